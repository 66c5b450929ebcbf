//! Shared helpers for benchmark output: percentiles, markdown tables and JSON files under `target/bench/`.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// Returns the `q` quantile (0.0..=1.0) of `samples`, sorting them in place. Zero for no samples.
pub fn percentile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let idx = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[idx.min(samples.len() - 1)]
}

/// Returns the median of `values` (sorting a copy): the middle value, or the mean of the two middle
/// values for an even count. Zero for no values.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// Prints a markdown table with the given header and rows.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", header.join(" | "));
    println!("|{}", header.iter().map(|_| "---|").collect::<String>());
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
}

/// The directory benchmark outputs go to: `target/bench/` of the workspace.
pub fn out_dir() -> Result<PathBuf> {
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// Writes `value` as pretty JSON to `target/bench/<name>` and returns the path.
pub fn write_json(name: &str, value: &serde_json::Value) -> Result<PathBuf> {
    let path = out_dir()?.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// The cargo target directory (`CARGO_TARGET_DIR`, else the workspace's `target`), not created.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}
