//! Watching the registry on a three-node in-process cluster: every member reports the same
//! changes under the same log indexes, a long poll wakes on a write, a linearizable start
//! covers every write before it, a member that restarted refuses an index it no longer
//! knows the changes after, and a member that cannot catch up neither makes a long poll
//! outlast its wait nor holds a closing node's watches.

mod common;

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::{Cluster, WAIT};
use meta_consensus::{
    Change, ChangeBatch, ChangeFilter, Command, CommandResult, Consistency, Error, MetaNode,
    NodeConfig, ShardReport,
};

fn shard(id: u64) -> ShardReport {
    ShardReport {
        id,
        generation: 1,
        size: 10,
    }
}

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: b"v".to_vec(),
        if_revision: None,
    }
}

/// A follower of the cluster.
fn follower(c: &Cluster, leader: &MetaNode) -> MetaNode {
    let id = if leader.id() == 1 { 2 } else { 1 };
    c.node(id).clone()
}

/// Every event after `after` on `node` that `filter` wants, read without waiting.
async fn all_after(
    node: &MetaNode,
    after: u64,
    filter: ChangeFilter,
) -> Result<Vec<(u64, Change)>> {
    let mut out = Vec::new();
    let mut at = after;
    loop {
        let ChangeBatch { events, index } = node
            .watch(Some(at), 0, filter.clone(), 2, Duration::ZERO)
            .await?;
        if events.is_empty() {
            return Ok(out);
        }
        out.extend(events.into_iter().map(|e| (e.index, e.change)));
        // A page whose index does not advance would be read for ever.
        ensure!(
            index > at,
            "a page of events ends at {index}, not past {at}"
        );
        at = index;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_reports_the_same_changes_and_a_watch_wakes_on_a_write() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    let f = follower(&c, &l);
    let start = f
        .watch(None, 0, ChangeFilter::All, 100, Duration::ZERO)
        .await?;
    ensure!(start.events.is_empty());
    let waiting = {
        let f = f.clone();
        tokio::spawn(async move {
            f.watch(Some(start.index), 0, ChangeFilter::All, 100, WAIT)
                .await
        })
    };
    let w = l.register_datanode(7, "dn-7").await?;
    let CommandResult::DatanodeRegistered { epoch, .. } = w.result else {
        bail!("unexpected {:?}", w.result);
    };
    let woke = tokio::time::timeout(WAIT, waiting)
        .await
        .context("the watch did not wake on a write")???;
    ensure!(
        woke.events.first().map(|e| (e.index, &e.change))
            == Some((
                w.index,
                &Change::DatanodeRegistered {
                    id: 7,
                    addr: "dn-7".into(),
                    epoch
                }
            )),
        "{woke:?}"
    );

    let shards = l
        .register_shards(7, epoch, vec![shard(1), shard(2)])
        .await?;
    // Unchanged: no event.
    l.register_shards(7, epoch, vec![shard(1)]).await?;
    let k = l.write(put("cfg/a")).await?;
    l.write(put("other")).await?;
    c.converged().await?;
    let want = vec![
        (
            w.index,
            Change::DatanodeRegistered {
                id: 7,
                addr: "dn-7".into(),
                epoch,
            },
        ),
        (
            shards.index,
            Change::ReplicasRegistered {
                datanode: 7,
                shards: vec![1, 2],
            },
        ),
        (
            k.index,
            Change::KvPut {
                key: "cfg/a".into(),
            },
        ),
        (
            k.index + 1,
            Change::KvPut {
                key: "other".into(),
            },
        ),
    ];
    for n in c.nodes.values() {
        let got = all_after(n, start.index, ChangeFilter::All).await?;
        ensure!(got == want, "node {}: {got:?}", n.id());
        let keys = all_after(n, start.index, ChangeFilter::KeyPrefix("cfg/".into())).await?;
        ensure!(keys == want[2..3], "node {}: {keys:?}", n.id());
        let dn = all_after(n, start.index, ChangeFilter::Datanode(7)).await?;
        ensure!(dn == want[..2], "node {}: {dn:?}", n.id());
    }

    // A node that stops answers its waiting watches at once.
    let last = f
        .watch(Some(start.index), 0, ChangeFilter::All, 100, Duration::ZERO)
        .await?;
    let parked = {
        let f = f.clone();
        tokio::spawn(async move {
            f.watch(
                Some(last.index),
                0,
                ChangeFilter::KeyPrefix("none/".into()),
                100,
                WAIT * 10,
            )
            .await
        })
    };
    c.stop(f.id()).await?;
    let answered = tokio::time::timeout(WAIT, parked)
        .await
        .context("a stopping node kept a watch waiting")??;
    match answered {
        Ok(b) => ensure!(b.events.is_empty(), "{b:?}"),
        Err(Error::Shutdown) => {}
        Err(e) => bail!("unexpected {e}"),
    }
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linearizable_start_covers_every_write_before_it() -> Result<()> {
    let c = Cluster::three().await?;
    let l = c.leader().await?;
    let f = follower(&c, &l);
    for i in 0..20 {
        let w = l.write(put(&format!("k{i}"))).await?;
        // The leader's read index, as a follower's watch gets it from the leader.
        let read_index = l.read_index(Consistency::Linearizable).await?;
        let start = f
            .watch(None, read_index, ChangeFilter::All, 100, Duration::ZERO)
            .await?;
        ensure!(
            start.index >= w.index,
            "watch starts at {} before acknowledged write {}",
            start.index,
            w.index
        );
    }
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_refuses_an_index_it_no_longer_knows_the_changes_after() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?;
    let f = follower(&c, &l);
    let before = f
        .watch(None, 0, ChangeFilter::All, 100, Duration::ZERO)
        .await?
        .index;
    let w = l.write(put("a")).await?;
    c.converged().await?;
    let id = f.id();
    drop(f);
    c.stop(id).await?;
    let f = c.start(id).await?;
    match f
        .watch(Some(before), 0, ChangeFilter::All, 100, Duration::ZERO)
        .await
    {
        Err(Error::Compacted { after, floor }) => {
            ensure!(after == before && floor >= w.index, "{after} {floor}")
        }
        other => bail!("expected compacted, got {other:?}"),
    }
    ensure!(f.watch_floor() >= w.index);
    // From the index a fresh start gives, later writes are reported.
    let start = f
        .watch(None, 0, ChangeFilter::All, 100, Duration::ZERO)
        .await?;
    let w2 = l.write(put("b")).await?;
    let got = f
        .watch(Some(start.index), 0, ChangeFilter::All, 100, WAIT)
        .await?;
    ensure!(
        got.events.iter().any(|e| e.index == w2.index),
        "{got:?} misses {w2:?}"
    );
    c.shutdown().await
}

/// A member cut off from the leader, with a read index it cannot reach, and the index its
/// own feed is at.
async fn cut_off_member(c: &Cluster, l: &MetaNode) -> Result<(MetaNode, u64, u64)> {
    let f = follower(c, l);
    let at = f
        .watch(None, 0, ChangeFilter::All, 100, Duration::ZERO)
        .await?
        .index;
    c.router.isolate(f.id());
    l.write(put("unseen")).await?;
    let read_index = l.read_index(Consistency::Linearizable).await?;
    ensure!(read_index > at, "the write did not move the read index");
    Ok((f, at, read_index))
}

/// A long poll of `wait` on a member that cannot apply the read index, in a cluster `tune`d:
/// it answers in time, with what the member applied.
async fn long_poll_on_a_cut_off_member(tune: fn(&mut NodeConfig), wait: Duration) -> Result<()> {
    let c = Cluster::three_tuned(tune).await?;
    let l = c.leader().await?;
    let (f, at, read_index) = cut_off_member(&c, &l).await?;
    let poll = f.watch(Some(at), read_index, ChangeFilter::All, 100, wait);
    let page = tokio::time::timeout(WAIT, poll)
        .await
        .context("a long poll outlasted its wait by far")??;
    ensure!(
        page.events.is_empty() && page.index >= at && page.index < read_index,
        "a member behind the read index answered {page:?}"
    );
    c.router.heal_all();
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_a_member_that_cannot_catch_up_answers_within_its_wait() -> Result<()> {
    // The request timeout, which bounds the wait to apply, is far longer than the test's bound.
    let tune = |cfg: &mut NodeConfig| cfg.request_timeout = Duration::from_secs(600);
    long_poll_on_a_cut_off_member(tune, Duration::from_millis(200)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_longer_than_the_request_timeout_answers_what_the_member_applied() -> Result<()>
{
    // The wait to apply ends with the request timeout; the poll goes on with what it has.
    let tune = |cfg: &mut NodeConfig| cfg.request_timeout = Duration::from_secs(2);
    long_poll_on_a_cut_off_member(tune, Duration::from_secs(3)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_member_answers_a_watch_that_waits_to_catch_up_at_once() -> Result<()> {
    let c = Cluster::three_tuned(|cfg| cfg.request_timeout = Duration::from_secs(600)).await?;
    let l = c.leader().await?;
    let (f, at, read_index) = cut_off_member(&c, &l).await?;
    let parked = {
        let f = f.clone();
        // No wait of its own: it waits to apply for the whole request timeout.
        tokio::spawn(async move {
            f.watch(Some(at), read_index, ChangeFilter::All, 100, Duration::ZERO)
                .await
        })
    };
    // The closing is what ends its wait: a node that stops drains its requests first.
    f.begin_close();
    let answered = tokio::time::timeout(WAIT, parked)
        .await
        .context("a closing node kept a watch waiting to catch up")??;
    // With what it applied, which the page's index says.
    let page = answered?;
    ensure!(
        page.events.is_empty() && page.index >= at && page.index < read_index,
        "a closing member behind the read index answered {page:?}"
    );
    c.router.heal_all();
    c.shutdown().await
}
