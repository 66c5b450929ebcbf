//! Bad input at the routes between members: bodies that do not decode, and forwarded
//! commands that the admin API would refuse.

use axum::body::Body;
use axum::http::{Method, StatusCode};

use crate::common::call;
use crate::helpers::{case, populated, Case, AUTH};

/// Bodies that do not decode, at the routes between members.
pub fn garbled_bodies() -> Vec<Case> {
    use Method as M;

    // The routes between members refuse bodies that do not decode.
    vec![
        case(
            "garbled read index request",
            M::POST,
            "/raft/read-index",
            vec![0xffu8; 3],
            400,
            "bad_read_index_request",
        ),
        case(
            "garbled forwarded batch",
            M::POST,
            "/raft/forward-commands",
            vec![0xffu8; 3],
            400,
            "bad_batch",
        ),
        // A member batches at most 256 commands; a longer batch is refused whole.
        case(
            "forwarded batch of too many commands",
            M::POST,
            "/raft/forward-commands",
            meta_consensus::codec::encode(
                &(0..257)
                    .map(|i| meta_consensus::Command::Put {
                        key: format!("many/{i}"),
                        value: b"x".to_vec(),
                        if_revision: None,
                    })
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
            400,
            "bad_batch",
        ),
    ]
}

/// The leader checks forwarded commands as the requests that carry them are checked: a caller
/// of `/raft/forward-commands` cannot store what the admin API refuses.
#[tokio::test]
async fn forwarded_commands_are_checked_by_the_leader() {
    use meta_consensus::{codec, Command, ShardReport};
    use meta_http::forward_batch::{Answer, Refusal, PATH_FORWARD_BATCH};

    let (t, epoch) = populated().await;
    let before = t.digest().await;
    let shard = |id| ShardReport {
        id,
        generation: 1,
        size: 1,
    };
    let put = |key: &str, value: Vec<u8>| Command::Put {
        key: key.into(),
        value,
        if_revision: None,
    };
    let bad = vec![
        put("a/../b", b"x".to_vec()),
        put("ctl\n", b"x".to_vec()),
        put("", b"x".to_vec()),
        put("big", vec![0; 1024 * 1024 + 1]),
        Command::Delete {
            key: "ctl\u{0}".into(),
            if_revision: None,
        },
        Command::RegisterDatanode {
            id: 8,
            addr: "a b c".into(),
        },
        Command::RegisterShards {
            datanode: 7,
            epoch,
            shards: vec![shard(5), shard(5)],
        },
        Command::RegisterShards {
            datanode: 7,
            epoch,
            shards: vec![],
        },
    ];
    let n = bad.len();
    let a = call(
        &t.app,
        Method::POST,
        PATH_FORWARD_BATCH,
        Body::from(codec::encode(&bad).unwrap()),
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let answers: Vec<Answer> = codec::decode(&a.body).unwrap();
    assert_eq!(answers.len(), n);
    for (cmd, answer) in bad.iter().zip(&answers) {
        assert!(
            matches!(answer, Err(Refusal::Invalid(_))),
            "{cmd} answered {answer:?}"
        );
    }
    assert_eq!(t.digest().await, before, "the registry changed");
}
