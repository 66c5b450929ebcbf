//! The in-memory index from LSN to segment and offset, with the effect of truncate and purge
//! markers applied. Built by recovery and kept current by appends; readers look records up here
//! and then read the file without holding any lock.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use super::record::{Kind, RecordMeta};
use super::segment::Segment;
use super::Lsn;

/// Where one record lives and whether it is still visible.
#[derive(Clone, Copy, Debug)]
struct Entry {
    segment: Lsn,
    offset: u64,
    len: u32,
    live: bool,
}

/// A located live record: its segment, the offset of its header and its payload length.
#[derive(Clone, Debug)]
pub(crate) struct Location {
    pub lsn: Lsn,
    pub segment: Arc<Segment>,
    pub offset: u64,
    pub len: u32,
}

/// LSN -> location for every record not purged, and the open segments by first LSN.
#[derive(Debug)]
pub(crate) struct Index {
    /// The LSN of `entries[0]`.
    base: Lsn,
    entries: VecDeque<Entry>,
    segments: BTreeMap<Lsn, Arc<Segment>>,
    purged_to: Lsn,
}

impl Index {
    /// An empty index whose first record will have LSN `base`.
    pub fn new(base: Lsn) -> Self {
        Index {
            base,
            entries: VecDeque::new(),
            segments: BTreeMap::new(),
            purged_to: 0,
        }
    }

    /// The LSN the next record must have.
    pub fn next_lsn(&self) -> Lsn {
        self.base + self.entries.len() as u64
    }

    /// Registers an open segment.
    pub fn add_segment(&mut self, segment: Arc<Segment>) {
        self.segments.insert(segment.first_lsn, segment);
    }

    /// Adds the record `meta` (the next LSN) stored in the segment starting at `segment`, and
    /// applies its effect if it is a marker.
    pub fn push(&mut self, segment: Lsn, meta: &RecordMeta) {
        debug_assert_eq!(meta.lsn, self.next_lsn());
        self.entries.push_back(Entry {
            segment,
            offset: meta.offset,
            len: meta.payload_len,
            live: meta.kind == Kind::Data,
        });
        match meta.kind {
            Kind::Data => {}
            Kind::Truncate => {
                let from = meta.target.max(self.base);
                for lsn in from..meta.lsn {
                    self.entries[(lsn - self.base) as usize].live = false;
                }
            }
            Kind::Purge => {
                let target = meta.target.min(meta.lsn - 1);
                while self.base <= target {
                    self.entries.pop_front();
                    self.base += 1;
                }
                self.purged_to = self.purged_to.max(target);
            }
        }
    }

    /// The live record `lsn`, if any.
    pub fn locate(&self, lsn: Lsn) -> Option<Location> {
        let entry = self.entries.get(lsn.checked_sub(self.base)? as usize)?;
        entry.live.then(|| self.location(lsn, entry))
    }

    /// The live records with LSN in `range`, in order.
    pub fn live_in(&self, range: Range<Lsn>) -> Vec<Location> {
        let start = range.start.max(self.base);
        let end = range.end.min(self.next_lsn());
        (start..end)
            .filter_map(|lsn| {
                let entry = &self.entries[(lsn - self.base) as usize];
                entry.live.then(|| self.location(lsn, entry))
            })
            .collect()
    }

    fn location(&self, lsn: Lsn, entry: &Entry) -> Location {
        Location {
            lsn,
            segment: self.segments[&entry.segment].clone(),
            offset: entry.offset,
            len: entry.len,
        }
    }

    /// The first live record.
    pub fn first_live(&self) -> Option<Lsn> {
        self.entries
            .iter()
            .position(|e| e.live)
            .map(|i| self.base + i as u64)
    }

    /// Every LSN at or below this was purged.
    pub fn purged_to(&self) -> Lsn {
        self.purged_to
    }

    /// Removes and returns, oldest first, the segments (other than the newest) all of whose
    /// records are purged and at or below `up_to`. A purge passes its own target, which its
    /// durable marker covers: `purged_to` may already count a later purge whose marker is not
    /// durable yet, and deleting what that one purges could lose records at a crash.
    pub fn take_obsolete_segments(&mut self, up_to: Lsn) -> Vec<Arc<Segment>> {
        let limit = self.purged_to.min(up_to);
        let firsts: Vec<Lsn> = self.segments.keys().copied().collect();
        let mut out = Vec::new();
        for pair in firsts.windows(2) {
            let (first, next) = (pair[0], pair[1]);
            if next > limit.saturating_add(1) {
                break;
            }
            if let Some(seg) = self.segments.remove(&first) {
                out.push(seg);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{FaultyFileSystem, FileSystem};
    use std::path::Path;

    fn meta(lsn: Lsn, kind: Kind, target: Lsn) -> RecordMeta {
        RecordMeta {
            lsn,
            kind,
            offset: lsn * 100,
            payload_len: 1,
            target,
        }
    }

    fn index_with_segments(firsts: &[Lsn]) -> Index {
        let fs = FaultyFileSystem::new();
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let mut index = Index::new(firsts[0]);
        for &f in firsts {
            index.add_segment(Arc::new(
                Segment::create(&fs, dir, f, None, Default::default()).unwrap(),
            ));
        }
        index
    }

    #[test]
    fn markers_hide_records() {
        let mut index = index_with_segments(&[1, 5]);
        for lsn in 1..=4 {
            index.push(1, &meta(lsn, Kind::Data, 0));
        }
        index.push(5, &meta(5, Kind::Truncate, 3));
        assert!(index.locate(2).is_some());
        assert!(index.locate(3).is_none());
        assert!(index.locate(5).is_none(), "markers are not records");
        index.push(5, &meta(6, Kind::Data, 0));
        let live: Vec<Lsn> = index.live_in(0..100).iter().map(|l| l.lsn).collect();
        assert_eq!(live, vec![1, 2, 6]);
        assert_eq!(index.first_live(), Some(1));

        index.push(5, &meta(7, Kind::Purge, 4));
        assert_eq!(index.first_live(), Some(6));
        assert!(index.locate(1).is_none());
        assert_eq!(index.purged_to(), 4);
        let gone: Vec<Lsn> = index
            .take_obsolete_segments(Lsn::MAX)
            .iter()
            .map(|s| s.first_lsn)
            .collect();
        assert_eq!(gone, vec![1]);
        assert_eq!(index.next_lsn(), 8);
    }

    #[test]
    fn obsolete_segments_stop_at_the_callers_purge() {
        let mut index = index_with_segments(&[1, 3, 5]);
        for lsn in 1..=5 {
            let segment = [1, 3, 5][(lsn as usize - 1) / 2];
            index.push(segment, &meta(lsn, Kind::Data, 0));
        }
        // A later purge's marker (to 4) is in the index; the caller's own purged to 2.
        index.push(5, &meta(6, Kind::Purge, 4));
        let firsts = |segs: Vec<Arc<Segment>>| segs.iter().map(|s| s.first_lsn).collect::<Vec<_>>();
        assert_eq!(firsts(index.take_obsolete_segments(2)), vec![1]);
        assert_eq!(firsts(index.take_obsolete_segments(Lsn::MAX)), vec![3]);
    }

    #[test]
    fn newest_segment_is_never_obsolete() {
        let mut index = index_with_segments(&[1, 3]);
        index.push(1, &meta(1, Kind::Data, 0));
        index.push(1, &meta(2, Kind::Data, 0));
        index.push(3, &meta(3, Kind::Data, 0));
        index.push(3, &meta(4, Kind::Purge, 3));
        let gone: Vec<Lsn> = index
            .take_obsolete_segments(Lsn::MAX)
            .iter()
            .map(|s| s.first_lsn)
            .collect();
        assert_eq!(gone, vec![1]);
        assert!(index.take_obsolete_segments(Lsn::MAX).is_empty());
    }
}
