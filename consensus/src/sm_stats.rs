//! Counters of one node's state machine: applies, the longest apply, snapshot builds and
//! installs (and installs refused for want of room). Per node instance, never process-wide.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Live counters (atomics), shared by the state machine, its snapshot builders and the node.
#[derive(Debug, Default)]
pub(crate) struct SmStats {
    applies: AtomicU64,
    applied_entries: AtomicU64,
    apply_max_nanos: AtomicU64,
    builder_start_max_nanos: AtomicU64,
    builds: AtomicU64,
    build_failures: AtomicU64,
    build_bytes: AtomicU64,
    build_nanos: AtomicU64,
    last_build_nanos: AtomicU64,
    installs: AtomicU64,
    install_nanos: AtomicU64,
    install_refusals: AtomicU64,
}

/// A copy of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateMachineStats {
    /// `apply` calls and the entries they applied.
    pub applies: u64,
    pub applied_entries: u64,
    /// Longest single `apply` call since the last reset (microseconds).
    pub apply_max_micros: u64,
    /// Longest time the state machine spent starting a snapshot builder (microseconds): the
    /// only moment a snapshot holds up `apply`.
    pub builder_start_max_micros: u64,
    /// Snapshots built, their payload bytes and total build time.
    pub snapshot_builds: u64,
    /// Snapshot builds that failed (automatic builds pause after one).
    pub snapshot_build_failures: u64,
    pub snapshot_build_bytes: u64,
    pub snapshot_build_millis: u64,
    pub last_snapshot_build_millis: u64,
    /// Snapshots installed (received from a leader or restored at open).
    pub snapshot_installs: u64,
    pub snapshot_install_millis: u64,
    /// Received snapshots refused because the data dir had no room to install them.
    #[serde(default)]
    pub snapshot_install_refusals: u64,
}

fn max(a: &AtomicU64, v: u64) {
    a.fetch_max(v, Ordering::Relaxed);
}

impl SmStats {
    pub(crate) fn applied(&self, entries: usize, took: Duration) {
        self.applies.fetch_add(1, Ordering::Relaxed);
        self.applied_entries
            .fetch_add(entries as u64, Ordering::Relaxed);
        max(&self.apply_max_nanos, took.as_nanos() as u64);
    }

    pub(crate) fn builder_started(&self, took: Duration) {
        max(&self.builder_start_max_nanos, took.as_nanos() as u64);
    }

    pub(crate) fn built(&self, bytes: u64, took: Duration) {
        self.builds.fetch_add(1, Ordering::Relaxed);
        self.build_bytes.fetch_add(bytes, Ordering::Relaxed);
        let n = took.as_nanos() as u64;
        self.build_nanos.fetch_add(n, Ordering::Relaxed);
        self.last_build_nanos.store(n, Ordering::Relaxed);
    }

    pub(crate) fn build_failed(&self) {
        self.build_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn installed(&self, took: Duration) {
        self.installs.fetch_add(1, Ordering::Relaxed);
        self.install_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn install_refused(&self) {
        self.install_refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// Clears the two maxima (benchmarks measure a window).
    pub(crate) fn reset_maxima(&self) {
        self.apply_max_nanos.store(0, Ordering::Relaxed);
        self.builder_start_max_nanos.store(0, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StateMachineStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StateMachineStats {
            applies: l(&self.applies),
            applied_entries: l(&self.applied_entries),
            apply_max_micros: l(&self.apply_max_nanos) / 1_000,
            builder_start_max_micros: l(&self.builder_start_max_nanos) / 1_000,
            snapshot_builds: l(&self.builds),
            snapshot_build_failures: l(&self.build_failures),
            snapshot_build_bytes: l(&self.build_bytes),
            snapshot_build_millis: l(&self.build_nanos) / 1_000_000,
            last_snapshot_build_millis: l(&self.last_build_nanos) / 1_000_000,
            snapshot_installs: l(&self.installs),
            snapshot_install_millis: l(&self.install_nanos) / 1_000_000,
            snapshot_install_refusals: l(&self.install_refusals),
        }
    }
}
