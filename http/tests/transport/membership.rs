//! Membership over HTTP: removed followers and learners are told, one process cannot be two
//! members, a member moves to a new address, and a member wiped and initialized anew is told
//! that its peers refuse it.

use std::time::Duration;

use meta_consensus::{Node, Role};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::common::{wait_for, DEADLINE};
use crate::helpers::{
    http_client, join_as_learner, served, served_with, start, start_alone, start_at, start_cluster,
    start_cluster_without_notices, stop_all, the_leader, Client, KeptPort, Server, TOKEN,
};

/// A follower removed from the voters learns it from the members' answers to its vote
/// requests, carried over HTTP (the leader sends no notices here, so they are not what tells
/// it): its `/v1/cluster` says `removed`, and a write sent to it is refused with 503 naming the
/// members, not forwarded to a leader it no longer follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_follower_is_told_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster_without_notices(&dir).await;
    let client = Client::new();
    let leader = the_leader(&servers);
    let removed_id = *servers.keys().find(|id| **id != leader.node.id()).unwrap();
    let others = servers.keys().copied().filter(|id| *id != removed_id);
    leader.node.change_voters(others.collect()).await.unwrap();

    let removed = &servers[&removed_id];
    wait_for(
        || removed.node.status().role == Role::Removed,
        "the removed follower is told",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, removed, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["role"], "removed", "{v}");
    assert_eq!(v["leader_id"], Value::Null, "{v}");
    let mut members: Vec<u64> = servers.keys().copied().collect();
    members.retain(|id| *id != removed_id);
    assert_eq!(v["removed_from"]["members"], json!(members), "{v}");
    assert!(
        v["removed_from"]["membership_index"].as_u64() > Some(0),
        "{v}"
    );
    let (_, v) = client
        .send(reqwest::Method::GET, leader, "/v1/cluster", None)
        .await;
    assert!(v.get("removed_from").is_none(), "{v}");
    let (status, v) = client
        .send(
            reqwest::Method::PUT,
            removed,
            "/v1/datanodes/7",
            Some(json!({"addr": "10.0.0.7:9000"})),
        )
        .await;
    assert_eq!(status, 503, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("removed from the cluster"), "{message}");
    // Nothing brings it up to date again: it answers no read, not even a local one, and no
    // watch.
    for path in [
        "/v1/shards/1?consistency=local",
        "/v1/kv?consistency=local",
        "/v1/watch?consistency=local&wait_ms=0",
        "/v1/watch?after=1&consistency=local&wait_ms=1000",
        "/v1/datanodes/7?consistency=lease",
    ] {
        let (status, v) = client.send(reqwest::Method::GET, removed, path, None).await;
        assert_eq!(status, 503, "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("removed from the cluster"),
            "{path}: {message}"
        );
    }
    for server in servers.values() {
        server.node.shutdown().await.unwrap();
    }
}

/// A removed learner never asks for votes, and the leader stops replicating to it at once: the
/// leader tells it, and it reports `removed` instead of a learner that still knows a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_learner_is_told_by_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let learner = start(4, &dir).await;
    let client = Client::new();
    let leader = the_leader(&servers);
    let (status, v) = client
        .send(
            reqwest::Method::POST,
            leader,
            "/v1/cluster/learners",
            Some(json!({"id": 4, "addr": learner.addr})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    wait_for(
        || learner.node.status().role == Role::Learner,
        "the learner joins",
    )
    .await;
    // The leader's view shows how far the learner is, and when it last answered.
    wait_for(
        || {
            leader
                .node
                .status()
                .replication
                .iter()
                .any(|r| r.node == 4 && r.matched.is_some() && r.heard_ms.is_some())
        },
        "the leader hears from the learner",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, leader, "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["replication"]["4"]["matched"].is_u64(), "{v}");
    assert!(v["replication"]["4"]["heard_ms"].is_u64(), "{v}");
    assert!(v["replication"]["4"]["lag"].is_u64(), "{v}");
    assert!(
        v["replication"].get(leader.node.id().to_string()).is_none(),
        "{v}"
    );

    let (status, v) = client
        .send(
            reqwest::Method::DELETE,
            leader,
            "/v1/cluster/learners/4",
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    wait_for(
        || learner.node.status().role == Role::Removed,
        "the removed learner is told",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, &learner, "/readyz", None)
        .await;
    assert_eq!(status, 503, "{v}");
    for server in servers.values().chain([&learner]) {
        server.node.shutdown().await.unwrap();
    }
}

/// Starts a three-node cluster and learner 4, stops the learner, and removes it (on the node,
/// so no request handler tells it). Returns the cluster and the learner's address, kept.
async fn remove_a_learner_while_it_is_down(
    dir: &tempfile::TempDir,
) -> (std::collections::BTreeMap<u64, Server>, KeptPort) {
    let servers = start_cluster(dir).await;
    let learner = start(4, dir).await;
    let leader = the_leader(&servers);
    join_as_learner(leader, &learner).await;
    let port = learner.stop_keeping_port().await;
    leader.node.remove_learner(4).await.unwrap();
    (servers, port)
}

/// A learner that is down when it is removed is told once it is back at its address: the
/// leader keeps trying, instead of leaving it to report itself a learner for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_down_when_removed_is_told_once_back() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, port) = remove_a_learner_while_it_is_down(&dir).await;
    let back = start_at(4, &dir, port).await;
    wait_for(
        || back.node.status().role == Role::Removed,
        "the learner is told once back",
    )
    .await;
    for server in servers.values().chain([&back]) {
        server.node.shutdown().await.unwrap();
    }
}

/// A learner that is down when it is removed is told once it is back even if every member
/// restarted meanwhile: each keeps the nodes still to be told in its data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_down_when_removed_is_told_after_every_member_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, learner_port) = remove_a_learner_while_it_is_down(&dir).await;
    // Each member notes the removal once it sees it committed; the restarts wait for that.
    let deadline = std::time::Instant::now() + DEADLINE;
    for server in servers.values() {
        while !server
            .node
            .untold_removals()
            .await
            .unwrap()
            .contains_key(&4)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "node {} never kept learner 4 as still to be told",
                server.node.id()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    let mut ports = Vec::new();
    for (id, server) in servers {
        ports.push((id, server.stop_keeping_port().await));
    }
    let mut servers = Vec::new();
    for (id, port) in ports {
        servers.push(start_at(id, &dir, port).await);
    }
    let back = start_at(4, &dir, learner_port).await;
    wait_for(
        || back.node.status().role == Role::Removed,
        "the learner is told once back",
    )
    .await;
    for server in servers.iter().chain([&back]) {
        server.node.shutdown().await.unwrap();
    }
}

/// A process that holds no cluster's data, started at a removed node's address with its id
/// (its data dir was wiped), refuses the notice meant for the member that was there: it
/// neither takes this cluster's id from it nor calls itself removed, and may still join
/// another cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_at_a_removed_address_refuses_the_notice() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, port) = remove_a_learner_while_it_is_down(&dir).await;
    let wiped = tempfile::tempdir().unwrap();
    let fresh = start_at(4, &wiped, port).await;
    let client = Client::new();
    let deadline = std::time::Instant::now() + DEADLINE;
    // Answered either way: refused (409), or taken (204).
    let notices = |status| served_with(&client, &fresh, "POST", "/raft/removed", status);
    while notices(409).await + notices(204).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the leader never sent its notice"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(fresh.node.cluster_id(), None);
    assert_ne!(fresh.node.status().role, Role::Removed);
    for server in servers.values().chain([&fresh]) {
        server.node.shutdown().await.unwrap();
    }
}

/// One process cannot answer for two members: a learner added (on the node, past the HTTP
/// handler's probe) at the address of a process with another id is never served by it, since
/// every message names its addressee and that process refuses messages for another id. The
/// leader never hears from the learner and refuses to make it a voter; the process stays out
/// of the cluster. Through the API the add is refused at once (409 `wrong_node`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_cannot_be_two_members() {
    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;
    let other = start(2, &dir).await;
    let honest = start(3, &dir).await;
    let client = Client::new();

    let (status, v) = client
        .send(
            reqwest::Method::POST,
            &leader,
            "/v1/cluster/learners",
            Some(json!({"id": 5, "addr": other.addr})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "wrong_node", "{v}");
    assert!(leader.node.status().learners.is_empty());

    // Past the probe (as if node 2 had been down when it was added), then a real learner
    // after it: once that one caught up, node 5 would have too, had anything answered for it.
    leader
        .node
        .add_learner(5, Node::new(other.addr.clone()))
        .await
        .unwrap();
    leader
        .node
        .add_learner(3, Node::new(honest.addr.clone()))
        .await
        .unwrap();
    wait_for(
        || {
            let s = leader.node.status();
            s.replication
                .iter()
                .any(|r| r.node == 3 && r.matched.is_some() && r.lag == 0)
        },
        "learner 3 catches up",
    )
    .await;
    let s = leader.node.status();
    let five = s.replication.iter().find(|r| r.node == 5).expect("node 5");
    // Nothing answered for it: no entry matched (its silence counts from when the leader took
    // office), and it is not promoted below.
    assert_eq!(five.matched, None, "{s:?}");
    assert_eq!(other.node.status().last_log_index, None);
    let e = leader.node.change_voters([1, 5].into()).await.unwrap_err();
    assert!(matches!(e, meta_consensus::Error::Conflict(_)), "{e}");

    // A member's address under a second id is refused by the leader itself, also when the
    // process there cannot be asked.
    let e = leader
        .node
        .add_learner(6, Node::new(honest.addr.clone()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is the address of node 3"), "{e}");
    for server in [&leader, &other, &honest] {
        server.node.shutdown().await.unwrap();
    }
}

/// A member restarted at another address is moved there with `PUT /v1/cluster/members/{id}`,
/// once it answers there as itself: the leader then replicates to it at the new address. An
/// address where nothing answers, or where another node answers, is refused; another name for
/// the address the member answers at is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_moves_to_a_new_address() {
    let dir = tempfile::tempdir().unwrap();
    let leader = start_alone(&dir).await;
    let learner = start(2, &dir).await;
    join_as_learner(&leader, &learner).await;
    let client = Client::new();

    // While node 2 still answers at its old address, no other process is taken for it, even
    // one that holds this cluster's id: two processes answering for one member could vote
    // twice in a term.
    let copy_dir = tempfile::tempdir().unwrap();
    let copy = start(2, &copy_dir).await;
    copy.node
        .accept_cluster(leader.node.cluster_id().unwrap())
        .await
        .unwrap();
    let (status, v) = client.move_member(&leader, 2, &copy.addr).await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("still answers at its old address"),
        "{v}"
    );
    copy.node.shutdown().await.unwrap();
    drop(copy);

    // Node 2 restarts from its data dir on another port.
    learner.node.shutdown().await.unwrap();
    drop(learner);
    let moved = start(2, &dir).await;
    // Node 2 no longer answers at its old address; still, a server that is no metaserver node
    // (it answers 404 to everything) is not taken for it.
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap().to_string();
    let plain_task = tokio::spawn(async move {
        axum::serve(plain, axum::Router::new()).await.unwrap();
    });
    let (status, v) = client.move_member(&leader, 2, &plain_addr).await;
    assert_eq!(status, 409, "{v}");
    plain_task.abort();
    // A bound socket that does not listen: connections to its port are refused.
    let (_refused, refused_addr) = crate::common::refusing();
    let (status, v) = client.move_member(&leader, 2, &refused_addr).await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not answer"),
        "{v}"
    );
    let (status, v) = client.move_member(&leader, 2, &leader.addr).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "wrong_node", "{v}");
    // A new node started with id 2 (an empty data dir) is not the member: two processes
    // answering for one member could vote twice in a term.
    let other_dir = tempfile::tempdir().unwrap();
    let impostor = start(2, &other_dir).await;
    let (status, v) = client.move_member(&leader, 2, &impostor.addr).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "wrong_node", "{v}");
    assert_eq!(impostor.node.cluster_id(), None, "it adopted the cluster");
    impostor.node.shutdown().await.unwrap();

    let (status, v) = client.move_member(&leader, 2, &moved.addr).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(leader.node.status().nodes[&2], moved.addr);
    // Another name for its host, on the same port: the old address still answers, as the same
    // process, so the move is taken.
    let port = moved.addr.rsplit_once(':').unwrap().1;
    let by_name = format!("localhost:{port}");
    let (status, v) = client.move_member(&leader, 2, &by_name).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(leader.node.status().nodes[&2], by_name);
    let (status, v) = client
        .send(
            reqwest::Method::PUT,
            &leader,
            "/v1/kv/after-the-move",
            Some(json!("x")),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let index = leader.node.status().last_log_index;
    wait_for(
        || moved.node.status().applied >= index,
        "the moved learner applies the write",
    )
    .await;
    for server in [&leader, &moved] {
        server.node.shutdown().await.unwrap();
    }
}

/// `PUT /v1/cluster/leader` moves the leadership to the voter it names, also when sent to a
/// follower (forwarded to the leader), and answers once that voter leads; an id that is no
/// voter is refused with 400 and the leader leads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_moves_to_the_voter_named_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let client = Client::new();
    let old = the_leader(&servers).node.id();
    let mut followers = servers.keys().copied().filter(|id| *id != old);
    let (via, to) = (followers.next().unwrap(), followers.next().unwrap());
    let set_leader = |server: u64, id: Value| {
        client.send(
            reqwest::Method::PUT,
            &servers[&server],
            "/v1/cluster/leader",
            Some(json!({ "id": id })),
        )
    };

    let (status, v) = set_leader(via, json!(9)).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("node 9"),
        "{v}"
    );
    let (status, v) = set_leader(via, json!(0)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(the_leader(&servers).node.id(), old);

    let (status, v) = set_leader(via, json!(to)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["leader"], json!(to), "{v}");
    let term = v["term"].as_u64().unwrap();
    // A leader that just took office reports `leader_without_quorum` until its first round of
    // heartbeats is acknowledged, a moment later.
    let new = &servers[&to].node;
    wait_for(
        || new.status().role == Role::Leader,
        "the new leader's first quorum",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::GET, &servers[&to], "/v1/cluster", None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["leader_id"], json!(to), "{v}");
    assert_eq!(v["term"], json!(term), "{v}");
    // Asked again, it is where it was asked to be: nothing changes.
    let (status, v) = set_leader(old, json!(to)).await;
    assert_eq!(
        (status, v["leader"].clone(), v["term"].clone()),
        (200, json!(to), json!(term)),
        "{v}"
    );
    stop_all(servers).await;
}

/// A leadership move sent to a follower is answered by the leader it was forwarded to, once the
/// voter it named took office, and not asked again of that voter as soon as it leads: the new
/// leader answered in the old one's stead, and one of a build without the route answered 404 to
/// a move that was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_move_via_a_follower_is_answered_by_the_leader_that_made_it() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster(&dir).await;
    let client = Client::new();
    let moves_served = |id: u64| served(&client, &servers[&id], "PUT", "/v1/cluster/leader");
    for round in 0..4 {
        // A leader reports itself one from its first quorum acknowledgement, which may come
        // just after the previous round's move was answered.
        wait_for(
            || {
                servers
                    .values()
                    .any(|s| s.node.status().role == Role::Leader)
            },
            "a leader that a quorum acknowledged",
        )
        .await;
        let old = the_leader(&servers).node.id();
        let mut followers = servers.keys().copied().filter(|id| *id != old);
        let (via, to) = (followers.next().unwrap(), followers.next().unwrap());
        let before = moves_served(to).await;
        let (status, v) = client
            .send(
                reqwest::Method::PUT,
                &servers[&via],
                "/v1/cluster/leader",
                Some(json!({ "id": to })),
            )
            .await;
        assert_eq!((status, v["leader"].clone()), (200, json!(to)), "{v}");
        assert_eq!(
            moves_served(to).await,
            before,
            "round {round}: the move was asked again of node {to}, the new leader"
        );
    }
    stop_all(servers).await;
}

/// A follower whose data dir was wiped and that was then initialized anew with the same
/// members (started with `--init` by mistake) forms another cluster, whose other voters refuse
/// every message it sends. It tells its clients so at once (503 `no_leader`, naming them, so
/// that they try another member) instead of after waiting out the request timeout for a leader
/// it cannot have, and both sides' `/v1/cluster` name who refuses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_initialized_anew_is_told_its_peers_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = start_cluster(&dir).await;
    let leader_id = the_leader(&servers).node.id();
    let wiped_id = *servers.keys().find(|id| **id != leader_id).unwrap();
    let port = servers.remove(&wiped_id).unwrap().stop_keeping_port().await;
    std::fs::remove_dir_all(dir.path().join(format!("node{wiped_id}"))).unwrap();
    let wiped = start_at(wiped_id, &dir, port).await;
    let members = servers
        .values()
        .chain([&wiped])
        .map(|s| (s.node.id(), Node::new(s.addr.clone())))
        .collect();
    wiped.node.initialize(members).await.unwrap();
    let others: Vec<u64> = servers.keys().copied().collect();
    wait_for(
        || wiped.node.status().refused_by == others,
        "the other voters refuse the wiped node's vote requests",
    )
    .await;

    let client = Client::new();
    let (status, v) = client
        .send(reqwest::Method::PUT, &wiped, "/v1/kv/k", Some(json!("x")))
        .await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "no_leader", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{others:?}")) && message.contains("another cluster"),
        "{message}"
    );
    let read = http_client()
        .get(format!("http://{}/v1/shards/1", wiped.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    // Asking this node again does not help: no `Retry-After`.
    assert!(read.headers().get("retry-after").is_none(), "{read:?}");
    let v: Value = read.json().await.unwrap();
    assert_eq!(v["error"]["message"].as_str(), Some(message), "reads too");
    // Local reads and watches too: this node's state is another cluster's.
    for path in ["/v1/kv/k?consistency=local", "/v1/watch?consistency=local"] {
        let (status, v) = client.send(reqwest::Method::GET, &wiped, path, None).await;
        assert_eq!(status, 503, "{path}: {v}");
        assert_eq!(v["error"]["message"].as_str(), Some(message), "{path}");
    }
    let (_, v) = client
        .send(reqwest::Method::GET, &wiped, "/v1/cluster", None)
        .await;
    assert_eq!(v["refused_by"], json!(others), "{v}");

    // The cluster goes on, and its leader names the member that refuses it.
    let leader = &servers[&leader_id];
    wait_for(
        || leader.node.status().refused_by == [wiped_id],
        "the wiped node refuses the leader's messages",
    )
    .await;
    let (status, v) = client
        .send(reqwest::Method::PUT, leader, "/v1/kv/k", Some(json!("x")))
        .await;
    assert_eq!(status, 200, "{v}");
    let (_, v) = client
        .send(reqwest::Method::GET, leader, "/v1/cluster", None)
        .await;
    assert_eq!(v["refused_by"], json!([wiped_id]), "{v}");
    let (_, metrics) = client
        .send(reqwest::Method::GET, leader, "/metrics", None)
        .await;
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains("\nmetaserver_members_refusing 1\n"),
        "{metrics}"
    );
    wiped.stop().await;
    stop_all(servers).await;
}

/// Nodes 1 to 3 as voters, and 4 and 5 as learners.
async fn voters_and_two_learners(
    dir: &tempfile::TempDir,
) -> std::collections::BTreeMap<u64, Server> {
    let mut servers = start_cluster(dir).await;
    for id in [4, 5] {
        let learner = start(id, dir).await;
        join_as_learner(the_leader(&servers), &learner).await;
        servers.insert(id, learner);
    }
    servers
}

/// Voters one at a time, named in the path: two learners promoted by two requests at once (one
/// through a follower) both become voters, since the leader computes each new set under its
/// membership lock; promoting a voter again changes nothing; a voter removed through a
/// follower leaves, and asking again answers 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voters_are_added_and_removed_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let servers = voters_and_two_learners(&dir).await;
    let client = Client::new();
    let leader = the_leader(&servers);
    let follower = servers
        .values()
        .find(|s| s.node.status().role == Role::Follower)
        .unwrap();
    let put = reqwest::Method::PUT;
    let (four, five) = tokio::join!(
        client.send(put.clone(), leader, "/v1/cluster/voters/4", None),
        client.send(put.clone(), follower, "/v1/cluster/voters/5", None),
    );
    assert_eq!(four.0, 200, "{four:?}");
    assert_eq!(five.0, 200, "{five:?}");
    let voters = |v: &Value| v["voters"].clone();
    let (_, v) = client
        .send(reqwest::Method::GET, leader, "/v1/cluster", None)
        .await;
    assert_eq!(voters(&v), json!([1, 2, 3, 4, 5]), "{v}");
    assert_eq!(v["learners"], json!([]), "{v}");
    let (status, v) = client
        .send(put.clone(), follower, "/v1/cluster/voters/4", None)
        .await;
    assert_eq!((status, voters(&v)), (200, json!([1, 2, 3, 4, 5])), "{v}");

    let delete = reqwest::Method::DELETE;
    let (status, v) = client
        .send(delete.clone(), follower, "/v1/cluster/voters/5", None)
        .await;
    assert_eq!((status, voters(&v)), (200, json!([1, 2, 3, 4])), "{v}");
    let (status, v) = client
        .send(delete.clone(), leader, "/v1/cluster/voters/5", None)
        .await;
    assert_eq!(status, 404, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("node 5 is not a voter"),
        "{v}"
    );
    stop_all(servers).await;
}

/// Membership changes sent through a learner while the leadership moves are all made. A learner
/// takes the new leader's first message a moment before its metrics stop naming the old one;
/// it took the old leader for silent since the learner started then (it remembered only the
/// last leader's messages), and answered a change it had replayed there 503 instead of asking
/// the new leader (about one round in 80 failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_through_a_learner_ride_out_leadership_moves() {
    let dir = tempfile::tempdir().unwrap();
    let servers = voters_and_two_learners(&dir).await;
    let client = Client::new();
    let addr5 = servers[&5].addr.clone();
    for round in 0..80u64 {
        let leader = the_leader(&servers);
        let to = [1, 2, 3].into_iter().find(|id| *id != leader.node.id());
        let (method, path) = if round % 2 == 0 {
            let learner = json!({"id": 5, "addr": addr5});
            let (status, v) = client
                .send(
                    reqwest::Method::POST,
                    leader,
                    "/v1/cluster/learners",
                    Some(learner),
                )
                .await;
            assert_eq!(status, 200, "{v}");
            (reqwest::Method::PUT, "/v1/cluster/voters/5")
        } else {
            (reqwest::Method::DELETE, "/v1/cluster/voters/5")
        };
        // The change leaves a little later each round, so that it meets each step of the move.
        let after = Duration::from_millis(round % 10 * 7);
        let ((moved, v), (changed, w)) = tokio::join!(
            client.send(
                reqwest::Method::PUT,
                leader,
                "/v1/cluster/leader",
                Some(json!({"id": to}))
            ),
            async {
                tokio::time::sleep(after).await;
                client.send(method.clone(), &servers[&4], path, None).await
            }
        );
        assert_eq!(moved, 200, "round {round}: {v}");
        assert_eq!(changed, 200, "round {round}: {w}");
        wait_for(
            || {
                let leading = servers
                    .values()
                    .filter(|s| s.node.status().role == Role::Leader);
                leading.count() == 1
            },
            "one leader",
        )
        .await;
    }
    stop_all(servers).await;
}
