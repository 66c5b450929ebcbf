//! Tests of the snapshot payload: export at a capture point, import's checks, and its bounds.

use super::*;
use crate::apply_batch::ApplyBatch;
use crate::command::{Command, CommandResult, ShardReport};
use crate::registry::Registry;

fn apply(reg: &Registry, index: u64, cmd: Command) -> CommandResult {
    let g = reg.current();
    let mut b = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
    let result = b.execute(index, &cmd).unwrap();
    g.commit(b.finish().unwrap()).unwrap();
    result
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

/// A payload's pairs, in order.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// `out` with its pairs edited by `edit`, and a trailer that counts them.
fn rewritten(out: &[u8], edit: impl FnOnce(&mut Pairs)) -> Vec<u8> {
    let mut input = out;
    let mut pairs = Vec::new();
    while let Some(Frame::Pair(k, v)) = read_frame(&mut input).unwrap() {
        pairs.push((k, v));
    }
    edit(&mut pairs);
    let mut trailer = Trailer::default();
    let mut payload = Vec::new();
    for (k, v) in &pairs {
        write_frame(&mut payload, TAG_PAIR, k, v).unwrap();
        trailer.count(k, replicas_in(k, v));
    }
    write_frame(
        &mut payload,
        TAG_END,
        &[],
        &codec::encode(&trailer).unwrap(),
    )
    .unwrap();
    payload
}

fn imports(payload: &[u8]) -> Result<(tempfile::TempDir, Registry)> {
    let (d, other) = registry();
    let r = other.begin_replace().unwrap();
    match import(&mut &payload[..], r.tree(), &SnapshotMeta::default(), None) {
        Ok(_) => {
            other.finish_replace(r).unwrap();
            Ok((d, other))
        }
        Err(e) => {
            other.abort_replace(r);
            assert!(other.content().unwrap().is_empty(), "nothing was imported");
            Err(e)
        }
    }
}

#[test]
fn a_key_carried_twice_is_refused() {
    let (_d, reg) = registry_with_datanode();
    for (index, key) in [(2, "a"), (3, "b"), (4, "c")] {
        let put = Command::Put {
            key: key.into(),
            value: vec![index as u8],
            if_revision: None,
        };
        apply(&reg, index, put);
    }
    apply(
        &reg,
        5,
        Command::RegisterShards {
            datanode: 1,
            epoch: 1,
            shards: shards(0..100, 1),
        },
    );
    let out = exported(&reg);
    let is_kv = |k: &[u8]| k.first() == Some(&keys::KV);
    let kv_at = |pairs: &Pairs| pairs.iter().position(|(k, _)| is_kv(k)).unwrap();
    // A key moved to the end (as an export's leftovers are) is imported.
    let moved = rewritten(&out, |pairs| {
        let p = pairs.remove(kv_at(pairs));
        pairs.push(p);
    });
    let (_d2, other) = imports(&moved).unwrap();
    assert_eq!(other.content().unwrap(), reg.content().unwrap());
    // Twice in a row, twice with another value after the ascending run, or twice after it:
    // each is refused, whatever the counts say.
    let twice: [&dyn Fn(&mut Pairs); 3] = [
        &|pairs| {
            let i = kv_at(pairs);
            pairs.insert(i, pairs[i].clone());
        },
        &|pairs| {
            let (k, _) = pairs[kv_at(pairs)].clone();
            let other_value = pairs[kv_at(pairs) + 1].1.clone();
            pairs.push((k, other_value));
        },
        &|pairs| {
            let i = kv_at(pairs);
            let p = pairs.remove(i);
            pairs.push(p.clone());
            pairs.push(p);
        },
    ];
    for edit in twice {
        let Err(refused) = imports(&rewritten(&out, edit)) else {
            panic!("a key carried twice was imported");
        };
        assert!(refused.to_string().contains("appears twice"), "{refused}");
    }
}

#[test]
fn an_import_holds_a_bounded_number_of_bytes_in_memory() {
    let (_d, reg) = registry();
    for index in 1..=4u64 {
        let put = Command::Put {
            key: format!("k{index}"),
            value: vec![7; 1 << 20],
            if_revision: None,
        };
        apply(&reg, index, put);
    }
    let out = exported(&reg);
    // A damaged end: the pairs before it went to the tree (the import held at most about
    // 2 MiB of them), far fewer than the pair limit.
    let damaged = &out[..out.len() - 3];
    let (_d2, other) = registry();
    let r = other.begin_replace().unwrap();
    let limits = ImportLimits {
        pairs: 1000,
        bytes: 2 << 20,
    };
    let meta = SnapshotMeta::default();
    import_with(&mut &damaged[..], r.tree(), &meta, None, limits).unwrap_err();
    assert!(
        r.tree().scan_prefix([keys::KV]).count() >= 2,
        "pairs are written to the tree once they hold the byte limit"
    );
    other.abort_replace(r);
}

#[test]
fn the_records_an_import_writes_are_counted_before_it() {
    let (_d, reg) = registry_with_datanode();
    for (index, id) in [(2, 2), (3, 3)] {
        let addr = format!("n{id}");
        apply(&reg, index, Command::RegisterDatanode { id, addr });
    }
    // Bucket 0 holds replicas of datanodes 1 and 2 (two index entries); bucket 15 and one far
    // away hold one datanode's each.
    let far = 1 << 40;
    for (index, datanode, ids) in [
        (4, 1, (0..10).collect::<Vec<u64>>()),
        (5, 2, vec![5, 6, 1000]),
        (6, 3, vec![far]),
    ] {
        let shards = ids
            .into_iter()
            .flat_map(|id| shards(id..id + 1, 1))
            .collect();
        let epoch = datanode;
        apply(
            &reg,
            index,
            Command::RegisterShards {
                datanode,
                epoch,
                shards,
            },
        );
    }
    let payload = exported(&reg);

    let records = count_records(&mut &payload[..]).unwrap();
    assert_eq!(records.index_entries, 4, "{records:?}");
    let (_d2, imported) = imports(&payload).unwrap();
    let g = imported.current();
    let written = |prefix: u8| g.tree.scan_prefix([prefix]).count() as u64;
    let index = written(keys::BY_DATANODE);
    assert_eq!(records.index_entries, index);
    let primary: u64 = keys::PRIMARY.iter().map(|&p| written(p)).sum();
    assert_eq!(records.pairs, primary);
    assert_eq!(primary, 3 + 3, "datanodes and buckets");

    // A payload cut short has no count.
    let cut = &payload[..payload.len() - 3];
    assert!(count_records(&mut &cut[..]).is_err());
}

/// A restore's mark, and its hold on keys, travel in a snapshot: a member that installs one, or
/// a backup taken from it, holds the mark as the cluster did, and refuses a client's key write.
#[test]
fn a_restore_mark_travels_in_a_snapshot() {
    let (_d, reg) = registry();
    let origin = crate::records::RestoreOrigin {
        index: 9,
        datanodes: 1,
        replicas: 2,
        keys: 3,
    };
    apply(
        &reg,
        1,
        Command::BeginRestoreHoldingKeys {
            at_least: 50,
            origin,
        },
    );
    let (_d2, other) = imports(&exported(&reg)).unwrap();
    assert_eq!(other.content().unwrap(), reg.content().unwrap());
    let mark = other.current().restore_mark().unwrap();
    assert_eq!(
        mark,
        Some(RestoreMark {
            claimed_at: 1,
            floor: 50,
            origin
        })
    );
    let put = Command::Put {
        key: "k".into(),
        value: b"v".to_vec(),
        if_revision: None,
    };
    assert_eq!(
        apply(&other, 2, put),
        CommandResult::RestoreUnderWay { claimed_at: 1 }
    );
}
