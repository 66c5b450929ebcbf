//! A small client for the metaserver HTTP API v1, with the error shape the tests reason about:
//! an answer with a status and error code, or no answer at all.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::status::ClusterStatus;

/// Why a request did not succeed.
#[derive(Clone, Debug)]
pub enum ApiError {
    /// No HTTP answer (refused, reset, timed out): the request may or may not have taken effect.
    NoAnswer(String),
    /// An answer with a non-2xx status.
    Status {
        /// The HTTP status.
        status: u16,
        /// `error.code` of the JSON error body (empty when the body had none).
        code: String,
        /// The body as text.
        body: String,
    },
}

impl ApiError {
    /// Whether the request certainly changed nothing (a 4xx answer).
    pub fn is_definite_rejection(&self) -> bool {
        matches!(self, ApiError::Status { status, .. } if (400..500).contains(status))
    }

    /// The error code of an answer, if any.
    pub fn code(&self) -> Option<&str> {
        match self {
            ApiError::Status { code, .. } => Some(code),
            ApiError::NoAnswer(_) => None,
        }
    }

    /// The HTTP status of an answer, if any.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            ApiError::NoAnswer(_) => None,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::NoAnswer(why) => write!(f, "no answer: {why}"),
            ApiError::Status { status, body, .. } => write!(f, "HTTP {status}: {body}"),
        }
    }
}

impl std::error::Error for ApiError {}

/// Read consistency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Read index through the leader (the default).
    Linearizable,
    /// This node's applied state.
    Local,
    /// Linearizable through the leader's lease.
    Lease,
}

impl Consistency {
    fn as_str(self) -> &'static str {
        match self {
            Consistency::Linearizable => "linearizable",
            Consistency::Local => "local",
            Consistency::Lease => "lease",
        }
    }
}

/// One shard as a datanode reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    /// Shard id.
    pub id: u64,
    /// Generation.
    pub generation: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The answer to a shard batch.
#[derive(Clone, Debug, Deserialize)]
pub struct ShardsRegistered {
    /// Replicas added or changed.
    pub accepted: u64,
    /// Replicas that were already registered identically.
    pub unchanged: u64,
    /// Shards rejected for a lower generation.
    pub stale: Vec<u64>,
    /// Log index of the command.
    #[serde(default)]
    pub index: u64,
}

/// A replica in a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardEntry {
    /// Shard id.
    pub shard: u64,
    /// Datanode id.
    pub datanode: u64,
    /// Generation.
    pub generation: u64,
    /// Size.
    pub size: u64,
}

/// A datanode in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatanodeEntry {
    /// Id.
    pub id: u64,
    /// Address.
    pub addr: String,
    /// Incarnation epoch.
    pub epoch: u64,
    /// Number of replicas.
    pub shards: u64,
}

/// A client for one node.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    timeout: Option<Duration>,
}

/// Per-request timeout for writes and reads.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A pooled HTTP client suitable for [`Api::with_client`].
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(1))
        .timeout(REQUEST_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .expect("build the HTTP client")
}

impl Api {
    /// A client for the node serving at `addr`, sharing `http`'s connection pool.
    pub fn with_client(http: reqwest::Client, addr: SocketAddr) -> Api {
        Api {
            http,
            base: format!("http://{addr}"),
            timeout: None,
        }
    }

    /// The same client with another per-request timeout (instead of [`REQUEST_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Api {
        self.timeout = Some(timeout);
        self
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ApiError> {
        let request = match self.timeout {
            Some(timeout) => request.timeout(timeout),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|err| ApiError::NoAnswer(error_chain(&err)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let code = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/code")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        Err(ApiError::Status { status, code, body })
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ApiError> {
        let response = self.send(request).await?;
        let text = response
            .text()
            .await
            .map_err(|err| ApiError::NoAnswer(error_chain(&err)))?;
        serde_json::from_str(&text)
            .map_err(|err| ApiError::NoAnswer(format!("undecodable answer {text:?}: {err}")))
    }

    /// `PUT /v1/datanodes/{id}`: returns the new epoch.
    pub async fn register_datanode(&self, id: u64, addr: &str) -> Result<u64, ApiError> {
        let value: Value = self
            .json(
                self.http
                    .put(format!("{}/v1/datanodes/{id}", self.base))
                    .json(&json!({ "addr": addr })),
            )
            .await?;
        value
            .get("epoch")
            .and_then(Value::as_u64)
            .ok_or_else(|| ApiError::NoAnswer(format!("no epoch in {value}")))
    }

    /// `POST /v1/datanodes/{id}/shards`.
    pub async fn register_shards(
        &self,
        datanode: u64,
        epoch: u64,
        shards: &[ShardReport],
    ) -> Result<ShardsRegistered, ApiError> {
        self.json(
            self.http
                .post(format!("{}/v1/datanodes/{datanode}/shards", self.base))
                .json(&json!({ "epoch": epoch, "shards": shards })),
        )
        .await
    }

    /// `PUT /v1/kv/{key}`: returns the new revision.
    pub async fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        if_revision: Option<u64>,
    ) -> Result<u64, ApiError> {
        let mut request = self
            .http
            .put(format!("{}/v1/kv/{key}", self.base))
            .body(value.to_vec());
        if let Some(rev) = if_revision {
            request = request.query(&[("if_revision", rev)]);
        }
        let answer: Value = self.json(request).await?;
        answer
            .get("revision")
            .and_then(Value::as_u64)
            .ok_or_else(|| ApiError::NoAnswer(format!("no revision in {answer}")))
    }

    /// `GET /v1/kv/{key}`: the value and its revision, `None` for 404.
    pub async fn kv_get(
        &self,
        key: &str,
        consistency: Consistency,
    ) -> Result<Option<(Vec<u8>, u64)>, ApiError> {
        let request = self
            .http
            .get(format!("{}/v1/kv/{key}", self.base))
            .query(&[("consistency", consistency.as_str())]);
        match self.send(request).await {
            Ok(response) => {
                let revision = response
                    .headers()
                    .get("x-revision")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| ApiError::NoAnswer(String::from("no X-Revision header")))?;
                let body = response
                    .bytes()
                    .await
                    .map_err(|err| ApiError::NoAnswer(error_chain(&err)))?;
                Ok(Some((body.to_vec(), revision)))
            }
            Err(ApiError::Status { status: 404, .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// `GET /v1/kv?prefix=`: every key under `prefix` with its revision (all pages).
    pub async fn kv_list(
        &self,
        prefix: &str,
        consistency: Consistency,
    ) -> Result<Vec<(String, u64)>, ApiError> {
        let url = format!("{}/v1/kv", self.base);
        self.all_pages(&url, &[("prefix", prefix)], consistency, "keys", |key| {
            let name = key.get("key").and_then(Value::as_str);
            let rev = key.get("revision").and_then(Value::as_u64);
            match (name, rev) {
                (Some(name), Some(rev)) => Ok((name.to_owned(), rev)),
                _ => Err(ApiError::NoAnswer(format!("bad key entry {key}"))),
            }
        })
        .await
    }

    /// `GET /v1/shards` (all pages), or `GET /v1/datanodes/{id}/shards` with `datanode`.
    pub async fn list_shards(
        &self,
        datanode: Option<u64>,
        consistency: Consistency,
    ) -> Result<Vec<ShardEntry>, ApiError> {
        let url = match datanode {
            Some(id) => format!("{}/v1/datanodes/{id}/shards", self.base),
            None => format!("{}/v1/shards", self.base),
        };
        self.all_pages(&url, &[], consistency, "shards", |item| {
            parse_shard_entry(item, datanode)
        })
        .await
    }

    /// `GET /v1/datanodes` (all pages).
    pub async fn datanodes(
        &self,
        consistency: Consistency,
    ) -> Result<Vec<DatanodeEntry>, ApiError> {
        let url = format!("{}/v1/datanodes", self.base);
        self.all_pages(&url, &[], consistency, "datanodes", |d| {
            let f = |k: &str| d.get(k).and_then(Value::as_u64);
            match (
                f("id"),
                f("epoch"),
                f("shards"),
                d.get("addr").and_then(Value::as_str),
            ) {
                (Some(id), Some(epoch), Some(shards), Some(addr)) => Ok(DatanodeEntry {
                    id,
                    addr: addr.to_owned(),
                    epoch,
                    shards,
                }),
                _ => Err(ApiError::NoAnswer(format!("bad datanode entry {d}"))),
            }
        })
        .await
    }

    /// Every item of a paginated listing at `url` (field `field` of each page, read by
    /// `parse`), following `next` in pages of 10,000.
    async fn all_pages<T>(
        &self,
        url: &str,
        params: &[(&str, &str)],
        consistency: Consistency,
        field: &str,
        parse: impl Fn(&Value) -> Result<T, ApiError>,
    ) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut query: Vec<(&str, String)> =
                params.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
            query.push(("limit", String::from("10000")));
            query.push(("consistency", consistency.as_str().to_owned()));
            if let Some(cursor) = &after {
                query.push(("after", cursor.clone()));
            }
            let page: Value = self.json(self.http.get(url).query(&query)).await?;
            let items = page
                .get(field)
                .and_then(Value::as_array)
                .ok_or_else(|| ApiError::NoAnswer(format!("no {field} in page {page}")))?;
            for item in items {
                out.push(parse(item)?);
            }
            match next_cursor(&page) {
                Some(cursor) => after = Some(cursor),
                None => return Ok(out),
            }
        }
    }

    /// `GET /v1/cluster`.
    pub async fn cluster(&self) -> Result<ClusterStatus, ApiError> {
        let value: Value = self
            .json(self.http.get(format!("{}/v1/cluster", self.base)))
            .await?;
        ClusterStatus::from_json(value).map_err(|err| ApiError::NoAnswer(format!("{err:#}")))
    }

    /// `POST /v1/cluster/snapshot`: `(index, bytes)` of the new snapshot.
    pub async fn snapshot_now(&self) -> Result<(u64, u64), ApiError> {
        let value: Value = self
            .json(
                self.http
                    .post(format!("{}/v1/cluster/snapshot", self.base))
                    .timeout(Duration::from_secs(60)),
            )
            .await?;
        let index = value.get("index").and_then(|v| {
            v.as_u64()
                .or_else(|| v.get("index").and_then(Value::as_u64))
        });
        let bytes = value
            .get("bytes")
            .or_else(|| value.get("size"))
            .and_then(Value::as_u64);
        match (index, bytes) {
            (Some(index), Some(bytes)) => Ok((index, bytes)),
            _ => Err(ApiError::NoAnswer(format!(
                "unexpected snapshot answer {value}"
            ))),
        }
    }

    /// `POST /v1/cluster/init` with `members` (id to address).
    pub async fn init(&self, members: &[(u64, String)]) -> Result<Value, ApiError> {
        let members: serde_json::Map<String, Value> = members
            .iter()
            .map(|(id, addr)| (id.to_string(), Value::String(addr.clone())))
            .collect();
        self.json(
            self.http
                .post(format!("{}/v1/cluster/init", self.base))
                .json(&json!({ "members": members })),
        )
        .await
    }

    /// `POST /v1/cluster/learners`.
    pub async fn add_learner(&self, id: u64, addr: &str) -> Result<Value, ApiError> {
        self.json(
            self.http
                .post(format!("{}/v1/cluster/learners", self.base))
                .timeout(Duration::from_secs(30))
                .json(&json!({ "id": id, "addr": addr })),
        )
        .await
    }

    /// `PUT /v1/cluster/voters`.
    pub async fn set_voters(&self, voters: &[u64]) -> Result<Value, ApiError> {
        self.json(
            self.http
                .put(format!("{}/v1/cluster/voters", self.base))
                .timeout(Duration::from_secs(30))
                .json(&json!({ "voters": voters })),
        )
        .await
    }

    /// `GET /metrics`: the value of the first sample of `name` (labels ignored), `None` when absent.
    pub async fn metric(&self, name: &str) -> Result<Option<f64>, ApiError> {
        let response = self
            .send(self.http.get(format!("{}/metrics", self.base)))
            .await?;
        let text = response
            .text()
            .await
            .map_err(|err| ApiError::NoAnswer(error_chain(&err)))?;
        Ok(text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let rest = match rest.strip_prefix('{') {
                Some(labelled) => &labelled[labelled.find('}')? + 1..],
                None => rest,
            };
            rest.split_whitespace().next()?.parse().ok()
        }))
    }

    /// `PATCH /v1/config` with a new snapshot rate (0 = unlimited).
    pub async fn set_snapshot_rate(&self, bytes_per_sec: u64) -> Result<Value, ApiError> {
        self.json(
            self.http
                .patch(format!("{}/v1/config", self.base))
                .json(&json!({ "snapshot_max_bytes_per_sec": bytes_per_sec })),
        )
        .await
    }
}

fn next_cursor(page: &Value) -> Option<String> {
    match page.get("next") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

fn parse_shard_entry(item: &Value, datanode: Option<u64>) -> Result<ShardEntry, ApiError> {
    let f = |k: &str| item.get(k).and_then(Value::as_u64);
    let shard = f("shard").or_else(|| f("id"));
    let dn = f("datanode").or(datanode);
    match (shard, dn, f("generation"), f("size")) {
        (Some(shard), Some(datanode), Some(generation), Some(size)) => Ok(ShardEntry {
            shard,
            datanode,
            generation,
            size,
        }),
        _ => Err(ApiError::NoAnswer(format!("bad shard entry {item}"))),
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
