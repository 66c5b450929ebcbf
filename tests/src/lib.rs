//! Fault tests for the metaserver: a harness that runs a cluster of real `metaserver` processes on
//! loopback (with a TCP proxy in front of each node so links can be cut), drives it over HTTP, keeps
//! a model of every acknowledged write, and checks the cluster against it. The scenarios live in
//! `tests/`.

pub mod binary;
pub mod client;
pub mod cluster;
pub mod held_request;
pub mod history;
pub mod model;
pub mod note;
pub mod poll;
pub mod process;
pub mod proxy;
pub mod registry_state;
pub mod scenario;
pub mod seed;
pub mod socket_owner;
pub mod status;
pub mod storm;
pub mod wal_files;
pub mod watcher;
pub mod zone;

pub use client::{Api, ApiError, Consistency, ShardReport};
pub use cluster::{Cluster, ClusterConfig, Endpoints};
pub use history::{History, LinearizableWorkload};
pub use model::Model;
pub use note::note;
pub use poll::poll_until;
pub use registry_state::RegistryState;
pub use scenario::{run_scenario, within};
pub use seed::{derived_rng, test_seed};
pub use storm::{Storm, StormConfig};
pub use watcher::{Watched, Watcher};
