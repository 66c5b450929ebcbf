//! A thin client for the parts of the metaserver's HTTP API v1 that the storm uses, over one pooled,
//! keep-alive HTTP client.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// One shard replica in a registration request.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ShardSpec {
    pub id: u64,
    pub generation: u64,
    pub size: u64,
}

/// The answer to `POST /v1/datanodes/{id}/shards`.
#[derive(Debug, Deserialize)]
pub struct ShardsReply {
    pub accepted: u64,
    pub unchanged: u64,
    pub stale: Vec<u64>,
}

/// What a member says about the cluster (`GET /v1/cluster`), as far as the storm needs it.
#[derive(Debug, Default)]
pub struct ClusterView {
    /// The leader this member knows of, if any.
    pub leader: Option<u64>,
}

/// Why a call failed: worth retrying (no leader, timeout, connection trouble) or not.
#[derive(Debug)]
pub enum CallError {
    /// The cluster may answer later: transport errors, 502, 503, 504.
    Retryable(String),
    /// A definite refusal (4xx, other 5xx): retrying the same request cannot help.
    Fatal(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Retryable(m) => write!(f, "retryable: {m}"),
            CallError::Fatal(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for CallError {}

/// A shared HTTP client; cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// The authority the `tls` arm's members are checked against (PEM), if that arm runs.
    ca: Option<std::sync::Arc<Vec<u8>>>,
}

#[derive(Serialize)]
struct DatanodeBody<'a> {
    addr: &'a str,
}

#[derive(Deserialize)]
struct DatanodeReply {
    epoch: u64,
}

#[derive(Deserialize)]
struct RemovalReply {
    replicas_removed: u64,
}

#[derive(Deserialize)]
struct PruneReply {
    removed: u64,
}

#[derive(Serialize)]
struct ShardsBody<'a> {
    epoch: u64,
    shards: &'a [ShardSpec],
}

impl Api {
    /// A client that keeps every connection alive and pools them per member without limit,
    /// trusting the authority in `ca` (PEM) for `https://` members, if given.
    pub fn new(ca: Option<&std::path::Path>) -> Result<Api> {
        let ca = match ca {
            Some(path) => Some(std::sync::Arc::new(
                std::fs::read(path).with_context(|| format!("read {}", path.display()))?,
            )),
            None => None,
        };
        Self::with_ca(ca)
    }

    /// Another client, with a pool of its own, that trusts what this one trusts.
    pub fn fresh(&self) -> Result<Api> {
        Self::with_ca(self.ca.clone())
    }

    fn with_ca(ca: Option<std::sync::Arc<Vec<u8>>>) -> Result<Api> {
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(Duration::from_secs(300))
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(5));
        if let Some(pem) = &ca {
            let cert = reqwest::Certificate::from_pem(pem).context("the run's CA certificate")?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().context("build HTTP client")?;
        Ok(Api { http, ca })
    }

    /// POSTs `body` as JSON to `url`; decodes the answer.
    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, CallError> {
        let resp = self.http.post(url).json(body).send().await;
        Self::json(url, resp).await
    }

    /// `PUT /v1/datanodes/{id}`: registers a datanode and returns its new epoch.
    pub async fn register_datanode(
        &self,
        base: &str,
        id: u64,
        addr: &str,
    ) -> Result<u64, CallError> {
        let url = format!("{base}/v1/datanodes/{id}");
        let resp = self
            .http
            .put(&url)
            .json(&DatanodeBody { addr })
            .send()
            .await;
        let reply: DatanodeReply = Self::json(&url, resp).await?;
        Ok(reply.epoch)
    }

    /// `POST /v1/datanodes/{id}/shards`: registers a batch of replicas under `epoch`.
    pub async fn register_shards(
        &self,
        base: &str,
        datanode: u64,
        epoch: u64,
        shards: &[ShardSpec],
    ) -> Result<ShardsReply, CallError> {
        let url = format!("{base}/v1/datanodes/{datanode}/shards");
        self.post(&url, &ShardsBody { epoch, shards }).await
    }

    /// `DELETE /v1/datanodes/{id}`: removes a datanode; returns how many replicas went with it.
    pub async fn remove_datanode(&self, base: &str, datanode: u64) -> Result<u64, CallError> {
        let url = format!("{base}/v1/datanodes/{datanode}");
        let resp = self.http.delete(&url).send().await;
        let reply: RemovalReply = Self::json(&url, resp).await?;
        Ok(reply.replicas_removed)
    }

    /// `POST /v1/datanodes/{id}/prune`: ends a full report under `epoch`; returns how many
    /// replicas were dropped.
    pub async fn prune(&self, base: &str, datanode: u64, epoch: u64) -> Result<u64, CallError> {
        let reply: PruneReply = self.post_epoch(base, datanode, "prune", epoch).await?;
        Ok(reply.removed)
    }

    /// `POST /v1/datanodes/{id}/heartbeat`: incarnation `epoch` is alive.
    pub async fn heartbeat(&self, base: &str, datanode: u64, epoch: u64) -> Result<(), CallError> {
        let _: serde_json::Value = self.post_epoch(base, datanode, "heartbeat", epoch).await?;
        Ok(())
    }

    /// `POST /v1/datanodes/{id}/{what}` `{"epoch":E}`.
    async fn post_epoch<T: serde::de::DeserializeOwned>(
        &self,
        base: &str,
        datanode: u64,
        what: &str,
        epoch: u64,
    ) -> Result<T, CallError> {
        let url = format!("{base}/v1/datanodes/{datanode}/{what}");
        self.post(&url, &serde_json::json!({ "epoch": epoch }))
            .await
    }

    /// A GET whose body is read and dropped; returns the status. Used for the admin read probes.
    pub async fn get_status(&self, url: &str) -> Result<u16, CallError> {
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| CallError::Retryable(format!("GET {url}: {e}")))?;
        let status = resp.status().as_u16();
        resp.bytes()
            .await
            .map_err(|e| CallError::Retryable(format!("GET {url}: body: {e}")))?;
        Ok(status)
    }

    /// A PUT of `body` whose answer is read and dropped; returns the status. Used for the admin
    /// write probe.
    pub async fn put_status(&self, url: &str, body: &'static str) -> Result<u16, CallError> {
        let resp = self
            .http
            .put(url)
            .body(body)
            .send()
            .await
            .map_err(|e| CallError::Retryable(format!("PUT {url}: {e}")))?;
        let status = resp.status().as_u16();
        resp.bytes()
            .await
            .map_err(|e| CallError::Retryable(format!("PUT {url}: body: {e}")))?;
        Ok(status)
    }

    /// `POST /v1/cluster/init` `{"members":{..}}`: forms the cluster of `members` (id to
    /// address) on a fresh node.
    pub async fn init(&self, base: &str, members: &serde_json::Value) -> Result<(), CallError> {
        let url = format!("{base}/v1/cluster/init");
        let _: serde_json::Value = self
            .post(&url, &serde_json::json!({ "members": members }))
            .await?;
        Ok(())
    }

    /// `GET /v1/cluster` on one member.
    pub async fn cluster(&self, base: &str) -> Result<ClusterView, CallError> {
        let url = format!("{base}/v1/cluster");
        let resp = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        let value: serde_json::Value = Self::json(&url, resp).await?;
        Ok(ClusterView {
            leader: leader_of(&value),
        })
    }

    /// The `wal` figures of `GET /v1/cluster` on one member: (appends, barriers).
    pub async fn cluster_wal(&self, base: &str) -> Result<(u64, u64), CallError> {
        let url = format!("{base}/v1/cluster");
        let resp = self.http.get(&url).send().await;
        let value: serde_json::Value = Self::json(&url, resp).await?;
        match (
            value["wal"]["appends"].as_u64(),
            value["wal"]["barriers"].as_u64(),
        ) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(CallError::Fatal(format!(
                "{url}: no wal.appends / wal.barriers"
            ))),
        }
    }

    /// `GET /readyz` on one member: whether it answers 200.
    pub async fn ready(&self, base: &str) -> bool {
        let url = format!("{base}/readyz");
        match self
            .http
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            Ok(resp) => resp.status().is_success(),
            Err(_) => false,
        }
    }

    /// `GET /metrics`: the Prometheus text of one member.
    pub async fn metrics(&self, base: &str) -> Result<String, CallError> {
        let url = format!("{base}/metrics");
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| CallError::Retryable(format!("GET {url}: {e}")))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| CallError::Retryable(format!("GET {url}: body: {e}")))?;
        if !status.is_success() {
            return Err(CallError::Fatal(format!("GET {url}: {status}: {text}")));
        }
        Ok(text)
    }

    /// `GET /v1/datanodes?consistency=linearizable`, every page: each datanode's replica
    /// count, by id.
    pub async fn replica_counts(
        &self,
        base: &str,
    ) -> Result<std::collections::BTreeMap<u64, u64>, CallError> {
        let mut counts = std::collections::BTreeMap::new();
        let mut after = String::new();
        loop {
            let url = format!("{base}/v1/datanodes?consistency=linearizable&limit=10000{after}");
            let resp = self.http.get(&url).send().await;
            let value: serde_json::Value = Self::json(&url, resp).await?;
            let list = value["datanodes"]
                .as_array()
                .ok_or_else(|| CallError::Fatal(format!("GET {url}: no \"datanodes\" array")))?;
            for d in list {
                match (d["id"].as_u64(), d["shards"].as_u64()) {
                    (Some(id), Some(shards)) => counts.insert(id, shards),
                    _ => {
                        return Err(CallError::Fatal(format!(
                            "GET {url}: a datanode without id or shards: {d}"
                        )))
                    }
                };
            }
            match value["next"].as_str() {
                Some(next) => after = format!("&after={next}"),
                None => return Ok(counts),
            }
        }
    }

    async fn json<T: serde::de::DeserializeOwned>(
        url: &str,
        resp: reqwest::Result<reqwest::Response>,
    ) -> Result<T, CallError> {
        let resp = resp.map_err(|e| CallError::Retryable(format!("{url}: {e}")))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| CallError::Retryable(format!("{url}: body: {e}")))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let msg = format!("{url}: {status}: {}", text.trim());
            return Err(match status.as_u16() {
                502..=504 => CallError::Retryable(msg),
                _ => CallError::Fatal(msg),
            });
        }
        serde_json::from_slice(&body).map_err(|e| {
            CallError::Fatal(format!(
                "{url}: unexpected body ({e}): {}",
                String::from_utf8_lossy(&body)
            ))
        })
    }
}

/// Finds the leader's id in a `/v1/cluster` answer: `leader_id`, or `leader` as a number or as an
/// object with an `id`.
fn leader_of(value: &serde_json::Value) -> Option<u64> {
    if let Some(id) = value["leader_id"].as_u64() {
        return Some(id);
    }
    match &value["leader"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::Object(o) => o.get("id").and_then(|v| v.as_u64()),
        _ => None,
    }
}
