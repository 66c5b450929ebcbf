//! Replays whose path a URL parser would change. A follower replays a request at the leader
//! through an HTTP client, which parses the URL by the WHATWG rules and so resolves `.` and `..`
//! segments, also percent-encoded ones (`%2E%2E`): `/v1/kv/a/%2E%2E/b` would reach the leader as
//! `/v1/kv/b`, another key (keys written before the rule against such segments may hold them).
//! Such a replay goes instead to [`PATH_RAW_REPLAY`] with the path and query as received in the
//! [`RAW_PATH`] header; the leader puts them back and routes the request as if it had come so.
//! A leader of an older build knows no such route and answers 404, which changes nothing.

use axum::extract::{MatchedPath, Request};
use axum::http::uri::PathAndQuery;
use axum::http::{HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::util::ServiceExt;

use crate::error::ApiError;
use crate::peer_client::PeerClient;

/// The route a replay takes when its path would not survive the URL parser.
pub const PATH_RAW_REPLAY: &str = "/v1/raw-replay";

/// The path and query of a replay sent to [`PATH_RAW_REPLAY`], as the follower received them.
pub const RAW_PATH: axum::http::HeaderName =
    axum::http::HeaderName::from_static("x-metaserver-raw-path");

/// Where to replay `path_and_query` at `addr`: the URL, and the header to send with it when the
/// URL goes to [`PATH_RAW_REPLAY`] because an HTTP client would send another path.
pub fn replay_url(
    client: &PeerClient,
    addr: &str,
    path_and_query: &str,
) -> (String, Option<HeaderValue>) {
    let url = client.url(addr, path_and_query);
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let kept = reqwest::Url::parse(&url).is_ok_and(|u| u.path() == path && u.query() == query);
    match HeaderValue::from_str(path_and_query) {
        Ok(raw) if !kept => (client.url(addr, PATH_RAW_REPLAY), Some(raw)),
        _ => (url, None),
    }
}

/// Serves [`PATH_RAW_REPLAY`]: routes the request through `app` with the path and query of its
/// [`RAW_PATH`] header, which must name an admin API route (`/v1/...`, not this one).
pub async fn serve(app: Router, mut request: Request) -> Response {
    let raw = request.headers_mut().remove(RAW_PATH);
    let path = raw
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<PathAndQuery>().ok())
        .filter(|p| p.path().starts_with("/v1/") && p.path() != PATH_RAW_REPLAY);
    let Some(path) = path else {
        return ApiError::invalid(
            "invalid_replay",
            format!("{PATH_RAW_REPLAY} needs an admin API path and query in the {RAW_PATH} header"),
        )
        .into_response();
    };
    // Routed afresh: the route this one matched would otherwise prefix the one it matches.
    request.extensions_mut().remove::<MatchedPath>();
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = Some(path);
    match Uri::from_parts(parts) {
        Ok(uri) => *request.uri_mut() = uri,
        Err(e) => {
            return ApiError::invalid("invalid_replay", format!("bad replay path: {e}"))
                .into_response()
        }
    }
    match app.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_the_url_parser_would_change_take_the_raw_route() {
        let plain = replay_url(&PeerClient::plain(), "h:1", "/v1/kv/a/b?consistency=lease");
        assert_eq!(
            plain,
            ("http://h:1/v1/kv/a/b?consistency=lease".into(), None)
        );
        let escaped = replay_url(&PeerClient::plain(), "h:1", "/v1/kv/a%20b/%C3%A9");
        assert_eq!(escaped.1, None);
        for dotted in [
            "/v1/kv/a/%2E%2E/b",
            "/v1/kv/a/../b?consistency=linearizable",
            "/v1/kv/%2e",
            "/v1/kv/./x",
        ] {
            let (url, raw) = replay_url(&PeerClient::plain(), "h:1", dotted);
            assert_eq!(url, "http://h:1/v1/raw-replay", "{dotted}");
            assert_eq!(raw.unwrap().to_str().unwrap(), dotted);
        }
    }
}
