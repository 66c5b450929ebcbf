//! A leader short of disk hands its leadership to a voter that has room. The free-space guard
//! (`meta-consensus`'s `node/free_space.rs`) has the leader refuse every write that adds data
//! while its data dir has less than `min_free_bytes` free; since every write goes through the
//! leader, one full disk would stop the whole cluster's writes though the other members have
//! room. So a leader that finds itself short asks the other voters how much room they have
//! (`GET /v1/cluster`) and moves the leadership to the one with the most, among those with at
//! least twice their own reserve free: a margin, so that the leadership does not come straight
//! back, and nobody takes it who would refuse the writes as well.
//!
//! The same look guards the followers: they cannot refuse what the leader commits, and a write
//! that fills their disks stops them, and a cluster whose majority stopped takes nothing. So
//! the leader notes the voters that say they are short (`MetaNode::note_voters_short_of_disk`)
//! and refuses every write while they, with the voters down, leave no majority of the voters
//! with room. A voter that goes short between two looks tells the leader itself, at once
//! (`disk_alarm.rs`).
//!
//! [`choose`] is the choice, plain code tested without a runtime.

use std::time::{Duration, Instant};

use meta_consensus::Role;
use openraft::async_runtime::watch::WatchReceiver as _;

use crate::state::AppState;

/// How often the node looks at its own free space while it leads.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// How long a voter may take to say how much room it has.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// A leader short of disk that finds no voter with room says so at most this often.
const STUCK_WARN_EVERY: Duration = Duration::from_secs(60);

/// A voter's room, as it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub id: u64,
    /// Bytes free on its data dir's file system (`None`: it could not tell).
    pub free: Option<u64>,
    /// Its own `min_free_bytes`.
    pub reserve: u64,
    /// It began a planned stop: it takes no leadership.
    pub stopping: bool,
}

impl Room {
    /// Whether the voter says it is short of disk: as leader, it would refuse every write that
    /// adds data.
    pub fn short(&self) -> bool {
        self.free.is_some_and(|free| free < self.reserve)
    }
}

/// The voters to hand the leadership to, best first: those with at least twice their reserve
/// free (and some space free at all), the most free first; none that is stopping (a short
/// leader that a stopping one handed over to gave the leadership back to it, and the cluster
/// had no leader for an election timeout).
pub fn choose(rooms: &[Room]) -> Vec<u64> {
    let mut fit: Vec<(u64, u64)> = rooms
        .iter()
        .filter(|r| !r.stopping)
        .filter_map(|r| {
            let free = r.free?;
            (free > 0 && free >= r.reserve.saturating_mul(2)).then_some((free, r.id))
        })
        .collect();
    fit.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    fit.into_iter().map(|(_, id)| id).collect()
}

/// Every `every` (and at once when its role, leader or membership changes), while this node
/// leads: asks the other voters for their room, has writes refused while those short of disk
/// (with those down) leave no majority with room, and, while this node has less than its reserve
/// free, moves the leadership to a voter with room ([`choose`]). Runs until the node closes.
pub async fn run(state: AppState, every: Duration) {
    let closing = state.node.closing();
    tokio::pin!(closing);
    let mut last_stuck_warning: Option<Instant> = None;
    // Role, leader and membership changes: a new leader looks at once, before it took many
    // writes that could fill its followers' disks.
    let mut metrics = state.node.raft().server_metrics();
    loop {
        tokio::select! {
            _ = &mut closing => return,
            _ = tokio::time::sleep(every) => {}
            changed = metrics.changed() => if changed.is_err() {
                return;
            },
        }
        let status = state.node.status();
        if !leads(status.role) {
            state.node.forget_voter_rooms();
            state.node.note_room_elsewhere(true);
            continue;
        }
        let asked_at = Instant::now();
        let rooms = ask_rooms(&state, &status).await;
        // Followers cannot refuse what the leader commits: writes stop while those short of
        // disk leave no majority with room, with the voters down (which the leader tells on
        // each write: `note_voters_short_of_disk`).
        let short_voters = rooms.iter().filter(|r| r.short()).map(|r| r.id).collect();
        state.node.note_voters_short_of_disk(short_voters, asked_at);
        let short = match status.data_dir_free_bytes {
            Some(free) if status.min_free_bytes > free => Some(free),
            _ => None,
        };
        let Some(free) = short else {
            // Should it lead short of disk later, it refuses writes as one handing over until
            // it looked.
            state.node.note_room_elsewhere(true);
            continue;
        };
        let reserve = status.min_free_bytes;
        let fit = choose(&rooms);
        // Writes refused meanwhile say whether asking again helps: it does while a voter
        // with room may take over (503 `no_leader`), not once none has room (507).
        state.node.note_room_elsewhere(!fit.is_empty());
        let mut handed = None;
        for to in fit {
            match state.node.transfer_leadership(to).await {
                Ok((leader, _)) if leader == to => {
                    handed = Some(to);
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(to, "handing leadership over for want of disk: {e}"),
            }
        }
        match handed {
            Some(to) => tracing::info!(
                free,
                reserve,
                to,
                "this leader's data dir is short of space: handed leadership to a voter with room"
            ),
            None if last_stuck_warning.is_none_or(|t| t.elapsed() >= STUCK_WARN_EVERY) => {
                last_stuck_warning = Some(Instant::now());
                tracing::warn!(
                    free,
                    reserve,
                    rooms = %describe(&rooms),
                    "this leader's data dir is short of space and no voter has room (twice its \
                     reserve free) to take over: writes that add data stay refused"
                );
            }
            None => {}
        }
    }
}

/// The voters' rooms in words, for the log: `node 2: 25968640 bytes free, 16777216 in reserve`.
fn describe(rooms: &[Room]) -> String {
    let room = |r: &Room| match r.free {
        Some(free) if r.stopping => format!("node {}: {free} bytes free, stopping", r.id),
        Some(free) => format!("node {}: {free} bytes free, {} in reserve", r.id, r.reserve),
        None => format!("node {}: did not answer", r.id),
    };
    rooms.iter().map(room).collect::<Vec<_>>().join("; ")
}

/// Whether a node in `role` leads, for the disk look: also one no quorum acknowledged yet, as
/// a leader elected a moment ago is (it looked only 5 s later, and took writes meanwhile that
/// filled its followers' disks).
fn leads(role: Role) -> bool {
    matches!(role, Role::Leader | Role::LeaderWithoutQuorum)
}

/// Asks the other voters of `status` how much room they have, all at once.
async fn ask_rooms(state: &AppState, status: &meta_consensus::ClusterStatus) -> Vec<Room> {
    let asked = status
        .voters
        .iter()
        .filter(|&&v| v != status.id)
        .filter_map(|v| status.nodes.get(v).map(|a| (*v, a.clone())))
        .map(|(id, addr)| async move { ask_room(state, id, &addr).await });
    futures::future::join_all(asked).await
}

/// Asks voter `id` at `addr` how much room it has; `free` is `None` if it does not say.
pub(crate) async fn ask_room(state: &AppState, id: u64, addr: &str) -> Room {
    let link = state.member_link();
    let mut request = link
        .client
        .http()
        .get(link.client.url(addr, "/v1/cluster"))
        .timeout(ASK_TIMEOUT);
    if let Some(token) = link.token.header_value() {
        request = request.header(reqwest::header::AUTHORIZATION, token);
    }
    let answer: Option<serde_json::Value> = match request.send().await {
        Ok(r) if r.status().is_success() => r.json().await.ok(),
        _ => None,
    };
    // Only the node asked for: another at its address says nothing of it.
    let answer = answer.filter(|v| v["id"].as_u64() == Some(id));
    Room {
        id,
        free: answer
            .as_ref()
            .and_then(|v| v["data_dir_free_bytes"].as_u64()),
        reserve: answer
            .as_ref()
            .and_then(|v| v["min_free_bytes"].as_u64())
            .unwrap_or(0),
        stopping: answer
            .as_ref()
            .is_some_and(|v| v["stopping"].as_bool() == Some(true)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_elected_a_moment_ago_looks() {
        assert!(leads(Role::Leader));
        assert!(leads(Role::LeaderWithoutQuorum));
        assert!(!leads(Role::Follower) && !leads(Role::Candidate));
    }

    #[test]
    fn rooms_are_described_in_words() {
        let rooms = [
            Room {
                id: 2,
                free: Some(10),
                reserve: 16,
                stopping: false,
            },
            Room {
                id: 3,
                free: None,
                reserve: 0,
                stopping: false,
            },
            Room {
                id: 4,
                free: Some(99),
                reserve: 16,
                stopping: true,
            },
        ];
        assert_eq!(
            describe(&rooms),
            "node 2: 10 bytes free, 16 in reserve; node 3: did not answer; node 4: 99 bytes \
             free, stopping"
        );
    }

    #[test]
    fn the_voter_with_the_most_room_goes_first_and_none_without_twice_its_reserve() {
        let room = |id, free, reserve| Room {
            id,
            free,
            reserve,
            stopping: false,
        };
        assert_eq!(
            choose(&[
                room(2, Some(300), 100),
                room(3, Some(500), 100),
                room(4, Some(199), 100),
                room(5, None, 0),
                room(6, Some(0), 0),
                room(7, Some(10), 0),
            ]),
            [3, 2, 7]
        );
        assert!(choose(&[room(2, Some(150), 100)]).is_empty());
        assert!(choose(&[]).is_empty());
        let stopping = Room {
            stopping: true,
            ..room(3, Some(500), 100)
        };
        assert_eq!(choose(&[room(2, Some(300), 100), stopping]), [2]);
    }
}
