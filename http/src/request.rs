//! Request bodies and query parameters of the admin API, with their validation.
//!
//! Bodies reject unknown fields; ids are unsigned 64-bit integers. `validate` methods check
//! what serde cannot (sizes, key rules, addresses) and never touch the registry, so a request
//! that fails here changes nothing.
//!
//! The bodies and queries live in submodules by subject and are re-exported here.

mod cluster;
mod command;
mod datanodes;
mod fields;
mod object_only;
mod query;

pub use cluster::{
    AddLearnerBody, ChangeAddressBody, ChangeVotersBody, ConfigPatchBody, EpochFloorBody, InitBody,
    RestoreBody, SetLeaderBody,
};
pub use command::validate_command;
pub use datanodes::{
    EpochBody, RegisterDatanodeBody, RegisterShardsBody, ShardBody, MAX_MIN_EPOCH,
};
pub use fields::{
    check_listen_addr, validate_addr, validate_key, validate_new_key, validate_value,
};
pub use object_only::ObjectOnly;
pub use query::{
    id_cursor_of, invalid_cursor, parse_consistency, parse_cursor, parse_limit, DeregisterQuery,
    KvListQuery, KvWriteQuery, LivenessQuery, PageQuery, PageRequest, QueryNumber, ReadConsistency,
    ReadQuery, WatchQuery, WatchRequest,
};
