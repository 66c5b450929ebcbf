//! SIGTERM, SIGINT and SIGHUP, installed once at startup so that a signal that arrives while
//! the node is still opening is not lost. SIGHUP (the terminal that started the process went
//! away) stops it as SIGTERM does, with the leadership handed over, rather than killing it at
//! once; a process started with SIGHUP ignored (`nohup`) keeps ignoring it.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The shutdown signals of this process.
pub struct Signals {
    term: Signal,
    int: Signal,
    /// `None` when SIGHUP was ignored at start.
    hup: Option<Signal>,
}

impl Signals {
    /// Starts listening for SIGTERM, SIGINT and (unless it is ignored) SIGHUP, replacing their
    /// default action.
    pub fn install() -> Result<Self> {
        let hup = if hangup_ignored() {
            None
        } else {
            Some(signal(SignalKind::hangup()).context("installing the SIGHUP handler")?)
        };
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            hup,
        })
    }

    /// Waits for the next signal and names it.
    pub async fn recv(&mut self) -> &'static str {
        let hup = async {
            match &mut self.hup {
                Some(hup) => hup.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = hup => "SIGHUP",
        }
    }
}

/// The exit status of a command that a signal named `name` ([`Signals::recv`]) stopped: 128
/// plus its number, as a shell reports a process the signal killed.
pub fn exit_status(name: &str) -> i32 {
    128 + match name {
        "SIGHUP" => libc::SIGHUP,
        "SIGTERM" => libc::SIGTERM,
        _ => libc::SIGINT,
    }
}

/// Whether SIGHUP is ignored (`nohup`, or a supervisor that asked for that).
fn hangup_ignored() -> bool {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only reads the
    // current one.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stopping_signal_gives_the_shells_exit_status() {
        assert_eq!(super::exit_status("SIGHUP"), 129);
        assert_eq!(super::exit_status("SIGINT"), 130);
        assert_eq!(super::exit_status("SIGTERM"), 143);
    }
}
