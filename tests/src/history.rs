//! Linearizable reads under faults: one sequential writer per key writes increasing numbers while
//! readers read with `consistency=linearizable` or `consistency=lease` (chosen at random per
//! read) from random nodes; the recorded history is checked for linearizability, completely
//! (`zone.rs`), key by key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::client::{Api, Consistency};
use crate::cluster::Endpoints;
use crate::seed::derived_rng;
use crate::zone::{zone_violations, Nanos, Span, ValueOps, BEFORE_ALL, NEVER_ANSWERED};

/// How a write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Acknowledged at this time.
    Acked(Instant),
    /// No answer: it may take effect at any later time, or never.
    Unknown,
    /// Refused: it never takes effect.
    Refused,
}

/// One write of `value` (values of a key are 1, 2, 3, ... in the order the writer issued them).
#[derive(Clone, Debug)]
pub struct WriteOp {
    /// The value written.
    pub value: u64,
    /// When the request was sent.
    pub start: Instant,
    /// How it ended.
    pub outcome: WriteOutcome,
}

/// One successful read.
#[derive(Clone, Debug)]
pub struct ReadOp {
    /// The key.
    pub key: String,
    /// The node asked.
    pub node: u64,
    /// How the read asked.
    pub consistency: Consistency,
    /// When the request was sent.
    pub start: Instant,
    /// When the answer arrived.
    pub end: Instant,
    /// The value read; 0 when the key did not exist.
    pub value: u64,
    /// The revision read (0 when absent).
    pub revision: u64,
}

/// Everything recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Writes per key, in issue order.
    pub writes: BTreeMap<String, Vec<WriteOp>>,
    /// Successful reads.
    pub reads: Vec<ReadOp>,
}

impl History {
    /// A line for the test's output: how many operations the history holds, by kind.
    pub fn summary(&self) -> String {
        let lease = self
            .reads
            .iter()
            .filter(|r| r.consistency == Consistency::Lease)
            .count();
        let (mut acked, mut unknown, mut refused) = (0, 0, 0);
        for w in self.writes.values().flatten() {
            match w.outcome {
                WriteOutcome::Acked(_) => acked += 1,
                WriteOutcome::Unknown => unknown += 1,
                WriteOutcome::Refused => refused += 1,
            }
        }
        format!(
            "{} reads ({lease} through the lease), {} writes ({acked} acknowledged, {unknown} unanswered, {refused} refused)",
            self.reads.len(),
            acked + unknown + refused
        )
    }

    /// Every way in which the history is not that of linearizable registers (one per key).
    ///
    /// A read of value `v` is wrong when `v` was never written, was refused, or was sent only
    /// after the read ended; the rest is the complete check of `zone.rs`, with each unanswered
    /// write free to take effect at any time after it was sent (or never, when no read returned
    /// it). Revisions must also agree: one value, one revision, and revisions that grow with the
    /// values of acknowledged writes.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut by_key: BTreeMap<&str, Vec<&ReadOp>> = BTreeMap::new();
        for read in &self.reads {
            by_key.entry(&read.key).or_default().push(read);
        }
        // Times in nanoseconds from the first request sent.
        let base = self
            .reads
            .iter()
            .map(|r| r.start)
            .chain(self.writes.values().flatten().map(|w| w.start))
            .min();
        let nanos = |t: Instant| match base {
            Some(base) => t.duration_since(base).as_nanos() as Nanos,
            None => 0,
        };
        let empty = Vec::new();
        for (key, reads) in by_key {
            let writes = self.writes.get(key).unwrap_or(&empty);
            let write = |v: u64| {
                if v == 0 {
                    None
                } else {
                    writes.get(v as usize - 1)
                }
            };
            // The initial absence, and every write that a read returned or that was
            // acknowledged, with the reads that returned it.
            let mut values: BTreeMap<u64, ValueOps> = BTreeMap::new();
            values.insert(
                0,
                ValueOps {
                    value: 0,
                    write: Span {
                        start: BEFORE_ALL,
                        end: BEFORE_ALL,
                    },
                    reads: Vec::new(),
                },
            );
            for w in writes {
                if let WriteOutcome::Acked(end) = w.outcome {
                    values.insert(w.value, value_ops(w, nanos(w.start), nanos(end)));
                }
            }
            let mut revisions: BTreeMap<u64, u64> = BTreeMap::new();
            for read in &reads {
                let v = read.value;
                let at = format!(
                    "key {key} read {v} (revision {}) from node {} ({:?})",
                    read.revision, read.node, read.consistency
                );
                if v != 0 {
                    match write(v) {
                        None => {
                            out.push(format!("{at}: value never written"));
                            continue;
                        }
                        Some(w) if w.outcome == WriteOutcome::Refused => {
                            out.push(format!("{at}: write was refused"));
                            continue;
                        }
                        Some(w) if w.start > read.end => {
                            out.push(format!("{at}: written only after the read ended"))
                        }
                        Some(_) => {}
                    }
                }
                if let Some(rev) = revisions.insert(v, read.revision) {
                    if rev != read.revision {
                        out.push(format!("{at}: also read with revision {rev}"));
                    }
                }
                let ops = values.entry(v).or_insert_with(|| {
                    let w = write(v).expect("checked above");
                    value_ops(w, nanos(w.start), NEVER_ANSWERED)
                });
                ops.reads.push(Span {
                    start: nanos(read.start),
                    end: nanos(read.end),
                });
            }
            let values: Vec<ValueOps> = values.into_values().collect();
            out.extend(
                zone_violations(&values)
                    .into_iter()
                    .map(|v| format!("key {key}: {v}")),
            );
            // Revisions follow the order writes took effect; only acknowledged writes have a
            // known order (an unanswered one may take effect after later ones).
            let acked =
                |v: u64| write(v).is_some_and(|w| matches!(w.outcome, WriteOutcome::Acked(_)));
            let mut last = (0u64, 0u64);
            for (v, rev) in revisions.into_iter().filter(|(v, _)| acked(*v)) {
                if last.0 > 0 && rev <= last.1 {
                    out.push(format!(
                        "key {key}: value {v} has revision {rev}, older value {} has {}",
                        last.0, last.1
                    ));
                }
                last = (v, rev);
            }
        }
        out
    }
}

/// The cluster of write `w`, sent at `start` and answered at `end`, before any read is added.
fn value_ops(w: &WriteOp, start: Nanos, end: Nanos) -> ValueOps {
    ValueOps {
        value: w.value,
        write: Span { start, end },
        reads: Vec::new(),
    }
}

/// How long the workload waits for an answer. An operation sent to a node that cannot reach a
/// quorum waits this long; shorter than the usual request timeout, so the workload spends its
/// time on operations that can complete.
const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// The running workload.
pub struct LinearizableWorkload {
    stopping: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    tasks: Vec<JoinHandle<()>>,
}

impl LinearizableWorkload {
    /// Starts one writer per key (`{prefix}{n}`) and `readers` readers.
    pub fn start(
        endpoints: Endpoints,
        http: reqwest::Client,
        prefix: &str,
        keys: usize,
        readers: usize,
        seed: u64,
    ) -> LinearizableWorkload {
        let stopping = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(History::default()));
        let keys: Vec<String> = (0..keys).map(|k| format!("{prefix}{k}")).collect();
        let mut tasks = Vec::new();
        for (n, key) in keys.iter().enumerate() {
            let (endpoints, http, stopping, history) = (
                endpoints.clone(),
                http.clone(),
                stopping.clone(),
                history.clone(),
            );
            let key = key.clone();
            let mut rng = derived_rng(seed, 2_000_000 + n as u64);
            tasks.push(tokio::spawn(async move {
                let mut value = 0u64;
                while !stopping.load(Ordering::SeqCst) {
                    let live = endpoints.live();
                    if live.is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    let (_, addr) = live[rng.usize(..live.len())];
                    value += 1;
                    let start = Instant::now();
                    let result = Api::with_client(http.clone(), addr)
                        .with_timeout(OP_TIMEOUT)
                        .kv_put(&key, value.to_string().as_bytes(), None)
                        .await;
                    let outcome = match result {
                        Ok(_) => WriteOutcome::Acked(Instant::now()),
                        Err(err) if err.is_definite_rejection() => WriteOutcome::Refused,
                        Err(_) => WriteOutcome::Unknown,
                    };
                    history
                        .lock()
                        .unwrap()
                        .writes
                        .entry(key.clone())
                        .or_default()
                        .push(WriteOp {
                            value,
                            start,
                            outcome,
                        });
                    if !matches!(outcome, WriteOutcome::Acked(_)) {
                        tokio::time::sleep(Duration::from_millis(rng.u64(20..80))).await;
                    }
                }
            }));
        }
        for n in 0..readers {
            let (endpoints, http, stopping, history) = (
                endpoints.clone(),
                http.clone(),
                stopping.clone(),
                history.clone(),
            );
            let keys = keys.clone();
            let mut rng = derived_rng(seed, 3_000_000 + n as u64);
            tasks.push(tokio::spawn(async move {
                while !stopping.load(Ordering::SeqCst) {
                    let live = endpoints.live();
                    if live.is_empty() || keys.is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    let (node, addr) = live[rng.usize(..live.len())];
                    let key = keys[rng.usize(..keys.len())].clone();
                    let consistency = if rng.bool() {
                        Consistency::Lease
                    } else {
                        Consistency::Linearizable
                    };
                    let start = Instant::now();
                    match Api::with_client(http.clone(), addr)
                        .with_timeout(OP_TIMEOUT)
                        .kv_get(&key, consistency)
                        .await
                    {
                        Ok(found) => {
                            let end = Instant::now();
                            let (value, revision) = match found {
                                None => (0, 0),
                                Some((bytes, revision)) => {
                                    let text = String::from_utf8_lossy(&bytes).into_owned();
                                    // An unparsable value is recorded as one never written.
                                    (text.parse().unwrap_or(u64::MAX), revision)
                                }
                            };
                            history.lock().unwrap().reads.push(ReadOp {
                                key,
                                node,
                                consistency,
                                start,
                                end,
                                value,
                                revision,
                            });
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(rng.u64(20..80))).await,
                    }
                }
            }));
        }
        LinearizableWorkload {
            stopping,
            history,
            tasks,
        }
    }

    /// Number of successful reads so far.
    pub fn reads(&self) -> usize {
        self.history.lock().unwrap().reads.len()
    }

    /// Stops every task and returns the history.
    pub async fn stop(self) -> anyhow::Result<History> {
        self.stopping.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await?;
        }
        let history = self.history.lock().unwrap().clone();
        Ok(history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn history(
        base: Instant,
        writes: &[(u64, u64, Option<u64>)],
        reads: &[(u64, u64, u64, u64)],
    ) -> History {
        let mut h = History::default();
        for (value, start, end) in writes {
            let outcome = match end {
                Some(end) => WriteOutcome::Acked(at(base, *end)),
                None => WriteOutcome::Unknown,
            };
            h.writes.entry("k".into()).or_default().push(WriteOp {
                value: *value,
                start: at(base, *start),
                outcome,
            });
        }
        for (start, end, value, revision) in reads {
            h.reads.push(ReadOp {
                key: "k".into(),
                node: 1,
                consistency: Consistency::Linearizable,
                start: at(base, *start),
                end: at(base, *end),
                value: *value,
                revision: *revision,
            });
        }
        h
    }

    #[test]
    fn accepts_a_correct_history() {
        let base = Instant::now();
        let h = history(
            base,
            &[(1, 0, Some(10)), (2, 20, Some(30))],
            &[(5, 8, 0, 0), (12, 15, 1, 3), (25, 40, 2, 5)],
        );
        assert!(h.violations().is_empty(), "{:?}", h.violations());
    }

    #[test]
    fn reports_a_read_older_than_an_acknowledged_write() {
        let base = Instant::now();
        let h = history(
            base,
            &[(1, 0, Some(10)), (2, 20, Some(30))],
            &[(35, 40, 1, 3)],
        );
        assert_eq!(h.violations().len(), 1, "{:?}", h.violations());
        let h = history(base, &[(1, 0, Some(10))], &[(15, 20, 0, 0)]);
        assert_eq!(h.violations().len(), 1, "{:?}", h.violations());
    }

    #[test]
    fn allows_an_unanswered_write_to_take_effect_late() {
        let base = Instant::now();
        let h = history(base, &[(1, 0, None), (2, 20, Some(30))], &[(35, 40, 1, 9)]);
        assert!(h.violations().is_empty(), "{:?}", h.violations());
    }

    /// Write 1 is unanswered, write 2 acknowledged; a read after that returns 1 (write 1 took
    /// effect late), so 2 can never be read again.
    #[test]
    fn reports_a_value_that_comes_back() {
        let base = Instant::now();
        let h = history(
            base,
            &[(1, 0, None), (2, 20, Some(30))],
            &[(35, 40, 1, 9), (45, 50, 2, 5)],
        );
        assert_eq!(h.violations().len(), 1, "{:?}", h.violations());
        // Reads that overlap may see either order.
        let h = history(
            base,
            &[(1, 0, None), (2, 20, Some(30))],
            &[(35, 50, 1, 9), (45, 55, 2, 5)],
        );
        assert!(h.violations().is_empty(), "{:?}", h.violations());
        // A late unanswered write has a newer revision than the acknowledged one before it.
        let h = history(
            base,
            &[(1, 0, None), (2, 20, Some(30))],
            &[(25, 28, 0, 0), (31, 33, 2, 5), (35, 40, 1, 9)],
        );
        assert!(h.violations().is_empty(), "{:?}", h.violations());
    }

    /// Neither write is answered, so either may take effect first; but a reader cannot see 2,
    /// then 1, then 2 again.
    #[test]
    fn reports_unanswered_writes_read_back_and_forth() {
        let base = Instant::now();
        let h = history(
            base,
            &[(1, 0, None), (2, 20, None)],
            &[(25, 28, 2, 5), (30, 32, 1, 9), (35, 38, 2, 5)],
        );
        assert_eq!(h.violations().len(), 1, "{:?}", h.violations());
        let h = history(
            base,
            &[(1, 0, None), (2, 20, None)],
            &[(25, 28, 2, 5), (30, 32, 1, 9)],
        );
        assert!(h.violations().is_empty(), "{:?}", h.violations());
    }

    #[test]
    fn reports_reads_from_the_future_and_going_back() {
        let base = Instant::now();
        let h = history(base, &[(1, 50, Some(60))], &[(10, 20, 1, 3)]);
        assert!(!h.violations().is_empty());
        let h = history(
            base,
            &[(1, 0, Some(10)), (2, 20, None)],
            &[(25, 30, 2, 5), (35, 40, 1, 3)],
        );
        assert_eq!(h.violations().len(), 1, "{:?}", h.violations());
    }
}
