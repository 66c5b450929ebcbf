//! A segment's bytes, read whole at recovery, in memory of their own.
//!
//! From the heap, the 64 MiB of a segment (two at once: the newest is read first, then the
//! others) stayed resident after recovery, for as long as the process ran: the allocator keeps
//! freed memory for reuse and hands it back only when later allocations on that thread come by,
//! which on the thread that opened the log never happens. Every restart of a member grew its
//! RSS by about 64 MiB that way. An anonymous mapping is unmapped when the bytes are dropped.

use std::io;
use std::ops::{Deref, DerefMut};

/// Zero-initialized bytes in an anonymous mapping (none for an empty file), unmapped on drop.
pub struct SegmentBytes(Option<memmap2::MmapMut>);

impl SegmentBytes {
    /// `len` zero bytes. The pages are the kernel's zero pages until written.
    pub fn zeroed(len: usize) -> io::Result<SegmentBytes> {
        match len {
            0 => Ok(SegmentBytes(None)),
            _ => memmap2::MmapMut::map_anon(len).map(|m| SegmentBytes(Some(m))),
        }
    }
}

impl Deref for SegmentBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for SegmentBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::SegmentBytes;

    #[test]
    fn bytes_start_as_zeros_and_keep_what_is_written() {
        let mut bytes = SegmentBytes::zeroed(10_000).unwrap();
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[9_999] = 7;
        bytes[..3].copy_from_slice(b"abc");
        assert_eq!(bytes.len(), 10_000);
        assert_eq!((&bytes[..3], bytes[9_999]), (&b"abc"[..], 7));
        let empty = SegmentBytes::zeroed(0).unwrap();
        assert!(empty.is_empty());
    }
}
