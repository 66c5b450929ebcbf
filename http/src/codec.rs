//! The one place where Raft RPC bodies are encoded: bincode 2 over serde, behind a version byte.
//!
//! The version byte lets a node refuse, with a clear error, an RPC from a binary that speaks
//! another wire format instead of misreading it.

use std::io;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Wire format of the Raft RPC bodies.
pub const WIRE_VERSION: u8 = 1;

/// Largest number of bytes a decoded body may claim for one allocation (guards against a
/// corrupt length prefix asking for gigabytes).
const DECODE_LIMIT: usize = 1 << 30;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// Encodes a value as `[WIRE_VERSION][bincode]`.
pub fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let mut out = vec![WIRE_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| invalid(format!("encoding an RPC body: {e}")))?;
    Ok(out)
}

/// Decodes a value written by [`encode`]; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    let (&version, rest) = bytes
        .split_first()
        .ok_or_else(|| invalid("empty RPC body".into()))?;
    if version != WIRE_VERSION {
        return Err(invalid(format!(
            "RPC wire version {version} is not the supported version {WIRE_VERSION}"
        )));
    }
    let (value, used) = bincode::serde::decode_from_slice(rest, config())
        .map_err(|e| invalid(format!("decoding an RPC body: {e}")))?;
    if used != rest.len() {
        return Err(invalid(format!(
            "decoding an RPC body: {} trailing bytes",
            rest.len() - used
        )));
    }
    Ok(value)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rpc {
        term: u64,
        entries: Vec<String>,
        leader: Option<u64>,
    }

    #[test]
    fn round_trip() {
        let rpc = Rpc {
            term: 7,
            entries: vec!["a".into(), "b".into()],
            leader: Some(1),
        };
        let bytes = encode(&rpc).unwrap();
        assert_eq!(bytes[0], WIRE_VERSION);
        assert_eq!(decode::<Rpc>(&bytes).unwrap(), rpc);
    }

    #[test]
    fn refuses_bad_bodies() {
        let mut bytes = encode(&Rpc {
            term: 1,
            entries: vec![],
            leader: None,
        })
        .unwrap();
        let message = |r: io::Result<Rpc>| r.unwrap_err().to_string();
        assert!(message(decode(&[])).contains("empty"));
        assert!(message(decode(&bytes[..2])).contains("decoding"));
        bytes.push(0);
        assert!(message(decode(&bytes)).contains("trailing"));
        bytes[0] = 9;
        assert!(message(decode(&bytes)).contains("version 9"));
    }
}
