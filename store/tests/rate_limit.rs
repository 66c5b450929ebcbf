//! The accumulating rate limiter: its pacing policy against a fake clock (no real sleeps), and
//! the sync and async writer adapters, and the async reader adapter.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meta_store::rate_limit::{
    AsyncThrottledReader, AsyncThrottledWriter, Clock, Pacer, RateLimiter, ThrottledWriter,
    IDLE_CREDIT, THREAD_TIMER, TOKIO_TIMER,
};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A clock that only moves when someone sleeps on it (or the test advances it), and counts reads.
#[derive(Debug, Default)]
struct FakeClock {
    now: Mutex<Duration>,
    reads: AtomicU64,
    sleeps: Mutex<Vec<Duration>>,
    /// Added to every sleep, like a timer that wakes late.
    oversleep: Duration,
}

impl FakeClock {
    fn new() -> Arc<Self> {
        Arc::new(FakeClock::default())
    }

    fn oversleeping(by: Duration) -> Arc<Self> {
        Arc::new(FakeClock {
            oversleep: by,
            ..FakeClock::default()
        })
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn elapsed(&self) -> Duration {
        *self.now.lock()
    }

    fn advance(&self, by: Duration) {
        *self.now.lock() += by;
    }

    fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().clone()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        self.reads.fetch_add(1, Ordering::Relaxed);
        *self.now.lock()
    }

    fn sleep(&self, duration: Duration) {
        self.sleeps.lock().push(duration);
        *self.now.lock() += duration + self.oversleep;
    }
}

fn limiter(rate: u64, clock: &Arc<FakeClock>) -> Arc<RateLimiter> {
    Arc::new(RateLimiter::with_clock(rate, clock.clone()))
}

/// Writes `total` bytes as 8 KiB writes, each followed by a zero-byte write and a flush.
fn write_pattern(out: &mut impl Write, total: usize) {
    let block = [7u8; 8192];
    let mut left = total;
    while left > 0 {
        let n = left.min(block.len());
        out.write_all(&block[..n]).unwrap();
        assert_eq!(out.write(&[]).unwrap(), 0);
        out.flush().unwrap();
        left -= n;
    }
}

const MB: u64 = 1_000_000;

#[test]
fn pacer_schedule_is_exact_at_several_rates() {
    for rate in [MB, 3 * MB, 16 * MB, 64 * MB, 1024 * MB] {
        let chunk = Pacer::chunk_bytes(rate);
        let cost = Pacer::cost(chunk, rate);
        let mut pacer = Pacer::new();
        let mut now = Duration::ZERO;
        for i in 1..=1000u32 {
            let wait = pacer.pause(chunk, rate, THREAD_TIMER, || now).wait;
            // Writes are instantaneous here, so every pause is exactly one chunk's time.
            assert_eq!(wait, cost, "rate {rate} pause {i}");
            now += wait;
            assert_eq!(pacer.deadline(), Some(cost * i), "rate {rate} pause {i}");
        }
        // 1000 chunks took exactly 1000 chunks' worth of time, to the rounding nanosecond.
        let ideal = chunk as f64 * 1000.0 / rate as f64;
        assert!(
            (now.as_secs_f64() - ideal).abs() < 1e-6,
            "rate {rate}: {now:?} vs {ideal}"
        );
    }
}

#[test]
fn pacer_makes_up_write_time_and_oversleep() {
    let rate = 16 * MB; // 16,000-byte chunks, 1 ms each
    let chunk = Pacer::chunk_bytes(rate);
    assert_eq!(Pacer::cost(chunk, rate), Duration::from_millis(1));
    let mut pacer = Pacer::new();
    let mut now = Duration::ZERO;
    let write_time = Duration::from_micros(200);
    let oversleep = Duration::from_micros(300);
    let mut waits = Vec::new();
    for _ in 0..100 {
        now += write_time;
        let wait = pacer.pause(chunk, rate, THREAD_TIMER, || now).wait;
        waits.push(wait);
        now += wait + oversleep;
    }
    // The first pause starts the clock; every later one deducts the write time and the last
    // oversleep, so the stream keeps the rate exactly.
    assert_eq!(waits[0], Duration::from_millis(1));
    for wait in &waits[1..] {
        assert_eq!(*wait, Duration::from_micros(500));
    }
    assert_eq!(
        pacer.deadline(),
        Some(write_time + Duration::from_millis(100))
    );
}

#[test]
fn pacer_skips_sleeps_the_timer_cannot_honour_but_keeps_the_average() {
    let rate = 16 * MB; // 1 ms chunks
    let chunk = Pacer::chunk_bytes(rate);
    let timer = TOKIO_TIMER; // 1 ms
    let mut pacer = Pacer::new();
    let mut now = Duration::ZERO;
    let write_time = Duration::from_micros(400);
    let mut slept = 0;
    let mut skipped = 0;
    for _ in 0..1000 {
        now += write_time;
        let wait = pacer.pause(chunk, rate, timer, || now).wait;
        assert!(
            wait.is_zero() || wait >= timer,
            "a sleep under the timer: {wait:?}"
        );
        if wait.is_zero() {
            skipped += 1;
        } else {
            slept += 1;
        }
        now += wait;
    }
    assert!(skipped > 0 && slept > 0, "skipped {skipped}, slept {slept}");
    // Skipped waits are made up later: after 1000 chunks of 1 ms the stream is behind its
    // deadline by less than one timer tick, never ahead of it by more than one.
    let deadline = pacer.deadline().unwrap();
    assert_eq!(deadline, write_time + Duration::from_millis(1000));
    assert!(
        deadline.saturating_sub(now) < timer,
        "{now:?} vs {deadline:?}"
    );
}

#[test]
fn pacer_bounds_the_credit_earned_while_idle() {
    let rate = 16 * MB; // 1 ms chunks
    let chunk = Pacer::chunk_bytes(rate);
    let cost = Pacer::cost(chunk, rate);
    let mut pacer = Pacer::new();
    let mut now = Duration::ZERO;
    for _ in 0..10 {
        now += pacer.pause(chunk, rate, THREAD_TIMER, || now).wait;
    }
    // Idle for ten seconds, then write a hundred more chunks as fast as allowed.
    now += Duration::from_secs(10);
    let resumed = now;
    let mut waits = Vec::new();
    for _ in 0..100 {
        let wait = pacer.pause(chunk, rate, THREAD_TIMER, || now).wait;
        waits.push(wait);
        now += wait;
    }
    // The idle credit's worth of chunks (50 ms: 50 chunks) goes at once; the rest are paced.
    let credited = (IDLE_CREDIT.as_nanos() / cost.as_nanos()) as usize;
    assert_eq!(credited, 50);
    assert!(waits[..credited].iter().all(|w| w.is_zero()), "{waits:?}");
    assert!(waits[credited..].iter().all(|w| *w == cost), "{waits:?}");
    assert_eq!(now - resumed, cost * (100 - credited as u32));
}

/// A job that pauses between its writes (an export reading its next records) for less than
/// the idle credit takes max(its own time, bytes / rate): here a producer that computes for
/// 4 ms, then writes 4 ms worth at once, takes 4 ms a round, not 7 (when a gap earned 1 ms).
#[test]
fn pacer_gaps_within_a_job_cost_it_nothing() {
    let rate = 64 * MB; // 1 ms chunks
    let chunk = Pacer::chunk_bytes(rate);
    let mut pacer = Pacer::new();
    let mut now = Duration::ZERO;
    for _ in 0..100 {
        now += Duration::from_millis(4);
        for _ in 0..4 {
            now += pacer.pause(chunk, rate, THREAD_TIMER, || now).wait;
        }
    }
    let ideal = Duration::from_millis(400);
    assert!(
        now <= ideal + ideal / 50,
        "{now:?} for {ideal:?} of work and of bytes"
    );
}

/// A sleep that ended very late (a stalled process) is credited only up to the idle credit:
/// the stream does not burst an hour's worth of bytes afterwards.
#[test]
fn pacer_bounds_the_credit_of_a_late_wake_up() {
    let rate = 16 * MB;
    let chunk = Pacer::chunk_bytes(rate);
    let mut pacer = Pacer::new();
    let first = pacer.pause(chunk * 10, rate, THREAD_TIMER, || Duration::ZERO);
    assert!(!first.is_zero());
    let now = Duration::from_secs(3600);
    pacer.woke(first, now);
    let free = (0..200)
        .take_while(|_| pacer.pause(chunk, rate, THREAD_TIMER, || now).is_zero())
        .count();
    // The idle credit (50 ms) and the oversleep credited (at most 50 ms more): 100 chunks.
    assert!(
        free <= 100,
        "{free} chunks went unpaced after a late wake-up"
    );
}

/// A rate set back to an earlier value (through unlimited, say) starts a new schedule: what
/// was charged at it before is not owed.
#[test]
fn a_rate_set_again_starts_a_new_schedule() {
    let clock = FakeClock::new();
    let limiter = limiter(1_000, &clock);
    assert_eq!(
        limiter.charge(1_000_000, THREAD_TIMER).wait,
        Duration::from_secs(1_000)
    );
    limiter.set_rate(0);
    limiter.set_rate(1_000);
    assert_eq!(
        limiter.charge(1_000, THREAD_TIMER).wait,
        Duration::from_secs(1),
        "the forgiven pause is owed again"
    );
}

#[test]
fn pacer_at_unlimited_rate_never_reads_the_clock() {
    let mut pacer = Pacer::new();
    for _ in 0..1000 {
        let pause = pacer.pause(1 << 30, 0, THREAD_TIMER, || {
            panic!("the unlimited rate read the clock")
        });
        assert!(pause.is_zero());
    }
}

#[test]
fn writer_keeps_the_exact_schedule_at_several_rates() {
    for rate in [MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB, 1024 * MB] {
        let clock = FakeClock::new();
        let limiter = limiter(rate, &clock);
        let mut out = ThrottledWriter::new(io::sink(), limiter.clone());
        let total = 8 * 1024 * 1024 + 123;
        write_pattern(&mut out, total);
        out.finish().unwrap();
        let ideal = Pacer::cost(total as u64, rate);
        let elapsed = clock.elapsed();
        let sleeps = clock.sleeps();
        let pauses = sleeps.len() as u32;
        // Rounding each pause up to a nanosecond adds at most a nanosecond per pause; a final
        // wait shorter than the timer is skipped, so the stream may end that much early.
        assert!(
            elapsed + THREAD_TIMER >= ideal
                && elapsed <= ideal + Duration::from_nanos(u64::from(pauses)),
            "rate {rate}: {elapsed:?} vs {ideal:?}"
        );
        // Two clock reads per pause, one to charge and one on waking (plus possibly a final,
        // skipped pause); each pause is about one chunk (a write may overshoot it).
        assert!(
            clock.reads() == 2 * u64::from(pauses) || clock.reads() == 2 * u64::from(pauses) + 1,
            "rate {rate}: {} reads, {pauses} pauses",
            clock.reads()
        );
        let chunk_time = Pacer::cost(Pacer::chunk_bytes(rate), rate);
        for sleep in &sleeps[..sleeps.len() - 1] {
            assert!(
                *sleep >= chunk_time && *sleep < chunk_time + Pacer::cost(8192, rate),
                "rate {rate}: pause {sleep:?}, chunk {chunk_time:?}"
            );
        }
        assert_eq!(limiter.pauses(), u64::from(pauses));
        assert_eq!(limiter.paused_nanos() as u128, elapsed.as_nanos());
    }
}

#[test]
fn zero_byte_calls_never_touch_the_clock() {
    let clock = FakeClock::new();
    let limiter = limiter(MB, &clock); // 4 KiB chunks
    let mut out = ThrottledWriter::new(io::sink(), limiter);
    for _ in 0..10_000 {
        assert_eq!(out.write(&[]).unwrap(), 0);
        out.flush().unwrap();
    }
    assert_eq!(clock.reads(), 0);
    // Bytes below one chunk accumulate without reading the clock either.
    for _ in 0..4095 {
        out.write_all(&[1]).unwrap();
        assert_eq!(out.write(&[]).unwrap(), 0);
        out.flush().unwrap();
    }
    assert_eq!(clock.reads(), 0);
    out.write_all(&[1]).unwrap();
    assert_eq!(clock.reads(), 2, "one read to charge, one on waking");
    assert_eq!(clock.elapsed(), Duration::from_nanos(4_096_000));
    // The 8 KiB + empty write + flush pattern pauses once per 8 KiB at this rate.
    write_pattern(&mut out, 100 * 8192);
    assert_eq!(clock.reads(), 202);
    out.finish().unwrap();
    assert_eq!(clock.reads(), 202, "nothing left to settle");
}

#[test]
fn finish_settles_the_accumulated_bytes() {
    let clock = FakeClock::new();
    let limiter = limiter(16 * MB, &clock); // 16,000-byte chunks
    let mut out = ThrottledWriter::new(Vec::new(), limiter);
    out.write_all(&[5u8; 10_000]).unwrap();
    assert_eq!(clock.reads(), 0);
    let inner = out.finish().unwrap();
    assert_eq!(inner, vec![5u8; 10_000]);
    assert_eq!(clock.reads(), 2);
    assert_eq!(clock.elapsed(), Pacer::cost(10_000, 16 * MB));
}

#[test]
fn oversleep_is_made_up_by_the_next_pause() {
    let clock = FakeClock::oversleeping(Duration::from_micros(300));
    let rate = 64 * MB;
    let mut out = ThrottledWriter::new(io::sink(), limiter(rate, &clock));
    let total = 64 * 1024 * 1024;
    write_pattern(&mut out, total);
    out.finish().unwrap();
    let ideal = Pacer::cost(total as u64, rate);
    let elapsed = clock.elapsed();
    // Only the very last oversleep is not made up.
    assert!(
        elapsed >= ideal && elapsed <= ideal + Duration::from_micros(301),
        "{elapsed:?} vs {ideal:?}"
    );
}

#[test]
fn pacer_makes_up_oversleep_longer_than_a_chunk() {
    let rate = 16 * MB; // 1 ms chunks
    let chunk = Pacer::chunk_bytes(rate);
    let mut pacer = Pacer::new();
    let mut now = Duration::ZERO;
    let late = Duration::from_millis(5);
    for _ in 0..1000 {
        let pause = pacer.pause(chunk, rate, THREAD_TIMER, || now);
        if !pause.is_zero() {
            // Every sleep wakes 5 ms late: five chunks' worth.
            now += pause.wait + late;
            pacer.woke(pause, now);
        }
    }
    // The oversleeps were made up by the chunks that followed them: 1000 chunks took 1000 ms,
    // but for the last sleep's lateness.
    assert_eq!(pacer.deadline(), Some(Duration::from_millis(1000)));
    assert!(now <= Duration::from_millis(1000) + late, "{now:?}");
    assert!(pacer.owed() <= late);
}

#[test]
fn a_long_oversleep_is_made_up_by_a_writer() {
    let late = Duration::from_millis(5);
    let clock = FakeClock::oversleeping(late);
    let rate = 64 * MB;
    let mut out = ThrottledWriter::new(io::sink(), limiter(rate, &clock));
    let total = 64 * 1024 * 1024;
    write_pattern(&mut out, total);
    out.finish().unwrap();
    let ideal = Pacer::cost(total as u64, rate);
    let elapsed = clock.elapsed();
    assert!(
        elapsed >= ideal && elapsed <= ideal + late,
        "{elapsed:?} vs {ideal:?}"
    );
}

#[test]
fn idle_credit_is_bounded_for_a_writer() {
    let clock = FakeClock::new();
    let rate = 16 * MB;
    let mut out = ThrottledWriter::new(io::sink(), limiter(rate, &clock));
    write_pattern(&mut out, 1 << 20);
    clock.advance(Duration::from_secs(60));
    let resumed = clock.elapsed();
    let total = 4 << 20;
    write_pattern(&mut out, total);
    out.finish().unwrap();
    // A minute of idleness bought at most the idle credit (50 ms) of unpaced writing.
    let floor = Pacer::cost(total as u64, rate).saturating_sub(IDLE_CREDIT);
    assert!(clock.elapsed() - resumed >= floor);
}

#[test]
fn a_rate_change_takes_effect_at_the_next_pause() {
    let clock = FakeClock::new();
    let limiter = limiter(MB, &clock);
    let mut out = ThrottledWriter::new(io::sink(), limiter.clone());
    write_pattern(&mut out, 64 * 1024);
    assert_eq!(clock.elapsed(), Pacer::cost(64 * 1024, MB));
    assert_eq!(clock.sleeps().len(), 8);

    limiter.set_rate(16 * MB);
    assert_eq!(limiter.rate(), 16 * MB);
    write_pattern(&mut out, 64 * 1024);
    // The first write after the change still crosses the old 4 KiB threshold; from then on the
    // new 16,000-byte threshold applies (a pause per two writes, the last write left pending).
    // Every byte charged after the change is charged at the new rate.
    assert_eq!(
        clock.elapsed(),
        Pacer::cost(64 * 1024, MB) + Pacer::cost(7 * 8192, 16 * MB)
    );
    assert_eq!(clock.sleeps().len(), 8 + 1 + 3);

    // Going unlimited mid-stream: the next pause charges the pending bytes at the unlimited
    // rate, and from then on nothing reads the clock or sleeps.
    limiter.set_rate(0);
    let reads = clock.reads();
    write_pattern(&mut out, 16 << 20);
    out.finish().unwrap();
    assert_eq!(clock.reads(), reads);
    assert_eq!(clock.sleeps().len(), 12);
}

#[test]
fn an_unlimited_limiter_never_sleeps_or_reads_the_clock() {
    let clock = FakeClock::new();
    let limiter = limiter(0, &clock);
    assert!(limiter.is_unlimited());
    let mut out = ThrottledWriter::new(io::sink(), limiter.clone());
    write_pattern(&mut out, 64 << 20);
    out.finish().unwrap();
    assert_eq!(clock.reads(), 0);
    assert!(clock.sleeps().is_empty());
    assert_eq!(limiter.pauses(), 0);
    assert_eq!(limiter.paused_nanos(), 0);
    assert_eq!(
        RateLimiter::unlimited().rate(),
        0,
        "unlimited is the rate 0"
    );
}

#[test]
fn an_unlimited_writer_picks_up_a_new_rate_within_one_mebibyte() {
    let clock = FakeClock::new();
    let limiter = limiter(0, &clock);
    let mut out = ThrottledWriter::new(io::sink(), limiter.clone());
    write_pattern(&mut out, 512 * 1024);
    limiter.set_rate(MB);
    write_pattern(&mut out, 1 << 20);
    assert!(clock.reads() >= 1, "the new rate was never applied");
    assert!(!clock.sleeps().is_empty());
}

#[test]
fn writers_sharing_a_limiter_share_its_budget() {
    let clock = FakeClock::new();
    let rate = 4 * MB;
    let limiter = limiter(rate, &clock);
    let mut a = ThrottledWriter::new(io::sink(), limiter.clone());
    let mut b = ThrottledWriter::new(io::sink(), limiter.clone());
    for _ in 0..256 {
        write_pattern(&mut a, 8192);
        write_pattern(&mut b, 8192);
    }
    a.finish().unwrap();
    b.finish().unwrap();
    assert_eq!(clock.elapsed(), Pacer::cost(2 * 256 * 8192, rate));
}

/// A pause of the async writer charged at a mistaken tiny rate ends once the rate is lifted,
/// as a thread's does: it does not sleep out the hour the old rate asked for.
#[tokio::test]
async fn async_writer_pause_ends_when_the_rate_changes() {
    let limiter = Arc::new(RateLimiter::new(1));
    let mut out = AsyncThrottledWriter::new(tokio::io::sink(), limiter.clone());
    // 4 KiB at 1 byte a second: a pause of over an hour, owed before the next write.
    out.write_all(&[0u8; 4096]).await.unwrap();
    limiter.set_rate(0);
    tokio::time::timeout(Duration::from_secs(10), out.write_all(&[0]))
        .await
        .expect("the pause outlived the rate it was charged at")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), out.finish())
        .await
        .expect("finish waited for the old pause")
        .unwrap();
}

#[tokio::test]
async fn async_writer_accumulates_and_shutdown_settles() {
    // The fake clock stands still, so the waits the limiter asks for are exact; the writer
    // sleeps them on tokio's (real) timer, a few milliseconds in all.
    let clock = FakeClock::new();
    let rate = 10 * MB; // 10,000-byte chunks, 1 ms each
    let limiter = limiter(rate, &clock);
    let mut out = AsyncThrottledWriter::new(Vec::new(), limiter.clone());
    for _ in 0..1000 {
        assert_eq!(out.write(&[]).await.unwrap(), 0);
        out.flush().await.unwrap();
    }
    assert_eq!(clock.reads(), 0);
    for _ in 0..5 {
        out.write_all(&[9u8; 5000]).await.unwrap();
        assert_eq!(out.write(&[]).await.unwrap(), 0);
        out.flush().await.unwrap();
    }
    // Two pauses so far, each read to charge and again when the writer woke.
    assert_eq!(clock.reads(), 4);
    out.shutdown().await.unwrap();
    assert_eq!(clock.reads(), 6, "shutdown settles the last 5,000 bytes");
    assert_eq!(limiter.pauses(), 3);
    assert_eq!(
        Duration::from_nanos(limiter.paused_nanos()),
        Duration::from_micros(1000 + 2000 + 2500)
    );
    assert_eq!(out.get_ref().len(), 25_000);
    assert!(
        clock.sleeps().is_empty(),
        "the async writer sleeps on tokio"
    );
}

#[tokio::test]
async fn async_writer_never_goes_faster_than_the_rate() {
    let rate = 8 * MB;
    let limiter = Arc::new(RateLimiter::new(rate));
    let started = Instant::now();
    let mut out = AsyncThrottledWriter::new(Vec::new(), limiter.clone());
    let block = [3u8; 8192];
    for _ in 0..32 {
        out.write_all(&block).await.unwrap();
        assert_eq!(out.write(&[]).await.unwrap(), 0);
        out.flush().await.unwrap();
    }
    let inner = out.finish().await.unwrap();
    assert_eq!(inner.len(), 32 * 8192);
    // A lower bound only: the first pause starts the clock and a final wait under one timer
    // tick may be skipped, so the stream can be at most that much early.
    let floor = Pacer::cost(32 * 8192, rate).saturating_sub(TOKIO_TIMER);
    assert!(started.elapsed() >= floor, "{:?}", started.elapsed());
    assert!(limiter.pauses() > 0);
}

#[test]
fn async_writer_at_unlimited_rate_never_reads_the_clock() {
    let clock = FakeClock::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut out = AsyncThrottledWriter::new(tokio::io::sink(), limiter(0, &clock));
        let block = [1u8; 8192];
        for _ in 0..4096 {
            out.write_all(&block).await.unwrap();
            assert_eq!(out.write(&[]).await.unwrap(), 0);
            out.flush().await.unwrap();
        }
        out.shutdown().await.unwrap();
    });
    assert_eq!(clock.reads(), 0);
}

#[tokio::test]
async fn async_reader_accumulates_and_the_end_of_the_stream_settles() {
    // As the writer's test: the fake clock stands still, so the waits are exact.
    let clock = FakeClock::new();
    let limiter = limiter(10 * MB, &clock); // 10,000-byte chunks, 1 ms each
    let source = vec![7u8; 25_000];
    let mut input = AsyncThrottledReader::new(&source[..], limiter.clone());
    let mut buf = [0u8; 5000];
    for _ in 0..5 {
        assert_eq!(input.read(&mut buf).await.unwrap(), 5000);
        assert_eq!(input.read(&mut []).await.unwrap(), 0, "an empty buffer");
    }
    // Two pauses so far, each read to charge and again when the reader woke.
    assert_eq!(clock.reads(), 4);
    assert_eq!(limiter.pauses(), 2);
    assert_eq!(input.read(&mut buf).await.unwrap(), 0, "the end");
    assert_eq!(clock.reads(), 6, "the end settles the last 5,000 bytes");
    assert_eq!(limiter.pauses(), 3);
    assert_eq!(
        Duration::from_nanos(limiter.paused_nanos()),
        Duration::from_micros(1000 + 2000 + 2500)
    );
    assert_eq!(input.read(&mut buf).await.unwrap(), 0, "the end, again");
    assert_eq!(clock.reads(), 6, "nothing left to settle");
    assert!(
        clock.sleeps().is_empty(),
        "the async reader sleeps on tokio"
    );
}

/// A large read buffer does not take a burst: a read takes at most what may pass before the next
/// charge (about 1 ms worth, 4 KiB at least), until the rate is lifted.
#[tokio::test]
async fn async_reader_takes_no_more_than_a_chunk_at_once() {
    let clock = FakeClock::new();
    let limiter = limiter(MB, &clock);
    let chunk = limiter.chunk_bytes() as usize;
    let source = vec![5u8; 64 * 1024];
    let mut input = AsyncThrottledReader::new(&source[..], limiter.clone());
    let mut buf = vec![0u8; 256 * 1024];
    assert_eq!(input.read(&mut buf).await.unwrap(), chunk);
    assert_eq!(input.read(&mut buf[..100]).await.unwrap(), 100);
    assert_eq!(
        input.read(&mut buf).await.unwrap(),
        chunk - 100,
        "up to the next charge"
    );
    limiter.set_rate(0);
    assert_eq!(
        input.read(&mut buf).await.unwrap(),
        source.len() - 2 * chunk,
        "unlimited: as much as the buffer takes"
    );
}

#[tokio::test]
async fn async_reader_never_goes_faster_than_the_rate() {
    let rate = 8 * MB;
    let limiter = Arc::new(RateLimiter::new(rate));
    let source = vec![3u8; 32 * 8192];
    let started = Instant::now();
    let mut read = Vec::new();
    AsyncThrottledReader::new(&source[..], limiter.clone())
        .read_to_end(&mut read)
        .await
        .unwrap();
    assert_eq!(read, source);
    // A lower bound, as for the writer.
    let floor = Pacer::cost(32 * 8192, rate).saturating_sub(TOKIO_TIMER);
    assert!(started.elapsed() >= floor, "{:?}", started.elapsed());
    assert!(limiter.pauses() > 0);
}

/// A download paced at a mistaken tiny rate speeds up once the rate is lifted (a closing node
/// lifts it too).
#[tokio::test]
async fn async_reader_pause_ends_when_the_rate_changes() {
    let limiter = Arc::new(RateLimiter::new(1));
    let source = vec![1u8; 8192];
    let mut input = AsyncThrottledReader::new(&source[..], limiter.clone());
    // 4 KiB at 1 byte a second: a pause of over an hour, owed before the next read.
    let mut buf = [0u8; 4096];
    assert_eq!(input.read(&mut buf).await.unwrap(), 4096);
    limiter.set_rate(0);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), input.read_to_end(&mut rest))
        .await
        .expect("the pause outlived the rate it was charged at")
        .unwrap();
    assert_eq!(rest.len(), 4096);
}

/// A new rate starts a new schedule: what was charged at a tiny rate is not waited out after the
/// rate is raised.
#[test]
fn pacer_forgives_what_was_charged_at_an_old_rate() {
    let mut pacer = Pacer::new();
    let now = Duration::from_secs(100);
    let slow = pacer.pause(4096, 1, THREAD_TIMER, || now);
    assert_eq!(slow.wait, Duration::from_secs(4096));
    let fast = pacer.pause(1_000_000, 1_000_000, THREAD_TIMER, || now);
    assert_eq!(fast.wait, Duration::from_secs(1));
}

/// A thread sleeping out a pause charged at 1 byte/s (over an hour for 4 KiB) returns soon after
/// the rate is lifted, as a closing node does, instead of holding the process for days.
#[test]
fn a_pause_ends_when_the_rate_changes() {
    let limiter = Arc::new(RateLimiter::new(1));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let sleeper = limiter.clone();
    let thread = std::thread::spawn(move || {
        sleeper.pause(4096);
        let _ = done_tx.send(());
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.pauses() == 0 {
        assert!(Instant::now() < deadline, "the pause never started");
        std::thread::yield_now();
    }
    limiter.set_rate(0);
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the pause ended after the rate was lifted");
    thread.join().unwrap();
}
