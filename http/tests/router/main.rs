//! Every route of the router, and every error status, against a real single-node `MetaNode`.

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod datanodes;
mod forwarding;
mod kv;
mod probes;
mod raft;
mod refusals;
