//! The on-disk record format: a fixed header (payload length, CRC32C, LSN, kind) followed by the
//! payload. The checksum is seeded with the segment's id, so bytes left from another segment or a
//! zero-filled (preallocated) tail never parse as a record.
//!
//! ```text
//! offset 0  u32 LE  payload length
//!        4  u32 LE  CRC32C(seed(segment id), bytes 0..4 ++ bytes 8..end)
//!        8  u64 LE  LSN (never 0)
//!       16  u8      kind (1 data, 2 truncate marker, 3 purge marker; never 0)
//!       17  payload (markers: the target LSN as u64 LE)
//! ```

use super::Lsn;

/// Bytes before the payload.
pub(crate) const HEADER_LEN: usize = 17;
/// The largest payload one record may carry.
pub const MAX_PAYLOAD: usize = 128 << 20;

/// What a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A caller's payload.
    Data = 1,
    /// Drops every record with LSN at or above the target (and below the marker).
    Truncate = 2,
    /// Drops every record with LSN at or below the target.
    Purge = 3,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Data),
            2 => Some(Kind::Truncate),
            3 => Some(Kind::Purge),
            _ => None,
        }
    }
}

/// A record found in a segment: where it is and what it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordMeta {
    pub lsn: Lsn,
    pub kind: Kind,
    /// Offset of the record header in the segment file.
    pub offset: u64,
    pub payload_len: u32,
    /// For markers: the target LSN; 0 for data.
    pub target: Lsn,
}

impl RecordMeta {
    /// Header plus payload.
    pub fn size(&self) -> u64 {
        HEADER_LEN as u64 + self.payload_len as u64
    }
}

fn seed(segment_id: u64) -> u32 {
    crc32c::crc32c(&segment_id.to_le_bytes())
}

/// The checksum of `record` (header and payload) as stored at bytes 4..8; those bytes are skipped.
pub(crate) fn checksum(segment_id: u64, record: &[u8]) -> u32 {
    let crc = crc32c::crc32c_append(seed(segment_id), &record[0..4]);
    crc32c::crc32c_append(crc, &record[8..])
}

/// Appends one encoded record to `buf`.
pub(crate) fn encode(buf: &mut Vec<u8>, segment_id: u64, lsn: Lsn, kind: Kind, payload: &[u8]) {
    debug_assert!(payload.len() <= MAX_PAYLOAD);
    let start = buf.len();
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&lsn.to_le_bytes());
    buf.push(kind as u8);
    buf.extend_from_slice(payload);
    let crc = checksum(segment_id, &buf[start..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Encoded size of a record with a payload of `len` bytes.
pub(crate) fn encoded_len(len: usize) -> u64 {
    (HEADER_LEN + len) as u64
}

/// Parses the record at `offset` of `bytes` (a whole segment), or `None` if the bytes there are
/// not a valid record of this segment with an LSN of at least `min_lsn`.
pub(crate) fn decode(
    bytes: &[u8],
    offset: usize,
    segment_id: u64,
    min_lsn: Lsn,
) -> Option<RecordMeta> {
    let head = bytes.get(offset..offset.checked_add(HEADER_LEN)?)?;
    let len = u32::from_le_bytes(head[0..4].try_into().ok()?) as usize;
    let lsn = u64::from_le_bytes(head[8..16].try_into().ok()?);
    let kind = Kind::from_u8(head[16])?;
    if lsn == 0 || lsn < min_lsn || len > MAX_PAYLOAD {
        return None;
    }
    let record = bytes.get(offset..offset.checked_add(HEADER_LEN + len)?)?;
    let stored = u32::from_le_bytes(head[4..8].try_into().ok()?);
    if checksum(segment_id, record) != stored {
        return None;
    }
    let target = match kind {
        Kind::Data => 0,
        Kind::Truncate | Kind::Purge => u64::from_le_bytes(record[HEADER_LEN..].try_into().ok()?),
    };
    Some(RecordMeta {
        lsn,
        kind,
        offset: offset as u64,
        payload_len: len as u32,
        target,
    })
}

/// Verifies one record read back from a file (header and payload) and returns its payload.
pub(crate) fn verify(record: &[u8], segment_id: u64, lsn: Lsn) -> Option<&[u8]> {
    let meta = decode(record, 0, segment_id, lsn)?;
    (meta.lsn == lsn && meta.size() as usize == record.len()).then(|| &record[HEADER_LEN..])
}

/// Finds the first offset at or after `from` where a valid record of this segment with LSN at
/// least `min_lsn` starts. Used to tell a torn tail (nothing valid follows) from corruption in
/// the middle of the log (valid records follow).
pub(crate) fn find_valid(
    bytes: &[u8],
    from: usize,
    segment_id: u64,
    min_lsn: Lsn,
) -> Option<usize> {
    let mut at = from;
    while at + HEADER_LEN <= bytes.len() {
        // A record's kind byte is never zero: skip quickly to the next plausible kind byte.
        let kind_at = skip_zeros(bytes, at + HEADER_LEN - 1);
        let skip = bytes
            .get(kind_at..)?
            .iter()
            .position(|b| (1..=3).contains(b))?;
        at = kind_at + skip + 1 - HEADER_LEN;
        if decode(bytes, at, segment_id, min_lsn).is_some() {
            return Some(at);
        }
        at += 1;
    }
    None
}

const ZEROS: [u8; 4096] = [0; 4096];

/// The index of the first non-zero byte at or after `from` (or `bytes.len()`), skipping whole
/// zero blocks with block compares (fast even in unoptimized builds).
pub(crate) fn skip_zeros(bytes: &[u8], from: usize) -> usize {
    let mut at = from.min(bytes.len());
    while at < bytes.len() {
        let end = (at + ZEROS.len()).min(bytes.len());
        if bytes[at..end] == ZEROS[..end - at] {
            at = end;
        } else {
            return at + bytes[at..end].iter().position(|&b| b != 0).unwrap_or(0);
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_segment_seed() {
        let mut buf = vec![0u8; 3];
        encode(&mut buf, 7, 42, Kind::Data, b"hello");
        let meta = decode(&buf, 3, 7, 1).expect("valid");
        assert_eq!((meta.lsn, meta.kind, meta.payload_len), (42, Kind::Data, 5));
        assert_eq!(meta.size() as usize, buf.len() - 3);
        // Another segment's seed never parses it.
        assert!(decode(&buf, 3, 8, 1).is_none());
        assert_eq!(verify(&buf[3..], 7, 42), Some(&b"hello"[..]));
        assert_eq!(verify(&buf[3..], 7, 43), None);
    }

    #[test]
    fn zeros_and_flipped_bits_never_parse() {
        let zeros = vec![0u8; 1024];
        assert!(decode(&zeros, 0, 1, 1).is_none());
        assert!(find_valid(&zeros, 0, 1, 1).is_none());
        let mut buf = Vec::new();
        encode(&mut buf, 1, 1, Kind::Purge, &5u64.to_le_bytes());
        for i in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[i] ^= 1 << bit;
                assert!(decode(&bad, 0, 1, 1).is_none(), "byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn find_valid_skips_garbage() {
        let mut buf = vec![0xAB; 100];
        buf.extend(std::iter::repeat_n(0, 50));
        let at = buf.len();
        encode(&mut buf, 9, 10, Kind::Data, b"x");
        assert_eq!(find_valid(&buf, 0, 9, 1), Some(at));
        assert_eq!(find_valid(&buf, 0, 9, 11), None);
        assert_eq!(find_valid(&buf, at + 1, 9, 1), None);
    }
}
