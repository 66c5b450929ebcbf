//! Crash property: random appends, syncs, truncates and purges, crashes at random points (unsynced
//! bytes lost, the last write possibly torn), reopen. Every record acknowledged durable is there,
//! no truncated or purged record is, and what is there is a consistent prefix of what was written.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use meta_store::fs::{CrashPoint, FaultyFileSystem};
use meta_store::{Wal, WalOptions};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<u8>),
    Batch(Vec<Vec<u8>>),
    Sync,
    /// Truncate this many records back from the end (0 = from the next LSN).
    Truncate(u64),
    /// Purge up to this fraction (of 255) of the log.
    Purge(u8),
    /// Crash, keeping this fraction (of 255) of the unsynced operations and tearing the next.
    Crash {
        keep: u8,
        torn: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let payload = || prop::collection::vec(any::<u8>(), 0..48);
    prop_oneof![
        6 => payload().prop_map(Op::Append),
        2 => prop::collection::vec(payload(), 1..4).prop_map(Op::Batch),
        3 => Just(Op::Sync),
        1 => (0u64..6).prop_map(Op::Truncate),
        1 => any::<u8>().prop_map(Op::Purge),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(keep, torn)| Op::Crash { keep, torn }),
    ]
}

/// What the log must hold: live records, the last LSN assigned, and the durable point.
#[derive(Debug, Default)]
struct Model {
    live: BTreeMap<u64, Vec<u8>>,
    last: u64,
    durable: u64,
}

fn run(ops: Vec<Op>, preallocate: bool) -> Result<(), TestCaseError> {
    let fs = FaultyFileSystem::new();
    let dir = Path::new("/log");
    let opts = WalOptions {
        segment_bytes: 320,
        preallocate,
        ..WalOptions::default()
    };
    let open = || Wal::open_with(Arc::new(fs.clone()), dir, opts.clone()).unwrap();
    let mut wal = open();
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Append(p) => {
                let lsn = wal.append(&p).unwrap();
                prop_assert_eq!(lsn, model.last + 1);
                model.live.insert(lsn, p);
                model.last = lsn;
            }
            Op::Batch(ps) => {
                let refs: Vec<&[u8]> = ps.iter().map(Vec::as_slice).collect();
                let last = wal.append_batch(&refs).unwrap();
                prop_assert_eq!(last, model.last + ps.len() as u64);
                for (i, p) in ps.into_iter().enumerate() {
                    model.live.insert(model.last + 1 + i as u64, p);
                }
                model.last = last;
            }
            Op::Sync => {
                wal.sync(model.last).unwrap();
                model.durable = model.last;
                prop_assert!(wal.durable_lsn() >= model.last);
            }
            Op::Truncate(back) => {
                let from = (model.last + 1).saturating_sub(back).max(1);
                let marker = wal.truncate_from(from).unwrap();
                prop_assert_eq!(marker, model.last + 1);
                model.live.retain(|&lsn, _| lsn < from);
                model.last = marker;
                model.durable = marker;
            }
            Op::Purge(frac) => {
                if model.last == 0 {
                    continue;
                }
                let to = 1 + (model.last - 1) * frac as u64 / 255;
                let marker = wal.purge_to(to).unwrap().marker;
                prop_assert_eq!(marker, model.last + 1);
                model.live.retain(|&lsn, _| lsn > to);
                model.last = marker;
                model.durable = marker;
            }
            Op::Crash { keep, torn } => {
                let unsynced = fs.unsynced_ops();
                fs.crash(CrashPoint {
                    persist_ops: unsynced * keep as usize / 255,
                    torn_bytes: torn as usize,
                });
                drop(wal);
                wal = open();
                let last = wal.last_lsn();
                prop_assert!(
                    last >= model.durable,
                    "lost durable records: recovered {} < durable {}",
                    last,
                    model.durable
                );
                prop_assert!(last <= model.last);
                prop_assert_eq!(wal.durable_lsn(), last);
                model.live.retain(|&lsn, _| lsn <= last);
                model.last = last;
                model.durable = last;
                check(&wal, &model)?;
            }
        }
        check(&wal, &model)?;
    }
    wal.close().unwrap();
    drop(wal);
    let wal = open();
    prop_assert_eq!(wal.last_lsn(), model.last);
    check(&wal, &model)
}

fn check(wal: &Wal, model: &Model) -> Result<(), TestCaseError> {
    let got = wal.read_range(..).unwrap();
    let want: Vec<(u64, Vec<u8>)> = model.live.iter().map(|(k, v)| (*k, v.clone())).collect();
    prop_assert_eq!(&got, &want);
    prop_assert_eq!(wal.first_lsn(), model.live.keys().next().copied());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn acknowledged_records_survive_crashes(ops in prop::collection::vec(op(), 1..60), preallocate in any::<bool>()) {
        run(ops, preallocate)?;
    }
}
