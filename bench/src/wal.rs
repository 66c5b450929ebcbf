//! WAL benchmark (placeholder).
pub fn run(_args: &[String]) -> anyhow::Result<()> { Ok(()) }
