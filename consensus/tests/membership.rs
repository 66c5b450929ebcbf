//! Membership changes: changes that meet each other (openraft takes one at a time, and a call
//! that arrives while another is uncommitted waits for it instead of failing with a conflict),
//! and what a removed voter reports.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use common::{addr, Cluster, WAIT};
use meta_consensus::{Consistency, Error, MetaNode, Node, Role};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;

/// Writes one key through `node`: one more entry in the log.
async fn kv_put(node: &MetaNode, key: &str) -> Result<()> {
    let put = meta_consensus::Command::Put {
        key: key.into(),
        value: vec![1],
        if_revision: None,
    };
    node.write(put).await?;
    Ok(())
}

/// Polls until `node` reports `role` (at most [`WAIT`]). The role also depends on a removal
/// notice, which is not in openraft's metrics: waiting for a metrics change could miss it.
async fn until_role(node: &MetaNode, role: Role) -> Result<()> {
    let deadline = std::time::Instant::now() + WAIT;
    while node.status().role != role {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "node {} is {:?} after {WAIT:?}, not {role:?}",
            node.id(),
            node.status().role
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Four learners added at once all join. Each change is proposed while others are still being
/// committed (they start together and each needs a quorum's fsync), which openraft refuses as
/// "in progress"; before the calls waited, most of them failed with a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_learner_additions_all_succeed() -> Result<()> {
    let mut c = Cluster::three().await?;
    for id in 4..=7 {
        c.start(id).await?;
    }
    let leader = c.leader().await?;
    let adds = (4..=7).map(|id| {
        let leader = leader.clone();
        async move { leader.add_learner(id, Node::new(addr(id))).await }
    });
    let results = futures::future::join_all(adds).await;
    for (id, r) in (4..=7).zip(results) {
        assert!(r.is_ok(), "adding learner {id}: {r:?}");
    }
    let learners: BTreeSet<_> = leader.status().learners.into_iter().collect();
    assert_eq!(learners, BTreeSet::from([4, 5, 6, 7]));

    // Removals at once wait for each other the same way.
    let removes = (4..=7).map(|id| {
        let leader = leader.clone();
        async move { leader.remove_learner(id).await }
    });
    for (id, r) in (4..=7).zip(futures::future::join_all(removes).await) {
        assert!(r.is_ok(), "removing learner {id}: {r:?}");
    }
    assert!(leader.status().learners.is_empty());
    c.shutdown().await
}

/// A membership change's caller sees it in the node's status as soon as the change returns
/// (the answer to an HTTP change shows the members from the status): openraft answers once
/// the entry is applied, and may publish its metrics only after. Repeated, under writes,
/// because the gap is a scheduling matter: it showed about one time in two on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_change_shows_in_the_status_when_it_returns() -> Result<()> {
    // One voter: a change commits as soon as the leader's own log holds it.
    let mut c = Cluster::new()?;
    let leader = c.start(1).await?;
    leader
        .initialize(std::collections::BTreeMap::from([(1, Node::new(addr(1)))]))
        .await?;
    c.start(4).await?;
    let leader = c.leader().await?;
    // Writes keep the Raft core busy, so that it handles several events between two
    // publications of its metrics.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let (leader, stop) = (leader.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = leader
                        .register_datanode(1000 * w + i, format!("dn-{w}-{i}"))
                        .await;
                    i += 1;
                }
            })
        })
        .collect();
    for round in 0..40 {
        leader.add_learner(4, Node::new(addr(4))).await?;
        let st = leader.status();
        assert_eq!(st.learners, vec![4], "round {round}: added, {st:?}");
        let moved = format!("{}-moved-{round}", addr(4));
        leader.change_address(4, moved.clone()).await?;
        let st = leader.status();
        assert_eq!(st.nodes[&4], moved, "round {round}: moved, {st:?}");
        leader.remove_learner(4).await?;
        let st = leader.status();
        assert!(st.learners.is_empty(), "round {round}: removed, {st:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await?;
    }
    c.shutdown().await
}

/// A leader that removes itself from the voters hands over to the others and then says what it
/// is: `Removed` in its status (no leader named), and a request sent to it is refused with the
/// members to go to, where it used to report itself a learner and answer "no leader".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_removed_itself_reports_it_and_refuses_requests() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    leader.register_datanode(7, "dn-7").await?;
    let others: BTreeSet<_> = (1..=3).filter(|i| *i != leader.id()).collect();
    leader.change_voters(others.clone()).await?;

    // Openraft steps the old leader down once the change is committed.
    leader
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.state != ServerState::Leader, "old leader steps down")
        .await?;
    let st = leader.status();
    assert_eq!(st.role, Role::Removed, "{st:?}");
    assert_eq!(st.leader_id, None);
    let removal = st
        .removal
        .clone()
        .expect("the status names the membership it was left out of");
    assert_eq!(removal.members, others.iter().copied().collect::<Vec<_>>());
    assert!(removal.membership_index > 0, "{removal:?}");
    match leader.register_datanode(8, "dn-8").await {
        Err(Error::Removed { members }) => {
            assert_eq!(members, others.iter().copied().collect::<Vec<_>>())
        }
        other => panic!("expected removed, got {other:?}"),
    }
    match leader.datanode(Consistency::Linearizable, 7).await {
        Err(Error::Removed { .. }) => {}
        other => panic!("expected removed, got {other:?}"),
    }

    // The others elect a leader among themselves and keep everything.
    c.stop(leader.id()).await?;
    let next = c.leader().await?;
    assert!(others.contains(&next.id()));
    next.register_datanode(8, "dn-8").await?;
    assert!(next.datanode(Consistency::Linearizable, 7).await?.is_some());
    c.shutdown().await
}

/// A leader that removed itself leads on for a while (openraft steps it down 150 ms after the
/// removal commits). A membership change asked of it in that time is refused with the members
/// to go to; it used to be proposed there, and a debug build's Raft core panicked on it (a
/// membership entry from a leader its own membership does not name), which stopped the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_removed_itself_refuses_membership_changes_before_it_steps_down() -> Result<()>
{
    let mut c = Cluster::three().await?;
    c.start(4).await?;
    let leader = c.leader().await?;
    leader.add_learner(4, Node::new(addr(4))).await?;
    let others: BTreeSet<_> = (1..=4).filter(|i| *i != leader.id()).collect();
    c.converged().await?;
    leader.change_voters(others.clone()).await?;

    let members: Vec<_> = others.iter().copied().collect();
    let asks = [
        leader.change_voters(others.clone()).await,
        leader
            .add_learner(leader.id(), Node::new(addr(leader.id())))
            .await,
        leader.remove_learner(4).await,
    ];
    for r in asks {
        match r {
            Err(Error::Removed { members: m }) => assert_eq!(m, members),
            other => panic!("expected removed, got {other:?}"),
        }
    }
    // Its core still runs: it steps down as it should.
    leader
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.state != ServerState::Leader, "old leader steps down")
        .await?;
    c.stop(leader.id()).await?;
    let next = c.leader().await?;
    assert!(others.contains(&next.id()));
    next.register_datanode(8, "dn-8").await?;
    c.shutdown().await
}

/// A follower removed from the voters never receives the membership without it (the leader
/// stops replicating to it first), so its own log still names it. The members it then asks for
/// votes tell it, and it reports `Removed` and refuses requests, where it used to report itself
/// a candidate of the old voters. Added again as a learner, it is a learner again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_follower_learns_it_from_the_members() -> Result<()> {
    let c = Cluster::three().await?;
    let leader = c.leader().await?;
    let removed = (1..=3).find(|i| *i != leader.id()).unwrap();
    let others: BTreeSet<_> = (1..=3).filter(|i| *i != removed).collect();
    leader.change_voters(others.clone()).await?;

    // Once its election timeout passes it campaigns, and the members' answers tell it.
    let node = c.node(removed).clone();
    until_role(&node, Role::Removed).await?;
    let st = node.status();
    assert_eq!(st.leader_id, None);
    // Its own membership still names it; the status says which one left it out.
    assert!(st.voters.contains(&removed), "{st:?}");
    let removal = st
        .removal
        .clone()
        .expect("the status names the membership it was left out of");
    assert_eq!(removal.members, others.iter().copied().collect::<Vec<_>>());
    assert!(
        st.last_log_index
            .is_none_or(|last| removal.membership_index > last),
        "{st:?}"
    );
    match node.register_datanode(8, "dn-8").await {
        Err(Error::Removed { members }) => {
            assert_eq!(members, others.iter().copied().collect::<Vec<_>>())
        }
        other => panic!("expected removed, got {other:?}"),
    }
    // The others carry on.
    let leader = c.leader().await?;
    leader.register_datanode(9, "dn-9").await?;

    // Added again, as a learner: the notice no longer applies.
    leader
        .add_learner(removed, Node::new(addr(removed)))
        .await?;
    until_role(&node, Role::Learner).await?;
    let w = leader.register_datanode(10, "dn-10").await?;
    node.wait_applied(w.index, WAIT).await?;
    c.shutdown().await
}

/// A learner that restarts while it catches up holds memberships from before it was added,
/// which leave it out: it still reports itself a learner, not `Removed` (which tells an
/// operator to stop it). It started with no Raft state, so a membership that leaves it out is
/// one it replays. It used to read as removed until it caught up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_restarted_while_catching_up_is_not_reported_removed() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    for i in 0..1500u64 {
        leader.register_datanode(i, "dn").await?;
    }
    let learner = c.start(4).await?;
    leader.add_learner(4, Node::new(addr(4))).await?;
    let left_out = |m: &openraft::RaftMetrics<meta_consensus::TypeConfig>| {
        m.last_log_index.is_some_and(|i| i > 0)
            && m.membership_config.membership().get_node(&4).is_none()
    };
    let learner = c
        .restart_cut_off_at(
            learner,
            leader.id(),
            left_out,
            "catching up on memberships without it",
        )
        .await?;
    let role = learner.status().role;
    anyhow::ensure!(
        role != Role::Removed,
        "the restarted learner reports {role:?}"
    );
    c.router.heal(leader.id(), 4);
    until_role(&learner, Role::Learner).await?;
    c.shutdown().await
}

/// Makes the first step of a voter change alone on a cluster of three with learner 4 (a caller
/// that went away between openraft's two steps): the voters and the voters with 4 in place of
/// a follower, at once. Returns the leader, the follower replaced and the newer voter set.
async fn half_done_voter_change(c: &mut Cluster) -> Result<(MetaNode, u64, BTreeSet<u64>)> {
    use std::collections::BTreeMap;

    use openraft::async_runtime::watch::WatchReceiver as _;
    use openraft::{EntryPayload, Membership};

    c.start(4).await?;
    let leader = c.leader().await?;
    leader.add_learner(4, Node::new(addr(4))).await?;
    let gone = (1..=3).find(|id| *id != leader.id()).unwrap();
    let mut after: BTreeSet<u64> = (1..=3).filter(|id| *id != gone).collect();
    after.insert(4);
    let observed = leader
        .raft()
        .metrics()
        .borrow_watched()
        .membership_config
        .clone();
    let nodes: BTreeMap<_, _> = observed
        .membership()
        .nodes()
        .map(|(id, n)| (*id, n.clone()))
        .collect();
    let joint = Membership::new(vec![BTreeSet::from([1, 2, 3]), after.clone()], nodes)?;
    leader
        .raft()
        .append_membership(joint, EntryPayload::Blank, [])
        .await?;
    assert_eq!(configs(&leader).len(), 2, "joint");
    Ok((leader, gone, after))
}

/// The voter sets of `n`'s membership (two while it is joint).
fn configs(n: &MetaNode) -> Vec<BTreeSet<u64>> {
    use openraft::async_runtime::watch::WatchReceiver as _;
    n.raft()
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .get_joint_config()
        .clone()
}

/// A voter change left half done (its caller went away between openraft's two steps, leaving
/// a joint membership whose commits need a majority of both voter sets) is finished by the
/// next membership change, as it was meant, before that change is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_change_left_half_done_is_finished_by_the_next_change() -> Result<()> {
    let mut c = Cluster::three().await?;
    c.start(5).await?;
    let (leader, gone, after) = half_done_voter_change(&mut c).await?;
    // Finished as the change meant it (the replaced voter leaves the cluster, not stays on as
    // a learner, as a learner's addition from the joint membership would keep it), then the
    // learner added.
    leader.add_learner(5, Node::new(addr(5))).await?;
    assert_eq!(configs(&leader), vec![after]);
    let learners: BTreeSet<_> = leader.status().learners.into_iter().collect();
    assert_eq!(learners, BTreeSet::from([5]), "node {gone} left");
    c.shutdown().await
}

/// A voter of the older set only, while a change that replaces it is half done, is a voter
/// still: removing it finishes the change (it was refused as "not a voter", 404, and the
/// README names this removal as the way to finish the change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_voter_a_half_done_change_replaces_finishes_it() -> Result<()> {
    let mut c = Cluster::three().await?;
    let (leader, gone, after) = half_done_voter_change(&mut c).await?;
    leader.remove_voter(gone).await?;
    assert_eq!(configs(&leader), vec![after]);
    assert!(leader.status().learners.is_empty(), "node {gone} left");
    match leader.remove_voter(gone).await {
        Err(meta_consensus::Error::NotFound(_)) => {}
        other => anyhow::bail!("removed again: {other:?}"),
    }
    c.shutdown().await
}

/// A voter change sent while one was left half done goes from the joint membership to the
/// voters it names, which may be any of either set: the replaced voter too. It used to finish
/// the half-done change first, which made the replaced voter leave, and then refuse it (400,
/// "neither a voter nor a learner") with the membership changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_change_over_a_half_done_one_keeps_the_voters_it_names() -> Result<()> {
    let mut c = Cluster::three().await?;
    let (leader, _, after) = half_done_voter_change(&mut c).await?;
    let sets = leader.status().voter_sets;
    let after: Vec<u64> = after.into_iter().collect();
    assert_eq!(
        sets,
        vec![vec![1, 2, 3], after],
        "the status shows both sets"
    );
    let all = BTreeSet::from([1, 2, 3, 4]);
    leader.change_voters(all.clone()).await?;
    assert_eq!(configs(&leader), vec![all]);
    let back = BTreeSet::from([1, 2, 3]);
    leader.change_voters(back.clone()).await?;
    assert_eq!(configs(&leader), vec![back]);
    assert!(leader.status().learners.is_empty(), "node 4 left");
    assert_eq!(leader.status().voter_sets, vec![vec![1, 2, 3]]);
    c.shutdown().await
}

/// A log to catch up on: 480 registrations at `leader`, by eight writers at once.
async fn write_a_log(leader: &MetaNode, from: u64) -> Result<()> {
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let leader = leader.clone();
            tokio::spawn(async move {
                for i in 0..60u64 {
                    leader.register_datanode(from + 1000 * w + i, "dn").await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for w in writers {
        w.await??;
    }
    Ok(())
}

/// Follows the roles `node` reports, looking as often as the runtime lets it, until it reports
/// itself a learner of a membership that names it, having applied `target` (at most [`WAIT`]).
fn roles_until_learner(
    node: &MetaNode,
    target: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Vec<Role>> {
    let node = node.clone();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let st = node.status();
            if seen.last() != Some(&st.role) {
                seen.push(st.role);
            }
            let applied = st
                .applied
                .is_some_and(|a| a >= target.load(Ordering::Acquire));
            if st.role == Role::Learner && st.learners.contains(&node.id()) && applied {
                return seen;
            }
            if std::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::task::yield_now().await;
        }
    })
}

/// A learner that is catching up holds the memberships from before it was added until it
/// reaches the entry that adds it. They leave it out, but it was not removed: it reports
/// itself a learner, not `Removed` (which tells an operator to stop it), all the way in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_catching_up_never_reports_itself_removed() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    write_a_log(&leader, 0).await?;
    let learner = c.start(4).await?;
    let roles = roles_until_learner(&learner, Arc::new(AtomicU64::new(0)));
    leader.add_learner(4, Node::new(addr(4))).await?;
    let seen = roles.await?;
    anyhow::ensure!(
        !seen.contains(&Role::Removed) && seen.last() == Some(&Role::Learner),
        "the learner reported {seen:?}"
    );
    c.shutdown().await
}

/// Nor does a node that was a voter before, removed, wiped and added again: the log it
/// replays names its former self, then removes it, then adds it again. It used to report
/// itself `Removed` (and refuse reads, telling its operator to stop it) from the removal's
/// entry on until it reached the new addition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_added_again_never_reports_itself_removed() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    c.start(4).await?;
    leader.add_learner(4, Node::new(addr(4))).await?;
    leader.add_voter(4).await?;
    write_a_log(&leader, 0).await?;
    leader.remove_voter(4).await?;
    write_a_log(&leader, 100_000).await?;
    c.stop(4).await?;
    std::fs::remove_dir_all(c.dir(4))?;
    let wiped = c.start(4).await?;
    // Until it applied its new addition: its former self was a learner too.
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let roles = roles_until_learner(&wiped, target.clone());
    leader.add_learner(4, Node::new(addr(4))).await?;
    let added = leader
        .status()
        .applied
        .context("the leader applied nothing")?;
    target.store(added, Ordering::Release);
    let seen = roles.await?;
    anyhow::ensure!(
        !seen.contains(&Role::Removed) && seen.last() == Some(&Role::Learner),
        "the wiped voter reported {seen:?}"
    );
    c.shutdown().await
}

/// Removing a voter that answers while another voter is down leaves the new voters without a
/// majority that answers: the change could not commit, and every write after it would wait
/// behind it until the down voter returned. The leader refuses it (a conflict naming the
/// silent voter; nothing changes, writes go on), and removing the down voter instead passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_change_without_an_answering_majority_is_refused() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    let mut followers = (1..=3).filter(|i| *i != leader.id());
    let (up, down) = (followers.next().unwrap(), followers.next().unwrap());
    c.stop(down).await?;
    // The leader counts a voter as answering while it heard from it within the election
    // timeout.
    let lease = c.config(leader.id()).election_timeout();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let heard = leader
            .status()
            .replication
            .iter()
            .find(|r| r.node == down)
            .and_then(|r| r.heard_ms);
        if heard.is_some_and(|ms| u128::from(ms) > lease.as_millis()) {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "node {down} still heard from {heard:?} ms ago after {WAIT:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    let without_up = BTreeSet::from([leader.id(), down]);
    match leader.change_voters(without_up).await {
        Err(Error::Conflict(m)) => assert!(
            m.contains(&format!("[{down}]")) && m.contains("new voters"),
            "names the silent voter: {m}"
        ),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(configs(&leader), vec![BTreeSet::from([1, 2, 3])]);
    leader.register_datanode(7, "dn-7").await?;

    let without_down = BTreeSet::from([leader.id(), up]);
    leader.change_voters(without_down.clone()).await?;
    assert_eq!(configs(&leader), vec![without_down]);
    leader.register_datanode(8, "dn-8").await?;
    c.shutdown().await
}

/// Nor one right after a voter stopped: the leader heard from it within the election timeout,
/// but not since the request. It used to take the change, which could not commit, and the
/// cluster sat in a joint membership that took no write until the stopped voter returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_change_right_after_a_voter_stopped_is_refused() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    let mut followers = (1..=3).filter(|i| *i != leader.id());
    let (up, down) = (followers.next().unwrap(), followers.next().unwrap());
    c.stop(down).await?;
    match leader
        .change_voters(BTreeSet::from([leader.id(), down]))
        .await
    {
        Err(Error::Conflict(m)) => assert!(
            m.contains(&format!("[{down}]")) && m.contains("since the request"),
            "names the stopped voter: {m}"
        ),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(configs(&leader), vec![BTreeSet::from([1, 2, 3])]);
    leader.register_datanode(7, "dn-7").await?;
    // Removing the stopped voter passes: the other two answer.
    leader.remove_voter(down).await?;
    assert_eq!(configs(&leader), vec![BTreeSet::from([leader.id(), up])]);
    c.shutdown().await
}

/// A leader that removes itself in favour of a single other voter steps down at once, and the
/// new voter leads without it: nobody replicates to the old leader any more. Its writes that
/// followed the removal were never answered, and waited for the request timeout; now each is
/// answered (`outcome_unknown` for those still under way) once the old leader stepped down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_at_a_leader_that_removed_itself_are_answered() -> Result<()> {
    let c = Cluster::three().await?;
    let old = c.leader().await?;
    let to = (1..=3).find(|i| *i != old.id()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Each writer goes on after a refusal (a write after the removal is refused at once) until
    // the old leader reports itself removed, and says whether a write of its waited for the
    // request timeout.
    let writers: Vec<_> = (0..16u64)
        .map(|w| {
            let (old, stop) = (old.clone(), stop.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let put = meta_consensus::Command::Put {
                        key: format!("k{w}-{i}"),
                        value: vec![1],
                        if_revision: None,
                    };
                    match old.write(put).await {
                        Err(Error::Timeout) => return true,
                        Err(_) => tokio::task::yield_now().await,
                        Ok(_) => {}
                    }
                }
                false
            })
        })
        .collect();
    // Writes under way when the change is made.
    old.raft()
        .wait(Some(WAIT))
        .metrics(|m| m.last_applied.is_some_and(|l| l.index > 100), "writes")
        .await?;
    old.change_voters(BTreeSet::from([to])).await?;
    until_role(&old, Role::Removed).await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        assert!(
            !w.await?,
            "a write at the removed leader waited for the request timeout"
        );
    }
    let leader = c.leader().await?;
    assert_eq!(leader.id(), to);
    leader.register_datanode(7, "dn-7").await?;
    c.shutdown().await
}

/// A learner promoted as soon as it was added is promoted once the leader hears it caught up
/// (within a lease), rather than refused because the leader's progress figures lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_promoted_at_once_is_promoted_once_it_caught_up() -> Result<()> {
    let mut c = Cluster::three().await?;
    c.start(4).await?;
    let leader = c.leader().await?;
    leader.add_learner(4, Node::new(addr(4))).await?;
    let voters: BTreeSet<_> = (1..=4).collect();
    leader.change_voters(voters.clone()).await?;
    let members: BTreeSet<_> = leader
        .raft()
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    assert_eq!(members, voters);
    c.shutdown().await
}

/// A learner whose addition was lost with the office of the leader that appended it (no voter
/// got the entry) has that entry truncated when the next leader probes its log: for a moment
/// the last membership in its log leaves it out after one named it. It was never removed: it
/// reports itself a learner throughout, not `Removed` (which tells an operator to stop it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_whose_addition_was_lost_never_reports_itself_removed() -> Result<()> {
    let mut c = Cluster::three().await?;
    let old = c.leader().await?;
    let last = |n: &MetaNode| n.status().last_log_index.unwrap_or(0);
    // openraft's first probe of a new member's log, whose leader's log ends at `end`, asks
    // whether it holds the entry at `end / 16 * 8 - 1`. The entries are laid so that this is
    // the lost addition: the log the voters share ends at `k - 1`, the addition is at `k`,
    // and the next leader's log ends at `2k + 1` once it adds node 4 again.
    while (last(&old) + 2) % 8 != 0 {
        kv_put(&old, "fill").await?;
    }
    let shared = last(&old);
    c.wait_applied(shared).await?;
    let learner = c.start(4).await?;
    let named = |m: &openraft::RaftMetrics<meta_consensus::TypeConfig>| {
        m.membership_config.membership().get_node(&4).is_some()
    };
    // Every state openraft reports on node 4, with the role node 4 reports in it.
    let watched = learner.clone();
    let roles = tokio::spawn(async move {
        let mut metrics = watched.raft().metrics();
        let (mut roles, mut was_named, mut unnamed_after) = (Vec::new(), false, false);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (now_named, committed) = {
                let m = metrics.borrow_watched();
                let committed = m
                    .committed_membership_config
                    .membership()
                    .get_node(&4)
                    .is_some();
                (named(&m), committed)
            };
            unnamed_after |= was_named && !now_named;
            was_named |= now_named;
            let role = watched.status().role;
            if roles.last() != Some(&role) {
                roles.push(role);
            }
            if committed && role == Role::Learner {
                return (roles, unnamed_after);
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                _ => return (roles, unnamed_after),
            }
        }
    });
    let others: Vec<_> = (1..=3).filter(|i| *i != old.id()).collect();
    for other in &others {
        c.router.cut(old.id(), *other);
    }
    anyhow::ensure!(
        last(&old) == shared,
        "the leader appended more before the cut"
    );
    // The cut-off leader appends the addition and sends it to node 4, but to no voter.
    let raft = old.raft().clone();
    let lost = tokio::spawn(async move { raft.add_learner(4, Node::new(addr(4)), false).await });
    learner
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| named(m), "node 4 holds its first addition")
        .await?;
    // The other voters elect a leader, which never had that entry, and add node 4 again.
    let deadline = std::time::Instant::now() + WAIT;
    let new = loop {
        if let Some(n) = others
            .iter()
            .map(|i| c.node(*i))
            .find(|n| n.status().role == Role::Leader)
        {
            break n.clone();
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "no new leader");
        c.node(others[0])
            .raft()
            .wait(Some(std::time::Duration::from_millis(200)))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != old.id()),
                "a new leader",
            )
            .await
            .ok();
    };
    while last(&new) < 2 * (shared + 1) {
        kv_put(&new, "fill").await?;
    }
    new.add_learner(4, Node::new(addr(4))).await?;
    let (roles, unnamed_after) = roles.await?;
    anyhow::ensure!(
        unnamed_after,
        "node 4's log never left it out after naming it (roles {roles:?})"
    );
    anyhow::ensure!(
        !roles.contains(&Role::Removed) && roles.last() == Some(&Role::Learner),
        "the learner reported {roles:?}"
    );
    lost.abort();
    c.router.heal_all();
    c.shutdown().await
}
