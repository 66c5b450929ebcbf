//! Whether one flipped bit explains an invalid record: recovery asks this before it cuts valid
//! records off the log as a torn write, since a flipped bit is damage to written (possibly
//! acknowledged) bytes.
//!
//! CRC32C is linear: for messages of equal length, `crc(a) ^ crc(b)` depends only on `a ^ b`. So
//! flipping the message bit of degree `d` (counted from the last bit the CRC reads) explains a
//! record whose computed checksum differs from its stored one by `delta` exactly when
//! `x^(32 + d) mod P == delta`. Walking the payload back from its end and multiplying by `x` once
//! per bit finds such a bit in 8 shift-and-xor steps per byte. A flip in the stored checksum leaves
//! a `delta` with one bit set. Flips in the length, LSN and kind fields change what the record is,
//! so those 104 bits are tried one by one with [`record::decode`].
//!
//! A torn write is one flip from a valid record only by chance, about one in 2^32 per bit of the
//! record (under 1/1000 below 500 KB, near 1/4 at [`MAX_PAYLOAD`]), or if the lost sector held one
//! set bit; it is then refused, which costs a rebuild from peers but loses nothing acknowledged.

use super::record::{self, HEADER_LEN, MAX_PAYLOAD};
use super::Lsn;

/// The CRC32C (Castagnoli) polynomial, bit-reflected as the checksum computes it; also `x^32 mod P`.
const POLY: u32 = 0x82F6_3B78;

/// A bit whose flip makes a record valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flip {
    /// Offset of the byte in the segment.
    pub offset: usize,
    /// The bit in that byte (0 is the least significant).
    pub bit: u8,
}

/// Finds a bit whose flip makes the bytes at `pos` a valid record of segment `segment_id` with LSN
/// `lsn`, ending anywhere in `bytes` (normally at the next valid record; past it if that record
/// lay in this one's payload; before it if the bytes after this one are damaged too).
///
/// Linear in the record's size, with no cap needed even at [`MAX_PAYLOAD`]: 8 cheap steps per
/// payload byte, plus a copy and checksum of the record for the candidate found and for each of the
/// few header flips that leave a plausible header (at most 35; a flipped length bit may reach
/// further into the segment).
pub(crate) fn find(bytes: &[u8], pos: usize, segment_id: u64, lsn: Lsn) -> Option<Flip> {
    let head: [u8; HEADER_LEN] = bytes
        .get(pos..pos.checked_add(HEADER_LEN)?)?
        .try_into()
        .ok()?;
    let header_flips = (0..4).chain(8..HEADER_LEN).flat_map(|i| {
        (0..8).map(move |bit| Flip {
            offset: pos + i,
            bit,
        })
    });
    let fixes = |flip: &Flip| fixes(bytes, pos, &head, *flip, segment_id, lsn);
    if let Some(flip) = header_flips.into_iter().find(fixes) {
        return Some(flip);
    }
    // The stored checksum or the payload: the record's extent and fields are as they stand.
    let len = plausible_len(&head, lsn)?;
    let record = bytes.get(pos..pos + HEADER_LEN + len)?;
    let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let delta = record::checksum(segment_id, record) ^ stored;
    let flip = if delta.count_ones() == 1 {
        let i = delta.trailing_zeros() as usize;
        Flip {
            offset: pos + 4 + i / 8,
            bit: (i % 8) as u8,
        }
    } else {
        let (at, bit) = payload_bit(len, delta)?;
        Flip {
            offset: pos + HEADER_LEN + at,
            bit,
        }
    };
    fixes(&flip).then_some(flip)
}

/// The payload length if `head` has LSN `lsn`, a valid kind and an acceptable length.
fn plausible_len(head: &[u8; HEADER_LEN], lsn: Lsn) -> Option<usize> {
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let head_lsn = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
    (len <= MAX_PAYLOAD && head_lsn == lsn && (1..=3).contains(&head[16])).then_some(len)
}

/// Whether flipping `flip` makes the bytes at `pos` (whose header is `head`) a valid record with
/// LSN `lsn`. Checks the header before copying and checksumming the record.
fn fixes(
    bytes: &[u8],
    pos: usize,
    head: &[u8; HEADER_LEN],
    flip: Flip,
    segment_id: u64,
    lsn: Lsn,
) -> bool {
    let mut head = *head;
    if let Some(b) = head.get_mut(flip.offset - pos) {
        *b ^= 1 << flip.bit;
    }
    let Some(len) = plausible_len(&head, lsn) else {
        return false;
    };
    let end = pos + HEADER_LEN + len;
    let Some(record) = bytes.get(pos..end).filter(|_| flip.offset < end) else {
        return false;
    };
    let mut copy = record.to_vec();
    copy[flip.offset - pos] ^= 1 << flip.bit;
    record::decode(&copy, 0, segment_id, lsn).is_some_and(|meta| meta.lsn == lsn)
}

/// The payload bit (byte index, bit) of a `len`-byte payload whose flip changes the checksum by
/// `delta`, if any. The last bit the CRC reads (bit 7 of the last byte, as the CRC is reflected)
/// changes it by `x^32 mod P`; each bit read before that by `x` times the one read after it.
/// Single-bit syndromes are distinct for messages under 2^31 bits, so there is at most one.
fn payload_bit(len: usize, delta: u32) -> Option<(usize, u8)> {
    let mut syndrome = POLY;
    for at in (0..len).rev() {
        for bit in (0..8).rev() {
            if syndrome == delta {
                return Some((at, bit));
            }
            syndrome = times_x(syndrome);
        }
    }
    None
}

/// Multiplies a reflected CRC value by `x` modulo the polynomial.
fn times_x(r: u32) -> u32 {
    (r >> 1) ^ if r & 1 == 1 { POLY } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::record::Kind;

    /// The CRC register after `data` from register `r`, without the final inversion.
    fn raw(r: u32, data: &[u8]) -> u32 {
        !crc32c::crc32c_append(!r, data)
    }

    /// A deterministic pseudo-random byte stream (xorshift).
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    /// Every single bit at or after `pos` whose flip makes a valid record with LSN `lsn`.
    fn brute_force(bytes: &mut [u8], pos: usize, segment_id: u64, lsn: Lsn) -> Vec<Flip> {
        let mut found = Vec::new();
        for offset in pos..bytes.len() {
            for bit in 0..8 {
                bytes[offset] ^= 1 << bit;
                if record::decode(bytes, pos, segment_id, lsn).is_some_and(|m| m.lsn == lsn) {
                    found.push(Flip { offset, bit });
                }
                bytes[offset] ^= 1 << bit;
            }
        }
        found
    }

    #[test]
    fn syndromes_match_the_crates_crc() {
        assert_eq!(raw(0, &[0x80]), POLY);
        // Bit `bit` followed by `k` zero bytes, as the zero-byte steps of the crate compute it.
        let mut by_bytes: Vec<u32> = (0..8).map(|bit| raw(0, &[1 << bit])).collect();
        let mut syndrome = POLY;
        for _k in 0..100 {
            for bit in (0..8).rev() {
                assert_eq!(syndrome, by_bytes[bit]);
                syndrome = times_x(syndrome);
            }
            for s in &mut by_bytes {
                *s = raw(*s, &[0]);
            }
        }
    }

    #[test]
    fn the_fast_search_finds_what_brute_force_finds() {
        let (segment_id, lsn, pos) = (7, 42, 24);
        // (kind, payload, whether to check every flip against brute force, not a sample)
        let cases = [
            (Kind::Data, noise(1, 300), true),
            (Kind::Data, vec![0; 300], false),
            (Kind::Data, Vec::new(), true),
            (Kind::Purge, 5u64.to_le_bytes().to_vec(), true),
        ];
        for (kind, payload, exhaustive) in cases {
            let mut bytes = noise(2, pos);
            record::encode(&mut bytes, segment_id, lsn, kind, &payload);
            let end = bytes.len();
            record::encode(&mut bytes, segment_id, lsn + 1, Kind::Data, b"next");
            bytes.extend([0; 64]);
            assert_eq!(find(&bytes, pos, segment_id, lsn), None, "an intact record");
            for offset in pos..end {
                for bit in 0..8 {
                    let flip = Flip { offset, bit };
                    bytes[offset] ^= 1 << bit;
                    let found = find(&bytes, pos, segment_id, lsn);
                    assert_eq!(found, Some(flip), "{kind:?} {}", payload.len());
                    // Brute force is quadratic: a sample of the bits, or all of them.
                    if exhaustive
                        || offset < pos + HEADER_LEN
                        || (offset * 8 + bit as usize) % 7 == 0
                    {
                        let all = brute_force(&mut bytes, pos, segment_id, lsn);
                        assert_eq!(all, [flip], "{kind:?} {}", payload.len());
                    }
                    // A second flip is not explained by one.
                    let other = pos + HEADER_LEN + (offset * 31 + 5) % (end - pos - HEADER_LEN + 1);
                    if other != offset && other < end {
                        bytes[other] ^= 0x10;
                        assert_eq!(find(&bytes, pos, segment_id, lsn), None);
                        bytes[other] ^= 0x10;
                    }
                    bytes[offset] ^= 1 << bit;
                }
            }
        }
    }

    #[test]
    fn random_bytes_and_zeros_are_not_one_flip_from_a_record() {
        let (segment_id, lsn, pos) = (3, 9, 24);
        let mut bytes = noise(3, pos);
        record::encode(&mut bytes, segment_id, lsn, Kind::Data, &noise(4, 2000));
        // A sector of the payload lost: zeros where the data was.
        bytes[pos + 600..pos + 1112].fill(0);
        assert_eq!(find(&bytes, pos, segment_id, lsn), None);
        assert_eq!(brute_force(&mut bytes.clone(), pos, segment_id, lsn), []);
        assert_eq!(find(&[0; 100], 24, segment_id, lsn), None);
        assert_eq!(find(&[0; 30], 24, segment_id, lsn), None);
    }
}
