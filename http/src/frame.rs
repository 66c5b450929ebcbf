//! Length-prefixed frames on a streamed HTTP body: a 4-byte big-endian length, then that
//! many bytes. The streamed AppendEntries exchange carries one request or one answer per
//! frame in each direction.

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::Serialize;

use meta_consensus::codec;

/// One value encoded (bincode, through the codec module) as a frame.
pub fn encode_frame<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, codec::CodecError> {
    let mut out = vec![0u8; 4];
    codec::encode_into(value, &mut out)?;
    let len = u32::try_from(out.len() - 4)
        .map_err(|_| codec::CodecError::Encode("a frame longer than 4 GiB".into()))?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out.into())
}

/// Why a framed body ended before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The body failed, or ended inside a frame: its connection broke (a member stopping, a
    /// connection closed), which says nothing of what was sent.
    Broken(String),
    /// The body announced a frame longer than its receiver takes: the sender speaks another
    /// protocol, or the bytes were damaged.
    TooLong(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Broken(e) | FrameError::TooLong(e) => f.write_str(e),
        }
    }
}

/// Splits a body of chunks into frames (payloads, without their length).
///
/// Ends after the last whole frame when the body ends. Yields one `Err` and ends if the body
/// fails, ends inside a frame, or announces a frame longer than `max_frame` bytes.
pub fn frames<S, E>(chunks: S, max_frame: usize) -> impl Stream<Item = Result<Bytes, FrameError>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    futures::stream::unfold(Some((chunks, BytesMut::new())), move |state| async move {
        let (mut chunks, mut buf) = state?;
        loop {
            if buf.len() >= 4 {
                let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if len > max_frame {
                    let e = format!("a frame of {len} bytes (at most {max_frame} accepted)");
                    return Some((Err(FrameError::TooLong(e)), None));
                }
                if buf.len() >= 4 + len {
                    buf.advance(4);
                    let frame = buf.split_to(len).freeze();
                    return Some((Ok(frame), Some((chunks, buf))));
                }
            }
            match chunks.next().await {
                Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    let e = format!("reading the stream: {e}");
                    return Some((Err(FrameError::Broken(e)), None));
                }
                None if buf.is_empty() => return None,
                None => {
                    let e = format!("the stream ended inside a frame ({} bytes)", buf.len());
                    return Some((Err(FrameError::Broken(e)), None));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(bytes: &[u8], at: &[usize]) -> Vec<Result<Bytes, String>> {
        let mut out = Vec::new();
        let mut start = 0;
        for &end in at.iter().chain(std::iter::once(&bytes.len())) {
            out.push(Ok(Bytes::copy_from_slice(&bytes[start..end])));
            start = end;
        }
        out
    }

    async fn collect(
        chunks: Vec<Result<Bytes, String>>,
        max: usize,
    ) -> Vec<Result<Bytes, FrameError>> {
        frames(futures::stream::iter(chunks), max).collect().await
    }

    #[tokio::test]
    async fn frames_survive_any_chunking() {
        let values: Vec<Vec<u8>> = vec![vec![], vec![7; 3], vec![1; 300]];
        let mut wire = Vec::new();
        for v in &values {
            wire.extend_from_slice(&encode_frame(v).unwrap());
        }
        for cut in 0..wire.len() {
            for cut2 in cut..wire.len() {
                let got = collect(split(&wire, &[cut, cut2]), 1024).await;
                let decoded: Vec<Vec<u8>> = got
                    .into_iter()
                    .map(|f| codec::decode(&f.unwrap()).unwrap())
                    .collect();
                assert_eq!(decoded, values, "cut at {cut}, {cut2}");
            }
        }
    }

    #[tokio::test]
    async fn a_truncated_an_oversized_or_a_failed_stream_ends_with_an_error() {
        let frame = encode_frame(&vec![5u8; 100]).unwrap();
        let got = collect(vec![Ok(frame.slice(..50))], 1024).await;
        assert_eq!(got.len(), 1);
        let broken = got[0].as_ref().unwrap_err();
        assert!(matches!(broken, FrameError::Broken(e) if e.contains("inside a frame")));

        let got = collect(vec![Ok(frame.clone()), Ok(frame.clone())], 50).await;
        assert_eq!(got.len(), 1);
        let long = got[0].as_ref().unwrap_err();
        assert!(matches!(long, FrameError::TooLong(e) if e.contains("at most 50")));

        let got = collect(vec![Ok(frame.clone()), Err("reset".into())], 1024).await;
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        let failed = got[1].as_ref().unwrap_err();
        assert!(matches!(failed, FrameError::Broken(e) if e.contains("reset")));
    }
}
