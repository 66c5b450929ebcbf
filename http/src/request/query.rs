//! Query parameters of the reads, listings and watches: consistency, pages, cursors, key
//! prefixes and watch filters, with their validation.

use serde::Deserialize;

use meta_consensus::{ChangeFilter, DatanodeState};

use crate::error::ApiError;
use crate::limits::{
    DEFAULT_PAGE_LIMIT, DEFAULT_WATCH_WAIT_MS, MAX_CURSOR_BYTES, MAX_KEY_BYTES, MAX_PAGE_LIMIT,
    MAX_WATCH_WAIT_MS,
};

/// Query of single-item reads: `?consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    /// `linearizable` (default) or `local`.
    pub consistency: Option<String>,
}

/// Query of `GET /v1/liveness`: `?state=` keeps the datanodes in that state; `?after=` and
/// `?limit=` page them by id, as `GET /v1/datanodes` does.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LivenessQuery {
    /// `alive`, `down` or `unknown`; all when absent.
    pub state: Option<String>,
    /// Cursor from the previous page's `next`.
    pub after: Option<String>,
    /// Page size, 1 to 10,000 (default 1,000).
    pub limit: Option<QueryNumber>,
}

impl LivenessQuery {
    /// The state asked for, if any; the id the page starts after, if any; the page size.
    pub fn validate(self) -> Result<(Option<DatanodeState>, Option<u64>, usize), ApiError> {
        let state = parse_state(self.state.as_deref())?;
        let limit = parse_limit(self.limit.as_ref())?;
        let after = match parse_cursor(self.after)? {
            None => None,
            Some(cursor) => Some(id_cursor(&cursor).ok_or_else(|| invalid_cursor(&cursor))?),
        };
        Ok((state, after, limit))
    }
}

/// Parses `?state=`.
fn parse_state(state: Option<&str>) -> Result<Option<DatanodeState>, ApiError> {
    match state {
        None => Ok(None),
        Some("alive") => Ok(Some(DatanodeState::Alive)),
        Some("down") => Ok(Some(DatanodeState::Down)),
        Some("unknown") => Ok(Some(DatanodeState::Unknown)),
        Some(other) => Err(ApiError::invalid(
            "invalid_state",
            format!("state must be \"alive\", \"down\" or \"unknown\", not {other:?}"),
        )),
    }
}

/// Query of shard listings: `?after=&limit=&consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Cursor from the previous page's `next`.
    pub after: Option<String>,
    /// Page size, 1 to 10,000 (default 1,000).
    pub limit: Option<QueryNumber>,
    /// `linearizable` (default) or `local`.
    pub consistency: Option<String>,
}

/// A number in a query string, read as text so that one not written in canonical decimal (no
/// sign, no leading zeros, as ids in paths: `?after=007` is refused, not read as 7) is refused
/// with its parameter's own code ([`QueryNumber::parse`]), as an out-of-range value is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct QueryNumber(String);

impl QueryNumber {
    /// The number, or 400 `code` naming parameter `name`.
    pub fn parse(&self, name: &str, code: &'static str) -> Result<u64, ApiError> {
        crate::extract::parse_id(&self.0).map_err(|_| {
            let shown: String = self.0.chars().take(64).collect();
            ApiError::invalid(
                code,
                // Its range is checked once it parses, with a message that names it.
                match self.0.bytes().all(|b| b.is_ascii_digit()) && !self.0.is_empty() {
                    true if self.0.len() > 1 && self.0.starts_with('0') => {
                        format!("{name}={shown:?} has a leading zero: write the number without it")
                    }
                    true => format!("{name}={shown:?} is too large (past 2^64 - 1)"),
                    false => format!(
                        "{name}={shown:?} is not a whole decimal number (digits only, without \
                         sign or leading zeros)"
                    ),
                },
            )
        })
    }
}

/// `value` of parameter `name` parsed ([`QueryNumber::parse`]), if given.
fn number(
    value: Option<&QueryNumber>,
    name: &str,
    code: &'static str,
) -> Result<Option<u64>, ApiError> {
    value.map(|v| v.parse(name, code)).transpose()
}

/// Query of `GET /v1/kv`: `?prefix=&after=&limit=&consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvListQuery {
    /// Only keys starting with this prefix.
    pub prefix: Option<String>,
    /// Cursor from the previous page's `next`.
    pub after: Option<String>,
    /// Page size, 1 to 10,000 (default 1,000).
    pub limit: Option<QueryNumber>,
    /// `linearizable` (default) or `local`.
    pub consistency: Option<String>,
}

/// Query of `GET /v1/watch`: `?after=&datanode=&prefix=&limit=&wait_ms=&consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// The log index the client has seen the changes up to (the `index` of its previous
    /// answer); none: answer at once with the index to start from.
    pub after: Option<QueryNumber>,
    /// Only the registry changes of this datanode.
    pub datanode: Option<QueryNumber>,
    /// Only the key-value changes of keys starting with this prefix.
    pub prefix: Option<String>,
    /// Most events in the answer, 1 to 10,000 (default 1,000).
    pub limit: Option<QueryNumber>,
    /// How long to wait for a change, in milliseconds (default 30,000, at most 55,000).
    pub wait_ms: Option<QueryNumber>,
    /// `linearizable` (default), `lease` or `local`.
    pub consistency: Option<String>,
    /// The history `after` counts in (the `history` of the page it came from): refused with
    /// 410 if this cluster's is another (a cluster restored from a backup counts from 1
    /// again, so an old index would skip its changes silently).
    pub history: Option<String>,
}

/// A validated watch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRequest {
    pub after: Option<u64>,
    /// The history `after` counts in, 16 lowercase hex digits, if the client said.
    pub history: Option<String>,
    pub filter: ChangeFilter,
    pub limit: usize,
    pub wait: std::time::Duration,
    pub consistency: ReadConsistency,
}

/// Query of key-value writes: `?if_revision=&history=&restore=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvWriteQuery {
    /// Compare-and-swap: the key's expected revision; 0 = must not exist.
    pub if_revision: Option<QueryNumber>,
    /// `true`: the write is a restore's (it takes the member token, and the key must not
    /// exist), which alone go on while a restore that holds keys back runs.
    pub restore: Option<String>,
    /// The history the revision counts in (the `x-history` of the read it came from): refused
    /// with 410 if this cluster's is another (a cluster restored from a backup counts
    /// revisions again, so an old revision could match a rolled-back value).
    pub history: Option<String>,
}

impl KvWriteQuery {
    /// The revision the write is conditional on, if any.
    pub fn if_revision(&self) -> Result<Option<u64>, ApiError> {
        number(self.if_revision.as_ref(), "if_revision", "invalid_argument")
    }

    /// Whether the write is a restore's (`restore=true`; `false` or absent: not). A restore's
    /// write creates its key: an `if_revision` other than 0 is refused with it.
    pub fn restore(&self) -> Result<bool, ApiError> {
        let restore = match self.restore.as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                let shown: String = other.chars().take(64).collect();
                return Err(ApiError::invalid(
                    "invalid_argument",
                    format!("restore={shown:?} is neither true nor false"),
                ));
            }
        };
        if restore && !matches!(self.if_revision()?, None | Some(0)) {
            return Err(ApiError::invalid(
                "invalid_argument",
                "a restore's write creates its key: if_revision, if given with restore=true, \
                 is 0",
            ));
        }
        Ok(restore)
    }

    /// The history the write's revision counts in, if the client said (checked as a name).
    pub fn history(&self) -> Result<Option<&str>, ApiError> {
        if let Some(history) = &self.history {
            check_history_name(history, "a key's read or write")?;
        }
        Ok(self.history.as_deref())
    }
}

/// Refuses `history` unless it is a history name: 16 lowercase hex digits, as `source` gives.
fn check_history_name(history: &str, source: &str) -> Result<(), ApiError> {
    let valid = history.len() == 16
        && history
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match valid {
        true => Ok(()),
        false => Err(ApiError::invalid(
            "invalid_argument",
            format!(
                "history={history:?} is not a history name (16 lowercase hex digits, the \
                 `history` of {source})"
            ),
        )),
    }
}

/// Query of `DELETE /v1/datanodes/{id}/shards/{shard}`: `?epoch=` names the incarnation that
/// deregisters (fenced when it is not the current one).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeregisterQuery {
    pub epoch: Option<QueryNumber>,
}

impl DeregisterQuery {
    /// The incarnation that deregisters, if named.
    pub fn epoch(&self) -> Result<Option<u64>, ApiError> {
        number(self.epoch.as_ref(), "epoch", "invalid_epoch")
    }
}

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadConsistency {
    /// Reflects every write acknowledged before the read began (answered by the leader).
    #[default]
    Linearizable,
    /// This node's applied state, possibly stale; never forwarded.
    Local,
    /// Linearizable while the leader's lease holds, without a round to the followers (answered
    /// by the leader).
    Lease,
}

/// A validated pagination request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// Resume after this cursor; `None` starts at the beginning.
    pub after: Option<String>,
    /// Page size.
    pub limit: usize,
}

/// Parses `?consistency=`.
pub fn parse_consistency(value: Option<&str>) -> Result<ReadConsistency, ApiError> {
    match value {
        None | Some("linearizable") => Ok(ReadConsistency::Linearizable),
        Some("local") => Ok(ReadConsistency::Local),
        Some("lease") => Ok(ReadConsistency::Lease),
        Some(other) => Err(ApiError::invalid(
            "invalid_consistency",
            format!("consistency must be \"linearizable\", \"lease\" or \"local\", not {other:?}"),
        )),
    }
}

/// Validates `?limit=` (default 1,000, 1 to 10,000).
pub fn parse_limit(limit: Option<&QueryNumber>) -> Result<usize, ApiError> {
    let Some(limit) = limit else {
        return Ok(DEFAULT_PAGE_LIMIT);
    };
    match crate::extract::parse_id(&limit.0) {
        Ok(n) if (1..=MAX_PAGE_LIMIT as u64).contains(&n) => Ok(n as usize),
        _ => {
            let shown: String = limit.0.chars().take(64).collect();
            Err(ApiError::invalid(
                "invalid_limit",
                format!(
                    "limit must be a decimal number from 1 to {MAX_PAGE_LIMIT} without sign or \
                     leading zeros, not {shown:?}"
                ),
            ))
        }
    }
}

/// Validates `?after=`: a cursor is printable ASCII of bounded length (the registry checks the
/// rest and answers `invalid_cursor` too). An empty one is refused, not read as "from the start":
/// a client that sends the last page's `null` as an empty string would otherwise list from the
/// start again, for ever.
pub fn parse_cursor(after: Option<String>) -> Result<Option<String>, ApiError> {
    match after {
        None => Ok(None),
        Some(cursor) if cursor.is_empty() => Err(ApiError::invalid(
            "invalid_cursor",
            "the cursor is empty (after=): leave after out to start at the first page; the last \
             page's next is null, and there is no page after it",
        )),
        Some(cursor) => {
            if cursor.len() > MAX_CURSOR_BYTES || !cursor.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid_cursor(&cursor));
            }
            Ok(Some(cursor))
        }
    }
}

/// The error for a cursor that is not one this server handed out.
/// The datanode id a datanode listing's cursor names (16 hex digits, as `next` gives it).
fn id_cursor(cursor: &str) -> Option<u64> {
    (cursor.len() == 16
        && cursor
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    .then(|| u64::from_str_radix(cursor, 16).ok())
    .flatten()
}

/// The cursor of a page of datanodes that ended at `id` (`?after=` reads it back).
pub fn id_cursor_of(id: u64) -> String {
    format!("{id:016x}")
}

pub fn invalid_cursor(cursor: &str) -> ApiError {
    let shown: String = cursor.chars().take(64).collect();
    ApiError::invalid(
        "invalid_cursor",
        format!("cursor {shown:?} is not a cursor returned by this API"),
    )
}

impl PageQuery {
    /// Validates the query into a page request and a consistency.
    pub fn validate(self) -> Result<(PageRequest, ReadConsistency), ApiError> {
        let consistency = parse_consistency(self.consistency.as_deref())?;
        let limit = parse_limit(self.limit.as_ref())?;
        let after = parse_cursor(self.after)?;
        Ok((PageRequest { after, limit }, consistency))
    }
}

impl ReadQuery {
    /// Validates the consistency choice.
    pub fn validate(&self) -> Result<ReadConsistency, ApiError> {
        parse_consistency(self.consistency.as_deref())
    }
}

impl KvListQuery {
    /// Validates into (prefix, page, consistency).
    pub fn validate(self) -> Result<(String, PageRequest, ReadConsistency), ApiError> {
        let consistency = parse_consistency(self.consistency.as_deref())?;
        let limit = parse_limit(self.limit.as_ref())?;
        let after = parse_cursor(self.after)?;
        let prefix = parse_prefix(self.prefix.unwrap_or_default())?;
        Ok((prefix, PageRequest { after, limit }, consistency))
    }
}

/// Validates a key prefix: at most [`MAX_KEY_BYTES`], no control characters.
fn parse_prefix(prefix: String) -> Result<String, ApiError> {
    if prefix.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(
            "invalid_key",
            format!("prefix is longer than {MAX_KEY_BYTES} bytes"),
        ));
    }
    if prefix.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "invalid_key",
            "prefix contains control characters",
        ));
    }
    Ok(prefix)
}

impl WatchQuery {
    /// Validates the query: at most one filter, a limit and a wait in range.
    pub fn validate(self) -> Result<WatchRequest, ApiError> {
        let consistency = parse_consistency(self.consistency.as_deref())?;
        let limit = parse_limit(self.limit.as_ref())?;
        let datanode = number(self.datanode.as_ref(), "datanode", "invalid_argument")?;
        let after = number(self.after.as_ref(), "after", "invalid_argument")?;
        let filter = match (datanode, self.prefix) {
            (None, None) => ChangeFilter::All,
            (Some(id), None) => ChangeFilter::Datanode(id),
            (None, Some(p)) => ChangeFilter::KeyPrefix(parse_prefix(p)?),
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "invalid_query",
                    "give datanode= (its registry changes) or prefix= (key changes), not both",
                ))
            }
        };
        // No log reaches this index; a watcher told to go on from it would wait for ever (a
        // local watch cannot ask the leader for the cluster's newest index).
        if let Some(after) = after.filter(|a| *a > meta_consensus::rpc_bounds::MAX_INDEX) {
            return Err(ApiError::invalid(
                "invalid_argument",
                format!(
                    "after={after} is past any log index (at most {})",
                    meta_consensus::rpc_bounds::MAX_INDEX
                ),
            ));
        }
        let wait_ms = number(self.wait_ms.as_ref(), "wait_ms", "invalid_wait")?
            .unwrap_or(DEFAULT_WATCH_WAIT_MS);
        if wait_ms > MAX_WATCH_WAIT_MS {
            return Err(ApiError::invalid(
                "invalid_wait",
                format!("wait_ms must be at most {MAX_WATCH_WAIT_MS}, not {wait_ms}"),
            ));
        }
        if let Some(history) = &self.history {
            check_history_name(history, "a watch page")?;
        }
        Ok(WatchRequest {
            after,
            history: self.history,
            filter,
            limit,
            wait: std::time::Duration::from_millis(wait_ms),
            consistency,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_values() {
        assert_eq!(
            parse_consistency(None).unwrap(),
            ReadConsistency::Linearizable
        );
        assert_eq!(
            parse_consistency(Some("linearizable")).unwrap(),
            ReadConsistency::Linearizable
        );
        assert_eq!(
            parse_consistency(Some("local")).unwrap(),
            ReadConsistency::Local
        );
        for bad in ["", "LOCAL", "stale", "local "] {
            assert_eq!(
                parse_consistency(Some(bad)).unwrap_err().code(),
                "invalid_consistency"
            );
        }
    }

    #[test]
    fn limits() {
        let limit = |text: &str| parse_limit(Some(&QueryNumber(text.into())));
        assert_eq!(parse_limit(None).unwrap(), 1_000);
        assert_eq!(limit("1").unwrap(), 1);
        assert_eq!(limit("10000").unwrap(), 10_000);
        // Out of range, or not a number written in canonical decimal: the same code.
        for bad in [
            "0",
            "10001",
            "18446744073709551615",
            "",
            "abc",
            "-1",
            "01",
            "+5",
            "1e3",
        ] {
            let refused = limit(bad).unwrap_err();
            assert_eq!(refused.code(), "invalid_limit", "{bad:?}");
            assert!(
                refused
                    .to_string()
                    .contains("limit must be a decimal number from 1 to 10000"),
                "the message names the range the limit takes: {refused}"
            );
        }
    }

    /// A number that does not parse is told what is wrong with it, not a range it does not take
    /// (each parameter's own range is checked after, and named then).
    #[test]
    fn a_number_that_does_not_parse_is_told_why() {
        let message = |text: &str| {
            QueryNumber(text.into())
                .parse("wait_ms", "invalid_wait")
                .unwrap_err()
                .to_string()
        };
        for (text, says) in [
            ("abc", "is not a whole decimal number"),
            ("", "is not a whole decimal number"),
            ("-1", "is not a whole decimal number"),
            ("007", "has a leading zero"),
            ("18446744073709551616", "is too large"),
        ] {
            let m = message(text);
            assert!(m.contains(says), "{text:?}: {m}");
            assert!(!m.contains("18446744073709551615"), "{text:?}: {m}");
        }
    }

    /// The query string `query` as the extractor reads it.
    fn parsed<T: serde::de::DeserializeOwned>(query: &str) -> T {
        let uri: axum::http::Uri = format!("/?{query}").parse().unwrap();
        axum::extract::Query::<T>::try_from_uri(&uri).unwrap().0
    }

    #[test]
    fn each_number_parameter_is_refused_with_its_own_code() {
        let watch = |query: &str| parsed::<WatchQuery>(query).validate().map_err(|e| e.code());
        assert_eq!(watch("wait_ms=x").unwrap_err(), "invalid_wait");
        assert_eq!(watch("wait_ms=55001").unwrap_err(), "invalid_wait");
        assert_eq!(watch("after=-1").unwrap_err(), "invalid_argument");
        assert_eq!(watch("datanode=07").unwrap_err(), "invalid_argument");
        assert_eq!(watch("limit=").unwrap_err(), "invalid_limit");
        let ok = watch("after=5&datanode=7&wait_ms=0&limit=3").unwrap();
        assert_eq!((ok.after, ok.limit), (Some(5), 3));
        assert_eq!(ok.filter, ChangeFilter::Datanode(7));
        let epoch = |query: &str| parsed::<DeregisterQuery>(query).epoch();
        assert_eq!(epoch("epoch=12").unwrap(), Some(12));
        assert_eq!(epoch("").unwrap(), None);
        for bad in [
            "epoch=abc",
            "epoch=-1",
            "epoch=021",
            "epoch=18446744073709551616",
        ] {
            assert_eq!(epoch(bad).unwrap_err().code(), "invalid_epoch", "{bad}");
        }
        let revision = |query: &str| parsed::<KvWriteQuery>(query).if_revision();
        assert_eq!(revision("if_revision=0").unwrap(), Some(0));
        assert_eq!(
            revision("if_revision=x").unwrap_err().code(),
            "invalid_argument"
        );
    }

    #[test]
    fn cursors() {
        assert_eq!(parse_cursor(None).unwrap(), None);
        let empty = parse_cursor(Some(String::new())).unwrap_err();
        assert_eq!(empty.code(), "invalid_cursor");
        assert!(empty.to_string().contains("the cursor is empty"), "{empty}");
        assert_eq!(
            parse_cursor(Some("00000000000000ff".into()))
                .unwrap()
                .as_deref(),
            Some("00000000000000ff")
        );
        assert_eq!(
            parse_cursor(Some("a b".into())).unwrap_err().code(),
            "invalid_cursor"
        );
        assert_eq!(
            parse_cursor(Some("x".repeat(MAX_CURSOR_BYTES + 1)))
                .unwrap_err()
                .code(),
            "invalid_cursor"
        );
        assert_eq!(
            parse_cursor(Some("é".into())).unwrap_err().code(),
            "invalid_cursor"
        );
    }
}
