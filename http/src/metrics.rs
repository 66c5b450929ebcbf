//! Prometheus metrics of the HTTP layer, and the `/metrics` registry.
//!
//! Requests are counted by route template, method and status, with a latency histogram per
//! route. The node's own figures (WAL, Raft, snapshots, registry size) are read from the node at
//! scrape time by a collector registered next to them (see `node_metrics`).

use crate::connection_metrics::ConnectionMetrics;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Route label of requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route template, e.g. `/v1/datanodes/{id}`.
    pub route: String,
    /// The HTTP method.
    pub method: String,
    /// The answered status code.
    pub status: u16,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route template.
    pub route: String,
    /// The HTTP method.
    pub method: String,
}

/// How a linearizable read at a follower was answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum FollowerReadOutcome {
    /// From the follower's registry, once it applied the leader's read index.
    Local,
    /// Replayed at the leader with the read index: the follower did not catch up in time.
    Replayed,
    /// Replayed at the leader at once: the follower was still applying committed entries.
    Behind,
}

impl EncodeLabelValue for FollowerReadOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        encoder.write_str(match self {
            FollowerReadOutcome::Local => "local",
            FollowerReadOutcome::Replayed => "replayed",
            FollowerReadOutcome::Behind => "behind",
        })
    }
}

/// Labels of the follower-read counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FollowerReadLabels {
    outcome: FollowerReadOutcome,
}

/// Route template recorded on a response by [`tag_route`].
#[derive(Clone, Debug)]
struct RouteTag(String);

/// The metrics registry of one server. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    follower_reads: Family<FollowerReadLabels, Counter>,
    read_index_exchanges: Counter,
    watch_slots_taken: Gauge,
    connections: ConnectionMetrics,
}

/// A watch slot counted in `metaserver_watch_slots_taken` while it lives.
#[derive(Debug)]
pub struct CountedWatchSlot(Gauge);

impl Drop for CountedWatchSlot {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn latency_histogram() -> Histogram {
    // 50 us to about 52 s, doubling: past the 10 s request timeout and a watch's longest wait.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

impl Metrics {
    /// A registry with the HTTP metrics and, if given, a collector of the node's figures.
    pub fn new(node_collector: Option<Box<dyn Collector>>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency =
            Family::<RouteLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        registry.register(
            "metaserver_http_requests",
            "HTTP requests answered, by route template, method and status",
            requests.clone(),
        );
        registry.register(
            "metaserver_http_request_duration_seconds",
            "HTTP request latency, by route template and method",
            latency.clone(),
        );
        let follower_reads = Family::<FollowerReadLabels, Counter>::default();
        registry.register(
            "metaserver_follower_reads",
            "Linearizable reads at this follower that obtained the leader's read index, by how \
             they were answered",
            follower_reads.clone(),
        );
        let read_index_exchanges = Counter::default();
        registry.register(
            "metaserver_read_index_exchanges",
            "Exchanges this follower sent the leader for a read index (reads share them)",
            read_index_exchanges.clone(),
        );
        let watch_slots_taken = Gauge::default();
        registry.register(
            "metaserver_watch_slots_taken",
            "Watches holding one of the waiting slots: waiting for a change, or for a read index \
             to start from (metaserver_watches_waiting counts the former only)",
            watch_slots_taken.clone(),
        );
        let connections = ConnectionMetrics::default();
        registry.register(
            "metaserver_tls_handshake_failures",
            "TLS handshakes of clients that failed, by reason (certificate_refused: the client \
             refused this node's certificate)",
            connections.handshake_failures.clone(),
        );
        registry.register_collector(Box::new(connections.collector()));
        if let Some(collector) = node_collector {
            registry.register_collector(collector);
        }
        Metrics {
            inner: Arc::new(Inner {
                registry,
                requests,
                latency,
                follower_reads,
                read_index_exchanges,
                watch_slots_taken,
                connections,
            }),
        }
    }

    /// Counts a watch slot taken until the returned guard drops.
    pub fn watch_slot_taken(&self) -> CountedWatchSlot {
        self.inner.watch_slots_taken.inc();
        CountedWatchSlot(self.inner.watch_slots_taken.clone())
    }

    /// The listener's connections and failed TLS handshakes.
    pub fn connections(&self) -> &ConnectionMetrics {
        &self.inner.connections
    }

    /// Records one answered request.
    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        self.inner
            .requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                method: method.to_owned(),
                status,
            })
            .inc();
        self.inner
            .latency
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
                method: method.to_owned(),
            })
            .observe(seconds);
    }

    /// Counts one follower read answered as `outcome`.
    pub fn follower_read(&self, outcome: FollowerReadOutcome) {
        self.inner
            .follower_reads
            .get_or_create(&FollowerReadLabels { outcome })
            .inc();
    }

    /// Counts one read index exchange sent to the leader.
    pub fn read_index_exchange(&self) {
        self.inner.read_index_exchanges.inc();
    }

    /// Renders every metric in the Prometheus text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)?;
        Ok(out)
    }

    /// How many requests were answered for this route, method and status (for tests).
    pub fn request_count(&self, route: &str, method: &str, status: u16) -> u64 {
        self.inner
            .requests
            .get(&RequestLabels {
                route: route.to_owned(),
                method: method.to_owned(),
                status,
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

/// Route layer: remembers the matched route template on the response for [`record`].
pub async fn tag_route(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(RouteTag(route));
    }
    response
}

/// The method as a label: one of HTTP's own, else `OTHER`. A client may send any token as a
/// method, and a label per made-up method would grow the metrics without bound (and before the
/// token is checked).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method as M;
    match *method {
        M::GET => "GET",
        M::PUT => "PUT",
        M::POST => "POST",
        M::DELETE => "DELETE",
        M::PATCH => "PATCH",
        M::HEAD => "HEAD",
        M::OPTIONS => "OPTIONS",
        M::CONNECT => "CONNECT",
        M::TRACE => "TRACE",
        _ => "OTHER",
    }
}

/// Outermost layer: counts the request and observes its latency.
pub async fn record(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = method_label(request.method()).to_owned();
    let response = next.run(request).await;
    let route = response
        .extensions()
        .get::<RouteTag>()
        .map(|t| t.0.as_str())
        .unwrap_or(UNMATCHED_ROUTE);
    metrics.observe(
        route,
        &method,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn made_up_methods_share_one_label() {
        use axum::http::Method;
        assert_eq!(super::method_label(&Method::GET), "GET");
        assert_eq!(super::method_label(&Method::PATCH), "PATCH");
        for made_up in ["M000001", "EVILMETHOD", "get"] {
            let method = Method::from_bytes(made_up.as_bytes()).unwrap();
            assert_eq!(super::method_label(&method), "OTHER", "{made_up}");
        }
    }

    use super::*;

    #[test]
    fn observed_requests_are_encoded() {
        let metrics = Metrics::new(None);
        metrics.observe("/v1/shards/{id}", "GET", 200, 0.001);
        metrics.observe("/v1/shards/{id}", "GET", 200, 0.002);
        metrics.observe("/v1/shards/{id}", "GET", 404, 0.001);
        assert_eq!(metrics.request_count("/v1/shards/{id}", "GET", 200), 2);
        assert_eq!(metrics.request_count("/v1/shards/{id}", "GET", 404), 1);
        let text = metrics.encode().unwrap();
        assert!(text.contains(
            "metaserver_http_requests_total{route=\"/v1/shards/{id}\",method=\"GET\",status=\"200\"} 2"
        ), "{text}");
        assert!(
            text.contains("metaserver_http_request_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
