//! Per-log metrics: appends, bytes, barriers, records covered per barrier and a barrier latency
//! histogram. Each [`crate::Wal`] has its own counters, so a test reads only its own log's.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the barrier latency buckets, in seconds (a last bucket catches the rest).
pub const LATENCY_BOUNDS_SECONDS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// A snapshot of a log's metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WalMetrics {
    /// Records appended, data and markers alike: every LSN handed out, so that
    /// `records_synced` never passes it.
    pub appends: u64,
    /// Bytes written to segment files by appends (headers included).
    pub bytes: u64,
    /// Barriers (fdatasync calls that publish a durable LSN) completed successfully.
    pub barriers: u64,
    /// LSNs made durable by those barriers, summed (records and markers).
    pub records_synced: u64,
    /// Segments created after open.
    pub segments_created: u64,
    /// Barrier latency.
    pub barrier_latency: LatencyHistogram,
}

impl WalMetrics {
    /// Records made durable per barrier, on average (0 without barriers).
    pub fn records_per_barrier(&self) -> f64 {
        if self.barriers == 0 {
            0.0
        } else {
            self.records_synced as f64 / self.barriers as f64
        }
    }
}

/// A latency histogram: `counts[i]` barriers took at most `bounds_seconds[i]` (and more than the
/// bound before); the last count is for longer ones. Not cumulative.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Upper bounds in seconds.
    pub bounds_seconds: Vec<f64>,
    /// One count per bound plus one for the overflow bucket.
    pub counts: Vec<u64>,
    /// Sum of all observations, in seconds.
    pub sum_seconds: f64,
    /// Number of observations.
    pub count: u64,
}

/// The live counters behind [`WalMetrics`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    appends: AtomicU64,
    bytes: AtomicU64,
    barriers: AtomicU64,
    records_synced: AtomicU64,
    segments_created: AtomicU64,
    latency: [AtomicU64; LATENCY_BOUNDS_SECONDS.len() + 1],
    latency_sum_nanos: AtomicU64,
}

impl Counters {
    pub fn appended(&self, records: u64, bytes: u64) {
        self.appends.fetch_add(records, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    pub fn barrier(&self, covered: u64, took: Duration) {
        self.barriers.fetch_add(1, Relaxed);
        self.records_synced.fetch_add(covered, Relaxed);
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS_SECONDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BOUNDS_SECONDS.len());
        self.latency[bucket].fetch_add(1, Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.latency_sum_nanos.fetch_add(nanos, Relaxed);
    }

    pub fn segment_created(&self) {
        self.segments_created.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> WalMetrics {
        let counts: Vec<u64> = self.latency.iter().map(|c| c.load(Relaxed)).collect();
        WalMetrics {
            appends: self.appends.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            barriers: self.barriers.load(Relaxed),
            records_synced: self.records_synced.load(Relaxed),
            segments_created: self.segments_created.load(Relaxed),
            barrier_latency: LatencyHistogram {
                bounds_seconds: LATENCY_BOUNDS_SECONDS.to_vec(),
                count: counts.iter().sum(),
                counts,
                sum_seconds: self.latency_sum_nanos.load(Relaxed) as f64 / 1e9,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_ratio() {
        let c = Counters::default();
        c.barrier(3, Duration::from_micros(40));
        c.barrier(1, Duration::from_millis(2));
        c.barrier(0, Duration::from_secs(3));
        let m = c.snapshot();
        assert_eq!(m.barriers, 3);
        assert_eq!(m.barrier_latency.count, 3);
        assert_eq!(m.barrier_latency.counts[0], 1);
        assert_eq!(m.barrier_latency.counts[5], 1);
        assert_eq!(*m.barrier_latency.counts.last().unwrap(), 1);
        assert!((m.records_per_barrier() - 4.0 / 3.0).abs() < 1e-9);
    }
}
