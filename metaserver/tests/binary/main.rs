//! The `metaserver` binary as operators use it: the command-less default node, restarts,
//! the token, graceful shutdown on SIGTERM, the operator commands and `local-cluster`.

#[path = "../common/mod.rs"]
mod common;

mod connections;
mod default_node;
mod environment;
mod helpers;
mod local_cluster;
mod output;
mod shutdown;
mod storage;
mod token;
mod watch;
