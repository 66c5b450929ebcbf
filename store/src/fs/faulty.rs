//! An in-memory file system for tests that models what a crash does to files: bytes that were
//! never synced are lost, the last unsynced write may be torn, and files whose directory was never
//! synced disappear. It can also fail file and directory syncs, hold syncs on a gate, and run out
//! of descriptors. A failed sync loses the file's unsynced bytes at the next crash while reads
//! still see them, and a later sync succeeds, as Linux does after a failed writeback: retrying a
//! failed fsync would report lost bytes as durable.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{FileHandle, FileSystem};

/// Which unsynced operations survive a [`FaultyFileSystem::crash`]: the first `persist_ops` of
/// them in the order they were issued, plus the first `torn_bytes` bytes of the next one if it is
/// a write. [`CrashPoint::default`] loses every unsynced byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashPoint {
    /// How many unsynced operations (writes, size changes) reach the disk, oldest first.
    pub persist_ops: usize,
    /// How many leading bytes of the following write reach the disk.
    pub torn_bytes: usize,
}

/// A file system held in memory that models crashes and sync failures. Cloning shares the state.
#[derive(Clone, Debug, Default)]
pub struct FaultyFileSystem {
    state: Arc<Mutex<State>>,
    gate: Arc<SyncGate>,
    dir_gate: Arc<SyncGate>,
}

#[derive(Debug, Default)]
struct State {
    /// Bumped by every crash; handles from an older generation fail every call.
    generation: u64,
    dirs: BTreeSet<PathBuf>,
    names: HashMap<PathBuf, u64>,
    durable_names: HashMap<PathBuf, u64>,
    nodes: HashMap<u64, Node>,
    next_id: u64,
    next_seq: u64,
    fail_syncs: bool,
    fail_next_syncs: usize,
    fail_next_dir_syncs: usize,
    fail_next_removes: usize,
    fail_writes: bool,
    /// Opens (of files and of directories to sync them) to let through before running short.
    opens_before_short: usize,
    /// Opens still to fail with `EMFILE` after those.
    short_opens: usize,
    syncs: u64,
}

impl State {
    /// Fails with `EMFILE` while opens are to run short of descriptors.
    fn open_descriptor(&mut self) -> io::Result<()> {
        if self.opens_before_short > 0 {
            self.opens_before_short -= 1;
        } else if self.short_opens > 0 {
            self.short_opens -= 1;
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Node {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<(u64, Op)>,
}

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
    Allocate(u64),
}

impl Op {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            Op::Write { offset, bytes } => write_into(data, *offset, bytes),
            Op::SetLen(len) => data.resize(*len as usize, 0),
            Op::Allocate(len) => {
                if data.len() < *len as usize {
                    data.resize(*len as usize, 0);
                }
            }
        }
    }
}

fn write_into(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let end = offset as usize + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset as usize..end].copy_from_slice(bytes);
}

fn crashed() -> io::Error {
    io::Error::other("file handle from before a simulated crash")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl FaultyFileSystem {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    /// Simulates a power loss: every unsynced operation is lost except those `point` keeps, files
    /// whose directory entry was never synced vanish, and every handle opened before fails from
    /// now on. Syncs held on the gates are released (they fail).
    pub fn crash(&self, point: CrashPoint) {
        let mut st = self.state.lock();
        let mut pending: Vec<(u64, u64, Op)> = Vec::new();
        for (id, node) in st.nodes.iter_mut() {
            for (seq, op) in node.pending.drain(..) {
                pending.push((seq, *id, op));
            }
        }
        pending.sort_by_key(|(seq, _, _)| *seq);
        for (i, (_, id, op)) in pending.iter().enumerate() {
            let Some(node) = st.nodes.get_mut(id) else {
                continue;
            };
            if i < point.persist_ops {
                op.apply(&mut node.durable);
            } else {
                if let Op::Write { offset, bytes } = op {
                    let keep = point.torn_bytes.min(bytes.len());
                    write_into(&mut node.durable, *offset, &bytes[..keep]);
                }
                break;
            }
        }
        st.names = st.durable_names.clone();
        let live: BTreeSet<u64> = st.names.values().copied().collect();
        st.nodes.retain(|id, _| live.contains(id));
        for node in st.nodes.values_mut() {
            node.data = node.durable.clone();
        }
        st.generation += 1;
        drop(st);
        self.gate.release();
        self.dir_gate.release();
    }

    /// How many operations are not yet durable (the range of [`CrashPoint::persist_ops`]).
    pub fn unsynced_ops(&self) -> usize {
        self.state
            .lock()
            .nodes
            .values()
            .map(|n| n.pending.len())
            .sum()
    }

    /// Makes every later sync fail (`true`) or succeed again (`false`).
    pub fn set_fail_syncs(&self, fail: bool) {
        self.state.lock().fail_syncs = fail;
    }

    /// Makes every later write fail (`true`) or succeed again (`false`).
    pub fn set_fail_writes(&self, fail: bool) {
        self.state.lock().fail_writes = fail;
    }

    /// Makes the next `n` syncs fail.
    pub fn fail_next_syncs(&self, n: usize) {
        self.state.lock().fail_next_syncs = n;
    }

    /// Makes the next `n` directory syncs fail after opening the directory; a failed one makes
    /// nothing durable.
    pub fn fail_next_dir_syncs(&self, n: usize) {
        self.state.lock().fail_next_dir_syncs = n;
    }

    /// Makes the next `n` file removals fail (`EACCES`); a failed one removes nothing.
    pub fn fail_next_removes(&self, n: usize) {
        self.state.lock().fail_next_removes = n;
    }

    /// Of the next calls that open a file or a directory (`create_new`, `open`, `sync_dir`),
    /// lets `after` through and then fails `n` with `EMFILE`, as a process out of file
    /// descriptors does; nothing is created or synced by a call that fails so.
    pub fn run_out_of_descriptors(&self, after: usize, n: usize) {
        let mut st = self.state.lock();
        st.opens_before_short = after;
        st.short_opens = n;
    }

    /// How many successful syncs (`sync_data` and `sync_all` on files) this file system has seen.
    pub fn sync_count(&self) -> u64 {
        self.state.lock().syncs
    }

    /// The gate that `sync_data` calls pass through; close it to hold barriers.
    pub fn gate(&self) -> &SyncGate {
        &self.gate
    }

    /// The gate that directory syncs pass through (after opening the directory); close it to
    /// hold one.
    pub fn dir_gate(&self) -> &SyncGate {
        &self.dir_gate
    }

    /// The current contents of a file, or `None` if it does not exist.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        let id = st.names.get(path)?;
        Some(st.nodes[id].data.clone())
    }

    /// Replaces bytes of a file durably, as damage on the disk of a stopped node would.
    pub fn damage(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = *st.names.get(path).ok_or_else(|| not_found(path))?;
        let node = st.nodes.get_mut(&id).expect("named node exists");
        write_into(&mut node.data, offset, bytes);
        write_into(&mut node.durable, offset, bytes);
        Ok(())
    }

    fn handle(&self, id: u64, generation: u64) -> Box<dyn FileHandle> {
        Box::new(FaultyFile {
            fs: self.clone(),
            id,
            generation,
        })
    }
}

impl FileSystem for FaultyFileSystem {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        for anc in dir.ancestors() {
            st.dirs.insert(anc.to_path_buf());
        }
        Ok(())
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let mut st = self.state.lock();
        st.open_descriptor()?;
        if st.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        if !path.parent().is_some_and(|d| st.dirs.contains(d)) {
            return Err(not_found(path));
        }
        let id = st.next_id;
        st.next_id += 1;
        st.nodes.insert(id, Node::default());
        st.names.insert(path.to_path_buf(), id);
        let generation = st.generation;
        Ok(self.handle(id, generation))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn FileHandle>> {
        let mut st = self.state.lock();
        st.open_descriptor()?;
        let id = *st.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(self.handle(id, st.generation))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.fail_next_removes > 0 {
            st.fail_next_removes -= 1;
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        st.names.remove(path).ok_or_else(|| not_found(path))?;
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let generation = {
            let mut st = self.state.lock();
            st.open_descriptor()?;
            st.generation
        };
        self.dir_gate.pass();
        let mut st = self.state.lock();
        if st.generation != generation {
            // A crash came while the sync was held (or under way): it syncs nothing.
            return Err(crashed());
        }
        if st.fail_next_dir_syncs > 0 {
            st.fail_next_dir_syncs -= 1;
            return Err(io::Error::other("injected directory sync failure"));
        }
        st.durable_names.retain(|p, _| p.parent() != Some(dir));
        let entries: Vec<(PathBuf, u64)> = st
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        st.durable_names.extend(entries);
        Ok(())
    }
}

/// A handle into a [`FaultyFileSystem`].
#[derive(Debug)]
struct FaultyFile {
    fs: FaultyFileSystem,
    id: u64,
    generation: u64,
}

impl FaultyFile {
    fn with_node<T>(&self, f: impl FnOnce(&mut Node, &mut u64) -> io::Result<T>) -> io::Result<T> {
        let mut st = self.fs.state.lock();
        if st.generation != self.generation {
            return Err(crashed());
        }
        let State {
            nodes, next_seq, ..
        } = &mut *st;
        let node = nodes.get_mut(&self.id).ok_or_else(crashed)?;
        f(node, next_seq)
    }

    fn push(&self, op: Op) -> io::Result<()> {
        self.with_node(|node, seq| {
            op.apply(&mut node.data);
            node.pending.push((*seq, op));
            *seq += 1;
            Ok(())
        })
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.fs.state.lock();
        if st.generation != self.generation {
            return Err(crashed());
        }
        if st.fail_syncs || st.fail_next_syncs > 0 {
            st.fail_next_syncs = st.fail_next_syncs.saturating_sub(1);
            if let Some(node) = st.nodes.get_mut(&self.id) {
                node.pending.clear();
            }
            return Err(io::Error::other("injected sync failure"));
        }
        st.syncs += 1;
        let node = st.nodes.get_mut(&self.id).ok_or_else(crashed)?;
        for (_, op) in node.pending.drain(..) {
            op.apply(&mut node.durable);
        }
        Ok(())
    }
}

impl FileHandle for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.with_node(|node, _| {
            let start = (offset as usize).min(node.data.len());
            let n = buf.len().min(node.data.len() - start);
            buf[..n].copy_from_slice(&node.data[start..start + n]);
            Ok(n)
        })
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.fs.state.lock().fail_writes {
            return Err(io::Error::other("injected write failure"));
        }
        self.push(Op::Write {
            offset,
            bytes: buf.to_vec(),
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.fs.gate.pass();
        self.sync()
    }

    fn drop_cache(&self) {
        // Only clean pages go: with unsynced writes pending, the cached view stays.
        let _ = self.with_node(|node, _| {
            if node.pending.is_empty() {
                node.data = node.durable.clone();
            }
            Ok(())
        });
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }

    fn size(&self) -> io::Result<u64> {
        self.with_node(|node, _| Ok(node.data.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.push(Op::SetLen(len))
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.push(Op::Allocate(len))
    }
}

/// A gate that syncs wait at while it is closed (`sync_data` calls at one, directory syncs at
/// another), so a test can hold a barrier or a directory sync in flight at a known moment.
/// Open unless [`SyncGate::close`] was called.
#[derive(Debug, Default)]
pub struct SyncGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    waiting: usize,
    passed: u64,
}

impl SyncGate {
    /// Closes the gate: later syncs that pass it wait until [`SyncGate::release`].
    pub fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Opens the gate and lets every held sync through.
    pub fn release(&self) {
        self.state.lock().closed = false;
        self.cv.notify_all();
    }

    /// How many syncs are waiting at the gate now.
    pub fn waiting(&self) -> usize {
        self.state.lock().waiting
    }

    /// Waits until at least `n` syncs are held at the gate or `timeout` passes; returns whether
    /// they are.
    pub fn wait_held(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        while st.waiting < n {
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                return st.waiting >= n;
            }
        }
        true
    }

    /// How many syncs have passed the gate.
    pub fn passed(&self) -> u64 {
        self.state.lock().passed
    }

    fn pass(&self) {
        let mut st = self.state.lock();
        if st.closed {
            st.waiting += 1;
            self.cv.notify_all();
            while st.closed {
                self.cv.wait(&mut st);
            }
            st.waiting -= 1;
        }
        st.passed += 1;
    }
}
