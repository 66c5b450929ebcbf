//! A forwarded batch's length prefixes cannot make the leader allocate for bytes the body
//! does not hold: bincode allocates (and zeroes) a string's claimed length before it reads it.
//! Measured with an allocator that notes the largest allocation of the calling thread (not a
//! process-wide figure: other tests' threads do not move it).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use axum::http::{Method, StatusCode};
use common::{call, leader_node};
use meta_consensus::{codec, Command};
use meta_http::forward_batch::PATH_FORWARD_BATCH;

struct LargestPerThread;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is passed on to the system allocator unchanged; noting a size touches
// only a const-initialized thread local, which allocates nothing.
unsafe impl GlobalAlloc for LargestPerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: LargestPerThread = LargestPerThread;

/// A body of a dozen bytes whose one `Put` claims a key of 250 MiB.
fn claiming_a_huge_key() -> Vec<u8> {
    let real = codec::encode(&vec![Command::Put {
        key: "k".into(),
        value: Vec::new(),
        if_revision: None,
    }])
    .unwrap();
    // Version, the batch's length (1), the variant index (both one byte), then the key's
    // length: replaced by a varint of 250 MiB (0xfc and four bytes).
    let mut body = real[..3].to_vec();
    body.push(0xfc);
    body.extend_from_slice(&(250u32 << 20).to_le_bytes());
    body.push(b'k');
    body
}

#[tokio::test]
async fn a_short_forwarded_batch_claiming_a_huge_key_allocates_little() {
    let t = leader_node(None).await;
    let body = claiming_a_huge_key();
    LARGEST.with(|l| l.set(0));
    // The router runs the handler on this thread (a current-thread runtime, no spawn).
    let a = call(&t.app, Method::POST, PATH_FORWARD_BATCH, body, &[]).await;
    let largest = LARGEST.with(|l| l.get());
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
    assert_eq!(a.error_code(), "bad_batch");
    assert!(
        largest < 16 << 20,
        "a {}-byte body made the leader allocate {largest} bytes at once",
        claiming_a_huge_key().len()
    );
}
