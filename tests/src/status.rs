//! The parts of `GET /v1/cluster` that the tests look at. The indexes the checks compare must be
//! there (a renamed field fails the read rather than reading as 0).

use serde_json::Value;

/// One node's view of the cluster.
#[derive(Clone, Debug)]
pub struct ClusterStatus {
    /// This node's id.
    pub id: u64,
    /// `leader`, `follower`, `candidate`, `learner`, ... (lower case).
    pub role: String,
    /// The leader this node knows of.
    pub leader: Option<u64>,
    /// The current term.
    pub term: u64,
    /// The index of the last log entry.
    pub last_log_index: u64,
    /// The commit index this node knows.
    pub committed: u64,
    /// The index of the last applied entry.
    pub applied: u64,
    /// Voter ids.
    pub voters: Vec<u64>,
    /// Learner ids.
    pub learners: Vec<u64>,
    /// The newest snapshot's last included index, if there is a snapshot.
    pub snapshot_index: Option<u64>,
    /// The newest snapshot's size in bytes.
    pub snapshot_bytes: Option<u64>,
    /// The index up to which the log was purged.
    pub purged: Option<u64>,
    /// The whole answer.
    pub raw: Value,
}

impl ClusterStatus {
    /// Reads the status from the JSON answer of `GET /v1/cluster`.
    pub fn from_json(raw: Value) -> anyhow::Result<ClusterStatus> {
        let id = required(&raw, "id")?;
        let role = raw
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow::anyhow!("no role in {raw}"))?
            .to_ascii_lowercase();
        let leader = first(&raw, &["leader_id", "leader", "current_leader"]).and_then(as_id);
        let snapshot = first(&raw, &["snapshot", "newest_snapshot", "last_snapshot"]);
        Ok(ClusterStatus {
            id,
            role,
            leader,
            term: required(&raw, "term")?,
            last_log_index: required(&raw, "last_log_index")?,
            committed: required(&raw, "committed")?,
            applied: required(&raw, "applied")?,
            voters: ids(first(&raw, &["voters"])),
            learners: ids(first(&raw, &["learners"])),
            snapshot_index: snapshot
                .and_then(|s| first_u64(s, &["index", "last_log_index", "last_index"]))
                .or_else(|| first_u64(&raw, &["snapshot_index"])),
            snapshot_bytes: snapshot
                .and_then(|s| first_u64(s, &["bytes", "size"]))
                .or_else(|| first_u64(&raw, &["snapshot_bytes"])),
            purged: first_u64(&raw, &["purged", "last_purged", "purged_index"]),
            raw,
        })
    }

    /// Whether this node says it is the leader.
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

/// A field the status always carries: a number, or `null` for none yet (read as 0). A missing
/// field is an error, not a 0: checks that compare indexes would pass trivially on zeros.
fn required(value: &Value, key: &str) -> anyhow::Result<u64> {
    match value.get(key) {
        None => anyhow::bail!("no {key} in {value}"),
        Some(Value::Null) => Ok(0),
        Some(v) => as_index(v).ok_or_else(|| anyhow::anyhow!("{key} is not an index in {value}")),
    }
}

fn first<'a>(value: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter()
        .find_map(|key| value.get(*key))
        .filter(|v| !v.is_null())
}

fn first_u64(value: &Value, keys: &[&str]) -> Option<u64> {
    first(value, keys).and_then(as_index)
}

/// A number, or a log id object carrying an `index`.
fn as_index(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.get("index").and_then(as_index))
}

/// A node id: a number, or an object with `id`.
fn as_id(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .or_else(|| value.get("id").and_then(as_id))
}

fn ids(value: Option<&Value>) -> Vec<u64> {
    let mut out: Vec<u64> = match value {
        Some(Value::Array(items)) => items.iter().filter_map(as_id).collect(),
        Some(Value::Object(map)) => map.keys().filter_map(|k| k.parse().ok()).collect(),
        _ => Vec::new(),
    };
    out.sort_unstable();
    out
}
