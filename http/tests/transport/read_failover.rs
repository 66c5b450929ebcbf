//! Reads that reach a member while its leader is gone: they are answered by the next leader,
//! not refused, whether the follower answers them with the leader's read index or replays them
//! at the leader, and whether the old leader's port is closed or takes connections and never
//! answers (a paused process). Membership changes and heartbeats, which may be asked again too,
//! do the same.

use std::collections::BTreeMap;
use std::time::Duration;

use meta_http::follower_read::{CatchUp, CATCH_UP};

use crate::common::wait_for;
use crate::helpers::{
    hand_over, http_client, put_kv, slow_election_cluster, start_cluster_tuned, stop_all,
    the_leader, KeptPort, Server, TOKEN,
};

/// How the old leader is gone.
#[derive(Debug, Clone, Copy)]
enum Gone {
    /// Stopped, its port closed: connections are refused.
    Stopped,
    /// Stopped, its port taking connections that nobody answers.
    Paused,
}

/// Stops server `leader` of `servers` as `gone` says; its port stays taken until the returned
/// one is dropped.
async fn stop_leader(servers: &mut BTreeMap<u64, Server>, leader: u64, gone: Gone) -> KeptPort {
    let port = servers.remove(&leader).unwrap().stop_keeping_port().await;
    if let Gone::Paused = gone {
        port.stop_answering();
    }
    port
}

/// A three-node cluster whose requests may wait a minute for the next leader: long enough that
/// a test is about whether they do, not how fast an election is on a loaded machine.
async fn patient_cluster(dir: &tempfile::TempDir) -> BTreeMap<u64, Server> {
    start_cluster_tuned(dir, None, |_, cfg| {
        cfg.request_timeout = Duration::from_secs(60)
    })
    .await
}

/// Sends `request` (to a follower whose leader is gone as `gone` says) and expects it answered
/// 200 once the next leader was elected, not after a forwarding timeout; returns the body.
async fn answered_by_the_next_leader(request: reqwest::RequestBuilder, gone: Gone) -> String {
    let started = std::time::Instant::now();
    let answer = request.bearer_auth(TOKEN).send().await.unwrap();
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    assert_eq!(status, 200, "{gone:?}: {text}");
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{gone:?}: answered after {:?}, not once the next leader was elected",
        started.elapsed()
    );
    text
}

/// Stops the leader of a three-node cluster as `gone` says, then sends a linearizable read of
/// a key written before to a follower that still names the old leader, and expects the value,
/// answered once the others elected a new leader.
async fn a_read_outlives_its_leader(follower_reads: Option<CatchUp>, gone: Gone) {
    let dir = tempfile::tempdir().unwrap();
    // The read waits for the next leader within what is left of its request timeout; a minute
    // keeps this test about whether it does, not how fast an election is on a loaded machine.
    let mut servers = start_cluster_tuned(&dir, follower_reads, |_, cfg| {
        cfg.request_timeout = Duration::from_secs(60)
    })
    .await;
    let http = http_client();
    let leader = the_leader(&servers).node.id();
    let put = put_kv(&servers[&leader], "before").await;
    assert_eq!(put.status().as_u16(), 200);
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    let port = stop_leader(&mut servers, leader, gone).await;
    let read = http
        .get(format!(
            "http://{}/v1/kv/before?consistency=linearizable",
            servers[&follower].addr
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let status = read.status().as_u16();
    let text = read.text().await.unwrap();
    assert_eq!(status, 200, "{follower_reads:?} {gone:?}: {text}");
    assert!(text.contains("\"x\""), "{text}");
    let new = servers[&follower].node.status().leader_id;
    assert!(new.is_some() && new != Some(leader), "{new:?}");
    stop_all(servers).await;
    drop(port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_read_outlives_a_stopped_leader() {
    a_read_outlives_its_leader(Some(CATCH_UP), Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_read_outlives_a_stopped_leader() {
    a_read_outlives_its_leader(None, Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_read_outlives_a_paused_leader() {
    a_read_outlives_its_leader(Some(CATCH_UP), Gone::Paused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_read_outlives_a_paused_leader() {
    a_read_outlives_its_leader(None, Gone::Paused).await;
}

/// A membership change (a target state, so it may be asked again) sent to a follower that still
/// names a leader that is gone rides out the election as a read does: the survivors make
/// themselves the voters. It used to be answered 503 `no_leader` at once (a stopped leader),
/// or 504 after the 30 s forwarding timeout (a paused one).
async fn a_voter_change_outlives_its_leader(gone: Gone) {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = patient_cluster(&dir).await;
    let leader = the_leader(&servers).node.id();
    let survivors: Vec<u64> = servers.keys().copied().filter(|id| *id != leader).collect();
    let follower = survivors[0];
    let port = stop_leader(&mut servers, leader, gone).await;
    let change = http_client()
        .put(format!(
            "http://{}/v1/cluster/voters",
            servers[&follower].addr
        ))
        .json(&serde_json::json!({ "voters": survivors }));
    answered_by_the_next_leader(change, gone).await;
    let voters: Vec<u64> = servers[&follower].node.status().voters;
    assert_eq!(voters, survivors, "{gone:?}");
    stop_all(servers).await;
    drop(port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_change_outlives_a_stopped_leader() {
    a_voter_change_outlives_its_leader(Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_change_outlives_a_paused_leader() {
    a_voter_change_outlives_its_leader(Gone::Paused).await;
}

/// A datanode's heartbeat sent to a follower that still names a leader that is gone rides out
/// the election as a read does (the leader only notes it in memory, so it may be asked again),
/// and the next leader hears it. It used to wait out the 30 s forwarding timeout at a paused
/// leader and answer 504 naming that leader, while the datanode's next heartbeats went through.
async fn a_heartbeat_outlives_its_leader(gone: Gone) {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = patient_cluster(&dir).await;
    let http = http_client();
    let leader = the_leader(&servers).node.id();
    let registered = http
        .put(format!("http://{}/v1/datanodes/7", servers[&leader].addr))
        .bearer_auth(TOKEN)
        .body(r#"{"addr":"10.0.0.7:9000"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status().as_u16(), 200);
    let epoch = registered.json::<serde_json::Value>().await.unwrap()["epoch"].clone();
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    let port = stop_leader(&mut servers, leader, gone).await;
    let beat = http
        .post(format!(
            "http://{}/v1/datanodes/7/heartbeat",
            servers[&follower].addr
        ))
        .json(&serde_json::json!({ "epoch": epoch }));
    answered_by_the_next_leader(beat, gone).await;
    let liveness: serde_json::Value = http
        .get(format!("http://{}/v1/liveness", servers[&follower].addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(liveness["leader_id"], leader, "{liveness}");
    assert_eq!(liveness["datanodes"][0]["id"], 7, "{liveness}");
    assert_eq!(
        liveness["datanodes"][0]["state"], "alive",
        "{gone:?}: the next leader heard it: {liveness}"
    );
    stop_all(servers).await;
    drop(port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_outlives_a_stopped_leader() {
    a_heartbeat_outlives_its_leader(Gone::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_outlives_a_paused_leader() {
    a_heartbeat_outlives_its_leader(Gone::Paused).await;
}

/// The index a watch at `url` (a member's `/v1/watch`) starts from.
async fn start_index(http: &reqwest::Client, url: &str) -> u64 {
    let start: serde_json::Value = http
        .get(url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    start["index"].as_u64().expect("a start index")
}

/// Sends `GET url` with the token; answers its status, its body, and how long it took.
async fn timed_get(http: &reqwest::Client, url: &str) -> (u16, String, Duration) {
    let sent = std::time::Instant::now();
    let answer = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
    let took = sent.elapsed();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap(), took)
}

/// A long poll that reaches a follower whose leader stopped waits for the next leader only
/// within its `wait_ms`, counted from its arrival, and then answers what the member applied:
/// it never outlasts what its client waits for, even when the election takes longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_outlives_its_leader_within_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    // Elections of 3 to 4 s, longer than the wait: a long poll that waited for the next
    // leader past its wait would answer seconds late.
    let (mut servers, leader, follower) = slow_election_cluster(&dir, Some(CATCH_UP)).await;
    let http = http_client();
    let url = format!("http://{}/v1/watch", servers[&follower].addr);
    let from = start_index(&http, &url).await;
    let port = servers.remove(&leader).unwrap().stop_keeping_port().await;
    let wait = Duration::from_secs(1);
    let polled = format!("{url}?after={from}&wait_ms={}", wait.as_millis());
    let (status, text, took) = timed_get(&http, &polled).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        took < wait + Duration::from_millis(1500),
        "a long poll of {wait:?} answered after {took:?}: {text}"
    );
    stop_all(servers).await;
    drop(port);
}

/// A long poll from an index the member no longer keeps is answered 410 `compacted` at once,
/// even at a member that knows no leader (two of three are down): it waited out its whole wait
/// for a read index before, and only then said what it knew from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_index_is_told_at_once_without_a_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = start_cluster_tuned(&dir, None, |_, cfg| cfg.watch_history = 2).await;
    let http = http_client();
    let leader = the_leader(&servers).node.id();
    let follower = *servers.keys().find(|id| **id != leader).unwrap();
    let url = format!("http://{}/v1/watch", servers[&follower].addr);
    let from = start_index(&http, &url).await;
    for i in 0..4 {
        let put = put_kv(&servers[&leader], &format!("k{i}")).await;
        assert_eq!(put.status(), 200);
    }
    let node = servers[&follower].node.clone();
    wait_for(|| node.watch_floor() > from, "the follower's feed moves on").await;
    let others: Vec<u64> = servers
        .keys()
        .copied()
        .filter(|id| *id != follower)
        .collect();
    for id in others {
        servers.remove(&id).unwrap().stop().await;
    }
    let polled = format!("{url}?after={from}&wait_ms=30000");
    let (status, text, took) = timed_get(&http, &polled).await;
    assert_eq!(status, 410, "{text}");
    assert!(text.contains("compacted"), "{text}");
    assert!(took < Duration::from_secs(15), "answered after {took:?}");
    stop_all(servers).await;
}

/// A long poll at the last member of a cluster that lost its quorum answers what the member
/// applied at the end of its wait, as one whose leader does not answer: not 503 `no_leader`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_without_a_quorum_answers_at_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = start_cluster_tuned(&dir, Some(CATCH_UP), |_, _| {}).await;
    let http = http_client();
    let leader = the_leader(&servers).node.id();
    let last = *servers.keys().find(|id| **id != leader).unwrap();
    let url = format!("http://{}/v1/watch", servers[&last].addr);
    let from = start_index(&http, &url).await;
    let gone: Vec<u64> = servers.keys().copied().filter(|id| *id != last).collect();
    let mut ports = Vec::new();
    for id in gone {
        ports.push(servers.remove(&id).unwrap().stop_keeping_port().await);
    }
    let poll = http
        .get(format!("{url}?after={from}&wait_ms=1000"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let status = poll.status().as_u16();
    let page: serde_json::Value = poll.json().await.unwrap();
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["index"].as_u64(), Some(from), "{page}");
    stop_all(servers).await;
    drop(ports);
}

/// Sends the requests `requests` builds (one loop per request, each repeated until the end)
/// to server `leader` of `servers` while it hands its leadership over, from 20 answers before to
/// 40 after; answers those that were not 200.
async fn refused_around_a_hand_over(
    servers: &BTreeMap<u64, Server>,
    leader: u64,
    requests: Vec<reqwest::RequestBuilder>,
) -> Vec<String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for request in requests {
        let (stop, done) = (stop.clone(), done.clone());
        senders.spawn(async move {
            let mut refused = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = request.try_clone().unwrap().send().await.unwrap();
                let status = r.status().as_u16();
                if status != 200 {
                    refused.push(format!("{status} {}", r.text().await.unwrap()));
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            refused
        });
    }
    wait_for(
        || done.load(Ordering::Relaxed) >= 20,
        "the requests to start",
    )
    .await;
    hand_over(&servers[&leader]).await;
    let after = done.load(Ordering::Relaxed) + 40;
    wait_for(
        || done.load(Ordering::Relaxed) >= after,
        "requests after the hand-over",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut refused = Vec::new();
    while let Some(joined) = senders.join_next().await {
        refused.extend(joined.unwrap());
    }
    refused
}

/// Reads sent to a leader while it hands its leadership over (as before a planned stop) are
/// answered: its core sends them to the new leader before that one has won, which refuses
/// them, and they go round again once it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_sent_to_a_leader_that_hands_over_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster_tuned(&dir, Some(CATCH_UP), |_, _| {}).await;
    let leader = the_leader(&servers);
    let http = http_client();
    let put = put_kv(leader, "handed").await;
    assert_eq!(put.status().as_u16(), 200);
    let reads = ["linearizable", "lease", "linearizable", "lease"]
        .into_iter()
        .map(|consistency| {
            http.get(format!(
                "http://{}/v1/kv/handed?consistency={consistency}",
                leader.addr
            ))
            .bearer_auth(TOKEN)
        })
        .collect();
    let refused = refused_around_a_hand_over(&servers, leader.node.id(), reads).await;
    assert!(refused.is_empty(), "{} refused: {refused:?}", refused.len());
    stop_all(servers).await;
}

/// Voter changes sent to a leader while it hands its leadership over are answered, as reads
/// are: one replayed at the new leader before it has won is refused there with 503
/// `no_leader` ("not the leader"), and goes round again once the new leader was elected. (That
/// window is a few milliseconds: this test does not always hit it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voter_changes_sent_to_a_leader_that_hands_over_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let servers = start_cluster_tuned(&dir, Some(CATCH_UP), |_, _| {}).await;
    let leader = the_leader(&servers);
    let voters: Vec<u64> = servers.keys().copied().collect();
    let http = http_client();
    let changes = (0..4)
        .map(|_| {
            http.put(format!("http://{}/v1/cluster/voters", leader.addr))
                .bearer_auth(TOKEN)
                .json(&serde_json::json!({ "voters": voters }))
        })
        .collect();
    let refused = refused_around_a_hand_over(&servers, leader.node.id(), changes).await;
    assert!(refused.is_empty(), "{} refused: {refused:?}", refused.len());
    stop_all(servers).await;
}

/// Stops one follower of `servers`, then pauses the leader: the last member cannot elect
/// another. Answers the leader's id, the last member's, and the two ports kept.
async fn pause_the_leader_with_one_down(
    servers: &mut BTreeMap<u64, Server>,
) -> (u64, u64, KeptPort, KeptPort) {
    let leader = the_leader(servers).node.id();
    let mut others = servers.keys().copied().filter(|id| *id != leader);
    let (down, last) = (others.next().unwrap(), others.next().unwrap());
    let down = servers.remove(&down).unwrap().stop_keeping_port().await;
    let paused = stop_leader(servers, leader, Gone::Paused).await;
    (leader, last, down, paused)
}

/// A member whose leader fell silent (paused) and that cannot elect another (the third voter
/// is down) answers 503 `no_leader` at once, naming the silence: a write, a linearizable read
/// and a membership change. Sent to the silent leader, they waited for its answer: a write 30 s
/// and then 504 `outcome_unknown`, a read 5 s for the read index and then 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_leader_fell_silent_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = patient_cluster(&dir).await;
    let http = http_client();
    let (leader, last, down, paused) = pause_the_leader_with_one_down(&mut servers).await;
    let node = servers[&last].node.clone();
    wait_for(
        || node.silent_leader().is_some_and(|(l, _)| l == leader),
        "the leader falls silent",
    )
    .await;

    let at = |path: &str| format!("http://{}{path}", servers[&last].addr);
    for request in [
        http.put(at("/v1/kv/k")).body("v"),
        http.get(at("/v1/kv/k?consistency=linearizable")),
        http.put(at("/v1/cluster/voters"))
            .body(serde_json::json!({"voters": [last]}).to_string()),
    ] {
        let started = std::time::Instant::now();
        let answer = request.bearer_auth(TOKEN).send().await.unwrap();
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(status, 503, "{body}");
        // Not after waiting for a next leader, which lasts the request timeout (a minute).
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "answered after {:?}: {body}",
            started.elapsed()
        );
        assert_eq!(body["error"]["code"], "no_leader", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("node {leader}, the last leader this node knew")),
            "{message}"
        );
    }
    stop_all(servers).await;
    drop((down, paused));
}

/// A watch without `after` (a start) at a follower whose leader stopped answering (paused)
/// answers within its `wait_ms` too: 504 `timeout`, since it has no events to answer with. It
/// used to wait for the leader's read index until the exchange timed out (5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_start_answers_within_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    // Elections of 3 to 4 s: the follower still names the paused leader, and does not count it
    // silent, when the start arrives.
    let (mut servers, leader, follower) = slow_election_cluster(&dir, Some(CATCH_UP)).await;
    let http = http_client();
    let url = format!("http://{}/v1/watch?wait_ms=500", servers[&follower].addr);
    let port = stop_leader(&mut servers, leader, Gone::Paused).await;
    let start = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
    let status = start.status().as_u16();
    let text = start.text().await.unwrap();
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("within wait_ms (500 ms)"), "{text}");
    stop_all(servers).await;
    drop(port);
}

/// Requests already waiting on a leader when it falls silent (paused, with the third voter down,
/// so that no other leader can be elected) are answered once it has been silent for two
/// election timeouts, naming the silence: a write 504 `outcome_unknown` (the leader may have
/// made it), a linearizable read and a membership change 503 `no_leader`. They waited for
/// their forwarding timeouts before: the read 5 s and then 504 `timeout`, the others 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_on_a_leader_that_falls_silent_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    // Silent after 4 s: the requests below are sent well before that, and the read's wait for
    // the read index (5 s) has not ended when the silence is noticed.
    let mut servers = start_cluster_tuned(&dir, None, |_, cfg| {
        cfg.election_min_ms = 1500;
        cfg.election_max_ms = 2000;
        cfg.request_timeout = Duration::from_secs(60);
    })
    .await;
    let http = http_client();
    let (leader, last, down, paused) = pause_the_leader_with_one_down(&mut servers).await;
    assert!(servers[&last].node.silent_leader().is_none());

    let at = |path: &str| format!("http://{}{path}", servers[&last].addr);
    let send = |request: reqwest::RequestBuilder| async move {
        let started = std::time::Instant::now();
        let answer = request.bearer_auth(TOKEN).send().await.unwrap();
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap();
        (status, body, started.elapsed())
    };
    let (write, read, change) = tokio::join!(
        send(http.put(at("/v1/kv/k")).body("v")),
        send(http.get(at("/v1/kv/k?consistency=linearizable"))),
        send(
            http.put(at("/v1/cluster/voters"))
                .body(serde_json::json!({"voters": [last]}).to_string())
        ),
    );
    for ((status, body, took), (want_status, want_code, sent_to)) in [
        (
            write,
            (504, "outcome_unknown", "the leader the write was sent to"),
        ),
        (
            read,
            (503, "no_leader", "the leader this request was sent to"),
        ),
        (
            change,
            (503, "no_leader", "the leader this request was sent to"),
        ),
    ] {
        assert_eq!(status, want_status, "{body}");
        assert_eq!(body["error"]["code"], want_code, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("node {leader}, {sent_to}"))
                && message.contains("has not been heard from"),
            "{message}"
        );
        assert!(took < Duration::from_secs(25), "answered after {took:?}");
    }
    stop_all(servers).await;
    drop((down, paused));
}
