//! A voter whose data dir was lost, back at its address: it cannot tell itself from a new
//! member, and its former self may have helped commit writes it no longer holds. Until a leader
//! has fed it the log again, it neither votes for a candidate with a log nor stands for
//! election itself.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{addr, Cluster, WAIT};
use meta_consensus::{Command, Consistency, Error, LogStore, MetaNode, Node, Role};
use meta_store::WalOptions;
use openraft::async_runtime::watch::WatchReceiver as _;

/// A voter whose data dir was lost still refuses to vote for a candidate with a log after a
/// leader's first message gave it a term (openraft saves the leader's vote before it looks at
/// the log), until it holds the log again; then it votes, and the marker that kept the rule
/// across restarts is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_votes_again_only_once_it_has_the_log() -> Result<()> {
    use openraft::raft::{AppendEntriesRequest, VoteRequest};

    let mut c = Cluster::three().await?;
    let leader = c.leader().await?.id();
    let others: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    let (stale, wiped) = (others[0], others[1]);
    c.converged().await?;
    // The stale candidate's log ends before the write the other two acknowledge.
    let stale_last = c.node(stale).raft().metrics().borrow_watched().last_applied;
    c.stop(stale).await?;
    let w = c
        .node(leader)
        .register_datanode(7, "dn-7".to_string())
        .await?;
    c.wait_applied(w.index).await?;
    let lm = c.node(leader).raft().metrics().borrow_watched().clone();

    c.stop(wiped).await?;
    std::fs::remove_dir_all(c.dir(wiped))?;
    c.stop(leader).await?;
    let empty = c.start(wiped).await?;
    // The leader's first message (a heartbeat that finds no matching log) gives it a term.
    let answer = empty
        .raft()
        .append_entries(AppendEntriesRequest {
            vote: lm.vote,
            prev_log_id: lm.last_applied,
            entries: vec![],
            leader_commit: lm.local_committed,
        })
        .await;
    ensure!(answer.is_ok(), "{answer:?}");
    // Its metrics show the term a moment after the answer.
    let term = lm.current_term;
    empty
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.current_term == term, "the heartbeat's term")
        .await
        .context("the heartbeat gave no term")?;
    // The leader is gone: once the lease its heartbeat gave ends (an election timeout, at most
    // 1.4 s here), openraft alone would grant the stale candidate's vote.
    let window = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < window {
        let rpc = VoteRequest::new(meta_consensus::Vote::new(term + 1, stale), stale_last);
        match empty.vote(rpc).await {
            Err(Error::NotVoting(_)) => {}
            Ok(answer) if !answer.vote_granted => {}
            other => anyhow::bail!("voted for a candidate without the write: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Once the leader fed it the log, it holds an entry of the current term: the rule ends.
    c.start(leader).await?;
    c.start(stale).await?;
    c.converged().await?;
    rejoin_ends(&c, wiped).await?;
    c.shutdown().await
}

/// A new member of a new cluster whose first leader stops right after its first entry reached
/// the member, before the commit index did. The member durably holds an entry of the leader's
/// term, at or past the commit index the leader's message carried (none yet): it holds the
/// log, and votes for the other survivor. It used to wait to learn an entry of its term
/// committed, which no leader was left to tell it, so the two survivors elected no leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_whose_first_leader_stopped_early_votes_for_the_other_survivor() -> Result<()>
{
    use std::collections::{BTreeMap, BTreeSet};

    use meta_consensus::{Entry, LogId, Node, Vote};
    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    use openraft::vote::leader_id_adv::LeaderId;
    use openraft::{EntryPayload, Membership};

    let mut c = Cluster::new()?;
    let new = c.start(3).await?;
    let members: BTreeMap<u64, Node> = (1..=3).map(|i| (i, Node::new(common::addr(i)))).collect();
    let membership = Membership::new(vec![BTreeSet::from([1, 2, 3])], members)?;
    // What node 1's `initialize` wrote, and the entry it appended once elected in term 1.
    let first = LogId::new(
        LeaderId {
            term: 1,
            node_id: 1,
        },
        1,
    );
    let entries = vec![
        Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 0,
                    node_id: 1,
                },
                0,
            ),
            payload: EntryPayload::Membership(membership),
        },
        Entry {
            log_id: first,
            payload: EntryPayload::Blank,
        },
    ];
    // Nodes 1 and 2 are not running: stand-ins answer the member's question for the term.
    for id in [1, 2] {
        c.router.stand_in(id, answer_of(1, 3));
    }
    append_admitted(
        &new,
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        },
    )
    .await?;

    // Node 1 is gone. Once the lease its message gave has passed (an election timeout, at most
    // 1.4 s here), node 2, holding the same log, gets the vote.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let rpc = VoteRequest::new(Vote::new(2, 2), Some(first));
        match new.vote(rpc).await {
            Ok(answer) if answer.vote_granted => break,
            Ok(_) | Err(Error::NotVoting(_)) => {}
            Err(e) => return Err(e.into()),
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no vote for the other survivor after {WAIT:?}: {:?}",
            new.status().role
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rejoin_ends(&c, 3).await?;
    c.shutdown().await
}

/// A member whose rejoin marker came back (its removal is not fsynced: a crash may undo it)
/// holds the log already: it ends the rejoin in an idle cluster too, where nothing is appended
/// (after a restart openraft counts what is on disk as flushed only once a leader's heartbeat
/// matched it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_rejoin_marker_came_back_ends_it_in_an_idle_cluster() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?.id();
    let member = (1..=3).find(|i| *i != leader).context("a follower")?;
    c.stop(member).await?;
    let marker = c.dir(member).join("REJOINING");
    std::fs::write(&marker, "this node started with no Raft state\n")?;
    c.start(member).await?;
    rejoin_ends(&c, member).await?;
    c.shutdown().await
}

/// A voter whose data dir was lost does not help elect a candidate that misses acknowledged
/// writes. Nodes a, b, c: with a down, a write is acknowledged by b and c; then c loses its data
/// dir and b stops. a and the empty c must not elect a (the write would be lost); once b is
/// back, the cluster elects a leader that holds the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_does_not_elect_a_stale_candidate() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?.id();
    let others: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    let (a, b, wiped) = (others[0], leader, others[1]);
    c.stop(a).await?;
    let w = c.node(b).register_datanode(7, "dn-7".to_string()).await?;
    c.wait_applied(w.index).await?;

    c.stop(wiped).await?;
    std::fs::remove_dir_all(c.dir(wiped))?;
    c.stop(b).await?;
    let stale = c.start(a).await?;
    c.start(wiped).await?;
    // Without the rule the empty node votes for a within an election timeout or two.
    none_leads(&[&stale], w.index).await?;
    the_write_survives(c, b).await
}

/// A voter whose data dir was lost does not help a deposed leader commit. Nodes l (leading),
/// b and c: l is cut off, b and c elect a leader of a newer term and commit a write; c loses
/// its data dir and comes back, reachable from l, which still leads its old term (cut off from
/// b, it does not know better). The newer leader's messages to c are lost, c's questions reach
/// it. A write sent to l must not be acknowledged: with c's acknowledgement l would commit it
/// where the newer term committed another entry. c answers l with the newer term, and l steps
/// down. Once the links heal, the newer term's write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_does_not_help_a_deposed_leader_commit() -> Result<()> {
    let mut c = Cluster::three().await?;
    let l = c.leader().await?.id();
    let old_term = c.node(l).raft().metrics().borrow_watched().current_term;
    c.router.isolate(l);
    let other = (1..=3).find(|i| *i != l).context("another node")?;
    let m = c
        .node(other)
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.current_term > old_term && m.current_leader.is_some_and(|x| x != l),
            "a leader of a newer term",
        )
        .await
        .context("the other two elected no leader")?;
    let b = m.current_leader.context("a leader")?;
    let wiped = (1..=3)
        .find(|i| *i != l && *i != b)
        .context("a third node")?;
    let w = c.node(b).register_datanode(7, "dn-7".to_string()).await?;
    ensure!(w.index > 0, "the write has an index");

    c.stop(wiped).await?;
    std::fs::remove_dir_all(c.dir(wiped))?;
    c.router.heal(l, wiped);
    c.router.cut_one_way(b, wiped);
    c.start(wiped).await?;
    let lm = c.node(l).raft().metrics().borrow_watched().clone();
    ensure!(
        lm.state == openraft::ServerState::Leader && lm.current_term == old_term,
        "l still leads its old term"
    );
    let deposed = tokio::time::timeout(
        Duration::from_secs(8),
        c.node(l).register_datanode(9, "dn-9".to_string()),
    )
    .await;
    if let Ok(Ok(written)) = deposed {
        anyhow::bail!(
            "the deposed leader committed a write at index {} with the acknowledgement of the \
             node that lost its data dir",
            written.index
        );
    }
    // Answered with the newer term, l steps down; cut off from b, it would lead on otherwise.
    c.node(l)
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.state != openraft::ServerState::Leader && m.current_term > old_term,
            "a follower of a newer term",
        )
        .await
        .context("the deposed leader still leads its old term")?;

    c.router.heal_all();
    the_write_is_kept(c).await
}

/// A voter whose data dir was lost is not kept out by a term that rose in a failed election.
/// Five voters: x is cut off from the leader l (only), and campaigns in vain (its pre-vote
/// passed, say, in a moment when the others had not heard from l): the others heard from l
/// lately and refuse it, so l leads on with them. r loses its data dir and comes back;
/// the members tell it x's term, newer than l's, so it refuses l. Answered with that term, l
/// steps down, the next election's leader is of a newer term still, and r rejoins. Were l
/// counted as merely unable to reach r, it would lead on, and r would wait for some other
/// election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_rejoins_past_a_term_that_rose_in_vain() -> Result<()> {
    let mut c = Cluster::voters(5).await?;
    // A new member rejoins until it holds the log, and stands for no election until then.
    for id in 2..=5 {
        rejoin_ends(&c, id).await?;
    }
    let l = c.leader().await?.id();
    let old_term = c.node(l).raft().metrics().borrow_watched().current_term;
    let mut others = (1..=5).filter(|i| *i != l);
    let (x, r) = (others.next().context("x")?, others.next().context("r")?);

    // x's pre-vote would fail (the others hear from l), so it campaigns as a node whose
    // pre-vote passed does.
    c.router.cut(l, x);
    c.node(x).raft().trigger().elect(false).await?;
    c.node(x)
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.current_term > old_term, "a newer term")
        .await
        .context("x never campaigned")?;
    let lm = c.node(l).raft().metrics().borrow_watched().clone();
    ensure!(
        lm.state == openraft::ServerState::Leader && lm.current_term == old_term,
        "l still leads its term"
    );
    c.stop(r).await?;
    std::fs::remove_dir_all(c.dir(r))?;
    c.start(r).await?;
    rejoin_ends(&c, r).await?;
    let term = c.node(r).raft().metrics().borrow_watched().current_term;
    ensure!(
        term > old_term,
        "r rejoined in term {term}, l's was {old_term}"
    );

    c.router.heal_all();
    let leader = c.leader().await?;
    leader.register_datanode(7, "dn-7".to_string()).await?;
    the_write_is_kept(c).await
}

/// A voter whose data dir was lost stands for no election until it holds the cluster's log
/// again. Nodes a, b, c: with a down, a write is acknowledged by b and c; c loses its data dir,
/// and b, leading, gives it the part of the log a holds (entries of b's term, committed) before
/// b stops. c's log is then as long as a's, and a would vote for it: c would lead without the
/// write, and b's copy would be overwritten once b is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_does_not_lead_before_it_has_the_log() -> Result<()> {
    fed_the_log_a_holds_it_does_not_lead(false).await
}

/// A voter whose data dir was lost takes what it must commit from its current term's leader,
/// not from a deposed leader (cut off, it does not know) whose message reached it first. As in
/// the test above, but a message of the term before, with an old commit index, comes first:
/// taking its commit index, the node would end its rejoin once it committed the entries a
/// holds, and lead without the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_lost_its_data_dir_heeds_the_newest_leader_not_the_first() -> Result<()> {
    fed_the_log_a_holds_it_does_not_lead(true).await
}

/// The node that lost its data dir is fed the entries a holds (committed, the last of b's
/// term) by b, then a comes back: neither may lead without the write a missed. With
/// `deposed_first`, a heartbeat of a deposed leader of the term before, with an old commit
/// index, reaches the node first.
async fn fed_the_log_a_holds_it_does_not_lead(deposed_first: bool) -> Result<()> {
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendError};

    let Lost {
        mut c,
        a,
        b,
        wiped,
        a_last,
        written,
        lm,
        entries,
    } = lost_after_a_write_a_missed(deposed_first).await?;
    // a and b are down: stand-ins answer the empty node's question for the term, as they
    // would (both know b's term).
    for id in [a, b] {
        c.router.stand_in(id, answer_of(lm.current_term, 3));
    }
    let empty = c.start(wiped).await?;
    if deposed_first {
        ensure!(lm.current_term >= 2, "a term before the leader's");
        // Once the node has heard the term, it refuses the deposed leader outright, with a
        // vote of that term, on which a leader steps down.
        let deposed_vote = meta_consensus::Vote::new_committed(lm.current_term - 1, a);
        let deposed = AppendEntriesRequest {
            vote: deposed_vote,
            prev_log_id: None,
            entries: vec![],
            leader_commit: entries.first().map(|e| e.log_id),
        };
        let higher = meta_consensus::Vote::new(lm.current_term, wiped);
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match empty.append_entries(deposed.clone()).await {
                Ok(AppendEntriesResponse::HigherVote(v)) if v == higher => break,
                Err(Error::Rejoining(_)) => {}
                other => anyhow::bail!("the deposed leader's message was answered {other:?}"),
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "the node never learned the term"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Streamed, the message ends the exchange with the same vote.
        use futures::StreamExt as _;
        let answers: Vec<_> = empty
            .stream_append(futures::stream::iter([deposed]))
            .collect()
            .await;
        ensure!(
            matches!(
                answers.as_slice(),
                [Ok(Err(StreamAppendError::HigherVote(v)))] if *v == higher
            ),
            "the deposed leader's streamed message was answered {answers:?}"
        );
        // Its snapshot too, before the file is looked at.
        let file = tempfile::NamedTempFile::new()?.into_temp_path();
        let answer = empty.install_received_snapshot(deposed_vote, file).await;
        ensure!(
            matches!(&answer, Ok(r) if r.vote == higher),
            "the deposed leader's snapshot was answered {answer:?}"
        );
    }
    append_admitted(
        &empty,
        AppendEntriesRequest {
            vote: lm.vote,
            prev_log_id: None,
            entries,
            leader_commit: lm.local_committed,
        },
    )
    .await?;
    empty
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.local_committed.is_some_and(|l| l.index == a_last),
            "the entries committed",
        )
        .await
        .context("the entries were not committed")?;
    let stale = c.start(a).await?;
    // a votes once the lease it gave b has passed (an election timeout, at most 1.4 s here);
    // the empty node stands within another.
    none_leads(&[&empty, &stale], written).await?;
    the_write_survives(c, b).await
}

/// Nodes a, b (the leader) and `wiped`, after: a stopped; a write acknowledged by b and
/// `wiped` (at index `written`); `wiped` lost its data dir; b stopped. With the entries a
/// holds too (up to `a_last`), read from b's log, the last of them of b's term, and b's
/// metrics before it stopped. With `second_term`, b leads a second term (its leader stopped
/// and started again first).
struct Lost {
    c: Cluster,
    a: u64,
    b: u64,
    wiped: u64,
    a_last: u64,
    written: u64,
    lm: openraft::RaftMetrics<meta_consensus::TypeConfig>,
    entries: Vec<meta_consensus::Entry>,
}

async fn lost_after_a_write_a_missed(second_term: bool) -> Result<Lost> {
    use openraft::storage::{RaftLogReader, RaftLogStorage};

    let mut c = Cluster::three().await?;
    if second_term {
        let first = c.leader().await?.id();
        c.stop(first).await?;
        c.start(first).await?;
    }
    let b = c.leader().await?.id();
    let others: Vec<u64> = (1..=3).filter(|i| *i != b).collect();
    let (a, wiped) = (others[0], others[1]);
    c.converged().await?;
    let a_last = c
        .node(a)
        .raft()
        .metrics()
        .borrow_watched()
        .last_log_index
        .context("a holds a log")?;
    c.stop(a).await?;
    let w = c.node(b).register_datanode(7, "dn-7".to_string()).await?;
    c.wait_applied(w.index).await?;
    let lm = c.node(b).raft().metrics().borrow_watched().clone();
    c.stop(wiped).await?;
    std::fs::remove_dir_all(c.dir(wiped))?;
    c.stop(b).await?;
    // The entries a holds too, from b's log while b is down.
    let entries = {
        let mut log = LogStore::open(&c.dir(b).join("wal"), WalOptions::default())?;
        let mut reader = log.get_log_reader().await;
        reader.try_get_log_entries(0..=a_last).await?
    };
    ensure!(
        entries.last().map(|e| e.log_id.leader_id.term) == Some(lm.current_term),
        "a's last entry is of b's term"
    );
    Ok(Lost {
        c,
        a,
        b,
        wiped,
        a_last,
        written: w.index,
        lm,
        entries,
    })
}

/// What a member of a cluster of nodes 1 to `n`, in term `term`, answers a term probe with.
fn answer_of(term: u64, n: u64) -> meta_consensus::TermAnswer {
    meta_consensus::TermAnswer {
        term,
        voters: vec![(1..=n).collect()],
        addrs: (1..=n).map(|i| (i, common::addr(i))).collect(),
    }
}

/// Hands `rpc` to `node` until it is admitted (at most [`WAIT`]): the first are refused while
/// the rejoining node asks the members for the cluster's term.
async fn append_admitted(
    node: &MetaNode,
    rpc: openraft::raft::AppendEntriesRequest<meta_consensus::TypeConfig>,
) -> Result<()> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match node.append_entries(rpc.clone()).await {
            Err(Error::Rejoining(why)) => ensure!(
                std::time::Instant::now() < deadline,
                "still refused after {WAIT:?}: {why}"
            ),
            answer => {
                answer?;
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// For 5 s, none of `nodes` leads (each would, without the write at `index`).
async fn none_leads(nodes: &[&MetaNode], index: u64) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut metrics = nodes[0].raft().metrics();
    while std::time::Instant::now() < deadline {
        for node in nodes {
            ensure!(
                node.status().role != Role::Leader,
                "node {} leads without the write acknowledged at index {index}",
                node.id()
            );
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    }
    Ok(())
}

/// Once node `b` (which holds it) is back, the cluster elects a leader that holds datanode 7's
/// acknowledged registration, and the members converge.
async fn the_write_survives(mut c: Cluster, b: u64) -> Result<()> {
    c.start(b).await?;
    the_write_is_kept(c).await
}

/// The cluster elects a leader that holds datanode 7's acknowledged registration, and the
/// members converge.
async fn the_write_is_kept(c: Cluster) -> Result<()> {
    let leader = c.leader().await?;
    ensure!(
        leader
            .datanode(Consistency::Linearizable, 7)
            .await?
            .is_some(),
        "the acknowledged registration is lost"
    );
    c.converged().await?;
    c.shutdown().await
}

/// Writes `n` keys `{prefix}/{i}` through `leader`, eight writers at once.
async fn puts(leader: &MetaNode, prefix: &str, n: u64) -> Result<()> {
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let leader = leader.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for i in (w..n).step_by(8) {
                    let key = format!("{prefix}/{i}");
                    let value = key.as_bytes().to_vec();
                    let put = Command::Put {
                        key,
                        value,
                        if_revision: None,
                    };
                    leader.write(put).await?;
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

/// A cluster started as node 1 alone, grown to three voters; then node 1 leaves the voters and
/// loses its data dir, and comes back as a learner. Returns the cluster's leader and the
/// rebuilt node, which starts to replay the log from its start.
async fn rebuilt_first_node(c: &mut Cluster) -> Result<(MetaNode, MetaNode)> {
    let one = c.leader().await?;
    // The stretch in which node 1 is the only voter.
    puts(&one, "alone", 5000).await?;
    for id in [2, 3] {
        c.start(id).await?;
        one.add_learner(id, Node::new(addr(id))).await?;
    }
    let deadline = std::time::Instant::now() + WAIT;
    while let Err(e) = one.change_voters(BTreeSet::from([1, 2, 3])).await {
        ensure!(std::time::Instant::now() < deadline, "no promotion: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    puts(&one, "three", 100).await?;
    one.change_voters(BTreeSet::from([2, 3])).await?;
    c.stop(1).await?;
    std::fs::remove_dir_all(c.dir(1))?;
    let leader = c.leader().await?;
    let rebuilt = c.start(1).await?;
    leader.add_learner(1, Node::new(addr(1))).await?;
    Ok((leader, rebuilt))
}

/// Follows `node` until it applied `target`, failing if it ever leads.
async fn never_leads_until(node: &MetaNode, target: Option<u64>) -> Result<()> {
    let mut metrics = node.raft().metrics();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = metrics.borrow_watched().clone();
        ensure!(
            m.state != openraft::ServerState::Leader,
            "the rebuilt node leads (term {}, log up to {:?}, the cluster's up to {target:?})",
            m.current_term,
            m.last_log_index
        );
        if m.last_applied.map(|l| l.index) >= target {
            return Ok(());
        }
        tokio::time::timeout_at(deadline, metrics.changed())
            .await
            .context("the rebuilt node never caught up")??;
    }
}

/// A node whose data dir was lost replays the cluster's log from its start, and a cluster that
/// started as one node (as the default does) has a stretch of log in which that node was the
/// only voter. openraft elects a sole voter at once, without asking anyone: replaying that
/// stretch, the node must not stand for election, since it follows the cluster's leader. It
/// used to lead there, with a log that ends in that stretch, and the real voters' newer entries
/// were cut back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_node_does_not_lead_from_a_membership_it_once_led_alone() -> Result<()> {
    let mut c = Cluster::voters(1).await?;
    let (leader, rebuilt) = rebuilt_first_node(&mut c).await?;
    let target = leader.raft().metrics().borrow_watched().last_log_index;
    never_leads_until(&rebuilt, target).await?;
    let leader = c.leader().await?;
    for key in ["alone/4999", "three/99"] {
        leader
            .kv_get(Consistency::Linearizable, key)
            .await?
            .with_context(|| format!("{key} is lost"))?;
    }
    c.shutdown().await
}

/// As above, but the rebuilt node restarts in the middle of that stretch, cut off from the
/// leader: it opens as the only voter of its membership, and still stands for no election (it
/// follows another node's leadership: its vote says so), from the moment it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_node_restarted_where_it_led_alone_does_not_lead() -> Result<()> {
    let mut c = Cluster::voters(1).await?;
    let (leader, rebuilt) = rebuilt_first_node(&mut c).await?;
    let alone = |m: &openraft::RaftMetrics<meta_consensus::TypeConfig>| {
        m.last_log_index.is_some_and(|i| i > 0)
            && m.membership_config.membership().voter_ids().eq([1])
    };
    let rebuilt = c
        .restart_cut_off_at(
            rebuilt,
            leader.id(),
            alone,
            "replaying the stretch where it was the only voter",
        )
        .await?;
    // Two election timeouts and more (1.4 s at most each here): openraft would have elected it
    // within a tick.
    let window = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut metrics = rebuilt.raft().metrics();
    loop {
        let state = metrics.borrow_watched().state;
        ensure!(
            state != openraft::ServerState::Leader,
            "the restarted rebuilt node leads"
        );
        match tokio::time::timeout_at(window, metrics.changed()).await {
            Err(_) => break,
            Ok(changed) => changed?,
        }
    }
    c.router.heal(leader.id(), 1);
    let target = leader.raft().metrics().borrow_watched().last_log_index;
    never_leads_until(&rebuilt, target).await?;
    c.shutdown().await
}

/// A node rejoining from an empty data dir forwards to its leader at the address the leader's
/// own messages name, not at the one of the membership it replays, which may be from before the
/// leader moved (it used to forward there, to nobody, until the request timed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoining_node_forwards_to_the_address_its_leader_names() -> Result<()> {
    let mut c = Cluster::three().await?;
    let leader = c.leader().await?;
    puts(&leader, "log", 3000).await?;
    let wiped = if leader.id() == 3 { 2 } else { 3 };
    c.stop(wiped).await?;
    std::fs::remove_dir_all(c.dir(wiped))?;
    let node = c.start(wiped).await?;
    // It follows the leader, and holds part of the log: cut off there, it still rejoins.
    node.raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.current_leader == Some(leader.id()) && m.last_log_index.is_some(),
            "following the leader",
        )
        .await?;
    c.router.cut(leader.id(), wiped);
    ensure!(
        node.is_rejoining(),
        "caught up before the cut (the test needs a longer log)"
    );
    let (id, at) = node
        .leader_to_forward_to()
        .context("no leader to forward to")?;
    ensure!(id == leader.id() && at == addr(leader.id()), "{id} at {at}");
    // The leader's messages name where it is now (the transport notes it while rejoining).
    node.note_member_address(leader.id(), "10.0.0.9:7101");
    let (id, at) = node
        .leader_to_forward_to()
        .context("no leader to forward to")?;
    ensure!(
        id == leader.id() && at == "10.0.0.9:7101",
        "forwards to {id} at {at}"
    );
    c.router.heal(leader.id(), wiped);
    rejoin_ends(&c, wiped).await?;
    let (_, at) = node
        .leader_to_forward_to()
        .context("no leader to forward to")?;
    ensure!(
        at == addr(leader.id()),
        "once rejoined, the membership's: {at}"
    );
    c.shutdown().await
}

/// Waits (at most [`WAIT`]) until node `id`'s rejoin ended: its marker is gone, and then the
/// node no longer says it rejoins (it clears the marker first, so a node that says it
/// rejoined holds the log durably).
async fn rejoin_ends(c: &Cluster, id: u64) -> Result<()> {
    let marker = c.dir(id).join("REJOINING");
    let deadline = std::time::Instant::now() + WAIT;
    while marker.exists() || c.node(id).is_rejoining() {
        ensure!(
            std::time::Instant::now() < deadline,
            "the rejoin never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
