//! Bounds on the terms and log indexes a Raft message may carry. No cluster comes near them (a
//! term of 2^48 is an election every microsecond for nine years; an index of 2^62 is a million
//! entries a second for 146,000 years), but openraft obeys whatever it is sent: a vote request
//! of term u64::MAX was granted and persisted, after which the node's Raft core panicked at
//! every start (the term after it overflows). The transport checks every message it receives
//! against these bounds and refuses one past them, whoever sent it.

use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use openraft::vote::RaftLeaderId;

use crate::error::{Error, Result};
use crate::types::{LogId, TypeConfig, Vote};

/// The largest term a message may carry.
pub const MAX_TERM: u64 = 1 << 48;
/// The largest log index a message may carry.
pub const MAX_INDEX: u64 = 1 << 62;

fn check_term(term: u64, what: &str) -> Result<()> {
    if term > MAX_TERM {
        return Err(Error::InvalidArgument(format!(
            "{what} has term {term}, past the largest a cluster can reach ({MAX_TERM})"
        )));
    }
    Ok(())
}

/// Checks a vote's term.
pub fn check_vote(vote: &Vote, what: &str) -> Result<()> {
    check_term(vote.leader_id().term(), what)
}

fn check_log_id(log_id: Option<&LogId>, what: &str) -> Result<()> {
    let Some(l) = log_id else {
        return Ok(());
    };
    check_term(l.leader_id.term, what)?;
    if l.index > MAX_INDEX {
        return Err(Error::InvalidArgument(format!(
            "{what} has index {}, past the largest a log can reach ({MAX_INDEX})",
            l.index
        )));
    }
    Ok(())
}

/// Checks a (pre-)vote request.
pub fn check_vote_request(rpc: &VoteRequest<TypeConfig>) -> Result<()> {
    check_vote(&rpc.vote, "the candidate's vote")?;
    check_log_id(rpc.last_log_id.as_ref(), "the candidate's last log id")
}

/// Checks an AppendEntries request: the leader's vote and every log id in it.
pub fn check_append(rpc: &AppendEntriesRequest<TypeConfig>) -> Result<()> {
    check_vote(&rpc.vote, "the leader's vote")?;
    check_log_id(rpc.prev_log_id.as_ref(), "the previous log id")?;
    check_log_id(rpc.leader_commit.as_ref(), "the leader's commit")?;
    rpc.entries
        .iter()
        .try_for_each(|e| check_log_id(Some(&e.log_id), "an entry"))
}

/// Checks a leadership transfer request.
pub fn check_transfer(rpc: &TransferLeaderRequest<TypeConfig>) -> Result<()> {
    check_vote(rpc.from_leader(), "the leader's vote")?;
    check_log_id(rpc.last_log_id(), "the last log id")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64) -> Vote {
        Vote::new(term, 1)
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(
            openraft::vote::leader_id_adv::LeaderId { term, node_id: 1 },
            index,
        )
    }

    #[test]
    fn terms_and_indexes_past_the_bounds_are_refused() {
        let ok = VoteRequest::<TypeConfig>::new(vote(7), Some(log_id(6, 100)));
        check_vote_request(&ok).unwrap();
        let edge =
            VoteRequest::<TypeConfig>::new(vote(MAX_TERM), Some(log_id(MAX_TERM, MAX_INDEX)));
        check_vote_request(&edge).unwrap();
        for bad in [
            VoteRequest::<TypeConfig>::new(vote(u64::MAX), None),
            VoteRequest::<TypeConfig>::new(vote(7), Some(log_id(MAX_TERM + 1, 1))),
            VoteRequest::<TypeConfig>::new(vote(7), Some(log_id(6, u64::MAX))),
        ] {
            let e = check_vote_request(&bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
        let transfer = TransferLeaderRequest::<TypeConfig>::new(vote(u64::MAX), 2, None);
        assert!(check_transfer(&transfer).is_err());
    }
}
