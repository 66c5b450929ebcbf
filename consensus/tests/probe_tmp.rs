use std::sync::Arc;
use std::time::Instant;
use meta_consensus::*;
use meta_store::{RateLimiter, WalOptions};
use openraft::storage::{RaftStateMachine, RaftLogStorage, IOFlushed};
use openraft::EntryPayload;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe() {
    let dir = tempfile::tempdir_in("/work/main/target").unwrap();
    let mut sm = StateMachine::open(&dir.path().join("r"), &dir.path().join("s"), 64<<20, 2, Arc::new(RateLimiter::unlimited())).unwrap();
    let mut log = LogStore::open(&dir.path().join("w"), WalOptions::default()).unwrap();
    let lid = |i: u64| openraft::LogId::new(openraft::vote::leader_id_adv::LeaderId { term: 1, node_id: 1 }, i);
    let mk = |i: u64, cmd: Command| Entry { log_id: lid(i), payload: EntryPayload::Normal(cmd) };
    let e = mk(1, Command::RegisterDatanode { id: 1, addr: "a".into() });
    sm.apply(futures::stream::iter(vec![Ok((e, None))])).await.unwrap();
    for round in 0..5u64 {
        let shards: Vec<ShardReport> = (0..1000).map(|s| ShardReport { id: round * 1000 + s, generation: 1, size: 1 }).collect();
        let e = mk(2 + round, Command::RegisterShards { datanode: 1, epoch: 1, shards });
        let t = Instant::now();
        use openraft::type_config::TypeConfigExt; let (tx, rx) = TypeConfig::oneshot();
        log.append(vec![e.clone()], IOFlushed::signal(tx)).await.unwrap();
        let t_append = t.elapsed();
        rx.await.unwrap().unwrap();
        let t_durable = t.elapsed();
        let t = Instant::now();
        sm.apply(futures::stream::iter(vec![Ok((e, None))])).await.unwrap();
        println!("append {:?} durable {:?} apply {:?}", t_append, t_durable, t.elapsed());
    }
}
