//! The node's figures in `/metrics`, read from [`MetaNode::status`] at scrape time: WAL,
//! Raft, snapshots and registry size, and on the leader how many datanodes are alive.
//! Nothing is cached between scrapes.

use meta_consensus::{ClusterStatus, MetaNode, Role};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Collects the node's figures at every scrape.
pub struct NodeCollector {
    node: MetaNode,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCollector")
            .field("node", &self.node.id())
            .finish()
    }
}

impl NodeCollector {
    /// A collector of `node`'s status.
    pub fn new(node: MetaNode) -> Self {
        NodeCollector { node }
    }
}

/// A histogram given as per-bucket (not cumulative) counts; the last bound is `f64::MAX`.
#[derive(Debug)]
struct BucketHistogram {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for BucketHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let metric = ConstCounter::new(v);
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let metric = ConstGauge::new(v);
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge_f64(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let metric = ConstGauge::new(v);
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn index(v: Option<u64>) -> i64 {
    v.map(|i| i64::try_from(i).unwrap_or(i64::MAX)).unwrap_or(0)
}

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Encodes `status`; a separate function so tests can feed a status directly.
fn encode_status(status: &ClusterStatus, mut enc: DescriptorEncoder) -> std::fmt::Result {
    let wal = &status.wal;
    counter(
        &mut enc,
        "metaserver_wal_appends",
        "WAL records appended",
        wal.appends,
    )?;
    counter(
        &mut enc,
        "metaserver_wal_bytes",
        "WAL bytes written by appends",
        wal.bytes,
    )?;
    counter(
        &mut enc,
        "metaserver_wal_barriers",
        "WAL fsync barriers completed",
        wal.barriers,
    )?;
    counter(
        &mut enc,
        "metaserver_wal_records_synced",
        "WAL records made durable by barriers",
        wal.records_synced,
    )?;
    gauge_f64(
        &mut enc,
        "metaserver_wal_records_per_barrier",
        "WAL records made durable per barrier, on average since start",
        wal.records_per_barrier(),
    )?;
    let latency = &wal.barrier_latency;
    let mut buckets: Vec<(f64, u64)> = latency
        .bounds_seconds
        .iter()
        .copied()
        .zip(latency.counts.iter().copied())
        .collect();
    buckets.push((
        f64::MAX,
        latency
            .counts
            .get(latency.bounds_seconds.len())
            .copied()
            .unwrap_or(0),
    ));
    let histogram = BucketHistogram {
        sum: latency.sum_seconds,
        count: latency.count,
        buckets,
    };
    histogram.encode(enc.encode_descriptor(
        "metaserver_wal_barrier_seconds",
        "WAL barrier (fdatasync) latency",
        None,
        histogram.metric_type(),
    )?)?;

    gauge(
        &mut enc,
        "metaserver_raft_term",
        "Current Raft term",
        count(status.term),
    )?;
    gauge(
        &mut enc,
        "metaserver_cluster_version",
        "The cluster's version as this node applied it (log commands every member can apply)",
        i64::from(status.cluster_version),
    )?;
    gauge(
        &mut enc,
        "metaserver_epoch_floor",
        "The cluster's epoch floor as this node applied it: every registration's epoch is at least this",
        count(status.epoch_floor),
    )?;
    gauge(
        &mut enc,
        "metaserver_restore_unended",
        "1 while a restore into the cluster has not ended (under way, or cut off part way and the cluster holds part of a backup), as this node applied it",
        i64::from(status.restore.is_some()),
    )?;
    gauge(
        &mut enc,
        "metaserver_build_version",
        "The highest cluster version this node's build applies",
        i64::from(status.build_version),
    )?;
    gauge(
        &mut enc,
        "metaserver_raft_leader",
        "Id of the known leader (0 when none)",
        status.leader_id.map(count).unwrap_or(0),
    )?;
    gauge(
        &mut enc,
        "metaserver_raft_is_leader",
        "1 when this node is the leader",
        i64::from(status.role == Role::Leader),
    )?;
    gauge(
        &mut enc,
        "metaserver_raft_last_log_index",
        "Index of the last log entry",
        index(status.last_log_index),
    )?;
    gauge(
        &mut enc,
        "metaserver_raft_commit_index",
        "Highest index known committed",
        index(status.committed),
    )?;
    gauge(
        &mut enc,
        "metaserver_raft_applied_index",
        "Highest index applied to the registry",
        index(status.applied),
    )?;
    gauge(
        &mut enc,
        "metaserver_raft_purged_index",
        "Highest index purged from the log",
        index(status.purged),
    )?;
    {
        let mut metric = enc.encode_descriptor(
            "metaserver_raft_replication_lag",
            "Entries each member is behind the leader's last log index (leader only)",
            None,
            MetricType::Gauge,
        )?;
        for lag in &status.replication {
            let labels = [("node", lag.node.to_string())];
            ConstGauge::new(count(lag.lag)).encode(metric.encode_family(&labels)?)?;
        }
    }
    {
        // Unlike the lag, this grows while a member is down even when nothing is written.
        let mut metric = enc.encode_descriptor(
            "metaserver_raft_peer_heard_seconds",
            "Seconds since the leader last heard from each member, or since it took office if it never has (leader only)",
            None,
            MetricType::Gauge,
        )?;
        for lag in &status.replication {
            let Some(ms) = lag.heard_ms else { continue };
            let labels = [("node", lag.node.to_string())];
            ConstGauge::new(ms as f64 / 1000.0).encode(metric.encode_family(&labels)?)?;
        }
    }

    let sm = &status.state_machine;
    counter(
        &mut enc,
        "metaserver_snapshot_builds",
        "Snapshots built",
        sm.snapshot_builds,
    )?;
    counter(
        &mut enc,
        "metaserver_snapshot_build_failures",
        "Snapshot builds that failed (automatic builds pause after one)",
        sm.snapshot_build_failures,
    )?;
    counter(
        &mut enc,
        "metaserver_snapshot_build_bytes",
        "Payload bytes of snapshots built",
        sm.snapshot_build_bytes,
    )?;
    let seconds = ConstCounter::new(sm.snapshot_build_millis as f64 / 1000.0);
    seconds.encode(enc.encode_descriptor(
        "metaserver_snapshot_build_seconds",
        "Time spent building snapshots",
        None,
        seconds.metric_type(),
    )?)?;
    counter(
        &mut enc,
        "metaserver_snapshot_installs",
        "Snapshots installed (received or restored)",
        sm.snapshot_installs,
    )?;
    counter(
        &mut enc,
        "metaserver_snapshot_install_refusals",
        "Snapshots from the leader refused: the data dir had no room for them",
        sm.snapshot_install_refusals,
    )?;
    if let Some(free) = status.data_dir_free_bytes {
        gauge(
            &mut enc,
            "metaserver_data_dir_free_bytes",
            "Bytes free to this process on the data dir's file system",
            count(free),
        )?;
    }
    gauge(
        &mut enc,
        "metaserver_min_free_bytes",
        "The reserve below which the leader refuses writes that add data (0: no guard)",
        count(status.min_free_bytes),
    )?;
    counter(
        &mut enc,
        "metaserver_snapshot_throttle_pauses",
        "Pauses of the snapshot rate limiter",
        status.snapshot_throttle_pauses,
    )?;
    let paused = ConstCounter::new(status.snapshot_throttle_millis as f64 / 1000.0);
    paused.encode(enc.encode_descriptor(
        "metaserver_snapshot_throttle_seconds",
        "Time the snapshot rate limiter paused",
        None,
        paused.metric_type(),
    )?)?;
    gauge(
        &mut enc,
        "metaserver_members_refusing",
        "Members whose answers lately refused this node's messages as another cluster's",
        count(status.refused_by.len() as u64),
    )?;
    gauge(
        &mut enc,
        "metaserver_members_refusing_token",
        "Members whose answers lately refused this node's token (401)",
        count(status.token_refused_by.len() as u64),
    )?;
    gauge(
        &mut enc,
        "metaserver_snapshot_rate_bytes_per_second",
        "Snapshot rate limit of exports, downloads and streams to members (0 = unlimited)",
        count(status.snapshot_rate),
    )?;
    gauge(
        &mut enc,
        "metaserver_snapshot_last_index",
        "Last log index covered by the newest snapshot",
        index(status.snapshot_index),
    )?;
    gauge(
        &mut enc,
        "metaserver_snapshot_last_bytes",
        "Payload bytes of the newest snapshot",
        status.snapshot_bytes.map(count).unwrap_or(0),
    )?;
    gauge(
        &mut enc,
        "metaserver_apply_max_micros",
        "Longest single apply call since start, in microseconds",
        count(sm.apply_max_micros),
    )?;

    gauge(
        &mut enc,
        "metaserver_registry_datanodes",
        "Registered datanodes",
        count(status.datanodes),
    )?;
    gauge(
        &mut enc,
        "metaserver_registry_replicas",
        "Registered shard replicas",
        count(status.replicas),
    )?;
    gauge(
        &mut enc,
        "metaserver_watches_waiting",
        "Watches (GET /v1/watch) waiting for a change",
        count(status.watches_waiting),
    )?;
    gauge(
        &mut enc,
        "metaserver_watch_floor_index",
        "Every change after this log index is kept for watchers",
        count(status.watch_floor),
    )?;
    Ok(())
}

/// The leader's liveness figures; nothing on other nodes.
fn encode_liveness(node: &MetaNode, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let Some((alive, collecting)) = node.liveness_figures() else {
        return Ok(());
    };
    gauge(
        enc,
        "metaserver_datanodes_alive",
        "Datanodes this leader heard a heartbeat from within the datanode timeout",
        count(alive as u64),
    )?;
    gauge_f64(
        enc,
        "metaserver_liveness_collecting_seconds",
        "How long this leader has collected heartbeats (it calls no datanode down before a whole timeout)",
        collecting.as_secs_f64(),
    )
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_liveness(&self.node, &mut encoder)?;
        encode_status(&self.node.status(), encoder)
    }
}
