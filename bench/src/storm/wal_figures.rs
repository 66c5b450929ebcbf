//! The leader's write-ahead-log counters, read from its Prometheus `/metrics` text, so that the
//! records per barrier of one measured window can be computed from two readings.

use anyhow::{anyhow, bail, Result};

use super::api::Api;

/// WAL counters of one server at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WalFigures {
    /// Records made durable so far: the records (and markers) that barriers covered, summed; the
    /// records appended when the server does not count covered records.
    pub records: f64,
    /// Durability barriers (fdatasyncs) completed so far.
    pub barriers: f64,
}

impl WalFigures {
    /// Reads the leader's counters from `/metrics`, or from the `wal` figures of `/v1/cluster` when
    /// the Prometheus text has none.
    pub async fn read(api: &Api, base: &str) -> Result<WalFigures> {
        let text = api.metrics(base).await.map_err(|e| anyhow!("{e}"))?;
        match WalFigures::parse(&text) {
            Ok(f) => Ok(f),
            Err(metrics_err) => {
                let (appends, barriers) = api
                    .cluster_wal(base)
                    .await
                    .map_err(|e| anyhow!("{metrics_err}; and /v1/cluster: {e}"))?;
                Ok(WalFigures {
                    records: appends as f64,
                    barriers: barriers as f64,
                })
            }
        }
    }

    /// Reads the counters from Prometheus text. Records, in order of preference: the sum of a
    /// records-per-barrier histogram (`*wal*record*barrier*_sum`, with its `_count` as barriers),
    /// the covered-records counter (`*wal*records_synced*_total`), the append counter
    /// (`*wal*append*_total`). Barriers: `*wal*barrier*_total`, else the `_count` of the barrier
    /// latency histogram.
    pub fn parse(text: &str) -> Result<WalFigures> {
        let samples: Vec<(&str, f64)> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (name_labels, rest) = l.rsplit_once(' ')?;
                let value: f64 = rest.trim().parse().ok()?;
                let name = name_labels.split('{').next()?;
                Some((name, value))
            })
            .collect();
        let find = |pred: &dyn Fn(&str) -> bool| -> Option<f64> {
            let hits: Vec<f64> = samples
                .iter()
                .filter(|(n, _)| n.contains("wal") && pred(n))
                .map(|(_, v)| *v)
                .collect();
            (!hits.is_empty()).then(|| hits.iter().sum())
        };
        let per_barrier = |n: &str| n.contains("record") && n.contains("barrier");
        if let (Some(sum), Some(count)) = (
            find(&|n| per_barrier(n) && n.ends_with("_sum")),
            find(&|n| per_barrier(n) && n.ends_with("_count")),
        ) {
            return Ok(WalFigures {
                records: sum,
                barriers: count,
            });
        }
        let records =
            find(&|n| n.contains("records_synced") && n.ends_with("_total")).or_else(|| {
                find(&|n| {
                    n.contains("append")
                        && n.ends_with("_total")
                        && !n.contains("byte")
                        && !n.contains("barrier")
                })
            });
        let barriers =
            find(&|n| n.contains("barrier") && n.ends_with("_total") && !n.contains("record"))
                .or_else(|| {
                    find(&|n| {
                        n.contains("barrier")
                            && n.ends_with("_count")
                            && (n.contains("latency")
                                || n.contains("seconds")
                                || n.contains("duration"))
                    })
                });
        match (records, barriers) {
            (Some(records), Some(barriers)) => Ok(WalFigures { records, barriers }),
            _ => bail!(
                "no WAL record and barrier counters in /metrics (found records={records:?}, barriers={barriers:?})"
            ),
        }
    }

    /// Records per barrier between `self` (earlier) and `later`; zero when no barrier ran.
    pub fn records_per_barrier(&self, later: &WalFigures) -> f64 {
        let barriers = later.barriers - self.barriers;
        if barriers <= 0.0 {
            return 0.0;
        }
        (later.records - self.records) / barriers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covered_records_are_preferred_to_appends_and_labels_ignored() {
        let text = "# HELP metaserver_wal_appends Records appended.\n\
                    # TYPE metaserver_wal_appends counter\n\
                    metaserver_wal_appends_total 120\n\
                    metaserver_wal_bytes_total 24000\n\
                    metaserver_wal_barriers_total{node=\"1\"} 40\n\
                    metaserver_wal_records_synced_total 100\n\
                    metaserver_wal_records_per_barrier 2.5\n\
                    metaserver_wal_barrier_seconds_count 40\n\
                    metaserver_http_requests_total{route=\"/v1/cluster\"} 9\n\
                    # EOF\n";
        let f = WalFigures::parse(text).unwrap();
        assert_eq!(
            f,
            WalFigures {
                records: 100.0,
                barriers: 40.0
            }
        );
        let without = text.replace("metaserver_wal_records_synced_total 100\n", "");
        assert_eq!(WalFigures::parse(&without).unwrap().records, 120.0);
    }

    #[test]
    fn a_records_per_barrier_histogram_is_preferred() {
        let text = "metaserver_wal_appends_total 7\n\
                    metaserver_wal_barriers_total 7\n\
                    metaserver_wal_records_per_barrier_sum 90\n\
                    metaserver_wal_records_per_barrier_count 10\n";
        let f = WalFigures::parse(text).unwrap();
        assert_eq!(f.records, 90.0);
        assert_eq!(f.barriers, 10.0);
    }

    #[test]
    fn missing_counters_are_an_error_and_no_barrier_is_zero() {
        assert!(WalFigures::parse("metaserver_http_requests_total 3\n").is_err());
        let a = WalFigures {
            records: 10.0,
            barriers: 5.0,
        };
        assert_eq!(a.records_per_barrier(&a), 0.0);
        let b = WalFigures {
            records: 30.0,
            barriers: 9.0,
        };
        assert_eq!(a.records_per_barrier(&b), 5.0);
    }
}
