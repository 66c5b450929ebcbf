//! The key layout of the registry tree. Everything lives in one sled tree so that one
//! commit (a redo record plus the writes) covers a whole `apply` call:
//!
//! | prefix | key                                   | value                         |
//! |--------|---------------------------------------|-------------------------------|
//! | `d`    | datanode id (u64 BE)                  | `DatanodeRecord`              |
//! | `r`    | shard bucket (u64 BE)                 | `ReplicaBucket`: the replicas of the shards in the bucket |
//! | `x`    | datanode id, shard bucket (u64 BE)    | present while the datanode holds a replica in the bucket; the value is not read |
//! | `k`    | key bytes (UTF-8)                     | `KvRecord`                    |
//! | `f`    | datanode id (u64 BE)                  | the epoch (`u64`) of a removed datanode: its id's next registration starts above it |
//! | `s`    | name                                  | a cluster setting, in snapshots (the cluster's version, its epoch floor) |
//! | `m`    | name                                  | metadata                      |
//!
//! Replicas are packed by shard bucket (`shard >> BUCKET_BITS`): a sled operation costs a few
//! microseconds whatever the value size, so a batch of shards with nearby ids costs a few
//! bucket rewrites instead of two operations per replica. The `x` entries index which buckets
//! hold a datanode's replicas, for listing and removing them; they change only when a datanode
//! gets its first replica in a bucket or loses its last one, so registering one more shard in a
//! bucket costs no index write. (Registries written before kept a count there; any value means
//! present.) Big-endian ids make sled's byte order the numeric order, which listings and cursors
//! use.

pub const DATANODE: u8 = b'd';
pub const REPLICA: u8 = b'r';
pub const BY_DATANODE: u8 = b'x';
pub const KV: u8 = b'k';
pub const SETTING: u8 = b's';
pub const EPOCH_FLOOR: u8 = b'f';

/// The prefixes of the registry's primary data: what a snapshot carries and what members must
/// agree on (the index and the metadata are derived, or local). In byte order: a snapshot's
/// export scans them in this order, and its capture (`capture.rs`) needs the keys it reads to
/// ascend.
pub const PRIMARY: [u8; 5] = [DATANODE, EPOCH_FLOOR, KV, REPLICA, SETTING];

/// Whether `key` is primary data ([`PRIMARY`]).
pub fn is_primary(key: &[u8]) -> bool {
    key.first().is_some_and(|p| PRIMARY.contains(p))
}

/// The cluster's version (`u32`, see `cluster_version.rs`); absent until first raised.
pub const CLUSTER_VERSION: &[u8] = b"sversion";

/// The cluster's epoch floor (`u64`): every registration from when it was raised on gets an
/// epoch of at least this; absent until first raised (`Command::RaiseEpochFloor`).
pub const CLUSTER_EPOCH_FLOOR: &[u8] = b"sepochfloor";

/// A restore's mark (`RestoreMark`): present from the claim that began a restore until the
/// restore ends (`Command::BeginRestore`, `Command::EndRestore`), and after one cut off.
pub const RESTORE_MARK: &[u8] = b"srestore";

/// Present (`u64`: the claim's index) while a restore that holds keys back runs
/// (`Command::BeginRestoreHoldingKeys`, cluster version 9): a key's write or delete other than
/// the restore's own (`Command::RestorePut`) is refused. Removed with the mark.
pub const RESTORE_KEYS_HELD: &[u8] = b"srestorekeys";

/// Last applied log id and the total number of replicas (`AppliedRecord`), one key so that
/// every apply writes one metadata record. Written through the redo record: current after
/// the registry is opened.
pub const META_APPLIED: &[u8] = b"mapplied";
/// The redo record: every write of the last commit (see `Generation::commit`); a commit written
/// in parts keeps them under `mredo/` until it is done.
pub const META_REDO: &[u8] = b"mredo";
/// Last applied membership (written only by membership entries).
pub const META_MEMBERSHIP: &[u8] = b"mmembership";

pub fn datanode(id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = DATANODE;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The key of a removed datanode's epoch floor.
pub fn epoch_floor(id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = EPOCH_FLOOR;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// Shards per bucket: `1 << BUCKET_BITS`.
pub const BUCKET_BITS: u32 = 6;

/// The bucket of a shard.
pub fn bucket_of(shard: u64) -> u64 {
    shard >> BUCKET_BITS
}

/// The key of a shard bucket.
pub fn replica_bucket(bucket: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = REPLICA;
    k[1..].copy_from_slice(&bucket.to_be_bytes());
    k
}

/// Value written under [`by_datanode`] keys: presence is what counts.
pub const PRESENT: &[u8] = &[];

/// The index key saying that a datanode holds replicas in a shard bucket.
pub fn by_datanode(datanode: u64, bucket: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = BY_DATANODE;
    k[1..9].copy_from_slice(&datanode.to_be_bytes());
    k[9..].copy_from_slice(&bucket.to_be_bytes());
    k
}

pub fn by_datanode_prefix(datanode: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = BY_DATANODE;
    k[1..].copy_from_slice(&datanode.to_be_bytes());
    k
}

pub fn kv(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(KV);
    k.extend_from_slice(key.as_bytes());
    k
}

/// Reads the two big-endian ids of a 17-byte `x` key.
pub fn two_ids(key: &[u8]) -> Option<(u64, u64)> {
    if key.len() != 17 {
        return None;
    }
    let a = u64::from_be_bytes(key[1..9].try_into().ok()?);
    let b = u64::from_be_bytes(key[9..17].try_into().ok()?);
    Some((a, b))
}

/// Reads the id of a 9-byte `d` or `r` key.
pub fn one_id(key: &[u8]) -> Option<u64> {
    if key.len() != 9 {
        return None;
    }
    Some(u64::from_be_bytes(key[1..9].try_into().ok()?))
}

/// The smallest key strictly greater than `key` (for "after" cursors).
pub fn successor(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// Lower-case hex of `bytes` (cursors are opaque hex strings).
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Parses hex written by [`to_hex`]; `None` for anything else.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_prefixes_ascend() {
        assert!(PRIMARY.windows(2).all(|w| w[0] < w[1]), "{PRIMARY:?}");
        assert!(is_primary(&epoch_floor(1)) && !is_primary(&by_datanode(1, 2)));
    }

    #[test]
    fn layout_and_cursors() {
        assert!(replica_bucket(1) < replica_bucket(2));
        assert_eq!(bucket_of(63), 0);
        assert_eq!(bucket_of(64), 1);
        assert_eq!(two_ids(&by_datanode(7, 9)), Some((7, 9)));
        assert_eq!(one_id(&datanode(5)), Some(5));
        assert_eq!(
            from_hex(&to_hex(&[0, 1, 0xab, 0xff])),
            Some(vec![0, 1, 0xab, 0xff])
        );
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert!(successor(b"ab").as_slice() > &b"ab"[..]);
    }
}
