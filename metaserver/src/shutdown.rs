//! SIGTERM and SIGINT, installed once at startup so that a signal that arrives while the node
//! is still opening is not lost.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// The shutdown signals of this process.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Starts listening for SIGTERM and SIGINT (replacing their default action).
    pub fn install() -> Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// Waits for the next signal and names it.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
