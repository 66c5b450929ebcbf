//! The fixed limits of the admin API, in one place so that handlers, tests and docs agree.

/// Most shards one `POST /v1/datanodes/{id}/shards` may carry.
pub const MAX_SHARDS_PER_BATCH: usize = 10_000;

/// Largest key-value value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

/// Longest key-value key (and listing prefix), in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;

/// Longest pagination cursor accepted, in bytes: a cursor is a stored key in hex (a one-byte
/// space tag, then the key), so the longest key's cursor must fit.
pub const MAX_CURSOR_BYTES: usize = 2 * (1 + MAX_KEY_BYTES);

/// Longest datanode or member address, in bytes.
pub const MAX_ADDR_BYTES: usize = 255;

/// Page size of listings when the request names none.
pub const DEFAULT_PAGE_LIMIT: usize = 1_000;

/// Largest page size a listing may ask for.
pub const MAX_PAGE_LIMIT: usize = 10_000;

/// How long a watch waits for a change when the request names no `wait_ms`.
pub const DEFAULT_WATCH_WAIT_MS: u64 = 30_000;

/// Longest wait a watch may ask for: below the usual idle timeouts of proxies and load
/// balancers (60 s), so a waiting watch is not cut by one.
pub const MAX_WATCH_WAIT_MS: u64 = 55_000;

/// Largest request body of the admin API. It leaves room for a full batch of shards and for a
/// value of [`MAX_VALUE_BYTES`]; a value between the two limits is refused as `value_too_large`.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Largest body of a Raft message other than AppendEntries and a snapshot (votes, leadership
/// transfers, removal notices, identity probes, read-index requests): a few hundred bytes.
pub const MAX_SMALL_RAFT_BODY_BYTES: usize = 64 * 1024;

/// Largest batch of forwarded writes the leader accepts: a batch grows to at most 4 MiB of
/// bodies, plus one write of at most [`MAX_BODY_BYTES`] and the framing.
pub const MAX_FORWARD_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Largest body of a Raft RPC other than a snapshot (which is streamed without a limit), and
/// largest frame of a replication stream.
pub const MAX_RAFT_BODY_BYTES: usize = 256 * 1024 * 1024;

/// Largest encoded log entry: one command from a request body of at most [`MAX_BODY_BYTES`]
/// (encoded, a command is no larger than its JSON or raw body), its key and the entry's framing.
pub const MAX_ENTRY_BYTES: usize = MAX_BODY_BYTES + MAX_KEY_BYTES + 1024;

// An AppendEntries request of the most entries openraft puts in one, each as large as an entry
// can be, fits in one frame: replication never builds a request the follower must refuse.
const _: () = assert!(
    meta_consensus::MAX_PAYLOAD_ENTRIES as usize * MAX_ENTRY_BYTES + 4096 <= MAX_RAFT_BODY_BYTES
);
