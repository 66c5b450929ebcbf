//! The cluster a node belongs to: a random id made when a cluster is initialized, kept in the
//! data dir (`cluster-id`) and sent by the transport with every message between members, so a
//! node of another cluster (one started with `--init` by mistake, then added as a learner) is
//! refused instead of taking part: its higher term would depose the real leader.
//!
//! Contracts: a node that initializes a cluster records a fresh id before it forms the cluster
//! (in place of one it adopted without joining); a node without one adopts the id of the first
//! member message that carries one (a leader adding it); once the node holds Raft state, the id
//! never changes, and messages carrying another are refused.

use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::data_dir::write_durably;
use crate::error::{Error, Result};

/// Name of the file in the data dir.
const FILE: &str = "cluster-id";

/// The cluster id of a node, shared between the node and its transport.
#[derive(Clone, Debug, Default)]
pub struct ClusterId(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// 0 while unknown.
    id: AtomicU64,
    /// Held while an id is recorded.
    recording: Mutex<()>,
}

/// The name of cluster `id`'s history that the API shows (a watch page carries it, and a
/// watcher that resumes gives it back): 16 hex digits of a digest, which do not give the id
/// away. Indexes of another cluster's history (one restored from a backup counts from 1 again)
/// mean nothing here.
pub fn history_name(id: u64) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(b"metaserver change history\0")
        .chain_update(id.to_be_bytes())
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

impl ClusterId {
    /// The id, or `None` while the node belongs to no cluster it knows of.
    pub fn get(&self) -> Option<u64> {
        match self.0.id.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// Reads the id recorded in `dir`, if any. Blocking.
    pub(crate) fn load(&self, dir: &Path) -> Result<()> {
        let path = dir.join(FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let id = u64::from_str_radix(text.trim(), 16)
                    .ok()
                    .filter(|id| *id != 0)
                    .ok_or_else(|| Error::DataDir {
                        path: dir.to_path_buf(),
                        reason: format!("{FILE} holds {text:?}, not a cluster id"),
                    })?;
                self.0.id.store(id, Ordering::Release);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("read cluster id", &path, e)),
        }
    }

    /// Records `id` in `dir` unless an id is known: then `id` must be it, else
    /// [`Error::OtherCluster`]. Returns whether this call recorded it (of calls made at once,
    /// one does). Blocking (writes and syncs a file the first time).
    ///
    /// Contract: when this returns `Ok`, the dir durably records the node's id, which is `id`.
    pub(crate) fn adopt(&self, dir: &Path, id: u64) -> Result<bool> {
        if id == 0 {
            return Err(Error::InvalidArgument("cluster id 0".into()));
        }
        let _recording = self.0.recording.lock();
        match self.get() {
            Some(ours) if ours == id => Ok(false),
            Some(ours) => Err(Error::OtherCluster { ours, theirs: id }),
            None => {
                write_durably(dir, FILE, &format!("{id:016x}\n"))?;
                self.0.id.store(id, Ordering::Release);
                Ok(true)
            }
        }
    }

    /// Records `id`, the fresh id of a cluster this node is about to form, in `dir`, in place of
    /// any id recorded before (the node holds no Raft state, so no cluster counts on it).
    /// Blocking (writes and syncs a file).
    ///
    /// Contract: when this returns `Ok`, the dir durably records `id`.
    pub(crate) fn record_new(&self, dir: &Path, id: u64) -> Result<()> {
        if id == 0 {
            return Err(Error::InvalidArgument("cluster id 0".into()));
        }
        let _recording = self.0.recording.lock();
        if let Some(old) = self.get().filter(|old| *old != id) {
            tracing::warn!(
                "this node had recorded cluster {old:016x} without joining it; it forms cluster \
                 {id:016x} instead"
            );
        }
        write_durably(dir, FILE, &format!("{id:016x}\n"))?;
        self.0.id.store(id, Ordering::Release);
        Ok(())
    }

    /// A fresh random id for a new cluster (never 0).
    pub(crate) fn fresh() -> u64 {
        loop {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.write_u32(std::process::id());
            let id = h.finish();
            if id != 0 {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_name_is_fixed_per_cluster_and_hides_the_id() {
        let name = history_name(0x1234_5678_9abc_def0);
        assert_eq!(name, history_name(0x1234_5678_9abc_def0));
        assert_eq!(name.len(), 16);
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(name, history_name(0x1234_5678_9abc_def1));
        assert!(!name.contains("123456789abcdef0"));
        // A fixed value: members of different builds must name one history alike, and a
        // watcher keeps the name across upgrades.
        assert_eq!(history_name(1), "303e6f2145f7fb2f");
    }

    #[test]
    fn an_id_is_adopted_once_and_kept_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let id = ClusterId::default();
        id.load(dir.path()).unwrap();
        assert_eq!(id.get(), None);
        assert!(id.adopt(dir.path(), 7).unwrap(), "recorded");
        assert!(!id.adopt(dir.path(), 7).unwrap(), "known already");
        match id.adopt(dir.path(), 8) {
            Err(Error::OtherCluster { ours: 7, theirs: 8 }) => {}
            other => panic!("expected another cluster, got {other:?}"),
        }
        let again = ClusterId::default();
        again.load(dir.path()).unwrap();
        assert_eq!(again.get(), Some(7));
        std::fs::write(dir.path().join(FILE), "zz\n").unwrap();
        assert!(ClusterId::default().load(dir.path()).is_err());
    }

    #[test]
    fn fresh_ids_differ() {
        assert_ne!(ClusterId::fresh(), ClusterId::fresh());
    }
}
