//! One server process: spawned so that it dies with the test process, its output kept in log files,
//! its `listening on ADDR` line reported, and killed when dropped.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::poll::POLL_INTERVAL;

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The executable.
    pub binary: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where the process's standard output is copied.
    pub stdout_log: PathBuf,
    /// Where the process's standard error goes.
    pub stderr_log: PathBuf,
}

/// A running (or exited) child process. Dropping it kills the process and reaps it.
pub struct ServerProcess {
    child: Child,
    exit: Option<ExitStatus>,
    listening: Option<tokio::sync::oneshot::Receiver<Result<SocketAddr, String>>>,
    stdout_log: PathBuf,
    stderr_log: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// All children are spawned by one thread that lives as long as the test process, because the
/// parent-death signal set below fires when the spawning *thread* exits.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("meta-tests-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the process spawner thread");
        Mutex::new(tx)
    })
}

impl ServerProcess {
    /// Starts the process. Its standard output is copied line by line to `stdout_log`; the first line
    /// `listening on ADDR` is reported to [`ServerProcess::listening`].
    pub fn spawn(spec: &LaunchSpec) -> anyhow::Result<ServerProcess> {
        let stderr = File::create(&spec.stderr_log)?;
        let mut command = Command::new(&spec.binary);
        command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        let parent = std::process::id();
        // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid).
        unsafe {
            command.pre_exec(move || {
                // The child gets SIGKILL when the test process dies, even by SIGKILL.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::other("test process exited during spawn"));
                }
                Ok(())
            });
        }
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| anyhow::anyhow!("spawner lock poisoned"))?
            .send((command, reply_tx))
            .map_err(|_| anyhow::anyhow!("spawner thread gone"))?;
        let mut child = reply_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("spawner thread gone"))?
            .map_err(|err| anyhow::anyhow!("spawn {}: {err}", spec.binary.display()))?;

        let stdout = child.stdout.take().expect("stdout is piped");
        let mut log = File::create(&spec.stdout_log)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("stdout-{}", child.id()))
            .spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(log, "{line}");
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        if let Some(tx) = tx.take() {
                            let text: String = rest
                                .trim_start()
                                .trim_start_matches("http://")
                                .chars()
                                .take_while(|c| {
                                    c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')
                                })
                                .collect();
                            let parsed = text
                                .parse::<SocketAddr>()
                                .map_err(|err| format!("bad address in {line:?}: {err}"));
                            let _ = tx.send(parsed);
                        }
                    }
                }
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Err(String::from(
                        "standard output closed before `listening on`",
                    )));
                }
            })?;
        Ok(ServerProcess {
            child,
            exit: None,
            listening: Some(rx),
            stdout_log: spec.stdout_log.clone(),
            stderr_log: spec.stderr_log.clone(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the `listening on ADDR` line and returns the address (at most once).
    pub async fn listening(&mut self, timeout: Duration) -> anyhow::Result<SocketAddr> {
        let rx = self
            .listening
            .take()
            .ok_or_else(|| anyhow::anyhow!("listening address already taken"))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(addr))) => Ok(addr),
            Ok(Ok(Err(err))) => anyhow::bail!(
                "pid {}: {err}; output:\n{}",
                self.pid(),
                self.output_tail(40)
            ),
            Ok(Err(_)) => anyhow::bail!("pid {}: output reader ended", self.pid()),
            Err(_) => anyhow::bail!(
                "pid {}: no `listening on` line within {timeout:?}; output:\n{}",
                self.pid(),
                self.output_tail(40)
            ),
        }
    }

    /// The exit status if the process has exited.
    pub fn try_exit(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait()?;
        }
        Ok(self.exit)
    }

    /// Waits (polling) until the process exits, at most `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit()? {
                return Ok(status);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "pid {} still running after {timeout:?}",
                self.pid()
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
    }

    /// SIGTERM, then wait up to `timeout` for a clean exit; SIGKILL after that. Returns the exit status.
    pub async fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if self.try_exit()?.is_none() {
            // SAFETY: plain kill(2) on our own child, which has not been reaped yet.
            unsafe {
                libc::kill(self.pid() as libc::pid_t, libc::SIGTERM);
            }
        }
        match self.wait_exit(timeout).await {
            Ok(status) => Ok(status),
            Err(err) => {
                self.kill();
                Err(err)
            }
        }
    }

    /// Everything the process wrote to standard output and standard error so far.
    pub fn output(&self) -> String {
        let mut text = read_lossy(&self.stdout_log);
        text.push_str(&read_lossy(&self.stderr_log));
        text
    }

    /// The last `lines` lines of the output.
    pub fn output_tail(&self, lines: usize) -> String {
        tail(&self.output(), lines)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
