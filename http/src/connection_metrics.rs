//! The listener's connections, the TLS handshakes that failed, and the node's certificate, as
//! metrics: a node whose slots are all taken (a storm, or a flood of idle connections) reaches
//! its members only through the reserve, certificates that clients refuse show only at the
//! other end, and one about to expire, or renewed files a node refuses, should be alerted on
//! before the members stop reaching it.
//! The connections are read at scrape time from the listener's own counts.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::connection_limit::ConnectionGauge;
use crate::tls::Tls;

/// Why a TLS handshake failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeFailure {
    /// The client refused this node's certificate.
    CertificateRefused,
    /// The client sent something else than a TLS handshake (a plain HTTP request, say).
    NotTls,
    /// The client did not complete it in time.
    Timeout,
    /// Anything else (the client went away, a protocol error).
    Other,
}

impl HandshakeFailure {
    fn label(self) -> &'static str {
        match self {
            HandshakeFailure::CertificateRefused => "certificate_refused",
            HandshakeFailure::NotTls => "not_tls",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Other => "other",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HandshakeLabels {
    reason: &'static str,
}

/// The connection metrics of one server. Cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    gauge: Arc<Mutex<Option<ConnectionGauge>>>,
    tls: Arc<Mutex<Option<Tls>>>,
    pub(crate) handshake_failures: Family<HandshakeLabels, Counter>,
}

impl ConnectionMetrics {
    /// Reports the connections of the listener `gauge` reads from now on.
    pub fn watch(&self, gauge: ConnectionGauge) {
        *self.gauge.lock().unwrap_or_else(|e| e.into_inner()) = Some(gauge);
    }

    /// Reports the certificate of `tls` (when it stops being accepted, whether the files as
    /// they are now are refused) from now on.
    pub fn watch_tls(&self, tls: Tls) {
        *self.tls.lock().unwrap_or_else(|e| e.into_inner()) = Some(tls);
    }

    /// Why this node's TLS files, as last read, are refused ([`Tls::refusal`]); `None` while
    /// they are in use, or without TLS.
    pub fn tls_refusal(&self) -> Option<String> {
        let tls = self.tls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        tls?.refusal()
    }

    /// Counts a failed TLS handshake.
    pub fn handshake_failed(&self, why: HandshakeFailure) {
        self.handshake_failures
            .get_or_create(&HandshakeLabels {
                reason: why.label(),
            })
            .inc();
    }

    /// The collector of the connection gauges, registered once.
    pub(crate) fn collector(&self) -> ConnectionCollector {
        ConnectionCollector {
            gauge: self.gauge.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Tests: the failed handshakes counted for `why`.
    pub fn handshake_failures(&self, why: HandshakeFailure) -> u64 {
        self.handshake_failures
            .get_or_create(&HandshakeLabels {
                reason: why.label(),
            })
            .get()
    }
}

/// Reads the connections at scrape time.
#[derive(Debug)]
pub(crate) struct ConnectionCollector {
    gauge: Arc<Mutex<Option<ConnectionGauge>>>,
    tls: Arc<Mutex<Option<Tls>>>,
}

impl Collector for ConnectionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut gauges: Vec<(&str, &str, u64)> = Vec::new();
        let tls = self.tls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(tls) = tls {
            gauges.extend([
                (
                    "metaserver_tls_certificate_expiry_timestamp_seconds",
                    "When the members stop accepting this node's certificate (the earliest end \
                     of validity in its chain), in seconds since the Unix epoch",
                    tls.accepted_until(),
                ),
                (
                    "metaserver_tls_files_refused",
                    "1 while the TLS files, as last read, are refused or cannot be read: the \
                     node serves with the ones it took before, and would not start with these",
                    u64::from(tls.files_refused()),
                ),
            ]);
        }
        let gauge = self.gauge.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(gauge) = gauge {
            gauges.extend([
                (
                    "metaserver_connections_open",
                    "Client connections open in the listener's slots",
                    gauge.open() as u64,
                ),
                (
                    "metaserver_connection_slots",
                    "The listener's connection slots (past them, connections wait, or serve \
                     only traffic between members)",
                    gauge.slots() as u64,
                ),
                (
                    "metaserver_member_reserve_connections_open",
                    "Connections open in the members' reserve, taken only while every slot is",
                    gauge.open_in_reserve() as u64,
                ),
            ]);
        }
        for (name, help, value) in gauges {
            let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}
