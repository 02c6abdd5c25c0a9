//! The CRI log format: `<RFC3339Nano> <stdout|stderr> <F|P> <content>\n` lines assembled from the
//! raw bytes of a container's streams, and the log file they are appended to.
//!
//! A line longer than the maximum is cut into pieces tagged `P` (partial), the last piece `F`
//! (full); text left unterminated when a stream ends is written as a last `F` piece, as containerd
//! does. Readers (the kubelet, `crictl logs`) join `P` pieces up to the next `F`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::time::push_rfc3339_nano;

/// containerd's default `max_container_log_line_size`.
pub const DEFAULT_MAX_LINE: usize = 16 * 1024;

/// A [`LogWriter`] writes when this many bytes are pending, which bounds its buffer.
const FLUSH_AT: usize = 32 * 1024;

/// Which of the container's streams a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn as_bytes(self) -> &'static [u8] {
        match self {
            Stream::Stdout => b"stdout",
            Stream::Stderr => b"stderr",
        }
    }
}

/// Failures of the log file.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("opening log file {path}")]
    Open { path: PathBuf, source: io::Error },
}

/// Turns one stream's bytes into CRI log lines. Holds at most one unfinished line.
#[derive(Debug)]
pub struct LineAssembler {
    stream: Stream,
    max_line: usize,
    pending: Vec<u8>,
}

impl LineAssembler {
    pub fn new(stream: Stream, max_line: usize) -> Self {
        LineAssembler { stream, max_line: max_line.max(1), pending: Vec::new() }
    }

    /// Adds bytes read from the stream; complete lines and full-size pieces go to `out`.
    pub fn push(&mut self, mut data: &[u8], out: &mut LogWriter) {
        while let Some(nl) = data.iter().position(|&b| b == b'\n') {
            self.append(&data[..nl], out);
            out.line(self.stream, b'F', &self.pending);
            self.pending.clear();
            data = &data[nl + 1..];
        }
        self.append(data, out);
    }

    /// The stream ended: what is left is written as the last, full piece.
    pub fn finish(&mut self, out: &mut LogWriter) {
        if !self.pending.is_empty() {
            out.line(self.stream, b'F', &self.pending);
            self.pending = Vec::new();
        }
    }

    fn append(&mut self, mut bytes: &[u8], out: &mut LogWriter) {
        while self.pending.len() + bytes.len() > self.max_line {
            let take = self.max_line - self.pending.len();
            self.pending.extend_from_slice(&bytes[..take]);
            out.line(self.stream, b'P', &self.pending);
            self.pending.clear();
            bytes = &bytes[take..];
        }
        self.pending.extend_from_slice(bytes);
    }
}

/// Where formatted lines go.
#[derive(Debug)]
pub enum Sink {
    /// Appended to the CRI log file.
    File(LogFile),
    /// Dropped (a container without a log path).
    Discard,
    /// Kept in memory (tests).
    #[cfg(test)]
    Memory,
}

/// Formats CRI log lines into a bounded buffer and writes them to a [`Sink`]. All lines of a
/// batch carry one timestamp (the time of the read that produced them).
#[derive(Debug)]
pub struct LogWriter {
    stamp: String,
    buf: Vec<u8>,
    sink: Sink,
}

impl LogWriter {
    pub fn new(sink: Sink) -> Self {
        LogWriter { stamp: String::new(), buf: Vec::new(), sink }
    }

    /// Starts a batch of lines read at `now`.
    pub fn stamp(&mut self, now: SystemTime) {
        self.stamp.clear();
        push_rfc3339_nano(&mut self.stamp, now);
    }

    fn line(&mut self, stream: Stream, tag: u8, content: &[u8]) {
        self.buf.extend_from_slice(self.stamp.as_bytes());
        self.buf.push(b' ');
        self.buf.extend_from_slice(stream.as_bytes());
        self.buf.extend_from_slice(&[b' ', tag, b' ']);
        self.buf.extend_from_slice(content);
        self.buf.push(b'\n');
        if self.buf.len() >= FLUSH_AT {
            self.flush();
        }
    }

    /// Writes what is pending. A failed write (a full disk) loses those lines but never stops the
    /// monitor: the container must not block on a pipe nobody reads.
    pub fn flush(&mut self) {
        match &mut self.sink {
            Sink::File(log) => {
                if !self.buf.is_empty() {
                    let _ = log.file.write_all(&self.buf);
                }
                self.buf.clear();
            }
            Sink::Discard => self.buf.clear(),
            #[cfg(test)]
            Sink::Memory => {}
        }
    }

    /// Reopens the log file (it was renamed away); on failure the old file keeps receiving lines.
    pub fn reopen(&mut self) -> Result<(), LogError> {
        self.flush();
        match &mut self.sink {
            Sink::File(log) => log.reopen(),
            _ => Ok(()),
        }
    }

    #[cfg(test)]
    fn contents(&self) -> &[u8] {
        &self.buf
    }
}

/// The CRI log file, opened for appending, reopened on request after rotation.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
}

impl LogFile {
    pub fn open(path: &Path) -> Result<Self, LogError> {
        Ok(LogFile { path: path.to_path_buf(), file: open_append(path)? })
    }

    fn reopen(&mut self) -> Result<(), LogError> {
        self.file = open_append(&self.path)?;
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
        .map_err(|source| LogError::Open { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn render(max_line: usize, chunks: &[&[u8]], finish: bool) -> String {
        let mut lines = LogWriter::new(Sink::Memory);
        lines.stamp(UNIX_EPOCH);
        let mut asm = LineAssembler::new(Stream::Stdout, max_line);
        for chunk in chunks {
            asm.push(chunk, &mut lines);
        }
        if finish {
            asm.finish(&mut lines);
        }
        String::from_utf8(lines.contents().to_vec()).unwrap().replace("1970-01-01T00:00:00.000000000Z ", "")
    }

    #[test]
    fn complete_lines_are_tagged_full() {
        assert_eq!(render(16, &[b"a\nbc\n\n"], false), "stdout F a\nstdout F bc\nstdout F \n");
    }

    #[test]
    fn a_line_split_across_reads_is_written_once_when_it_ends() {
        assert_eq!(render(16, &[b"he", b"llo", b"\nx"], false), "stdout F hello\n");
    }

    #[test]
    fn a_line_longer_than_the_maximum_is_cut_into_partial_pieces() {
        assert_eq!(render(4, &[b"abcdefghij\n"], false), "stdout P abcd\nstdout P efgh\nstdout F ij\n");
    }

    #[test]
    fn a_line_of_exactly_the_maximum_is_one_full_piece() {
        assert_eq!(render(4, &[b"ab", b"cd", b"\n"], false), "stdout F abcd\n");
    }

    #[test]
    fn unterminated_text_at_the_end_of_a_stream_is_a_last_full_piece() {
        assert_eq!(render(4, &[b"abcdef"], true), "stdout P abcd\nstdout F ef\n");
        assert_eq!(render(4, &[b"abc\n"], true), "stdout F abc\n");
    }

    #[test]
    fn stderr_lines_name_their_stream() {
        let mut lines = LogWriter::new(Sink::Memory);
        lines.stamp(UNIX_EPOCH);
        LineAssembler::new(Stream::Stderr, 8).push(b"oops\n", &mut lines);
        assert_eq!(lines.contents(), b"1970-01-01T00:00:00.000000000Z stderr F oops\n");
    }

    #[test]
    fn a_reopened_log_file_receives_the_lines_after_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        let mut log = LogWriter::new(Sink::File(LogFile::open(&path).unwrap()));
        log.stamp(UNIX_EPOCH);
        let mut asm = LineAssembler::new(Stream::Stdout, 64);
        asm.push(b"one\n", &mut log);
        log.flush();
        std::fs::rename(&path, dir.path().join("c.log.1")).unwrap();
        asm.push(b"two\n", &mut log);
        log.reopen().unwrap();
        asm.push(b"three\n", &mut log);
        log.flush();
        let old = std::fs::read_to_string(dir.path().join("c.log.1")).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        assert!(old.contains("stdout F one\n") && old.ends_with("stdout F two\n"), "{old}");
        assert!(new.ends_with("stdout F three\n") && !new.contains("two"), "{new}");
    }

    #[test]
    fn a_burst_of_short_lines_is_written_in_bounded_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        let mut log = LogWriter::new(Sink::File(LogFile::open(&path).unwrap()));
        log.stamp(UNIX_EPOCH);
        LineAssembler::new(Stream::Stdout, 64).push(&[b'\n'; 10_000], &mut log);
        assert!(log.buf.capacity() < 2 * FLUSH_AT, "{}", log.buf.capacity());
        log.flush();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 10_000);
    }
}
