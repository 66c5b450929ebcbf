//! Seeded randomness: every test prints its seed, and `META_TEST_SEED` replays a run with it.

use crate::note::note;

/// The environment variable that replays a run with a given seed.
pub const SEED_ENV: &str = "META_TEST_SEED";

/// Returns the seed for `test` (from `META_TEST_SEED` when set, random otherwise) and prints it.
///
/// # Panics
/// When `META_TEST_SEED` is set but is not an unsigned integer.
pub fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var(SEED_ENV) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not an unsigned integer")),
        Err(_) => fastrand::u64(..),
    };
    note(format!(
        "[{test}] seed {seed} (replay with {SEED_ENV}={seed})"
    ));
    seed
}

/// A generator for one part of a test (a task, a step), derived from the test's seed and a label,
/// so that the parts draw independent but replayable numbers.
pub fn derived_rng(seed: u64, label: u64) -> fastrand::Rng {
    // SplitMix64 finalizer: spreads nearby labels over the whole seed space.
    let mut z = seed ^ label.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    fastrand::Rng::with_seed(z ^ (z >> 31))
}
