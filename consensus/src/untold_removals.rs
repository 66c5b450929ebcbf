//! The nodes that a committed membership change removed and that may not know it yet, kept in
//! the data dir (`UNTOLD_REMOVALS`) so that a member that restarts still tells them.
//!
//! Every member follows its committed membership and notes whom a change leaves out; the
//! leader tells them (`meta-http`'s `removal_notices.rs`). Kept in memory only, a removed node
//! that was down was never told once every member that saw its removal had restarted, and it
//! reported itself a learner (or a voter campaigning in vain) for ever. The file is advice, not
//! state: a notice is only ever sent for this node's own committed membership (see
//! `removal_notice.rs`), so a stale entry (a node added again since) sends nothing wrong.
//!
//! Format: one line per node, `ID ADDR`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::data_dir::{remove_if_present, write_durably};
use crate::error::{Error, Result};
use crate::types::NodeId;

/// Name of the file in the data dir.
const FILE: &str = "UNTOLD_REMOVALS";

/// The data dir's list of nodes still to be told they were removed.
#[derive(Debug)]
pub(crate) struct UntoldRemovals {
    dir: PathBuf,
}

impl UntoldRemovals {
    /// The list of the data dir `dir`.
    pub(crate) fn new(dir: &Path) -> UntoldRemovals {
        UntoldRemovals {
            dir: dir.to_path_buf(),
        }
    }

    /// The nodes (id to address) last saved; none if the file is absent. Blocking.
    ///
    /// Errors: the file cannot be read, or a line is not `ID ADDR`.
    pub(crate) fn load(&self) -> Result<BTreeMap<NodeId, String>> {
        let path = self.dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(Error::io("read untold removals", &path, e)),
        };
        let mut untold = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let parsed = line
                .split_once(' ')
                .and_then(|(id, addr)| Some((id.parse().ok()?, addr)))
                .filter(|(_, addr)| !addr.is_empty());
            let Some((id, addr)) = parsed else {
                let why = format!("line {} is not `ID ADDR`: {line:?}", n + 1);
                let e = std::io::Error::new(std::io::ErrorKind::InvalidData, why);
                return Err(Error::io("read untold removals", &path, e));
            };
            untold.insert(id, addr.to_string());
        }
        Ok(untold)
    }

    /// Replaces the saved list with `untold`; an empty list removes the file. Blocking.
    ///
    /// Contract: on `Ok` the list survives a crash, whole (temp file, fsync, rename, directory
    /// fsync); the removal of the file for an empty list is not fsynced (a list that comes back
    /// only sends notices that change nothing). An address with a line break cannot be a
    /// member's, and is left out.
    pub(crate) fn save(&self, untold: &BTreeMap<NodeId, String>) -> Result<()> {
        if untold.is_empty() {
            return remove_if_present(&self.dir, FILE, "remove untold removals");
        }
        let text: String = untold
            .iter()
            .filter(|(_, addr)| !addr.contains(['\n', '\r']) && !addr.is_empty())
            .map(|(id, addr)| format!("{id} {addr}\n"))
            .collect();
        write_durably(&self.dir, FILE, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[(NodeId, &str)]) -> BTreeMap<NodeId, String> {
        entries.iter().map(|(id, a)| (*id, a.to_string())).collect()
    }

    #[test]
    fn a_saved_list_is_loaded_and_an_empty_one_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let untold = UntoldRemovals::new(dir.path());
        assert_eq!(untold.load().unwrap(), BTreeMap::new(), "no file yet");
        let saved = list(&[(4, "127.0.0.1:7104"), (9, "[::1]:7109")]);
        untold.save(&saved).unwrap();
        assert_eq!(UntoldRemovals::new(dir.path()).load().unwrap(), saved);
        untold.save(&list(&[(9, "[::1]:7109")])).unwrap();
        assert_eq!(untold.load().unwrap(), list(&[(9, "[::1]:7109")]));
        untold.save(&BTreeMap::new()).unwrap();
        assert!(!dir.path().join(FILE).exists());
        assert_eq!(untold.load().unwrap(), BTreeMap::new());
        untold.save(&BTreeMap::new()).unwrap();
    }

    #[test]
    fn an_address_with_a_line_break_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let untold = UntoldRemovals::new(dir.path());
        untold
            .save(&list(&[(4, "a:1\n5 b:2"), (6, "c:3")]))
            .unwrap();
        assert_eq!(untold.load().unwrap(), list(&[(6, "c:3")]));
    }

    #[test]
    fn a_garbled_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "4 a:1\nfour b:2\n").unwrap();
        let e = UntoldRemovals::new(dir.path()).load().unwrap_err();
        let text = e.to_string();
        assert!(text.contains("UNTOLD_REMOVALS"), "{text}");
        assert!(format!("{e:?}").contains("line 2"), "{e:?}");
        std::fs::write(dir.path().join(FILE), "4\n").unwrap();
        assert!(UntoldRemovals::new(dir.path()).load().is_err());
    }
}
