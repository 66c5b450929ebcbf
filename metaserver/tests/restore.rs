//! `metaserver snapshot restore`: a backup from `snapshot save`, replayed into a node on a fresh
//! data dir, gives it the datanodes, replicas and keys of the node it came from; a restore into
//! a node that holds anything, or from a damaged file, changes nothing; a save or restore
//! stopped by a signal leaves no temp file.

mod common;

use std::path::Path;

use common::{client, poll, run, send, spawn, Proc};
use reqwest::Method;
use serde_json::{json, Value};

/// Keys written before the backup, as (path segment, key, value).
const KEYS: [(&str, &str, &str); 3] = [
    ("config/replication", "config/replication", "3"),
    ("a%20b/%C3%A9", "a b/é", "spaces and accents"),
    ("z", "z", "last"),
];

/// Starts a node on a fresh data dir under `dir` and waits until it is ready.
async fn start(dir: &Path) -> (Proc, String) {
    std::fs::create_dir_all(dir).unwrap();
    let mut server = spawn(
        dir,
        dir,
        &[],
        &[("METASERVER_LISTEN", "127.0.0.1:0")],
        false,
    );
    let addr = server.address();
    poll(&client(), &format!("http://{addr}/readyz"), None, |_| true).await;
    (server, addr)
}

/// Sends `body` to `path` with `method` and returns the JSON answer; fails unless 200.
async fn ok(method: Method, addr: &str, path: &str, body: Option<String>) -> Value {
    let (status, v) = send(
        &client(),
        method,
        &format!("http://{addr}{path}"),
        None,
        body,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// What a node holds, without what a restore renews (epochs, registration indexes, revisions):
/// each datanode's address and replicas (id, generation, size) and each key's value.
async fn content(addr: &str) -> Value {
    let mut datanodes = Vec::new();
    for d in ok(Method::GET, addr, "/v1/datanodes", None).await["datanodes"]
        .as_array()
        .unwrap()
    {
        let id = d["id"].as_u64().unwrap();
        let mut replicas = Vec::new();
        let mut after = String::new();
        loop {
            let page = ok(
                Method::GET,
                addr,
                &format!("/v1/datanodes/{id}/shards?limit=10000{after}"),
                None,
            )
            .await;
            for s in page["shards"].as_array().unwrap() {
                replicas.push(json!([s["id"], s["generation"], s["size"]]));
            }
            match page["next"].as_str() {
                Some(next) => {
                    let next = format!("&after={next}");
                    assert_ne!(next, after, "the cursor does not advance");
                    after = next;
                }
                None => break,
            }
        }
        datanodes.push(
            json!({"id": id, "addr": d["addr"], "shards": d["shards"], "replicas": replicas}),
        );
    }
    let keys = ok(Method::GET, addr, "/v1/kv", None).await;
    let mut values = serde_json::Map::new();
    for (segment, key, _) in KEYS {
        let listed = keys["keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["key"] == key);
        if listed {
            let value = ok(Method::GET, addr, &format!("/v1/kv/{segment}"), None).await;
            values.insert(key.to_string(), value);
        }
    }
    json!({"datanodes": datanodes, "keys": keys["keys"].as_array().unwrap().len(), "values": values})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_into_an_empty_node_and_never_into_one_that_holds_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, from) = start(&dir.path().join("source")).await;
    // Datanode 7 with 25,000 replicas (three batches, three pages), 8 with three, 9 with none.
    let mut old_epochs = Vec::new();
    for (id, count) in [(7u64, 25_000u64), (8, 3), (9, 0)] {
        let v = ok(
            Method::PUT,
            &from,
            &format!("/v1/datanodes/{id}"),
            Some(json!({"addr": format!("10.0.{}.{}:9000", id / 256 % 256, id % 256)}).to_string()),
        )
        .await;
        let epoch = v["epoch"].as_u64().unwrap();
        old_epochs.push((id, epoch));
        let shards: Vec<Value> = (0..count)
            .map(|i| json!({"id": id * 100_000 + i, "generation": 1 + i % 3, "size": i}))
            .collect();
        for batch in shards.chunks(10_000) {
            let body = json!({"epoch": epoch, "shards": batch}).to_string();
            ok(
                Method::POST,
                &from,
                &format!("/v1/datanodes/{id}/shards"),
                Some(body),
            )
            .await;
        }
    }
    for (segment, _, value) in KEYS {
        ok(
            Method::PUT,
            &from,
            &format!("/v1/kv/{segment}"),
            Some(value.into()),
        )
        .await;
    }
    // Datanode 11 registered far above the log index, then removed: its id's epoch floor is
    // all the backup keeps of it.
    const REMOVED_EPOCH: u64 = 4_000_000_000_000_000;
    let body = json!({"addr": "10.0.0.11:9000", "min_epoch": REMOVED_EPOCH}).to_string();
    ok(Method::PUT, &from, "/v1/datanodes/11", Some(body)).await;
    ok(Method::DELETE, &from, "/v1/datanodes/11", None).await;
    let expected = content(&from).await;
    assert_eq!(
        expected["datanodes"][0]["replicas"]
            .as_array()
            .unwrap()
            .len(),
        25_000
    );
    assert_eq!(expected["keys"], 3);

    let backup = dir.path().join("backup.snap");
    let (saved, _, err) = run(
        &[
            "snapshot",
            "save",
            "--server",
            &from,
            backup.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert!(saved, "{err}");
    // Datanode 10 registers after the backup was taken: the backup does not name it.
    let body = json!({"addr": "10.0.0.10:9000"}).to_string();
    let v = ok(Method::PUT, &from, "/v1/datanodes/10", Some(body)).await;
    old_epochs.push((10, v["epoch"].as_u64().unwrap()));
    source.stop().await;

    let (mut target, to) = start(&dir.path().join("target")).await;
    let restore = [
        "snapshot",
        "restore",
        "--server",
        &to,
        backup.to_str().unwrap(),
    ];
    let (restored, out, err) = run(&restore, &[]).await;
    assert!(restored, "{err}");
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            &summary["datanodes"],
            &summary["replicas"],
            &summary["keys"]
        ),
        (&json!(3), &json!(25_003), &json!(3)),
        "{out}"
    );
    assert_eq!(content(&to).await, expected);
    // It ended the mark its claim put on the cluster.
    let view = ok(Method::GET, &to, "/v1/cluster", None).await;
    assert_eq!(view.get("restore"), None, "{view}");
    // The restore raised the cluster's epoch floor above every epoch of the backup, the removed
    // datanode's included; datanodes the backup does not name register above it.
    let floor = summary["epoch_floor"].as_u64().unwrap();
    assert!(floor > REMOVED_EPOCH, "{out}");
    for id in [10, 11] {
        let body =
            json!({"addr": format!("10.0.{}.{}:9000", id / 256 % 256, id % 256)}).to_string();
        let v = ok(Method::PUT, &to, &format!("/v1/datanodes/{id}"), Some(body)).await;
        assert!(v["epoch"].as_u64().unwrap() >= floor, "{v}");
    }
    // A batch under an epoch of the old cluster is fenced: the new epochs are above every
    // epoch it handed out (the fresh cluster's own log indexes are small, and would repeat
    // them).
    for (id, old) in old_epochs {
        let body = json!({"epoch": old, "shards": [{"id": 1, "generation": 1, "size": 1}]});
        let url = format!("http://{to}/v1/datanodes/{id}/shards");
        let (status, v) = send(&client(), Method::POST, &url, None, Some(body.to_string()))
            .await
            .unwrap();
        assert_eq!(
            (status, &v["error"]["code"]),
            (409, &json!("fenced")),
            "{v}"
        );
    }
    // The restored datanodes take new registrations under their new epochs.
    let epoch = ok(Method::GET, &to, "/v1/datanodes/8", None).await["epoch"].clone();
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 1, "size": 1}]});
    ok(
        Method::POST,
        &to,
        "/v1/datanodes/8/shards",
        Some(body.to_string()),
    )
    .await;
    let now = content(&to).await;

    // Again, into the node that now holds it all: refused, nothing changes.
    let (again, _, err) = run(&restore, &[]).await;
    assert!(!again, "a restore into a node that holds data succeeded");
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(content(&to).await, now);

    // A damaged backup is refused before anything is sent, naming the file.
    let bytes = std::fs::read(&backup).unwrap();
    let damaged = dir.path().join("damaged.snap");
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let (third, _, err) = run(
        &[
            "snapshot",
            "restore",
            "--server",
            &to,
            damaged.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert!(!third, "a damaged backup was restored");
    assert!(err.contains("damaged.snap"), "{err}");
    assert_eq!(content(&to).await, now);
    target.stop().await;
}

/// A restore claims the cluster it goes into before it writes: a cluster claimed already (by a
/// restore running, or one whose backup held nothing) refuses it with nothing written, and of
/// two restores run into one fresh cluster at once, one restores and the other writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_restores_into_one_cluster_one_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, from) = start(&dir.path().join("source")).await;
    let body = json!({"addr": "10.0.0.7:9000"}).to_string();
    let epoch = ok(Method::PUT, &from, "/v1/datanodes/7", Some(body)).await["epoch"].clone();
    let shards: Vec<Value> = (1..=2_000)
        .map(|id| json!({"id": id, "generation": 1, "size": 1}))
        .collect();
    let body = json!({"epoch": epoch, "shards": shards}).to_string();
    ok(Method::POST, &from, "/v1/datanodes/7/shards", Some(body)).await;
    ok(Method::PUT, &from, "/v1/kv/z", Some("last".into())).await;
    let expected = content(&from).await;
    let backup = dir.path().join("backup.snap");
    let backup = backup.to_str().unwrap();
    let (saved, _, err) = run(&["snapshot", "save", "--server", &from, backup], &[]).await;
    assert!(saved, "{err}");
    source.stop().await;

    let (mut claimed, to) = start(&dir.path().join("claimed")).await;
    let claim = json!({"at_least": 5, "if_fresh": true}).to_string();
    ok(
        Method::PUT,
        &to,
        "/v1/cluster/epoch-floor",
        Some(claim.clone()),
    )
    .await;
    let url = format!("http://{to}/v1/cluster/epoch-floor");
    let (status, v) = send(&client(), Method::PUT, &url, None, Some(claim))
        .await
        .unwrap();
    assert_eq!(status, 409, "{v}");
    let (restored, _, err) = run(&["snapshot", "restore", "--server", &to, backup], &[]).await;
    assert!(!restored);
    assert!(
        err.contains("not fresh") && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!err.contains("part way"), "{err}");
    assert_eq!(
        ok(Method::GET, &to, "/v1/datanodes", None).await["datanodes"],
        json!([])
    );
    claimed.stop().await;

    // With a separate member token, the client token cannot claim: refused, nothing written.
    let guarded = dir.path().join("guarded");
    std::fs::create_dir_all(&guarded).unwrap();
    let tokens = [
        ("METASERVER_LISTEN", "127.0.0.1:0"),
        ("METASERVER_TOKEN", "client"),
        ("METASERVER_MEMBER_TOKEN", "member"),
    ];
    let mut node = spawn(&guarded, &guarded, &[], &tokens, false);
    let at = node.address();
    poll(&client(), &format!("http://{at}/readyz"), None, |_| true).await;
    let restore = ["snapshot", "restore", "--server", &at, backup];
    let (restored, _, err) = run(&restore, &[("METASERVER_TOKEN", "client")]).await;
    assert!(!restored);
    assert!(
        err.contains("member token") && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!err.contains("part way"), "{err}");
    let (restored, _, err) = run(&restore, &tokens[1..]).await;
    assert!(restored, "{err}");
    node.stop().await;

    let (mut target, to) = start(&dir.path().join("target")).await;
    let restore = ["snapshot", "restore", "--server", &to, backup];
    let (first, second) = tokio::join!(run(&restore, &[]), run(&restore, &[]));
    let outcomes = [first, second];
    let done: Vec<_> = outcomes.iter().filter(|(ok, _, _)| *ok).collect();
    assert_eq!(done.len(), 1, "{outcomes:?}");
    let (_, _, err) = outcomes.iter().find(|(ok, _, _)| !*ok).unwrap();
    assert!(
        !err.contains("part way") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(content(&to).await, expected);
    target.stop().await;
}

/// A restore cut off part way leaves a cluster that says so until the mark its claim put is
/// removed: its status names the restore and the backup, its metrics and `metaserver health`
/// flag it, and a snapshot of it keeps the mark, which `snapshot save` (keeping the backup it
/// would replace) and a restore of it refuse without `--partial`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_off_part_way_leaves_a_cluster_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cut, at) = start(&dir.path().join("cut")).await;
    // What a restore cut off after its first datanode leaves: the marked claim, and some writes.
    let backup_figures = json!({"index": 40, "datanodes": 2, "replicas": 3, "keys": 1});
    let refused = json!({"at_least": 5, "restore": backup_figures}).to_string();
    let url = format!("http://{at}/v1/cluster/epoch-floor");
    let (status, v) = send(&client(), Method::PUT, &url, None, Some(refused))
        .await
        .unwrap();
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("invalid_body")),
        "{v}"
    );
    assert_eq!(
        ok(Method::GET, &at, "/v1/cluster", None)
            .await
            .get("restore"),
        None
    );
    let claim = json!({"at_least": 5, "if_fresh": true, "restore": backup_figures});
    ok(
        Method::PUT,
        &at,
        "/v1/cluster/epoch-floor",
        Some(claim.to_string()),
    )
    .await;
    // A datanode waits until the restore ends; the restore's registrations ask for epochs of
    // at least its floor.
    let url = format!("http://{at}/v1/datanodes/9");
    let body = json!({"addr": "10.0.0.9:9000"}).to_string();
    let (status, v) = send(&client(), Method::PUT, &url, None, Some(body.clone()))
        .await
        .unwrap();
    assert_eq!(
        (status, &v["error"]["code"]),
        (503, &json!("restoring")),
        "{v}"
    );
    let body = json!({"addr": "10.0.0.7:9000", "min_epoch": 5}).to_string();
    let epoch = ok(Method::PUT, &at, "/v1/datanodes/7", Some(body)).await["epoch"].clone();
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 1, "size": 1}]});
    ok(
        Method::POST,
        &at,
        "/v1/datanodes/7/shards",
        Some(body.to_string()),
    )
    .await;

    let view = ok(Method::GET, &at, "/v1/cluster", None).await;
    assert_eq!(view["restore"]["backup"], backup_figures, "{view}");
    let claimed_at = view["restore"]["claimed_at"].as_u64().unwrap();
    assert!(claimed_at > 0, "{view}");
    let metrics = client()
        .get(format!("http://{at}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("\nmetaserver_restore_unended 1\n"),
        "{metrics}"
    );
    let (healthy, out, err) = run(&["health", "--server", &at], &[]).await;
    assert!(!healthy, "{out}");
    assert!(
        err.contains(&format!(
            "a restore into the cluster has not ended (claimed at index {claimed_at}"
        )),
        "{err}"
    );

    // A save keeps the backup it would replace; with --partial it saves the marked snapshot.
    let backup = dir.path().join("backup.snap");
    std::fs::write(&backup, b"an earlier backup").unwrap();
    let save = [
        "snapshot",
        "save",
        "--server",
        &at,
        backup.to_str().unwrap(),
    ];
    let (saved, _, err) = run(&save, &[]).await;
    assert!(!saved);
    assert!(
        err.contains("built while a restore into its cluster had not ended")
            && err.contains("--partial"),
        "{err}"
    );
    assert_eq!(std::fs::read(&backup).unwrap(), b"an earlier backup");
    let partial = dir.path().join("partial.snap");
    let partial = partial.to_str().unwrap();
    let save = ["snapshot", "save", "--server", &at, partial, "--partial"];
    let (saved, _, err) = run(&save, &[]).await;
    assert!(saved, "{err}");
    assert!(err.contains("warning"), "{err}");

    // Its restore is refused with nothing written; with --partial it goes, and ends its mark.
    let (mut target, to) = start(&dir.path().join("target")).await;
    let restore = ["snapshot", "restore", "--server", &to, partial];
    let (restored, _, err) = run(&restore, &[]).await;
    assert!(!restored);
    assert!(
        err.contains("nothing was written") && !err.contains("stopped part way"),
        "{err}"
    );
    assert_eq!(
        ok(Method::GET, &to, "/v1/datanodes", None).await["datanodes"],
        json!([])
    );
    let (restored, _, err) = run(&[&restore[..], &["--partial"]].concat(), &[]).await;
    assert!(restored, "{err}");
    assert_eq!(content(&to).await, content(&at).await);
    let view = ok(Method::GET, &to, "/v1/cluster", None).await;
    assert_eq!(view.get("restore"), None, "{view}");
    target.stop().await;

    // Ending it by hand keeps what the cluster holds; a second end finds no mark.
    let (done, out, err) = run(&["snapshot", "end-restore", "--server", &at], &[]).await;
    assert!(done, "{err}");
    let ended: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ended["ended"]["claimed_at"], claimed_at, "{ended}");
    let again = ok(Method::DELETE, &at, "/v1/cluster/restore", None).await;
    assert_eq!(again["ended"], Value::Null, "{again}");
    let view = ok(Method::GET, &at, "/v1/cluster", None).await;
    assert_eq!(view.get("restore"), None, "{view}");
    assert_eq!(view["datanodes"], 1, "{view}");
    // Datanodes register again.
    let body = json!({"addr": "10.0.0.9:9000"}).to_string();
    ok(Method::PUT, &at, "/v1/datanodes/9", Some(body)).await;
    let (healthy, out, err) = run(&["health", "--server", &at], &[]).await;
    assert!(healthy, "{out}{err}");
    cut.stop().await;
}

/// A stand-in between the restore and the member at `to`: it passes every request on, and once
/// the restore's claim passed, it writes two keys at the member itself: `meanwhile`, as a client
/// that writes while a restore runs would (its answer, status and JSON, is sent on the channel),
/// and `forged`, as the restore's own (`restore=true`), as a client that claims to be the
/// restore would.
async fn writing_meanwhile(
    to: String,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<(u16, Value)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tell, told) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let to = to.clone();
        let tell = tell.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            let path = parts.uri.path_and_query().unwrap().as_str().to_owned();
            let answer = client()
                .request(parts.method.clone(), format!("http://{to}{path}"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = answer.status();
            let bytes = answer.bytes().await.unwrap();
            if parts.method == Method::PUT && path == "/v1/cluster/epoch-floor" {
                let url = format!("http://{to}/v1/kv/meanwhile");
                let http = client();
                let client_write = send(&http, Method::PUT, &url, None, Some("x".into()));
                tell.send(client_write.await.unwrap()).unwrap();
                let path = "/v1/kv/forged?restore=true";
                ok(Method::PUT, &to, path, Some("x".into())).await;
            }
            let mut response = axum::response::Response::new(axum::body::Body::from(bytes));
            *response.status_mut() = status;
            response
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, told)
}

/// While a restore runs, a client's key write is refused (503 `restoring`): only the restore
/// writes keys. A restore checks that the cluster holds what the backup holds before it ends its
/// mark: a key written meanwhile as the restore's own fails the restore, naming the counts, and
/// the cluster keeps the mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_written_while_it_was_restored_keeps_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, from) = start(&dir.path().join("source")).await;
    let body = json!({"addr": "10.0.0.7:9000"}).to_string();
    let epoch = ok(Method::PUT, &from, "/v1/datanodes/7", Some(body)).await["epoch"].clone();
    let shards: Vec<Value> = (1..=10)
        .map(|id| json!({"id": id, "generation": 1, "size": 1}))
        .collect();
    let body = json!({"epoch": epoch, "shards": shards}).to_string();
    ok(Method::POST, &from, "/v1/datanodes/7/shards", Some(body)).await;
    ok(Method::PUT, &from, "/v1/kv/z", Some("last".into())).await;
    let backup = dir.path().join("backup.snap");
    let backup = backup.to_str().unwrap();
    let (saved, _, err) = run(&["snapshot", "save", "--server", &from, backup], &[]).await;
    assert!(saved, "{err}");
    source.stop().await;

    let (mut target, to) = start(&dir.path().join("target")).await;
    let (between, mut told) = writing_meanwhile(to.clone()).await;
    let (restored, _, err) = run(&["snapshot", "restore", "--server", &between, backup], &[]).await;
    let (status, answer) = told.recv().await.expect("the stand-in wrote meanwhile");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "restoring", "{answer}");
    assert!(!restored, "{err}");
    assert!(
        err.contains(
            "the cluster holds 1, 10, 2 (datanodes, replicas, keys) but the backup 1, 10, 1"
        ) && err.contains("keeps its restore mark"),
        "{err}"
    );
    let view = ok(Method::GET, &to, "/v1/cluster", None).await;
    assert_eq!(view["restore"]["backup"]["datanodes"], 1, "{view}");
    let keys = ok(Method::GET, &to, "/v1/kv", None).await;
    assert_eq!(keys["keys"].as_array().unwrap().len(), 2, "{keys}");
    target.stop().await;
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Waits until a name in `dir` starts with `prefix`.
async fn until_named(dir: &Path, prefix: &str) {
    let deadline = std::time::Instant::now() + common::DEADLINE;
    while !names(dir).iter().any(|n| n.starts_with(prefix)) {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing named {prefix}* appeared in {}: {:?}",
            dir.display(),
            names(dir)
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Runs the command `args` in `dir` until a name starting with `appears` is there, then sends
/// it `signal`: it must exit with `code` and leave only `backup.snap` in `dir`.
async fn interrupt(
    dir: &Path,
    logs: &Path,
    args: &[&str],
    appears: &str,
    (signal, code): (libc::c_int, i32),
) -> String {
    let mut command = spawn(dir, logs, args, &[], false);
    until_named(dir, appears).await;
    command.signal(signal);
    let exit = command.wait_exit().await;
    assert_eq!(exit.code(), Some(code), "{exit:?}: {}", command.logs());
    assert_eq!(names(dir), ["backup.snap"]);
    command.logs()
}

/// Stopped by SIGTERM or SIGINT, `snapshot save` and `snapshot restore` leave none of their temp files:
/// not a save's download (held here by a low snapshot rate), not the scratch registry that
/// reads a backup (while a restore waits for a server that never answers). An earlier backup
/// stays as it was.
#[tokio::test]
async fn an_interrupted_save_or_restore_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, from) = start(&dir.path().join("source")).await;
    let body = json!({"addr": "10.0.0.7:9000"}).to_string();
    let epoch = ok(Method::PUT, &from, "/v1/datanodes/7", Some(body)).await["epoch"].clone();
    let shards: Vec<Value> = (1..=1000)
        .map(|id| json!({"id": id, "generation": 1, "size": 1}))
        .collect();
    let body = json!({"epoch": epoch, "shards": shards}).to_string();
    ok(Method::POST, &from, "/v1/datanodes/7/shards", Some(body)).await;
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let save = ["snapshot", "save", "--server", &from, "backup.snap"];
    let (saved, _, err) = run(
        &[
            "snapshot",
            "save",
            "--server",
            &from,
            out.join("backup.snap").to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert!(saved, "{err}");
    let good = std::fs::read(out.join("backup.snap")).unwrap();

    // The snapshot is built already; at 1,000 bytes a second its download takes seconds.
    let body = json!({"snapshot_max_bytes_per_sec": 1000}).to_string();
    ok(Method::PATCH, &from, "/v1/config", Some(body)).await;
    interrupt(&out, dir.path(), &save, ".tmp", (libc::SIGTERM, 143)).await;
    assert_eq!(std::fs::read(out.join("backup.snap")).unwrap(), good);
    source.stop().await;

    // Connections to it are taken (by the kernel) and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let restore = [
        "snapshot",
        "restore",
        "--server",
        &silent_addr,
        "backup.snap",
    ];
    let stderr = interrupt(
        &out,
        dir.path(),
        &restore,
        ".metaserver-scratch-",
        (libc::SIGINT, 130),
    )
    .await;
    assert!(!stderr.contains("part way"), "nothing was sent: {stderr}");

    // A member that finds the cluster empty and never answers the restore's first write: the
    // restore stopped then says that the cluster may hold part of the backup.
    let (member, mut first_write) = holds_the_first_write().await;
    let restore = ["snapshot", "restore", "--server", &member, "backup.snap"];
    let mut command = spawn(&out, dir.path(), &restore, &[], false);
    let first = tokio::time::timeout(common::DEADLINE, first_write.recv())
        .await
        .expect("the restore sends its first write")
        .unwrap();
    // The claim, which marks the cluster as being restored from this backup.
    let (line, body) = first.split_once("\r\n").unwrap();
    assert!(line.starts_with("PUT /v1/cluster/epoch-floor "), "{first}");
    let claim: Value = serde_json::from_str(body).unwrap();
    assert_eq!(claim["if_fresh"], true, "{claim}");
    assert_eq!(
        (
            &claim["restore"]["datanodes"],
            &claim["restore"]["replicas"],
            &claim["restore"]["keys"]
        ),
        (&json!(1), &json!(1000), &json!(0)),
        "{claim}"
    );
    command.signal(libc::SIGINT);
    let exit = command.wait_exit().await;
    assert_eq!(exit.code(), Some(130), "{exit:?}: {}", command.logs());
    let stderr = command.logs();
    assert!(
        stderr.contains("stopped part way") && stderr.contains("fresh data dirs"),
        "{stderr}"
    );
    assert_eq!(names(&out), ["backup.snap"]);
}

/// A stand-in member on a port of its own: it answers every `GET` with an empty page (of
/// datanodes or keys) and never answers anything else, sending its request line (with its line
/// end) and body on the channel.
async fn holds_the_first_write() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let mut head = Vec::new();
                    loop {
                        let mut line = String::new();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push(line);
                    }
                    if !head[0].starts_with("GET ") {
                        let length = head
                            .iter()
                            .find_map(|h| {
                                let (name, value) = h.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        let mut body = vec![0u8; length];
                        use tokio::io::AsyncReadExt;
                        if stream.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let body = String::from_utf8_lossy(&body);
                        let _ = tx.send(format!("{}{body}", head[0]));
                        return std::future::pending().await;
                    }
                    let body = if head[0].contains("/v1/kv") {
                        r#"{"keys":[],"next":null}"#
                    } else {
                        r#"{"datanodes":[],"next":null}"#
                    };
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// A backup whose epochs are above what a restore can give (a datanode registered at the
/// highest floor a registration may ask for, then again) is refused by `snapshot save`, which
/// keeps no file, and, downloaded as it is, by a restore before anything is sent, whose error
/// says so without claiming that the restore stopped part way.
#[tokio::test]
async fn a_backup_whose_epochs_are_too_high_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start(&dir.path().join("node")).await;
    let highest = json!({"addr": "10.0.0.7:9000", "min_epoch": 1u64 << 52}).to_string();
    ok(Method::PUT, &addr, "/v1/datanodes/7", Some(highest)).await;
    let again = json!({"addr": "10.0.0.7:9000"}).to_string();
    let epoch = ok(Method::PUT, &addr, "/v1/datanodes/7", Some(again)).await["epoch"].clone();
    assert_eq!(epoch, json!((1u64 << 52) + 1));
    let backup = dir.path().join("backup.snap");
    let backup = backup.to_str().unwrap();
    let (saved, _, err) = run(&["snapshot", "save", "--server", &addr, backup], &[]).await;
    assert!(!saved && err.contains("no restore can take"), "{err}");
    // Not a damaged download, nor a want of space.
    assert!(!err.contains("not a usable backup"), "{err}");
    assert!(!Path::new(backup).exists(), "the refused save kept a file");
    // A plain download copies it still.
    ok(Method::POST, &addr, "/v1/cluster/snapshot", None).await;
    let url = format!("http://{addr}/v1/cluster/snapshot");
    let bytes = client()
        .get(url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    std::fs::write(backup, &bytes).unwrap();
    let (restored, _, err) = run(&["snapshot", "restore", "--server", &addr, backup], &[]).await;
    assert!(!restored);
    assert!(
        err.contains("holds epochs, or epoch floors, up to"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert!(!err.contains("part way"), "{err}");
    server.stop().await;
}
