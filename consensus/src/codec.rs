//! The one place that knows the binary encoding (bincode 2.0.1) of everything this crate
//! persists or ships: log entries, registry records and snapshot records.
//!
//! Every encoded value starts with a format version byte, so that a later format can still
//! read what an earlier one wrote: decoding dispatches on that byte and refuses versions it
//! does not know with a clear error instead of misreading bytes.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The format written by this build.
pub const FORMAT_VERSION: u8 = 1;

/// Largest value the decoder will allocate for, guarding against corrupt length prefixes.
const DECODE_LIMIT: usize = 256 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// The configuration with a decode limit of `LIMIT` bytes.
fn config_limited<const LIMIT: usize>() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<LIMIT>()
}

/// Why a value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty input: no format version byte")]
    Empty,
    #[error("unknown format version {0} (this build reads version {FORMAT_VERSION})")]
    UnknownVersion(u8),
    #[error("decode: {0}")]
    Decode(String),
    #[error("encode: {0}")]
    Encode(String),
    #[error("{0} trailing bytes after the value")]
    Trailing(usize),
}

/// Encodes `value` as a version byte followed by its bincode form.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(64);
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Appends the encoding of `value` (version byte first) to `out`.
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
    out.push(FORMAT_VERSION);
    bincode::serde::encode_into_std_write(value, out, config())
        .map(|_| ())
        .map_err(|e| CodecError::Encode(e.to_string()))
}

/// Decodes a value written by [`encode`]; the whole input must be consumed.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_with(bytes, config())
}

/// [`decode`], allocating for at most `LIMIT` bytes of the lengths the input claims (bincode
/// allocates for a length before it reads the bytes it announces): for input from the network,
/// so that a short body cannot make the decoder allocate hundreds of megabytes.
pub fn decode_bounded<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<T, CodecError> {
    decode_with(bytes, config_limited::<LIMIT>())
}

fn decode_with<T: DeserializeOwned>(
    bytes: &[u8],
    config: impl bincode::config::Config,
) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    match version {
        FORMAT_VERSION => {
            let (value, used) = bincode::serde::decode_from_slice::<T, _>(body, config)
                .map_err(|e| CodecError::Decode(e.to_string()))?;
            if used != body.len() {
                return Err(CodecError::Trailing(body.len() - used));
            }
            Ok(value)
        }
        other => Err(CodecError::UnknownVersion(other)),
    }
}

/// The number of elements of a sequence (a `Vec`) written by [`encode`], read without decoding
/// them (bincode writes it first); `None` for bytes of another format version or too short.
pub fn sequence_len(bytes: &[u8]) -> Option<u64> {
    leading::<u64>(bytes)
}

/// The variant index of an enum value written by [`encode`], read without decoding the rest
/// (bincode writes it first); `None` for bytes of another format version or too short.
pub fn variant_index(bytes: &[u8]) -> Option<u32> {
    leading::<u32>(bytes)
}

/// The integer that bytes written by [`encode`] begin with (after the format version).
fn leading<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let (&version, body) = bytes.split_first()?;
    if version != FORMAT_VERSION {
        return None;
    }
    bincode::serde::decode_from_slice::<T, _>(body, config())
        .ok()
        .map(|(value, _)| value)
}

impl From<CodecError> for std::io::Error {
    fn from(e: CodecError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_checks() {
        let v = (7u64, String::from("x"), vec![1u8, 2, 3]);
        let bytes = encode(&v).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        let back: (u64, String, Vec<u8>) = decode(&bytes).unwrap();
        assert_eq!(back, v);

        let mut future = bytes.clone();
        future[0] = 99;
        assert!(matches!(
            decode::<(u64, String, Vec<u8>)>(&future),
            Err(CodecError::UnknownVersion(99))
        ));
        assert!(matches!(decode::<u64>(&[]), Err(CodecError::Empty)));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            decode::<(u64, String, Vec<u8>)>(&long),
            Err(CodecError::Trailing(1))
        ));
        assert!(decode::<(u64, String, Vec<u8>)>(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn the_variant_index_is_read_without_the_rest() {
        #[derive(Serialize)]
        enum E {
            A(u64),
            B { x: String },
        }
        assert_eq!(variant_index(&encode(&E::A(7)).unwrap()), Some(0));
        let b = encode(&E::B { x: "y".into() }).unwrap();
        assert_eq!(variant_index(&b), Some(1));
        assert_eq!(variant_index(&b[..2]), Some(1), "the rest is not read");
        assert_eq!(variant_index(&[]), None);
        assert_eq!(variant_index(&[99, 1]), None);
    }
}
