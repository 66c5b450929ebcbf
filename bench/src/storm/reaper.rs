//! Makes sure no server process outlives the benchmark: a registry of live child pids that a Ctrl-C
//! handler kills, and a parent-death signal set in every child. The handler also removes the
//! clusters' data dirs (a storm's holds about a gigabyte), which no destructor would.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Pids of the server processes that are running now.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Data dirs of the running clusters, to remove at an interruption.
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The process-wide registry of running children. Drop of a cluster handles the ordinary and the
/// panic paths; this covers Ctrl-C and SIGTERM, where no destructor runs.
pub struct Reaper;

impl Reaper {
    /// Installs the Ctrl-C / SIGTERM handler on the current tokio runtime: it kills every registered
    /// child, removes every registered dir and exits with status 130.
    pub fn install() {
        tokio::spawn(async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("storm: cannot watch SIGTERM: {e}");
                        return;
                    }
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            let killed = Reaper::kill_all();
            eprintln!("\nstorm: interrupted; killed {killed} server process(es)");
            Reaper::remove_dirs();
            std::process::exit(130);
        });
    }

    /// Makes `command`'s child receive SIGKILL when this process dies, however it dies.
    pub fn arm_parent_death_signal(command: &mut Command) {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches only the child's own state between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Records a started child.
    pub fn register(pid: u32) {
        CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    }

    /// Forgets a child that has been waited for (its pid may be reused).
    pub fn unregister(pid: u32) {
        CHILDREN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| *p != pid);
    }

    /// Records the data dir of a cluster, to remove if the benchmark is interrupted.
    pub fn register_dir(dir: &Path) {
        DIRS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(dir.to_path_buf());
    }

    /// Forgets a dir that its owner removes (or keeps).
    pub fn unregister_dir(dir: &Path) {
        DIRS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| d != dir);
    }

    /// Removes every registered dir. A killed server may still be exiting, its files open: a
    /// removal that fails is tried again for a while, then reported.
    fn remove_dirs() {
        let dirs = std::mem::take(&mut *DIRS.lock().unwrap_or_else(|e| e.into_inner()));
        for dir in dirs {
            let mut tries = 0;
            while let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() == std::io::ErrorKind::NotFound {
                    break;
                }
                tries += 1;
                if tries == 50 {
                    eprintln!("storm: could not remove {}: {e}", dir.display());
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Sends SIGKILL to every registered child; returns how many there were.
    pub fn kill_all() -> usize {
        let pids = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|e| e.into_inner()));
        for pid in &pids {
            // SAFETY: kill(2) with a pid of our own child; a stale pid at worst yields ESRCH.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
        pids.len()
    }
}
