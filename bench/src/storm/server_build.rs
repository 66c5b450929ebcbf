//! Builds the `metaserver` release binary with cargo and finds where cargo put it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The result of `cargo build --release -p metaserver`: the path of the release binary.
pub struct ServerBuild {
    /// The executable cargo reported for the `metaserver` binary target.
    pub binary: PathBuf,
}

impl ServerBuild {
    /// Runs `cargo build --release -p metaserver` in this workspace (compiler diagnostics go to the
    /// terminal) and returns the executable it produced.
    pub fn run() -> Result<ServerBuild> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        eprintln!("storm: cargo build --release -p metaserver");
        let mut child = Command::new(&cargo)
            .args([
                "build",
                "--release",
                "-p",
                "metaserver",
                "--bin",
                "metaserver",
                "--message-format=json-render-diagnostics",
            ])
            .current_dir(&workspace)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawn {:?} build", cargo))?;
        let stdout = child.stdout.take().context("cargo stdout")?;
        let mut binary = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.context("read cargo output")?;
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "metaserver" {
                if let Some(exe) = msg["executable"].as_str() {
                    binary = Some(PathBuf::from(exe));
                }
            }
        }
        let status = child.wait().context("wait for cargo build")?;
        if !status.success() {
            bail!("cargo build --release -p metaserver failed ({status})");
        }
        let binary = binary.context("cargo reported no executable for the metaserver binary")?;
        if !binary.is_file() {
            bail!("cargo reported {} but it is not a file", binary.display());
        }
        Ok(ServerBuild { binary })
    }
}
