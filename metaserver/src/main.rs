//! The `metaserver` binary: a node of the replicated shard registry, a local cluster of
//! them, and operator commands. Only this crate knows the CLI, config files, signals and
//! logging setup.

mod boolish;
mod cli;
mod local_cluster;
mod logging;
mod open_files;
mod operator;
mod output;
mod relocation;
mod restore;
mod scratch;
mod server;
mod settings;
mod shutdown;
mod tls_files;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches};

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
        Command::Health(args) => operator::health(args).await,
        Command::Liveness(args) => operator::liveness(args).await,
        Command::Shards(args) => operator::shards(args).await,
        Command::Register(args) => operator::register(args).await,
        Command::Watch(args) => operator::watch(args).await,
        Command::Snapshot(SnapshotCommand::Save {
            client,
            file,
            local,
            partial,
        }) => {
            let save = operator::snapshot_save(client, &file, local, partial);
            interruptible(save, || None).await
        }
        Command::Snapshot(SnapshotCommand::Restore {
            client,
            file,
            partial,
        }) => {
            let sending = Arc::new(AtomicBool::new(false));
            let left = || sending.load(Ordering::SeqCst).then_some(restore::PART_WAY);
            let restore = restore::restore(client, &file, partial, sending.clone());
            interruptible(restore, left).await
        }
        Command::Snapshot(SnapshotCommand::EndRestore { client }) => {
            restore::end_restore_command(client).await
        }
        Command::Member(command) => operator::member(command).await,
    }
}

/// Runs a command that keeps temp files while it runs (a backup's download, the scratch
/// registry that checks or reads it) so that SIGINT, SIGTERM or SIGHUP stops it with them removed: the
/// command is dropped, which removes what it made, and the process exits at once (status 130
/// after SIGINT, 143 after SIGTERM, 129 after SIGHUP), without waiting for a check still running on a blocking
/// thread. `left` says what the operator must do about what the command changed before it was
/// stopped, if anything.
async fn interruptible(
    command: impl std::future::Future<Output = Result<()>>,
    left: impl Fn() -> Option<&'static str>,
) -> Result<()> {
    let mut signals = shutdown::Signals::install()?;
    let mut command = Box::pin(command);
    let signal = tokio::select! {
        result = &mut command => return result,
        signal = signals.recv() => signal,
    };
    drop(command);
    match left() {
        Some(left) => {
            eprintln!("metaserver: stopped by {signal}; its temp files were removed; {left}")
        }
        None => eprintln!("metaserver: stopped by {signal}; its temp files were removed"),
    }
    std::process::exit(shutdown::exit_status(signal))
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

/// The command line, parsed, and the secrets it gave itself (`--token`, `--member-token` of
/// a node), which anyone on the machine can read there (`ps`).
fn parse_cli() -> (Cli, Vec<&'static str>) {
    let args: Vec<OsString> = std::env::args_os().collect();
    let command = cli_command(&args);
    let matches = command
        .clone()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| {
            // clap names the flag; an operator who set the variable never typed it.
            if let Some(var) = from_environment(&command, &args, &e) {
                let _ = e.print();
                eprintln!("note: the value came from the environment variable {var}");
                std::process::exit(e.exit_code());
            }
            e.exit()
        });
    let node = match matches.subcommand() {
        Some(("serve", serve)) => Some(serve),
        Some(_) => None,
        None => Some(&matches),
    };
    let exposed = node.map_or_else(Vec::new, |m| {
        [("token", "--token"), ("member_token", "--member-token")]
            .into_iter()
            .filter(|(id, _)| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
            .map(|(_, flag)| flag)
            .collect()
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    (cli, exposed)
}

/// The environment variable that gave the value `e` refuses, when the command line `args` did
/// not give that option.
fn from_environment(command: &clap::Command, args: &[OsString], e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // "--id <ID>": the option's long name.
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let flag = format!("--{long}");
    let typed = args
        .iter()
        .filter_map(|a| a.to_str())
        .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    if typed {
        return None;
    }
    all_arguments(command.clone())
        .into_iter()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
}

/// The arguments of `command` and of all its subcommands, at any depth.
fn all_arguments(command: clap::Command) -> Vec<clap::Arg> {
    let mut arguments = Vec::new();
    let mut commands = vec![command];
    while let Some(c) = commands.pop() {
        arguments.extend(c.get_arguments().cloned());
        commands.extend(c.get_subcommands().cloned());
    }
    arguments
}

/// The command line's definition for `args`. The command-less node's options sit at the top
/// level and read `METASERVER_*` variables; with a command other than `serve` they are unused,
/// and do not read them: a bad serve setting in the environment must not break `status`.
fn cli_command(args: &[OsString]) -> clap::Command {
    let command = Cli::command();
    let other = args
        .get(1)
        .and_then(|a| command.find_subcommand(a))
        .is_some_and(|c| c.get_name() != "serve");
    match other {
        true => command.mut_args(|a| a.env(None)),
        false => command,
    }
}

fn main() -> ExitCode {
    let (cli, exposed) = parse_cli();
    logging::init();
    for flag in exposed {
        tracing::warn!(
            "{flag} was given on the command line, where anyone on this machine can read it \
             (ps): give it in the environment or the config file"
        );
    }
    for name in unknown_variables(std::env::vars_os().map(|(k, _)| k)) {
        tracing::warn!("{name} is not a setting of metaserver (a typo?): it is ignored");
    }
    let serving = matches!(cli.command, None | Some(Command::Serve(_)));
    let result = match cli.command {
        None => serve_on_runtime(&cli.serve, true),
        Some(Command::Serve(args)) => serve_on_runtime(&args, false),
        Some(command) => runtime(None).and_then(|rt| rt.block_on(run(command))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of its output went away (`| head`): nothing more to say to anyone.
        Err(e) if !serving && output::reader_gone(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // A server reports through its log; a command says it once, plainly.
            if serving {
                tracing::error!("{}", describe(&e));
            } else {
                let hint = operator::plain_http_hint(&e).unwrap_or_default();
                eprintln!("metaserver: {}{hint}", describe(&e));
            }
            ExitCode::FAILURE
        }
    }
}

/// The `METASERVER_*` variables among `names` that no option reads: a misspelt setting would
/// otherwise be ignored without a word, where a misspelt TOML key is refused.
fn unknown_variables(names: impl Iterator<Item = std::ffi::OsString>) -> Vec<String> {
    use clap::CommandFactory;
    let known: std::collections::BTreeSet<String> = all_arguments(Cli::command())
        .iter()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    let mut unknown: Vec<String> = names
        .filter_map(|n| n.into_string().ok())
        .filter(|n| n.starts_with("METASERVER_") && !known.contains(n))
        .collect();
    unknown.sort();
    unknown
}

/// An error and its causes, `: `-separated, leaving out a cause whose text the message already
/// holds (many errors name their cause in their own message).
fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{describe, unknown_variables};

    #[test]
    fn misspelt_variables_are_named_and_known_ones_are_not() {
        let names = [
            "METASERVER_STOP_DELAY",
            "METASERVER_STOP_DELAY_MS",
            "METASERVER_TOKEN",
            "METASERVER_CONFIG",
            "METASERVER_DATANODE_TIMEOUT_MS",
            "PATH",
        ]
        .map(std::ffi::OsString::from);
        assert_eq!(
            unknown_variables(names.into_iter()),
            vec!["METASERVER_STOP_DELAY".to_string()]
        );
    }

    #[test]
    fn only_the_node_reads_the_nodes_variables() {
        let reads_env = |args: &[&str]| {
            let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
            let command = super::cli_command(&args);
            let worker_threads = command
                .get_arguments()
                .find(|a| a.get_id() == "worker_threads")
                .expect("a top-level serve option");
            worker_threads.get_env().is_some()
        };
        assert!(reads_env(&["metaserver"]));
        assert!(reads_env(&["metaserver", "--id", "2"]));
        assert!(reads_env(&["metaserver", "serve"]));
        assert!(!reads_env(&["metaserver", "status"]));
        assert!(!reads_env(&[
            "metaserver",
            "snapshot",
            "restore",
            "backup.snap"
        ]));
    }

    #[test]
    fn a_cause_the_message_names_is_not_repeated() {
        let io = std::io::Error::other("Permission denied (os error 13)");
        let named = anyhow::Error::new(io).context("LOCK: Permission denied (os error 13)");
        assert_eq!(describe(&named), "LOCK: Permission denied (os error 13)");
        let e = anyhow::anyhow!("disk full").context("writing the marker");
        assert_eq!(describe(&e), "writing the marker: disk full");
    }
}
