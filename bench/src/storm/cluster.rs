//! A three-node cluster of real `metaserver` release processes on loopback: started with fresh data
//! dirs and ephemeral ports, waited on until a leader is known and every member is ready, and killed
//! when dropped (also on panic).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::api::Api;
use super::options::{Arm, ServerFlags};
use super::reaper::Reaper;

/// How many members a cluster has.
pub const MEMBERS: u64 = 3;

/// One server process of the cluster.
struct Member {
    id: u64,
    base: String,
    child: Option<Child>,
    log: PathBuf,
}

/// A running three-node cluster. Dropping it kills the processes and removes the data dirs (unless
/// they are kept for inspection).
pub struct Cluster {
    members: Vec<Member>,
    leader: u64,
    dir: Option<tempfile::TempDir>,
    keep_data: bool,
}

impl Cluster {
    /// Starts three `binary serve` processes with `arm`'s barrier mode (`--barrier`) under a fresh directory in
    /// `parent`, each on a port the system picks, forms the cluster through member 1's init route, and
    /// waits until all agree on a leader and report ready.
    ///
    /// Call this from the thread that drives the runtime (not a spawned task): the children's
    /// parent-death signal is tied to the thread that spawned them.
    pub async fn start(
        binary: &Path,
        arm: Arm,
        parent: &Path,
        server: &ServerFlags,
        keep_data: bool,
        startup_timeout: Duration,
        api: &Api,
    ) -> Result<Cluster> {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", arm.name()))
            .tempdir_in(parent)
            .with_context(|| format!("create a run dir in {}", parent.display()))?;
        if !keep_data {
            Reaper::register_dir(dir.path());
        }
        let mut cluster = Cluster {
            members: Vec::new(),
            leader: 0,
            dir: Some(dir),
            keep_data,
        };
        // Each server binds a port of the system's choosing and prints it; then the bench forms
        // the cluster through node 1's init route. (Ports picked here and released would be a
        // race with anything else that binds one meanwhile.)
        for id in 1..=MEMBERS {
            let root = cluster.root().to_path_buf();
            let data = root.join(format!("node{id}"));
            let log = root.join(format!("node{id}.log"));
            let out = File::create(&log).with_context(|| format!("create {}", log.display()))?;
            let err = out.try_clone().context("clone log handle")?;
            let mut command = Command::new(binary);
            command
                .arg("serve")
                .args(["--id", &id.to_string()])
                .args(["--listen", "127.0.0.1:0"])
                .arg("--data-dir")
                .arg(&data)
                .args(["--barrier", arm.barrier()])
                .env("RUST_LOG", &server.log)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            if server.worker_threads > 0 {
                command.args(["--worker-threads", &server.worker_threads.to_string()]);
            }
            command.args(&server.extra);
            if arm == Arm::Tls {
                let certs = server
                    .certs
                    .as_ref()
                    .context("the tls arm without certificates")?;
                command.args(certs.server_flags());
            }
            // Only the flags above configure the servers: no setting leaks in from this environment.
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("METASERVER_") {
                    command.env_remove(&key);
                }
            }
            Reaper::arm_parent_death_signal(&mut command);
            let child = command
                .spawn()
                .with_context(|| format!("start {} serve --id {id}", binary.display()))?;
            Reaper::register(child.id());
            cluster.members.push(Member {
                id,
                base: String::new(),
                child: Some(child),
                log,
            });
        }
        let deadline = Instant::now() + startup_timeout;
        let mut members = serde_json::Map::new();
        for i in 0..cluster.members.len() {
            let addr = cluster.listening_address(i, deadline).await?;
            let m = &mut cluster.members[i];
            let scheme = if arm == Arm::Tls { "https" } else { "http" };
            m.base = format!("{scheme}://{addr}");
            members.insert(m.id.to_string(), addr.into());
        }
        let members = serde_json::Value::Object(members);
        api.init(&cluster.members[0].base, &members)
            .await
            .context("initialize the cluster")?;
        cluster.wait_ready(api, startup_timeout).await?;
        Ok(cluster)
    }

    /// The run's directory: data dirs and logs of the three members.
    pub fn root(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("."))
    }

    /// The leader found at start (or by the last `refresh_leader`).
    pub fn leader(&self) -> u64 {
        self.leader
    }

    /// The base URL (`http://127.0.0.1:port`) of member `id`.
    pub fn base(&self, id: u64) -> &str {
        &self.members[(id - 1) as usize].base
    }

    /// Base URLs of all members, the leader first, so that one client goes to the leader and more
    /// clients spread evenly over all members.
    pub fn bases_leader_first(&self) -> Vec<String> {
        let mut out = vec![self.base(self.leader).to_string()];
        out.extend(
            self.members
                .iter()
                .filter(|m| m.id != self.leader)
                .map(|m| m.base.clone()),
        );
        out
    }

    /// Process ids by member id.
    pub fn pids(&self) -> Vec<(u64, u32)> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(|c| (m.id, c.id())))
            .collect()
    }

    /// Peak resident set size (VmHWM) of each member in MiB, by member id.
    pub fn peak_rss_mib(&self) -> Result<Vec<(u64, f64)>> {
        self.pids()
            .into_iter()
            .map(|(id, pid)| Ok((id, vm_hwm_kib(pid)? as f64 / 1024.0)))
            .collect()
    }

    /// Asks the members who leads now; keeps the old answer when none knows.
    pub async fn refresh_leader(&mut self, api: &Api) -> u64 {
        for m in &self.members {
            if let Ok(view) = api.cluster(&m.base).await {
                if let Some(l) = view.leader.filter(|l| (1..=MEMBERS).contains(l)) {
                    self.leader = l;
                    break;
                }
            }
        }
        self.leader
    }

    /// Fails, naming the member and the tail of its log, if any server process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut() {
                if let Some(status) = child.try_wait().context("wait for a server")? {
                    Reaper::unregister(child.id());
                    m.child = None;
                    bail!(
                        "metaserver {} exited ({status}); the end of its log {}:\n{}",
                        m.id,
                        m.log.display(),
                        log_tail(&m.log)
                    );
                }
            }
        }
        Ok(())
    }

    /// Stops every member with SIGTERM, waiting up to `grace` before SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        for m in &self.members {
            if let Some(child) = &m.child {
                // SAFETY: kill(2) on our own child that has not been waited for.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + grace;
        for m in &mut self.members {
            let Some(mut child) = m.child.take() else {
                continue;
            };
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
            Reaper::unregister(child.id());
        }
    }

    /// The address member `i` printed as `listening on ADDR`, waited for until `deadline`.
    async fn listening_address(&mut self, i: usize, deadline: Instant) -> Result<String> {
        loop {
            self.check_alive()?;
            let log = &self.members[i].log;
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(addr) = text
                .lines()
                .find_map(|l| l.strip_prefix("listening on "))
                .map(str::trim)
            {
                return Ok(addr.to_string());
            }
            if Instant::now() >= deadline {
                bail!(
                    "metaserver {} printed no address in time; the end of its log {}:\n{}",
                    self.members[i].id,
                    log.display(),
                    log_tail(log)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_ready(&mut self, api: &Api, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no member answered yet");
        loop {
            self.check_alive()?;
            let mut leaders = Vec::new();
            for m in &self.members {
                match api.cluster(&m.base).await {
                    Ok(view) => leaders.push(view.leader),
                    Err(e) => {
                        last = format!("member {}: {e}", m.id);
                        leaders.push(None);
                    }
                }
            }
            let agreed = leaders[0]
                .filter(|l| (1..=MEMBERS).contains(l) && leaders.iter().all(|x| *x == Some(*l)));
            if let Some(leader) = agreed {
                let mut all_ready = true;
                for m in &self.members {
                    if !api.ready(&m.base).await {
                        all_ready = false;
                        last = format!("leader {leader} known, member {} not ready", m.id);
                        break;
                    }
                }
                if all_ready {
                    self.leader = leader;
                    return Ok(());
                }
            } else if leaders.iter().any(Option::is_some) {
                last = format!("members disagree on the leader: {leaders:?}");
            }
            if Instant::now() >= deadline {
                let logs = self
                    .members
                    .iter()
                    .map(|m| format!("--- {}:\n{}", m.log.display(), log_tail(&m.log)))
                    .collect::<Vec<_>>()
                    .join("\n");
                bail!("the cluster did not become ready within {timeout:?} ({last})\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
                Reaper::unregister(child.id());
            }
        }
        if let Some(dir) = self.dir.take() {
            Reaper::unregister_dir(dir.path());
            if self.keep_data {
                let kept = dir.keep();
                eprintln!("storm: kept {}", kept.display());
            }
        }
    }
}

/// The peak resident set size of `pid` in KiB, from `/proc/<pid>/status`.
fn vm_hwm_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .with_context(|| format!("no VmHWM in {path}"))?;
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("bad VmHWM line {line:?} in {path}"))
}

/// The last few lines of a server log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
