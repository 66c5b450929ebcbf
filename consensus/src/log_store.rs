//! Raft log storage over the `meta-store` write-ahead log.
//!
//! Every entry is one WAL record; the vote, the committed id and purge/truncation state are
//! WAL records too, so the vote is ordered with the appends around it. An in-memory index maps
//! each live raft index to its WAL record number (LSN); it is rebuilt by replaying the WAL at
//! open.
//!
//! What each call guarantees when it returns:
//! - `append`: the entries are written to the WAL and readable by every reader; the callback
//!   fires from the WAL's barrier thread once a barrier covered them (appends that arrive while
//!   a barrier runs share the next one), or with the log's error. In `Own` barrier mode (the
//!   benchmarks' baseline) every entry waits for a barrier of its own and the callback fires
//!   once all of them completed.
//! - `save_vote`: the vote is durable (it waited for a barrier covering it).
//! - `save_committed`: the committed id is recorded; it is written with the next append (same
//!   write call), in the next record that carries it (a logical truncation, a purge's state)
//!   or at close, and is durable with the barrier after that (a vote does not carry it).
//!   Losing the newest value in a crash is tolerated: openraft recovers it from the cluster, and
//!   the state machine never loses what it applied (sled) beyond what the log re-applies.
//! - `truncate_after`: entries after the given id are gone, durably. When the latest vote
//!   record lies before them, the WAL drops their records (a durable marker); otherwise a
//!   logical truncation record carrying the vote is written and waited for, because dropping
//!   the records would drop the vote too, and a marker plus a re-written vote cannot become
//!   durable atomically. Durable on return, not with the next barrier: openraft installs a
//!   snapshot right after a truncation without waiting for any flush, and a registry made
//!   durable at the snapshot's newer log id beside a log whose truncated entries came back at a
//!   crash is a store openraft refuses to start from ("inverted log order").
//! - `purge`: entries up to the id are gone, durably; the last purged id, vote and committed id
//!   were re-written and made durable first, so dropping old WAL records never loses them. A
//!   failure to remove the segments it emptied, once its marker is durable (the log not
//!   poisoned), is logged rather than returned: openraft would stop the node for it, and the
//!   next open removes them.
//!
//! Nothing here waits for a barrier on the async runtime's threads: appends only write
//! (microseconds, into the page cache) and waiting is an async wait on the barrier thread.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use meta_store::{BarrierMode, FileSystem, Lsn, Wal, WalMetrics, WalOptions};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use parking_lot::{Mutex, RwLock};

use crate::codec;
use crate::error::{Error, Result};
use crate::log_record::{LogRecord, LogRecordRef};
use crate::types::{Entry, LogId, TypeConfig, Vote};

/// Most encoded entry bytes one replication read returns (at least one entry).
pub const MAX_REPLICATION_BYTES: u64 = 4 << 20;

/// The in-memory view of the log.
#[derive(Debug, Default)]
struct Index {
    /// Raft index of `entries[0]` (meaningful when non-empty).
    first: u64,
    /// LSN, log id and encoded size of each live entry, consecutive raft indexes.
    entries: VecDeque<(Lsn, LogId, u32)>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    /// LSN of the record that holds the current vote.
    vote_lsn: Lsn,
    committed: Option<LogId>,
    /// `committed` changed since it was last written.
    committed_dirty: bool,
}

impl Index {
    fn last_log_id(&self) -> Option<LogId> {
        self.entries.back().map(|(_, l, _)| *l).or(self.last_purged)
    }

    fn next_index(&self) -> u64 {
        match (self.entries.back(), &self.last_purged) {
            (Some((_, l, _)), _) => l.index + 1,
            (None, Some(p)) => p.index + 1,
            (None, None) => 0,
        }
    }

    /// Whether an entry at `index` may be appended: it follows the last entry or the purge
    /// point; a log that never held anything starts wherever its first entry is.
    fn accepts(&self, index: u64) -> bool {
        let pristine = self.entries.is_empty() && self.last_purged.is_none();
        pristine || index == self.next_index()
    }

    fn push(&mut self, lsn: Lsn, log_id: LogId, bytes: usize) -> Result<()> {
        let want = self.next_index();
        if !self.accepts(log_id.index) {
            return Err(Error::Raft(format!(
                "log entry {log_id} does not follow the log (next index {want})"
            )));
        }
        if self.entries.is_empty() {
            self.first = log_id.index;
        }
        self.entries
            .push_back((lsn, log_id, u32::try_from(bytes).unwrap_or(u32::MAX)));
        Ok(())
    }

    /// [`Index::push`] for an entry replayed from the files, which may also begin the log's
    /// entries past the purge point (or past entry 0): the records before it are gone, and
    /// [`LogStore::lost_front`] names them.
    fn push_replayed(&mut self, lsn: Lsn, log_id: LogId, bytes: usize) -> Result<()> {
        let past_start = log_id.index >= self.next_index();
        if self.entries.is_empty() && past_start {
            self.first = log_id.index;
            self.entries
                .push_back((lsn, log_id, u32::try_from(bytes).unwrap_or(u32::MAX)));
            return Ok(());
        }
        self.push(lsn, log_id, bytes)
    }

    /// Drops entries with index > `after` (all of them for `None`).
    fn truncate_after(&mut self, after: Option<u64>) {
        let keep = match after {
            None => 0,
            Some(a) if a < self.first => 0,
            Some(a) => (a - self.first + 1) as usize,
        };
        self.entries.truncate(keep.min(self.entries.len()));
    }

    /// Drops entries with index <= `upto` and records it as purged.
    fn purge(&mut self, upto: &LogId) {
        while let Some((_, l, _)) = self.entries.front() {
            if l.index > upto.index {
                break;
            }
            self.entries.pop_front();
            self.first += 1;
        }
        if self.entries.is_empty() {
            self.first = upto.index + 1;
        }
        if self.last_purged.as_ref().is_none_or(|p| p < upto) {
            self.last_purged = Some(*upto);
        }
    }

    /// LSN of the entry at `index`, if live.
    fn lsn_of(&self, index: u64) -> Option<Lsn> {
        if index < self.first {
            return None;
        }
        self.entries
            .get((index - self.first) as usize)
            .map(|(l, _, _)| *l)
    }

    /// Encoded size of the entry at `index` (0 if not live).
    fn size_of(&self, index: u64) -> u64 {
        if index < self.first {
            return 0;
        }
        self.entries
            .get((index - self.first) as usize)
            .map(|(_, _, b)| *b as u64)
            .unwrap_or(0)
    }
}

struct Shared {
    wal: Wal,
    index: RwLock<Index>,
}

/// The log store (and, cloned, its readers).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

/// The storage error `e` of `op` as the `io::Error` openraft takes: one message that says it
/// all, of the innermost IO error's kind (a full disk stays `StorageFull`), and no sources,
/// which openraft would print again after it, each with its own.
fn store_err(op: &'static str) -> impl Fn(meta_store::Error) -> io::Error {
    move |e| {
        let e = Error::storage(op, e);
        let kind = e.io_kinds().last().unwrap_or(io::ErrorKind::Other);
        io::Error::new(kind, e.to_string())
    }
}

fn encode(rec: &LogRecordRef<'_>) -> io::Result<Vec<u8>> {
    codec::encode(rec).map_err(io::Error::from)
}

impl LogStore {
    /// Opens the log in `dir` and rebuilds the index by replaying it. Blocking.
    pub fn open(dir: &Path, opts: WalOptions) -> Result<LogStore> {
        let wal = Wal::open(dir, opts).map_err(|e| Error::storage("open log", e))?;
        Self::replay(wal, dir)
    }

    /// [`LogStore::open`] with the log's files accessed through `fs` (tests inject faults and
    /// crashes that drop unsynced bytes). Blocking.
    pub fn open_with(fs: Arc<dyn FileSystem>, dir: &Path, opts: WalOptions) -> Result<LogStore> {
        let wal = Wal::open_with(fs, dir, opts).map_err(|e| Error::storage("open log", e))?;
        Self::replay(wal, dir)
    }

    /// Rebuilds the index of `wal` (in `dir`) by replaying it.
    fn replay(wal: Wal, dir: &Path) -> Result<LogStore> {
        let mut index = Index::default();
        let records = wal
            .read_range(..)
            .map_err(|e| Error::storage("replay log", e))?;
        let decode = |lsn: Lsn, bytes: &[u8]| -> Result<LogRecord> {
            codec::decode(bytes).map_err(|source| Error::UndecodableLogRecord { lsn, source })
        };
        // The purge point first: the newest purge's record may lie after entries an older
        // purge's record precedes (a purge records the point, then drops the records up to
        // it, which may leave an older purge's record in place after entries it dropped).
        for (lsn, bytes) in &records {
            if codec::variant_index(bytes) != Some(LogRecord::STATE_VARIANT) {
                continue;
            }
            if let LogRecord::State {
                purged: Some(p), ..
            } = decode(*lsn, bytes)?
            {
                index.purge(&p);
            }
        }
        for (lsn, bytes) in records {
            let rec = decode(lsn, &bytes)?;
            match rec {
                LogRecord::Entry(e) => {
                    if index
                        .last_purged
                        .as_ref()
                        .is_some_and(|p| e.log_id.index <= p.index)
                    {
                        continue;
                    }
                    // A gap is damage to the files (a segment lost or cut): say where.
                    index
                        .push_replayed(lsn, e.log_id, bytes.len())
                        .map_err(|e| {
                            Error::Raft(format!(
                                "{e}, at record {lsn} of the log in {}: a segment before it is \
                             missing or damaged",
                                dir.display()
                            ))
                        })?;
                }
                LogRecord::Vote(v) => {
                    index.vote = Some(v);
                    index.vote_lsn = lsn;
                }
                LogRecord::Committed(c) => index.committed = c,
                LogRecord::State {
                    vote,
                    committed,
                    purged,
                } => {
                    index.vote = vote;
                    index.vote_lsn = lsn;
                    index.committed = committed;
                    if let Some(p) = purged {
                        index.purge(&p);
                    }
                }
                LogRecord::Truncated {
                    after,
                    vote,
                    committed,
                } => {
                    index.truncate_after(after.map(|a| a.index));
                    index.vote = vote;
                    index.vote_lsn = lsn;
                    index.committed = committed;
                }
            }
        }
        tracing::info!(
            "opened log in {}: {} entries, last {:?}, purged {:?}",
            dir.display(),
            index.entries.len(),
            index.last_log_id(),
            index.last_purged
        );
        Ok(LogStore {
            shared: Arc::new(Shared {
                wal,
                index: RwLock::new(index),
            }),
        })
    }

    /// The write-ahead log's own metrics.
    pub fn wal_metrics(&self) -> WalMetrics {
        self.shared.wal.metrics()
    }

    pub(crate) fn wal(&self) -> &Wal {
        &self.shared.wal
    }

    /// Writes the committed id if it changed since it was last written (it is otherwise
    /// written with the next append). Called before the log closes.
    pub(crate) fn flush_committed(&self) -> Result<()> {
        let c = {
            let mut idx = self.shared.index.write();
            if !std::mem::take(&mut idx.committed_dirty) {
                return Ok(());
            }
            idx.committed
        };
        let bytes = codec::encode(&LogRecordRef::Committed(&c))
            .map_err(|e| Error::corrupt("committed record", e))?;
        self.shared
            .wal
            .append(&bytes)
            .map(|_| ())
            .map_err(|e| Error::storage("append committed", e))
    }

    /// The last purged log id.
    pub(crate) fn last_purged(&self) -> Option<LogId> {
        self.shared.index.read().last_purged
    }

    /// The entries missing at the front of the log, `(from, to)`, when its first entry does
    /// not follow its purge point (or is not entry 0, the first a cluster's log holds, in a log
    /// never purged): their records are gone (`front_gap.rs`).
    pub(crate) fn lost_front(&self) -> Option<(u64, u64)> {
        let idx = self.shared.index.read();
        let from = idx.last_purged.map_or(0, |p| p.index + 1);
        (!idx.entries.is_empty() && idx.first > from).then(|| (from, idx.first - 1))
    }

    /// The vote of a log that lost the record holding it (its oldest segment was lost), taken
    /// as this log's vote from now on, in memory; [`LogStore::persist_vote`] makes it durable.
    /// Every vote change is written in a record after the ones before it, so a vote whose
    /// record is gone while entries after it remain is the one under which the newest entry
    /// was taken: a node takes a leader's entries only once it holds that leader's vote,
    /// committed, and a later change would be in a later record. The restored vote is the
    /// newest entry's own leader's: that vote, unless a leader of a later term sent the entry
    /// (catching this node up on older entries) and the node stopped before that leader's
    /// first entry, of its own term, arrived; then it is older than the one lost. `None`: the
    /// log holds its vote, or nothing of an elected term.
    pub(crate) fn restore_lost_vote(&self) -> Option<Vote> {
        let mut idx = self.shared.index.write();
        let vote = match idx.last_log_id() {
            Some(last) if idx.vote.is_none() && last.leader_id.term > 0 => {
                Vote::new_committed(last.leader_id.term, last.leader_id.node_id)
            }
            _ => return None,
        };
        idx.vote = Some(vote);
        Some(vote)
    }

    /// Writes `vote`, this log's vote, in a record of its own and waits until it is durable.
    /// Blocking; before Raft starts.
    pub(crate) fn persist_vote(&self, vote: Vote) -> Result<()> {
        let bytes = encode(&LogRecordRef::Vote(&vote))
            .map_err(|e| Error::Raft(format!("encode a restored vote: {e}")))?;
        let wal = &self.shared.wal;
        let lsn = wal
            .append(&bytes)
            .map_err(|e| Error::storage("write a restored vote", e))?;
        wal.sync(lsn)
            .map_err(|e| Error::storage("write a restored vote", e))?;
        self.shared.index.write().vote_lsn = lsn;
        Ok(())
    }

    /// Whether the log holds no Raft state at all: no entry, none purged, no vote (a new member,
    /// or one whose data dir was lost).
    pub(crate) fn holds_no_state(&self) -> bool {
        let idx = self.shared.index.read();
        idx.last_log_id().is_none() && idx.last_purged.is_none() && idx.vote.is_none()
    }

    /// The stored vote, if any.
    pub(crate) fn vote(&self) -> Option<Vote> {
        self.shared.index.read().vote
    }

    /// Whether the stored vote is committed to another node: this node acknowledged that
    /// node as its term's leader, and may have given it a lease (see `node/votes.rs`).
    pub(crate) fn follows_another_leader(&self, me: crate::types::NodeId) -> bool {
        use openraft::vote::RaftLeaderId;
        self.shared
            .index
            .read()
            .vote
            .is_some_and(|v| v.is_committed() && *v.leader_id().node_id() != me)
    }

    /// The last log id and how many entries are held.
    pub fn summary(&self) -> (Option<LogId>, usize) {
        let idx = self.shared.index.read();
        (idx.last_log_id(), idx.entries.len())
    }

    async fn sync(&self, lsn: Lsn) -> io::Result<()> {
        self.shared
            .wal
            .sync_async(lsn)
            .await
            .map_err(store_err("wait for barrier"))
    }

    async fn append_record(&self, rec: &LogRecordRef<'_>) -> io::Result<Lsn> {
        self.write_records(vec![encode(rec)?]).await
    }

    /// Appends `payloads` to the WAL in one write and returns the last LSN. Inline (one
    /// positional write) unless the write moves the log to a new segment, whose syncs and file
    /// creation run on a blocking thread instead of the async runtime.
    async fn write_records(&self, payloads: Vec<Vec<u8>>) -> io::Result<Lsn> {
        let append = |wal: &Wal, payloads: &[Vec<u8>]| {
            let slices: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
            wal.append_batch(&slices)
                .map_err(store_err("append log records"))
        };
        if !self.shared.wal.needs_roll(payloads.iter().map(|p| p.len())) {
            return append(&self.shared.wal, &payloads);
        }
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || append(&shared.wal, &payloads))
            .await
            .map_err(|e| io::Error::other(format!("log append task failed: {e}")))?
    }

    /// Reads the live entries with index in `range`, as of the moment the index is consulted.
    fn read_entries(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry>> {
        let wanted: Vec<(u64, Lsn)> = {
            let idx = self.shared.index.read();
            if idx.entries.is_empty() {
                return Ok(Vec::new());
            }
            let last = idx.first + idx.entries.len() as u64 - 1;
            let start = match range.start_bound() {
                Bound::Included(&s) => s,
                Bound::Excluded(&s) => s.saturating_add(1),
                Bound::Unbounded => 0,
            }
            .max(idx.first);
            let end = match range.end_bound() {
                Bound::Included(&e) => e,
                Bound::Excluded(&0) => return Ok(Vec::new()),
                Bound::Excluded(&e) => e - 1,
                Bound::Unbounded => last,
            }
            .min(last);
            if start > end {
                return Ok(Vec::new());
            }
            (start..=end)
                .map(|i| (i, idx.lsn_of(i).expect("index within the live range")))
                .collect()
        };
        let (first_lsn, last_lsn) = (wanted[0].1, wanted[wanted.len() - 1].1);
        let records = if wanted.len() == 1 {
            self.shared
                .wal
                .read(first_lsn)
                .map_err(store_err("read log entry"))?
                .map(|b| vec![(first_lsn, b)])
                .unwrap_or_default()
        } else {
            self.shared
                .wal
                .read_range(first_lsn..=last_lsn)
                .map_err(store_err("read log entries"))?
        };
        // Merge: keep the records whose LSN is wanted, in order. A record that vanished was
        // purged (at the front) or truncated (at the back) after the index was consulted.
        let mut out = Vec::with_capacity(wanted.len());
        let mut recs = records.into_iter().peekable();
        for (i, lsn) in wanted {
            while recs.peek().is_some_and(|(l, _)| *l < lsn) {
                recs.next();
            }
            match recs.peek() {
                Some((l, _)) if *l == lsn => {
                    let (_, bytes) = recs.next().expect("peeked");
                    match codec::decode::<LogRecord>(&bytes)
                        .map_err(|source| Error::UndecodableLogRecord { lsn, source })?
                    {
                        LogRecord::Entry(e) if e.log_id.index == i => out.push(e),
                        _ => {
                            return Err(Error::Raft(format!(
                                "log record {lsn} is not the entry at index {i}"
                            ))
                            .into())
                        }
                    }
                }
                _ if out.is_empty() => continue,
                _ => break,
            }
        }
        Ok(out)
    }
}

impl LogStore {
    /// [`LogStore::read_entries`] without blocking the runtime on the disk: a range that starts
    /// in the segment being written is read inline (its pages were just written, so they are
    /// cached, and replication reads there on every append); one that starts in an older
    /// segment, as a lagging follower's does, is read on a blocking thread.
    /// `start` must not be below the first live index, or the range is read inline wherever it
    /// starts.
    async fn read_entries_async(&self, start: u64, end: Bound<u64>) -> io::Result<Vec<Entry>> {
        if self.reads_inline(start) {
            return self.read_entries((Bound::Included(start), end));
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.read_entries((Bound::Included(start), end)))
            .await
            .map_err(io::Error::other)?
    }

    /// Whether a read from `start` runs inline: it starts in the segment being written, or at
    /// no live entry.
    fn reads_inline(&self, start: u64) -> bool {
        let first_lsn = self.shared.index.read().lsn_of(start);
        first_lsn.is_none_or(|lsn| self.shared.wal.in_tail(lsn))
    }

    /// The range `[start, end)` a replication read of `[start, end)` reads: from the first
    /// live index at the earliest, up to `MAX_REPLICATION_BYTES` of entries.
    fn replication_range(&self, start: u64, end: u64) -> (u64, u64) {
        let idx = self.shared.index.read();
        let start = start.max(idx.first);
        let mut stop = start;
        let mut bytes = 0u64;
        while stop < end && idx.lsn_of(stop).is_some() && bytes < MAX_REPLICATION_BYTES {
            bytes += idx.size_of(stop);
            stop += 1;
        }
        (start, stop)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let start = start.max(self.shared.index.read().first);
        self.read_entries_async(start, range.end_bound().cloned())
            .await
    }

    /// Replication reads through here: at most `MAX_REPLICATION_BYTES` of encoded entries
    /// (at least one entry), so a transport never has to carry an unbounded message.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        let (start, end) = self.replication_range(start, end);
        self.read_entries_async(start, Bound::Excluded(end)).await
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.shared.index.read().vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let idx = self.shared.index.read();
        Ok(LogState {
            last_purged_log_id: idx.last_purged,
            last_log_id: idx.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let lsn = self.append_record(&LogRecordRef::Vote(vote)).await?;
        self.sync(lsn).await?;
        let mut idx = self.shared.index.write();
        idx.vote = Some(*vote);
        idx.vote_lsn = lsn;
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Written with the next append (one write instead of two), or by `flush_committed`.
        let mut idx = self.shared.index.write();
        idx.committed = committed;
        idx.committed_dirty = true;
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.shared.index.read().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        // A committed id not yet written goes first, in the same write as the entries.
        let pending_committed = {
            let mut idx = self.shared.index.write();
            std::mem::take(&mut idx.committed_dirty).then_some(idx.committed)
        };
        let mut payloads = Vec::with_capacity(entries.len() + 1);
        if let Some(c) = &pending_committed {
            payloads.push(encode(&LogRecordRef::Committed(c))?);
        }
        for e in &entries {
            payloads.push(encode(&LogRecordRef::Entry(e))?);
        }
        {
            let idx = self.shared.index.read();
            let want = idx.next_index();
            if !idx.accepts(entries[0].log_id.index) {
                return Err(Error::Raft(format!(
                    "append of {} would leave a hole: next index is {want}",
                    entries[0].log_id
                ))
                .into());
            }
        }
        let lens: Vec<usize> = payloads.iter().map(|p| p.len()).collect();
        let last_lsn = self.write_records(payloads).await?;
        let first_lsn = last_lsn + 1 - entries.len() as u64;
        {
            let mut idx = self.shared.index.write();
            let skip = lens.len() - entries.len();
            for (i, e) in entries.iter().enumerate() {
                idx.push(first_lsn + i as u64, e.log_id, lens[skip + i])
                    .map_err(io::Error::from)?;
            }
        }
        let flushed = move |res: meta_store::Result<()>| {
            callback.io_completed(res.map_err(|e| Error::storage("log barrier", e).into()))
        };
        if self.shared.wal.barrier_mode() == BarrierMode::Own && entries.len() > 1 {
            // The design without shared barriers: every entry (every client write) waits for a
            // barrier of its own, as if each had been appended alone. openraft's batching would
            // otherwise let one barrier cover a whole batch even here.
            let flushed = Arc::new(Mutex::new(Some(flushed)));
            let left = Arc::new(AtomicUsize::new(entries.len()));
            for lsn in first_lsn..=last_lsn {
                let (flushed, left) = (flushed.clone(), left.clone());
                self.shared.wal.on_durable(
                    lsn,
                    Box::new(move |res| {
                        if res.is_err() || left.fetch_sub(1, Ordering::AcqRel) == 1 {
                            if let Some(flushed) = flushed.lock().take() {
                                flushed(res);
                            }
                        }
                    }),
                );
            }
            return Ok(());
        }
        self.shared.wal.on_durable(last_lsn, Box::new(flushed));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let after = last_log_id.as_ref().map(|l| l.index);
        let (first_gone, vote_lsn, vote, committed) = {
            let idx = self.shared.index.read();
            let first_gone = match after {
                None => idx.entries.front().map(|(lsn, _, _)| *lsn),
                Some(a) => a.checked_add(1).and_then(|i| idx.lsn_of(i)),
            };
            (first_gone, idx.vote_lsn, idx.vote, idx.committed)
        };
        let Some(first_gone) = first_gone else {
            return Ok(());
        };
        if vote_lsn < first_gone {
            // The vote survives a physical truncation; re-write the committed id in case its
            // record was among the dropped ones.
            // `truncate_from` waits for a barrier: run it off the runtime.
            let shared = self.shared.clone();
            tokio::task::spawn_blocking(move || shared.wal.truncate_from(first_gone))
                .await
                .map_err(|e| io::Error::other(format!("truncate task failed: {e}")))?
                .map_err(store_err("truncate log"))?;
            self.shared.index.write().truncate_after(after);
            self.append_record(&LogRecordRef::Committed(&committed))
                .await?;
            self.shared.index.write().committed_dirty = false;
        } else {
            // Dropping the records from `first_gone` would drop the current vote: truncate
            // logically, with the vote in the same record, and wait for it (see the module's
            // comment: nothing applied or installed after this may outlive it in a crash).
            let lsn = self
                .append_record(&LogRecordRef::Truncated {
                    after: &last_log_id,
                    vote: &vote,
                    committed: &committed,
                })
                .await?;
            self.sync(lsn).await?;
            let mut idx = self.shared.index.write();
            idx.truncate_after(after);
            idx.committed_dirty = false;
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let (upto_lsn, vote, committed) = {
            let idx = self.shared.index.read();
            if idx.last_purged.as_ref().is_some_and(|p| p >= &log_id) {
                return Ok(());
            }
            let upto = idx
                .entries
                .iter()
                .take_while(|(_, l, _)| l.index <= log_id.index)
                .last()
                .map(|(lsn, _, _)| *lsn);
            (upto, idx.vote, idx.committed)
        };
        let purged = Some(log_id);
        let state_lsn = self
            .append_record(&LogRecordRef::State {
                vote: &vote,
                committed: &committed,
                purged: &purged,
            })
            .await?;
        self.sync(state_lsn).await?;
        {
            let mut idx = self.shared.index.write();
            idx.purge(&log_id);
            idx.vote_lsn = state_lsn;
            idx.committed_dirty = false;
        }
        if let Some(lsn) = upto_lsn {
            // `purge_to` waits for a barrier and deletes files: run it off the runtime.
            let shared = self.shared.clone();
            let purged = tokio::task::spawn_blocking(move || shared.wal.purge_to(lsn))
                .await
                .map_err(|e| io::Error::other(format!("purge task failed: {e}")))?;
            let purged = purged.map_err(store_err("purge log"))?;
            // The purge is durable; only the removal of the segments it emptied is not done, or
            // not durable: the next open (or directory fsync) finishes it. openraft takes a
            // failed purge for a failed disk and stops the node: this one is not.
            if let Some(e) = purged.leftover {
                tracing::warn!(
                    "purged the log up to {log_id}, but the removal of its old segments is not \
                     finished ({e}); a later open or directory fsync finishes it"
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
