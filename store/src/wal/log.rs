//! [`Wal`]: appends under a write lock, shared barriers on a dedicated thread (or inline for a
//! lone blocking caller), reads by LSN and range. Its truncate and purge markers are in
//! `log/markers.rs`.

use std::future::Future;
use std::ops::{Bound, Range, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};

mod markers;

use super::index::{Index, Location};
use super::metrics::Counters;
use super::newest_segment;
use super::record::{self, Kind, RecordMeta, HEADER_LEN, MAX_PAYLOAD};
use super::recovery;
use super::segment::{Segment, SEGMENT_HEADER_LEN};
use super::waiter::{Parker, Waiter};
use super::{BarrierMode, Lsn, WalMetrics, WalOptions, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES};
use crate::barrier::{BarrierBook, Job, Status, Step};
use crate::error::{Error, Result};
use crate::fs::{DescriptorWait, FileSystem, OsFileSystem, SlowSyncFileSystem};

/// Largest single read `read_range` issues for a run of adjacent records.
const MAX_READ_SPAN: u64 = 4 << 20;

/// A segmented write-ahead log with shared fsync barriers.
///
/// Methods take `&self`; wrap the log in an `Arc` to share it. One `Wal` per directory. Blocking
/// calls (`sync`, `truncate_from`, `purge_to`, `close`, `open`) may wait for an fdatasync: from
/// async code use [`Wal::sync_async`] / [`Wal::on_durable`], or `spawn_blocking`.
pub struct Wal {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

struct Inner {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    segment_bytes: u64,
    preallocate: bool,
    descriptor_wait: DescriptorWait,
    mode: AtomicU8,
    /// The write lock: the segment being written, where, and the next LSN.
    writer: Mutex<Writer>,
    index: RwLock<Index>,
    /// The last LSN whose bytes are in the file. Stored after the write, under the write lock.
    written: AtomicU64,
    /// Mirror of the book's durable LSN, for lock-free reads.
    durable: AtomicU64,
    poisoned: AtomicBool,
    closed: AtomicBool,
    /// The segment being written; a barrier syncs it. Older segments were synced when the log
    /// moved on from them.
    tail: Mutex<Arc<Segment>>,
    /// Held around every fdatasync of a segment (a barrier's, a roll's) together with the poison
    /// check before it and the poisoning after a failure. Linux reports a failed writeback once
    /// and may drop the failed pages, so a sync running beside one that failed could return Ok
    /// for bytes that are lost: in effect a retried fsync. Taken after the write lock, before
    /// `book`.
    sync_lock: Mutex<()>,
    /// Held around every fsync of the log directory (a segment's creation, a purge's deletions)
    /// together with the poison check before it and the poisoning after a failure, for the same
    /// reason as `sync_lock`. A purge takes it without the write lock, so appends that stay in
    /// the current segment go on while it deletes segments; a segment's creation takes it after
    /// the write lock (an append that moves to a new segment waits for a purge's deletions).
    dir_lock: Mutex<()>,
    book: Mutex<BarrierBook<Waiter>>,
    /// Waiters failed by a poisoning under the write lock or the directory lock, to complete once
    /// it is released.
    orphans: Mutex<Vec<(Waiter, Result<(), String>)>>,
    /// Wakes the barrier thread (paired with `book`).
    wake: Condvar,
    metrics: Counters,
}

struct Writer {
    segment: Arc<Segment>,
    offset: u64,
    next_lsn: Lsn,
    buf: Vec<u8>,
}

/// What one write call appends.
enum Batch<'a> {
    Data(&'a [&'a [u8]]),
    Marker(Kind, Lsn),
}

impl Wal {
    /// Opens (creating if needed) the log in `dir` on the real file system. See [`Wal::open_with`].
    pub fn open(dir: impl AsRef<Path>, opts: WalOptions) -> Result<Wal> {
        let fs: Arc<dyn FileSystem> = if opts.extra_sync_latency.is_zero() {
            Arc::new(OsFileSystem)
        } else {
            Arc::new(SlowSyncFileSystem::new(
                Arc::new(OsFileSystem),
                opts.extra_sync_latency,
            ))
        };
        Wal::open_with(fs, dir, opts)
    }

    /// Opens (creating if needed) the log in `dir` through `fs`, recovering it first.
    ///
    /// Contract: on return every record is verified; a torn or corrupt tail of the newest segment
    /// has been cut off physically, including valid records after a torn write (a zero sector
    /// before them shows that their sync never completed); everything recovered is durable
    /// (`durable_lsn() == last_lsn()`), the newest segment's directory entry included; and no
    /// segment whose records are all purged is left. Any
    /// other invalid record followed by valid ones, an invalid record that one flipped bit (outside
    /// bytes a crash may have lost) would make valid, or missing records, fail with
    /// [`Error::Corrupt`] naming the file and offset, and nothing is changed.
    pub fn open_with(
        fs: Arc<dyn FileSystem>,
        dir: impl AsRef<Path>,
        opts: WalOptions,
    ) -> Result<Wal> {
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&opts.segment_bytes) {
            return Err(Error::InvalidArgument {
                op: "open",
                reason: format!(
                    "segment_bytes must be between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES}"
                ),
            });
        }
        let dir = dir.as_ref().to_path_buf();
        let rec = recovery::recover(&*fs, &dir, &opts)?;
        let last = rec.index.next_lsn() - 1;
        let inner = Arc::new(Inner {
            fs,
            segment_bytes: opts.segment_bytes,
            preallocate: opts.preallocate,
            descriptor_wait: DescriptorWait::new(opts.descriptor_wait),
            mode: AtomicU8::new(opts.barrier as u8),
            writer: Mutex::new(Writer {
                segment: rec.tail.clone(),
                offset: rec.tail_offset,
                next_lsn: last + 1,
                buf: Vec::new(),
            }),
            index: RwLock::new(rec.index),
            written: AtomicU64::new(last),
            durable: AtomicU64::new(last),
            poisoned: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            tail: Mutex::new(rec.tail),
            sync_lock: Mutex::new(()),
            dir_lock: Mutex::new(()),
            book: Mutex::new(BarrierBook::new(last)),
            orphans: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            metrics: Counters::default(),
            dir,
        });
        let thread_inner = inner.clone();
        let handle = std::thread::Builder::new()
            .name("wal-barrier".into())
            .spawn(move || thread_inner.barrier_loop())
            .map_err(|e| Error::io("spawn barrier thread", &inner.dir, e))?;
        Ok(Wal {
            thread_id: handle.thread().id(),
            thread: Mutex::new(Some(handle)),
            inner,
        })
    }

    /// Appends one record.
    ///
    /// Contract: on success the record is in the file and readable by [`Wal::read`]; it is NOT
    /// durable until [`Wal::sync`] (or an async form) says so. Fails without writing anything if
    /// the payload exceeds [`MAX_PAYLOAD`], the log is closed, or the log is poisoned; a failed
    /// write poisons the log.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn> {
        self.append_batch(&[payload])
    }

    /// Appends several records with one write call and returns the LSN of the last; their LSNs
    /// are consecutive.
    ///
    /// Contract: as [`Wal::append`] for every record of the batch; the batch is one write, so
    /// after a crash a prefix of it (possibly none) may survive if it was not synced.
    pub fn append_batch(&self, payloads: &[&[u8]]) -> Result<Lsn> {
        if payloads.is_empty() {
            return Err(invalid("append_batch", "empty batch"));
        }
        if let Some(p) = payloads.iter().find(|p| p.len() > MAX_PAYLOAD) {
            return Err(invalid(
                "append",
                format!("payload of {} bytes exceeds {MAX_PAYLOAD}", p.len()),
            ));
        }
        self.inner.with_writer(|w| {
            self.inner.check_writable()?;
            self.inner.write(w, Batch::Data(payloads))
        })
    }

    /// Blocks until every record with LSN at or below `lsn` is durable.
    ///
    /// Contract: on `Ok` every record and marker up to `lsn` survives a crash. Returns at once if a
    /// completed barrier already covered `lsn` (in [`BarrierMode::Shared`]); otherwise shares the
    /// next barrier with every other waiter, running it on this thread when no barrier is running.
    /// In [`BarrierMode::Own`] it always takes a barrier of its own. Fails with
    /// [`Error::Poisoned`] if this or any earlier barrier failed, [`Error::InvalidArgument`] for an
    /// LSN not yet assigned, [`Error::Closed`] after [`Wal::close`].
    pub fn sync(&self, lsn: Lsn) -> Result<()> {
        self.inner.check_open()?;
        self.inner.check_written(lsn, "sync")?;
        self.inner.sync(lsn)
    }

    /// Async form of [`Wal::sync`]: registers the wait now and resolves when `lsn` is durable (or
    /// with the error). Never blocks the runtime: the fdatasync runs on the barrier thread.
    pub fn sync_async(&self, lsn: Lsn) -> impl Future<Output = Result<()>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.on_durable(
            lsn,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        );
        async move { rx.await.unwrap_or(Err(Error::Closed)) }
    }

    /// Callback form of [`Wal::sync`]: `done` is called exactly once, with `Ok` once `lsn` is
    /// durable or with the error. It runs inline if the answer is known now (already durable,
    /// poisoned, closed, invalid LSN), otherwise on the barrier thread: keep it short and never
    /// block in it. Never runs an fdatasync on the calling thread.
    pub fn on_durable(&self, lsn: Lsn, done: Box<dyn FnOnce(Result<()>) + Send>) {
        if let Err(e) = self
            .inner
            .check_open()
            .and_then(|()| self.inner.check_written(lsn, "on_durable"))
        {
            return done(Err(e));
        }
        let own = self.inner.mode() == BarrierMode::Own;
        let mut book = self.inner.book.lock();
        match book.status(lsn, own) {
            Status::Durable => {
                drop(book);
                done(Ok(()))
            }
            Status::Poisoned(msg) => {
                drop(book);
                done(Err(Error::Poisoned(msg)))
            }
            Status::Pending if book.is_shut_down() => {
                drop(book);
                done(Err(Error::Closed))
            }
            Status::Pending => {
                let waiter = Waiter::Callback(done);
                if own {
                    book.wait_own(waiter);
                } else {
                    book.wait_shared(lsn, waiter);
                }
                let idle = !book.running();
                drop(book);
                if idle {
                    self.inner.wake.notify_one();
                }
            }
        }
    }

    /// Reads one live record.
    ///
    /// Contract: returns the payload of record `lsn` if it was appended and is neither truncated,
    /// purged nor a marker, else `None`. Runs concurrently with appends. The bytes are verified;
    /// a mismatch is [`Error::Corrupt`].
    pub fn read(&self, lsn: Lsn) -> Result<Option<Vec<u8>>> {
        self.inner.check_open()?;
        let loc = self.inner.index.read().locate(lsn);
        match loc {
            None => Ok(None),
            Some(loc) => {
                let mut out = Vec::with_capacity(1);
                read_span(&[loc], &mut out)?;
                Ok(out.pop().map(|(_, p)| p))
            }
        }
    }

    /// Reads the live records with LSN in `range`, in order.
    ///
    /// Contract: returns exactly the records [`Wal::read`] would return for each LSN of the range
    /// at the moment of the call (truncated, purged and marker LSNs skipped), verified. Runs
    /// concurrently with appends.
    pub fn read_range(&self, range: impl RangeBounds<Lsn>) -> Result<Vec<(Lsn, Vec<u8>)>> {
        self.inner.check_open()?;
        let locs = self.inner.index.read().live_in(to_range(range));
        let mut out = Vec::with_capacity(locs.len());
        let mut start = 0;
        for i in 1..=locs.len() {
            let split = i == locs.len() || {
                let (a, b) = (&locs[i - 1], &locs[i]);
                !Arc::ptr_eq(&a.segment, &b.segment)
                    || a.offset + HEADER_LEN as u64 + a.len as u64 != b.offset
                    || b.offset + HEADER_LEN as u64 + b.len as u64 - locs[start].offset
                        > MAX_READ_SPAN
            };
            if split {
                read_span(&locs[start..i], &mut out)?;
                start = i;
            }
        }
        Ok(out)
    }

    /// Whether record `lsn` lies in the segment being written, the one most recently written and
    /// so the most likely to be in the page cache. Reading an older segment may wait for the
    /// disk: async callers keep such reads off their runtime.
    pub fn in_tail(&self, lsn: Lsn) -> bool {
        lsn >= self.inner.tail.lock().first_lsn
    }

    /// The LSN of the first live record, `None` if there is none.
    pub fn first_lsn(&self) -> Option<Lsn> {
        self.inner.index.read().first_live()
    }

    /// Whether appending records with these payload lengths now would move the log to a new
    /// segment. A move syncs the old segment and creates, syncs and names a new one: blocking
    /// IO that async callers keep off their runtime (an append is otherwise one positional
    /// write). Exact for a single writer; with concurrent writers it is a hint.
    pub fn needs_roll(&self, payload_lens: impl IntoIterator<Item = usize>) -> bool {
        let total: u64 = payload_lens.into_iter().map(record::encoded_len).sum();
        let w = self.inner.writer.lock();
        w.offset > SEGMENT_HEADER_LEN && w.offset + total > self.inner.segment_bytes
    }

    /// The last LSN assigned (records and markers); 0 for a log that never had one.
    pub fn last_lsn(&self) -> Lsn {
        self.inner.written.load(Ordering::Acquire)
    }

    /// The LSN published by the last completed barrier: everything at or below it is durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.inner.durable.load(Ordering::Acquire)
    }

    /// Every LSN at or below this was purged.
    pub fn purged_to(&self) -> Lsn {
        self.inner.index.read().purged_to()
    }

    /// This log's metrics (not shared with any other instance).
    pub fn metrics(&self) -> WalMetrics {
        self.inner.metrics.snapshot()
    }

    /// Switches the barrier mode for syncs requested from now on.
    pub fn set_barrier_mode(&self, mode: BarrierMode) {
        self.inner.mode.store(mode as u8, Ordering::Relaxed);
    }

    /// The current barrier mode.
    pub fn barrier_mode(&self) -> BarrierMode {
        self.inner.mode()
    }

    /// The directory the log lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Makes everything written durable and stops the barrier thread.
    ///
    /// Contract: on `Ok` every record appended before the call is durable. Later calls (other
    /// than `close`, which returns `Ok` again, and the plain getters) fail with [`Error::Closed`].
    /// Fails with [`Error::Poisoned`] if the final barrier (or an earlier one) failed.
    pub fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Taking the write lock waits out an append in flight; none starts after `closed`.
        let last = {
            let _w = self.inner.writer.lock();
            self.inner.written.load(Ordering::Acquire)
        };
        // Taking the directory lock waits out a purge's deletions; none starts after `closed`.
        // Whoever opens the log next may list a segment such a purge would delete.
        drop(self.inner.dir_lock.lock());
        let outcome = self.inner.sync(last);
        self.stop_thread();
        outcome
    }

    fn stop_thread(&self) {
        self.inner.book.lock().shut_down();
        self.inner.wake.notify_all();
        if std::thread::current().id() == self.thread_id {
            // Dropped from a callback on the barrier thread: it exits on its own.
            return;
        }
        if let Some(handle) = self.thread.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.inner.dir)
            .field("last_lsn", &self.last_lsn())
            .field("durable_lsn", &self.durable_lsn())
            .finish()
    }
}

impl Inner {
    fn mode(&self) -> BarrierMode {
        if self.mode.load(Ordering::Relaxed) == BarrierMode::Own as u8 {
            BarrierMode::Own
        } else {
            BarrierMode::Shared
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.poisoned.load(Ordering::Acquire) {
            let msg = self
                .book
                .lock()
                .poison()
                .unwrap_or("an fdatasync failed")
                .to_owned();
            return Err(Error::Poisoned(msg));
        }
        Ok(())
    }

    fn check_written(&self, lsn: Lsn, op: &'static str) -> Result<()> {
        let written = self.written.load(Ordering::Acquire);
        if lsn > written {
            return Err(invalid(
                op,
                format!("LSN {lsn} was not written (last is {written})"),
            ));
        }
        Ok(())
    }

    /// Writes a batch under the write lock `w` and returns its last LSN.
    fn write(&self, w: &mut Writer, batch: Batch<'_>) -> Result<Lsn> {
        let target_bytes;
        let marker_slot: [&[u8]; 1];
        let (kind, payloads, target): (Kind, &[&[u8]], Lsn) = match batch {
            Batch::Data(p) => (Kind::Data, p, 0),
            Batch::Marker(kind, target) => {
                target_bytes = target.to_le_bytes();
                marker_slot = [&target_bytes];
                (kind, &marker_slot[..], target)
            }
        };
        let total: u64 = payloads.iter().map(|p| record::encoded_len(p.len())).sum();
        if w.offset > SEGMENT_HEADER_LEN && w.offset + total > self.segment_bytes {
            self.roll(w)?;
        }
        let first = w.next_lsn;
        let segment_id = w.segment.first_lsn;
        let mut buf = std::mem::take(&mut w.buf);
        buf.clear();
        for (i, p) in payloads.iter().enumerate() {
            record::encode(&mut buf, segment_id, first + i as u64, kind, p);
        }
        let written = w.segment.file.write_all_at(&buf, w.offset);
        if buf.capacity() > 1 << 20 {
            buf = Vec::new();
        }
        w.buf = buf;
        if let Err(e) = written {
            let err = Error::io("append", &w.segment.path, e);
            self.poison(err.to_string());
            return Err(err);
        }
        {
            let mut index = self.index.write();
            let mut offset = w.offset;
            for (i, p) in payloads.iter().enumerate() {
                let meta = RecordMeta {
                    lsn: first + i as u64,
                    kind,
                    offset,
                    payload_len: p.len() as u32,
                    target,
                };
                index.push(segment_id, &meta);
                offset += meta.size();
            }
        }
        let last = first + payloads.len() as u64 - 1;
        w.offset += total;
        w.next_lsn = last + 1;
        self.written.store(last, Ordering::Release);
        // Markers too: barriers count every LSN they make durable.
        self.metrics.appended(payloads.len() as u64, total);
        Ok(last)
    }

    /// Moves writing to a new segment. The old one is synced first, because barriers sync only
    /// the segment being written: no durable LSN may pass an old segment before it is synced.
    fn roll(&self, w: &mut Writer) -> Result<()> {
        {
            let _serial = self.sync_lock.lock();
            // A barrier's sync of this segment may have failed while this call waited.
            self.check_writable()?;
            if let Err(e) = w.segment.file.sync_data() {
                let err = Error::io("fsync segment before moving on", &w.segment.path, e);
                self.poison(err.to_string());
                return Err(err);
            }
        }
        let prealloc = self.preallocate.then_some(self.segment_bytes);
        // A purge may have failed its directory fsync while this call waited for the lock.
        let _dir = self.dir_lock.lock();
        self.check_writable()?;
        let segment = match Segment::create(
            &*self.fs,
            &self.dir,
            w.next_lsn,
            prealloc,
            self.descriptor_wait,
        ) {
            Ok(s) => Arc::new(s),
            Err(err) => {
                // A half-created segment cannot be retried safely (its fsync may have failed).
                self.poison(err.to_string());
                return Err(err);
            }
        };
        // Before anything is appended to it: recovery then knows the segment was there.
        if let Err(err) = newest_segment::record(&*self.fs, &self.dir, segment.first_lsn) {
            self.poison(err.to_string());
            return Err(err);
        }
        self.index.write().add_segment(segment.clone());
        *self.tail.lock() = segment.clone();
        w.segment = segment;
        w.offset = SEGMENT_HEADER_LEN;
        self.metrics.segment_created();
        Ok(())
    }

    /// Runs `f` under the write lock, then completes the waiters a poisoning inside `f` failed
    /// (outside the lock, so their callbacks may call back into the log).
    fn with_writer<T>(&self, f: impl FnOnce(&mut Writer) -> Result<T>) -> Result<T> {
        let result = f(&mut self.writer.lock());
        if result.is_err() {
            self.complete_orphans();
        }
        result
    }

    /// Runs `f` under the directory lock (not the write lock), then completes the waiters a
    /// poisoning inside `f` failed, as [`Inner::with_writer`] does.
    fn with_dir_lock<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let result = {
            let _dir = self.dir_lock.lock();
            f()
        };
        if result.is_err() {
            self.complete_orphans();
        }
        result
    }

    /// Completes the waiters that a poisoning failed.
    fn complete_orphans(&self) {
        let failed = std::mem::take(&mut *self.orphans.lock());
        for (w, outcome) in failed {
            w.complete(outcome);
        }
    }

    /// Poisons the log under the write lock or the directory lock: every waiter is failed
    /// (completed by [`Inner::with_writer`] or [`Inner::with_dir_lock`] once the lock is
    /// released) and every later call fails.
    fn poison(&self, msg: String) {
        tracing::error!(error = %msg, "write-ahead log poisoned");
        let mut book = self.book.lock();
        self.poisoned.store(true, Ordering::Release);
        let failed = book.fail_all(msg);
        drop(book);
        self.orphans.lock().extend(failed);
    }

    /// Waits until `lsn` is durable; see [`Wal::sync`].
    fn sync(&self, lsn: Lsn) -> Result<()> {
        let own = self.mode() == BarrierMode::Own;
        let mut book = self.book.lock();
        match book.status(lsn, own) {
            Status::Durable => return Ok(()),
            Status::Poisoned(msg) => return Err(Error::Poisoned(msg)),
            Status::Pending => {}
        }
        if book.try_begin() {
            // No barrier is running: run it here rather than hand off to the barrier thread,
            // which saves a lone writer two context switches.
            drop(book);
            return self.run_barrier(None).map_err(Error::Poisoned);
        }
        if book.is_shut_down() {
            return Err(Error::Closed);
        }
        let parker = Parker::current();
        if own {
            book.wait_own(Waiter::Thread(parker.clone()));
        } else {
            book.wait_shared(lsn, Waiter::Thread(parker.clone()));
        }
        drop(book);
        parker.wait().map_err(Error::Poisoned)
    }

    /// Runs one barrier (the caller claimed it in the book) and settles its waiters.
    fn run_barrier(&self, owner: Option<Waiter>) -> Result<(), String> {
        // Read how far the log is written BEFORE the sync, then the segment to sync. This order
        // matters: a roll syncs the old segment before it publishes the new tail, so whatever the
        // tail read here, every LSN up to `target` is covered once the sync below returns.
        let target = self.written.load(Ordering::Acquire);
        let segment = self.tail.lock().clone();
        let started = Instant::now();
        let outcome = {
            let _serial = self.sync_lock.lock();
            if self.poisoned.load(Ordering::Acquire) {
                // An earlier sync failed (its message is in the book): never sync again.
                Err("an earlier fdatasync failed".to_owned())
            } else {
                let outcome = segment
                    .file
                    .sync_data()
                    .map_err(|e| format!("fdatasync {}: {e}", segment.path.display()));
                if outcome.is_err() {
                    self.poisoned.store(true, Ordering::Release);
                }
                outcome
            }
        };
        let took = started.elapsed();

        // Publish only AFTER the sync returned.
        let mut book = self.book.lock();
        let failed = outcome.is_err();
        let finished = book.finish(target, outcome, owner);
        let outcome = finished.outcome.clone();
        match &outcome {
            Ok(()) => {
                self.metrics.barrier(finished.covered, took);
                self.durable.store(book.durable(), Ordering::Release);
            }
            Err(msg) if failed => {
                tracing::error!(error = %msg, "barrier failed; write-ahead log poisoned");
            }
            Err(_) => {}
        }
        let more = book.wake_thread();
        drop(book);
        if more {
            self.wake.notify_one();
        }
        for (w, outcome) in finished.done {
            w.complete(outcome);
        }
        outcome
    }

    /// The barrier thread: runs barriers while anyone waits, until shut down.
    fn barrier_loop(&self) {
        let mut book = self.book.lock();
        loop {
            match book.next_step() {
                Step::Run(job) => {
                    drop(book);
                    let owner = match job {
                        Job::Own(w) => Some(w),
                        Job::Shared => None,
                    };
                    let _ = self.run_barrier(owner);
                    book = self.book.lock();
                }
                Step::Exit => return,
                Step::Wait => self.wake.wait(&mut book),
            }
        }
    }
}

fn invalid(op: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        reason: reason.into(),
    }
}

fn to_range(range: impl RangeBounds<Lsn>) -> Range<Lsn> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => Lsn::MAX,
    };
    start..end.max(start)
}

/// Reads adjacent records of one segment with one read, verifies each and appends the payloads.
fn read_span(locs: &[Location], out: &mut Vec<(Lsn, Vec<u8>)>) -> Result<()> {
    let (Some(first), Some(last)) = (locs.first(), locs.last()) else {
        return Ok(());
    };
    let seg = &first.segment;
    let start = first.offset;
    let end = last.offset + HEADER_LEN as u64 + last.len as u64;
    let mut buf = vec![0u8; (end - start) as usize];
    seg.file
        .read_exact_at(&mut buf, start)
        .map_err(|e| Error::io("read record", &seg.path, e))?;
    for loc in locs {
        let at = (loc.offset - start) as usize;
        let rec = &buf[at..at + HEADER_LEN + loc.len as usize];
        let payload =
            record::verify(rec, seg.first_lsn, loc.lsn).ok_or_else(|| Error::Corrupt {
                path: seg.path.clone(),
                offset: loc.offset,
                reason: format!("record {} failed verification on read", loc.lsn),
            })?;
        out.push((loc.lsn, payload.to_vec()));
    }
    Ok(())
}
