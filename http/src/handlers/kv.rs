//! `/v1/kv...`: the small key-value space with compare-and-swap on per-key revisions.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use meta_consensus::{Command, CommandResult};

use super::{listing_error, unexpected};
use crate::auth::ClientTokenOnly;
use crate::error::ApiError;
use crate::extract::{malformed_escape, NoBody, Query, RawBody};
use crate::follower_read::ReplayedReadIndex;
use crate::request::{
    validate_key, validate_new_key, validate_value, KvListQuery, KvWriteQuery, ReadQuery,
};
use crate::response::{KvKeyPage, KvKeyView, KvWritten};
use crate::state::SharedState;
use crate::writer::Writer;

/// Response header carrying a key's revision.
pub const X_REVISION: &str = "x-revision";

/// Response header carrying the history a key's revision counts in (the watch's `history`):
/// a write that gives it back as `history=` is refused in a cluster restored from a backup
/// since, where the revision could match a rolled-back value.
pub const X_HISTORY: &str = "x-history";

/// Refuses a write whose `history` is not this cluster's ([`super::check_history`]).
fn check_history(state: &SharedState, query: &KvWriteQuery) -> Result<(), ApiError> {
    super::check_history(
        &state.node,
        query.history()?,
        "revisions",
        "read the key again",
    )
}

/// The key of `/v1/kv/{*key}`, percent-decoded, valid UTF-8 and within the key rules.
#[derive(Debug)]
pub struct KeyPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // The path decoder keeps a `%` that starts no escape as it is, which would give the key
        // `a%zz` a second spelling beside `a%25zz`: refused, as in query strings.
        if let Some(at) = malformed_escape(parts.uri.path()) {
            return Err(ApiError::invalid(
                "invalid_key",
                format!(
                    "path {:?} has a malformed %-escape at byte {at} (write a % in a key as %25)",
                    parts.uri.path()
                ),
            ));
        }
        let key = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|r| {
                ApiError::invalid(
                    "invalid_key",
                    format!("key is not valid percent-encoded UTF-8: {}", r.body_text()),
                )
            })?
            .0;
        validate_key(&key)?;
        Ok(KeyPath(key))
    }
}

/// The 404 of key `key`; one that no write can make now says so (only keys written before the
/// rule on "." and ".." segments may hold one, and stay readable and deletable).
fn absent(key: &str) -> ApiError {
    let why = match validate_new_key(key) {
        Ok(()) => String::new(),
        Err(e) => format!(" ({e}, so no write makes it)"),
    };
    ApiError::NotFound(format!("key {key:?} does not exist{why}"))
}

fn written(
    state: &SharedState,
    result: CommandResult,
    key: &str,
    expected: Option<u64>,
) -> Result<KvWritten, ApiError> {
    let history = state.node.history_name();
    match result {
        CommandResult::Put { revision } => Ok(KvWritten { revision, history }),
        CommandResult::Deleted {
            existed: true,
            revision,
        } => Ok(KvWritten { revision, history }),
        CommandResult::Deleted { existed: false, .. } => Err(absent(key)),
        CommandResult::RevisionMismatch { current } => Err(ApiError::RevisionMismatch {
            key: key.to_owned(),
            expected: expected.unwrap_or_default(),
            current,
        }),
        CommandResult::RestoreUnderWay { claimed_at } => Err(ApiError::Restoring(format!(
            "a restore into the cluster (claimed at index {claimed_at}) has not ended: keys are \
             written and deleted once it ends, by the restore alone until then (one cut off \
             part way ends with `metaserver snapshot end-restore`, or is run again into fresh \
             data dirs)"
        ))),
        CommandResult::NotRestoring => Err(ApiError::Conflict(format!(
            "key {key:?} was not written: restore=true writes a restore's keys, and no restore \
             is under way in the cluster (it holds no restore mark: the restore was ended, by \
             hand say, or did not mark the cluster)"
        ))),
        other => Err(unexpected(other)),
    }
}

/// Why a restore's key write takes the member token, when the node has a separate one.
const RESTORE_WRITE: &str = "a restore's key write (restore=true) goes on while every other \
     waits for the restore to end";

/// `PUT /v1/kv/{key}?if_revision=N&history=H&restore=B` with the value as body (at most 1
/// MiB). `restore=true` (a restore's write of a key it creates, which takes a separate member
/// token if the node has one) goes on while a restore that holds keys back runs; every other
/// key write is refused then, 503 `restoring`.
pub async fn put(
    State(state): State<SharedState>,
    writer: Writer,
    client_only: Option<axum::Extension<ClientTokenOnly>>,
    KeyPath(key): KeyPath,
    Query(query): Query<KvWriteQuery>,
    RawBody(value): RawBody,
) -> Result<axum::Json<KvWritten>, ApiError> {
    let mut if_revision = query.if_revision()?;
    let restore = query.restore()?;
    validate_new_key(&key)?;
    validate_value(&value)?;
    check_history(&state, &query)?;
    if restore && client_only.is_some() {
        return Err(ClientTokenOnly::refusal(RESTORE_WRITE));
    }
    let command = match restore {
        true => {
            if_revision = Some(0);
            Command::RestorePut {
                key: key.clone(),
                value: value.to_vec(),
            }
        }
        false => Command::Put {
            key: key.clone(),
            value: value.to_vec(),
            if_revision,
        },
    };
    let result = writer.write(command).await?.result;
    written(&state, result, &key, if_revision).map(axum::Json)
}

/// `DELETE /v1/kv/{key}?if_revision=N&history=H`; 404 if the key does not exist.
pub async fn delete(
    State(state): State<SharedState>,
    writer: Writer,
    KeyPath(key): KeyPath,
    Query(query): Query<KvWriteQuery>,
    _: NoBody,
) -> Result<axum::Json<KvWritten>, ApiError> {
    let if_revision = query.if_revision()?;
    if query.restore()? {
        return Err(ApiError::invalid(
            "invalid_argument",
            "restore=true is for a restore's key writes: a restore deletes no key",
        ));
    }
    check_history(&state, &query)?;
    let result = writer
        .write(Command::Delete {
            key: key.clone(),
            if_revision,
        })
        .await?
        .result;
    written(&state, result, &key, if_revision).map(axum::Json)
}

/// `GET /v1/kv/{key}`: the value as body, its revision in `X-Revision` and the history that
/// counts in `X-History`; 404 if absent.
pub async fn get(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    KeyPath(key): KeyPath,
    Query(query): Query<ReadQuery>,
    _: NoBody,
) -> Result<Response, ApiError> {
    let consistency = query.validate()?;
    match state
        .node
        .kv_get(state.read_consistency(consistency, replayed).await?, &key)
        .await?
    {
        Some(entry) => {
            let mut answer = (
                [
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    ),
                    (
                        header::HeaderName::from_static(X_REVISION),
                        HeaderValue::from(entry.revision),
                    ),
                ],
                entry.value,
            )
                .into_response();
            if let Some(history) = state.node.history_name() {
                if let Ok(value) = HeaderValue::from_str(&history) {
                    answer
                        .headers_mut()
                        .insert(header::HeaderName::from_static(X_HISTORY), value);
                }
            }
            Ok(answer)
        }
        None => Err(absent(&key)),
    }
}

/// `GET /v1/kv?prefix=&after=&limit=`: keys and revisions in byte order.
pub async fn list(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    Query(query): Query<KvListQuery>,
    _: NoBody,
) -> Result<axum::Json<KvKeyPage>, ApiError> {
    let (prefix, page, consistency) = query.validate()?;
    let after = page.after.as_deref();
    let result = state
        .node
        .kv_list(
            state.read_consistency(consistency, replayed).await?,
            &prefix,
            after,
            page.limit,
        )
        .await
        .map_err(listing_error(after))?;
    Ok(axum::Json(KvKeyPage {
        keys: result
            .items
            .into_iter()
            .map(|k| KvKeyView {
                key: k.key,
                revision: k.revision,
            })
            .collect(),
        next: result.next,
        history: state.node.history_name(),
    }))
}
