//! Bodies of the cluster routes: init, learners, member addresses, voters and the config.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer};

use super::datanodes::MAX_MIN_EPOCH;
use super::fields::{not_null, validate_addr};
use super::object_only::some_object;
use crate::error::ApiError;

/// Body of `POST /v1/cluster/init`: member id to address.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitBody {
    /// The initial voters, id to `host:port`. An id named twice is refused, not overwritten.
    #[serde(deserialize_with = "unique_members")]
    pub members: BTreeMap<u64, String>,
}

/// A JSON object of member ids to addresses that names no id twice (serde's map would keep the
/// last address of an id given twice, and a typo in the first would go unnoticed). Ids are
/// written as in paths, canonical decimal: `"01"` would otherwise be a syntax error, not a
/// wrong member list.
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
            while let Some((id, addr)) = map.next_entry::<String, String>()? {
                let id = crate::extract::parse_id(&id).map_err(serde::de::Error::custom)?;
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

/// Body of `PUT /v1/cluster/epoch-floor`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochFloorBody {
    /// The cluster's epoch floor is raised to this (at most [`MAX_MIN_EPOCH`]); a lower one
    /// changes nothing.
    pub at_least: u64,
    /// A restore's claim: raise it only if the cluster is fresh (no datanode, no key, a floor
    /// never raised), else refuse (409) and change nothing.
    #[serde(default)]
    pub if_fresh: bool,
    /// With `if_fresh`, the backup the restore replays: the claim also marks the cluster as
    /// being restored from it (cluster version 8) until `DELETE /v1/cluster/restore`.
    #[serde(default, deserialize_with = "some_object")]
    pub restore: Option<RestoreBody>,
    /// With `restore`, the claim also holds keys back until the restore ends (cluster version
    /// 9): every key write and delete is refused but the restore's own (`restore=true`).
    #[serde(default)]
    pub hold_keys: bool,
}

/// What a restore's backup holds, as its claim names it (`EpochFloorBody::restore`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    /// The index of the backup's snapshot.
    pub index: u64,
    pub datanodes: u64,
    pub replicas: u64,
    pub keys: u64,
}

impl EpochFloorBody {
    /// The floor asked for, if it is one the API accepts.
    pub fn validate(&self) -> Result<u64, ApiError> {
        if self.at_least > MAX_MIN_EPOCH {
            return Err(ApiError::invalid(
                "invalid_epoch",
                format!(
                    "at_least must be at most {MAX_MIN_EPOCH}, not {}",
                    self.at_least
                ),
            ));
        }
        if self.if_fresh && self.at_least == 0 {
            return Err(ApiError::invalid(
                "invalid_epoch",
                "a restore's claim (if_fresh) raises the floor to at least 1",
            ));
        }
        if self.restore.is_some() && !self.if_fresh {
            return Err(ApiError::invalid(
                "invalid_body",
                "restore names the backup of a restore's claim: give it with if_fresh",
            ));
        }
        if self.hold_keys && self.restore.is_none() {
            return Err(ApiError::invalid(
                "invalid_body",
                "hold_keys holds keys back while a restore runs: give it with restore (and \
                 if_fresh)",
            ));
        }
        Ok(self.at_least)
    }
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

/// Body of `PUT /v1/cluster/leader`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLeaderBody {
    /// The voter to lead.
    pub id: u64,
}

impl SetLeaderBody {
    /// The voter asked for, if its id is one the API accepts.
    pub fn validate(&self) -> Result<u64, ApiError> {
        validate_node_id(self.id)?;
        Ok(self.id)
    }
}

/// Body of `PATCH /v1/config`; absent fields stay as they are.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigPatchBody {
    /// Snapshot rate (exports, downloads, streams to members) in bytes per second; 0 = unlimited.
    #[serde(default, deserialize_with = "not_null")]
    pub snapshot_max_bytes_per_sec: Option<u64>,
}

impl InitBody {
    /// Checks the member list: not empty, every address `host:port` and no address twice (one
    /// process cannot be two members).
    pub fn validate(&self) -> Result<(), ApiError> {
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
        Ok(())
    }

    /// Checks that the list names this node (`own_id`) at the address it advertises
    /// (`own_addr`): the others would otherwise never reach it.
    pub fn validate_names(&self, own_id: u64, own_addr: &str) -> Result<(), ApiError> {
        match self.members.get(&own_id) {
            Some(addr) if addr != own_addr => Err(ApiError::invalid(
                "invalid_members",
                format!(
                    "this node ({own_id}) is at {own_addr}, not {addr} (a node that listens on \
                     all interfaces names its address with --advertise)"
                ),
            )),
            Some(_) => Ok(()),
            // The node refuses this too; said here, it gets the code every other wrong member
            // list gets.
            None => Err(ApiError::invalid(
                "invalid_members",
                format!(
                    "members must include this node ({own_id} at {own_addr}): init is sent to \
                     one of the nodes that form the cluster"
                ),
            )),
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
        ok.validate().unwrap();
        ok.validate_names(1, "10.0.0.1:7101").unwrap();
        let e = ok.validate_names(3, "10.0.0.3:7101").unwrap_err();
        assert_eq!(e.code(), "invalid_members");
        assert!(
            e.to_string()
                .contains("must include this node (3 at 10.0.0.3:7101)"),
            "{e}"
        );
        let e = ok.validate_names(1, "10.0.0.9:7101").unwrap_err();
        assert_eq!(e.code(), "invalid_members");
        assert!(
            e.to_string()
                .contains("is at 10.0.0.9:7101, not 10.0.0.1:7101"),
            "{e}"
        );

        let same = init(r#"{"members":{"1":"10.0.0.1:7101","2":"10.0.0.1:7101"}}"#).unwrap();
        let e = same.validate().unwrap_err();
        assert!(e.to_string().contains("nodes 1 and 2 are both at"), "{e}");

        let twice = init(r#"{"members":{"1":"10.0.0.1:7101","1":"10.0.0.2:7101"}}"#).unwrap_err();
        assert!(
            twice.to_string().contains("member 1 is named twice"),
            "{twice}"
        );
    }

    #[test]
    fn membership_bodies() {
        let init: InitBody =
            serde_json::from_str(r#"{"members":{"1":"127.0.0.1:7101","2":"127.0.0.1:7102"}}"#)
                .unwrap();
        assert!(init
            .validate()
            .and_then(|()| init.validate_names(1, "127.0.0.1:7101"))
            .is_ok());
        assert_eq!(init.members[&2], "127.0.0.1:7102");
        assert!(serde_json::from_str::<InitBody>(r#"{"members":{"-1":"a:1"}}"#).is_err());
        assert!(serde_json::from_str::<InitBody>(r#"{"members":{"x":"a:1"}}"#).is_err());
        // One spelling per id, as in paths; the error is about the data, not the syntax.
        for key in ["01", "+1", " 1", "1.0", ""] {
            let e =
                serde_json::from_str::<InitBody>(&format!(r#"{{"members":{{"{key}":"a:1"}}}}"#))
                    .unwrap_err();
            assert_eq!(
                e.classify(),
                serde_json::error::Category::Data,
                "{key:?}: {e}"
            );
            assert!(e.to_string().contains("is not an id"), "{key:?}: {e}");
        }
        let empty: InitBody = serde_json::from_str(r#"{"members":{}}"#).unwrap();
        assert_eq!(
            empty
                .validate()
                .and_then(|()| empty.validate_names(1, "127.0.0.1:7101"))
                .unwrap_err()
                .code(),
            "invalid_members"
        );
        let voters = ChangeVotersBody {
            voters: vec![1, 2, 2],
        };
        assert_eq!(voters.validate().unwrap_err().code(), "invalid_members");
    }
}
