//! The `metaserver` binary: a node of the replicated shard registry, a local cluster of
//! them, and operator commands. Only this crate knows the CLI, config files, signals and
//! logging setup.

mod cli;
mod local_cluster;
mod logging;
mod open_files;
mod operator;
mod restore;
mod server;
mod settings;
mod shutdown;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crate::cli::{Cli, Command, ServeArgs, SnapshotCommand};
use crate::settings::ServeSettings;

/// mimalloc instead of the system allocator: allocation was about 8% of the servers' CPU under
/// load (glibc's malloc, free and consolidation), and interleaved runs gained 7% registrations/s
/// at 16 clients and 9% at 64 (ARCHITECTURE.md, Dependencies).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Serve(args) => server::serve(ServeSettings::resolve(&args, false)?).await,
        Command::LocalCluster(args) => local_cluster::run(args).await,
        Command::Status(args) => operator::status(args).await,
        Command::Shards(args) => operator::shards(args).await,
        Command::Register(args) => operator::register(args).await,
        Command::Snapshot(SnapshotCommand::Save { client, file }) => {
            operator::snapshot_save(client, &file).await
        }
        Command::Snapshot(SnapshotCommand::Restore { client, file }) => {
            restore::restore(client, &file).await
        }
    }
}

/// The async runtime, with `worker_threads` workers (`None`: one per core).
fn runtime(worker_threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    builder
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Resolves a node's settings (before the runtime exists: they size it), then serves.
fn serve_on_runtime(args: &ServeArgs, default_mode: bool) -> Result<()> {
    let settings = ServeSettings::resolve(args, default_mode)?;
    runtime(settings.worker_threads)?.block_on(server::serve(settings))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    let result = match cli.command {
        None => serve_on_runtime(&cli.serve, true),
        Some(Command::Serve(args)) => serve_on_runtime(&args, false),
        Some(command) => runtime(None).and_then(|rt| rt.block_on(run(command))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("metaserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}
