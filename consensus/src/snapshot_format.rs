//! The payload of a registry snapshot: a stream of frames, and how it is exported from a
//! registry generation and imported into a fresh one.
//!
//! A frame is `tag (u8) | key length (u32 LE) | key | value length (u32 LE) | value`. Pair
//! frames carry the primary registry records (datanodes, replicas, keys, removed datanodes' epoch
//! floors, and the cluster's settings such as its version) exactly as stored, in key order
//! (keys deleted while the export ran, at their captured values, come last);
//! the last frame is an end frame whose value is the codec-encoded [`Trailer`] with the
//! counts, so a truncated stream is detected even before the file checksum is. The datanode
//! bucket index and the counters are derived data: the importer rebuilds and cross-checks them. The Raft
//! metadata (last log id, membership) travels in the snapshot file's header, not here.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use sled::IVec;

use crate::capture::Capture;
use crate::codec;
use crate::error::{Error, Result};
use crate::keys;
use crate::records::{AppliedRecord, DatanodeRecord, KvRecord, ReplicaBucket, RestoreMark};
use crate::types::SnapshotMeta;

const TAG_PAIR: u8 = 1;
const TAG_END: u8 = 0xFE;
/// Pairs read from the live tree before their pre-images are checked...
const EXPORT_CHUNK: usize = 1024;
/// ...or fewer, once they hold this many bytes (keys' values may be 1 MiB each).
const EXPORT_CHUNK_BYTES: usize = 16 << 20;
/// How many pairs, and bytes, an import holds in memory before it writes them to the tree.
const IMPORT_LIMITS: ImportLimits = ImportLimits {
    pairs: 8192,
    bytes: 32 << 20,
};
/// Largest key or value a frame may carry.
const MAX_FIELD: u32 = 64 << 20;

/// Counts written at the end of the payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Trailer {
    pub pairs: u64,
    pub datanodes: u64,
    pub replicas: u64,
    pub kvs: u64,
}

impl Trailer {
    /// Counts one pair; `replicas` is the number of replicas a bucket value holds.
    fn count(&mut self, key: &[u8], replicas: u64) {
        self.pairs += 1;
        match key.first() {
            Some(&keys::DATANODE) => self.datanodes += 1,
            Some(&keys::REPLICA) => self.replicas += replicas,
            Some(&keys::KV) => self.kvs += 1,
            _ => {}
        }
    }
}

/// The records importing a payload writes, counted before it is imported: the room it takes
/// depends on them more than on its bytes (see `node/free_space.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportRecords {
    /// The payload's pairs, each a record.
    pub pairs: u64,
    /// The datanode index entries the import derives: one per datanode of each bucket.
    pub index_entries: u64,
}

/// Reads a payload to its end and counts the [`ImportRecords`] its import writes. Checks only
/// what the count reads (the frames, the buckets' encoding, nothing after the end frame); the
/// import checks the rest. Memory stays bounded by one frame. Blocking.
pub(crate) fn count_records(input: &mut impl Read) -> Result<ImportRecords> {
    let mut records = ImportRecords::default();
    let mut datanodes = Vec::new();
    loop {
        match read_frame(input)? {
            None => return Err(Error::Snapshot("payload ends without an end frame".into())),
            Some(Frame::End(_)) => {
                // Read to the end: a checksum checked as it is read is checked there.
                if read_frame(input)?.is_some() {
                    return Err(Error::Snapshot("frames after the end frame".into()));
                }
                return Ok(records);
            }
            Some(Frame::Pair(k, v)) => {
                records.pairs += 1;
                if k.first() == Some(&keys::REPLICA) {
                    let bucket: ReplicaBucket = codec::decode(&v).map_err(|e| {
                        Error::corrupt(format!("snapshot record {}", keys::to_hex(&k)), e)
                    })?;
                    datanodes.clear();
                    datanodes.extend(bucket.iter().map(|e| e.datanode));
                    datanodes.sort_unstable();
                    datanodes.dedup();
                    records.index_entries += datanodes.len() as u64;
                }
            }
        }
    }
}

/// How many replicas a pair holds (buckets only). Export trusts its own tree's values.
fn replicas_in(key: &[u8], value: &[u8]) -> u64 {
    if key.first() == Some(&keys::REPLICA) {
        codec::decode::<ReplicaBucket>(value)
            .map(|b| b.len() as u64)
            .unwrap_or(0)
    } else {
        0
    }
}

fn write_frame<W: Write + ?Sized>(
    out: &mut W,
    tag: u8,
    key: &[u8],
    value: &[u8],
) -> io::Result<()> {
    out.write_all(&[tag])?;
    out.write_all(&(key.len() as u32).to_le_bytes())?;
    out.write_all(key)?;
    out.write_all(&(value.len() as u32).to_le_bytes())?;
    out.write_all(value)
}

/// Writes the registry as it was when `capture` started: the live tree read in key order,
/// corrected by the capture's pre-images. Blocking.
/// Stops with [`Error::Shutdown`] between chunks once `stop` is set (the node is closing).
pub(crate) fn export(
    tree: &sled::Tree,
    capture: &Capture,
    out: &mut impl Write,
    stop: &AtomicBool,
) -> Result<Trailer> {
    let mut trailer = Trailer::default();
    let io_err = |e: io::Error| Error::io("write snapshot payload", "snapshot", e);
    let mut chunk: Vec<(IVec, IVec)> = Vec::with_capacity(EXPORT_CHUNK);
    for prefix in keys::PRIMARY {
        let mut iter = tree.scan_prefix([prefix]);
        loop {
            chunk.clear();
            let mut bytes = 0;
            for item in iter.by_ref() {
                let (k, v) = item.map_err(|e| Error::registry("export", e))?;
                bytes += k.len() + v.len();
                chunk.push((k, v));
                if chunk.len() >= EXPORT_CHUNK || bytes >= EXPORT_CHUNK_BYTES {
                    break;
                }
            }
            if chunk.is_empty() {
                break;
            }
            if stop.load(Ordering::Acquire) {
                return Err(Error::Shutdown);
            }
            capture.resolve(&mut chunk);
            for (k, v) in &chunk {
                write_frame(out, TAG_PAIR, k, v).map_err(io_err)?;
                trailer.count(k, replicas_in(k, v));
            }
        }
    }
    for (k, v) in capture.leftovers() {
        if keys::is_primary(&k) {
            write_frame(out, TAG_PAIR, &k, &v).map_err(io_err)?;
            trailer.count(&k, replicas_in(&k, &v));
        }
    }
    let end = codec::encode(&trailer).map_err(|e| Error::corrupt("snapshot trailer", e))?;
    write_frame(out, TAG_END, &[], &end).map_err(io_err)?;
    Ok(trailer)
}

/// One decoded frame.
enum Frame {
    Pair(Vec<u8>, Vec<u8>),
    End(Trailer),
}

fn read_exact_or_eof(input: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut read = 0;
    while read < buf.len() {
        match input.read(&mut buf[read..]) {
            Ok(0) if read == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => read += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn read_field(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FIELD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame field of {len} bytes"),
        ));
    }
    let mut v = vec![0u8; len as usize];
    input.read_exact(&mut v)?;
    Ok(v)
}

fn read_frame(input: &mut impl Read) -> Result<Option<Frame>> {
    let bad = |e: io::Error| Error::Snapshot(format!("reading payload: {e}"));
    let mut tag = [0u8; 1];
    if !read_exact_or_eof(input, &mut tag).map_err(bad)? {
        return Ok(None);
    }
    let key = read_field(input).map_err(bad)?;
    let value = read_field(input).map_err(bad)?;
    match tag[0] {
        TAG_PAIR => Ok(Some(Frame::Pair(key, value))),
        TAG_END => Ok(Some(Frame::End(
            codec::decode(&value).map_err(|e| Error::corrupt("snapshot trailer", e))?,
        ))),
        t => Err(Error::Snapshot(format!("unknown frame tag {t:#x}"))),
    }
}

/// Derived data rebuilt while importing: per datanode, its declared and found replica counts,
/// and the (datanode, bucket) pairs of the index.
#[derive(Default)]
struct Derived {
    per_datanode: HashMap<u64, (u64, u64)>,
    index: BTreeSet<(u64, u64)>,
}

/// Checks one pair (key shape, value decodes, bucket entries sorted, unique and in their
/// bucket) and records what the index needs; returns the replicas it holds.
fn check_pair(key: &[u8], value: &[u8], derived: &mut Derived) -> Result<u64> {
    let what = || format!("snapshot record {}", keys::to_hex(key));
    let bad = |m: &str| Error::Snapshot(format!("{m} in {}", what()));
    match key.first() {
        Some(&keys::DATANODE) => {
            let id = keys::one_id(key).ok_or_else(|| bad("bad key"))?;
            let rec: DatanodeRecord =
                codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            derived.per_datanode.entry(id).or_default().0 = rec.shards;
            Ok(0)
        }
        Some(&keys::REPLICA) => {
            let b = keys::one_id(key).ok_or_else(|| bad("bad key"))?;
            let bucket: ReplicaBucket =
                codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            if bucket.is_empty() {
                return Err(bad("empty bucket"));
            }
            let mut prev: Option<(u64, u64)> = None;
            for e in &bucket {
                if keys::bucket_of(e.shard) != b {
                    return Err(bad("replica outside its bucket"));
                }
                if prev.is_some_and(|p| p >= (e.shard, e.datanode)) {
                    return Err(bad("unsorted or duplicate replicas"));
                }
                prev = Some((e.shard, e.datanode));
                derived.per_datanode.entry(e.datanode).or_default().1 += 1;
                derived.index.insert((e.datanode, b));
            }
            Ok(bucket.len() as u64)
        }
        Some(&keys::KV) => {
            std::str::from_utf8(&key[1..]).map_err(|_| bad("non-UTF-8 key"))?;
            let _: KvRecord = codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            Ok(0)
        }
        Some(&keys::EPOCH_FLOOR) => {
            keys::one_id(key).ok_or_else(|| bad("bad key"))?;
            let _: u64 = codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            Ok(0)
        }
        Some(&keys::SETTING) if key == keys::CLUSTER_VERSION => {
            let _: u32 = codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            Ok(0)
        }
        Some(&keys::SETTING)
            if key == keys::CLUSTER_EPOCH_FLOOR || key == keys::RESTORE_KEYS_HELD =>
        {
            let _: u64 = codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            Ok(0)
        }
        Some(&keys::SETTING) if key == keys::RESTORE_MARK => {
            let _: RestoreMark = codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
            Ok(0)
        }
        // A setting this build does not know: a newer build's, in a snapshot of a cluster whose
        // version is past this build (a downgrade), if the file is not damaged.
        Some(&keys::SETTING) => Err(Error::Snapshot(format!(
            "unknown setting in {}: the snapshot was written by a newer build (run a build of \
             its cluster's version), or is damaged",
            what()
        ))),
        _ => Err(Error::Snapshot(format!("unexpected {}", what()))),
    }
}

/// When an import writes the pairs it holds in memory to the tree.
#[derive(Clone, Copy, Debug)]
struct ImportLimits {
    pairs: usize,
    bytes: usize,
}

/// The pairs an import holds in memory, and the keys it has seen: a key the payload carries
/// twice is refused (the tree would keep one value while the counts checked both).
struct Pending<'a> {
    tree: &'a sled::Tree,
    limits: ImportLimits,
    batch: Vec<(IVec, IVec)>,
    pairs: usize,
    bytes: usize,
    /// The greatest key so far, while every key ascended (an export's scan does): a key above
    /// it is new.
    ascending: Option<IVec>,
    /// Whether a key did not ascend (an export's leftovers come last): from then on every key
    /// is looked up in the tree and in `unordered`.
    unordered_seen: bool,
    /// The keys in `batch` that came after the ascending run.
    unordered: std::collections::HashSet<IVec>,
}

impl<'a> Pending<'a> {
    fn new(tree: &'a sled::Tree, limits: ImportLimits) -> Self {
        Pending {
            tree,
            limits,
            batch: Vec::new(),
            pairs: 0,
            bytes: 0,
            ascending: None,
            unordered_seen: false,
            unordered: std::collections::HashSet::new(),
        }
    }

    /// Adds a pair of the payload; fails if its key came before.
    fn pair(&mut self, k: Vec<u8>, v: Vec<u8>) -> Result<()> {
        // Shared, not copied, by the checks and the batch.
        let k = IVec::from(k);
        let ascends = !self.unordered_seen && self.ascending.as_ref().is_none_or(|l| &k > l);
        if ascends {
            self.ascending = Some(k.clone());
        } else {
            if !self.unordered_seen {
                // Every key so far goes to the tree, where the lookups below find it.
                self.unordered_seen = true;
                self.flush()?;
            }
            let known = self
                .tree
                .contains_key(&k)
                .map_err(|e| Error::registry("import snapshot", e))?;
            if known || !self.unordered.insert(k.clone()) {
                return Err(Error::Snapshot(format!(
                    "snapshot record {} appears twice",
                    keys::to_hex(&k)
                )));
            }
        }
        self.insert(k, v)
    }

    /// Adds a pair the import derived (the index, the metadata).
    fn insert(&mut self, k: impl Into<IVec>, v: impl Into<IVec>) -> Result<()> {
        let (k, v) = (k.into(), v.into());
        self.bytes += k.len() + v.len();
        self.pairs += 1;
        self.batch.push((k, v));
        if self.pairs >= self.limits.pairs || self.bytes >= self.limits.bytes {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the pairs held to the tree, one insert each. Not as one `sled::Tree::apply_batch`:
    /// the import need not be atomic (its generation becomes the registry only once complete),
    /// and sled's memory grows with the pairs of one batch, far beyond their size when they are
    /// many small ones with ascending keys, as an import writes them. Measured with 1 million
    /// pairs of 29 bytes: 3.3 GB in batches of 8,192, 0.2 GB inserted one by one (also faster);
    /// a member installing a 36 MB snapshot of 1 million replicas with scattered shard ids
    /// peaked at 6.6 GB, and 0.43 GB this way.
    fn flush(&mut self) -> Result<()> {
        for (k, v) in self.batch.drain(..) {
            self.tree
                .insert(k, v)
                .map_err(|e| Error::registry("import snapshot", e))?;
        }
        self.pairs = 0;
        self.bytes = 0;
        self.unordered.clear();
        Ok(())
    }
}

/// Imports a payload into the empty `tree`, verifying every record (each key once), the trailer
/// counts and each datanode's replica count, then writes the metadata from `meta`. Every pair
/// read is also handed to `tee` (to keep a local copy of a received snapshot). Memory stays
/// bounded: pairs go to the tree in batches of [`IMPORT_LIMITS`]. Blocking.
pub(crate) fn import(
    input: &mut impl Read,
    tree: &sled::Tree,
    meta: &SnapshotMeta,
    tee: Option<&mut dyn Write>,
) -> Result<Trailer> {
    import_with(input, tree, meta, tee, IMPORT_LIMITS)
}

fn import_with(
    input: &mut impl Read,
    tree: &sled::Tree,
    meta: &SnapshotMeta,
    mut tee: Option<&mut dyn Write>,
    limits: ImportLimits,
) -> Result<Trailer> {
    let mut counted = Trailer::default();
    let mut derived = Derived::default();
    let mut pending = Pending::new(tree, limits);
    let tee_err = |e: io::Error| Error::io("copy snapshot", "snapshot", e);
    let trailer = loop {
        match read_frame(input)? {
            None => return Err(Error::Snapshot("payload ends without an end frame".into())),
            Some(Frame::End(t)) => {
                if let Some(out) = tee.as_deref_mut() {
                    let end =
                        codec::encode(&t).map_err(|e| Error::corrupt("snapshot trailer", e))?;
                    write_frame(out, TAG_END, &[], &end).map_err(tee_err)?;
                }
                break t;
            }
            Some(Frame::Pair(k, v)) => {
                let replicas = check_pair(&k, &v, &mut derived)?;
                if let Some(out) = tee.as_deref_mut() {
                    write_frame(out, TAG_PAIR, &k, &v).map_err(tee_err)?;
                }
                counted.count(&k, replicas);
                pending.pair(k, v)?;
            }
        }
    };
    if read_frame(input)?.is_some() {
        return Err(Error::Snapshot("frames after the end frame".into()));
    }
    if trailer != counted {
        return Err(Error::Snapshot(format!(
            "trailer says {trailer:?} but the payload holds {counted:?}"
        )));
    }
    for (dn, (declared, found)) in &derived.per_datanode {
        if declared != found {
            return Err(Error::Snapshot(format!(
                "datanode {dn} declares {declared} replicas but the snapshot holds {found}"
            )));
        }
    }
    let enc = |what: &'static str, e| Error::corrupt(what, e);
    for (dn, b) in &derived.index {
        pending.insert(&keys::by_datanode(*dn, *b)[..], keys::PRESENT)?;
    }
    let applied = AppliedRecord {
        applied: meta.last_log_id,
        replicas: counted.replicas,
    };
    pending.insert(
        keys::META_APPLIED,
        codec::encode(&applied).map_err(|e| enc("applied", e))?,
    )?;
    pending.insert(
        keys::META_MEMBERSHIP,
        codec::encode(&meta.last_membership).map_err(|e| enc("membership", e))?,
    )?;
    pending.flush()?;
    Ok(counted)
}

#[cfg(test)]
mod tests;
