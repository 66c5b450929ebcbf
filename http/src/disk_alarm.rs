//! A voter short of disk tells its leader at once. The leader refuses every write while the
//! voters short of disk, with those down, leave no majority with room (followers cannot refuse
//! what the leader commits, and a write that fills their disks stops them), but its own disk
//! look (`disk_handover.rs`) asks the voters only every few seconds: a voter that went short
//! between two looks took writes until the next. So every voter reads its own free space
//! often ([`CHECK_EVERY`], one `statvfs`) and, while it has less than its `min_free_bytes`
//! free, tells its leader so ([`PATH_ROOM`]): at once when it goes short or the leader changes,
//! and again every [`REPEAT_EVERY`] (a notice may be lost, or reach a leader a moment before
//! its look clears the note). Once it has room again it says so once, and writes resume
//! without waiting for the next look. Like etcd's `NOSPACE` alarm, but it clears itself.
//!
//! [`Alarm`] is the sender's bookkeeping, plain code tested without a runtime; [`serve`] is the
//! leader's side.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use meta_consensus::MetaNode;
use openraft::async_runtime::watch::WatchReceiver as _;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::state::AppState;

/// A voter's notice of its room, to its leader (member-only, JSON [`RoomNotice`]).
pub const PATH_ROOM: &str = "/raft/room";

/// How often a voter reads its own free space.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How often a voter short of disk tells its leader again.
pub const REPEAT_EVERY: Duration = Duration::from_secs(1);

/// How long the leader may take to answer a notice.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What a voter tells its leader of its room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomNotice {
    /// The voter.
    pub id: u64,
    /// Whether it has less than its reserve free.
    pub short: bool,
    /// Bytes free on its data dir's file system.
    pub free: u64,
    /// Its `min_free_bytes`.
    pub reserve: u64,
}

/// What a voter last told a leader of its room, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Told {
    leader: u64,
    short: bool,
    at: Instant,
}

/// The sender's bookkeeping: whether a notice is due.
#[derive(Debug, Default)]
pub struct Alarm {
    told: Option<Told>,
}

impl Alarm {
    /// Whether this voter, `short` of disk or not, should tell `leader` now: while short, when
    /// it has not told this leader so within [`REPEAT_EVERY`]; with room, once, if what it
    /// last told (any leader) was that it is short.
    pub fn due(&self, leader: u64, short: bool, now: Instant) -> bool {
        match (short, self.told) {
            (true, Some(t)) => {
                !(t.leader == leader && t.short && now.duration_since(t.at) < REPEAT_EVERY)
            }
            (true, None) => true,
            (false, Some(t)) => t.short,
            (false, None) => false,
        }
    }

    /// `leader` took the notice that this voter is `short` (or has room) at `now`.
    pub fn told(&mut self, leader: u64, short: bool, now: Instant) {
        self.told = Some(Told {
            leader,
            short,
            at: now,
        });
    }
}

/// Every `every`, while this node is a voter that another node leads: reads its free space and
/// tells the leader when [`Alarm::due`] says so. Logs when this node goes short of disk and
/// when it has room again. Runs until the node closes.
pub async fn run(state: AppState, every: Duration) {
    let closing = state.node.closing();
    tokio::pin!(closing);
    let mut alarm = Alarm::default();
    let mut was_short = false;
    loop {
        tokio::select! {
            _ = &mut closing => return,
            _ = tokio::time::sleep(every) => {}
        }
        let reserve = state.node.config().min_free_bytes;
        let Some(free) = state.node.data_dir_free_bytes().filter(|_| reserve > 0) else {
            continue;
        };
        let short = free < reserve;
        if short != was_short {
            was_short = short;
            if short {
                tracing::warn!(
                    free,
                    reserve,
                    "this node's data dir is short of space (less than --min-free-bytes free): \
                     leading, it refuses writes that add data and hands the leadership to a \
                     voter with room; as another voter, it tells the leader, which refuses \
                     writes while the voters short of disk leave no majority with room"
                );
            } else {
                tracing::info!(free, reserve, "this node's data dir has room again");
            }
        }
        let Some((leader, addr)) = leader_of_voter(&state.node) else {
            continue;
        };
        let now = Instant::now();
        if !alarm.due(leader, short, now) {
            continue;
        }
        let notice = RoomNotice {
            id: state.node.id(),
            short,
            free,
            reserve,
        };
        match tell(&state, leader, &addr, notice).await {
            Ok(()) => alarm.told(leader, short, now),
            Err(e) => tracing::debug!(leader, "telling the leader of this node's room: {e}"),
        }
    }
}

/// The leader and its address (`MetaNode::leader_to_forward_to`), if this node is a voter
/// another node leads.
fn leader_of_voter(node: &MetaNode) -> Option<(u64, String)> {
    let voter = {
        let metrics = node.raft().metrics();
        let m = metrics.borrow_watched();
        let mut voters = m.membership_config.membership().voter_ids();
        voters.any(|v| v == node.id())
    };
    voter.then(|| node.leader_to_forward_to()).flatten()
}

/// Sends `notice` to `leader` at `addr`; `Err` says why it did not take it.
async fn tell(state: &AppState, leader: u64, addr: &str, notice: RoomNotice) -> Result<(), String> {
    let Some(request) = state.member_link().post(leader, addr, PATH_ROOM) else {
        return Err("this node knows no cluster id yet".into());
    };
    let body = serde_json::to_vec(&notice).map_err(|e| e.to_string())?;
    let answer = request
        .timeout(SEND_TIMEOUT)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    match answer.status() {
        s if s.is_success() => Ok(()),
        s => Err(format!("answered {s}")),
    }
}

/// `POST /raft/room`: a voter's [`RoomNotice`]. 204 once noted; 409 `not_leader` if this node
/// does not lead or the sender is not another voter (nothing noted); 400 for a body that is not
/// a notice.
pub async fn serve(node: MetaNode, body: Bytes) -> Response {
    let notice: RoomNotice = match serde_json::from_slice(&body) {
        Ok(notice) => notice,
        Err(e) => {
            return ApiError::invalid("bad_rpc", format!("not a room notice: {e}")).into_response()
        }
    };
    let RoomNotice {
        id,
        short,
        free,
        reserve,
    } = notice;
    match node.note_voter_alarm(id, short) {
        None => ApiError::Conflict(format!(
            "node {} does not lead a cluster in which node {id} is another voter",
            node.id()
        ))
        .into_response(),
        Some(changed) => {
            if changed && short {
                tracing::warn!(
                    voter = id,
                    free,
                    reserve,
                    "a voter says its data dir is short of space: writes are refused while the \
                     voters short of disk, with those down, leave no majority with room"
                );
            } else if changed {
                tracing::info!(voter = id, free, reserve, "a voter says it has room again");
            }
            axum::http::StatusCode::NO_CONTENT.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_voter_tells_at_once_then_every_repeat_and_a_new_leader_at_once() {
        let t0 = Instant::now();
        let mut alarm = Alarm::default();
        assert!(!alarm.due(1, false, t0), "nothing to tell with room");
        assert!(alarm.due(1, true, t0));
        alarm.told(1, true, t0);
        assert!(!alarm.due(1, true, t0 + REPEAT_EVERY / 2));
        assert!(alarm.due(1, true, t0 + REPEAT_EVERY));
        assert!(alarm.due(2, true, t0 + REPEAT_EVERY / 2), "a new leader");
    }

    #[test]
    fn room_again_is_told_once() {
        let t0 = Instant::now();
        let mut alarm = Alarm::default();
        alarm.told(1, true, t0);
        assert!(alarm.due(1, false, t0));
        assert!(alarm.due(2, false, t0), "whoever leads now");
        alarm.told(2, false, t0);
        assert!(!alarm.due(2, false, t0 + REPEAT_EVERY * 10));
        assert!(alarm.due(2, true, t0), "short again: at once");
    }

    #[test]
    fn a_notice_is_json_with_named_fields() {
        let notice = RoomNotice {
            id: 2,
            short: true,
            free: 10,
            reserve: 16,
        };
        let text = serde_json::to_string(&notice).unwrap();
        assert_eq!(text, r#"{"id":2,"short":true,"free":10,"reserve":16}"#);
        assert_eq!(serde_json::from_str::<RoomNotice>(&text).unwrap(), notice);
    }
}
