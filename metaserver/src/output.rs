//! What commands print on stdout, a line at a time. A reader that goes away before the end
//! (`metaserver shards | head -1`) ends the command quietly, as it ends `cat` or `grep`,
//! rather than with a panic (`println!`) or an error message; a `watch` waiting for changes
//! notices within a second.

use std::fmt::Display;
use std::io::{self, Write};

/// The error of a command whose stdout was closed by its reader: `main` exits quietly on it.
#[derive(Debug)]
pub(crate) struct ReaderGone;

impl std::fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for ReaderGone {}

/// Prints `text` and a newline, flushed, so that a reader sees the line at once.
pub(crate) fn line(text: impl Display) -> anyhow::Result<()> {
    lines([text])
}

/// Prints each of `texts` on a line of its own, then flushes.
pub(crate) fn lines<T: Display>(texts: impl IntoIterator<Item = T>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    texts
        .into_iter()
        .try_for_each(|text| writeln!(out, "{text}"))
        .and_then(|()| out.flush())
        .map_err(failed)
}

/// Prints each of `items` as JSON on a line of its own, then flushes.
pub(crate) fn json_lines<T: serde::Serialize>(items: &[T]) -> anyhow::Result<()> {
    let texts: Vec<String> = items
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    lines(texts)
}

/// How often [`until_reader_gone`] looks.
const READER_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Ends (with [`ReaderGone`]) once the reader of stdout went away: stdout is a pipe whose
/// reading end was closed. Looked at every second; a terminal or a file never ends it.
pub(crate) async fn until_reader_gone() -> anyhow::Error {
    let mut ticks = tokio::time::interval(READER_CHECK);
    loop {
        ticks.tick().await;
        if reader_gone_now() {
            return anyhow::Error::new(ReaderGone);
        }
    }
}

/// Whether stdout is a pipe that nobody reads any more (`poll` reports an error on it).
fn reader_gone_now() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, and a timeout of 0: poll only reports its state.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready > 0 && fd.revents & libc::POLLERR != 0
}

/// Whether `e` ends a command because its reader went away.
pub(crate) fn reader_gone(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| cause.is::<ReaderGone>())
}

fn failed(e: io::Error) -> anyhow::Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe => anyhow::Error::new(ReaderGone),
        _ => anyhow::Error::new(e).context("writing to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_pipe_is_a_reader_gone() {
        let gone = failed(io::Error::from(io::ErrorKind::BrokenPipe)).context("watching");
        assert!(reader_gone(&gone));
        let full = failed(io::Error::from(io::ErrorKind::StorageFull));
        assert!(!reader_gone(&full));
        assert!(full.to_string().contains("writing to stdout"), "{full}");
    }
}
