//! The single-shard workload once more, on servers whose every fdatasync takes longer
//! (`--emulated-sync-latency-us`), as on a disk without a write cache: what sharing barriers
//! is for. On a disk whose fdatasync costs little, `shared` and `own` differ little, whatever
//! the design; this pass shows the gap where a sync costs what the reference measured.
//! It is reported apart from the targets, which are judged on the machine's own disk.

use super::options::Arm;
use super::single::SinglePoint;
use crate::report::median;

/// The median registrations per second of `arm` over `points`, if it ran.
fn median_rate(points: &[SinglePoint], arm: Arm) -> Option<f64> {
    let rates: Vec<f64> = points
        .iter()
        .filter(|p| p.arm == arm)
        .map(|p| p.per_sec)
        .collect();
    (!rates.is_empty()).then(|| median(&rates))
}

/// `shared` over `own`, medians over rounds, when both arms ran.
pub fn ratio(points: &[SinglePoint]) -> Option<f64> {
    Some(median_rate(points, Arm::Shared)? / median_rate(points, Arm::Own)?)
}

/// Prints every run and the ratio of the medians.
pub fn print(points: &[SinglePoint], extra_us: u64) {
    println!(
        "\n### Single-shard writes with every fdatasync {extra_us} µs longer (emulated; not \
         the issue's targets), every run\n"
    );
    super::results::print_single_runs(points);
    let medians = (
        ratio(points),
        median_rate(points, Arm::Shared),
        median_rate(points, Arm::Own),
    );
    if let (Some(r), Some(s), Some(o)) = medians {
        println!(
            "\nshared/own registrations/s ratio, medians over rounds: {r:.2} ({s:.0} / {o:.0})"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::single::Route;

    fn point(arm: Arm, round: usize, per_sec: f64) -> SinglePoint {
        SinglePoint {
            arm,
            round,
            clients: 16,
            route: Route::Spread,
            per_sec,
            p50_ms: 1.0,
            p99_ms: 2.0,
            errors: 0,
            records_per_barrier: Some(4.0),
            cores: Default::default(),
        }
    }

    #[test]
    fn the_ratio_is_of_the_medians_of_each_arm() {
        let points = [
            point(Arm::Shared, 0, 3000.0),
            point(Arm::Own, 0, 1000.0),
            point(Arm::Own, 1, 500.0),
            point(Arm::Shared, 1, 1000.0),
            point(Arm::Shared, 2, 2000.0),
            point(Arm::Own, 2, 400.0),
        ];
        let r = ratio(&points).unwrap();
        assert!((r - 4.0).abs() < 1e-9, "{r}");
        assert_eq!(ratio(&points[..1]), None);
    }
}
