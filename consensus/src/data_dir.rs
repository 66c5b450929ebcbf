//! The guard of a node's data dir: an exclusive lock held while the node runs, so a second
//! process pointed at the same dir stops before it touches the log (its recovery would cut what
//! it takes for a torn tail), and the node id the dir belongs to, so a dir cannot be started as
//! another member by mistake.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::error::{Error, Result};
use crate::types::NodeId;

/// Name of the lock file in the data dir.
const LOCK: &str = "LOCK";
/// The log's and the registry's dirs in the data dir (`NodeConfig::wal_dir`, `registry_dir`).
const WAL: &str = "wal";
const REGISTRY: &str = "registry";
/// Name of the file that records which node the data dir belongs to.
const NODE_ID: &str = "node-id";

/// Holds the data dir's lock until dropped or released.
#[derive(Debug)]
pub(crate) struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Locks `dir` for this node and checks that it belongs to node `id`, recording that on the
    /// first start. Blocking.
    ///
    /// Contract: on success no other holder of this lock (another process, or another open of
    /// the same dir in this process) exists until this value is dropped, and `dir` durably
    /// names `id` as its node. Fails with [`Error::DataDir`] when the dir is in use or belongs
    /// to another node; nothing in the dir is changed then.
    pub(crate) fn acquire(dir: &Path, id: NodeId) -> Result<DataDirLock> {
        let path = dir.join(LOCK);
        let created = !path.exists();
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open lock file", &path, e))?;
        // SAFETY: `flock` on a descriptor this function owns; it touches no memory. The lock
        // is released when the descriptor is closed (the `File` dropped), also by a crash.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Err(data_dir(
                    dir,
                    "is in use by another metaserver (its LOCK file is held)",
                ));
            }
            return Err(Error::io("lock data dir", &path, e));
        }
        if let Err(e) = check_node_id(dir, id) {
            // A dir refused on its first start (another node's parent, say) is left as it
            // was: without the lock file this call made, so nothing hints that a node used it.
            if created {
                let _ = std::fs::remove_file(&path);
            }
            return Err(e);
        }
        Ok(DataDirLock { _file: file })
    }
}

/// Creates `dir` (and its parents) if it does not exist. [`Error::DataDir`] if something other
/// than a directory is there. Blocking.
pub(crate) fn create(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(data_dir(dir, "is not a directory"));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create data dir", dir, e))
}

fn data_dir(dir: &Path, reason: impl Into<String>) -> Error {
    Error::DataDir {
        path: dir.to_path_buf(),
        reason: reason.into(),
    }
}

/// Compares `id` with the id recorded in `dir`, or records it (file, fsync, rename, dir fsync).
fn check_node_id(dir: &Path, id: NodeId) -> Result<()> {
    let path = dir.join(NODE_ID);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let stored: NodeId = text
                .trim()
                .parse()
                .map_err(|_| data_dir(dir, format!("{NODE_ID} holds {text:?}, not a node id")))?;
            if stored != id {
                return Err(data_dir(
                    dir,
                    format!("belongs to node {stored}, not node {id}"),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The id is recorded before anything else is written: a dir that holds a log or a
            // registry without it lost the file, and may be another member's (two processes
            // answering for one member could vote twice in a term).
            if holds_state(dir) {
                return Err(data_dir(
                    dir,
                    format!(
                        "holds a log or a registry but no {NODE_ID} file, so which node it belongs \
                         to is not known; if it is node {id}'s, write {id} into {}",
                        path.display()
                    ),
                ));
            }
            // A parent of data dirs (as `local-cluster`'s `node1/`..) given by mistake would
            // become a new node's, and perhaps a new cluster's, beside them.
            let nested = nested_data_dirs(dir);
            if !nested.is_empty() {
                return Err(data_dir(
                    dir,
                    format!(
                        "holds other nodes' data dirs ({}), so it is likely their parent, given \
                         by mistake: give one of them, or a dir of its own",
                        nested.join(", ")
                    ),
                ));
            }
            record_node_id(dir, id)
        }
        Err(e) => Err(Error::io("read node id", &path, e)),
    }
}

/// The names of the dirs in `dir` that are nodes' data dirs (they record a node id), sorted,
/// at most three.
fn nested_data_dirs(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut nested: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join(NODE_ID).is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    nested.sort();
    nested.truncate(3);
    nested
}

/// Whether `dir` was never a node's data dir: it records no node id and holds no log or
/// registry (it may not exist). A first start can check what it would initialize before
/// opening the node records its id there, so that a mistake found then leaves nothing that the
/// corrected start would refuse.
pub fn is_fresh(dir: &Path) -> bool {
    !dir.join(NODE_ID).exists() && !holds_state(dir)
}

/// Whether `dir` holds a log with anything in it, or a registry.
fn holds_state(dir: &Path) -> bool {
    let log = std::fs::read_dir(dir.join(WAL)).is_ok_and(|mut entries| entries.next().is_some());
    log || dir.join(REGISTRY).exists()
}

fn record_node_id(dir: &Path, id: NodeId) -> Result<()> {
    write_durably(dir, NODE_ID, &format!("{id}\n"))
}

/// Writes `text` as file `name` of `dir` so that it is whole or absent after a crash (temp
/// file, fsync, rename, dir fsync). Blocking.
pub(crate) fn write_durably(dir: &Path, name: &str, text: &str) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let mut file = File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| Error::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename into place", &path, e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync data dir", dir, e))
}

/// Removes file `name` of `dir` if it is there (`op` names the removal in an error). Blocking.
/// The removal is not fsynced: after a crash the file may be back.
pub(crate) fn remove_if_present(dir: &Path, name: &str, op: &'static str) -> Result<()> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(op, &path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_one_node_per_dir() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path(), 2).unwrap();
        let err = DataDirLock::acquire(dir.path(), 2).unwrap_err();
        assert!(err.to_string().contains("in use"), "{err}");
        drop(first);
        let again = DataDirLock::acquire(dir.path(), 2).unwrap();
        drop(again);
        let err = DataDirLock::acquire(dir.path(), 3).unwrap_err();
        assert!(
            err.to_string().contains("belongs to node 2, not node 3"),
            "{err}"
        );
        std::fs::write(dir.path().join(NODE_ID), "two\n").unwrap();
        let err = DataDirLock::acquire(dir.path(), 2).unwrap_err();
        assert!(err.to_string().contains("not a node id"), "{err}");
    }

    /// A dir that lost its node id file after it got a log (or a registry) is not taken for
    /// whichever node starts on it: it may be another member's.
    #[test]
    fn a_dir_with_a_log_but_no_node_id_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(WAL)).unwrap();
        drop(DataDirLock::acquire(dir.path(), 5).expect("an empty log dir holds nothing"));
        std::fs::remove_file(dir.path().join(NODE_ID)).unwrap();
        std::fs::write(dir.path().join(WAL).join("1.wal"), b"x").unwrap();
        let err = DataDirLock::acquire(dir.path(), 5).unwrap_err();
        assert!(err.to_string().contains("no node-id file"), "{err}");
        assert!(!dir.path().join(NODE_ID).exists(), "nothing was recorded");
        std::fs::remove_dir_all(dir.path().join(WAL)).unwrap();
        std::fs::create_dir(dir.path().join(REGISTRY)).unwrap();
        let err = DataDirLock::acquire(dir.path(), 5).unwrap_err();
        assert!(err.to_string().contains("no node-id file"), "{err}");
        std::fs::write(dir.path().join(NODE_ID), "5\n").unwrap();
        DataDirLock::acquire(dir.path(), 5).expect("the id written back is taken");
    }

    #[test]
    fn a_parent_of_data_dirs_is_refused_and_left_as_it_was() {
        let parent = tempfile::tempdir().unwrap();
        let child = parent.path().join("node1");
        create(&child).unwrap();
        drop(DataDirLock::acquire(&child, 1).unwrap());
        std::fs::write(parent.path().join("notes.txt"), "x").unwrap();
        let e = DataDirLock::acquire(parent.path(), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds other nodes' data dirs (node1)"), "{e}");
        assert!(!parent.path().join(NODE_ID).exists(), "nothing recorded");
        assert!(!parent.path().join(LOCK).exists(), "no lock file left");
        // A dir of other files only (a mount point's lost+found, say) is taken.
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join("lost+found")).unwrap();
        DataDirLock::acquire(other.path(), 1).unwrap();
    }

    #[test]
    fn a_data_dir_that_is_a_file_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = create(&file).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        create(&dir.path().join("a/b")).unwrap();
        assert!(dir.path().join("a/b").is_dir());
    }
}
