//! The on-disk layout of a snapshot file: the header before the payload and the trailer after it.

use std::io::Read;
use std::path::Path;

use crate::{Error, Result};

/// The first bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"METASNAP";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The highest version a file may name and still be taken for a newer build's (refused, left
/// as it is) rather than for damage.
const NEWEST_PLAUSIBLE_VERSION: u32 = 255;
/// The largest caller metadata a header holds.
pub const MAX_META_BYTES: usize = 16 << 20;
/// The last bytes of every complete snapshot file.
pub const TRAILER_MAGIC: [u8; 4] = *b"SEND";
/// The trailer's length in bytes.
pub const TRAILER_LEN: u64 = 16;

/// Magic, version and metadata length.
const FIXED_LEN: usize = 16;
/// The header checksum after the metadata.
const CRC_LEN: usize = 4;

/// The header: everything before the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The caller's metadata.
    pub meta: Vec<u8>,
}

impl Header {
    /// The header's encoded length for `meta_len` bytes of metadata.
    pub fn encoded_len(meta_len: usize) -> u64 {
        (FIXED_LEN + meta_len + CRC_LEN) as u64
    }

    /// Encodes a header around `meta` (at most [`MAX_META_BYTES`], checked by the caller).
    pub fn encode(meta: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(meta.len()) as usize);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        out.extend_from_slice(meta);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads and checks the header at the start of `input` (the file `path`, `file_len` bytes
    /// long). Errors name the file and say what is wrong.
    pub fn read(input: &mut impl Read, path: &Path, file_len: u64) -> Result<Header> {
        let corrupt = |offset: u64, reason: String| Error::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        if file_len < FIXED_LEN as u64 {
            return Err(corrupt(
                0,
                format!("truncated: {file_len} bytes is shorter than a snapshot header"),
            ));
        }
        let mut fixed = [0u8; FIXED_LEN];
        input
            .read_exact(&mut fixed)
            .map_err(|e| Error::io("read snapshot header", path, e))?;
        if fixed[..8] != MAGIC {
            return Err(corrupt(0, "bad magic: not a snapshot file".to_string()));
        }
        let version = u32::from_le_bytes(fixed[8..12].try_into().expect("4 bytes"));
        // A later version is a newer build's file, not damage; no earlier one was ever written,
        // and no build comes near a version with more than its low byte set (a flipped bit
        // there is damage, not a format from the far future).
        if version > FORMAT_VERSION && version <= NEWEST_PLAUSIBLE_VERSION {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                reason: format!(
                    "snapshot format version {version}, written by a newer build (this build \
                     reads {FORMAT_VERSION}), or its header is damaged"
                ),
            });
        }
        if version != FORMAT_VERSION {
            return Err(corrupt(
                8,
                format!(
                    "unknown format version {version} (this build reads {FORMAT_VERSION}, and \
                     no build writes one past {NEWEST_PLAUSIBLE_VERSION}): the header is damaged"
                ),
            ));
        }
        let meta_len = u32::from_le_bytes(fixed[12..16].try_into().expect("4 bytes")) as usize;
        if meta_len > MAX_META_BYTES {
            return Err(corrupt(
                12,
                format!("metadata length {meta_len} exceeds the limit of {MAX_META_BYTES}"),
            ));
        }
        let header_len = Self::encoded_len(meta_len);
        if file_len < header_len + TRAILER_LEN {
            return Err(corrupt(
                0,
                format!(
                    "truncated: {file_len} bytes cannot hold a {header_len}-byte header and the trailer"
                ),
            ));
        }
        let mut rest = vec![0u8; meta_len + CRC_LEN];
        input
            .read_exact(&mut rest)
            .map_err(|e| Error::io("read snapshot header", path, e))?;
        let stored = u32::from_le_bytes(rest[meta_len..].try_into().expect("4 bytes"));
        let mut crc = crc32c::crc32c(&fixed);
        crc = crc32c::crc32c_append(crc, &rest[..meta_len]);
        if crc != stored {
            return Err(corrupt(
                (FIXED_LEN + meta_len) as u64,
                format!("header checksum mismatch: stored {stored:#010x}, computed {crc:#010x}"),
            ));
        }
        rest.truncate(meta_len);
        Ok(Header { meta: rest })
    }
}

/// The trailer: the payload's length and checksum, after the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// The payload length in bytes.
    pub payload_len: u64,
    /// The payload's CRC32C.
    pub crc: u32,
}

impl Trailer {
    /// Encodes the trailer.
    pub fn encode(&self) -> [u8; TRAILER_LEN as usize] {
        let mut out = [0u8; TRAILER_LEN as usize];
        out[..8].copy_from_slice(&self.payload_len.to_le_bytes());
        out[8..12].copy_from_slice(&self.crc.to_le_bytes());
        out[12..].copy_from_slice(&TRAILER_MAGIC);
        out
    }

    /// Decodes a trailer; `None` if its magic is missing (a truncated or overwritten file).
    pub fn decode(bytes: &[u8; TRAILER_LEN as usize]) -> Option<Trailer> {
        if bytes[12..] != TRAILER_MAGIC {
            return None;
        }
        Some(Trailer {
            payload_len: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            crc: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
        })
    }
}
