//! openraft's own storage test suite against our log store (over the write-ahead log) and
//! state machine (sled registry).

use std::io;

use meta_consensus::{LogStore, StateMachine, TypeConfig};
use meta_store::{RateLimiter, WalOptions};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb, StorageError};
use tempfile::TempDir;

struct Builder;

fn sto_err(e: impl std::fmt::Display) -> StorageError<TypeConfig> {
    StorageError::from_io_error(
        ErrorSubject::Store,
        ErrorVerb::Write,
        io::Error::other(e.to_string()),
    )
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().map_err(sto_err)?;
        let log =
            LogStore::open(&dir.path().join("wal"), WalOptions::default()).map_err(sto_err)?;
        let sm = StateMachine::open(
            None,
            &dir.path().join("registry"),
            &dir.path().join("snapshots"),
            8 << 20,
            2,
            std::sync::Arc::new(RateLimiter::unlimited()),
        )
        .map_err(sto_err)?;
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() {
    Suite::test_all(Builder)
        .await
        .expect("openraft storage suite");
}
