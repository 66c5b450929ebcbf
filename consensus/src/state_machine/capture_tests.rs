//! A snapshot holds the registry as of its capture, whatever is applied while it is exported:
//! random commands, a capture part way, more commands applied while the export runs on another
//! thread; the snapshot, installed elsewhere, holds what a state machine that applied only the
//! commands before the capture holds. Seeded: a failure names its seed.

use openraft::storage::RaftSnapshotBuilder;

use super::batching_tests::random_entries;
use super::tests::{installed, open};
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_holds_the_registry_as_of_its_capture() {
    for seed in 0..30u64 {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xcafe);
        let entries = random_entries(&mut rng, 80 + (seed as usize % 4) * 40);
        let split = rng.usize(1..entries.len());
        let (before, after) = entries.split_at(split);

        let dir = tempfile::tempdir().unwrap();
        let mut sm = open(dir.path());
        let shared = sm.shared();
        for chunk in before.chunks(rng.usize(1..6)) {
            shared.apply_entries(chunk, Mode::Deferred).unwrap();
        }
        // Captured here; the commands after it are applied before the export starts (even
        // seeds: every change the capture must undo is made first) or while it runs.
        let mut builder = sm.get_snapshot_builder().await;
        let apply_after = {
            let shared = sm.shared();
            let after = after.to_vec();
            let heavy = rng.bool();
            move || {
                for chunk in after.chunks(3) {
                    let mode = if heavy { Mode::Heavy } else { Mode::Deferred };
                    shared.apply_entries(chunk, mode).unwrap();
                    shared.commit_deferred().unwrap();
                }
            }
        };
        let snapshot = if seed % 2 == 0 {
            tokio::task::spawn_blocking(apply_after).await.unwrap();
            builder.build_snapshot().await.unwrap()
        } else {
            let export = tokio::spawn(async move { builder.build_snapshot().await });
            tokio::task::spawn_blocking(apply_after).await.unwrap();
            export.await.unwrap().unwrap()
        };
        assert_eq!(
            snapshot.meta.last_log_id.map(|l| l.index),
            Some(split as u64),
            "seed {seed}: the snapshot's last entry"
        );

        let (_installed_dir, installed) = installed(snapshot).await;
        let reference_dir = tempfile::tempdir().unwrap();
        let reference = open(reference_dir.path());
        reference
            .shared()
            .apply_entries(before, Mode::Deferred)
            .unwrap();
        reference.shared().commit_deferred().unwrap();
        assert!(
            installed.shared().registry.content().unwrap()
                == reference.shared().registry.content().unwrap(),
            "seed {seed}: the snapshot (captured after entry {split}) holds another registry"
        );
        assert_eq!(
            (
                installed.shared().replicas(),
                installed.shared().datanodes()
            ),
            (
                reference.shared().replicas(),
                reference.shared().datanodes()
            ),
            "seed {seed}: the snapshot counts otherwise"
        );
    }
}
