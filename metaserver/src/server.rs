//! Running one node: bind, open the node over the HTTP transport, initialize on the first
//! start if asked, serve until SIGTERM or SIGINT (or until the Raft core stops on a storage
//! failure: then the process exits with an error), then stop accepting, let in-flight requests
//! finish, and shut the node down so its log is durable.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use meta_consensus::{MetaNode, Node};
use meta_http::{AppState, HttpNetwork, LimitedListener, PeerClient, Server, Token};

use crate::open_files;
use crate::relocation;
use crate::settings::ServeSettings;
use crate::shutdown::Signals;

/// How long in-flight requests may run after a shutdown signal before the node stops anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a stopping leader waits for another voter to take over.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long closing the node (log close, registry commit and flush) may take before the process
/// exits anyway: a registry whose writes failed can block its flush forever.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves one node until a shutdown signal; returns once its log is durable.
pub async fn serve(settings: ServeSettings) -> Result<()> {
    let mut signals = Signals::install()?;
    // Before anything opens files: the log, the registry and every connection count.
    let max_connections = open_files::connection_slots();
    let listener = match settings.listen_fd {
        Some(fd) => inherited_listener(fd)?,
        None => meta_http::connection_limit::bind(&settings.listen)
            .await
            .with_context(|| format!("binding {}", settings.listen))?,
    };
    let bound = listener.local_addr().context("reading the bound address")?;
    let addr = settings.advertised(bound)?;
    if bound.ip().is_unspecified() && addr == bound.to_string() {
        tracing::warn!(
            %bound,
            "listening on all interfaces without --advertise; peers are told {addr}"
        );
    }
    if let Some(warning) = settings.listening_elsewhere(bound, &addr) {
        tracing::warn!("{warning}");
    }
    if !settings.emulated_sync_latency.is_zero() {
        tracing::warn!(
            extra = ?settings.emulated_sync_latency,
            "every WAL sync is slowed on purpose (emulating a slower disk; benchmarks only)"
        );
    }
    let mut token =
        Token::new(settings.token.as_deref()).with_member(settings.member_token.as_deref());
    if bound.ip().is_loopback() {
        // The names its members and clients may address it by, besides IP addresses.
        let names = settings
            .peers
            .values()
            .chain([&addr, &settings.listen])
            .filter_map(|a| a.rsplit_once(':').map(|(host, _)| host.to_owned()))
            .collect();
        token = token.on_loopback(names);
    }
    // Read before anything opens the data dir: a file that cannot be used stops the start.
    let tls = match &settings.tls {
        Some(files) => Some(files.load().context("loading the TLS files")?),
        None => None,
    };
    let open_key = settings
        .tls
        .as_ref()
        .and_then(|f| Some((f, f.key_readable_by_all()?)));
    if let Some((files, mode)) = open_key {
        tracing::warn!(
            key = %files.key.display(),
            "the TLS private key's file is readable by every user of this machine (mode {mode:o}): \
             whoever reads it can answer as this node; make it readable by the node's user only \
             (chmod 600)"
        );
    }
    // The host the members reach this node at, which its certificate must name (none to check
    // while it advertises no reachable address: it warned above).
    let host = (!crate::settings::unspecified(&addr)).then(|| {
        addr.rsplit_once(':')
            .map_or(addr.as_str(), |(h, _)| h)
            .to_owned()
    });
    if let Some(tls) = &tls {
        if host.is_none() {
            tracing::warn!(
                "without --advertise, the certificate's names are not checked against the host \
                 peers reach this node at"
            );
        }
        tls.check_identity(host.as_deref())
            .context("the TLS certificate (--tls-cert, METASERVER_TLS_CERT or tls_cert)")?;
    }
    let peers = PeerClient::new(tls.as_ref());
    if let Some(tls) = &tls {
        // Renewed certificates and new authorities are taken as the files change.
        tokio::spawn(
            tls.clone()
                .keep_fresh(meta_http::tls::RELOAD_INTERVAL, host.clone()),
        );
    }
    let cfg = settings.node_config(&addr);
    // What this start runs with, defaults filled in: the one place an operator can confirm
    // that a flag, variable or config file took effect.
    tracing::info!(
        barrier = ?cfg.barrier,
        snapshot_rate = cfg.snapshot_max_bytes_per_sec,
        snapshot_logs_since_last = cfg.snapshot_logs_since_last,
        keep_logs = cfg.max_in_snapshot_log_to_keep,
        sled_cache_bytes = cfg.sled_cache_bytes,
        wal_segment_bytes = cfg.wal_segment_bytes,
        max_pending_shards = cfg.max_pending_shards,
        watch_history = cfg.watch_history,
        min_free_bytes = cfg.min_free_bytes,
        datanode_timeout_ms = cfg.datanode_timeout.as_millis() as u64,
        follower_reads = settings.follower_reads,
        idle_timeout_secs = settings.idle_timeout.map_or(0, |t| t.as_secs()),
        stop_delay_ms = settings.stop_delay.as_millis() as u64,
        // The runtime's default when unset: one worker per core.
        worker_threads = settings
            .worker_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        id = settings.id,
        %addr,
        listen = %settings.listen,
        // Absolute: a relative one is taken from the working directory, which a supervisor
        // may set anywhere.
        data_dir = %std::path::absolute(&settings.data_dir)
            .unwrap_or_else(|_| settings.data_dir.clone())
            .display(),
        peers = ?settings.peers,
        init = settings.init,
        token = settings.token.is_some(),
        member_token = settings.member_token.is_some(),
        tls = settings.tls.is_some(),
        "settings in effect"
    );
    if settings.member_token.is_some() && settings.token.is_none() {
        tracing::warn!(
            "--member-token without --token: the members' routes take the member token, but the \
             admin API takes every request without one (give --token too to require one there)"
        );
    }
    if settings.member_token.is_some() && settings.member_token == settings.token {
        tracing::warn!(
            "--member-token is the same as --token: a client holding it can speak for a \
             member; give the members a token of their own"
        );
    }
    // On a first start, the members to initialize are checked before opening records this
    // node's id in the data dir: a mistake in --id or --peers found after it would leave a dir
    // that the corrected start refuses as another node's.
    if settings.init && meta_consensus::is_fresh_data_dir(&settings.data_dir) {
        settings.initial_members(&addr)?;
    }
    let network = HttpNetwork::new(&cfg, token.clone()).with_client(peers.clone());
    let node = MetaNode::open(cfg, network).await.with_context(|| {
        format!(
            "opening node {} in {}",
            settings.id,
            settings.data_dir.display()
        )
    })?;
    tracing::info!(id = settings.id, %addr, data_dir = %settings.data_dir.display(), "node open");

    for disagreement in disagreements(&settings, &addr, &node.status().nodes) {
        tracing::warn!("{disagreement}");
    }
    if settings.init {
        initialize_once(&node, &settings, &addr, &token, &peers).await?;
    } else if !node.is_initialized().await? {
        // Also what a member whose data dir was lost looks like, which must not rejoin as is;
        // but mostly a new node, so not a warning.
        tracing::info!(
            "this node holds no Raft state: it waits to be added to a cluster (or initialized \
             with --init). (A voter whose data dir was lost looks the same: remove it from the \
             voters, then add it back as a learner and promote it once caught up.)"
        );
    }

    let state = AppState::with_peer_client(node.clone(), token.clone(), peers.clone())
        .with_follower_reads(settings.follower_reads)
        .with_watch_slots((max_connections / 2).max(1));
    let readiness = state.readiness.clone();
    // While this node leads, the nodes a membership change removes are told so.
    tokio::spawn(meta_http::removal_notices::run(state.clone()));
    // While this node leads short of disk, a voter with room takes over.
    tokio::spawn(meta_http::disk_handover::run(
        state.clone(),
        meta_http::disk_handover::CHECK_EVERY,
    ));
    // A voter short of disk tells its leader at once.
    tokio::spawn(meta_http::disk_alarm::run(
        state.clone(),
        meta_http::disk_alarm::CHECK_EVERY,
    ));
    let metrics = state.metrics.clone();
    let app = meta_http::router(state);
    // Tests and scripts read the bound address (port 0 picks a free one) from this line. A
    // node serves on whether or not anyone reads it (`metaserver | head -1`).
    crate::output::line(format_args!("listening on {bound}")).ok();
    tracing::info!(%bound, "serving");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = Server::new(LimitedListener::new(listener, max_connections), app)
        .idle_timeout(settings.idle_timeout)
        .tls(tls)
        .metrics(metrics.connections().clone())
        .token(token.clone());
    let server = tokio::spawn(server.serve(async {
        let _ = stop_rx.await;
    }));
    // Once it answers at its address: a member restarted elsewhere has the cluster move it.
    tokio::spawn(relocation::follow(node.clone(), token, peers, addr.clone()));
    // A node whose Raft core stopped (a storage failure) can serve nothing until it restarts:
    // it stops like a signalled one and exits with an error, so a supervisor restarts it and
    // recovery reads the log back from the disk (a failed fsync is never retried in place).
    let failure = tokio::select! {
        signal = signals.recv() => {
            // While still serving, so that requests meanwhile are forwarded to the new leader.
            // A second signal ends every wait of the stop (the log is still closed properly).
            tokio::select! {
                handed = node.hand_over_leadership(HANDOVER_TIMEOUT) => match handed {
                    Ok(Some(to)) => tracing::info!(to, "handed leadership over"),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("handing leadership over: {e}"),
                },
                again = signals.recv() => {
                    tracing::warn!(signal = again, "a second signal: stopping without handing leadership over");
                }
            }
            if !settings.stop_delay.is_zero() {
                // Load balancers see /readyz fail and take the node out of rotation while it
                // still answers (forwarding writes to the new leader); a second signal ends it.
                readiness.set_stopping();
                tracing::info!(delay = ?settings.stop_delay, "stopping: not ready, still serving");
                tokio::select! {
                    _ = tokio::time::sleep(settings.stop_delay) => {}
                    _ = signals.recv() => {}
                }
            }
            tracing::info!(signal, "shutting down: no new connections, draining requests");
            None
        }
        why = node.stopped() => {
            tracing::error!(
                data_dir = %settings.data_dir.display(),
                "the Raft core stopped: {why}; shutting down to be restarted"
            );
            Some(why)
        }
    };
    // Nothing long-lived may hold the drain: waiting watches answer now (their clients watch on
    // at another member) and the leader's replication streams end. A node whose port is closed
    // hears no leader: it must not campaign meanwhile.
    node.begin_close();
    node.stop_elections();
    let _ = stop_tx.send(());
    tokio::select! {
        drained = tokio::time::timeout(DRAIN_TIMEOUT, server) => match drained {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("server task failed: {e}"),
            Err(_) => tracing::warn!("requests still running after {DRAIN_TIMEOUT:?}; stopping anyway"),
        },
        again = signals.recv() => {
            tracing::warn!(signal = again, "a second signal: not waiting for running requests");
        }
    }
    // Closing is bounded, and a node that cannot close exits here: after a storage error
    // sled's flush (and its handles' drop, which flushes) can wait forever for a log buffer that
    // will never be written (seen on a full disk), and the runtime's drop waits for that
    // blocking task.
    let closed = tokio::time::timeout(CLOSE_TIMEOUT, node.shutdown()).await;
    if failure.is_some() {
        match closed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("closing the node after its core stopped: {e}"),
            Err(_) => tracing::warn!("still closing the node after {CLOSE_TIMEOUT:?}"),
        }
        // Its cause was logged once, when the core stopped.
        tracing::info!("closed after the Raft core stopped (see above); exiting with status 1");
        std::process::exit(1);
    }
    let Ok(closed) = closed else {
        tracing::error!(
            "the node did not close within {CLOSE_TIMEOUT:?} (a storage failure?); exiting with \
             status 1"
        );
        std::process::exit(1);
    };
    closed.context("shutting the node down")?;
    tracing::info!("stopped; the log is durable");
    Ok(())
}

/// Initializes the cluster unless this node was ever initialized (or joined one). Refuses
/// (before anything is changed) when a member that answers is another node, or belongs to a
/// cluster already: a member whose data dir was lost, started with `--init` again by mistake,
/// would otherwise form a new cluster that every other member refuses.
async fn initialize_once(
    node: &MetaNode,
    settings: &ServeSettings,
    addr: &str,
    token: &Token,
    peers: &PeerClient,
) -> Result<()> {
    if node.is_initialized().await? {
        tracing::info!("already initialized; restarting from the data dir");
        return Ok(());
    }
    let members = settings.initial_members(addr)?;
    if let Some(warning) = settings.unnamed_in_peers(addr) {
        tracing::warn!("{warning}");
    }
    let link = meta_http::cluster_identity::MemberLink {
        client: peers,
        token,
        cluster: &node.config().cluster_id,
    };
    link.check_init_members(settings.id, &members)
        .await
        .context("--init: a member named in --peers cannot join the cluster formed here")?;
    tracing::info!(?members, "initializing the cluster (first start)");
    let members = members
        .into_iter()
        .map(|(id, addr)| (id, Node::new(addr)))
        .collect();
    match node.initialize(members).await {
        Ok(()) => Ok(()),
        Err(meta_consensus::Error::AlreadyInitialized) => Ok(()),
        Err(e) => Err(e).context("initializing the cluster"),
    }
}

/// What the settings say that the stored membership `nodes` contradicts. The membership wins:
/// `--peers` is read only when a cluster is initialized, and a node whose address changed cannot
/// be reached by its peers until it is removed and added back. A one-node cluster has no peers
/// to miss it.
fn disagreements(
    settings: &ServeSettings,
    addr: &str,
    nodes: &BTreeMap<u64, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    if nodes.len() < 2 {
        return found;
    }
    if let Some(known) = nodes.get(&settings.id) {
        if known != addr {
            found.push(format!(
                "the cluster knows this node ({}) at {known}, but this start gives it the \
                 address {addr} (--advertise, else its --peers entry, else where it listens): \
                 it asks the members to move it there (PUT /v1/cluster/members/ID); until the \
                 leader has, its peers may not reach it",
                settings.id
            ));
        }
    }
    // This node's own entry gave it its address, named above if the cluster knows another.
    for (id, peer) in settings.peers.iter().filter(|(id, _)| **id != settings.id) {
        match nodes.get(id) {
            Some(known) if known != peer => found.push(format!(
                "--peers gives node {id} the address {peer}, but the cluster knows it at {known} \
                 (--peers is read only when a cluster is initialized)"
            )),
            None => found.push(format!(
                "--peers names node {id}, which is not a member (--peers is read only when a \
                 cluster is initialized)"
            )),
            Some(_) => {}
        }
    }
    found
}

/// The listening TCP socket inherited as descriptor `fd` (`--listen-fd`). Refused unless `fd` is
/// a socket that listens: a wrong number must not make this process adopt a descriptor it uses
/// for something else.
fn inherited_listener(fd: i32) -> Result<tokio::net::TcpListener> {
    use std::os::fd::FromRawFd;
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`; any descriptor number is
    // safe to ask about (a bad one fails with EBADF or ENOTSOCK).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || listening == 0 {
        let why = if rc != 0 {
            std::io::Error::last_os_error().to_string()
        } else {
            "it does not listen".to_owned()
        };
        anyhow::bail!("--listen-fd {fd} is not a listening socket: {why}");
    }
    // SAFETY: `fd` is an open listening socket (checked above) that this process inherited to
    // serve; nothing else here owns it.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    listener
        .set_nonblocking(true)
        .context("making the inherited socket non-blocking")?;
    tokio::net::TcpListener::from_std(listener).context("serving the inherited socket")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ServeArgs;

    #[test]
    fn settings_that_the_membership_contradicts_are_named() {
        let mut settings = ServeSettings::resolve(&ServeArgs::default(), false).unwrap();
        let nodes: BTreeMap<u64, String> = [(1, "10.0.0.1:7101"), (2, "10.0.0.2:7101")]
            .map(|(id, a)| (id, a.to_owned()))
            .into();
        assert!(disagreements(&settings, "10.0.0.1:7101", &nodes).is_empty());
        let moved = disagreements(&settings, "10.0.0.9:7101", &nodes);
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert!(moved[0].contains("10.0.0.9:7101"), "{moved:?}");

        settings.peers = [
            (1, "10.0.0.1:7101"),
            (2, "10.0.0.7:7101"),
            (3, "10.0.0.3:7101"),
        ]
        .map(|(id, a)| (id, a.to_owned()))
        .into();
        let peers = disagreements(&settings, "10.0.0.1:7101", &nodes);
        assert_eq!(peers.len(), 2, "{peers:?}");
        // Its own --peers entry, which gave it its address, is named once, as its address.
        settings.peers.insert(1, "10.0.0.8:7101".to_owned());
        let own = disagreements(&settings, "10.0.0.8:7101", &nodes);
        assert_eq!(own.len(), 3, "{own:?}");
        assert!(
            !own.iter().any(|d| d.contains("--peers gives node 1")),
            "{own:?}"
        );
        // A one-node cluster has nobody to miss it.
        let alone: BTreeMap<u64, String> = [(1, "127.0.0.1:1".to_owned())].into();
        assert!(disagreements(&settings, "127.0.0.1:2", &alone).is_empty());
    }
}
