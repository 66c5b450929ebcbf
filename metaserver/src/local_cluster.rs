//! `metaserver local-cluster`: a whole cluster on loopback, one child process per node.
//!
//! Node N listens on base-port + N - 1 (or on a free port when the base port is 0: this process
//! binds it and the node inherits the socket, so no other process can take it between), keeps its
//! data in DIR/nodeN and knows every other node; node 1 initializes the cluster on its first
//! start. Options after `--` go to every node's `serve`. SIGINT or SIGTERM stops every child
//! with SIGTERM (each makes its log durable and exits), and a second one is passed on (it ends a
//! node's stop delay); a child that dies on its own stops the others too. Children also get SIGTERM if this process dies, so none is left behind.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cli::LocalClusterArgs;
use crate::output;
use crate::shutdown::Signals;

/// How long children may take to stop after SIGTERM before they are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// One running node.
struct NodeProcess {
    id: u64,
    child: Child,
}

impl NodeProcess {
    fn signal(&self, signal: libc::c_int) {
        // The child is ours and not yet reaped, so its pid is still valid.
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Binds `n` listeners on free loopback ports (port 0). Each node serves the one bound for it
/// (`serve --listen-fd`): a port picked, released and bound again by the child could be taken
/// by another process in between.
async fn free_listeners(n: u64) -> Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::new();
    for _ in 0..n {
        let listener = meta_http::connection_limit::bind("127.0.0.1:0")
            .await
            .context("binding a free port")?;
        listeners.push(listener.into_std().context("binding a free port")?);
    }
    Ok(listeners)
}

/// `serve` options that `local-cluster` sets for each node itself.
const OWN_OPTIONS: [&str; 7] = [
    "--id",
    "--listen",
    "--listen-fd",
    "--advertise",
    "--data-dir",
    "--peers",
    "--init",
];

/// Why `local-cluster` gives its nodes no config file.
const CONFIG_NOT_PASSED: &str = "local-cluster gives its nodes no config file (one could set what \
     it sets for each node: ids, addresses, data dirs); give the other serve options after --";

/// Refuses options after `--` that `local-cluster` sets itself (a node given another's id or
/// data dir would not start, or worse).
fn check_serve_options(options: &[String]) -> Result<()> {
    for option in options {
        let name = option.split('=').next().unwrap_or_default();
        if name == "--config" {
            bail!("{CONFIG_NOT_PASSED}");
        }
        if OWN_OPTIONS.contains(&name) {
            bail!(
                "{name} is set by local-cluster for each node; give only other serve options \
                 after --"
            );
        }
    }
    Ok(())
}

/// Reads the serve options after `--` as each node will, with what `local-cluster` sets
/// itself (and what it does not pass on) left out: a bad one ends the command before any node
/// starts, rather than each node printing the same error.
fn check_serve_values(options: &[String]) -> Result<()> {
    use clap::Parser;
    let argv = ["metaserver", "serve"]
        .into_iter()
        .map(String::from)
        .chain(options.iter().cloned());
    let cli = crate::cli::Cli::try_parse_from(argv).map_err(|e| {
        anyhow::anyhow!(
            "the serve options (after --, or METASERVER_* in the environment): {}",
            e.render()
        )
    })?;
    let Some(crate::cli::Command::Serve(mut args)) = cli.command else {
        bail!("the serve options after -- were not read as serve options");
    };
    args.config = None;
    args.id = Some(1);
    args.listen = Some("127.0.0.1:0".into());
    args.listen_fd = None;
    args.advertise = None;
    args.data_dir = Some("node1".into());
    args.peers = None;
    args.init = Some(false);
    crate::settings::ServeSettings::resolve(&args, false)
        .map(|_| ())
        .context("the serve options (after --, or METASERVER_* in the environment)")
}

/// Runs the cluster until a signal or a child's death.
pub async fn run(args: LocalClusterArgs) -> Result<()> {
    if args.nodes == 0 || args.nodes > 9 {
        bail!("--nodes must be 1 to 9, not {}", args.nodes);
    }
    check_serve_options(&args.serve_options)?;
    check_serve_values(&args.serve_options)?;
    if args.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        // Every node would refuse it; say so before any starts.
        bail!("--token (METASERVER_TOKEN) is empty: give a token or leave it unset");
    }
    if std::env::var_os("METASERVER_CONFIG").is_some() {
        tracing::warn!("METASERVER_CONFIG is not passed on: {CONFIG_NOT_PASSED}");
    }
    let mut signals = Signals::install()?;
    // With port 0, the listeners bound here, handed to the nodes.
    let mut listeners = if args.base_port == 0 {
        free_listeners(args.nodes).await?
    } else {
        Vec::new()
    };
    let ports: Vec<u16> = if args.base_port == 0 {
        listeners
            .iter()
            .map(|l| Ok(l.local_addr()?.port()))
            .collect::<std::io::Result<_>>()
            .context("reading a bound port")?
    } else {
        (0..args.nodes)
            .map(|i| {
                let port = u64::from(args.base_port) + i;
                u16::try_from(port).map_err(|_| {
                    anyhow::anyhow!(
                        "--base-port {} with --nodes {} needs port {port}, past 65535",
                        args.base_port,
                        args.nodes
                    )
                })
            })
            .collect::<Result<_>>()?
    };
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let exe = std::env::current_exe().context("locating the metaserver binary")?;

    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i as u64 + 1;
        let dir = args.data_dir.join(format!("node{id}"));
        let mut command = Command::new(&exe);
        command
            .arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(addr)
            .arg("--data-dir")
            .arg(&dir)
            .arg("--peers")
            .arg(&peers)
            .arg("--init")
            .arg(if id == 1 { "true" } else { "false" })
            .args(&args.serve_options)
            .env_remove("METASERVER_CONFIG")
            .env_remove("METASERVER_ID")
            .env_remove("METASERVER_LISTEN")
            .env_remove("METASERVER_ADVERTISE")
            .env_remove("METASERVER_DATA_DIR")
            .env_remove("METASERVER_PEERS")
            .env_remove("METASERVER_INIT");
        match &args.token {
            Some(token) => command.env("METASERVER_TOKEN", token),
            None => command.env_remove("METASERVER_TOKEN"),
        };
        // A group of its own: a terminal's Ctrl-C signals the foreground group, and the node
        // must hear it once, from this process, not also directly (a second signal cuts its
        // stop short). The parent-death signal below still stops it if this process dies.
        command.process_group(0);
        // The node's own listener, if bound here: inherited under its descriptor number.
        let inherited = listeners.get(i).map(|l| l.as_raw_fd());
        if let Some(fd) = inherited {
            command.arg("--listen-fd").arg(fd.to_string());
        }
        // SAFETY: prctl and fcntl are async-signal-safe; they only set this child's
        // parent-death signal and let its own listener (only that one) stay open across exec.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = inherited {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        // Its log goes to this process's stderr, each line prefixed with the node's id: three
        // nodes' lines merged read alike.
        command.stderr(std::process::Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                stop_all(&mut nodes, &mut signals).await;
                return Err(e).with_context(|| format!("starting node {id}"));
            }
        };
        if let Some(log) = child.stderr.take() {
            std::thread::spawn(move || prefix_lines(id, log));
        }
        // The cluster runs on whether or not anyone reads these lines.
        output::line(format_args!(
            "node {id} at {addr} (data in {})",
            dir.display()
        ))
        .ok();
        nodes.push(NodeProcess { id, child });
    }
    // Each node holds its own listener now.
    listeners.clear();
    output::line(format_args!(
        "local cluster of {} nodes running; Ctrl-C stops it",
        args.nodes
    ))
    .ok();

    let outcome = loop {
        tokio::select! {
            signal = signals.recv() => {
                tracing::info!(signal, "stopping the local cluster");
                break Ok(());
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if let Some((id, status)) = exited(&mut nodes) {
                    break Err(anyhow::anyhow!("node {id} exited on its own: {status}"));
                }
            }
        }
    };
    let clean = stop_all(&mut nodes, &mut signals).await;
    outcome?;
    if !clean {
        bail!("not every node stopped cleanly");
    }
    output::line("local cluster stopped").ok();
    Ok(())
}

/// Copies node `id`'s log to this process's stderr, each line prefixed `[node ID] `, until the
/// node closes it.
fn prefix_lines(id: u64, log: std::process::ChildStderr) {
    use std::io::{BufRead, Write};
    let mut lines = std::io::BufReader::new(log);
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "[node {id}] ");
                let _ = err.write_all(&line);
            }
        }
    }
}

/// SIGTERM to every child still running.
fn term_running(nodes: &mut [NodeProcess]) {
    for node in nodes.iter_mut() {
        if let Ok(None) = node.child.try_wait() {
            node.signal(libc::SIGTERM);
        }
    }
}

/// The first child that has exited, if any.
fn exited(nodes: &mut [NodeProcess]) -> Option<(u64, ExitStatus)> {
    nodes.iter_mut().find_map(|n| match n.child.try_wait() {
        Ok(Some(status)) => Some((n.id, status)),
        _ => None,
    })
}

/// SIGTERM to every running child, then waits; kills those that do not stop in time. A signal
/// to this process meanwhile (a second Ctrl-C) is passed on as a second SIGTERM, which ends a
/// node's stop delay (`--stop-delay-ms`). Returns whether every child exited with status 0.
async fn stop_all(nodes: &mut [NodeProcess], signals: &mut Signals) -> bool {
    term_running(nodes);
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut clean = true;
    for i in 0..nodes.len() {
        loop {
            let node = &mut nodes[i];
            match node.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("node {} exited with {status}", node.id);
                        clean = false;
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    tokio::select! {
                        signal = signals.recv() => {
                            tracing::info!(signal, "passing the signal on to the nodes still running");
                            term_running(nodes);
                        }
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
                _ => {
                    eprintln!("node {} did not stop in time; killing it", node.id);
                    let _ = node.child.kill();
                    let _ = node.child.wait();
                    clean = false;
                    break;
                }
            }
        }
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_options_local_cluster_sets_or_does_not_pass_are_refused_with_the_reason() {
        let check = |o: &str| check_serve_options(&[o.to_owned()]).map_err(|e| e.to_string());
        assert!(check("--snapshot-rate=5").is_ok());
        let own = check("--data-dir=x").unwrap_err();
        assert!(own.contains("set by local-cluster"), "{own}");
        let config = check("--config=f.toml").unwrap_err();
        assert!(
            config.contains("gives its nodes no config file"),
            "{config}"
        );
    }

    #[test]
    fn serve_options_that_no_node_would_take_are_refused_before_any_starts() {
        let check = |o: &[&str]| {
            let options: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            check_serve_values(&options).map_err(|e| format!("{e:#}"))
        };
        check(&["--snapshot-rate", "67108864", "--watch-history=10"]).unwrap();
        check(&[]).unwrap();
        for bad in [
            &["--bogus"][..],
            &["--snapshot-rate", "abc"],
            &["--wal-segment-bytes", "10"],
        ] {
            let refused = check(bad).unwrap_err();
            assert!(refused.contains("the serve options (after --"), "{refused}");
        }
    }
}
