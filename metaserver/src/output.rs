//! What commands print on stdout, a line at a time. A reader that goes away before the end
//! (`metaserver shards | head -1`) ends the command quietly, as it ends `cat` or `grep`,
//! rather than with a panic (`println!`) or an error message.

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
