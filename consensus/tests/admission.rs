//! The admission window (`max_pending_shards`) counts every write openraft has not answered,
//! also one whose caller gave up: a write that timed out is still in flight, and letting its
//! room go let retries pile unbounded work onto an overloaded leader, exactly when the window
//! matters.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use common::{addr, Cluster, WAIT};
use meta_consensus::{Command, Error, Node};
use meta_store::fs::FaultyFileSystem;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_timed_out_keeps_its_room_until_openraft_answers_it() -> Result<()> {
    let disk = FaultyFileSystem::new();
    let mut c = Cluster::new()?;
    c.tune = |cfg| {
        cfg.request_timeout = Duration::from_millis(500);
    };
    c.wal_fs.insert(1, Arc::new(disk.clone()));
    let node = c.start(1).await?;
    node.initialize([(1, Node::new(addr(1)))].into()).await?;
    c.leader().await?;

    // No sync completes: the write cannot commit, and its caller gives up.
    disk.gate().close();
    let put = Command::Put {
        key: "k".into(),
        value: vec![1],
        if_revision: None,
    };
    let answer = node.write(put).await;
    let held = node.pending_shards();
    // Syncs complete again before any check can fail: a sync held at the gate would keep the
    // runtime from ending.
    disk.gate().release();
    ensure!(
        matches!(answer, Err(Error::Timeout)),
        "a write that cannot commit answered {answer:?}"
    );
    ensure!(
        held == 1,
        "the write that timed out held {held} shards of the window, not 1"
    );

    // Once it commits, openraft answers it and its room is free again.
    let deadline = std::time::Instant::now() + WAIT;
    while node.pending_shards() != 0 {
        ensure!(
            std::time::Instant::now() < deadline,
            "the committed write still holds its room"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.shutdown().await
}
