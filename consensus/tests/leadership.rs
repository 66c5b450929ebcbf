//! Leadership changing hands on a three-node in-process cluster: a leader cut off from the
//! others is replaced, serves no lease read meanwhile and rejoins after the heal, and a leader
//! about to stop hands over to a caught-up voter without losing a write.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{register, shard, Cluster, WAIT};
use meta_consensus::{Command, Consistency, MetaNode, Role};
use openraft::async_runtime::watch::WatchReceiver as _;

/// The leader the other two nodes elect among themselves once `old`, their leader, was cut off.
async fn replacement(c: &Cluster, old: &MetaNode) -> Result<MetaNode> {
    let others: Vec<MetaNode> = c
        .nodes
        .values()
        .filter(|n| n.id() != old.id())
        .cloned()
        .collect();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let l = others.iter().find(|n| n.status().role == Role::Leader);
        if let Some(l) = l {
            return Ok(l.clone());
        }
        ensure!(std::time::Instant::now() < deadline, "no new leader");
        others[0]
            .raft()
            .wait(Some(Duration::from_millis(200)))
            .metrics(
                |m| m.current_leader.is_some() && m.current_leader != Some(old.id()),
                "x",
            )
            .await
            .ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_leader_is_replaced_and_rejoins_after_heal() -> Result<()> {
    let c = Cluster::three().await?;
    let old = c.leader().await?;
    c.router.isolate(old.id());
    let new = replacement(&c, &old).await?;
    let w = new
        .write(Command::Put {
            key: "after-cut".into(),
            value: vec![],
            if_revision: None,
        })
        .await?;
    // The majority elected a leader only after the old one's lease ran out (a node that
    // acknowledged a leader votes for no other within the lease), so the old leader serves
    // no lease read that could miss the new leader's write.
    match old.kv_get(Consistency::Lease, "after-cut").await {
        Err(_) => {}
        Ok(found) => panic!("the cut-off old leader served a lease read: {found:?}"),
    }
    c.router.heal_all();
    old.wait_applied(w.index, WAIT).await?;
    assert!(old.kv_get(Consistency::Local, "after-cut").await?.is_some());
    c.converged().await?;
    c.shutdown().await
}

/// A write a leader took just before it was cut off from the other voters is answered once no
/// quorum has acknowledged the leader for two election timeouts (`outcome_unknown`: the others
/// may elect a leader without it), not at the request timeout; a write sent to it after that
/// is refused at once (`no_leader`: it was not taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_under_way_at_a_cut_off_leader_are_answered_when_its_quorum_falls_silent(
) -> Result<()> {
    let c = Cluster::three().await?;
    let old = c.leader().await?;
    let put = |key: &str| Command::Put {
        key: key.into(),
        value: vec![],
        if_revision: None,
    };
    c.router.isolate(old.id());
    let started = std::time::Instant::now();
    let under_way = tokio::time::timeout(WAIT, old.write(put("under-way")))
        .await
        .context("the write under way was not answered")?;
    let took = started.elapsed();
    match under_way {
        Err(meta_consensus::Error::OutcomeUnknown(why)) => {
            ensure!(why.contains("no quorum of voters"), "{why}")
        }
        other => anyhow::bail!("the write under way was answered {other:?} after {took:?}"),
    }
    ensure!(
        old.unacknowledged_for().is_some(),
        "the silence is not reported"
    );
    // At once: waiting for a lease that does not come (two election timeouts, 2.8 s here)
    // only delays the client's move to another member.
    let sent = std::time::Instant::now();
    match tokio::time::timeout(WAIT, old.write(put("after"))).await? {
        Err(meta_consensus::Error::NoLeader) => {}
        other => anyhow::bail!("a write sent after the silence was answered {other:?}"),
    }
    ensure!(
        sent.elapsed() < Duration::from_secs(2),
        "refused after {:?}",
        sent.elapsed()
    );
    c.router.heal_all();
    c.converged().await?;
    c.shutdown().await
}

/// A leader short of disk refuses writes that add data as one about to hand its leadership
/// over (nothing written: ask again, and a follower sends the write on to the next leader)
/// while another voter may have room; once a look for one found none, as one that stays short
/// (507 over HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_short_of_disk_refuses_as_handing_over_until_no_voter_has_room() -> Result<()> {
    let c = Cluster::three_tuned(|cfg| cfg.min_free_bytes = u64::MAX).await?;
    let l = c.leader().await?;
    let put = || Command::Put {
        key: "k".into(),
        value: vec![],
        if_revision: None,
    };
    match l.write(put()).await {
        Err(meta_consensus::Error::HandingOverForDisk { .. }) => {}
        other => anyhow::bail!("before any look: {other:?}"),
    }
    l.note_room_elsewhere(false);
    match l.write(put()).await {
        Err(meta_consensus::Error::InsufficientStorage { .. }) => {}
        other => anyhow::bail!("once no voter has room: {other:?}"),
    }
    // A delete passes a leader short of disk, but not once another voter is short too: with
    // both, no majority has room for it.
    let delete = || Command::Delete {
        key: "k".into(),
        if_revision: None,
    };
    l.write(delete())
        .await
        .context("a delete at a short leader")?;
    let other = c
        .nodes
        .keys()
        .copied()
        .find(|id| *id != l.id())
        .context("a voter")?;
    l.note_voters_short_of_disk([other].into(), std::time::Instant::now());
    match l.write(delete()).await {
        Err(meta_consensus::Error::QuorumShortOfDisk { short }) => ensure!(
            short.contains(&l.id()) && short.contains(&other),
            "{short:?}"
        ),
        other => anyhow::bail!("a delete with the leader and another voter short: {other:?}"),
    }
    c.shutdown().await
}

/// Voters short of disk that leave no majority with room stop writes at the leader, deletes
/// too (their disks would fill, and stop them); one short voter of three leaves a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_short_of_disk_without_a_majority_with_room_stop_writes() -> Result<()> {
    let c = Cluster::three().await?;
    let l = c.leader().await?;
    let others: std::collections::BTreeSet<_> =
        c.nodes.keys().copied().filter(|id| *id != l.id()).collect();
    let put = || Command::Put {
        key: "k".into(),
        value: vec![],
        if_revision: None,
    };
    l.note_voters_short_of_disk(others.clone(), std::time::Instant::now());
    match l.write(put()).await {
        Err(meta_consensus::Error::QuorumShortOfDisk { short }) => {
            ensure!(
                short.iter().copied().eq(others.iter().copied()),
                "{short:?}"
            )
        }
        other => anyhow::bail!("with two of three voters short: {other:?}"),
    }
    // Deletes too: they are written to the full voters' logs and registries.
    let delete = Command::Delete {
        key: "k".into(),
        if_revision: None,
    };
    match l.write(delete).await {
        Err(meta_consensus::Error::QuorumShortOfDisk { .. }) => {}
        other => anyhow::bail!("a delete with two of three voters short: {other:?}"),
    }
    let short: std::collections::BTreeSet<_> = others.iter().copied().take(1).collect();
    l.note_voters_short_of_disk(short.clone(), std::time::Instant::now());
    l.write(put()).await.context("one short voter of three")?;
    // The other voter falls silent: a write commits only with the short one now, and is
    // refused once the silence passes an election timeout, without waiting for a disk look.
    let other = *others.difference(&short).next().context("a third voter")?;
    c.router.cut(l.id(), other);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match l.write(put()).await {
            Err(meta_consensus::Error::QuorumShortOfDisk { short }) => {
                ensure!(short.contains(&other), "{short:?}");
                break;
            }
            Ok(_) => ensure!(
                std::time::Instant::now() < deadline,
                "writes go on with voter {other} silent"
            ),
            Err(e) => anyhow::bail!("with voter {other} silent: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.router.heal_all();
    c.shutdown().await
}

/// A stopping leader hands over to a voter not short of disk, even if one short of disk is
/// further along: that one would refuse writes, then hand over again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_to_a_voter_with_room() -> Result<()> {
    let c = Cluster::three().await?;
    let l = c.leader().await?;
    c.converged().await?;
    // The voter the leader would pick by the log alone.
    let first_pick = l
        .status()
        .replication
        .iter()
        .filter(|r| r.node != l.id())
        .max_by_key(|r| (r.matched, r.node))
        .map(|r| r.node)
        .context("no other voter")?;
    l.note_voters_short_of_disk([first_pick].into(), std::time::Instant::now());
    let to = l.hand_over_leadership(WAIT).await?;
    ensure!(
        to.is_some_and(|to| to != first_pick),
        "handed over to {to:?}, and {first_pick} is short of disk"
    );
    c.shutdown().await
}

/// A deposed leader that learns of the new leader from its own read's round (its messages
/// reach the others again, theirs do not reach it yet, as when a paused process resumes) sends
/// the read on to the new leader, rather than answering that no leader is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_sends_a_read_on_to_the_new_leader() -> Result<()> {
    let c = Cluster::three().await?;
    let old = c.leader().await?;
    c.router.isolate(old.id());
    let new = replacement(&c, &old).await?;
    // The read starts while the old leader is still cut off (its round fails at once).
    let read = tokio::spawn({
        let old = old.clone();
        async move { old.kv_get(Consistency::Linearizable, "k").await }
    });
    c.router.heal_all();
    for n in c.nodes.keys().filter(|id| **id != old.id()) {
        c.router.cut_one_way(*n, old.id());
    }
    match read.await? {
        Err(meta_consensus::Error::ForwardToLeader { leader_id, .. }) => ensure!(
            leader_id == new.id(),
            "the read went to node {leader_id}, not to the new leader {}",
            new.id()
        ),
        other => anyhow::bail!("the deposed leader answered the read with {other:?}"),
    }
    c.router.heal_all();
    c.converged().await?;
    c.shutdown().await
}

/// A leader about to stop hands over to a caught-up voter: another node leads before it
/// stops, takes writes, and holds everything written before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_to_a_caught_up_voter() -> Result<()> {
    let c = Cluster::three().await?;
    let old = c.leader().await?;
    let epoch = register(&old, 7, 0..10).await?;
    c.converged().await?;
    // Every voter must have been heard from recently to be picked; wait for the heartbeats.
    let mut new = None;
    let mut metrics = old.raft().metrics();
    // Writes in flight at the old leader while it hands over.
    let mut writes = tokio::task::JoinSet::new();
    for s in 100..116 {
        let old = old.clone();
        writes.spawn(async move { old.register_shards(7, epoch, vec![shard(s, 1)]).await });
    }
    for _ in 0..100 {
        new = old.hand_over_leadership(Duration::from_secs(5)).await?;
        if new.is_some() {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    }
    let new = new.context("no voter took over")?;
    ensure!(new != old.id(), "handed over to itself");
    // The new leader's first entry is in the old leader's log before the old leader learns it
    // committed: the hand-over waits until the old leader applied it, so that requests it took
    // as leader are answered before it closes.
    let status = old.status();
    ensure!(
        status.applied >= status.last_log_index,
        "handed over with entries not applied: {status:?}"
    );
    // Each write in flight was answered: acknowledged, or refused for want of a leader.
    let mut acknowledged = 0;
    while let Some(joined) = tokio::time::timeout(Duration::from_secs(10), writes.join_next())
        .await
        .context("a write in flight was not answered")?
    {
        acknowledged += u64::from(joined?.is_ok());
    }
    let leader = c.leader().await?;
    ensure!(leader.id() == new, "node {} leads, not {new}", leader.id());
    register(&leader, 8, 0..10).await?;
    c.converged().await?;
    for n in c.nodes.values() {
        let replicas = n.status().replicas;
        ensure!(
            replicas >= 20 + acknowledged,
            "{replicas} of {acknowledged}"
        );
    }
    // A node that does not lead has nothing to hand over.
    ensure!(old
        .hand_over_leadership(Duration::from_secs(1))
        .await?
        .is_none());
    c.shutdown().await
}

/// Where a write that was refused without being acted on goes next: a leader that refused it
/// (it hands its leadership over, or has no quorum) is not asked again in the same term; any
/// other leader, this node included, takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_goes_to_a_leader_other_than_the_one_that_refused_it() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    c.converged().await?;
    let follower = c
        .nodes
        .values()
        .find(|n| n.id() != leader.id() && n.status().leader_id == Some(leader.id()))
        .context("a follower that knows the leader")?
        .clone();
    let term = leader.term();
    let brief = Duration::from_millis(200);
    // The leader led before now; the follower does not lead.
    let now = std::time::Instant::now();
    ensure!(leader.led_before(now) && !follower.led_before(now));
    // The leader refused it itself: not again in this term; in a later one it may.
    let me = Some(leader.id());
    ensure!(leader.next_leader(me, term, brief).await.is_none());
    ensure!(leader.next_leader(me, term - 1, brief).await == Some(None));
    // Another node refused it, or nobody led: this one leads, so it writes here.
    ensure!(leader.next_leader(Some(follower.id()), term, brief).await == Some(None));
    ensure!(leader.next_leader(None, term, brief).await == Some(None));
    // At a follower: any leader will do, unless that leader refused it in its term.
    let to = follower.next_leader(None, term, brief).await;
    ensure!(
        to == Some(Some((leader.id(), common::addr(leader.id())))),
        "{to:?}"
    );
    ensure!(follower.next_leader(me, term, brief).await.is_none());
    c.shutdown().await
}

/// An operator moves the leadership to a voter they name: once the call returns that voter
/// leads, takes writes and holds what was written before. Asked of the leader for itself, it
/// changes nothing; a node that is no voter, or a voter that is down, is refused and the
/// leader leads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leadership_moves_to_the_voter_an_operator_names() -> Result<()> {
    let mut c = Cluster::three().await?;
    let old = c.leader().await?;
    register(&old, 7, 0..10).await?;
    let term = old.term();
    assert_eq!(old.transfer_leadership(old.id()).await?, (old.id(), term));
    match old.transfer_leadership(9).await {
        Err(meta_consensus::Error::InvalidArgument(m)) => assert!(m.contains("node 9"), "{m}"),
        other => panic!("expected invalid argument, got {other:?}"),
    }

    let to = (1..=3).find(|i| *i != old.id()).unwrap();
    let (leader, new_term) = old.transfer_leadership(to).await?;
    assert_eq!(leader, to);
    ensure!(new_term > term, "term {new_term} after {term}");
    let new = c.leader().await?;
    ensure!(new.id() == to, "node {} leads, not {to}", new.id());
    register(&new, 8, 0..10).await?;
    c.converged().await?;
    ensure!(new.status().replicas == 20, "{:?}", new.status());

    // A voter that is down cannot take over: refused, and the leader leads on.
    let down = (1..=3).find(|i| *i != to && *i != old.id()).unwrap();
    c.stop(down).await?;
    match new.transfer_leadership(down).await {
        Err(meta_consensus::Error::Conflict(m)) => {
            assert!(m.contains(&format!("node {down} cannot take over")), "{m}")
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    ensure!(c.leader().await?.id() == to, "the leader changed");
    register(&new, 9, 0..10).await?;
    c.shutdown().await
}

/// A leader that is handing its office over (here to a voter whose answers do not come, as a
/// paused process's, so the hand-over hangs until the others' election timeout) takes no
/// leadership move: asked for itself, it used to answer at once that it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_handing_over_takes_no_leadership_move() -> Result<()> {
    let c = Cluster::three().await?;
    let old = c.leader().await?;
    for other in (1..=3).filter(|i| *i != old.id()) {
        c.router.hold(old.id(), other);
    }
    // Its followers answered a moment ago: it asks one to take over, and nobody does.
    let handed = old.hand_over_leadership(Duration::from_millis(1)).await?;
    ensure!(
        handed.is_none(),
        "handed over to {handed:?} through a cut link"
    );
    match old.transfer_leadership(old.id()).await {
        Err(meta_consensus::Error::NoLeader | meta_consensus::Error::ForwardToLeader { .. }) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    c.router.heal_all();
    c.shutdown().await
}

/// A leader whose voters stopped with it (a whole cluster stopped at once) stops without
/// waiting for a hand-over none of them can take: it used to ask one and wait the whole time
/// given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_voters_stopped_with_it_does_not_wait_to_hand_over() -> Result<()> {
    let mut c = Cluster::three().await?;
    let old = c.leader().await?;
    c.converged().await?;
    for other in (1..=3).filter(|i| *i != old.id()) {
        c.stop(other).await?;
    }
    let within = Duration::from_secs(20);
    let started = std::time::Instant::now();
    let handed = old.hand_over_leadership(within).await?;
    ensure!(handed.is_none(), "handed over to {handed:?}, which stopped");
    ensure!(
        started.elapsed() < within / 2,
        "waited {:?} to hand over to a stopped voter",
        started.elapsed()
    );
    drop(old);
    c.shutdown().await
}

/// A voter the leader has not heard from for the lease already (its messages go unanswered, as
/// a paused process's) is refused the leadership at once, and the leader leads on: the move
/// used to wait another lease for an answer first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_voter_is_refused_the_leadership_at_once() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let lease = c.config(leader.id()).election_timeout();
    let to = (1..=3).find(|i| *i != leader.id()).unwrap();
    c.router.hold(leader.id(), to);
    let silent = |m: &openraft::RaftMetrics<meta_consensus::TypeConfig>| {
        m.heartbeat
            .as_ref()
            .and_then(|h| h.get(&to).cloned().flatten())
            .is_some_and(|t| openraft::Instant::elapsed(&*t) > lease)
    };
    let deadline = std::time::Instant::now() + WAIT;
    while !silent(&leader.raft().metrics().borrow_watched()) {
        ensure!(
            std::time::Instant::now() < deadline,
            "node {to} never fell silent"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match tokio::time::timeout(lease / 2, leader.transfer_leadership(to)).await {
        Ok(Err(meta_consensus::Error::Conflict(m))) => {
            ensure!(m.contains(&format!("node {to} cannot take over")), "{m}")
        }
        Ok(other) => anyhow::bail!("expected a conflict, got {other:?}"),
        Err(_) => anyhow::bail!("the move waited for a voter silent for the lease already"),
    }
    ensure!(
        leader.status().role == Role::Leader,
        "{:?}",
        leader.status()
    );
    c.router.heal_all();
    c.shutdown().await
}
