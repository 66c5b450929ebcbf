//! The storm's results: every measured run, summarised as medians per arm with the ratios of [`RATIOS`],
//! printed as markdown tables, checked against the targets, and written as JSON and a chart.

use anyhow::Result;
use serde_json::json;

use super::chart::{self, Series};
use super::options::Arm;
use super::reads::{self, ReadPoint};
use super::restart::{Pass, StormPoint, LOST_EVERY};
use super::single::{Route, SinglePoint};
use crate::report::{median, out_dir, print_table, write_json};

/// The arms compared in the medians' tables, each as the first's rate over the second's:
/// what sharing barriers gains, and what TLS costs.
const RATIOS: [(Arm, Arm); 2] = [(Arm::Shared, Arm::Own), (Arm::Tls, Arm::Shared)];

/// Everything one invocation measured.
#[derive(Default)]
pub struct Results {
    pub single: Vec<SinglePoint>,
    pub storm: Vec<StormPoint>,
    /// The storms again into the full registry, after each of `storm` (with prunes).
    pub again: Vec<StormPoint>,
    pub reads: Vec<ReadPoint>,
    pub removals: Vec<super::removal::RemovalPoint>,
    /// Single-shard points on servers whose fdatasync took `slow_sync_us` longer.
    pub slow_sync: Vec<SinglePoint>,
    pub slow_sync_us: u64,
}

/// Formats a number with `digits` decimals.
fn f(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

/// Formats an optional number, `-` when absent.
fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| f(v, digits)).unwrap_or_else(|| "-".into())
}

/// The median of the values that are present, if any.
fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    (!v.is_empty()).then(|| median(&v))
}

/// The largest peak RSS over the members of one run.
fn max_rss(p: &StormPoint) -> f64 {
    p.peak_rss_mib.iter().map(|r| r.1).fold(0.0, f64::max)
}

/// Prints one row per single-shard run.
pub(super) fn print_single_runs(points: &[SinglePoint]) {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                (p.round + 1).to_string(),
                p.arm.name().into(),
                p.route.label(p.clients),
                f(p.per_sec, 0),
                f(p.p50_ms, 2),
                f(p.p99_ms, 2),
                opt(p.records_per_barrier, 2),
                format!("{:.2} / {:.2}", p.cores.client, p.cores.servers),
                p.errors.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "round",
            "arm",
            "clients",
            "registrations/s",
            "p50 ms",
            "p99 ms",
            "records/barrier",
            "client / servers cores",
            "errors",
        ],
        &rows,
    );
}

/// Prints one row per storm run.
fn print_storm_runs(points: &[StormPoint]) {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let rss = p
                .peak_rss_mib
                .iter()
                .map(|(id, r)| format!("{id}:{r:.0}"))
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                (p.round + 1).to_string(),
                p.arm.name().into(),
                format!("{}x{}", p.datanodes, p.replicas / p.datanodes),
                f(p.seconds, 2),
                f(p.per_sec, 0),
                f(p.p50_ms, 1),
                f(p.p99_ms, 1),
                match p.pass {
                    Pass::Fresh => "-".into(),
                    Pass::Again => format!(
                        "{} ({} / {})",
                        p.pruned,
                        opt(p.prune_p50_ms, 1),
                        opt(p.prune_p99_ms, 1)
                    ),
                },
                format!(
                    "{} / {} ({} failed)",
                    opt(p.heartbeat_p50_ms, 1),
                    opt(p.heartbeat_p99_ms, 1),
                    p.heartbeat_errors
                ),
                format!(
                    "{} / {}",
                    f(p.admin_shard_p50_ms, 2),
                    f(p.admin_shard_p99_ms, 2)
                ),
                format!(
                    "{} / {}",
                    f(p.admin_cluster_p50_ms, 2),
                    f(p.admin_cluster_p99_ms, 2)
                ),
                format!(
                    "{} ({} reads, {} failed, {} skipped)",
                    f(p.admin_p99_ms, 2),
                    p.admin_reads,
                    p.admin_errors,
                    p.admin_skipped
                ),
                format!(
                    "{} / {}",
                    f(p.admin_write_p50_ms, 2),
                    f(p.admin_write_p99_ms, 2)
                ),
                rss,
                opt(p.records_per_barrier, 2),
                format!("{:.2} / {:.2}", p.cores.client, p.cores.servers),
                p.retries.to_string(),
                if p.verified { "yes" } else { "NO" }.into(),
            ]
        })
        .collect();
    print_table(
        &[
            "round",
            "arm",
            "datanodes x shards",
            "seconds",
            "replicas/s",
            "batch p50 ms",
            "batch p99 ms",
            "pruned (prune p50/p99 ms)",
            "heartbeat p50/p99 ms",
            "GET shard p50/p99 ms",
            "GET cluster p50/p99 ms",
            "admin p99 ms",
            "PUT key p50/p99 ms",
            "peak RSS MiB by node",
            "records/barrier",
            "client / servers cores",
            "retries",
            "count ok",
        ],
        &rows,
    );
}

/// Medians of the single-shard workload for one arm, client count and route.
struct SingleSummary {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    records_per_barrier: Option<f64>,
    /// Failed requests over every run (they are in neither the rate nor the latencies).
    errors: u64,
}

/// Medians of the storm for one arm.
struct StormSummary {
    datanodes: u64,
    replicas: u64,
    seconds: f64,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    admin_p50_ms: f64,
    admin_p99_ms: f64,
    admin_write_p50_ms: f64,
    admin_write_p99_ms: f64,
    peak_rss_mib: f64,
    /// The largest peak RSS of each member over the runs, by member id.
    peak_rss_mib_by_node: Vec<(u64, f64)>,
    records_per_barrier: Option<f64>,
    /// Admin reads that failed or were never sent, over every run (each counts in its run's p99
    /// as slower than any answer; enough of them make it infinite).
    admin_unanswered: u64,
    /// Whether every member held every acknowledged replica after every run.
    verified: bool,
}

/// Formats a rate, naming the failed requests that it leaves out, if any.
fn rate_and_errors(per_sec: f64, errors: u64) -> String {
    if errors == 0 {
        f(per_sec, 0)
    } else {
        format!("{} ({errors} failed)", f(per_sec, 0))
    }
}

/// A number for the JSON output: `null` for a value that is not finite (an infinite p99 means
/// that too many reads were never answered; `admin_unanswered` says how many).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

impl Results {
    fn arms(&self) -> Vec<Arm> {
        let mut arms = Vec::new();
        for a in self
            .single
            .iter()
            .map(|p| p.arm)
            .chain(self.storm.iter().map(|p| p.arm))
        {
            if !arms.contains(&a) {
                arms.push(a);
            }
        }
        arms
    }

    /// The client counts spread over the members, in order.
    fn client_counts(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self
            .single
            .iter()
            .filter(|p| p.route == Route::Spread)
            .map(|p| p.clients)
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// Every measured client count and route, in order: a count's follower point after it.
    fn single_points(&self) -> Vec<(usize, Route)> {
        let mut points: Vec<(usize, Route)> =
            self.single.iter().map(|p| (p.clients, p.route)).collect();
        points.sort_unstable_by_key(|(c, r)| (*c, *r == Route::Follower));
        points.dedup();
        points
    }

    fn single_summary(&self, arm: Arm, clients: usize) -> Option<SingleSummary> {
        self.single_summary_via(arm, clients, Route::Spread)
    }

    fn single_summary_via(&self, arm: Arm, clients: usize, route: Route) -> Option<SingleSummary> {
        let runs: Vec<&SinglePoint> = self
            .single
            .iter()
            .filter(|p| p.arm == arm && p.clients == clients && p.route == route)
            .collect();
        if runs.is_empty() {
            return None;
        }
        let m = |g: fn(&SinglePoint) -> f64| median(&runs.iter().map(|p| g(p)).collect::<Vec<_>>());
        Some(SingleSummary {
            per_sec: m(|p| p.per_sec),
            p50_ms: m(|p| p.p50_ms),
            p99_ms: m(|p| p.p99_ms),
            records_per_barrier: median_of(runs.iter().map(|p| p.records_per_barrier)),
            errors: runs.iter().map(|p| p.errors).sum(),
        })
    }

    fn storm_summary(&self, arm: Arm) -> Option<StormSummary> {
        let runs: Vec<&StormPoint> = self.storm.iter().filter(|p| p.arm == arm).collect();
        let first = runs.first()?;
        let m = |g: fn(&StormPoint) -> f64| median(&runs.iter().map(|p| g(p)).collect::<Vec<_>>());
        Some(StormSummary {
            datanodes: first.datanodes,
            replicas: first.replicas,
            seconds: m(|p| p.seconds),
            per_sec: m(|p| p.per_sec),
            p50_ms: m(|p| p.p50_ms),
            p99_ms: m(|p| p.p99_ms),
            admin_p50_ms: m(|p| p.admin_p50_ms),
            admin_p99_ms: m(|p| p.admin_p99_ms),
            admin_write_p50_ms: m(|p| p.admin_write_p50_ms),
            admin_write_p99_ms: m(|p| p.admin_write_p99_ms),
            peak_rss_mib: m(max_rss),
            peak_rss_mib_by_node: {
                let mut by_node: Vec<(u64, f64)> = Vec::new();
                for &(id, rss) in runs.iter().flat_map(|p| &p.peak_rss_mib) {
                    match by_node.iter_mut().find(|(n, _)| *n == id) {
                        Some((_, max)) => *max = max.max(rss),
                        None => by_node.push((id, rss)),
                    }
                }
                by_node.sort_by_key(|(id, _)| *id);
                by_node
            },
            records_per_barrier: median_of(runs.iter().map(|p| p.records_per_barrier)),
            admin_unanswered: runs.iter().map(|p| p.admin_errors + p.admin_skipped).sum(),
            verified: runs.iter().all(|p| p.verified),
        })
    }

    /// Prints every table: the raw runs, the medians with ratios, and the targets.
    pub fn print(&self) {
        if !self.single.is_empty() {
            println!("\n### Single-shard writes, every run\n");
            print_single_runs(&self.single);
            self.print_single_medians();
        }
        if !self.slow_sync.is_empty() {
            super::slow_sync::print(&self.slow_sync, self.slow_sync_us);
        }
        if !self.storm.is_empty() {
            println!("\n### Restart storm, every run\n");
            print_storm_runs(&self.storm);
            self.print_storm_medians();
        }
        if !self.again.is_empty() {
            println!(
                "\n### Restart storm again, into the full registry: every datanode registers again, \
                 reports all but one replica in {LOST_EVERY} (each unchanged) and prunes the rest\n"
            );
            print_storm_runs(&self.again);
        }
        if !self.reads.is_empty() {
            reads::print(&self.reads);
        }
        if !self.removals.is_empty() {
            super::removal::print(&self.removals);
        }
        if !self.single.is_empty() || !self.storm.is_empty() {
            self.print_targets();
        }
    }

    fn print_single_medians(&self) {
        let arms = self.arms();
        println!("\n### Single-shard writes, medians over rounds\n");
        let mut header = vec!["clients".to_string()];
        for a in &arms {
            header.push(format!("{} reg/s", a.name()));
            header.push(format!("{} p50 / p99 ms", a.name()));
            header.push(format!("{} records/barrier", a.name()));
        }
        let ratios: Vec<(Arm, Arm)> = RATIOS
            .into_iter()
            .filter(|(a, b)| arms.contains(a) && arms.contains(b))
            .collect();
        for (a, b) in &ratios {
            header.push(format!("{}/{}", a.name(), b.name()));
        }
        let rows: Vec<Vec<String>> = self
            .single_points()
            .into_iter()
            .map(|(c, route)| {
                let mut row = vec![route.label(c)];
                for a in &arms {
                    match self.single_summary_via(*a, c, route) {
                        Some(s) => {
                            row.push(rate_and_errors(s.per_sec, s.errors));
                            row.push(format!("{} / {}", f(s.p50_ms, 2), f(s.p99_ms, 2)));
                            row.push(opt(s.records_per_barrier, 2));
                        }
                        None => row.extend(["-".into(), "-".into(), "-".into()]),
                    }
                }
                for (a, b) in &ratios {
                    let r = self
                        .single_summary_via(*a, c, route)
                        .zip(self.single_summary_via(*b, c, route))
                        .map(|(x, y)| x.per_sec / y.per_sec);
                    row.push(opt(r, 2));
                }
                row
            })
            .collect();
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        print_table(&header, &rows);
    }

    fn print_storm_medians(&self) {
        println!("\n### Restart storm, medians over rounds\n");
        let rows: Vec<Vec<String>> = self
            .arms()
            .into_iter()
            .filter_map(|a| self.storm_summary(a).map(|s| (a, s)))
            .map(|(a, s)| {
                vec![
                    a.name().into(),
                    s.datanodes.to_string(),
                    s.replicas.to_string(),
                    f(s.seconds, 2),
                    f(s.per_sec, 0),
                    format!("{} / {}", f(s.p50_ms, 1), f(s.p99_ms, 1)),
                    format!("{} / {}", f(s.admin_p50_ms, 2), f(s.admin_p99_ms, 2)),
                    format!(
                        "{} / {}",
                        f(s.admin_write_p50_ms, 2),
                        f(s.admin_write_p99_ms, 2)
                    ),
                    f(s.peak_rss_mib, 0),
                    opt(s.records_per_barrier, 2),
                ]
            })
            .collect();
        print_table(
            &[
                "arm",
                "datanodes",
                "replicas",
                "seconds",
                "replicas/s",
                "batch p50 / p99 ms",
                "admin p50 / p99 ms",
                "PUT key p50 / p99 ms",
                "peak RSS MiB (max node)",
                "records/barrier",
            ],
            &rows,
        );
        for (a, b) in RATIOS {
            if let (Some(x), Some(y)) = (self.storm_summary(a), self.storm_summary(b)) {
                println!(
                    "\n{}/{} replicas/s ratio: {:.2}",
                    a.name(),
                    b.name(),
                    x.per_sec / y.per_sec
                );
            }
        }
    }

    /// Prints each target of the issue with what was measured and whether it was met: rates
    /// and single-shard latencies as medians over rounds, the storm's limits in the worst run.
    fn print_targets(&self) {
        let rows = self.targets();
        if !rows.is_empty() {
            println!(
                "\n### Targets (shared arm: rates are medians; storm limits hold in every run of \
                 both passes)\n"
            );
            print_table(&["target", "measured", "verdict"], &rows);
        }
    }

    /// The rows of the targets table: target, measured, verdict (`met` or `MISSED`).
    fn targets(&self) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        let mut check = |what: &str, measured: String, ok: bool| {
            rows.push(vec![
                what.to_string(),
                measured,
                if ok { "met" } else { "MISSED" }.into(),
            ]);
        };
        // One client is judged at the leader and at a follower (every write forwarded).
        for (route, at) in [
            (Route::Spread, "at the leader"),
            (Route::Follower, "via a follower"),
        ] {
            if let Some(s) = self.single_summary_via(Arm::Shared, 1, route) {
                check(
                    &format!("shared, 1 client {at}: >= 1200/s"),
                    f(s.per_sec, 0),
                    s.per_sec >= 1200.0,
                );
                check(
                    &format!("shared, 1 client {at}: p50 <= 0.8 ms"),
                    f(s.p50_ms, 2),
                    s.p50_ms <= 0.8,
                );
            }
        }
        if let Some(s) = self.single_summary(Arm::Shared, 64) {
            check(
                "shared, 64 clients: >= 8000/s",
                f(s.per_sec, 0),
                s.per_sec >= 8000.0,
            );
        }
        if let (Some(s), Some(o)) = (
            self.single_summary(Arm::Shared, 16),
            self.single_summary(Arm::Own, 16),
        ) {
            let r = s.per_sec / o.per_sec;
            check("16 clients: shared >= 3x own", format!("{r:.2}x"), r >= 3.0);
        }
        if let Some(s) = self.storm_summary(Arm::Shared) {
            // The limits hold in every run, not on average: the worst run and the worst server
            // are judged, of the fresh storm and of the storm again into the full registry, and
            // a run whose members do not all hold what was acknowledged fails the storm target.
            // An admin read that failed or was never sent is in its run's p99 as slower than any.
            let runs: Vec<&StormPoint> = self
                .storm
                .iter()
                .chain(&self.again)
                .filter(|p| p.arm == Arm::Shared)
                .collect();
            let per_million = |p: &StormPoint| p.seconds * 1e6 / p.replicas.max(1) as f64;
            let worst_time = runs.iter().map(|p| per_million(p)).fold(0.0, f64::max);
            let scaled = if s.replicas == 1_000_000 {
                ""
            } else {
                " (scaled)"
            };
            let unverified = runs.iter().filter(|p| !p.verified).count();
            let held = if unverified == 0 {
                "every member holds every replica".to_string()
            } else {
                format!("but {unverified} run(s) lost replicas")
            };
            check(
                &format!("storm: 1M replicas in <= 15 s{scaled}"),
                format!(
                    "{:.2} s (worst run of either pass {worst_time:.2} s), {held}",
                    s.seconds * 1e6 / s.replicas.max(1) as f64
                ),
                worst_time <= 15.0 && unverified == 0,
            );
            let worst_p99 = runs.iter().map(|p| p.admin_p99_ms).fold(0.0, f64::max);
            let unanswered: u64 = runs.iter().map(|p| p.admin_errors + p.admin_skipped).sum();
            check(
                "storm: admin p99 <= 50 ms",
                format!(
                    "{} (worst run of either pass {}; {unanswered} read(s) failed or not sent)",
                    f(s.admin_p99_ms, 2),
                    f(worst_p99, 2)
                ),
                worst_p99 <= 50.0,
            );
            let worst_rss = runs.iter().map(|p| max_rss(p)).fold(0.0, f64::max);
            check(
                "storm: peak RSS <= 512 MiB per server",
                format!("{} (any server, any run)", f(worst_rss, 0)),
                worst_rss <= 512.0,
            );
        }
        rows
    }

    /// The JSON output: one object of medians per workload, arm and client count, with the
    /// issue's keys and a few more: `errors` (failed requests, over the runs), for one client
    /// the figures at a follower (`follower_per_sec`, `follower_p50_ms`, `follower_p99_ms`,
    /// `follower_errors`), and
    /// for the storm `admin_unanswered`, `verified` and `peak_rss_mib_by_node`.
    pub fn json(&self) -> serde_json::Value {
        let mut out = Vec::new();
        for arm in self.arms() {
            for c in self.client_counts() {
                if let Some(s) = self.single_summary(arm, c) {
                    let mut o = json!({
                        "workload": "single",
                        "arm": arm.name(),
                        "clients": c,
                        "per_sec": s.per_sec,
                        "p50_ms": s.p50_ms,
                        "p99_ms": s.p99_ms,
                        "errors": s.errors,
                    });
                    if let Some(v) = self.single_summary_via(arm, c, Route::Follower) {
                        o["follower_per_sec"] = json!(v.per_sec);
                        o["follower_p50_ms"] = json!(v.p50_ms);
                        o["follower_p99_ms"] = json!(v.p99_ms);
                        o["follower_errors"] = json!(v.errors);
                    }
                    out.push(o);
                }
            }
        }
        for arm in self.arms() {
            if let Some(s) = self.storm_summary(arm) {
                out.push(json!({
                    "workload": "storm",
                    "arm": arm.name(),
                    "clients": s.datanodes,
                    "per_sec": s.per_sec,
                    "p50_ms": s.p50_ms,
                    "p99_ms": s.p99_ms,
                    "seconds": s.seconds,
                    "admin_p50_ms": finite(s.admin_p50_ms),
                    "admin_p99_ms": finite(s.admin_p99_ms),
                    "admin_unanswered": s.admin_unanswered,
                    "admin_write_p50_ms": finite(s.admin_write_p50_ms),
                    "admin_write_p99_ms": finite(s.admin_write_p99_ms),
                    "peak_rss_mib": s.peak_rss_mib,
                    "peak_rss_mib_by_node": s
                        .peak_rss_mib_by_node
                        .iter()
                        .map(|(id, rss)| (id.to_string(), json!(rss)))
                        .collect::<serde_json::Map<_, _>>(),
                    "records_per_barrier": s.records_per_barrier,
                    "verified": s.verified,
                }));
            }
        }
        serde_json::Value::Array(out)
    }

    /// Writes `target/bench/storm.json` and, when the single-shard workload ran,
    /// `target/bench/storm.svg`.
    pub fn write(&self) -> Result<()> {
        if self.single.is_empty() && self.storm.is_empty() {
            return Ok(());
        }
        let path = write_json("storm.json", &self.json())?;
        println!("\nwrote {}", path.display());
        if !self.single.is_empty() {
            let series: Vec<Series> = self
                .arms()
                .into_iter()
                .map(|a| Series {
                    name: format!("{} barriers", a.name()),
                    points: self
                        .client_counts()
                        .into_iter()
                        .filter_map(|c| self.single_summary(a, c).map(|s| (c, s.per_sec)))
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            let svg = out_dir()?.join("storm.svg");
            chart::draw(&svg, &series)?;
            println!("wrote {}", svg.display());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
