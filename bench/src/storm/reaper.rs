//! Makes sure no server process outlives the benchmark: a registry of live child pids that a Ctrl-C
//! handler kills, and a parent-death signal set in every child.

use std::process::Command;
use std::sync::Mutex;

/// Pids of the server processes that are running now.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The process-wide registry of running children. Drop of a cluster handles the ordinary and the
/// panic paths; this covers Ctrl-C and SIGTERM, where no destructor runs.
pub struct Reaper;

impl Reaper {
    /// Installs the Ctrl-C / SIGTERM handler on the current tokio runtime: it kills every registered
    /// child and exits with status 130.
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
