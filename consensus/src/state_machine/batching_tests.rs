//! Applying is deterministic whatever the batching: random command sequences applied entry by
//! entry with a commit after each, in deferred batches cut at random points, and as heavy
//! entries give the same result for every command and the same registry (members apply the
//! same log with different timing, so their batches are cut in different places), and a
//! snapshot of it installed elsewhere holds the same registry, and the change feed's events,
//! replayed, give it too. Seeded: a failure names its seed.

use super::tests::{entry, installed, open, snapshot_now};
use super::*;
use crate::command::ShardReport;

/// A random command sequence over a few datanodes, shards in many buckets and a few keys.
/// Epochs are mostly the datanode's latest registration index (its epoch unless a floor
/// raised it), sometimes another: fenced batches are part of the test.
fn commands(rng: &mut fastrand::Rng, n: usize) -> Vec<Command> {
    let mut out = Vec::with_capacity(n);
    let mut registered: [u64; 4] = [0; 4];
    for i in 0..n {
        let index = i as u64 + 1;
        let dn = rng.u64(1..=4);
        let epoch = if rng.u8(0..5) == 0 {
            rng.u64(0..index + 2)
        } else {
            registered[(dn - 1) as usize]
        };
        // Now and then a large batch, so that prunes and removals take several pieces.
        let shards = |rng: &mut fastrand::Rng| -> Vec<u64> {
            let (count, range) = if rng.u8(0..12) == 0 {
                (rng.usize(2000..6000), 0..20_000)
            } else {
                (rng.usize(1..20), 0..300)
            };
            let mut s: Vec<u64> = (0..count).map(|_| rng.u64(range.clone())).collect();
            s.sort_unstable();
            s.dedup();
            s
        };
        let key = format!("k{}", rng.u8(0..5));
        let cmd = match rng.u8(0..20) {
            0..=2 => {
                registered[(dn - 1) as usize] = index;
                Command::RegisterDatanode {
                    id: dn,
                    addr: format!("dn{dn}:1"),
                }
            }
            3..=8 => Command::RegisterShards {
                datanode: dn,
                epoch,
                shards: shards(rng)
                    .into_iter()
                    .map(|id| ShardReport {
                        id,
                        generation: rng.u64(1..4),
                        size: rng.u64(0..100),
                    })
                    .collect(),
            },
            9 => Command::DeregisterShards {
                datanode: dn,
                shards: shards(rng),
            },
            10 => Command::PruneReplicas {
                datanode: dn,
                epoch,
                from_bucket: rng.u64(0..3),
            },
            11 => Command::RemoveDatanode { id: dn },
            12 => Command::RemoveDatanodePiece {
                id: dn,
                registered_index: if rng.bool() {
                    None
                } else {
                    Some(registered[(dn - 1) as usize])
                },
            },
            13 => Command::SetClusterVersion {
                version: rng.u32(1..=4),
            },
            14 => Command::RaiseEpochFloor {
                at_least: rng.u64(0..index + 5),
            },
            15 => Command::RegisterDatanodeAtLeast {
                id: dn,
                addr: format!("dn{dn}:2"),
                min_epoch: rng.u64(0..index + 5),
            },
            16 | 17 => Command::Put {
                key,
                value: vec![rng.u8(..)],
                if_revision: match rng.u8(0..3) {
                    0 => None,
                    1 => Some(0),
                    _ => Some(rng.u64(0..index + 1)),
                },
            },
            _ => Command::Delete {
                key,
                if_revision: if rng.bool() {
                    None
                } else {
                    Some(rng.u64(0..index + 1))
                },
            },
        };
        out.push(cmd);
    }
    out
}

/// [`commands`] as entries at indexes from 1.
pub(super) fn random_entries(rng: &mut fastrand::Rng, n: usize) -> Vec<Entry> {
    commands(rng, n)
        .into_iter()
        .enumerate()
        .map(|(i, c)| entry(i as u64 + 1, c))
        .collect()
}

/// A registry's keys and values, in order.
type Contents = Vec<(Vec<u8>, Vec<u8>)>;

/// Every key and value of the registry's active generation, but the last commit's redo record
/// (which holds that commit's writes, so it depends on where the last batch was cut).
fn contents(sm: &StateMachine) -> Contents {
    sm.shared().commit_deferred().unwrap();
    sm.shared()
        .registry
        .current()
        .tree
        .iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .filter(|(k, _)| k.as_slice() != crate::keys::META_REDO)
        .collect()
}

/// How an arm feeds the entries to the state machine.
#[derive(Clone, Copy, Debug)]
enum Feed {
    /// One entry per call, a commit after each.
    EachCommitted,
    /// Deferred calls of random sizes, committed at random points.
    RandomCuts,
    /// Heavy calls of random sizes.
    Heavy,
}

/// One arm: the results, the registry, and the state machine with its dir.
type Arm = (
    Vec<CommandResult>,
    Contents,
    StateMachine,
    tempfile::TempDir,
);

fn run(seed: u64, entries: &[Entry], feed: Feed) -> Arm {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    let shared = sm.shared();
    // The whole history, for the feed check.
    shared.feed.set_capacity(usize::MAX / 2);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut results = Vec::new();
    let mut at = 0;
    while at < entries.len() {
        let size = match feed {
            Feed::EachCommitted => 1,
            _ => rng.usize(1..8).min(entries.len() - at),
        };
        let chunk = &entries[at..at + size];
        let mode = match feed {
            Feed::Heavy => Mode::Heavy,
            _ => Mode::Deferred,
        };
        results.extend(shared.apply_entries(chunk, mode).unwrap());
        if matches!(feed, Feed::EachCommitted) || rng.u8(0..4) == 0 {
            shared.commit_deferred().unwrap();
        }
        at += size;
    }
    let registry = contents(&sm);
    (results, registry, sm, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_gives_the_same_results_and_registry_however_entries_are_batched() {
    for seed in 0..40u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let entries = random_entries(&mut rng, 60 + (seed as usize % 5) * 30);
        let (results, registry, mut sm, _dir) = run(seed, &entries, Feed::EachCommitted);
        for feed in [Feed::RandomCuts, Feed::Heavy] {
            let (other_results, other_registry, _, _) = run(seed, &entries, feed);
            for (i, (a, b)) in results.iter().zip(&other_results).enumerate() {
                assert_eq!(
                    a,
                    b,
                    "seed {seed}: entry {} ({:?}) answered differently fed {feed:?}",
                    i + 1,
                    entries[i].payload
                );
            }
            assert_eq!(results.len(), other_results.len(), "seed {seed}");
            assert!(
                registry == other_registry,
                "seed {seed}: the registry differs fed {feed:?}"
            );
        }
        check_change_feed(seed, &sm);
        // A snapshot of it, installed elsewhere, holds the same registry.
        let snapshot = snapshot_now(&mut sm).await;
        let (_other_dir, other) = installed(snapshot).await;
        assert!(
            other.shared().registry.content().unwrap() == sm.shared().registry.content().unwrap(),
            "seed {seed}: the installed snapshot holds another registry"
        );
        assert_eq!(
            (other.shared().replicas(), other.shared().datanodes()),
            (sm.shared().replicas(), sm.shared().datanodes()),
            "seed {seed}: the installed snapshot counts otherwise"
        );
    }
}

/// The change feed describes the registry: replaying every event from the start gives the
/// datanodes (with address and epoch), the replicas and the keys the registry holds.
fn check_change_feed(seed: u64, sm: &StateMachine) {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::change_feed::{Change, ChangeFilter};

    let shared = sm.shared();
    let mut datanodes: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut replicas: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut keys: BTreeSet<String> = BTreeSet::new();
    let mut after = 0;
    loop {
        let batch = shared
            .feed
            .read(after, &ChangeFilter::All, usize::MAX)
            .expect("the whole history is kept");
        for e in &batch.events {
            match &e.change {
                Change::DatanodeRegistered { id, addr, epoch } => {
                    datanodes.insert(*id, (addr.clone(), *epoch));
                }
                Change::DatanodeRemoved { id, .. } => {
                    datanodes.remove(id);
                    replicas.retain(|(_, d)| d != id);
                }
                Change::ReplicasRegistered { datanode, shards } => {
                    replicas.extend(shards.iter().map(|s| (*s, *datanode)));
                }
                Change::ReplicasRemoved { datanode, shards } => {
                    for s in shards {
                        replicas.remove(&(*s, *datanode));
                    }
                }
                Change::KvPut { key } => {
                    keys.insert(key.clone());
                }
                Change::KvDeleted { key } => {
                    keys.remove(key);
                }
            }
        }
        if batch.index == after {
            break;
        }
        after = batch.index;
    }
    let registry = &shared.registry;
    let held: BTreeMap<u64, (String, u64)> = registry
        .datanodes()
        .unwrap()
        .into_iter()
        .map(|d| (d.id, (d.addr, d.epoch)))
        .collect();
    assert_eq!(
        datanodes.keys().collect::<Vec<_>>(),
        held.keys().collect::<Vec<_>>(),
        "seed {seed}: the feed's datanodes"
    );
    for (id, (addr, epoch)) in &held {
        let (fed_addr, fed_epoch) = &datanodes[id];
        // A removal's first piece (from version 4) raises the epoch by one to fence the
        // incarnation it removes; no event reports that (the next registration's does).
        assert!(
            fed_addr == addr && (*epoch == *fed_epoch || *epoch == fed_epoch + 1),
            "seed {seed}: datanode {id} is {addr} at epoch {epoch}, the feed says {fed_addr} \
             at {fed_epoch}"
        );
    }
    let mut held = BTreeSet::new();
    for id in datanodes.keys() {
        let mut cursor: Option<String> = None;
        loop {
            let page = registry
                .datanode_shards(*id, cursor.as_deref(), usize::MAX)
                .unwrap();
            held.extend(page.items.iter().map(|s| (s.shard, s.datanode)));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
    assert!(replicas == held, "seed {seed}: the feed's replicas");
    let held: BTreeSet<String> = registry
        .kv_list("", None, usize::MAX)
        .unwrap()
        .items
        .into_iter()
        .map(|k| k.key)
        .collect();
    assert_eq!(keys, held, "seed {seed}: the feed's keys");
}
