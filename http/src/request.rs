//! Request bodies and query parameters of the admin API, with their validation.
//!
//! Bodies reject unknown fields; ids are unsigned 64-bit integers. `validate` methods check
//! what serde cannot (sizes, key rules, addresses) and never touch the registry, so a request
//! that fails here changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use meta_consensus::{ChangeFilter, Command, DatanodeState};

use crate::error::ApiError;
use crate::limits::{
    DEFAULT_PAGE_LIMIT, DEFAULT_WATCH_WAIT_MS, MAX_ADDR_BYTES, MAX_CURSOR_BYTES, MAX_KEY_BYTES,
    MAX_PAGE_LIMIT, MAX_SHARDS_PER_BATCH, MAX_VALUE_BYTES, MAX_WATCH_WAIT_MS,
};

/// Body of `PUT /v1/datanodes/{id}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterDatanodeBody {
    /// The datanode's address, `host:port`.
    pub addr: String,
    /// The new epoch is at least this (a restore sets it; at most 2^53, which JSON numbers
    /// hold exactly).
    pub min_epoch: Option<u64>,
}

/// Largest `min_epoch`: epochs stay integers that every JSON reader holds exactly.
pub const MAX_MIN_EPOCH: u64 = 1 << 53;

fn validate_min_epoch(min_epoch: u64) -> Result<(), ApiError> {
    if min_epoch > MAX_MIN_EPOCH {
        return Err(ApiError::invalid(
            "invalid_epoch",
            format!("min_epoch must be at most {MAX_MIN_EPOCH}, not {min_epoch}"),
        ));
    }
    Ok(())
}

/// One shard replica in a registration batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardBody {
    /// Shard id.
    pub id: u64,
    /// The replica's generation; a lower one than stored is rejected as stale.
    pub generation: u64,
    /// The replica's size in bytes.
    pub size: u64,
}

/// Body of `POST /v1/datanodes/{id}/shards`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterShardsBody {
    /// The datanode's epoch the batch belongs to.
    pub epoch: u64,
    /// 1 to 10,000 distinct shards.
    #[serde(deserialize_with = "objects")]
    pub shards: Vec<ShardBody>,
}

/// Body of `POST /v1/datanodes/{id}/prune` and `POST /v1/datanodes/{id}/heartbeat`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochBody {
    /// The incarnation that sends it: the datanode's current epoch.
    pub epoch: u64,
}

/// Deserializes `T` from a JSON object only.
///
/// serde's derived structs also accept a JSON array of the fields in order; the API does not,
/// so `[1,2,3]` where an object is expected is `invalid_body` like any other wrong type.
#[derive(Debug)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(ObjectVisitor(PhantomData))
            .map(ObjectOnly)
    }
}

fn objects<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    let items = Vec::<ObjectOnly<T>>::deserialize(deserializer)?;
    Ok(items.into_iter().map(|o| o.0).collect())
}

/// Body of `POST /v1/cluster/init`: member id to address.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitBody {
    /// The initial voters, id to `host:port`. An id named twice is refused, not overwritten.
    #[serde(deserialize_with = "unique_members")]
    pub members: BTreeMap<u64, String>,
}

/// A JSON object of member ids to addresses that names no id twice (serde's map would keep the
/// last address of an id given twice, and a typo in the first would go unnoticed).
fn unique_members<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u64, String>, D::Error> {
    struct Members;
    impl<'de> serde::de::Visitor<'de> for Members {
        type Value = BTreeMap<u64, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of member ids to addresses")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut members = BTreeMap::new();
            while let Some((id, addr)) = map.next_entry::<u64, String>()? {
                if members.insert(id, addr).is_some() {
                    return Err(serde::de::Error::custom(format!(
                        "member {id} is named twice"
                    )));
                }
            }
            Ok(members)
        }
    }
    d.deserialize_map(Members)
}

/// Body of `POST /v1/cluster/learners`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddLearnerBody {
    /// The new node's id.
    pub id: u64,
    /// The new node's address, `host:port`.
    pub addr: String,
}

/// Body of `PUT /v1/cluster/members/{id}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeAddressBody {
    /// The member's new address, `host:port`.
    pub addr: String,
}

/// Body of `PUT /v1/cluster/voters`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeVotersBody {
    /// The complete new set of voters.
    pub voters: Vec<u64>,
}

/// Body of `PATCH /v1/config`; absent fields stay as they are.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigPatchBody {
    /// Snapshot export rate in bytes per second; 0 = unlimited.
    pub snapshot_max_bytes_per_sec: Option<u64>,
}

/// Query of single-item reads: `?consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    /// `linearizable` (default) or `local`.
    pub consistency: Option<String>,
}

/// Query of `GET /v1/liveness`: `?state=` keeps the datanodes in that state.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LivenessQuery {
    /// `alive`, `down` or `unknown`; all when absent.
    pub state: Option<String>,
}

impl LivenessQuery {
    /// The state asked for, if any.
    pub fn validate(&self) -> Result<Option<DatanodeState>, ApiError> {
        match self.state.as_deref() {
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
}

/// Query of shard listings: `?after=&limit=&consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Cursor from the previous page's `next`.
    pub after: Option<String>,
    /// Page size, 1 to 10,000 (default 1,000).
    #[serde(default, deserialize_with = "canonical_number")]
    pub limit: Option<u64>,
    /// `linearizable` (default) or `local`.
    pub consistency: Option<String>,
}

/// A number in a query string: canonical decimal (no sign, no leading zeros), as ids in paths
/// are, so that each value has one spelling (`?after=007` is refused, not read as 7).
fn canonical_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text = Option::<String>::deserialize(d)?;
    text.map(|t| {
        crate::extract::parse_id(&t).map_err(|_| {
            serde::de::Error::custom(format!(
                "{t:?} is not a decimal number from 0 to {} without sign or leading zeros",
                u64::MAX
            ))
        })
    })
    .transpose()
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
    #[serde(default, deserialize_with = "canonical_number")]
    pub limit: Option<u64>,
    /// `linearizable` (default) or `local`.
    pub consistency: Option<String>,
}

/// Query of `GET /v1/watch`: `?after=&datanode=&prefix=&limit=&wait_ms=&consistency=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// The log index the client has seen the changes up to (the `index` of its previous
    /// answer); none: answer at once with the index to start from.
    #[serde(default, deserialize_with = "canonical_number")]
    pub after: Option<u64>,
    /// Only the registry changes of this datanode.
    #[serde(default, deserialize_with = "canonical_number")]
    pub datanode: Option<u64>,
    /// Only the key-value changes of keys starting with this prefix.
    pub prefix: Option<String>,
    /// Most events in the answer, 1 to 10,000 (default 1,000).
    #[serde(default, deserialize_with = "canonical_number")]
    pub limit: Option<u64>,
    /// How long to wait for a change, in milliseconds (default 30,000, at most 55,000).
    #[serde(default, deserialize_with = "canonical_number")]
    pub wait_ms: Option<u64>,
    /// `linearizable` (default), `lease` or `local`.
    pub consistency: Option<String>,
}

/// A validated watch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRequest {
    pub after: Option<u64>,
    pub filter: ChangeFilter,
    pub limit: usize,
    pub wait: std::time::Duration,
    pub consistency: ReadConsistency,
}

/// Query of key-value writes: `?if_revision=`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvWriteQuery {
    /// Compare-and-swap: the key's expected revision; 0 = must not exist.
    #[serde(default, deserialize_with = "canonical_number")]
    pub if_revision: Option<u64>,
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
pub fn parse_limit(limit: Option<u64>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(DEFAULT_PAGE_LIMIT),
        Some(n) if (1..=MAX_PAGE_LIMIT as u64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(
            "invalid_limit",
            format!("limit must be between 1 and {MAX_PAGE_LIMIT}, not {n}"),
        )),
    }
}

/// Validates `?after=`: an empty cursor means "from the start"; a cursor is printable ASCII of
/// bounded length (the registry checks the rest and answers `invalid_cursor` too).
pub fn parse_cursor(after: Option<String>) -> Result<Option<String>, ApiError> {
    match after {
        None => Ok(None),
        Some(cursor) if cursor.is_empty() => Ok(None),
        Some(cursor) => {
            if cursor.len() > MAX_CURSOR_BYTES || !cursor.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid_cursor(&cursor));
            }
            Ok(Some(cursor))
        }
    }
}

/// The error for a cursor that is not one this server handed out.
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
        let limit = parse_limit(self.limit)?;
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
        let limit = parse_limit(self.limit)?;
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
        let limit = parse_limit(self.limit)?;
        let filter = match (self.datanode, self.prefix) {
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
        if let Some(after) = self
            .after
            .filter(|a| *a > meta_consensus::rpc_bounds::MAX_INDEX)
        {
            return Err(ApiError::invalid(
                "invalid_argument",
                format!(
                    "after={after} is past any log index (at most {})",
                    meta_consensus::rpc_bounds::MAX_INDEX
                ),
            ));
        }
        let wait_ms = self.wait_ms.unwrap_or(DEFAULT_WATCH_WAIT_MS);
        if wait_ms > MAX_WATCH_WAIT_MS {
            return Err(ApiError::invalid(
                "invalid_wait",
                format!("wait_ms must be at most {MAX_WATCH_WAIT_MS}, not {wait_ms}"),
            ));
        }
        Ok(WatchRequest {
            after: self.after,
            filter,
            limit,
            wait: std::time::Duration::from_millis(wait_ms),
            consistency,
        })
    }
}

/// Validates a key-value key: 1 to 1,024 bytes of UTF-8 without control characters.
pub fn validate_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() {
        return Err(ApiError::invalid("invalid_key", "key must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(
            "invalid_key",
            format!(
                "key is {} bytes long, at most {MAX_KEY_BYTES} are allowed",
                key.len()
            ),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "invalid_key",
            "key contains control characters",
        ));
    }
    Ok(())
}

/// Validates the key of a new write: a valid key ([`validate_key`]) none of whose
/// `/`-separated segments is `.` or `..`. URL clients drop such segments (`a/./b` reaches the
/// server as `a/b`), so a key holding one could be written by some clients and not addressed
/// by others. Keys written before this rule stay readable and deletable.
pub fn validate_new_key(key: &str) -> Result<(), ApiError> {
    validate_key(key)?;
    if key.split('/').any(|s| s == "." || s == "..") {
        return Err(ApiError::invalid(
            "invalid_key",
            format!("key {key:?} has a \".\" or \"..\" segment, which URL clients drop"),
        ));
    }
    Ok(())
}

/// Validates a key-value value's size (at most 1 MiB).
pub fn validate_value(value: &[u8]) -> Result<(), ApiError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::too_large(
            "value_too_large",
            format!(
                "value is {} bytes, at most {MAX_VALUE_BYTES} are allowed",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Validates an address `host:port`: a name or IPv4 address (letters, digits, `.`, `-`, `_`) or
/// an IPv6 address in brackets, and a port 1-65535.
pub fn validate_addr(addr: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        let shown: String = addr.chars().take(64).collect();
        ApiError::invalid(
            "invalid_addr",
            format!("address {shown:?} is not host:port: {why}"),
        )
    };
    if addr.len() > MAX_ADDR_BYTES {
        return Err(bad("too long"));
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(bad("no port"));
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    // A name or IPv4 address (letters, digits, '.', '-', '_'), or an IPv6 address in brackets.
    let valid_host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
    };
    if !valid_host {
        return Err(bad(
            "the host must be a name, an IPv4 address or an IPv6 address in brackets",
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err(bad("the port must be 1 to 65535")),
    }
}

impl RegisterDatanodeBody {
    /// Checks the address and the epoch floor.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_addr(&self.addr)?;
        self.min_epoch.map_or(Ok(()), validate_min_epoch)
    }

    /// The command that registers datanode `id` as this body asks.
    pub fn command(self, id: u64) -> Command {
        match self.min_epoch {
            None => Command::RegisterDatanode {
                id,
                addr: self.addr,
            },
            Some(min_epoch) => Command::RegisterDatanodeAtLeast {
                id,
                addr: self.addr,
                min_epoch,
            },
        }
    }
}

impl RegisterShardsBody {
    /// Checks the batch: 1 to 10,000 shards (413 `batch_too_large` above), no shard twice.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_shard_ids(self.shards.iter().map(|s| s.id), self.shards.len())
    }
}

/// Checks the `n` shard ids of a batch: 1 to 10,000 (413 `batch_too_large` above), none twice.
fn validate_shard_ids(ids: impl Iterator<Item = u64>, n: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::invalid(
            "empty_batch",
            "a batch must carry at least one shard",
        ));
    }
    if n > MAX_SHARDS_PER_BATCH {
        return Err(ApiError::too_large(
            "batch_too_large",
            format!("a batch carries at most {MAX_SHARDS_PER_BATCH} shards, this one {n}"),
        ));
    }
    let mut seen = HashSet::with_capacity(n);
    for id in ids {
        if !seen.insert(id) {
            return Err(ApiError::invalid(
                "duplicate_shard",
                format!("shard {id} appears more than once in the batch"),
            ));
        }
    }
    Ok(())
}

/// Checks a command as the request that carries it was checked. A member that forwards a write
/// has checked it already; the leader checks it again, since `/raft/forward-commands` is an
/// endpoint anyone holding the token (or anyone, without one) can call.
pub fn validate_command(cmd: &Command) -> Result<(), ApiError> {
    match cmd {
        Command::RegisterDatanode { addr, .. } => validate_addr(addr),
        Command::RegisterDatanodeAtLeast {
            addr, min_epoch, ..
        } => {
            validate_addr(addr)?;
            validate_min_epoch(*min_epoch)
        }
        Command::RegisterShards { shards, .. } => {
            validate_shard_ids(shards.iter().map(|s| s.id), shards.len())
        }
        Command::DeregisterShards { shards, .. } => {
            validate_shard_ids(shards.iter().copied(), shards.len())
        }
        Command::RemoveDatanode { .. } | Command::PruneReplicas { .. } => Ok(()),
        Command::Put { key, value, .. } => {
            validate_new_key(key)?;
            validate_value(value)
        }
        Command::Delete { key, .. } => validate_key(key),
        Command::SetClusterVersion { .. } => Err(ApiError::invalid(
            "bad_command",
            "the cluster's version is raised by its leader only",
        )),
    }
}

impl InitBody {
    /// Checks the member list: not empty, every address `host:port` and no address twice (one
    /// process cannot be two members), and this node (`own_id`), if named, at the address it
    /// advertises (`own_addr`): the others would otherwise never reach it.
    pub fn validate(&self, own_id: u64, own_addr: &str) -> Result<(), ApiError> {
        if self.members.is_empty() {
            return Err(ApiError::invalid(
                "invalid_members",
                "members must name at least one node",
            ));
        }
        let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
        for (&id, addr) in &self.members {
            validate_node_id(id)?;
            validate_addr(addr)?;
            if let Some(other) = seen.insert(addr, id) {
                return Err(ApiError::invalid(
                    "invalid_members",
                    format!("nodes {other} and {id} are both at {addr}: each member needs its own address"),
                ));
            }
        }
        match self.members.get(&own_id) {
            Some(addr) if addr != own_addr => Err(ApiError::invalid(
                "invalid_members",
                format!(
                    "this node ({own_id}) is at {own_addr}, not {addr} (a node that listens on \
                     all interfaces names its address with --advertise)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Node ids start at 1: 0 means "no node" in status and metrics.
fn validate_node_id(id: u64) -> Result<(), ApiError> {
    if id == 0 {
        return Err(ApiError::invalid(
            "invalid_members",
            "node ids start at 1 (0 means no node)",
        ));
    }
    Ok(())
}

impl AddLearnerBody {
    /// Checks the id and the address.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_node_id(self.id)?;
        validate_addr(&self.addr)
    }
}

impl ChangeVotersBody {
    /// Checks the voter set: not empty, no id twice.
    pub fn validate(&self) -> Result<BTreeSet<u64>, ApiError> {
        if self.voters.is_empty() {
            return Err(ApiError::invalid(
                "invalid_members",
                "voters must name at least one node",
            ));
        }
        for &id in &self.voters {
            validate_node_id(id)?;
        }
        let set: BTreeSet<u64> = self.voters.iter().copied().collect();
        if set.len() != self.voters.len() {
            return Err(ApiError::invalid(
                "invalid_members",
                "voters names a node more than once",
            ));
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(json: &str) -> Result<InitBody, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn init_members_are_checked() {
        let ok = init(r#"{"members":{"1":"10.0.0.1:7101","2":"10.0.0.2:7101"}}"#).unwrap();
        ok.validate(1, "10.0.0.1:7101").unwrap();
        // This node may be left out here; the node itself refuses a list without it.
        ok.validate(3, "10.0.0.3:7101").unwrap();
        let e = ok.validate(1, "10.0.0.9:7101").unwrap_err();
        assert_eq!(e.code(), "invalid_members");
        assert!(
            e.to_string()
                .contains("is at 10.0.0.9:7101, not 10.0.0.1:7101"),
            "{e}"
        );

        let same = init(r#"{"members":{"1":"10.0.0.1:7101","2":"10.0.0.1:7101"}}"#).unwrap();
        let e = same.validate(1, "10.0.0.1:7101").unwrap_err();
        assert!(e.to_string().contains("nodes 1 and 2 are both at"), "{e}");

        let twice = init(r#"{"members":{"1":"10.0.0.1:7101","1":"10.0.0.2:7101"}}"#).unwrap_err();
        assert!(
            twice.to_string().contains("member 1 is named twice"),
            "{twice}"
        );
    }

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
        assert_eq!(parse_limit(None).unwrap(), 1_000);
        assert_eq!(parse_limit(Some(1)).unwrap(), 1);
        assert_eq!(parse_limit(Some(10_000)).unwrap(), 10_000);
        assert_eq!(parse_limit(Some(0)).unwrap_err().code(), "invalid_limit");
        assert_eq!(
            parse_limit(Some(10_001)).unwrap_err().code(),
            "invalid_limit"
        );
        assert_eq!(
            parse_limit(Some(u64::MAX)).unwrap_err().code(),
            "invalid_limit"
        );
    }

    #[test]
    fn cursors() {
        assert_eq!(parse_cursor(None).unwrap(), None);
        assert_eq!(parse_cursor(Some(String::new())).unwrap(), None);
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

    #[test]
    fn keys_and_values() {
        assert!(validate_key("a").is_ok());
        assert!(validate_key("config/datanode/7").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert_eq!(validate_key("").unwrap_err().code(), "invalid_key");
        assert_eq!(
            validate_key(&"k".repeat(MAX_KEY_BYTES + 1))
                .unwrap_err()
                .code(),
            "invalid_key"
        );
        assert_eq!(validate_key("a\nb").unwrap_err().code(), "invalid_key");
        assert!(validate_new_key("a/.b/c..").is_ok());
        for dotted in [".", "..", "a/./b", "a/..", "../a"] {
            assert!(validate_key(dotted).is_ok(), "{dotted} stays addressable");
            assert_eq!(
                validate_new_key(dotted).unwrap_err().code(),
                "invalid_key",
                "{dotted}"
            );
        }
        assert!(validate_value(&vec![0; MAX_VALUE_BYTES]).is_ok());
        assert_eq!(
            validate_value(&vec![0; MAX_VALUE_BYTES + 1])
                .unwrap_err()
                .code(),
            "value_too_large"
        );
    }

    #[test]
    fn addresses() {
        for good in [
            "127.0.0.1:7101",
            "localhost:1",
            "dn-7.example:65535",
            "[::1]:80",
        ] {
            assert!(validate_addr(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "127.0.0.1",
            ":80",
            "host:0",
            "host:65536",
            "host:+80",
            "host:port",
            "a b:80",
            "http://x:80",
            "::1:80",
            "a:b:c:80",
            "[not-v6]:80",
            "127.0.0.1:7121;2=127.0.0.1:7122",
            "a:1;b=c:2",
            "user@host:80",
        ] {
            assert_eq!(
                validate_addr(bad).unwrap_err().code(),
                "invalid_addr",
                "{bad}"
            );
        }
        assert_eq!(
            validate_addr(&format!("{}:80", "h".repeat(300)))
                .unwrap_err()
                .code(),
            "invalid_addr"
        );
    }

    #[test]
    fn shard_batches() {
        let shard = |id| ShardBody {
            id,
            generation: 1,
            size: 10,
        };
        let batch = |shards| RegisterShardsBody { epoch: 1, shards };
        assert!(batch(vec![shard(1)]).validate().is_ok());
        assert!(batch((0..10_000).map(shard).collect()).validate().is_ok());
        assert_eq!(batch(vec![]).validate().unwrap_err().code(), "empty_batch");
        let too_many = batch((0..10_001).map(shard).collect())
            .validate()
            .unwrap_err();
        assert_eq!(too_many.code(), "batch_too_large");
        assert_eq!(too_many.status().as_u16(), 413);
        assert_eq!(
            batch(vec![shard(1), shard(1)])
                .validate()
                .unwrap_err()
                .code(),
            "duplicate_shard"
        );
    }

    #[test]
    fn shards_must_be_objects() {
        let ok: ObjectOnly<RegisterShardsBody> =
            serde_json::from_str(r#"{"epoch":3,"shards":[{"id":1,"generation":2,"size":3}]}"#)
                .unwrap();
        assert_eq!(ok.0.shards[0].size, 3);
        for bad in [
            r#"{"epoch":3,"shards":[[1,2,3]]}"#,
            r#"[3,[{"id":1,"generation":2,"size":3}]]"#,
            r#"{"epoch":3,"shards":[{"id":1,"generation":2,"size":3,"x":0}]}"#,
            r#"{"epoch":3,"shards":{"id":1}}"#,
        ] {
            assert!(
                serde_json::from_str::<ObjectOnly<RegisterShardsBody>>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn membership_bodies() {
        let init: InitBody =
            serde_json::from_str(r#"{"members":{"1":"127.0.0.1:7101","2":"127.0.0.1:7102"}}"#)
                .unwrap();
        assert!(init.validate(1, "127.0.0.1:7101").is_ok());
        assert_eq!(init.members[&2], "127.0.0.1:7102");
        assert!(serde_json::from_str::<InitBody>(r#"{"members":{"-1":"a:1"}}"#).is_err());
        assert!(serde_json::from_str::<InitBody>(r#"{"members":{"x":"a:1"}}"#).is_err());
        let empty: InitBody = serde_json::from_str(r#"{"members":{}}"#).unwrap();
        assert_eq!(
            empty.validate(1, "127.0.0.1:7101").unwrap_err().code(),
            "invalid_members"
        );
        let voters = ChangeVotersBody {
            voters: vec![1, 2, 2],
        };
        assert_eq!(voters.validate().unwrap_err().code(), "invalid_members");
    }
}
