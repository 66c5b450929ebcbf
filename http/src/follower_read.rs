//! Follower reads: a linearizable (or lease) read that reaches a follower is answered from the
//! follower's own registry instead of being replayed at the leader.
//!
//! The follower asks the leader for a read index (`/raft/read-index`): the leader confirms
//! that it still leads, as it does for a read of its own (a round to a quorum, or its lease),
//! and answers the log index a registry must have applied to show every write committed before
//! the read. The follower waits until it applied that index, then reads locally. So the leader,
//! the cluster's bottleneck, does one small exchange per batch of reads instead of parsing,
//! answering and relaying every read, and reads scale with the number of members.
//!
//! Reads share exchanges as the log's writers share barriers: a read joins the next exchange,
//! never one already under way (the leader may have fixed that one's index before the read
//! arrived, so before a write the reader already saw acknowledged). One exchange per leader is
//! out at a time and carries every read for that leader that arrived while the previous one was
//! out. Exchanges to different leaders are independent: right after a leader change, reads for
//! the new leader go out at once, not after an exchange with the old one that may not answer
//! for seconds. An exchange asks for a round to a quorum if any of its reads asked for
//! `linearizable`, else for the lease.
//!
//! Under a write storm followers apply a few milliseconds behind the leader, and waiting for
//! that costs more than a replay ([`CATCH_UP`]). A follower still applying committed entries
//! when a read arrives replays it at the leader at once, and one that has not applied the read
//! index within 2 ms replays the read with the index attached (`forward.rs`, header
//! [`READ_INDEX`]): the receiver answers once it applied that index, from its own registry,
//! without another round to a quorum. A leader that cannot be asked, or no longer leads, makes
//! the read fail as a replayed read would: 503 `no_leader`, or 504 `timeout`; an exchange is
//! dropped with 503 `no_leader` as soon as this node learns that another node leads. A read
//! answered `no_leader` goes on to the next leader (`failover.rs`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderName};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use meta_consensus::{codec, ClusterId, Consistency, MetaNode};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::auth::Token;
use crate::cluster_identity;
use crate::error::{ApiError, ForwardTo};
use crate::failover;
use crate::forward::FORWARDED_BY;
use crate::forward_batch::Refusal;
use crate::leader_exchange::LeaderLink;
use crate::metrics::{FollowerReadOutcome, Metrics};
use crate::peer_client::PeerClient;
use crate::state::SharedState;

/// The leader's route that answers read indexes.
pub const PATH_READ_INDEX: &str = "/raft/read-index";

/// The leader's read index for a replayed read (see the module comment).
pub const READ_INDEX: HeaderName = HeaderName::from_static("x-metaserver-read-index");

/// When a follower answers a read itself rather than replaying it at the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    /// Longest it waits to apply the leader's read index; then it replays the read with the
    /// index. Without a write storm a follower applies a write within a round trip of the
    /// leader's commit; under one it may lag tens of milliseconds, more than a replay costs.
    pub wait: Duration,
    /// A follower with more committed entries than this still to apply replays a read at
    /// once, without asking for a read index: under a write storm it would rarely catch up in
    /// time.
    pub max_backlog: u64,
}

/// The default catch-up: 2 ms, and no backlog (measured under the storm: see ARCHITECTURE.md).
pub const CATCH_UP: CatchUp = CatchUp {
    wait: Duration::from_millis(2),
    max_backlog: 0,
};
/// Longest the leader may take to answer a read index. Reads queue behind an exchange that is
/// out, so this is short: the leader's own refusal (no quorum within twice the lease) comes
/// sooner.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a follower asks the leader for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct ReadIndexRequest {
    /// The leader may rely on its lease instead of a round to a quorum.
    lease: bool,
}

/// The leader's answer: the read index, or why it could not give one.
type ReadIndexAnswer = Result<u64, Refusal>;

/// A follower's reads that wait for a read index from the leader. Cloning shares the queue.
#[derive(Clone, Debug)]
pub struct FollowerReads {
    enabled: bool,
    catch_up: CatchUp,
    link: Arc<Link>,
    metrics: Metrics,
}

/// Clears the running mark of a leader's exchange task that ends without doing so itself,
/// failing the reads still queued for that leader (their answers are dropped).
struct RunGuard<'a> {
    link: &'a Link,
    addr: &'a str,
    armed: bool,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut pending = self.link.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.running.remove(self.addr);
            pending.waiting.retain(|w| w.target.addr != self.addr);
        }
    }
}

/// What an exchange needs, and the reads waiting for the next one.
#[derive(Debug)]
struct Link {
    leader: LeaderLink,
    pending: Mutex<Pending>,
    metrics: Metrics,
}

#[derive(Debug, Default)]
struct Pending {
    waiting: Vec<Waiter>,
    /// The leaders (by address) that a task is sending exchanges to; each task takes the reads
    /// waiting for its leader after each exchange.
    running: HashSet<String>,
}

#[derive(Debug)]
struct Waiter {
    target: ForwardTo,
    lease: bool,
    answer: oneshot::Sender<Result<u64, ApiError>>,
}

impl FollowerReads {
    /// Follower reads of node `id` (a build of `build_version`) of `cluster`, sending with
    /// `client` and this node's `token`, counted in `metrics`.
    pub fn new(
        id: u64,
        build_version: u32,
        cluster: ClusterId,
        client: PeerClient,
        token: Token,
        metrics: Metrics,
    ) -> Self {
        FollowerReads {
            enabled: true,
            catch_up: CATCH_UP,
            link: Arc::new(Link {
                leader: LeaderLink {
                    id,
                    build_version,
                    client,
                    token,
                    cluster,
                },
                pending: Mutex::default(),
                metrics: metrics.clone(),
            }),
            metrics,
        }
    }

    /// When not `enabled`, every read that reaches this node as a follower is replayed at the
    /// leader.
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// When this node answers reads itself (default [`CATCH_UP`]).
    pub fn with_catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Prepares a read with consistency `c` on `node` and returns the consistency to read
    /// with: `Local` once `node` has applied the read index for it (its registry then shows
    /// every write committed before this call): the leader's read index obtained here when
    /// `node` is a follower, or the one a member `replayed` the read with. Otherwise `c`
    /// itself: when `node` may lead or knows no leader (its own read barrier decides), or when
    /// follower reads are off (the barrier answers "forward to leader"). A follower that does
    /// not catch up in time answers "forward to leader" with the read index.
    pub async fn linearize(
        &self,
        node: &MetaNode,
        c: Consistency,
        replayed: ReplayedReadIndex,
    ) -> Result<Consistency, ApiError> {
        if c == Consistency::Local {
            return Ok(c);
        }
        if let ReplayedReadIndex(Some(index)) = replayed {
            node.wait_applied(index, node.config().request_timeout)
                .await?;
            return Ok(Consistency::Local);
        }
        if !self.enabled {
            return Ok(c);
        }
        let Some((leader_id, addr)) = node.leader_to_forward_to() else {
            return Ok(c);
        };
        if node.apply_backlog() > self.catch_up.max_backlog {
            // Behind already: it would not catch up in time; replayed as is, without an
            // exchange.
            self.metrics.follower_read(FollowerReadOutcome::Behind);
            return Ok(c);
        }
        let target = ForwardTo { leader_id, addr };
        let index = self
            .leader_read_index(node, target.clone(), c == Consistency::Lease)
            .await?;
        match node.wait_applied(index, self.catch_up.wait).await {
            Ok(()) => {
                self.metrics.follower_read(FollowerReadOutcome::Local);
                Ok(Consistency::Local)
            }
            Err(meta_consensus::Error::Timeout) => {
                self.metrics.follower_read(FollowerReadOutcome::Replayed);
                Err(ApiError::ForwardToLeader {
                    leader_id: target.leader_id,
                    addr: target.addr,
                    read_index: Some(index),
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl FollowerReads {
    /// The read index a request with consistency `c` on `node` must have applied before it
    /// answers (0 for `Local`: none): the one a member `replayed` the request with, this node's
    /// own when it leads, else the leader's, from an exchange. For requests that are not
    /// replayed at the leader: watches (a long wait would hold a connection to the leader),
    /// readiness and snapshot builds (which act on this member). Followers ask even when
    /// follower reads are off.
    pub async fn read_index_for(
        &self,
        node: &MetaNode,
        c: Consistency,
        replayed: ReplayedReadIndex,
    ) -> Result<u64, ApiError> {
        if c == Consistency::Local {
            return Ok(0);
        }
        if let ReplayedReadIndex(Some(index)) = replayed {
            return Ok(index);
        }
        let target = match node.leader_to_forward_to() {
            Some((leader_id, addr)) => ForwardTo { leader_id, addr },
            None => match node.read_index(c).await {
                Ok(index) => return Ok(index),
                // It lost leadership meanwhile: ask the new leader.
                Err(meta_consensus::Error::ForwardToLeader {
                    leader_id,
                    leader_addr,
                }) => ForwardTo {
                    leader_id,
                    addr: leader_addr,
                },
                Err(e) => return Err(e.into()),
            },
        };
        self.leader_read_index(node, target, c == Consistency::Lease)
            .await
    }

    /// The read index of the leader `target`, unless `node` learns first that another node
    /// leads: then 503 `no_leader`, and the read goes on to that one (`failover.rs`).
    async fn leader_read_index(
        &self,
        node: &MetaNode,
        target: ForwardTo,
        lease: bool,
    ) -> Result<u64, ApiError> {
        let leader = target.leader_id;
        if let Some(silent) = failover::refused_as_silent(node, leader) {
            return Err(silent);
        }
        let asked = self.link.read_index(target, lease);
        failover::unless_deposed(node, leader, asked).await
    }
}

/// The leader's read index that a member replayed a read with (header [`READ_INDEX`] on a
/// request carrying the forwarding marker and this cluster's id), if any. A value that does
/// not parse counts as none: the read then confirms leadership itself. Without the cluster's
/// id (which the API never shows) the header is a client's claim, not a member's: trusting it
/// would let a client have a linearizable read answered from any state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayedReadIndex(pub Option<u64>);

impl FromRequestParts<SharedState> for ReplayedReadIndex {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Self, Self::Rejection> {
        if !parts.headers.contains_key(FORWARDED_BY) {
            return Ok(ReplayedReadIndex(None));
        }
        let theirs = parts
            .headers
            .get(cluster_identity::CLUSTER)
            .and_then(cluster_identity::parse);
        if theirs.is_none() || theirs != state.node.config().cluster_id.get() {
            return Ok(ReplayedReadIndex(None));
        }
        Ok(ReplayedReadIndex(
            parts
                .headers
                .get(READ_INDEX)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
        ))
    }
}

impl Link {
    /// The read index of the leader `target` from an exchange that starts after this call.
    async fn read_index(self: &Arc<Self>, target: ForwardTo, lease: bool) -> Result<u64, ApiError> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let addr = target.addr.clone();
            pending.waiting.push(Waiter {
                target,
                lease,
                answer,
            });
            pending.running.insert(addr.clone()).then_some(addr)
        };
        if let Some(addr) = start {
            tokio::spawn(self.clone().run(addr));
        }
        answered.await.unwrap_or_else(|_| {
            Err(ApiError::Internal(
                "a follower read lost its read index".into(),
            ))
        })
    }

    /// Sends exchanges to the leader at `addr` while reads wait for it: each carries every read
    /// for it that was waiting when it started.
    async fn run(self: Arc<Self>, addr: String) {
        // Should this task end early (a panic, or the runtime shutting down), the reads still
        // queued for this leader fail instead of waiting for a task that no longer runs.
        let mut guard = RunGuard {
            link: &self,
            addr: &addr,
            armed: true,
        };
        loop {
            let mut batch = {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                let (same, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut pending.waiting)
                    .into_iter()
                    .partition(|w| w.target.addr == addr);
                pending.waiting = rest;
                if same.is_empty() {
                    pending.running.remove(&addr);
                    guard.armed = false;
                    return;
                }
                same
            };
            // A read whose request went away needs no index; an exchange for none is skipped.
            batch.retain(|w| !w.answer.is_closed());
            if !batch.is_empty() {
                self.exchange_for(batch).await;
            }
        }
    }

    /// One exchange with the leader that `same` (not empty) all name, answered to each of them.
    async fn exchange_for(&self, same: Vec<Waiter>) {
        let lease = same.iter().all(|w| w.lease);
        self.metrics.read_index_exchange();
        let answer = self.exchange(&same[0].target, lease).await;
        for w in same {
            let _ = w.answer.send(answer.clone());
        }
    }

    /// Asks the leader `target` for its read index.
    async fn exchange(&self, target: &ForwardTo, lease: bool) -> Result<u64, ApiError> {
        let answer: ReadIndexAnswer = self
            .leader
            .exchange(
                target,
                PATH_READ_INDEX,
                "a read index",
                EXCHANGE_TIMEOUT,
                &ReadIndexRequest { lease },
            )
            .await
            // Asking for a read index changes nothing: a broken exchange is only a missing
            // leader to the reader.
            .map_err(|e| match e {
                ApiError::OutcomeUnknown(m) => ApiError::NoLeader(m),
                e => e,
            })?;
        answer.map_err(ApiError::from)
    }
}

/// The leader's end: confirms that `node` leads and answers its read index. Never forwards: a
/// node that does not lead refuses with `no_leader`.
pub async fn serve(node: MetaNode, body: Bytes) -> Response {
    let request: ReadIndexRequest = match codec::decode(&body) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::invalid(
                "bad_read_index_request",
                format!("undecodable read index request: {e}"),
            )
            .into_response()
        }
    };
    let c = if request.lease {
        Consistency::Lease
    } else {
        Consistency::Linearizable
    };
    let answer: ReadIndexAnswer = node.read_index(c).await.map_err(Refusal::of);
    match codec::encode(&answer) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => ApiError::Internal(format!("encoding a read index: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use axum::routing::post;
    use axum::Router;
    use futures::FutureExt;
    use tokio::sync::{mpsc, Semaphore};

    use super::*;

    /// A stand-in leader: reports whether each exchange asked for the lease, holds its answer
    /// until released, then answers `answer(n)` for the n-th exchange (from 1).
    async fn fake_leader(
        answer: fn(u64) -> ReadIndexAnswer,
    ) -> (ForwardTo, mpsc::UnboundedReceiver<bool>, Arc<Semaphore>) {
        let (seen_tx, seen_rx) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let gate = release.clone();
        let exchanges = Arc::new(AtomicU64::new(0));
        let app = Router::new().route(
            PATH_READ_INDEX,
            post(move |body: Bytes| {
                let (seen, gate, exchanges) = (seen_tx.clone(), gate.clone(), exchanges.clone());
                async move {
                    let n = exchanges.fetch_add(1, Ordering::SeqCst) + 1;
                    let request: ReadIndexRequest = codec::decode(&body).unwrap();
                    seen.send(request.lease).unwrap();
                    gate.acquire().await.unwrap().forget();
                    codec::encode(&answer(n)).unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (ForwardTo { leader_id: 1, addr }, seen_rx, release)
    }

    /// The next thing the stand-in leader saw; fails the test if it saw nothing within 10 s.
    async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the stand-in leader heard nothing in time")
            .expect("the stand-in leader is gone")
    }

    fn link() -> Arc<Link> {
        Arc::new(Link {
            leader: LeaderLink {
                id: 2,
                build_version: meta_consensus::BUILD_VERSION,
                client: crate::PeerClient::plain(),
                token: Token::new(None),
                cluster: ClusterId::default(),
            },
            pending: Mutex::default(),
            metrics: Metrics::new(None),
        })
    }

    #[tokio::test]
    async fn reads_join_the_next_exchange_never_one_under_way() {
        let (leader, mut seen, release) = fake_leader(|n| Ok(100 + n)).await;
        let link = link();
        let mut a = Box::pin(link.read_index(leader.clone(), false));
        assert!((&mut a).now_or_never().is_none());
        assert!(
            !next(&mut seen).await,
            "a read index read asks for a quorum round"
        );
        // Reads that arrive while the first exchange is out wait for the next one: the leader
        // may have fixed the first one's index before they arrived.
        let mut b = Box::pin(link.read_index(leader.clone(), true));
        let mut c = Box::pin(link.read_index(leader.clone(), false));
        assert!((&mut b).now_or_never().is_none());
        assert!((&mut c).now_or_never().is_none());
        release.add_permits(1);
        assert_eq!(a.await.unwrap(), 101);
        // One exchange carries both; one of them asked for a quorum round, so it does.
        assert!(!next(&mut seen).await);
        assert!(
            (&mut b).now_or_never().is_none(),
            "answered by its own exchange"
        );
        release.add_permits(1);
        assert_eq!(b.await.unwrap(), 102);
        assert_eq!(c.await.unwrap(), 102);
        // A lone lease read asks for the lease.
        let mut d = Box::pin(link.read_index(leader.clone(), true));
        assert!((&mut d).now_or_never().is_none());
        assert!(next(&mut seen).await);
        release.add_permits(1);
        assert_eq!(d.await.unwrap(), 103);
        assert!(seen.try_recv().is_err(), "three exchanges in all");
    }

    #[tokio::test]
    async fn reads_naming_different_leaders_get_their_exchanges_side_by_side() {
        let (a_leader, mut a_seen, a_release) = fake_leader(|n| Ok(100 + n)).await;
        let (b_leader, mut b_seen, b_release) = fake_leader(|n| Ok(200 + n)).await;
        let link = link();
        let mut first = Box::pin(link.read_index(a_leader.clone(), false));
        assert!((&mut first).now_or_never().is_none());
        next(&mut a_seen).await;
        // Both wait for the next exchange, A's first in the queue.
        let mut to_a = Box::pin(link.read_index(a_leader.clone(), false));
        let mut to_b = Box::pin(link.read_index(b_leader.clone(), false));
        assert!((&mut to_a).now_or_never().is_none());
        assert!((&mut to_b).now_or_never().is_none());
        b_release.add_permits(1);
        a_release.add_permits(1);
        assert_eq!(first.await.unwrap(), 101);
        // A holds its second answer; B's read does not wait for it.
        next(&mut a_seen).await;
        assert_eq!(to_b.await.unwrap(), 201);
        next(&mut b_seen).await;
        assert!((&mut to_a).now_or_never().is_none());
        a_release.add_permits(1);
        assert_eq!(to_a.await.unwrap(), 102);
    }

    /// A leader whose exchange hangs (the old leader, cut off) holds up no read for another.
    #[tokio::test]
    async fn a_read_for_a_new_leader_does_not_wait_for_an_exchange_with_the_old_one() {
        let (old, mut old_seen, _never) = fake_leader(|n| Ok(100 + n)).await;
        let (new, _new_seen, release) = fake_leader(|n| Ok(200 + n)).await;
        release.add_permits(1);
        let link = link();
        let mut stuck = Box::pin(link.read_index(old, false));
        assert!((&mut stuck).now_or_never().is_none());
        next(&mut old_seen).await;
        let answer = tokio::time::timeout(Duration::from_secs(3), link.read_index(new, false))
            .await
            .expect("the read waited for the old leader's exchange");
        assert_eq!(answer.unwrap(), 201);
        assert!(
            (&mut stuck).now_or_never().is_none(),
            "the old one still hangs"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_after_the_exchange_task_was_dropped_gets_a_new_exchange() {
        let (leader, seen, release) = fake_leader(|n| Ok(100 + n)).await;
        let link = link();
        // The first read and its exchange task run on a runtime that shuts down while the
        // exchange is out.
        let (l, t) = (link.clone(), leader.clone());
        let mut seen = std::thread::spawn(move || {
            let mut seen = seen;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let read = tokio::spawn(async move { l.read_index(t, false).await });
                assert!(!next(&mut seen).await);
                assert!(!read.is_finished());
            });
            drop(rt);
            seen
        })
        .join()
        .unwrap();
        release.add_permits(2);
        let answer = tokio::time::timeout(Duration::from_secs(10), link.read_index(leader, false))
            .await
            .expect("a read queued behind a task that no longer runs waits forever");
        assert_eq!(answer.unwrap(), 102);
        assert!(!next(&mut seen).await, "a second exchange");
    }

    #[tokio::test]
    async fn a_refusing_or_unreachable_leader_fails_the_reads_with_its_error() {
        let (leader, _seen, release) = fake_leader(|_| {
            Err(Refusal::of(meta_consensus::Error::ForwardToLeader {
                leader_id: 3,
                leader_addr: "127.0.0.1:1".into(),
            }))
        })
        .await;
        release.add_permits(10);
        let link = link();
        let answers =
            futures::future::join_all((0..3).map(|i| link.read_index(leader.clone(), i % 2 == 0)))
                .await;
        for a in answers {
            let e = a.unwrap_err();
            assert_eq!((e.status().as_u16(), e.code()), (503, "no_leader"), "{e}");
        }
        let refused = crate::refused_port::RefusedPort::new();
        let gone = ForwardTo {
            leader_id: 1,
            addr: format!("127.0.0.1:{}", refused.port),
        };
        let e = link.read_index(gone, false).await.unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (503, "no_leader"), "{e}");
        assert!(e.to_string().contains("unreachable"), "{e}");
        // The queue still works after failures.
        let (leader, _seen, release) = fake_leader(Ok).await;
        release.add_permits(1);
        assert_eq!(link.read_index(leader, true).await.unwrap(), 1);
    }
}
