//! The `limiter` benchmark: how closely the accumulating rate limiter keeps to the requested rate
//! under the write pattern that broke a naive limiter (8 KiB write, zero-byte write, flush), what
//! the adapter costs at the unlimited rate, and how long a paced snapshot export takes.
//!
//! `cargo run --release -p meta-bench -- limiter [--seconds S] [--rounds N] [--rates 1,4,..]
//! [--export-mib M] [--export-rate R]` (`--help` explains them)

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use meta_store::{RateLimiter, SnapshotStore, ThrottledWriter};
use serde_json::{json, Value};

use crate::cli;
use crate::report::{self, median};

const MB: f64 = 1_000_000.0;
const BLOCK: usize = 8192;
/// The clock is checked for the end of a run once per this many blocks (in every arm alike).
const BLOCKS_PER_CHECK: usize = 16;
/// The real file is rewritten from its start once it reaches this size, to bound disk use.
const FILE_WRAP: u64 = 256 << 20;
/// Lower and upper bounds of the accepted achieved/requested ratio.
const TARGET: (f64, f64) = (0.97, 1.01);
/// A paced export may take at most this much longer than max(unthrottled, bytes / rate).
const EXPORT_SLACK: f64 = 1.05;

/// `meta-bench limiter`: how closely the accumulating limiter keeps to the requested rate.
#[derive(Debug, clap::Parser)]
#[command(name = "meta-bench limiter")]
struct Options {
    /// Seconds of each paced run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Rounds of each rate, arms interleaved; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Requested rates in MB/s, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256,1024")]
    rates: Vec<u64>,
    /// MiB of the paced snapshot export.
    #[arg(long, default_value_t = 256)]
    export_mib: u64,
    /// Pace of the snapshot export in MB/s.
    #[arg(long, default_value_t = 64)]
    export_rate: u64,
    /// Rounds of the overhead measurement (the adapter at the unlimited rate against none).
    #[arg(long, default_value_t = 15)]
    overhead_rounds: usize,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let opts: Options = cli::parse("limiter", args)?;
        if !opts.seconds.is_finite()
            || opts.seconds <= 0.0
            || opts.rounds == 0
            || opts.overhead_rounds == 0
        {
            bail!("--seconds, --rounds and --overhead-rounds must be positive");
        }
        if opts.rates.is_empty() || opts.rates.contains(&0) || opts.export_rate == 0 {
            bail!("rates must be positive (MB/s)");
        }
        Ok(opts)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sink {
    Sink,
    File,
}

impl Sink {
    fn name(self) -> &'static str {
        match self {
            Sink::Sink => "sink",
            Sink::File => "file",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    Accumulating,
    Naive,
    Bare,
    Adapter,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Accumulating => "accumulating",
            Arm::Naive => "naive",
            Arm::Bare => "bare",
            Arm::Adapter => "adapter",
        }
    }
}

/// A real file of [`FILE_WRAP`] bytes, written over and over from its start.
struct WrappingFile {
    file: File,
    pos: u64,
}

impl WrappingFile {
    /// Creates the file at its full size and makes it durable once, so that the runs overwrite
    /// allocated blocks (through the page cache) instead of each run allocating anew.
    fn prepare(path: &Path) -> Result<()> {
        let mut file = File::create(path).with_context(|| format!("create {}", path.display()))?;
        let block = vec![0x5Au8; 1 << 20];
        for _ in 0..FILE_WRAP / block.len() as u64 {
            file.write_all(&block)?;
        }
        file.sync_all()?;
        Ok(())
    }

    /// Opens the prepared file for a run, at offset 0.
    fn open(path: &Path) -> Result<WrappingFile> {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        Ok(WrappingFile { file, pos: 0 })
    }
}

impl Write for WrappingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.pos + buf.len() as u64 > FILE_WRAP {
            self.file.seek(SeekFrom::Start(0))?;
            self.pos = 0;
        }
        let n = self.file.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// The naive limiter the reference system started with: every call, including a zero-byte one,
/// reads the clock and sleeps until the call's bytes are due; a deadline already past is reset to
/// now (so oversleep is never made up).
struct NaiveWriter<W> {
    inner: W,
    nanos_per_byte: f64,
    last: Instant,
}

impl<W: Write> NaiveWriter<W> {
    fn new(inner: W, bytes_per_sec: u64) -> Self {
        NaiveWriter {
            inner,
            nanos_per_byte: 1e9 / bytes_per_sec as f64,
            last: Instant::now(),
        }
    }

    fn pause(&mut self, bytes: usize) {
        let target = self.last + Duration::from_nanos((bytes as f64 * self.nanos_per_byte) as u64);
        self.last = target;
        let mut now = Instant::now();
        if self.last < now {
            self.last = now;
        }
        while target > now {
            thread::sleep(target - now);
            now = Instant::now();
        }
    }
}

impl<W: Write> Write for NaiveWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.pause(n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes 8 KiB blocks, each followed by a zero-byte write and a flush, for `seconds`. Returns
/// the bytes written.
fn pattern(out: &mut impl Write, seconds: f64) -> Result<u64> {
    let block = [0xA5u8; BLOCK];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut bytes = 0u64;
    loop {
        for _ in 0..BLOCKS_PER_CHECK {
            out.write_all(&block)?;
            let _ = out.write(&[])?;
            out.flush()?;
            bytes += BLOCK as u64;
        }
        if Instant::now() >= end {
            return Ok(bytes);
        }
    }
}

/// The throughput of one run: bytes per wall-clock second, and bytes per second of the writing
/// thread's CPU time (user + system), which leaves out the time other processes had the CPU.
#[derive(Clone, Copy, Debug)]
struct Throughput {
    wall: f64,
    cpu: f64,
}

/// The calling thread's CPU time (user + system).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One run of `arm` into `sink` at `rate` bytes/s (0 = unlimited).
fn run_arm(arm: Arm, sink: Sink, rate: u64, seconds: f64, file: &Path) -> Result<Throughput> {
    fn timed<W: Write>(out: W, arm: Arm, rate: u64, seconds: f64) -> Result<Throughput> {
        let start = Instant::now();
        let cpu_start = thread_cpu_time();
        let bytes = match arm {
            Arm::Accumulating | Arm::Adapter => {
                let limiter =
                    Arc::new(RateLimiter::new(if arm == Arm::Adapter { 0 } else { rate }));
                let mut w = ThrottledWriter::new(out, limiter);
                let bytes = pattern(&mut w, seconds)?;
                w.finish()?;
                bytes
            }
            Arm::Naive => {
                let mut w = NaiveWriter::new(out, rate);
                let bytes = pattern(&mut w, seconds)?;
                w.flush()?;
                bytes
            }
            Arm::Bare => {
                let mut w = out;
                let bytes = pattern(&mut w, seconds)?;
                w.flush()?;
                bytes
            }
        };
        let wall = start.elapsed().as_secs_f64();
        let cpu = (thread_cpu_time() - cpu_start).as_secs_f64().max(1e-9);
        Ok(Throughput {
            wall: bytes as f64 / wall,
            cpu: bytes as f64 / cpu,
        })
    }
    match sink {
        Sink::Sink => timed(io::sink(), arm, rate, seconds),
        Sink::File => timed(WrappingFile::open(file)?, arm, rate, seconds),
    }
}

/// Exports a snapshot of `bytes` payload bytes at `rate` bytes/s (0 = unlimited), from creating
/// the temp file to the directory fsync; returns the seconds it took in all and the seconds
/// `finish` took (trailer, sync, rename, directory fsync, retention).
fn export(store: &SnapshotStore, name: &str, bytes: u64, rate: u64) -> Result<(f64, f64)> {
    let mut data = vec![0u8; 1 << 20];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let limiter = Arc::new(RateLimiter::new(rate));
    let start = Instant::now();
    let mut writer = store.create(name, b"bench", limiter)?;
    let mut left = bytes;
    while left > 0 {
        for piece in data.chunks(64 * 1024) {
            let n = (piece.len() as u64).min(left) as usize;
            writer.write_all(&piece[..n])?;
            left -= n as u64;
            if left == 0 {
                break;
            }
        }
    }
    let finishing = Instant::now();
    writer.finish()?;
    Ok((
        start.elapsed().as_secs_f64(),
        finishing.elapsed().as_secs_f64(),
    ))
}

fn within(ratio: f64) -> bool {
    (TARGET.0..=TARGET.1).contains(&ratio)
}

pub fn run(args: &[String]) -> Result<()> {
    let opts = Options::parse(args)?;
    let work = tempfile::tempdir_in(report::out_dir()?).context("create bench temp dir")?;
    let file = work.path().join("limiter.dat");
    WrappingFile::prepare(&file)?;
    let mut json: Vec<Value> = Vec::new();

    // Unthrottled: the bare writer against the adapter at the unlimited rate, interleaved.
    let overhead_seconds = (opts.seconds / 6.0).max(0.1);
    let mut overhead_rows = Vec::new();
    let mut overhead_file = 0.0;
    let mut overhead_sink_ns = 0.0;
    for sink in [Sink::File, Sink::Sink] {
        let (mut bare, mut adapter) = (Vec::new(), Vec::new());
        let (mut wall_ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
        for round in 0..opts.overhead_rounds {
            // A B, then B A: a drift in the machine's speed cancels out of the ratios.
            let (b, a) = if round % 2 == 0 {
                let b = run_arm(Arm::Bare, sink, 0, overhead_seconds, &file)?;
                (b, run_arm(Arm::Adapter, sink, 0, overhead_seconds, &file)?)
            } else {
                let a = run_arm(Arm::Adapter, sink, 0, overhead_seconds, &file)?;
                (run_arm(Arm::Bare, sink, 0, overhead_seconds, &file)?, a)
            };
            eprintln!(
                "  unthrottled {} pair {round}: wall bare {:.0} adapter {:.0} MB/s ratio {:.4}; \
                 cpu bare {:.0} adapter {:.0} MB/s ratio {:.4}",
                sink.name(),
                b.wall / MB,
                a.wall / MB,
                a.wall / b.wall,
                b.cpu / MB,
                a.cpu / MB,
                a.cpu / b.cpu
            );
            wall_ratios.push(a.wall / b.wall);
            cpu_ratios.push(a.cpu / b.cpu);
            bare.push(b);
            adapter.push(a);
        }
        let med = |v: &[Throughput], f: fn(&Throughput) -> f64| {
            median(&v.iter().map(f).collect::<Vec<_>>())
        };
        let (bw, aw) = (med(&bare, |t| t.wall), med(&adapter, |t| t.wall));
        let (bc, ac) = (med(&bare, |t| t.cpu), med(&adapter, |t| t.cpu));
        let (wall_ratio, cpu_ratio) = (median(&wall_ratios), median(&cpu_ratios));
        // CPU nanoseconds the adapter adds per block (8 KiB write + empty write + flush).
        let ns_per_block = (BLOCK as f64 / ac - BLOCK as f64 / bc) * 1e9;
        eprintln!(
            "unthrottled {}: wall ratio {wall_ratio:.4}, cpu ratio {cpu_ratio:.4}",
            sink.name()
        );
        if sink == Sink::File {
            overhead_file = cpu_ratio;
            json.push(json!({
                "arm": "overhead",
                "sink": sink.name(),
                "ratio": cpu_ratio,
                "wall_ratio": wall_ratio,
                "bare_mb_s": bw / MB,
                "adapter_mb_s": aw / MB,
                "bare_mb_per_cpu_s": bc / MB,
                "adapter_mb_per_cpu_s": ac / MB,
            }));
        } else {
            // Into the sink a block costs a few nanoseconds, so the ratio there measures the
            // loop, not the adapter; it is reported (as nanoseconds per block) but not the target.
            overhead_sink_ns = ns_per_block;
        }
        overhead_rows.push(vec![
            sink.name().to_string(),
            format!("{:.0}", bw / MB),
            format!("{:.0}", aw / MB),
            format!("{wall_ratio:.4}"),
            format!("{:.0}", bc / MB),
            format!("{:.0}", ac / MB),
            format!("{cpu_ratio:.4}"),
            format!("{ns_per_block:.1} ns"),
        ]);
    }

    // Paced runs: both arms, interleaved A B A B, into the sink and into the file.
    let mut rate_rows = Vec::new();
    let mut misses = Vec::new();
    for &rate_mb in &opts.rates {
        let rate = rate_mb * 1_000_000;
        for sink in [Sink::Sink, Sink::File] {
            let mut achieved = [Vec::new(), Vec::new()];
            let mut bare_file = Vec::new();
            for round in 0..opts.rounds {
                if sink == Sink::File {
                    // How fast the file takes the same pattern unthrottled, measured next to the
                    // paced runs (the machine's speed drifts), decides whether the target applies.
                    bare_file.push(run_arm(Arm::Bare, sink, 0, overhead_seconds, &file)?.wall);
                }
                // A B, then B A: neither arm always runs first (into the file, right after the
                // unthrottled run whose dirty pages may still be written back).
                let mut arms = [(0, Arm::Accumulating), (1, Arm::Naive)];
                if round % 2 == 1 {
                    arms.reverse();
                }
                for (i, arm) in arms {
                    let a = run_arm(arm, sink, rate, opts.seconds, &file)?.wall;
                    eprintln!(
                        "{rate_mb:>5} MB/s {:<4} {:<12} {:>9.3} MB/s ratio {:.4}",
                        sink.name(),
                        arm.name(),
                        a / MB,
                        a / rate as f64
                    );
                    achieved[i].push(a);
                }
            }
            let acc = median(&achieved[0]);
            let naive = median(&achieved[1]);
            let (acc_ratio, naive_ratio) = (acc / rate as f64, naive / rate as f64);
            let unthrottled = median(&bare_file);
            let applies = sink == Sink::Sink || unthrottled >= 2.0 * rate as f64;
            let verdict = if !applies {
                format!("n/a (file only {:.1}x the rate)", unthrottled / rate as f64)
            } else if within(acc_ratio) {
                "yes".to_string()
            } else {
                misses.push(format!("{rate_mb} MB/s {}", sink.name()));
                "NO".to_string()
            };
            rate_rows.push(vec![
                sink.name().to_string(),
                rate_mb.to_string(),
                format!("{:.3}", acc / MB),
                format!("{acc_ratio:.4}"),
                format!("{:.3}", naive / MB),
                format!("{naive_ratio:.4}"),
                if sink == Sink::File {
                    format!("{:.0}", unthrottled / MB)
                } else {
                    "-".to_string()
                },
                verdict,
            ]);
            for (arm, mb, ratio) in [
                (Arm::Accumulating, acc, acc_ratio),
                (Arm::Naive, naive, naive_ratio),
            ] {
                json.push(json!({
                    "arm": arm.name(),
                    "sink": sink.name(),
                    "requested_mb_s": rate_mb,
                    "achieved_mb_s": mb / MB,
                    "ratio": ratio,
                    "runs": opts.rounds,
                }));
            }
        }
    }

    // Snapshot export: unthrottled and paced, interleaved.
    let store = SnapshotStore::open(work.path().join("snapshots"), 2)?;
    let export_bytes = opts.export_mib << 20;
    let export_rate = opts.export_rate * 1_000_000;
    let (mut free, mut paced, mut free_fin, mut paced_fin) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..opts.rounds {
        // Unthrottled then paced, then the other way round.
        let ((f, ff), (p, pf)) = if round % 2 == 0 {
            let free = export(&store, &format!("{round:04}-a"), export_bytes, 0)?;
            (
                free,
                export(&store, &format!("{round:04}-b"), export_bytes, export_rate)?,
            )
        } else {
            let paced = export(&store, &format!("{round:04}-a"), export_bytes, export_rate)?;
            (
                export(&store, &format!("{round:04}-b"), export_bytes, 0)?,
                paced,
            )
        };
        eprintln!(
            "export: unthrottled {f:.3} s (finish {ff:.3} s), {} MB/s {p:.3} s (finish {pf:.3} s)",
            opts.export_rate
        );
        free.push(f);
        paced.push(p);
        free_fin.push(ff);
        paced_fin.push(pf);
    }
    let (free_s, paced_s) = (median(&free), median(&paced));
    let (free_fin_s, paced_fin_s) = (median(&free_fin), median(&paced_fin));
    // The yardstick, max(unthrottled, 4.0 s) for 256 MiB at 64 MB/s, for any size and
    // rate: MiB over MB/s (the bytes alone take about 5% longer, as they are MiB).
    let nominal = opts.export_mib as f64 / opts.export_rate as f64;
    let ideal = free_s.max(nominal);
    let floor = export_bytes as f64 / export_rate as f64;
    json.push(json!({
        "arm": "export",
        "seconds": paced_s,
        "ideal_seconds": ideal,
        "unthrottled_seconds": free_s,
        "pacing_floor_seconds": floor,
        "finish_seconds": paced_fin_s,
        "requested_mb_s": opts.export_rate,
        "payload_bytes": export_bytes,
    }));

    println!(
        "\n### Paced writes: 8 KiB write + zero-byte write + flush, {} s per run, median of {} runs per arm (interleaved)\n",
        opts.seconds, opts.rounds
    );
    report::print_table(
        &[
            "sink",
            "requested MB/s",
            "accumulating MB/s",
            "accumulating ratio",
            "naive MB/s",
            "naive ratio",
            "unthrottled MB/s",
            "accumulating within [0.97, 1.01]",
        ],
        &rate_rows,
    );
    println!(
        "\n### Unthrottled: adapter at the unlimited rate vs the bare writer, median of {} interleaved pairs of {overhead_seconds:.2} s\n",
        opts.overhead_rounds
    );
    report::print_table(
        &[
            "sink",
            "bare MB/s (wall)",
            "adapter MB/s (wall)",
            "wall ratio",
            "bare MB per CPU-s",
            "adapter MB per CPU-s",
            "CPU ratio",
            "adapter CPU per block",
        ],
        &overhead_rows,
    );
    println!(
        "\n### Snapshot export: {} MiB, median of {} runs each (interleaved)\n",
        opts.export_mib, opts.rounds
    );
    report::print_table(
        &[
            "arm",
            "seconds",
            "of which finish",
            "vs ideal",
            "vs bytes/rate",
        ],
        &[
            vec![
                "unthrottled".to_string(),
                format!("{free_s:.3}"),
                format!("{free_fin_s:.3}"),
                String::new(),
                String::new(),
            ],
            vec![
                format!("{} MB/s", opts.export_rate),
                format!("{paced_s:.3}"),
                format!("{paced_fin_s:.3}"),
                format!("{:.4}", paced_s / ideal),
                format!("{:.4}", paced_s / floor),
            ],
        ],
    );
    println!(
        "\nideal = max(unthrottled {free_s:.3} s, {} MiB / {} MB/s = {nominal:.3} s) = {ideal:.3} s; \
         the bytes alone take {floor:.3} s at {} MB/s ({:.4} of the ideal)",
        opts.export_mib,
        opts.export_rate,
        opts.export_rate,
        floor / ideal
    );
    // A throttled job takes max(unthrottled, bytes / rate) plus a few percent, never much more
    // (judged on the bytes: the nominal yardstick counts MiB as MB).
    let export_ratio = paced_s / free_s.max(floor);
    if export_ratio > EXPORT_SLACK {
        misses.push(format!(
            "export {export_ratio:.4} of max(unthrottled, bytes / rate) (target <= {EXPORT_SLACK})"
        ));
    }
    if overhead_file < 0.98 {
        misses.push(format!(
            "file overhead ratio {overhead_file:.4} (target >= 0.98)"
        ));
    }
    println!(
        "file overhead ratio (CPU time) {overhead_file:.4} (target >= 0.98); export {export_ratio:.4} of \
         max(unthrottled, bytes / rate) (target <= {EXPORT_SLACK}); into the sink the adapter adds \
         {overhead_sink_ns:.1} ns per block; misses: {}",
        if misses.is_empty() {
            "none".to_string()
        } else {
            misses.join(", ")
        }
    );
    let path = report::write_json("limiter.json", &Value::Array(json))?;
    println!("wrote {}", path.display());
    Ok(())
}
