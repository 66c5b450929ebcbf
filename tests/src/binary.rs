//! Locating the `metaserver` binary, built once per test process with the same profile as the tests.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

/// Overrides the binary that the tests start (skips the build).
pub const BINARY_ENV: &str = "META_TEST_METASERVER_BIN";

static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The path of the `metaserver` binary, built on first use.
///
/// The binary lives next to the test executable's profile directory (`target/<profile>/metaserver`).
/// The first call runs `cargo build -p metaserver` for that profile and target directory, so that a
/// plain `cargo test` from a clean clone tests the current sources; later calls return the cached path.
pub fn metaserver_binary() -> anyhow::Result<PathBuf> {
    BINARY
        .get_or_init(|| locate_and_build().map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(|err| anyhow::anyhow!("metaserver binary unavailable: {err}"))
}

fn locate_and_build() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var(BINARY_ENV) {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "{BINARY_ENV}={} is not a file",
            path.display()
        );
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow::anyhow!("unexpected test executable path {}", exe.display()))?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| anyhow::anyhow!("unexpected profile directory {}", profile_dir.display()))?;
    let profile = profile_dir
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| anyhow::anyhow!("unexpected profile directory {}", profile_dir.display()))?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| anyhow::anyhow!("tests package has no parent folder"))?;

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo"));
    let mut build = Command::new(cargo);
    build
        .arg("build")
        .arg("-p")
        .arg("metaserver")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    match profile {
        "debug" => {}
        "release" => {
            build.arg("--release");
        }
        other => {
            build.arg("--profile").arg(other);
        }
    }
    // Output is shown only when the build fails, so other packages' warnings stay out of the tests.
    let started = Instant::now();
    let output = build.output()?;
    // Past the harness's capture: a build from scratch takes a minute or more, and without this
    // line the first scenario of a run looks that slow.
    let _ = writeln!(
        std::io::stderr(),
        "meta-tests: `cargo build -p metaserver` ({profile}) took {:.1?} before the first scenario",
        started.elapsed()
    );
    anyhow::ensure!(
        output.status.success(),
        "cargo build -p metaserver failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let binary = profile_dir.join("metaserver");
    anyhow::ensure!(
        binary.is_file(),
        "{} missing after the build",
        binary.display()
    );
    Ok(binary)
}
