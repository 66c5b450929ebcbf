//! Counters under faults: clients increment a few keys by compare-and-swap and read them back
//! (linearizable and lease reads), through any member, and two more clients only read, while a
//! nemesis cuts members off (the leader too, long enough for the others to elect one), heals
//! them, restarts them (also one while another is cut off), and takes the power from one at a
//! time (its log loses what it never synced, the last write possibly torn). Afterwards:
//! - no two acknowledged increments of a key wrote the same value (each swaps one revision, so a
//!   duplicate means an acknowledged write was lost and its revision reused);
//! - every value up to a key's final one was written by some increment, and no acknowledged
//!   one is above it;
//! - no read returned less than an increment acknowledged, or a read answered, before the read
//!   began, nor a value no increment had been sent for when it was answered (values only grow,
//!   so each would be a stale or an invented read).
//!
//! It found that a member whose log had failed kept its data dir locked after its shutdown
//! until the last handle to it was dropped: while a client held one, the member could not
//! start again. Seeded: a failure names its seed; `NEMESIS_SEEDS=N` runs more.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::{addr, Cluster};
use meta_consensus::transport::LocalRouter;
use meta_consensus::{Command, CommandResult, Consistency, Node, NodeId};
use meta_store::fs::{CrashPoint, FaultyFileSystem};

const KEYS: usize = 3;
const CLIENTS: u64 = 6;
/// Clients that only read: none waits out a write that a cut-off leader cannot commit, so reads
/// go on at such a leader after the others elected a new one.
const READERS: u64 = 4;
const STEPS: usize = 10;
/// How long a client waits for one answer before it gives up on it.
const PATIENCE: Duration = Duration::from_secs(3);

#[derive(Debug)]
enum Event {
    /// An increment to `value`, sent at `began`, was acknowledged at `at`.
    Acked {
        key: usize,
        value: u64,
        began: Instant,
        at: Instant,
    },
    /// An increment to `value`, sent at `began`, got no answer: it may or may not have been
    /// written.
    Unknown {
        key: usize,
        value: u64,
        began: Instant,
    },
    /// A read that began at `began` and was answered at `ended` returned `value`.
    Read {
        key: usize,
        value: u64,
        began: Instant,
        ended: Instant,
        consistency: Consistency,
    },
}

fn key_name(key: usize) -> String {
    format!("counter/{key}")
}

fn decode(value: &[u8]) -> u64 {
    u64::from_le_bytes(value.try_into().expect("counter values are 8 bytes"))
}

/// The value and revision of `key` as `node` reads it with `c` (0 and 0: never written).
async fn read(router: &LocalRouter, id: NodeId, key: usize, c: Consistency) -> Option<(u64, u64)> {
    let node = router.node(id)?;
    match tokio::time::timeout(PATIENCE, node.kv_get(c, &key_name(key))).await {
        Ok(Ok(Some(e))) => Some((decode(&e.value), e.revision)),
        Ok(Ok(None)) => Some((0, 0)),
        _ => None,
    }
}

/// One client: random reads, and with `increments` increments, through random members until
/// `stop`.
async fn client(
    router: LocalRouter,
    seed: u64,
    increments: bool,
    stop: Arc<AtomicBool>,
) -> Vec<Event> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut events = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let id = rng.u64(1..=3);
        let key = rng.usize(..KEYS);
        let c = if rng.bool() {
            Consistency::Linearizable
        } else {
            Consistency::Lease
        };
        let began = Instant::now();
        let Some((value, revision)) = read(&router, id, key, c).await else {
            // A follower forwards, a stopped member refuses: try another.
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        events.push(Event::Read {
            key,
            value,
            began,
            ended: Instant::now(),
            consistency: c,
        });
        if !increments || rng.bool() {
            continue;
        }
        let Some(node) = router.node(id) else {
            continue;
        };
        let put = Command::Put {
            key: key_name(key),
            value: (value + 1).to_le_bytes().to_vec(),
            if_revision: Some(revision),
        };
        let sent = Instant::now();
        match tokio::time::timeout(PATIENCE, node.write(put)).await {
            Ok(Ok(w)) => match w.result {
                CommandResult::Put { .. } => events.push(Event::Acked {
                    key,
                    value: value + 1,
                    began: sent,
                    at: Instant::now(),
                }),
                // Another increment came first: nothing was written.
                CommandResult::RevisionMismatch { .. } => {}
                other => panic!("an increment answered {other:?}"),
            },
            // Refused before it was proposed (a follower, a stopped member): nothing written.
            Ok(Err(meta_consensus::Error::ForwardToLeader { .. })) => {}
            _ => events.push(Event::Unknown {
                key,
                value: value + 1,
                began: sent,
            }),
        }
    }
    events
}

async fn nemesis(seed: u64) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let disks: BTreeMap<NodeId, FaultyFileSystem> =
        (1..=3).map(|id| (id, FaultyFileSystem::new())).collect();
    let mut c = Cluster::new()?;
    c.tune = |cfg| {
        cfg.snapshot_logs_since_last = 40;
        cfg.max_in_snapshot_log_to_keep = 10;
    };
    for (id, disk) in &disks {
        c.wal_fs.insert(*id, Arc::new(disk.clone()));
    }
    for id in 1..=3 {
        c.start(id).await?;
    }
    let members = (1..=3).map(|i| (i, Node::new(addr(i)))).collect();
    c.node(1).initialize(members).await?;
    c.converged().await?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for n in 0..CLIENTS + READERS {
        let increments = n < CLIENTS;
        clients.spawn(client(
            c.router.clone(),
            seed * 100 + n,
            increments,
            stop.clone(),
        ));
    }
    let mut done = Vec::new();
    for _ in 0..STEPS {
        // Pacing, not synchronization: the clients run meanwhile.
        tokio::time::sleep(Duration::from_millis(rng.u64(100..600))).await;
        let id = rng.u64(1..=3);
        match rng.u32(0..6) {
            5 => {
                // The leader, long enough for the others to elect one (an election timeout is
                // at most 1.4 s) and take writes while it may still think it leads: the readers
                // go on reading there, and a leader that answered them from a lease it no
                // longer holds returns values older than the new leader's.
                let leader = c
                    .leader()
                    .await
                    .with_context(|| format!("seed {seed}: {done:?}"))?
                    .id();
                c.router.isolate(leader);
                tokio::time::sleep(Duration::from_millis(rng.u64(2500..4000))).await;
                c.router.heal_all();
                done.push(format!("isolated leader {leader}"));
            }
            0 => {
                c.router.isolate(id);
                tokio::time::sleep(Duration::from_millis(rng.u64(200..1500))).await;
                c.router.heal_all();
                done.push(format!("isolated {id}"));
            }
            1 => {
                let other = 1 + (id + rng.u64(0..2)) % 3;
                c.router.cut(id, other);
                tokio::time::sleep(Duration::from_millis(rng.u64(200..1500))).await;
                c.router.heal_all();
                done.push(format!("cut {id}-{other}"));
            }
            2 => {
                // A member cut off while another restarts (and so forgets what it promised
                // before, unless it keeps it).
                let other = 1 + (id + rng.u64(0..2)) % 3;
                c.router.isolate(id);
                c.stop(other).await?;
                c.start(other)
                    .await
                    .with_context(|| format!("seed {seed}: {done:?}"))?;
                c.router.isolate(id);
                tokio::time::sleep(Duration::from_millis(rng.u64(200..2000))).await;
                c.router.heal_all();
                done.push(format!("isolated {id}, restarted {other}"));
            }
            3 => {
                c.stop(id).await?;
                c.start(id)
                    .await
                    .with_context(|| format!("seed {seed}: {done:?}"))?;
                done.push(format!("restarted {id}"));
            }
            _ => {
                // Syncs stop completing first, so that appends pile up unsynced (at most a
                // second: a member nobody writes to has nothing to append).
                let disk = &disks[&id];
                disk.gate().close();
                let piled = Instant::now() + Duration::from_secs(1);
                while disk.unsynced_ops() == 0 && Instant::now() < piled {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let unsynced = disk.unsynced_ops();
                let point = CrashPoint {
                    persist_ops: rng.usize(0..=unsynced),
                    torn_bytes: rng.usize(0..100),
                };
                disk.crash(point);
                c.router.unregister(id);
                if let Some(node) = c.nodes.remove(&id) {
                    let _ = tokio::time::timeout(Duration::from_secs(30), node.shutdown()).await;
                }
                c.start(id).await.with_context(|| {
                    format!("seed {seed}: restart after a power loss; {done:?}")
                })?;
                done.push(format!("power loss of {id} at {point:?} of {unsynced}"));
            }
        }
    }
    c.router.heal_all();
    stop.store(true, Ordering::SeqCst);
    let mut events = Vec::new();
    while let Some(joined) = clients.join_next().await {
        events.extend(joined?);
    }
    c.converged()
        .await
        .with_context(|| format!("seed {seed}: {done:?}"))?;
    let leader = c.leader().await?;
    let mut finals = Vec::new();
    for key in 0..KEYS {
        let v = leader
            .kv_get(Consistency::Linearizable, &key_name(key))
            .await?
            .map_or(0, |e| decode(&e.value));
        finals.push(v);
    }
    check(&events, &finals).with_context(|| format!("seed {seed}: after {done:?}"))?;
    let acked = events
        .iter()
        .filter(|e| matches!(e, Event::Acked { .. }))
        .count();
    let reads = events
        .iter()
        .filter(|e| matches!(e, Event::Read { .. }))
        .count();
    println!(
        "seed {seed}: {acked} increments acknowledged, {reads} reads, finals {finals:?}; {done:?}"
    );
    // A history of no acknowledged increment or no read checks nothing.
    ensure!(
        acked > 0 && reads > 0,
        "seed {seed}: no progress ({acked} increments acknowledged, {reads} reads); {done:?}"
    );
    c.shutdown().await
}

/// The highest value answered before a given time, from values and when they were answered.
struct Floor(Vec<(Instant, u64)>);

impl Floor {
    fn new(mut answered: Vec<(Instant, u64)>) -> Floor {
        answered.sort();
        let mut highest = 0;
        for (_, v) in &mut answered {
            highest = highest.max(*v);
            *v = highest;
        }
        Floor(answered)
    }

    /// The highest value answered strictly before `t`, if any was.
    fn before(&self, t: Instant) -> Option<u64> {
        let n = self.0.partition_point(|(at, _)| *at < t);
        n.checked_sub(1).map(|i| self.0[i].1)
    }
}

fn check(events: &[Event], finals: &[u64]) -> Result<()> {
    for (key, last) in finals.iter().enumerate() {
        let mut acked = BTreeSet::new();
        // Each value written, and when the first increment to it was sent.
        let mut written: BTreeMap<u64, Instant> = BTreeMap::new();
        let mut acks: Vec<(Instant, u64)> = Vec::new();
        let mut reads: Vec<(Instant, Instant, u64, Consistency)> = Vec::new();
        for e in events {
            match *e {
                Event::Acked {
                    key: k,
                    value,
                    began,
                    at,
                } if k == key => {
                    ensure!(
                        acked.insert(value),
                        "key {key}: two acknowledged increments wrote {value}"
                    );
                    let first = written.entry(value).or_insert(began);
                    *first = (*first).min(began);
                    acks.push((at, value));
                }
                Event::Unknown {
                    key: k,
                    value,
                    began,
                } if k == key => {
                    let first = written.entry(value).or_insert(began);
                    *first = (*first).min(began);
                }
                Event::Read {
                    key: k,
                    value,
                    began,
                    ended,
                    consistency,
                } if k == key => reads.push((began, ended, value, consistency)),
                _ => {}
            }
        }
        if let Some(max) = acked.last() {
            ensure!(
                max <= last,
                "key {key}: the increment to {max} was acknowledged, the final value is {last}"
            );
        }
        for v in 1..=*last {
            ensure!(
                written.contains_key(&v),
                "key {key}: the value {v} (final {last}) was written by no increment"
            );
        }
        // Values only grow, so a read must return at least every value acknowledged or read
        // before it began, and a value some increment had been sent for when it ended.
        let ack_floor = Floor::new(acks);
        let read_floor = Floor::new(reads.iter().map(|r| (r.1, r.2)).collect());
        for &(began, ended, value, consistency) in &reads {
            if let Some(floor) = ack_floor.before(began).filter(|f| value < *f) {
                bail!(
                    "key {key}: a {consistency:?} read returned {value}, after the \
                     increment to {floor} was acknowledged"
                );
            }
            if let Some(floor) = read_floor.before(began).filter(|f| value < *f) {
                bail!(
                    "key {key}: a {consistency:?} read returned {value}, after a read \
                     that ended before it began returned {floor}"
                );
            }
            if value > 0 {
                match written.get(&value) {
                    Some(sent) if *sent <= ended => {}
                    Some(_) => bail!(
                        "key {key}: a {consistency:?} read returned {value} before any \
                         increment to it was sent"
                    ),
                    None => bail!(
                        "key {key}: a {consistency:?} read returned {value}, which no \
                         increment wrote"
                    ),
                }
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_stay_consistent_under_cuts_restarts_and_power_losses() -> Result<()> {
    let seeds = common::seed_count("NEMESIS_SEEDS", 2);
    for seed in 0..seeds {
        nemesis(seed).await?;
    }
    Ok(())
}

/// The history checks, on made-up histories: each kind of wrong read is caught.
mod check_tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn read(base: Instant, began: u64, ended: u64, value: u64) -> Event {
        Event::Read {
            key: 0,
            value,
            began: at(base, began),
            ended: at(base, ended),
            consistency: Consistency::Lease,
        }
    }

    fn unknown(base: Instant, began: u64, value: u64) -> Event {
        Event::Unknown {
            key: 0,
            value,
            began: at(base, began),
        }
    }

    #[test]
    fn a_read_behind_an_answered_read_is_caught() {
        let base = Instant::now();
        // Neither increment was answered; a read saw 2, and a later one 1.
        let mut events = vec![
            unknown(base, 0, 1),
            unknown(base, 1, 2),
            read(base, 2, 3, 2),
            read(base, 5, 6, 1),
        ];
        let e = check(&events, &[2]).unwrap_err();
        assert!(e.to_string().contains("after a read"), "{e}");
        // Overlapping reads may see them in either order.
        events[3] = read(base, 2, 6, 1);
        check(&events, &[2]).unwrap();
    }

    #[test]
    fn a_read_of_a_value_not_yet_sent_is_caught() {
        let base = Instant::now();
        let events = vec![read(base, 0, 1, 1), unknown(base, 2, 1)];
        let e = check(&events, &[1]).unwrap_err();
        assert!(e.to_string().contains("before any increment"), "{e}");
        let events = vec![read(base, 0, 1, 3), unknown(base, 0, 1)];
        let e = check(&events, &[1]).unwrap_err();
        assert!(e.to_string().contains("no increment wrote"), "{e}");
    }

    #[test]
    fn a_read_behind_an_acknowledged_increment_is_caught() {
        let base = Instant::now();
        let events = vec![
            Event::Acked {
                key: 0,
                value: 1,
                began: at(base, 0),
                at: at(base, 1),
            },
            read(base, 2, 3, 0),
        ];
        let e = check(&events, &[1]).unwrap_err();
        assert!(e.to_string().contains("was acknowledged"), "{e}");
    }
}
