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
use crate::records::{AppliedRecord, DatanodeRecord, KvRecord, ReplicaBucket};
use crate::types::SnapshotMeta;

const TAG_PAIR: u8 = 1;
const TAG_END: u8 = 0xFE;
/// Pairs read from the live tree before their pre-images are checked.
const EXPORT_CHUNK: usize = 1024;
/// Pairs per sled batch when importing.
const IMPORT_CHUNK: usize = 8192;
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
            for item in iter.by_ref().take(EXPORT_CHUNK) {
                chunk.push(item.map_err(|e| Error::registry("export", e))?);
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
        Some(&keys::SETTING) if key == keys::CLUSTER_EPOCH_FLOOR => {
            let _: u64 = codec::decode(value).map_err(|e| Error::corrupt(what(), e))?;
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

/// Imports a payload into the empty `tree`, verifying every record, the trailer counts and
/// each datanode's replica count, then writes the metadata from `meta`. Every pair read is
/// also handed to `tee` (to keep a local copy of a received snapshot). Blocking.
pub(crate) fn import(
    input: &mut impl Read,
    tree: &sled::Tree,
    meta: &SnapshotMeta,
    mut tee: Option<&mut dyn Write>,
) -> Result<Trailer> {
    let mut counted = Trailer::default();
    let mut derived = Derived::default();
    let mut batch = sled::Batch::default();
    let mut in_batch = 0usize;
    let flush = |batch: &mut sled::Batch| -> Result<()> {
        tree.apply_batch(std::mem::take(batch))
            .map_err(|e| Error::registry("import snapshot", e))
    };
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
                batch.insert(k, v);
                in_batch += 1;
                if in_batch >= IMPORT_CHUNK {
                    flush(&mut batch)?;
                    in_batch = 0;
                }
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
        batch.insert(&keys::by_datanode(*dn, *b)[..], keys::PRESENT);
        in_batch += 1;
        if in_batch >= IMPORT_CHUNK {
            flush(&mut batch)?;
            in_batch = 0;
        }
    }
    let applied = AppliedRecord {
        applied: meta.last_log_id,
        replicas: counted.replicas,
    };
    batch.insert(
        keys::META_APPLIED,
        codec::encode(&applied).map_err(|e| enc("applied", e))?,
    );
    batch.insert(
        keys::META_MEMBERSHIP,
        codec::encode(&meta.last_membership).map_err(|e| enc("membership", e))?,
    );
    flush(&mut batch)?;
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply_batch::ApplyBatch;
    use crate::command::{Command, CommandResult, ShardReport};
    use crate::registry::Registry;

    fn apply(reg: &Registry, index: u64, cmd: Command) {
        let g = reg.current();
        let mut b = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
        b.execute(index, &cmd).unwrap();
        g.commit(b.finish().unwrap()).unwrap();
    }

    fn shards(range: std::ops::Range<u64>, generation: u64) -> Vec<ShardReport> {
        range
            .map(|id| ShardReport {
                id,
                generation,
                size: id,
            })
            .collect()
    }

    fn registry() -> (tempfile::TempDir, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path(), 1 << 20).unwrap();
        (dir, reg)
    }

    /// The registry's content as a snapshot payload.
    fn exported(reg: &Registry) -> Vec<u8> {
        let g = reg.current();
        let capture = g.start_capture();
        let mut out = Vec::new();
        export(&g.tree, &capture, &mut out, &AtomicBool::new(false)).unwrap();
        g.end_capture(&capture);
        out
    }

    /// A registry whose entry 1 registered datanode 1.
    fn registry_with_datanode() -> (tempfile::TempDir, Registry) {
        let (dir, reg) = registry();
        apply(
            &reg,
            1,
            Command::RegisterDatanode {
                id: 1,
                addr: "a".into(),
            },
        );
        (dir, reg)
    }

    #[test]
    fn export_during_writes_imports_the_captured_point() {
        let (_d, reg) = registry_with_datanode();
        apply(
            &reg,
            2,
            Command::RegisterDatanode {
                id: 2,
                addr: "b".into(),
            },
        );
        apply(
            &reg,
            3,
            Command::RegisterShards {
                datanode: 1,
                epoch: 1,
                shards: shards(0..3000, 1),
            },
        );
        apply(
            &reg,
            4,
            Command::RegisterShards {
                datanode: 2,
                epoch: 2,
                shards: shards(1000..1500, 1),
            },
        );
        apply(
            &reg,
            5,
            Command::Put {
                key: "k".into(),
                value: vec![1],
                if_revision: None,
            },
        );
        let before = reg.content().unwrap();

        let g = reg.current();
        let capture = g.start_capture();
        // Export the first part of the tree, then write, then export the rest.
        let mut out = Vec::new();
        let trailer = {
            // Writes that land before, inside and after the exporter's position.
            apply(
                &reg,
                6,
                Command::RegisterShards {
                    datanode: 1,
                    epoch: 1,
                    shards: shards(0..10, 2),
                },
            );
            apply(&reg, 7, Command::RemoveDatanode { id: 2 });
            apply(
                &reg,
                8,
                Command::RegisterShards {
                    datanode: 1,
                    epoch: 1,
                    shards: shards(5000..5100, 1),
                },
            );
            apply(
                &reg,
                9,
                Command::Delete {
                    key: "k".into(),
                    if_revision: None,
                },
            );
            apply(
                &reg,
                10,
                Command::RegisterDatanode {
                    id: 3,
                    addr: "c".into(),
                },
            );
            export(&g.tree, &capture, &mut out, &AtomicBool::new(false)).unwrap()
        };
        g.end_capture(&capture);
        assert_eq!(trailer.replicas, 3500);
        assert_eq!(trailer.datanodes, 2);
        assert_eq!(trailer.kvs, 1);
        assert_ne!(reg.content().unwrap(), before, "the live registry moved on");

        let (_d2, other) = registry();
        let r = other.begin_replace().unwrap();
        let meta = SnapshotMeta::default();
        let imported = import(&mut out.as_slice(), r.tree(), &meta, None).unwrap();
        assert_eq!(imported, trailer);
        other.finish_replace(r).unwrap();
        assert_eq!(other.content().unwrap(), before);
        assert_eq!(other.current().replica_count().unwrap(), 3500);
        // The rebuilt index lists each datanode's replicas.
        assert_eq!(
            other.datanode_shards(2, None, 1000).unwrap().items.len(),
            500
        );
    }

    #[test]
    fn epoch_floors_travel_in_a_snapshot() {
        let (_d, reg) = registry();
        apply(&reg, 1, Command::RaiseEpochFloor { at_least: 40 });
        apply(
            &reg,
            2,
            Command::RegisterDatanodeAtLeast {
                id: 1,
                addr: "a".into(),
                min_epoch: 50,
            },
        );
        apply(
            &reg,
            3,
            Command::RemoveDatanodePiece {
                id: 1,
                registered_index: None,
            },
        );
        let before = reg.content().unwrap();
        // Exported as of the capture: the id's registration after it deletes the id's floor, and
        // a raise changes the cluster's.
        let g = reg.current();
        let capture = g.start_capture();
        let register = Command::RegisterDatanode {
            id: 1,
            addr: "a".into(),
        };
        apply(&reg, 4, register);
        apply(&reg, 5, Command::RaiseEpochFloor { at_least: 90 });
        assert_ne!(reg.content().unwrap(), before);
        let mut out = Vec::new();
        export(&g.tree, &capture, &mut out, &AtomicBool::new(false)).unwrap();
        g.end_capture(&capture);

        let (_d2, other) = registry();
        let r = other.begin_replace().unwrap();
        import(
            &mut out.as_slice(),
            r.tree(),
            &SnapshotMeta::default(),
            None,
        )
        .unwrap();
        other.finish_replace(r).unwrap();
        assert_eq!(other.content().unwrap(), before);
        // On the member that installed the snapshot, the id's next registration starts above
        // the removed datanode's epoch, and another id's at the cluster's floor.
        let g = other.current();
        let mut b = ApplyBatch::new(g.tree.clone(), 0);
        for (index, id, epoch) in [(3, 1, 51), (4, 2, 40)] {
            let register = Command::RegisterDatanode {
                id,
                addr: "a".into(),
            };
            assert_eq!(
                b.execute(index, &register).unwrap(),
                CommandResult::DatanodeRegistered { id, epoch }
            );
        }
    }

    #[test]
    fn a_setting_of_a_newer_build_is_refused_saying_so() {
        let (_d, reg) = registry_with_datanode();
        let g = reg.current();
        g.tree
            .insert(b"sfuture", codec::encode(&1u64).unwrap())
            .unwrap();
        let out = exported(&reg);
        let (_d2, other) = registry();
        let r = other.begin_replace().unwrap();
        let meta = SnapshotMeta::default();
        let refused = import(&mut out.as_slice(), r.tree(), &meta, None).unwrap_err();
        other.abort_replace(r);
        assert!(refused.to_string().contains("newer build"), "{refused}");
    }

    #[test]
    fn export_stops_when_the_node_closes() {
        let (_d, reg) = registry_with_datanode();
        let g = reg.current();
        let c = g.start_capture();
        let mut out = Vec::new();
        let e = export(&g.tree, &c, &mut out, &AtomicBool::new(true)).unwrap_err();
        assert!(matches!(e, Error::Shutdown), "{e}");
        assert!(out.is_empty(), "nothing written after the stop");
        g.end_capture(&c);
    }

    #[test]
    fn damaged_payloads_are_refused_and_change_nothing() {
        let (_d, reg) = registry_with_datanode();
        apply(
            &reg,
            2,
            Command::RegisterShards {
                datanode: 1,
                epoch: 1,
                shards: shards(0..200, 1),
            },
        );
        let out = exported(&reg);

        let (_d2, other) = registry();
        let meta = SnapshotMeta::default();
        for bad in [
            out[..out.len() - 3].to_vec(),
            out[..out.len() / 2].to_vec(),
            {
                let mut v = out.clone();
                let n = v.len();
                v[n / 2] ^= 0xff;
                v
            },
            [out.clone(), out.clone()].concat(),
        ] {
            let r = other.begin_replace().unwrap();
            assert!(import(&mut bad.as_slice(), r.tree(), &meta, None).is_err());
            other.abort_replace(r);
            assert!(
                other.content().unwrap().is_empty(),
                "the registry is unchanged"
            );
        }
    }
}
