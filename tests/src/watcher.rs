//! A client that follows `GET /v1/watch` through faults, as a router caching the shard map would:
//! it asks a live member for the changes after the index it reached and moves to another member
//! when one fails, stops, or no longer keeps that index. The check compares what it saw with the
//! model: every acknowledged replica and key must appear in an event, and events come in log
//! order, each once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::cluster::Endpoints;
use crate::model::Model;
use crate::note::note;
use crate::poll::poll_until;
use crate::registry_state::RegistryState;

/// How long one watch waits at a member: short, so the watcher notices a stop request soon.
const WAIT_MS: u64 = 1_000;

/// What the watcher saw.
#[derive(Debug, Default)]
pub struct Watched {
    /// The events, in the order they came.
    pub events: Vec<Value>,
    /// Answers that break the watch contract (an event at or below the index asked after).
    pub anomalies: Vec<String>,
    /// Answers of 410 `compacted`: a member no longer knew the changes after the index.
    pub compacted: u64,
}

/// A running watcher (see the module comment).
pub struct Watcher {
    stop: Arc<AtomicBool>,
    reached: Arc<AtomicU64>,
    task: JoinHandle<Watched>,
}

impl Watcher {
    /// Starts following the changes from now: asks live members for a starting index until one
    /// answers (at most `timeout`).
    pub async fn start(
        endpoints: Endpoints,
        http: reqwest::Client,
        timeout: Duration,
    ) -> anyhow::Result<Watcher> {
        let start = poll_until("a starting index for the watcher", timeout, || {
            let (endpoints, http) = (endpoints.clone(), http.clone());
            async move {
                for (_, addr) in endpoints.live() {
                    let url = format!("http://{addr}/v1/watch");
                    if let Ok(r) = http.get(&url).send().await {
                        if let Ok(v) = r.json::<Value>().await {
                            if let (Some(index), Some(history)) =
                                (v["index"].as_u64(), v["history"].as_str())
                            {
                                return Ok(Some((index, history.to_string())));
                            }
                        }
                    }
                }
                Ok(None)
            }
        })
        .await?;
        let (start, history) = start;
        let stop = Arc::new(AtomicBool::new(false));
        let reached = Arc::new(AtomicU64::new(start));
        let task = tokio::spawn(follow(
            endpoints,
            http,
            (start, history),
            stop.clone(),
            reached.clone(),
        ));
        Ok(Watcher {
            stop,
            reached,
            task,
        })
    }

    /// Waits until the watcher has seen the changes up to `index` (at most `timeout`).
    pub async fn wait_reached(&self, index: u64, timeout: Duration) -> anyhow::Result<()> {
        let reached = self.reached.clone();
        poll_until(
            &format!("the watcher reaching index {index}"),
            timeout,
            || {
                let at = reached.load(Ordering::Acquire);
                async move { Ok((at >= index).then_some(())) }
            },
        )
        .await
    }

    /// Stops following and returns what it saw.
    pub async fn stop(self) -> anyhow::Result<Watched> {
        self.stop.store(true, Ordering::Release);
        Ok(self.task.await?)
    }
}

async fn follow(
    endpoints: Endpoints,
    http: reqwest::Client,
    (mut after, history): (u64, String),
    stop: Arc<AtomicBool>,
    reached: Arc<AtomicU64>,
) -> Watched {
    let mut watched = Watched::default();
    let mut member = 0usize;
    while !stop.load(Ordering::Acquire) {
        let live = endpoints.live();
        if live.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let (id, addr) = live[member % live.len()];
        // The history the indexes count in goes along: every member names the same one.
        let url =
            format!("http://{addr}/v1/watch?after={after}&history={history}&wait_ms={WAIT_MS}");
        let answer = match http.get(&url).send().await {
            Ok(r) => (r.status().as_u16(), r.json::<Value>().await.ok()),
            Err(_) => (0, None),
        };
        match answer {
            (200, Some(v)) => {
                if v["history"] != history.as_str() {
                    watched.anomalies.push(format!(
                        "node {id}: a page of history {} in history {history}",
                        v["history"]
                    ));
                }
                let events = v["events"].as_array().cloned().unwrap_or_default();
                let mut last = after;
                for e in events {
                    let index = e["index"].as_u64().unwrap_or(0);
                    if index <= last {
                        watched.anomalies.push(format!(
                            "node {id}: event at {index} after {last} (asked after {after}): {e}"
                        ));
                    }
                    last = last.max(index);
                    watched.events.push(e);
                }
                match v["index"].as_u64() {
                    Some(next) if next >= last => after = next,
                    other => watched.anomalies.push(format!(
                        "node {id}: next index {other:?} below event {last}"
                    )),
                }
                reached.store(after, Ordering::Release);
            }
            (410, _) => {
                // This member restarted or fell behind its history: another one may know.
                watched.compacted += 1;
                note(format!(
                    "watcher: node {id} no longer knows the changes after {after}"
                ));
                member += 1;
            }
            _ => {
                // Down, stopping, or without a leader for the read index: try the next one.
                member += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    watched
}

impl Watched {
    /// What contradicts the model or the final registry `state` (read with the keys under
    /// `kv_prefix`): an acknowledged replica or key that no event reported; a replica or key
    /// that events report and no later event removes, but that the registry does not hold (an
    /// event for an entry that never took effect); and the anomalies seen while watching.
    pub fn violations(&self, model: &Model, state: &RegistryState, kv_prefix: &str) -> Vec<String> {
        let mut out = self.anomalies.clone();
        let mut replicas = BTreeSet::new();
        let mut keys = BTreeSet::new();
        // What the events leave in place, in their order.
        let mut standing = BTreeSet::new();
        let mut standing_keys = BTreeSet::new();
        for e in &self.events {
            let datanode = e["datanode"].as_u64().unwrap_or(0);
            let shards = || {
                e["shards"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| (s.as_u64().unwrap_or(0), datanode))
            };
            let key = || e["key"].as_str().unwrap_or_default().to_owned();
            match e["kind"].as_str() {
                Some("replicas_registered") => {
                    replicas.extend(shards());
                    standing.extend(shards());
                }
                Some("replicas_removed") => {
                    for r in shards() {
                        standing.remove(&r);
                    }
                }
                Some("datanode_removed") => standing.retain(|(_, d)| *d != datanode),
                Some("kv_put") => {
                    keys.insert(key());
                    standing_keys.insert(key());
                }
                Some("kv_deleted") => {
                    standing_keys.remove(&key());
                }
                _ => {}
            }
        }
        let false_replicas: Vec<_> = standing
            .iter()
            .filter(|r| !state.replicas.contains_key(r))
            .collect();
        if !false_replicas.is_empty() {
            out.push(format!(
                "{} replicas (shard, datanode) reported registered but not in the registry, e.g. {:?}",
                false_replicas.len(),
                &false_replicas[..false_replicas.len().min(5)]
            ));
        }
        let false_keys: Vec<_> = standing_keys
            .iter()
            .filter(|k| k.starts_with(kv_prefix) && !state.kv.contains_key(*k))
            .collect();
        if !false_keys.is_empty() {
            out.push(format!(
                "{} keys reported written but not in the registry, e.g. {:?}",
                false_keys.len(),
                &false_keys[..false_keys.len().min(5)]
            ));
        }
        let missing: Vec<_> = model
            .replicas()
            .keys()
            .filter(|r| !replicas.contains(r))
            .collect();
        if !missing.is_empty() {
            out.push(format!(
                "{} acknowledged replicas (shard, datanode) never reported, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            ));
        }
        let missing: Vec<_> = model.acked_keys().filter(|k| !keys.contains(*k)).collect();
        if !missing.is_empty() {
            out.push(format!(
                "{} acknowledged keys never reported, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            ));
        }
        out
    }
}
