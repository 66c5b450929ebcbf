//! Bearer-token authentication for every route except the probes and metrics.
//!
//! With a token configured, a request needs `Authorization: Bearer <token>`; the token is
//! compared in constant time. `/healthz`, `/readyz` and `/metrics` are always open. The Raft
//! RPCs between nodes carry the same token.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// Paths served without a token.
pub const OPEN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// The shared secret, if any. Cloning is cheap.
#[derive(Clone, Default)]
pub struct Token(Option<Arc<str>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(_) => f.write_str("Token(<set>)"),
            None => f.write_str("Token(<none>)"),
        }
    }
}

impl Token {
    /// A token that requests must present; `None` or an empty string disables authentication.
    pub fn new(token: Option<&str>) -> Self {
        Token(token.filter(|t| !t.is_empty()).map(Arc::from))
    }

    /// Whether authentication is on.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The `Authorization` header value to send to peers, if a token is set.
    pub fn header_value(&self) -> Option<String> {
        self.0.as_ref().map(|t| format!("Bearer {t}"))
    }

    /// Whether the headers carry the right token (always true without a token).
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = &self.0 else {
            return true;
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
}

/// Middleware: 401 `unauthorized` unless the path is open or the token matches.
pub async fn require_token(State(token): State<Token>, request: Request, next: Next) -> Response {
    if token.is_set()
        && !OPEN_PATHS.contains(&request.uri().path())
        && !token.accepts(request.headers())
    {
        return ApiError::Unauthorized.into_response();
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
    fn debug_hides_the_secret() {
        assert!(!format!("{:?}", Token::new(Some("s3cret"))).contains("s3cret"));
    }
}
