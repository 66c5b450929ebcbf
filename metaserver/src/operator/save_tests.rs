//! The `snapshot save` command's tests, against servers on loopback that answer as members
//! would: what it keeps, and how it rides out a member that cannot build or send the backup.

use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::tests::{answering, answering_with, closed_port, operator_args};
use super::*;

#[tokio::test]
async fn a_download_that_is_not_a_backup_leaves_the_earlier_backup_in_place() {
    // The member answers the build, then serves bytes that are no snapshot (a damaged
    // file, or another server at the address).
    let (addr, _) = answering(|n| match n {
        0 => (StatusCode::OK, "{}"),
        _ => (StatusCode::OK, "<html>not a snapshot</html>"),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("meta.snap");
    std::fs::write(&file, b"the earlier backup").unwrap();
    let err = snapshot_save(
        ClientArgs {
            server: addr,
            token: None,
            member_token: None,
            tls_ca: None,
        },
        &file,
        false,
        false,
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("not a usable backup"),
        "{err:#}"
    );
    assert!(format!("{err:#}").contains("was left as it was"), "{err:#}");
    assert_eq!(std::fs::read(&file).unwrap(), b"the earlier backup");
    // Without an earlier backup, nothing is said to be left.
    let (addr, _) = answering(|n| match n {
        0 => (StatusCode::OK, "{}"),
        _ => (StatusCode::OK, "<html>not a snapshot</html>"),
    })
    .await;
    let new = dir.path().join("new.snap");
    let args = ClientArgs {
        server: addr,
        token: None,
        member_token: None,
        tls_ca: None,
    };
    let err = snapshot_save(args, &new, false, false).await.unwrap_err();
    assert!(format!("{err:#}").contains("was not written"), "{err:#}");
    assert!(!new.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("meta.snap")],
        "no temp file is left"
    );
}

/// Runs `snapshot save` against the members `server`, one of which builds and serves bytes
/// that are no snapshot: the save fails at its check of the download, which shows it got there.
async fn saved_up_to_the_check(server: String) {
    saved_up_to_the_check_with(server, false).await;
}

/// [`saved_up_to_the_check`], with `snapshot save --local` if `local`.
async fn saved_up_to_the_check_with(server: String, local: bool) {
    let dir = tempfile::tempdir().unwrap();
    let args = ClientArgs {
        server,
        token: None,
        member_token: None,
        tls_ca: None,
    };
    let err = snapshot_save(args, &dir.path().join("meta.snap"), local, false)
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("not a usable backup"),
        "{err:#}"
    );
}

/// `snapshot save --local` asks the member to build from its state as it is, which a member
/// of a cluster without a leader does (it refuses otherwise: here at once, with 400).
#[tokio::test]
async fn a_local_save_builds_without_a_leader() {
    let app = axum::Router::new().fallback(
        |method: axum::http::Method, uri: axum::http::Uri| async move {
            let local = uri.query() == Some("consistency=local");
            match (method, local) {
                (axum::http::Method::POST, true) => (StatusCode::OK, "{}"),
                (axum::http::Method::POST, false) => (
                    StatusCode::BAD_REQUEST,
                    r#"{"error":{"code":"x","message":"not local"}}"#,
                ),
                _ => (StatusCode::OK, "<html>not a snapshot</html>"),
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    saved_up_to_the_check_with(addr.clone(), true).await;
    let dir = tempfile::tempdir().unwrap();
    let args = ClientArgs {
        server: addr,
        token: None,
        member_token: None,
        tls_ca: None,
    };
    let err = snapshot_save(args, &dir.path().join("meta.snap"), false, false)
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("not local"), "{err:#}");
}

/// A save that no leader confirms (a member answers 503 no_leader, and waiting does not help)
/// points to `--local`, which saves what a survivor of a lost majority holds.
#[tokio::test]
async fn a_save_without_a_leader_points_to_local() {
    let (addr, _) = answering_with(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":"no_leader","message":"too few voters answer"}}"#,
        )
            .into_response()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let err = snapshot_save(
        operator_args(addr),
        &dir.path().join("meta.snap"),
        false,
        false,
    )
    .await
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("too few voters answer"), "{text}");
    assert!(text.contains("with --local"), "{text}");
}

/// A member that goes away while it builds the snapshot (it takes the request, then the
/// connection closes) leaves the save to the next member given, which is asked to build one
/// (here it serves no snapshot, which the save then says): the save used to stop, saying the
/// first member was the last of those given.
#[tokio::test]
async fn a_save_whose_member_went_away_asks_the_next_one() {
    let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone_addr = gone.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt as _;
        while let Ok((mut conn, _)) = gone.accept().await {
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
        }
    });
    let (next, asked) = answering(|n| match n {
        0 => (StatusCode::OK, "{}"),
        _ => (StatusCode::OK, "<html>not a snapshot</html>"),
    })
    .await;
    // The last member given serves no snapshot: the save says so, having got that far.
    saved_up_to_the_check(format!("{gone_addr},{next}")).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "built and downloaded there"
    );
}

/// A save whose leader went away rides out the election that follows: the other members
/// answer 503 while they know no leader, and the save asks again (it stopped at once, having
/// asked the gone leader again as the last member).
#[tokio::test]
async fn a_save_rides_out_a_leader_change() {
    let (gone, _held) = closed_port();
    // The election outlasts a round of every member given, twice.
    let (next, asked) = answering(|n| match n {
        0..4 => (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":"no_leader","message":"electing"}}"#,
        ),
        4 => (StatusCode::OK, "{}"),
        _ => (StatusCode::OK, "<html>not a snapshot</html>"),
    })
    .await;
    saved_up_to_the_check(format!("{next},{gone}")).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        6,
        "asked again, built and downloaded there"
    );
}
