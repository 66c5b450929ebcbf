//! The cluster's version in a three-node in-process cluster: a command that needs a newer
//! version waits for every member to run a build of it, the leader raises the version once they
//! do, and afterwards an older build is refused as a member and as a learner.

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::{addr, remove_datanode, Cluster, WAIT};
use meta_consensus::{
    Behind, Command, CommandResult, Error, MetaNode, Node, NodeConfig, ShardReport, BASE_VERSION,
    BUILD_VERSION,
};

/// The tests of upgrades play clusters formed by builds whose version rose only when a command
/// needed it (a cluster formed by this build raises it at once: see the last test).
fn formed_by_an_older_build(cfg: &mut NodeConfig) {
    cfg.raise_version_at_formation = false;
}

/// This build's default, which the in-process cluster turns off for the other tests.
fn formed_by_this_build(cfg: &mut NodeConfig) {
    cfg.raise_version_at_formation = true;
}

/// Node 3 runs a build that predates `PruneReplicas`.
fn old_third(cfg: &mut NodeConfig) {
    formed_by_an_older_build(cfg);
    if cfg.id == 3 {
        cfg.build_version = 1;
    }
}

fn current_build(cfg: &mut NodeConfig) {
    formed_by_an_older_build(cfg);
}

/// Registers datanode 7 and asks for a prune of its current epoch.
async fn prune(leader: &MetaNode) -> meta_consensus::Result<CommandResult> {
    let w = leader.register_datanode(7, "dn-7").await?;
    let CommandResult::DatanodeRegistered { epoch, .. } = w.result else {
        panic!("unexpected {:?}", w.result);
    };
    let w = leader
        .write(Command::PruneReplicas {
            datanode: 7,
            epoch,
            from_bucket: 0,
        })
        .await?;
    Ok(w.result)
}

/// Waits until what `leader` heard from member `id` recently is `version` (`None`: nothing).
/// Restarts node 3 as the build `tune` gives it (of version `build`); answers the leader once
/// it heard node 3 answer as that build (until then it may count the old build's last answer).
async fn restart_third(c: &mut Cluster, tune: fn(&mut NodeConfig), build: u32) -> Result<MetaNode> {
    c.stop(3).await?;
    c.tune = tune;
    c.start(3).await?;
    let leader = c.leader().await?;
    until_heard(&leader, 3, Some(build)).await?;
    Ok(leader)
}

/// Restarts node 3 as the build `tune` gives it, which must refuse to start on the data of a
/// cluster of a newer version; answers its error.
async fn refused_restart_of_third(c: &mut Cluster, tune: fn(&mut NodeConfig)) -> Result<String> {
    c.stop(3).await?;
    c.tune = tune;
    let Err(e) = c.start(3).await else {
        bail!("an older build started on a cluster of a newer version");
    };
    Ok(e.downcast_ref::<Error>()
        .context("a node error")?
        .to_string())
}

async fn until_heard(leader: &MetaNode, id: u64, version: Option<u32>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while leader.member_versions().get(&id).copied().flatten() != version {
        if Instant::now() > deadline {
            bail!("the leader did not count node {id} as {version:?} within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_command_waits_until_every_member_runs_a_build_that_applies_it() -> Result<()> {
    let mut c = Cluster::three_tuned(old_third).await?;
    // Whichever node leads (node 3 too, which counts its own build), the prune is refused.
    let leader = c.leader().await?;
    let refused = prune(&leader).await;
    let Err(Error::ClusterVersionTooLow {
        what,
        needed,
        current,
        behind,
    }) = &refused
    else {
        bail!("expected a refusal, got {refused:?}");
    };
    assert_eq!((*needed, *current), (2, BASE_VERSION));
    // Named as an operator knows the request, not by the command's name.
    assert_eq!(what, "a prune of datanode 7's replicas");
    assert_eq!(
        behind,
        &vec![Behind {
            node: 3,
            version: Some(1)
        }]
    );
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("node 3 runs a build of version 1"),
        "{message}"
    );
    c.converged().await?;
    for n in c.nodes.values() {
        assert_eq!(n.cluster_version(), BASE_VERSION);
    }

    // Upgraded, node 3 lets the leader raise the version, and the prune goes through.
    let leader = restart_third(&mut c, current_build, BUILD_VERSION).await?;
    let result = prune(&leader).await?;
    assert!(matches!(result, CommandResult::Pruned { .. }), "{result:?}");
    c.converged().await?;
    for n in c.nodes.values() {
        assert_eq!(n.cluster_version(), 2, "node {}", n.id());
    }

    // A cluster's version never goes back: the old build no longer starts on node 3's data.
    let e = refused_restart_of_third(&mut c, old_third).await?;
    assert!(
        e.contains("applies cluster versions up to 1, but the cluster's version is 2"),
        "{e}"
    );
    c.shutdown().await
}

/// Node 3 runs a build of version 2: it applies prunes, not a removal's pieces.
fn second_version_third(cfg: &mut NodeConfig) {
    formed_by_an_older_build(cfg);
    if cfg.id == 3 {
        cfg.build_version = 2;
    }
}

/// Node 3 runs a build of version 3: it applies a removal's pieces, not the fencing first piece
/// of version 4.
fn third_version_third(cfg: &mut NodeConfig) {
    formed_by_an_older_build(cfg);
    if cfg.id == 3 {
        cfg.build_version = 3;
    }
}

/// Registers datanode `id` with 10,000 shards (157 buckets: three pieces of a removal) and
/// removes it; returns the replicas removed and how many log entries the removal took.
async fn register_and_remove(leader: &MetaNode, id: u64) -> Result<(u64, u64)> {
    let w = leader.register_datanode(id, format!("dn-{id}")).await?;
    let CommandResult::DatanodeRegistered { epoch, .. } = w.result else {
        bail!("unexpected {:?}", w.result);
    };
    for chunk in 0..10 {
        let shards = (chunk * 1_000..(chunk + 1) * 1_000)
            .map(|s| ShardReport {
                id: id * 1_000_000 + s,
                generation: 1,
                size: 1,
            })
            .collect();
        leader.register_shards(id, epoch, shards).await?;
    }
    let before = leader.status().last_log_index.context("a log")?;
    let removed = remove_datanode(leader, id).await?;
    let after = leader.status().last_log_index.context("a log")?;
    Ok((removed, after - before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_goes_in_pieces_once_every_member_runs_a_build_that_applies_them() -> Result<()> {
    let mut c = Cluster::three_tuned(second_version_third).await?;
    // With node 3 on version 2 the removal goes as one entry, without waiting or a refusal.
    let leader = c.leader().await?;
    assert_eq!(register_and_remove(&leader, 7).await?, (10_000, 1));
    c.converged().await?;
    for n in c.nodes.values() {
        assert_eq!(n.cluster_version(), BASE_VERSION, "node {}", n.id());
    }
    // Removing an unknown datanode raises nothing either.
    let unknown = leader.write(Command::RemoveDatanode { id: 9 }).await?;
    assert_eq!(
        unknown.result,
        CommandResult::DatanodeRemoved {
            existed: false,
            replicas_removed: 0
        }
    );

    // Upgraded to a build of version 3, node 3 lets the leader raise the version to 3 (not to
    // 4, which the others' builds allow), and the removal goes in pieces: the raise and three
    // pieces.
    let leader = restart_third(&mut c, third_version_third, 3).await?;
    let unknown = leader.write(Command::RemoveDatanode { id: 9 }).await?;
    assert!(
        matches!(
            unknown.result,
            CommandResult::DatanodeRemoved { existed: false, .. }
        ),
        "{unknown:?}"
    );
    assert_eq!(
        leader.cluster_version(),
        BASE_VERSION,
        "no raise for a typo"
    );
    assert_eq!(register_and_remove(&leader, 8).await?, (10_000, 4));
    // Forwarded by a member whose build predates pieces, a removal goes as one entry.
    leader.register_datanode(10, "dn-10").await?;
    let one = leader
        .write_forwarded(Command::RemoveDatanode { id: 10 }, 2)
        .await?;
    assert_eq!(
        one.result,
        CommandResult::DatanodeRemoved {
            existed: true,
            replicas_removed: 0
        }
    );
    c.converged().await?;
    for n in c.nodes.values() {
        assert_eq!(n.cluster_version(), 3, "node {}", n.id());
        let gone = n.datanode(meta_consensus::Consistency::Local, 8).await?;
        assert!(gone.is_none(), "node {}", n.id());
    }

    // Upgraded to this build, node 3 lets the next removal raise the version to 7 (its first
    // piece marks the datanode as being removed) in one step: the raise and three pieces again.
    let leader = restart_third(&mut c, current_build, BUILD_VERSION).await?;
    assert_eq!(register_and_remove(&leader, 11).await?, (10_000, 4));
    c.converged().await?;
    for n in c.nodes.values() {
        assert_eq!(n.cluster_version(), 7, "node {}", n.id());
    }

    // The build of version 2 no longer starts on node 3's data.
    let e = refused_restart_of_third(&mut c, second_version_third).await?;
    assert!(
        e.contains("applies cluster versions up to 2, but the cluster's version is 7"),
        "{e}"
    );
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_does_not_answer_keeps_the_version_down() -> Result<()> {
    let mut c = Cluster::three_tuned(formed_by_an_older_build).await?;
    let leader = c.leader().await?;
    let down = if leader.id() == 3 { 2 } else { 3 };
    c.stop(down).await?;
    until_heard(&leader, down, None).await?;
    let refused = prune(&leader).await;
    let Err(Error::ClusterVersionTooLow { behind, .. }) = &refused else {
        bail!("expected a refusal, got {refused:?}");
    };
    assert_eq!(
        behind,
        &vec![Behind {
            node: down,
            version: None
        }]
    );
    assert!(refused
        .unwrap_err()
        .to_string()
        .contains("has not answered"));

    // Back, it answers, and the prune goes through.
    c.start(down).await?;
    let result = prune(&leader).await?;
    assert!(matches!(result, CommandResult::Pruned { .. }), "{result:?}");
    assert_eq!(leader.cluster_version(), 2);
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_older_than_the_cluster_is_not_added() -> Result<()> {
    let c = Cluster::three_tuned(formed_by_an_older_build).await?;
    let leader = c.leader().await?;
    prune(&leader).await?;
    assert_eq!(leader.cluster_version(), 2);

    // Node 4 answered (as the HTTP layer's probe notes it) as a build of version 1.
    leader.config().peer_versions.note(4, 1);
    let refused = leader.add_learner(4, Node::new(addr(4))).await;
    assert!(
        matches!(
            refused,
            Err(Error::LearnerTooOld {
                node: 4,
                build: 1,
                cluster: 2
            })
        ),
        "{refused:?}"
    );
    assert!(leader.status().learners.is_empty());

    // Upgraded, it is added.
    leader.config().peer_versions.note(4, 2);
    leader.add_learner(4, Node::new(addr(4))).await?;
    assert_eq!(leader.status().learners, vec![4]);
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_not_heard_from_is_not_added_once_the_version_was_raised() -> Result<()> {
    let c = Cluster::three_tuned(formed_by_an_older_build).await?;
    let leader = c.leader().await?;
    // In a cluster of the base version every build applies every entry: a learner may be added
    // before it runs.
    leader.add_learner(5, Node::new(addr(5))).await?;
    leader.remove_learner(5).await?;
    prune(&leader).await?;
    assert_eq!(leader.cluster_version(), 2);

    // Node 4 does not run: its build is unknown, and might be older than the cluster.
    let refused = leader.add_learner(4, Node::new(addr(4))).await;
    assert!(
        matches!(
            refused,
            Err(Error::LearnerNotHeard {
                node: 4,
                cluster: 2
            })
        ),
        "{refused:?}"
    );
    let said = refused.unwrap_err().to_string();
    assert!(said.contains("is that where it listens?"), "{said}");
    assert!(leader.status().learners.is_empty());
    c.shutdown().await
}

/// A cluster formed by this build raises its version to its members' builds as soon as they
/// all answered, not when a command first needs it: later, with a member down (whose answer
/// then counts no more), a prune still goes through. It used to be refused (503
/// `cluster_version`) until that member returned, on a cluster that never ran an older build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_formed_by_this_build_takes_every_command_with_a_member_down() -> Result<()> {
    let mut c = Cluster::three_tuned(formed_by_this_build).await?;
    let deadline = Instant::now() + WAIT;
    while c
        .nodes
        .values()
        .any(|n| n.cluster_version() != BUILD_VERSION)
    {
        if Instant::now() > deadline {
            let versions: Vec<u32> = c.nodes.values().map(|n| n.cluster_version()).collect();
            bail!("the cluster's version is {versions:?} after {WAIT:?}, not {BUILD_VERSION}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader = c.leader().await?;
    let down = if leader.id() == 3 { 2 } else { 3 };
    c.stop(down).await?;
    until_heard(&leader, down, None).await?;
    let result = prune(&leader).await?;
    assert!(matches!(result, CommandResult::Pruned { .. }), "{result:?}");
    c.shutdown().await
}
