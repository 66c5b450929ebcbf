//! Extractors whose rejections are [`ApiError`]s, so that a bad path, query or body answers with
//! the same JSON error shape as every other failure.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{Method, Uri};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::error::ApiError;
use crate::request::ObjectOnly;

/// A JSON body parsed with serde (types declare `deny_unknown_fields`).
///
/// Unlike axum's `Json`, no content type is required, so `curl -d` works as written.
#[derive(Debug)]
pub struct Json<T>(pub T);

/// Path parameters; a value that does not parse (for example a negative id) is `invalid_path`.
#[derive(Debug)]
pub struct Path<T>(pub T);

/// A numeric id in a path (a datanode, shard or node id): canonical decimal, without sign or
/// leading zeros, so that each id has one spelling (`/v1/shards/007` is refused, not read as 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id(pub u64);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_id(&text).map(Id).map_err(serde::de::Error::custom)
    }
}

/// Parses a canonical decimal id (see [`Id`]); the error says what is wrong with `text`.
pub fn parse_id(text: &str) -> Result<u64, String> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || (text.len() > 1 && text.starts_with('0')) {
        return Err(format!(
            "{text:?} is not an id: ids are decimal numbers without sign or leading zeros"
        ));
    }
    text.parse()
        .map_err(|_| format!("{text} is larger than the largest id ({})", u64::MAX))
}

/// The offset of the first `%` in `query` (or a path) that is not followed by two hex digits,
/// if any.
pub(crate) fn malformed_escape(query: &str) -> Option<usize> {
    let bytes = query.as_bytes();
    (0..bytes.len()).find(|&i| {
        bytes[i] == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// Query parameters; an unknown or repeated parameter, or a value that does not parse, is
/// `invalid_query` (numbers are read as text and refused by their validation with their own
/// codes: `request/query.rs`).
#[derive(Debug)]
pub struct Query<T>(pub T);

/// For routes that take no query parameters: any query string is `invalid_query`, so that a
/// parameter a client counts on (a condition on a delete, say) is never silently ignored.
#[derive(Debug)]
pub struct NoQuery;

/// The raw body bytes, limited like every body.
#[derive(Debug)]
pub struct RawBody(pub Bytes);

/// For routes that take no body: a body of one byte or more is `unexpected_body`, so that what
/// a client put there (an epoch meant to fence a delete, say) is never silently ignored.
#[derive(Debug)]
pub struct NoBody;

/// Parses a JSON object, telling malformed JSON (`malformed_json`) from a well-formed document
/// of the wrong shape (`invalid_body`: not an object, wrong types, unknown or missing fields,
/// numbers out of range).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice::<ObjectOnly<T>>(bytes)
        .map(|o| o.0)
        .map_err(|e| {
            use serde_json::error::Category;
            // The typed read stops at the first field it refuses (an unknown one, say), before
            // it reads the rest: on failure, the whole document's syntax is read once more, so
            // that `{"a":` is malformed JSON, not an unknown field. A number too large for any
            // type (`1e400`) is well-formed JSON of the wrong shape.
            let e = match e.classify() {
                Category::Data => match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    Err(syntax) if !out_of_range(&syntax) => syntax,
                    _ => e,
                },
                _ => e,
            };
            match e.classify() {
                _ if out_of_range(&e) => ApiError::invalid(
                    "invalid_body",
                    format!(
                        "invalid request body: {e} (numbers here are whole, from 0 to \
                         18446744073709551615)"
                    ),
                ),
                Category::Data => {
                    // serde_json reads an integer past u64 as a float, and says so; say why.
                    let hint = if e.to_string().contains("floating point") {
                        " (numbers here are whole, from 0 to 18446744073709551615)"
                    } else {
                        ""
                    };
                    ApiError::invalid("invalid_body", format!("invalid request body: {e}{hint}"))
                }
                Category::Syntax | Category::Eof | Category::Io => {
                    ApiError::invalid("malformed_json", format!("malformed JSON: {e}"))
                }
            }
        })
}

/// Whether `e` is serde_json's refusal of a number no type holds (a float past `f64`).
fn out_of_range(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("number out of range")
}

/// Maps a failure to buffer a body: too large is 413 `body_too_large`, anything else 400.
pub fn body_error(status: axum::http::StatusCode, text: String) -> ApiError {
    if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(
            "body_too_large",
            format!(
                "request body is larger than {} bytes",
                crate::limits::MAX_BODY_BYTES
            ),
        )
    } else {
        ApiError::invalid(
            "bad_body",
            format!("could not read the request body: {text}"),
        )
    }
}

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|r| body_error(r.status(), r.body_text()))
    }
}

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let RawBody(bytes) = RawBody::from_request(req, state).await?;
        if bytes.is_empty() {
            return Ok(NoBody);
        }
        Err(ApiError::invalid(
            "unexpected_body",
            format!(
                "this route takes no request body, got {} bytes: its parameters go in the path \
                 and the query string",
                bytes.len()
            ),
        ))
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let RawBody(bytes) = RawBody::from_request(req, state).await?;
        parse_json(&bytes).map(Json)
    }
}

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // Only ids are path parameters here, and the routes' fixed parts hold no `%`: any
        // escape spells an id a second way (`/v1/shards/%31` for `/v1/shards/1`).
        if parts.uri.path().contains('%') {
            return Err(ApiError::invalid(
                "invalid_path",
                format!(
                    "invalid path {:?}: ids are decimal numbers without sign, leading zeros \
                     or %-escapes",
                    parts.uri.path()
                ),
            ));
        }
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::invalid(
                "invalid_path",
                format!(
                    "invalid path {:?}: {}",
                    parts.uri.path(),
                    path_error(&rejection)
                ),
            )),
        }
    }
}

/// What is wrong with a path's parameters: [`Id`]'s own message where it refused one, without
/// the wrapping of axum's rejection text ("Invalid URL: Cannot parse `id` with value ...").
fn path_error(rejection: &axum::extract::rejection::PathRejection) -> String {
    use axum::extract::path::ErrorKind;
    use axum::extract::rejection::PathRejection;
    match rejection {
        PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
            ErrorKind::DeserializeError { message, .. } | ErrorKind::Message(message) => {
                message.clone()
            }
            kind => kind.to_string(),
        },
        other => other.body_text(),
    }
}

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        // A `%` that does not start an escape is taken literally by the form decoder, so
        // `?prefix=%2` would ask for the prefix "%2": refused, like any malformed escape.
        if let Some(at) = malformed_escape(query) {
            return Err(ApiError::invalid(
                "invalid_query",
                format!("query string {query:?} has a malformed %-escape at byte {at}"),
            ));
        }
        // The form decoder turns bytes that are not UTF-8 into U+FFFD, so `?prefix=%ff` would
        // silently ask for another prefix: such a query is refused instead.
        let plus_as_space = query.replace('+', " ");
        if percent_encoding::percent_decode_str(&plus_as_space)
            .decode_utf8()
            .is_err()
        {
            return Err(ApiError::invalid(
                "invalid_query",
                format!("query string {query:?} does not decode to UTF-8"),
            ));
        }
        // An empty query string means "no parameters", which the struct's defaults handle.
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| {
                ApiError::invalid(
                    "invalid_query",
                    format!("invalid query string {query:?}: {}", rejection.body_text()),
                )
            })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for NoQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.uri.query() {
            Some(query) if !query.is_empty() => Err(ApiError::invalid(
                "invalid_query",
                format!("this route takes no query parameters, got {query:?}"),
            )),
            _ => Ok(NoQuery),
        }
    }
}

/// Fallback for paths that no route matches. `/v1/kv/` (a key-value path whose key is empty,
/// which the key route's wildcard cannot match) is a bad key rather than an unknown route.
pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    if uri.path() == "/v1/kv/" {
        return ApiError::invalid("invalid_key", "key must not be empty");
    }
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

/// Fallback for a known path with a method it does not serve.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    tracing::debug!(%method, path = uri.path(), "method not allowed");
    ApiError::MethodNotAllowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[allow(dead_code)]
        id: u64,
    }

    fn code_of(result: Result<Body, ApiError>) -> &'static str {
        result.expect_err("must fail").code()
    }

    #[test]
    fn malformed_escapes_are_found() {
        for ok in ["", "prefix=a%2Fb", "a=%41%42", "prefix=100%25"] {
            assert_eq!(malformed_escape(ok), None, "{ok:?}");
        }
        assert_eq!(malformed_escape("prefix=%2"), Some(7));
        assert_eq!(malformed_escape("prefix=%zz"), Some(7));
        assert_eq!(malformed_escape("a=1&b=%"), Some(6));
        assert_eq!(malformed_escape("a=%4g"), Some(2));
    }

    #[test]
    fn ids_have_one_spelling() {
        assert_eq!(parse_id("0"), Ok(0));
        assert_eq!(parse_id("7"), Ok(7));
        assert_eq!(parse_id("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "", "007", "00", "+7", "-7", " 7", "7 ", "0x7", "1e3", "7.0", "٣",
        ] {
            assert!(parse_id(bad).is_err(), "{bad:?} accepted");
        }
        let err = parse_id("18446744073709551616").unwrap_err();
        assert!(err.contains("larger than the largest id"), "{err}");
    }

    /// The message of the answer to `GET uri` from a router whose routes take one and two ids.
    async fn path_message(uri: &str) -> (u16, String) {
        use axum::routing::get;
        use tower::ServiceExt;
        async fn one(Path(Id(_)): Path<Id>) {}
        async fn two(Path((Id(_), Id(_))): Path<(Id, Id)>) {}
        let app = axum::Router::new()
            .route("/d/{id}", get(one))
            .route("/d/{id}/s/{shard}", get(two));
        let request = axum::http::Request::get(uri)
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = app.oneshot(request).await.unwrap();
        let status = answer.status().as_u16();
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "invalid_path", "{json}");
        (
            status,
            json["error"]["message"].as_str().unwrap().to_owned(),
        )
    }

    #[tokio::test]
    async fn path_errors_name_the_path_and_what_is_wrong_with_it() {
        let expect = [
            (
                "/d/-1",
                r#"invalid path "/d/-1": "-1" is not an id: ids are decimal numbers without sign or leading zeros"#,
            ),
            (
                "/d/7/s/007",
                r#"invalid path "/d/7/s/007": "007" is not an id: ids are decimal numbers without sign or leading zeros"#,
            ),
            (
                "/d/18446744073709551616",
                r#"invalid path "/d/18446744073709551616": 18446744073709551616 is larger than the largest id (18446744073709551615)"#,
            ),
        ];
        for (uri, message) in expect {
            assert_eq!(path_message(uri).await, (400, message.to_owned()), "{uri}");
        }
        let (status, escaped) = path_message("/d/%37").await;
        assert_eq!(status, 400);
        assert!(escaped.contains("or %-escapes"), "{escaped}");
    }

    #[test]
    fn json_errors_are_classified() {
        assert!(parse_json::<Body>(br#"{"id":1}"#).is_ok());
        assert_eq!(code_of(parse_json(b"{\"id\":")), "malformed_json");
        assert_eq!(code_of(parse_json(b"")), "malformed_json");
        assert_eq!(code_of(parse_json(b"not json")), "malformed_json");
        assert_eq!(code_of(parse_json(br#"{"id":"1"}"#)), "invalid_body");
        assert_eq!(code_of(parse_json(br#"{"id":-1}"#)), "invalid_body");
        assert_eq!(code_of(parse_json(br#"{"id":1.5}"#)), "invalid_body");
        let past = parse_json::<Body>(br#"{"id":18446744073709551616}"#).unwrap_err();
        assert_eq!(past.code(), "invalid_body");
        assert!(
            past.to_string().contains("numbers here are whole"),
            "{past}"
        );
        assert_eq!(code_of(parse_json(br#"{"id":1,"x":2}"#)), "invalid_body");
        assert_eq!(code_of(parse_json(br#"{}"#)), "invalid_body");
        assert_eq!(code_of(parse_json(br#"[1]"#)), "invalid_body");
    }
}
