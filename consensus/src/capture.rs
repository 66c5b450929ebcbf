//! A point-in-time view of the registry tree for snapshot export, kept by copy-on-write
//! pre-images instead of a copy.
//!
//! sled's iteration is not a point-in-time snapshot: `apply` keeps writing while an export
//! walks the tree. A capture taken at last-applied `S` records, before `apply` first changes a
//! key after `S`, that key's value at `S` (its pre-image, `None` if it did not exist). The
//! exporter reads the live tree in key order in chunks and, for every chunk, substitutes
//! pre-images under the capture's lock. Correctness rests on two orderings:
//!
//! - a pre-image is recorded before the write it protects, so an exporter that read a value
//!   written after `S` finds that key's pre-image when it checks the chunk afterwards;
//! - the capture remembers how far the exporter has checked (`cursor`); a key deleted after
//!   `S` that the exporter had already passed was exported then, and one it had not passed is
//!   exported at the end from its pre-image (the live tree no longer has it).
//!
//! Starting a capture is O(1), so `apply` never stalls for the length of an export; its cost is
//! one extra read per key first changed during the export, and memory for those keys only.

use std::collections::HashMap;

use parking_lot::Mutex;
use sled::IVec;

#[derive(Debug)]
struct PreImage {
    value: Option<IVec>,
    /// The exporter has already written this key (or deliberately skipped it).
    done: bool,
}

#[derive(Debug, Default)]
struct Inner {
    pre: HashMap<Vec<u8>, PreImage>,
    /// Largest key the exporter has checked.
    cursor: Option<Vec<u8>>,
}

/// Pre-images of the keys changed since the capture started.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    inner: Mutex<Inner>,
}

impl Capture {
    pub(crate) fn new() -> Self {
        Capture::default()
    }

    /// Records the current value of every key in `keys` that has no pre-image yet. Must be
    /// called before the write that changes them, with no other writer in between.
    pub(crate) fn record<'a>(
        &self,
        tree: &sled::Tree,
        keys: impl Iterator<Item = &'a [u8]>,
    ) -> sled::Result<()> {
        let mut inner = self.inner.lock();
        let Inner { pre, cursor } = &mut *inner;
        for key in keys {
            if pre.contains_key(key) {
                continue;
            }
            let value = tree.get(key)?;
            let done = cursor.as_deref().is_some_and(|c| key <= c);
            pre.insert(key.to_vec(), PreImage { value, done });
        }
        Ok(())
    }

    /// Replaces the values of a chunk just read from the live tree (in ascending key order) by
    /// their pre-images: keys created after the capture started are dropped, changed ones get
    /// their old value back.
    pub(crate) fn resolve(&self, chunk: &mut Vec<(IVec, IVec)>) {
        let Some(last) = chunk.last().map(|(k, _)| k.to_vec()) else {
            return;
        };
        let mut inner = self.inner.lock();
        let Inner { pre, cursor } = &mut *inner;
        debug_assert!(
            cursor.as_deref().is_none_or(|c| chunk[0].0.as_ref() > c),
            "an export reads the tree in ascending key order"
        );
        if !pre.is_empty() {
            chunk.retain_mut(|(k, v)| match pre.get_mut(k.as_ref()) {
                None => true,
                Some(p) => {
                    p.done = true;
                    match &p.value {
                        Some(old) => {
                            *v = old.clone();
                            true
                        }
                        None => false,
                    }
                }
            });
        }
        *cursor = Some(last);
    }

    /// The keys that existed at the capture point but were deleted before the exporter reached
    /// them, with their values then. Call once, after the whole tree was read.
    pub(crate) fn leftovers(&self) -> Vec<(IVec, IVec)> {
        let mut inner = self.inner.lock();
        let mut out: Vec<(IVec, IVec)> = inner
            .pre
            .iter_mut()
            .filter(|(_, p)| !p.done)
            .filter_map(|(k, p)| {
                p.done = true;
                p.value.clone().map(|v| (IVec::from(k.as_slice()), v))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// How many pre-images are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().pre.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk_of(tree: &sled::Tree) -> Vec<(IVec, IVec)> {
        tree.iter().map(|r| r.unwrap()).collect()
    }

    #[test]
    fn capture_reconstructs_the_point_in_time_view() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        for k in [b"a", b"b", b"c", b"d"] {
            tree.insert(k, &b"0"[..]).unwrap();
        }
        let cap = Capture::new();

        // Exporter reads and checks "a" and "b".
        let mut first: Vec<(IVec, IVec)> = tree.range(..&b"c"[..]).map(|r| r.unwrap()).collect();
        cap.resolve(&mut first);

        // Writers: change "a" (already exported), delete "c" (not yet), add "e", change "d".
        for (k, v) in [
            (b"a", Some(b"1")),
            (b"c", None),
            (b"e", Some(b"1")),
            (b"d", Some(b"1")),
        ] {
            cap.record(&tree, std::iter::once(&k[..])).unwrap();
            match v {
                Some(v) => tree.insert(k, &v[..]).unwrap(),
                None => tree.remove(k).unwrap(),
            };
        }

        let mut rest: Vec<(IVec, IVec)> = tree.range(&b"c"[..]..).map(|r| r.unwrap()).collect();
        cap.resolve(&mut rest);
        let mut all = first;
        all.extend(rest);
        all.extend(cap.leftovers());
        all.sort();
        let want: Vec<(IVec, IVec)> = [b"a", b"b", b"c", b"d"]
            .iter()
            .map(|k| (IVec::from(&k[..]), IVec::from(&b"0"[..])))
            .collect();
        assert_eq!(all, want);
        assert_eq!(cap.len(), 4);
        let _ = chunk_of(&tree);
    }
}
