//! The `metaserver` binary: a node of the replicated shard registry, a local cluster of
//! them, and operator commands. Only this crate knows the CLI, config files, signals and
//! logging setup.

mod cli;
mod local_cluster;
mod logging;
mod operator;
mod server;
mod settings;
mod shutdown;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command, SnapshotCommand};
use crate::settings::ServeSettings;

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => server::serve(ServeSettings::resolve(&cli.serve, true)?).await,
        Some(Command::Serve(args)) => server::serve(ServeSettings::resolve(&args, false)?).await,
        Some(Command::LocalCluster(args)) => local_cluster::run(args).await,
        Some(Command::Status(args)) => operator::status(args).await,
        Some(Command::Shards(args)) => operator::shards(args).await,
        Some(Command::Register(args)) => operator::register(args).await,
        Some(Command::Snapshot(SnapshotCommand::Save { client, file })) => {
            operator::snapshot_save(client, &file).await
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("metaserver: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("metaserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}
