//! The records the log store writes to the write-ahead log. Each is one WAL record, encoded
//! by the crate's codec.

use serde::{Deserialize, Serialize};

use crate::types::{Entry, LogId, Vote};

/// A record as read back.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum LogRecord {
    /// A Raft log entry.
    Entry(Entry),
    /// A saved vote (durable before `save_vote` returns).
    Vote(Vote),
    /// A saved committed log id.
    Committed(Option<LogId>),
    /// Everything besides entries that the log must keep: written before a purge drops older
    /// records and after a physical truncation, so neither loses the vote or committed id.
    State {
        vote: Option<Vote>,
        committed: Option<LogId>,
        purged: Option<LogId>,
    },
    /// Entries after `after` are gone (logical truncation), and the state as of then: used
    /// when a physical truncation would also drop the latest vote record, so that the vote and
    /// the truncation become durable in one record.
    Truncated {
        after: Option<LogId>,
        vote: Option<Vote>,
        committed: Option<LogId>,
    },
}

/// The same records, borrowed for encoding (same variants in the same order).
#[derive(Debug, Serialize)]
pub(crate) enum LogRecordRef<'a> {
    Entry(&'a Entry),
    Vote(&'a Vote),
    Committed(&'a Option<LogId>),
    State {
        vote: &'a Option<Vote>,
        committed: &'a Option<LogId>,
        purged: &'a Option<LogId>,
    },
    Truncated {
        after: &'a Option<LogId>,
        vote: &'a Option<Vote>,
        committed: &'a Option<LogId>,
    },
}

impl LogRecord {
    /// The variant index of `State` in the encoding (the variants' order above), so that a
    /// replay can find the purge points without decoding every entry.
    pub(crate) const STATE_VARIANT: u32 = 3;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    #[test]
    fn state_records_are_known_by_their_variant_index() {
        let state = codec::encode(&LogRecordRef::State {
            vote: &None,
            committed: &None,
            purged: &None,
        })
        .unwrap();
        assert_eq!(codec::variant_index(&state), Some(LogRecord::STATE_VARIANT));
        let vote = codec::encode(&LogRecordRef::Committed(&None)).unwrap();
        assert_ne!(codec::variant_index(&vote), Some(LogRecord::STATE_VARIANT));
    }
}
