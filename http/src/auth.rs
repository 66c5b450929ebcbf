//! Bearer-token authentication for every route except the probes and metrics.
//!
//! With a token configured, a request needs `Authorization: Bearer <token>`; tokens are
//! compared in constant time. `/healthz`, `/readyz` and `/metrics` need none. Without a
//! token, requests that a web page sends are refused, on every route (see
//! [`Token::on_loopback`]): a page must not use a browser to reach a node that trusts anyone
//! who can reach it. The members' own traffic (the Raft RPCs, and the requests a member
//! forwards or replays at its leader) carries the member token: the client token unless a
//! separate one is given, so that a client (a datanode) cannot speak for a member. With a
//! separate member token, the routes under `/raft/` and the raw replay route take only it, and
//! so do the requests that name where a member listens (forming a cluster, adding a learner,
//! moving a member: the node sends its messages there, with the member token) and those that
//! raise epochs, which nothing lowers again (the epoch floor, a registration's `min_epoch`); a
//! request on the other routes that carries only the client token has the headers a member's
//! request carries removed before it is served: it counts as a client's.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::log_throttle::LogThrottle;

/// Paths served without a token.
pub const OPEN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// The headers by which a request says it comes from a member (a forward, a replayed read, a
/// member's identity). A client's request has them removed when a separate member token is set.
const MEMBER_HEADERS: [HeaderName; 8] = [
    crate::forward::FORWARDED_BY,
    crate::follower_read::READ_INDEX,
    crate::cluster_identity::CLUSTER,
    crate::cluster_identity::FROM,
    crate::cluster_identity::TO,
    crate::cluster_identity::MEMBER_ONLY,
    crate::cluster_identity::IDENTITY,
    crate::raw_path::RAW_PATH,
];

/// The secrets, if any: the clients' token and the members' own. Cloning is cheap.
#[derive(Clone, Default)]
pub struct Token {
    client: Option<Arc<str>>,
    /// A separate member token; `None`: the members use the client token.
    member: Option<Arc<str>>,
    /// When a member's message was last logged as refused for its token: at most every 30 s,
    /// whichever sender it names (the name is the sender's claim: an outsider naming a new
    /// one each time must not write a line each time).
    refused: Arc<LogThrottle<()>>,
    /// On a node without a client token that listens on loopback only, the host names with a
    /// dot a request may be addressed to ([`Token::on_loopback`]).
    loopback_names: Option<Arc<[String]>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |t: &Option<Arc<str>>| if t.is_some() { "<set>" } else { "<none>" };
        write!(
            f,
            "Token(client: {}, member: {})",
            set(&self.client),
            set(&self.member)
        )
    }
}

impl Token {
    /// A token that requests must present; `None` or an empty string disables authentication.
    /// The members use it too, unless [`Token::with_member`] gives them their own.
    pub fn new(token: Option<&str>) -> Self {
        Token {
            client: token.filter(|t| !t.is_empty()).map(Arc::from),
            member: None,
            refused: Arc::default(),
            loopback_names: None,
        }
    }

    /// This token on a node that listens on loopback only, whose members and clients may name
    /// it by `names` (the hosts of its own and its peers' addresses) besides an IP address or a
    /// name without a dot (`localhost`). Without a client token, a request addressed to any
    /// other name is refused: a web page can reach a loopback node only through a name of its
    /// own (with a dot) that resolves to the loopback address (DNS rebinding).
    pub fn on_loopback(mut self, names: Vec<String>) -> Self {
        self.loopback_names = Some(names.into());
        self
    }

    /// Without a client token, why a request is refused as one a web page sent, if it is: it
    /// carries an `Origin` header (a browser's cross-site request, or a same-site write), or,
    /// on a loopback node, it is addressed to a name with a dot that no setting gives (see
    /// [`Token::on_loopback`]), by any of its `Host` headers or by the authority of an
    /// absolute-form `uri`. Tools and members send neither.
    fn refuses_browser(&self, headers: &HeaderMap, uri: &axum::http::Uri) -> Option<String> {
        if self.client.is_some() {
            return None;
        }
        if headers.contains_key(header::ORIGIN) {
            return Some(
                "a node without --token refuses requests that web pages send (this one carries \
                 an Origin header): a page a browser opened could otherwise change the \
                 registry; give the nodes a token to serve browsers"
                    .into(),
            );
        }
        let names = self.loopback_names.as_ref()?;
        headers
            .get_all(header::HOST)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .chain(uri.authority().map(|a| a.as_str()))
            .find_map(|host| refused_name(names, host))
    }

    /// This token with a separate member token (`None` or empty: the members use the client
    /// token). Only the member token opens the members' routes; it opens every other route
    /// too (a member forwards its clients' requests with it).
    pub fn with_member(mut self, member: Option<&str>) -> Self {
        self.member = member.filter(|t| !t.is_empty()).map(Arc::from);
        self
    }

    /// Whether authentication is on (a client token is set).
    pub fn is_set(&self) -> bool {
        self.client.is_some()
    }

    /// The token the members' traffic carries, if any.
    fn member_token(&self) -> Option<&Arc<str>> {
        self.member.as_ref().or(self.client.as_ref())
    }

    /// A fingerprint of the client token for cluster `cluster` (hex, as the cluster header
    /// carries it): two nodes with a separate member token compare fingerprints when one adds
    /// the other ([`crate::cluster_identity::CLIENT_TOKEN`]), since their member token alone
    /// does not tell that datanodes holding the cluster's client token would be refused. Salted
    /// with the cluster id, so the value is of no use to another cluster; `none` without a
    /// client token.
    pub fn client_fingerprint(&self, cluster: &str) -> String {
        use sha2::Digest;
        let Some(client) = &self.client else {
            return "none".to_owned();
        };
        let digest = sha2::Sha256::new()
            .chain_update(b"metaserver client token\0")
            .chain_update(cluster.as_bytes())
            .chain_update(b"\0")
            .chain_update(client.as_bytes())
            .finalize();
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `fingerprint` is [`Token::client_fingerprint`]'s for `cluster` (compared in
    /// constant time).
    pub fn same_client_token(&self, cluster: &str, fingerprint: &[u8]) -> bool {
        self.client_fingerprint(cluster)
            .as_bytes()
            .ct_eq(fingerprint)
            .into()
    }

    /// Whether a separate member token is set.
    pub fn has_member_token(&self) -> bool {
        self.member.is_some()
    }

    /// The `Authorization` header value to send to peers (the member token), if a token is set.
    pub fn header_value(&self) -> Option<String> {
        self.member_token().map(|t| format!("Bearer {t}"))
    }

    /// Whether the headers may use a client route: they carry the client or the member token
    /// (always true without a client token).
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        self.client.is_none()
            || presents(headers, self.client.as_deref())
            || presents(headers, self.member.as_deref())
    }

    /// Logs that a message a member sent (it names its sender, `x-metaserver-from`) was
    /// refused for its token: the other side logs it too, but a member that sends no token to
    /// one that wants one hears no refusal of its own. At most every 30 s, with the count of
    /// the refusals in between; a request that names no sender is a client's, and is not
    /// logged.
    fn log_member_refusal(&self, headers: &HeaderMap) {
        let Some((id, _)) = headers
            .get(crate::cluster_identity::FROM)
            .and_then(crate::cluster_identity::parse_from)
        else {
            return;
        };
        if let Some(unlogged) = self.refused.note((), (), std::time::Instant::now()) {
            tracing::warn!(
                from_node = id,
                unlogged,
                "refused a message that names node {id} as its sender: it carries no token or \
                 another one than this node's; every member needs the same --token \
                 (METASERVER_TOKEN) and --member-token; until then this node takes none of its \
                 messages"
            );
        }
    }

    /// Whether the headers carry the member token (always true without any token).
    pub fn accepts_member(&self, headers: &HeaderMap) -> bool {
        match self.member_token() {
            None => true,
            Some(t) => presents(headers, Some(t)),
        }
    }
}

/// Whether `headers` present `expected` as a bearer token (never for `None`).
fn presents(headers: &HeaderMap, expected: Option<&str>) -> bool {
    let Some(expected) = expected else {
        return false;
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    // The scheme's name is case-insensitive (RFC 9110, section 11.1).
    let value = value.as_bytes();
    let Some(presented) = value
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| &value[7..])
    else {
        return false;
    };
    // The length is not secret; the bytes are compared in constant time.
    presented.ct_eq(expected.as_bytes()).into()
}

/// Why a request on a client route takes the member token, if it does: it names the address
/// of a member (it forms a cluster, adds a learner or moves a member: the node then sends that
/// address its messages as a member, which carry the member token), or it raises the epoch
/// floor (no request lowers it again, and one raised near the largest epoch leaves a restore
/// no epoch to give).
fn takes_member_token(method: &axum::http::Method, path: &str) -> Option<&'static str> {
    use axum::http::Method;
    if (*method == Method::POST && (path == "/v1/cluster/init" || path == "/v1/cluster/learners"))
        || (*method == Method::PUT && path.starts_with("/v1/cluster/members/"))
    {
        // Else a client could have the member token sent to an address of its choosing.
        Some(
            "this request names where a member listens, and the members' messages sent there \
             carry the member token",
        )
    } else if *method == Method::PUT && path == "/v1/cluster/epoch-floor" {
        Some(EPOCH_RAISE)
    } else if *method == Method::DELETE && path == "/v1/cluster/restore" {
        Some(
            "ending a restore is the restore's: a cluster cut off part way through one says \
             so until then",
        )
    } else {
        None
    }
}

/// Why raising epochs takes the member token: also said for a registration with `min_epoch`.
pub(crate) const EPOCH_RAISE: &str = "raising epochs is a restore's: no request lowers them \
     again, and epochs raised near the largest leave a later restore none to give";

/// Marks a request that carries the client token and not a separate member token: a handler
/// that refuses some of what a client may send on its route (a registration's `min_epoch`)
/// looks for it.
#[derive(Clone, Copy, Debug)]
pub struct ClientTokenOnly;

impl ClientTokenOnly {
    /// The 403 for what such a request may not do, with `why`.
    pub(crate) fn refusal(why: &str) -> ApiError {
        ApiError::Forbidden(format!(
            "{why}: it takes the member token (--member-token, METASERVER_MEMBER_TOKEN), not \
             the client token"
        ))
    }
}

/// Whether `path` is one of the members' own routes.
fn members_path(path: &str) -> bool {
    path.starts_with("/raft/") || path == crate::raw_path::PATH_RAW_REPLAY
}

/// Why a loopback node that knows `names` refuses a request addressed to `host` (`name` or
/// `name:port`), if it does (see [`Token::on_loopback`]).
fn refused_name(names: &[String], host: &str) -> Option<String> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    // A page is served from a domain its author holds, which has a dot: a name without
    // one (`localhost`, a host of `/etc/hosts`) is this machine's or its network's own.
    let allowed = name.parse::<std::net::Ipv4Addr>().is_ok()
        || (name.starts_with('[') && name.ends_with(']'))
        || !name.contains('.')
        || name.ends_with(".localhost")
        || names.iter().any(|n| n.eq_ignore_ascii_case(&name));
    (!allowed).then(|| {
        format!(
            "a node without --token that listens on loopback answers requests addressed to an IP \
             address, a name without a dot (localhost) or a member's host only, not to \
             {name:?}: a web page could otherwise reach it through a name of its own that \
             resolves to this machine"
        )
    })
}

/// Middleware: 401 `unauthorized` unless the path is open or the token matches (the member
/// token on the members' routes). A client's request loses the member headers (see the
/// module's comment).
pub async fn require_token(
    State(token): State<Token>,
    mut request: Request,
    next: Next,
) -> Response {
    // First, also on the open paths: a page must not read a tokenless node's metrics either.
    if let Some(why) = token.refuses_browser(request.headers(), request.uri()) {
        return ApiError::Forbidden(why).into_response();
    }
    let path = request.uri().path();
    if OPEN_PATHS.contains(&path) {
        return next.run(request).await;
    }
    if members_path(path) {
        if !token.accepts_member(request.headers()) {
            token.log_member_refusal(request.headers());
            return ApiError::Unauthorized.into_response();
        }
    } else if !token.accepts(request.headers()) {
        return ApiError::Unauthorized.into_response();
    } else if token.member.is_some() && !token.accepts_member(request.headers()) {
        if let Some(why) = takes_member_token(request.method(), path) {
            return ClientTokenOnly::refusal(why).into_response();
        }
        for name in &MEMBER_HEADERS {
            request.headers_mut().remove(name);
        }
        request.extensions_mut().insert(ClientTokenOnly);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn token_comparison() {
        let token = Token::new(Some("s3cret"));
        assert!(token.accepts(&headers("Bearer s3cret")));
        assert!(token.accepts(&headers("bearer s3cret")));
        assert!(!token.accepts(&headers("Basic s3cret")));
        assert!(!token.accepts(&headers("Bearer s3cre")));
        assert!(!token.accepts(&headers("Bearer s3cret2")));
        assert!(!token.accepts(&headers("Bearer")));
        assert!(!token.accepts(&HeaderMap::new()));
        assert_eq!(token.header_value().as_deref(), Some("Bearer s3cret"));
    }

    #[test]
    fn no_token_accepts_everything() {
        for token in [Token::new(None), Token::new(Some(""))] {
            assert!(!token.is_set());
            assert!(token.accepts(&HeaderMap::new()));
            assert!(token.header_value().is_none());
        }
    }

    #[test]
    fn debug_hides_the_secrets() {
        let token = Token::new(Some("s3cret")).with_member(Some("m3mber"));
        let shown = format!("{token:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("m3mber"),
            "{shown}"
        );
    }

    #[test]
    fn a_separate_member_token_opens_the_members_routes_alone() {
        let token = Token::new(Some("s3cret")).with_member(Some("m3mber"));
        assert!(token.accepts(&headers("Bearer s3cret")));
        assert!(token.accepts(&headers("Bearer m3mber")));
        assert!(!token.accepts(&headers("Bearer other")));
        assert!(token.accepts_member(&headers("Bearer m3mber")));
        assert!(!token.accepts_member(&headers("Bearer s3cret")));
        assert!(!token.accepts_member(&HeaderMap::new()));
        assert_eq!(token.header_value().as_deref(), Some("Bearer m3mber"));
        // Without one, the client token is the members' too.
        let token = Token::new(Some("s3cret"));
        assert!(token.accepts_member(&headers("Bearer s3cret")));
        assert!(!token.accepts_member(&headers("Bearer m3mber")));
        // A member token alone guards the members' routes; the others stay open.
        let token = Token::new(None).with_member(Some("m3mber"));
        assert!(token.accepts(&HeaderMap::new()));
        assert!(!token.accepts_member(&HeaderMap::new()));
        assert_eq!(token.header_value().as_deref(), Some("Bearer m3mber"));
    }

    #[test]
    fn the_requests_that_take_the_member_token() {
        use axum::http::Method;
        let takes = |method: &Method, path: &str| takes_member_token(method, path).is_some();
        assert!(takes(&Method::POST, "/v1/cluster/init"));
        assert!(takes(&Method::POST, "/v1/cluster/learners"));
        assert!(takes(&Method::PUT, "/v1/cluster/members/2"));
        assert!(takes(&Method::PUT, "/v1/cluster/epoch-floor"));
        assert!(takes(&Method::DELETE, "/v1/cluster/restore"));
        assert!(!takes(&Method::GET, "/v1/cluster/members/2"));
        assert!(!takes(&Method::DELETE, "/v1/cluster/learners/4"));
        assert!(!takes(&Method::PUT, "/v1/cluster/voters"));
        assert!(!takes(&Method::GET, "/v1/cluster"));
        assert!(!takes(&Method::PUT, "/v1/datanodes/7"));
    }

    #[test]
    fn a_node_without_a_token_refuses_what_web_pages_send() {
        let with = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            h
        };
        let path: axum::http::Uri = "/v1/cluster".parse().unwrap();
        let open = Token::new(None);
        assert!(open
            .refuses_browser(&with(&[("host", "a.example:1")]), &path)
            .is_none());
        let why = open.refuses_browser(&with(&[("origin", "http://evil.example")]), &path);
        assert!(why.unwrap().contains("Origin"));
        let lo = Token::new(None).on_loopback(vec!["meta-1.internal".into()]);
        for host in [
            "127.0.0.1:7101",
            "[::1]:7101",
            "localhost:7101",
            "LocalHost",
            "a.localhost:1",
            "meta-1:7101",
            "t",
            "meta-1.internal.:7101",
        ] {
            assert!(
                lo.refuses_browser(&with(&[("host", host)]), &path)
                    .is_none(),
                "{host}"
            );
        }
        assert!(
            lo.refuses_browser(&HeaderMap::new(), &path).is_none(),
            "no host"
        );
        let why = lo.refuses_browser(&with(&[("host", "rebind.evil.example:7101")]), &path);
        assert!(why.unwrap().contains("\"rebind.evil.example\""));
        // A second Host header, or an absolute-form request's authority (which wins over the
        // Host header), addressed to such a name is refused too.
        let mut two = with(&[("host", "127.0.0.1:7101")]);
        two.append(
            header::HOST,
            HeaderValue::from_static("rebind.evil.example"),
        );
        assert!(lo.refuses_browser(&two, &path).is_some());
        let absolute: axum::http::Uri = "http://rebind.evil.example/v1/cluster".parse().unwrap();
        let local = with(&[("host", "127.0.0.1:7101")]);
        assert!(lo.refuses_browser(&local, &absolute).is_some());
        let absolute: axum::http::Uri = "http://127.0.0.1:7101/v1/cluster".parse().unwrap();
        assert!(lo.refuses_browser(&local, &absolute).is_none());
        // With a token, a page cannot present it: nothing is refused for this.
        let set = Token::new(Some("s3cret")).on_loopback(Vec::new());
        let page = with(&[("origin", "http://x"), ("host", "rebind.evil.example")]);
        assert!(set.refuses_browser(&page, &path).is_none());
    }

    #[test]
    fn the_members_routes() {
        assert!(members_path("/raft/append"));
        assert!(members_path("/raft/room"));
        assert!(members_path("/v1/raw-replay"));
        assert!(!members_path("/v1/raft/x"));
        assert!(!members_path("/v1/cluster"));
        assert!(!members_path("/raft"));
    }
}
