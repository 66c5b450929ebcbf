//! Requests without the token, or with a wrong or malformed one.

use axum::http::Method as M;

use crate::helpers::{case, Case, TOKEN};

/// Each request sent without the token, with a wrong one or a malformed one, at the admin
/// API and at the routes between members.
pub fn missing_wrong_and_malformed() -> Vec<Case> {
    let mut cases = Vec::new();
    // Tokens: missing, wrong, malformed.
    for (what, headers) in [
        ("missing token", vec![]),
        ("wrong token", vec![("authorization", "Bearer nope")]),
        ("token without Bearer", vec![("authorization", TOKEN)]),
        (
            "token prefix",
            vec![("authorization", "Bearer matrix-toke")],
        ),
    ] {
        let mut c = case(
            what,
            M::PUT,
            "/v1/datanodes/7",
            r#"{"addr":"10.0.0.8:1"}"#,
            401,
            "unauthorized",
        );
        c.headers = headers.clone();
        cases.push(c);
        let mut c = case(
            what,
            M::POST,
            "/raft/append",
            vec![1u8, 0],
            401,
            "unauthorized",
        );
        c.headers = headers.clone();
        cases.push(c);
        // A path no route takes: whoever asks without the token learns nothing of the routes.
        let mut c = case(what, M::GET, "/v1/nosuch", "", 401, "unauthorized");
        c.headers = headers;
        cases.push(c);
    }
    cases
}
