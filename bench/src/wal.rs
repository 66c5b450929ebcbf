//! The `wal` benchmark: writers appending 200-byte records and waiting for durability, with
//! shared barriers (`shared`) against one barrier per append (`own`), plus the raw rate of a
//! 200-byte write + fdatasync loop, and preallocation on against off.
//!
//! The disk is shared with other work and its fsync latency swings widely over seconds, so the
//! arms of one point are interleaved in short slices (A B A B ..., each arm keeping its own open
//! log) until every arm has run `--seconds`. A rate is the median of the arm's per-slice rates;
//! for arms of the same point the median of the paired per-slice ratios is given too.
//!
//! `meta-bench wal [--seconds S] [--slice S] [--writers 1,4,16,64] [--dir DIR]` (`--help` explains
//! them); the seconds can also come from `WAL_BENCH_SECONDS`. Writes `target/bench/wal.json` and
//! `target/bench/wal_prealloc.json`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use meta_store::{BarrierMode, Wal, WalOptions};
use serde_json::json;
use tempfile::TempDir;

use crate::{cli, report};

const RECORD_BYTES: usize = 200;

/// `meta-bench wal`: shared barriers against one barrier per append, interleaved.
#[derive(Debug, clap::Parser)]
#[command(name = "meta-bench wal")]
struct Config {
    /// Seconds each arm of a point is measured, in all.
    #[arg(long, env = "WAL_BENCH_SECONDS", default_value_t = 5.0)]
    seconds: f64,
    /// Seconds of one slice; the arms of a point take turns slice by slice.
    #[arg(long, default_value_t = 0.5)]
    slice: f64,
    /// Concurrent writers of each point, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    writers: Vec<usize>,
    /// Directory for the logs under test (the JSON goes to target/bench either way).
    #[arg(long, default_value_os_t = report::target_dir().join("bench"))]
    dir: PathBuf,
}

fn parse(args: &[String]) -> Result<Config> {
    let mut cfg: Config = cli::parse("wal", args)?;
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(cfg.seconds)
        || !positive(cfg.slice)
        || cfg.writers.is_empty()
        || cfg.writers.contains(&0)
    {
        bail!("--seconds, --slice and every writer count must be positive");
    }
    cfg.slice = cfg.slice.min(cfg.seconds);
    Ok(cfg)
}

/// What one slice of one arm measured.
struct Slice {
    appends: u64,
    barriers: u64,
    seconds: f64,
    latencies_ms: Vec<f64>,
}

/// One arm of a comparison, kept open across its slices.
enum Arm {
    Wal {
        wal: Arc<Wal>,
        _dir: TempDir,
    },
    Raw {
        file: File,
        offset: u64,
        _dir: TempDir,
    },
}

impl Arm {
    fn wal(base: &Path, mode: BarrierMode, preallocate: bool) -> Result<Arm> {
        let dir = tempfile::tempdir_in(base).context("temp dir for the log")?;
        let opts = WalOptions {
            barrier: mode,
            preallocate,
            ..WalOptions::default()
        };
        let wal = Arc::new(Wal::open(dir.path(), opts)?);
        Ok(Arm::Wal { wal, _dir: dir })
    }

    fn raw(base: &Path, preallocate: bool) -> Result<Arm> {
        let dir = tempfile::tempdir_in(base)?;
        let path = dir.path().join("raw");
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)?;
        if preallocate {
            use std::os::fd::AsRawFd;
            // SAFETY: the descriptor is owned by `file` and open for the duration of the call.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 256 << 20) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error()).context("fallocate");
            }
            file.sync_all()?;
        }
        Ok(Arm::Raw {
            file,
            offset: 0,
            _dir: dir,
        })
    }

    /// Runs `writers` threads (append + sync each) for `seconds`, or the raw loop.
    fn slice(&mut self, writers: usize, seconds: f64) -> Result<Slice> {
        match self {
            Arm::Wal { wal, .. } => wal_slice(wal, writers, seconds),
            Arm::Raw { file, offset, .. } => {
                let payload = [7u8; RECORD_BYTES];
                let mut latencies_ms = Vec::new();
                let t0 = Instant::now();
                while t0.elapsed().as_secs_f64() < seconds {
                    let t = Instant::now();
                    file.write_all_at(&payload, *offset)?;
                    file.sync_data()?;
                    latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
                    *offset += RECORD_BYTES as u64;
                }
                let n = latencies_ms.len() as u64;
                Ok(Slice {
                    appends: n,
                    barriers: n,
                    seconds: t0.elapsed().as_secs_f64(),
                    latencies_ms,
                })
            }
        }
    }
}

fn wal_slice(wal: &Arc<Wal>, writers: usize, seconds: f64) -> Result<Slice> {
    let stop = Arc::new(AtomicBool::new(false));
    let m0 = wal.metrics();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|i| {
            let (wal, stop) = (wal.clone(), stop.clone());
            thread::spawn(move || -> Result<Vec<f64>> {
                let payload = vec![i as u8; RECORD_BYTES];
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let lsn = wal.append(&payload)?;
                    wal.sync(lsn)?;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                Ok(lat)
            })
        })
        .collect();
    thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies_ms = Vec::new();
    for t in threads {
        latencies_ms.extend(t.join().map_err(|_| anyhow!("writer panicked"))??);
    }
    // Every started append finished: counting them all over the time until the last one did.
    let elapsed = t0.elapsed().as_secs_f64();
    let m1 = wal.metrics();
    Ok(Slice {
        appends: m1.appends - m0.appends,
        barriers: m1.barriers - m0.barriers,
        seconds: elapsed,
        latencies_ms,
    })
}

/// Accumulated results of one arm at one point.
#[derive(Default)]
struct Totals {
    appends: u64,
    barriers: u64,
    seconds: f64,
    latencies_ms: Vec<f64>,
    slice_rates: Vec<f64>,
}

impl Totals {
    fn add(&mut self, s: Slice) {
        self.slice_rates.push(s.appends as f64 / s.seconds);
        self.appends += s.appends;
        self.barriers += s.barriers;
        self.seconds += s.seconds;
        self.latencies_ms.extend(s.latencies_ms);
    }

    /// Appends per second: the median over the slices, which is robust to the disk's slow spells.
    fn rate(&self) -> f64 {
        report::median(&self.slice_rates)
    }

    fn per_barrier(&self) -> f64 {
        self.appends as f64 / self.barriers.max(1) as f64
    }
}

/// Runs the arms (each with its own writer count) interleaved in slices until each ran `seconds`.
fn compare(cfg: &Config, label: &str, arms: &mut [(Arm, usize)]) -> Result<Vec<Totals>> {
    // Warm up each arm once (unmeasured): first segment, page cache, threads.
    for (arm, writers) in arms.iter_mut() {
        arm.slice(*writers, (cfg.slice / 4.0).min(0.2))?;
    }
    let mut totals: Vec<Totals> = arms.iter().map(|_| Totals::default()).collect();
    let mut pass = 0;
    while totals.iter().any(|t| t.seconds < cfg.seconds) {
        // A B C, then C B A: no arm always runs first, or always right after the same one.
        let mut order: Vec<usize> = (0..arms.len()).collect();
        if pass % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (arm, writers) = &mut arms[i];
            totals[i].add(arm.slice(*writers, cfg.slice)?);
        }
        pass += 1;
    }
    let rates: Vec<String> = totals.iter().map(|t| format!("{:.0}", t.rate())).collect();
    eprintln!("  {label}: {}", rates.join(" / "));
    Ok(totals)
}

/// Median of the per-slice ratios a/b (slices paired in the order they ran).
fn paired_ratio(a: &Totals, b: &Totals) -> f64 {
    let ratios: Vec<f64> = a
        .slice_rates
        .iter()
        .zip(&b.slice_rates)
        .map(|(x, y)| x / y.max(1e-9))
        .collect();
    report::median(&ratios)
}

pub fn run(args: &[String]) -> Result<()> {
    let cfg = parse(args)?;
    std::fs::create_dir_all(&cfg.dir).with_context(|| format!("create {}", cfg.dir.display()))?;
    println!(
        "wal bench: {RECORD_BYTES} B records, {} s per arm and point in {} s slices (arms interleaved), dir {}",
        cfg.seconds,
        cfg.slice,
        cfg.dir.display()
    );

    // Main comparison: shared against own at each writer count; at one writer the raw loop too.
    let mut table = Vec::new();
    let mut raw = None;
    for &writers in &cfg.writers {
        let mut arms = vec![
            (Arm::wal(&cfg.dir, BarrierMode::Shared, true)?, writers),
            (Arm::wal(&cfg.dir, BarrierMode::Own, true)?, writers),
        ];
        if writers == 1 || (raw.is_none() && writers == *cfg.writers.last().unwrap()) {
            // Preallocated, as the log's segments are: otherwise every raw fdatasync also
            // writes a size update the log does not, and the log looks better against it.
            arms.push((Arm::raw(&cfg.dir, true)?, 1));
        }
        let mut totals = compare(
            &cfg,
            &format!("{writers} writers shared/own[/raw]"),
            &mut arms,
        )?;
        if totals.len() == 3 {
            let raw_totals = totals.pop().unwrap();
            let shared_vs_raw = paired_ratio(&totals[0], &raw_totals);
            raw = Some((raw_totals, writers, shared_vs_raw));
        }
        table.push((writers, totals));
    }
    let (raw, raw_writers, shared_vs_raw_paired) = raw.expect("raw measured");

    let mut rows = Vec::new();
    let mut out = Vec::new();
    for (writers, totals) in table.iter_mut() {
        for (name, t) in ["shared", "own"].iter().zip(totals.iter_mut()) {
            let p50 = report::percentile(&mut t.latencies_ms, 0.5);
            let p99 = report::percentile(&mut t.latencies_ms, 0.99);
            rows.push(vec![
                writers.to_string(),
                name.to_string(),
                format!("{:.0}", t.rate()),
                format!("{:.2}", t.per_barrier()),
                format!("{p50:.3}"),
                format!("{p99:.3}"),
            ]);
            out.push(json!({
                "writers": *writers,
                "arm": name,
                "appends_per_sec": t.rate(),
                "appends_per_barrier": t.per_barrier(),
                "p50_ms": p50,
                "p99_ms": p99,
            }));
        }
    }
    out.push(json!({"arm": "raw_fdatasync", "appends_per_sec": raw.rate()}));
    println!();
    report::print_table(
        &[
            "writers",
            "arm",
            "appends/s",
            "appends per barrier",
            "p50 ms",
            "p99 ms",
        ],
        &rows,
    );
    println!();
    println!(
        "raw 200-byte write + fdatasync loop, preallocated (interleaved with the {raw_writers}-writer point): {:.0}/s",
        raw.rate()
    );

    // Scaling: the shared arm at 1 writer against 16 and 64, interleaved in one comparison
    // (points measured apart would compare the disk's moods as much as the writer counts).
    let scale_writers: Vec<usize> = [1, 16, 64]
        .into_iter()
        .filter(|w| *w == 1 || cfg.writers.contains(w))
        .collect();
    let scaling = if scale_writers.len() > 1 {
        let mut arms = Vec::new();
        for &w in &scale_writers {
            arms.push((Arm::wal(&cfg.dir, BarrierMode::Shared, true)?, w));
        }
        let t = compare(&cfg, "shared at 1/16/64 writers", &mut arms)?;
        scale_writers.iter().copied().zip(t).collect::<Vec<_>>()
    } else {
        Vec::new()
    };

    let point = |writers: usize| table.iter().find(|(w, _)| *w == writers).map(|(_, t)| t);
    let mut checks = Vec::new();
    let mut check = |what: &str, ratio: f64, paired: Option<f64>, target: f64| {
        let verdict = if ratio >= target { "ok" } else { "MISSED" };
        checks.push(vec![
            what.to_string(),
            format!("{ratio:.2}"),
            paired.map_or("-".into(), |p| format!("{p:.2}")),
            format!(">= {target}"),
            verdict.into(),
        ]);
    };
    if let Some((_, one)) = scaling.first() {
        for (w, target) in [(16, 8.0), (64, 20.0)] {
            if let Some((_, p)) = scaling.iter().find(|(writers, _)| *writers == w) {
                check(
                    &format!("shared@{w} / shared@1"),
                    p.rate() / one.rate(),
                    Some(paired_ratio(p, one)),
                    target,
                );
            }
        }
    }
    if let Some(one) = point(1) {
        let s1 = one[0].rate();
        let paired = paired_ratio(&one[0], &one[1]);
        check("shared@1 / own@1", s1 / one[1].rate(), Some(paired), 0.95);
        if raw_writers == 1 {
            check(
                "shared@1 / raw",
                s1 / raw.rate(),
                Some(shared_vs_raw_paired),
                0.8,
            );
        }
    }
    println!();
    report::print_table(
        &["ratio", "value", "median of paired slices", "target", ""],
        &checks,
    );

    // Preallocation on (A) against off (B), interleaved, and the raw loop with and without.
    let mut prows = Vec::new();
    let mut pout = Vec::new();
    for writers in [1usize, 16] {
        let mut arms = vec![
            (Arm::wal(&cfg.dir, BarrierMode::Shared, true)?, writers),
            (Arm::wal(&cfg.dir, BarrierMode::Shared, false)?, writers),
        ];
        let t = compare(
            &cfg,
            &format!("{writers} writers prealloc on/off"),
            &mut arms,
        )?;
        let (on, off) = (t[0].rate(), t[1].rate());
        let paired = paired_ratio(&t[0], &t[1]);
        prows.push(vec![
            format!("shared, {writers} writers"),
            format!("{on:.0}"),
            format!("{off:.0}"),
            format!("{:.2}", on / off),
            format!("{paired:.2}"),
        ]);
        pout.push(
            json!({"arm": "shared", "writers": writers, "prealloc_appends_per_sec": on,
            "no_prealloc_appends_per_sec": off, "ratio": on / off, "paired_ratio": paired}),
        );
    }
    let mut arms = vec![
        (Arm::raw(&cfg.dir, true)?, 1),
        (Arm::raw(&cfg.dir, false)?, 1),
    ];
    let t = compare(&cfg, "raw loop prealloc on/off", &mut arms)?;
    let (on, off) = (t[0].rate(), t[1].rate());
    let paired = paired_ratio(&t[0], &t[1]);
    prows.push(vec![
        "raw write + fdatasync".into(),
        format!("{on:.0}"),
        format!("{off:.0}"),
        format!("{:.2}", on / off),
        format!("{paired:.2}"),
    ]);
    pout.push(
        json!({"arm": "raw_fdatasync", "writers": 1, "prealloc_appends_per_sec": on,
        "no_prealloc_appends_per_sec": off, "ratio": on / off, "paired_ratio": paired}),
    );
    println!();
    println!("preallocation (fallocate) on against off, interleaved:");
    report::print_table(
        &[
            "arm",
            "on /s",
            "off /s",
            "on / off",
            "median of paired slices",
        ],
        &prows,
    );

    let path = report::write_json("wal.json", &serde_json::Value::Array(out))?;
    let ppath = report::write_json("wal_prealloc.json", &serde_json::Value::Array(pout))?;
    println!();
    println!("wrote {} and {}", path.display(), ppath.display());
    Ok(())
}
