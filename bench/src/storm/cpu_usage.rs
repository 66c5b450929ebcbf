//! CPU time of this process and of the servers over a measured window, from `/proc/<pid>/stat`,
//! to tell a CPU-bound run (the cores are busy) from a latency-bound one (they wait).

use std::time::Instant;

/// CPU seconds (user + system) used so far by `pid` (`None` for this process); zero when the
/// process is gone or the file cannot be read.
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // The command name may hold spaces; fields after its closing parenthesis are fixed.
    let Some(rest) = text.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks / hz
}

/// A reading of the CPU time of the client and the servers at one moment.
pub struct CpuUsage {
    at: Instant,
    client: f64,
    servers: Vec<(u32, f64)>,
}

/// Cores used on average between two readings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cores {
    /// This benchmark process.
    pub client: f64,
    /// The three servers together.
    pub servers: f64,
}

impl CpuUsage {
    /// Reads the CPU time of this process and of `server_pids` now.
    pub fn start(server_pids: &[u32]) -> CpuUsage {
        CpuUsage {
            at: Instant::now(),
            client: cpu_seconds(None),
            servers: server_pids
                .iter()
                .map(|&p| (p, cpu_seconds(Some(p))))
                .collect(),
        }
    }

    /// The cores used since `start`.
    pub fn cores(&self) -> Cores {
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let servers: f64 = self
            .servers
            .iter()
            .map(|&(p, before)| (cpu_seconds(Some(p)) - before).max(0.0))
            .sum();
        Cores {
            client: (cpu_seconds(None) - self.client).max(0.0) / wall,
            servers: servers / wall,
        }
    }
}
