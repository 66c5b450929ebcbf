//! Helpers of the binary tests: start `metaserver` processes on ephemeral loopback ports,
//! read the address they print, poll them with deadlines, signal them, and never leave one
//! behind (children are killed when their handle is dropped).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a test waits for anything.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A running `metaserver` process (and, for `local-cluster`, its process group).
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub stderr: PathBuf,
    group: bool,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = self.child.id() as libc::pid_t;
            let target = if self.group { -pid } else { pid };
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(target, libc::SIGKILL);
            }
            let _ = self.child.wait();
        } else if self.group {
            // The leader exited; make sure nothing of its group lingers.
            // SAFETY: as above.
            unsafe {
                libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
            }
        }
    }
}

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_metaserver")
}

/// Starts the binary in `cwd` with `args` and `env`; stdout lines are collected, stderr
/// goes to a log file in `log_dir`. `group` puts it in its own process group.
pub fn spawn(cwd: &Path, log_dir: &Path, args: &[&str], env: &[(&str, &str)], group: bool) -> Proc {
    spawn_with_open_files(cwd, log_dir, args, env, group, None)
}

/// Starts nodes 1 to `dirs.len()` (`serve`, each with its data under its own dir, one worker
/// thread, and `extra` flags) on ports of the system's choosing; returns them and their
/// addresses. The caller forms the cluster.
pub fn spawn_members(dirs: &[tempfile::TempDir], extra: &[String]) -> (Vec<Proc>, Vec<String>) {
    let mut nodes = Vec::new();
    let mut addrs = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = (i + 1).to_string();
        let data = dir.path().join("data");
        let mut args = vec![
            "serve",
            "--id",
            &id,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--worker-threads",
            "1",
        ];
        args.extend(extra.iter().map(String::as_str));
        let mut node = spawn(dir.path(), dir.path(), &args, &[], false);
        addrs.push(node.address());
        nodes.push(node);
    }
    (nodes, addrs)
}

/// Stops member `id` of `nodes` (from [`spawn_members`]) and starts it again on its data dir
/// and address, with `extra` arguments and `env`.
pub async fn restart_member(
    nodes: &mut [Proc],
    dirs: &[tempfile::TempDir],
    addrs: &[String],
    id: usize,
    extra: &[&str],
    env: &[(&str, &str)],
) {
    nodes[id - 1].stop().await;
    let data = dirs[id - 1].path().join("data");
    let number = id.to_string();
    let mut args = vec![
        "serve",
        "--id",
        &number,
        "--listen",
        &addrs[id - 1],
        "--data-dir",
        data.to_str().unwrap(),
        "--worker-threads",
        "1",
    ];
    args.extend_from_slice(extra);
    let dir = dirs[id - 1].path();
    nodes[id - 1] = spawn(dir, dir, &args, env, false);
    nodes[id - 1].address();
}

/// Like [`spawn`], with the child's soft and hard limit of open files set to `open_files`.
pub fn spawn_with_open_files(
    cwd: &Path,
    log_dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    group: bool,
    open_files: Option<u64>,
) -> Proc {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stderr = log_dir.join(format!("stderr-{n}.log"));
    let mut command = Command::new(binary());
    command
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("log file"))
        .env("RUST_LOG", "warn");
    for (key, _) in std::env::vars() {
        if key.starts_with("METASERVER_") {
            command.env_remove(key);
        }
    }
    for (key, value) in env {
        command.env(key, value);
    }
    if group {
        command.process_group(0);
    }
    if let Some(n) = open_files {
        // SAFETY: setrlimit is async-signal-safe, so it may run between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().expect("spawn metaserver");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Proc {
        child,
        lines: rx,
        stderr,
        group,
    }
}

impl Proc {
    /// Waits for a stdout line starting with `prefix` and returns the rest.
    pub fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(_) => panic!("no line starting with {prefix:?}; stderr:\n{}", self.logs()),
            }
        }
    }

    /// The address printed as `listening on ADDR`.
    pub fn address(&mut self) -> String {
        self.wait_line("listening on ")
    }

    /// The tail of its stderr.
    pub fn logs(&self) -> String {
        let bytes = std::fs::read(&self.stderr).unwrap_or_default();
        let start = bytes.len().saturating_sub(4000);
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// Whether the process's stderr holds `text` anywhere.
    pub fn logged(&self, text: &str) -> bool {
        String::from_utf8_lossy(&std::fs::read(&self.stderr).unwrap_or_default()).contains(text)
    }

    /// Waits until the process's stderr holds `text`; fails the test, with the log's tail, if it
    /// does not within [`DEADLINE`].
    pub async fn wait_logged(&self, text: &str) {
        let deadline = Instant::now() + DEADLINE;
        while !self.logged(text) {
            assert!(
                Instant::now() < deadline,
                "never logged {text:?}; stderr:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fails unless the process's last stop drained its requests in time: a request that held
    /// the drain makes the server give up on it after its drain timeout and log so.
    pub fn assert_drained(&self) {
        assert!(
            !self.logged("requests still running after"),
            "a request held the drain; stderr:\n{}",
            self.logs()
        );
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions; the child is not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// Sends `signal` to its whole process group, as a terminal's Ctrl-C does. Only for a
    /// process spawned in a group of its own.
    pub fn signal_group(&self, signal: libc::c_int) {
        assert!(self.group, "not in a group of its own");
        // SAFETY: kill(2) has no memory-safety preconditions; the group leader is not reaped.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), signal);
        }
    }

    /// Stops it with SIGTERM and asserts that it exits cleanly.
    pub async fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let exit = self.wait_exit().await;
        assert!(exit.success(), "{exit:?}; stderr:\n{}", self.logs());
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit; stderr:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An HTTP client for the tests.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Sends a request and returns (status, JSON or string body).
pub async fn send(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<String>,
) -> reqwest::Result<(u16, Value)> {
    let mut request = http.request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// Polls `GET url` until it answers 200 and `ok` accepts the body.
pub async fn poll(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    mut ok: impl FnMut(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + DEADLINE;
    let mut last = None;
    loop {
        if let Ok((200, v)) = send(http, reqwest::Method::GET, url, token, None).await {
            if ok(&v) {
                return v;
            }
            last = Some(v);
        }
        assert!(
            Instant::now() < deadline,
            "gave up polling {url}; last {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `url` (GET, no token) until it answers `status`; returns that answer's body.
pub async fn poll_status(http: &reqwest::Client, url: &str, status: u16) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (got, v) = send(http, reqwest::Method::GET, url, None, None)
            .await
            .unwrap();
        if got == status {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never answered {status}; last {got}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Initializes a cluster of the members at `addrs` (nodes 1, 2, ..., spoken to over `scheme`,
/// `http` or `https`, with `token` if any), waits until each is ready, and returns the
/// leader's id.
pub async fn form_cluster(
    http: &reqwest::Client,
    scheme: &str,
    addrs: &[String],
    token: Option<&str>,
) -> usize {
    let members: serde_json::Map<String, Value> = addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| ((i + 1).to_string(), Value::String(addr.clone())))
        .collect();
    let body = serde_json::json!({ "members": members }).to_string();
    let url = format!("{scheme}://{}/v1/cluster/init", addrs[0]);
    let (status, v) = send(http, reqwest::Method::POST, &url, token, Some(body))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    for addr in addrs {
        poll(http, &format!("{scheme}://{addr}/readyz"), None, |_| true).await;
    }
    let url = format!("{scheme}://{}/v1/cluster", addrs[0]);
    let view = poll(http, &url, token, |v| v["leader_id"].is_u64()).await;
    view["leader_id"].as_u64().unwrap() as usize
}

/// How long an operator command of the tests may run before it is killed and the test fails.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(120);

/// Runs an operator command to completion and returns (success, stdout, stderr). A command
/// still running after [`COMMAND_DEADLINE`] is killed and fails the test.
pub async fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(binary());
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with("METASERVER_") {
            command.env_remove(key);
        }
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let out = tokio::time::timeout(COMMAND_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("metaserver {args:?} still ran after {COMMAND_DEADLINE:?}"))
        .expect("run metaserver");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
