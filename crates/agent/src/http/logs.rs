//! Container logs as kubelet serves them: CRI log files parsed, partial lines joined, and
//! `tailLines`, `sinceSeconds`/`sinceTime`, `timestamps`, `limitBytes` and `follow` applied.
//!
//! A CRI log record is `<RFC3339Nano> <stdout|stderr> <P|F> <text>`; `P` pieces are joined per
//! stream up to the stream's next `F`. Unlike kubelet, `tailLines` counts joined lines rather than
//! file records, so a long line the runtime cut into pieces counts once. Following polls the file
//! (no inotify needed for a handful of readers), ends once the container is no longer running and
//! the file is drained, and moves to the new file when the log is rotated under the same path.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncSeekExt, BufReader};
use tokio::sync::mpsc;

/// How often a follower looks for new data at the end of the file.
const POLL: Duration = Duration::from_millis(100);
/// How often a follower waiting at the end of the file asks the runtime whether the container runs.
const RUNNING_CHECK: Duration = Duration::from_millis(500);
/// Output is sent to the client in chunks of about this size (or sooner, at the end of the file).
const CHUNK: usize = 32 * 1024;
/// A line still unfinished after this many bytes of `P` pieces is sent as it is, so a stream that
/// never ends its line cannot grow the reader's memory without bound.
const MAX_PENDING: usize = 1024 * 1024;

/// The stream a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Which streams a request wants (`stream=All|Stdout|Stderr`, kubelet's split-streams option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamFilter {
    #[default]
    All,
    Stdout,
    Stderr,
}

/// The query of a `/containerLogs` request (kubelet's `PodLogOptions`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    /// From `sinceSeconds` (relative to the request) or `sinceTime`.
    pub since: Option<Timestamp>,
    pub stream: StreamFilter,
}

/// A query parameter Kubernetes would refuse, with its validation message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOptions(pub String);

impl LogOptions {
    /// Parses the query pairs of a request made at `now`, validating as `ValidatePodLogOptions`.
    pub fn from_query(pairs: &[(String, String)], now: Timestamp) -> Result<LogOptions, InvalidOptions> {
        let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let int = |name: &str| -> Result<Option<i64>, InvalidOptions> {
            get(name)
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| InvalidOptions(format!("{name}: Invalid value: {v:?}: must be an integer")))
                })
                .transpose()
        };
        let mut opts = LogOptions {
            follow: get("follow").is_some_and(query_bool),
            previous: get("previous").is_some_and(query_bool),
            timestamps: get("timestamps").is_some_and(query_bool),
            ..LogOptions::default()
        };
        if let Some(n) = int("tailLines")? {
            if n < 0 {
                return Err(InvalidOptions(format!(
                    "tailLines: Invalid value: {n}: must be greater than or equal to 0"
                )));
            }
            opts.tail_lines = Some(n as u64);
        }
        if let Some(n) = int("limitBytes")? {
            if n < 1 {
                return Err(InvalidOptions(format!("limitBytes: Invalid value: {n}: must be greater than 0")));
            }
            opts.limit_bytes = Some(n as u64);
        }
        let since_seconds = int("sinceSeconds")?;
        let since_time = get("sinceTime");
        if since_seconds.is_some() && since_time.is_some() {
            return Err(InvalidOptions("at most one of `sinceTime` or `sinceSeconds` may be specified".into()));
        }
        if let Some(secs) = since_seconds {
            if secs < 1 {
                return Err(InvalidOptions(format!("sinceSeconds: Invalid value: {secs}: must be greater than 0")));
            }
            opts.since = Some(now.checked_sub(jiff::SignedDuration::from_secs(secs)).unwrap_or(Timestamp::MIN));
        }
        if let Some(text) = since_time {
            let at = text
                .parse::<Timestamp>()
                .map_err(|_| InvalidOptions(format!("sinceTime: Invalid value: {text:?}: must be an RFC 3339 time")))?;
            opts.since = Some(at);
        }
        opts.stream = match get("stream") {
            None | Some("" | "All") => StreamFilter::All,
            Some("Stdout") => StreamFilter::Stdout,
            Some("Stderr") => StreamFilter::Stderr,
            Some(other) => {
                return Err(InvalidOptions(format!(
                    "stream: Unsupported value: {other:?}: supported values: \"All\", \"Stderr\", \"Stdout\""
                )));
            }
        };
        if opts.stream != StreamFilter::All && opts.tail_lines.is_some() {
            return Err(InvalidOptions(
                "tailLines: Forbidden: `tailLines` and specific `stream` are mutually exclusive for now".into(),
            ));
        }
        Ok(opts)
    }
}

/// Query booleans as Kubernetes converts them: absent, `0` and `false` are false, anything else true.
pub fn query_bool(value: &str) -> bool {
    !(value == "0" || value.eq_ignore_ascii_case("false"))
}

/// One record of a CRI log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The timestamp as written, e.g. `2024-05-01T10:00:00.123456789Z`.
    pub timestamp: &'a str,
    pub time: Timestamp,
    pub stream: Stream,
    /// Tagged `P`: the line goes on in the stream's next record.
    pub partial: bool,
    /// The text, without the record's newline.
    pub content: &'a [u8],
}

/// Parses one record (without its newline); `None` for lines that are not in the CRI format.
pub fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let (timestamp, rest) = split_field(line)?;
    let timestamp = std::str::from_utf8(timestamp).ok()?;
    let time = timestamp.parse::<Timestamp>().ok()?;
    let (stream, rest) = split_field(rest)?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    // The tag field may carry more `:`-separated tags in the future; only the first counts.
    let (tags, content) = split_field(rest).unwrap_or((rest, b""));
    let partial = tags.split(|b| *b == b':').next() == Some(b"P");
    Some(Record { timestamp, time, stream, partial, content })
}

fn split_field(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = bytes.iter().position(|b| *b == b' ')?;
    Some((&bytes[..space], &bytes[space + 1..]))
}

/// A timestamp in kubelet's output format: nine fraction digits, the record's own offset.
pub fn fixed_timestamp(text: &str) -> String {
    let (date_time, zone) = match text.find(['Z', 'z', '+']).or_else(|| text.rfind('-').filter(|i| *i > 10)) {
        Some(i) => text.split_at(i),
        None => (text, "Z"),
    };
    let zone = if zone == "+00:00" || zone.eq_ignore_ascii_case("z") { "Z" } else { zone };
    let (whole, fraction) = date_time.split_once('.').unwrap_or((date_time, ""));
    let digits: String = fraction.chars().chain(std::iter::repeat('0')).take(9).collect();
    format!("{whole}.{digits}{zone}")
}

/// A log line as it will be served: joined pieces with the first piece's time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub time: Timestamp,
    /// In kubelet's output format.
    pub timestamp: String,
    pub stream: Stream,
    /// The text, ending in `\n` unless the line was left unfinished.
    pub text: Vec<u8>,
    /// Continues a line already served in part (too long to hold), so it gets no timestamp.
    pub continuation: bool,
}

/// Joins `P` pieces per stream into whole lines.
#[derive(Debug, Default)]
pub struct Joiner {
    pending: [Option<Line>; 2],
}

impl Joiner {
    /// Adds a record; returns the line it completes, if any.
    pub fn push(&mut self, record: &Record<'_>) -> Option<Line> {
        let slot = &mut self.pending[record.stream as usize];
        let line = slot.get_or_insert_with(|| Line {
            time: record.time,
            timestamp: fixed_timestamp(record.timestamp),
            stream: record.stream,
            text: Vec::new(),
            continuation: false,
        });
        line.text.extend_from_slice(record.content);
        if !record.partial {
            line.text.push(b'\n');
            return slot.take();
        }
        if line.text.len() >= MAX_PENDING {
            let done = slot.take();
            *slot = done.as_ref().map(|l| Line { text: Vec::new(), continuation: true, ..l.clone() });
            return done;
        }
        None
    }

    /// Lines left unfinished (the file ended inside them), oldest first.
    pub fn finish(&mut self) -> Vec<Line> {
        let mut lines: Vec<Line> =
            self.pending.iter_mut().filter_map(Option::take).filter(|l| !l.text.is_empty()).collect();
        lines.sort_by_key(|l| l.time);
        lines
    }
}

/// Renders lines for the client: the `since`, `stream`, `timestamps` and `limitBytes` options.
#[derive(Debug)]
pub struct Renderer {
    since: Option<Timestamp>,
    stream: StreamFilter,
    timestamps: bool,
    remaining: Option<u64>,
}

impl Renderer {
    pub fn new(opts: &LogOptions) -> Self {
        Renderer { since: opts.since, stream: opts.stream, timestamps: opts.timestamps, remaining: opts.limit_bytes }
    }

    /// Appends `line` as served to `out`; false once `limitBytes` is used up (nothing more to send).
    pub fn render(&mut self, line: &Line, out: &mut Vec<u8>) -> bool {
        if self.remaining == Some(0) {
            return false;
        }
        if self.since.is_some_and(|since| line.time < since) {
            return true;
        }
        let wanted = match self.stream {
            StreamFilter::All => true,
            StreamFilter::Stdout => line.stream == Stream::Stdout,
            StreamFilter::Stderr => line.stream == Stream::Stderr,
        };
        if !wanted {
            return true;
        }
        let start = out.len();
        if self.timestamps && !line.continuation {
            out.extend_from_slice(line.timestamp.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&line.text);
        if let Some(remaining) = &mut self.remaining {
            let written = (out.len() - start) as u64;
            if written >= *remaining {
                out.truncate(start + *remaining as usize);
                *remaining = 0;
                return false;
            }
            *remaining -= written;
        }
        true
    }
}

/// The offset where the last `n` lines of a CRI log file begin (joined lines, see the module doc).
///
/// Reads the file backwards in blocks, so tailing a large file reads only its end. The start is
/// never inside a line: when a stream's pieces straddle lines of the other stream, the output
/// begins with the whole straddling line and so holds a line or two more than asked.
pub fn tail_start(file: &std::fs::File, n: u64) -> io::Result<u64> {
    const BLOCK: u64 = 64 * 1024;
    let len = file.metadata()?.len();
    let ends_with_newline = len > 0 && {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, len - 1)?;
        last[0] == b'\n'
    };
    if n == 0 {
        // Only what is written from now on; an unterminated last record is still being written.
        return Ok(if ends_with_newline { len } else { last_newline_end(file, len)? });
    }
    let mut cut = TailCut::new(n);
    let mut block = vec![0u8; BLOCK as usize];
    let mut block_start = len;
    let mut block_len = 0usize;
    // The record being examined ends (before its newline) at `record_end`.
    let mut record_end = len;
    loop {
        for i in (0..block_len).rev() {
            if block[i] != b'\n' {
                continue;
            }
            let newline_at = block_start + i as u64;
            let start = newline_at + 1;
            if start < record_end {
                let unterminated = record_end == len && !ends_with_newline;
                let header = record_header(file, start, record_end, &block[..block_len], block_start)?;
                if let Some(found) = cut.visit(start, header, unterminated) {
                    return Ok(found);
                }
            }
            record_end = newline_at;
        }
        if block_start == 0 {
            break;
        }
        let next_start = block_start.saturating_sub(BLOCK);
        block_len = (block_start - next_start) as usize;
        file.read_exact_at(&mut block[..block_len], next_start)?;
        block_start = next_start;
    }
    if record_end > 0 {
        let unterminated = record_end == len && !ends_with_newline;
        let header = record_header(file, 0, record_end, &block[..block_len], 0)?;
        if let Some(found) = cut.visit(0, header, unterminated) {
            return Ok(found);
        }
    }
    Ok(cut.at_start_of_file())
}

/// The stream and `P` tag of the record [start, end), read from the block when it holds the header.
fn record_header(
    file: &std::fs::File,
    start: u64,
    end: u64,
    block: &[u8],
    block_start: u64,
) -> io::Result<Option<(Stream, bool)>> {
    let header_len = (end - start).min(64) as usize;
    let mut header = [0u8; 64];
    let header = &mut header[..header_len];
    if start >= block_start && (start - block_start) as usize + header_len <= block.len() {
        let at = (start - block_start) as usize;
        header.copy_from_slice(&block[at..at + header_len]);
    } else {
        file.read_exact_at(header, start)?;
    }
    Ok(parse_header(header))
}

/// The backward walk of [`tail_start`]: counts line ends from the end of the file and keeps the
/// latest record start at which a cut would break no stream's line.
struct TailCut {
    n: u64,
    counted: u64,
    seen: [bool; 2],
    /// A possible cut (a record start with at least `n` lines after it) and the streams whose
    /// record before it has not been seen yet: a `P` there would mean the cut breaks a line.
    candidate: Option<(u64, [bool; 2])>,
}

impl TailCut {
    fn new(n: u64) -> Self {
        TailCut { n, counted: 0, seen: [false; 2], candidate: None }
    }

    /// Visits the record starting at `start` (walking backwards); `Some(cut)` once it is known.
    fn visit(&mut self, start: u64, header: Option<(Stream, bool)>, unterminated: bool) -> Option<u64> {
        let (stream, partial) = header?;
        let partial = partial || unterminated;
        let s = stream as usize;
        if let Some((at, unknown)) = &mut self.candidate
            && unknown[s]
        {
            if partial {
                self.candidate = None; // this stream's line goes on past the cut
            } else {
                unknown[s] = false;
                if !unknown.iter().any(|u| *u) {
                    return Some(*at);
                }
            }
        }
        if !partial || !self.seen[s] {
            self.counted += 1; // a line end, or a line still unfinished at the end of the file
        }
        self.seen[s] = true;
        if self.counted >= self.n && self.candidate.is_none() {
            self.candidate = Some((start, [true; 2]));
        }
        None
    }

    fn at_start_of_file(&self) -> u64 {
        self.candidate.map_or(0, |(at, _)| at)
    }
}

/// The stream and `P` tag of a record header (timestamp, stream, tag); the content may be cut off.
fn parse_header(header: &[u8]) -> Option<(Stream, bool)> {
    let (_, rest) = split_field(header)?;
    let (stream, rest) = split_field(rest)?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let tags = split_field(rest).map_or(rest, |(t, _)| t);
    Some((stream, tags.split(|b| *b == b':').next() == Some(b"P")))
}

fn last_newline_end(file: &std::fs::File, len: u64) -> io::Result<u64> {
    let mut end = len;
    let mut block = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Asks the runtime whether the container still runs (a follower stops once it does not).
pub type RunningCheck = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Why a log could not be served.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("failed to open log file {path:?}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to read log file {path:?}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// An opened log, positioned where the requested output starts.
pub struct LogReader {
    path: PathBuf,
    file: tokio::fs::File,
    start: u64,
    opts: LogOptions,
}

impl LogReader {
    /// Opens the log at `path` and finds where `tailLines` starts; errors here come before any output.
    pub async fn open(path: PathBuf, opts: LogOptions) -> Result<LogReader, LogError> {
        let open_path = path.clone();
        let tail = opts.tail_lines;
        let opened = tokio::task::spawn_blocking(move || -> io::Result<(std::fs::File, u64)> {
            let file = std::fs::File::open(&open_path)?;
            let start = match tail {
                Some(n) => tail_start(&file, n)?,
                None => 0,
            };
            Ok((file, start))
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .map_err(|source| LogError::Open { path: path.clone(), source })?;
        Ok(LogReader { path, file: tokio::fs::File::from_std(opened.0), start: opened.1, opts })
    }

    /// Sends the log to `out` in chunks until it is done: at the end of the file, or (following)
    /// once the container stopped and the file is drained, or `limitBytes` is reached, or the
    /// receiver is gone.
    pub async fn stream(self, running: RunningCheck, out: mpsc::Sender<Bytes>) -> Result<(), LogError> {
        let LogReader { path, mut file, start, opts } = self;
        let read_err = |source| LogError::Read { path: path.clone(), source };
        file.seek(io::SeekFrom::Start(start)).await.map_err(read_err)?;
        let mut inode = file.metadata().await.map_err(read_err)?.ino();
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let mut joiner = Joiner::default();
        let mut renderer = Renderer::new(&opts);
        let mut record = Vec::new();
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut last_check: Option<Instant> = None;
        let mut draining = false;
        loop {
            let n = reader.read_until(b'\n', &mut record).await.map_err(read_err)?;
            if n > 0 && record.last() == Some(&b'\n') {
                record.pop();
                let more = emit_record(&record, &mut joiner, &mut renderer, &mut chunk);
                record.clear();
                if !more {
                    let _ = send(&out, &mut chunk).await;
                    return Ok(());
                }
                if chunk.len() >= CHUNK && !send(&out, &mut chunk).await {
                    return Ok(());
                }
                continue;
            }
            // The end of the file, possibly inside a record still being written.
            if !opts.follow || draining {
                let mut more = true;
                if !record.is_empty() {
                    more = emit_record(&record, &mut joiner, &mut renderer, &mut chunk);
                }
                if more {
                    for line in joiner.finish() {
                        if !renderer.render(&line, &mut chunk) {
                            break;
                        }
                    }
                }
                let _ = send(&out, &mut chunk).await;
                return Ok(());
            }
            if !send(&out, &mut chunk).await {
                return Ok(());
            }
            // Rotated: the path names a new file. What the old one held is read; go on in the new one.
            if let Ok(meta) = tokio::fs::metadata(&path).await
                && meta.ino() != inode
                && let Ok(next) = tokio::fs::File::open(&path).await
            {
                inode = meta.ino();
                reader = BufReader::with_capacity(64 * 1024, next);
                record.clear();
                continue;
            }
            if last_check.is_none_or(|at| at.elapsed() >= RUNNING_CHECK) {
                last_check = Some(Instant::now());
                if !running().await {
                    // Whatever the container wrote before it stopped is in the file: one more pass.
                    draining = true;
                    continue;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = out.closed() => return Ok(()),
            }
        }
    }
}

/// Parses one complete record into the output; false once nothing more may be written.
fn emit_record(record: &[u8], joiner: &mut Joiner, renderer: &mut Renderer, chunk: &mut Vec<u8>) -> bool {
    let Some(parsed) = parse_record(record) else {
        tracing::debug!(line = %String::from_utf8_lossy(record), "skipping a log line not in CRI format");
        return true;
    };
    match joiner.push(&parsed) {
        Some(line) => renderer.render(&line, chunk),
        None => true,
    }
}

/// Sends the pending chunk; false when the client is gone.
async fn send(out: &mpsc::Sender<Bytes>, chunk: &mut Vec<u8>) -> bool {
    if chunk.is_empty() {
        return !out.is_closed();
    }
    let data = Bytes::from(std::mem::take(chunk));
    out.send(data).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn opts(pairs: &[(&str, &str)]) -> Result<LogOptions, InvalidOptions> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LogOptions::from_query(&pairs, "2024-05-01T10:00:00Z".parse().unwrap())
    }

    const LOG: &str = "\
2024-05-01T09:00:00.000000001Z stdout F one
2024-05-01T09:00:01.5Z stderr F two
2024-05-01T09:00:02.000000003Z stdout P thr
2024-05-01T09:00:02.000000004Z stderr F err-between
2024-05-01T09:00:02.000000005Z stdout F ee
2024-05-01T09:59:30.000000000Z stdout F four
";

    fn render_all(text: &str, o: &LogOptions) -> String {
        let mut joiner = Joiner::default();
        let mut renderer = Renderer::new(o);
        let mut out = Vec::new();
        for record in text.lines() {
            if !emit_record(record.as_bytes(), &mut joiner, &mut renderer, &mut out) {
                break;
            }
        }
        for line in joiner.finish() {
            renderer.render(&line, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn records_parse_into_time_stream_tag_and_content() {
        let r = parse_record(b"2024-05-01T09:00:00.000000001Z stderr P  two spaces").unwrap();
        assert_eq!(r.stream, Stream::Stderr);
        assert!(r.partial);
        assert_eq!(r.content, b" two spaces");
        assert_eq!(r.time, "2024-05-01T09:00:00.000000001Z".parse::<Timestamp>().unwrap());
        let empty = parse_record(b"2024-05-01T09:00:00Z stdout F").unwrap();
        assert_eq!(empty.content, b"");
        assert!(!empty.partial);
        let tagged = parse_record(b"2024-05-01T09:00:00Z stdout F:x y").unwrap();
        assert_eq!((tagged.partial, tagged.content), (false, &b"y"[..]));
        assert!(parse_record(b"not a log line").is_none());
        assert!(parse_record(b"2024-05-01T09:00:00Z stdin F x").is_none());
    }

    #[test]
    fn partial_pieces_are_joined_per_stream_and_the_prefix_is_stripped() {
        assert_eq!(render_all(LOG, &LogOptions::default()), "one\ntwo\nerr-between\nthree\nfour\n");
    }

    #[test]
    fn timestamps_are_printed_as_kubelet_prints_them_with_the_first_pieces_time() {
        let out = render_all(LOG, &LogOptions { timestamps: true, ..Default::default() });
        assert_eq!(
            out,
            "2024-05-01T09:00:00.000000001Z one\n\
             2024-05-01T09:00:01.500000000Z two\n\
             2024-05-01T09:00:02.000000004Z err-between\n\
             2024-05-01T09:00:02.000000003Z three\n\
             2024-05-01T09:59:30.000000000Z four\n"
        );
        assert_eq!(fixed_timestamp("2016-10-06T00:17:09.669794202+02:00"), "2016-10-06T00:17:09.669794202+02:00");
        assert_eq!(fixed_timestamp("2016-10-06T00:17:09-07:00"), "2016-10-06T00:17:09.000000000-07:00");
        assert_eq!(fixed_timestamp("2016-10-06T00:17:09.1+00:00"), "2016-10-06T00:17:09.100000000Z");
    }

    #[test]
    fn since_seconds_and_since_time_skip_older_lines() {
        let recent = opts(&[("sinceSeconds", "60")]).unwrap();
        assert_eq!(render_all(LOG, &recent), "four\n");
        let since = opts(&[("sinceTime", "2024-05-01T09:00:01Z")]).unwrap();
        assert_eq!(render_all(LOG, &since), "two\nerr-between\nthree\nfour\n");
    }

    #[test]
    fn limit_bytes_cuts_the_output_mid_line() {
        let o = opts(&[("limitBytes", "6")]).unwrap();
        assert_eq!(render_all(LOG, &o), "one\ntw");
    }

    #[test]
    fn stream_selects_one_stream() {
        let o = opts(&[("stream", "Stderr")]).unwrap();
        assert_eq!(render_all(LOG, &o), "two\nerr-between\n");
    }

    #[test]
    fn an_unfinished_last_line_is_served_without_a_newline() {
        let text = "2024-05-01T09:00:00Z stdout F a\n2024-05-01T09:00:01Z stdout P b";
        assert_eq!(render_all(text, &LogOptions::default()), "a\nb");
    }

    #[test]
    fn a_never_ending_partial_line_is_sent_in_bounded_parts() {
        let mut joiner = Joiner::default();
        let piece = "x".repeat(16 * 1024);
        let record = format!("2024-05-01T09:00:00Z stdout P {piece}");
        let mut emitted = Vec::new();
        for _ in 0..70 {
            emitted.extend(joiner.push(&parse_record(record.as_bytes()).unwrap()));
        }
        assert_eq!(emitted.len(), 1);
        assert_eq!(emitted[0].text.len(), MAX_PENDING);
        assert!(!emitted[0].continuation);
        let rest = joiner.finish();
        assert!(rest[0].continuation, "the rest continues the line without a second timestamp");
    }

    #[test]
    fn invalid_options_get_kubernetes_validation_messages() {
        assert_eq!(
            opts(&[("tailLines", "-1")]).unwrap_err().0,
            "tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(opts(&[("limitBytes", "0")]).unwrap_err().0, "limitBytes: Invalid value: 0: must be greater than 0");
        assert_eq!(
            opts(&[("sinceSeconds", "5"), ("sinceTime", "2024-05-01T09:00:01Z")]).unwrap_err().0,
            "at most one of `sinceTime` or `sinceSeconds` may be specified"
        );
        assert!(opts(&[("sinceTime", "yesterday")]).is_err());
        let o = opts(&[("follow", "true"), ("previous", "1"), ("timestamps", "false"), ("tailLines", "3")]).unwrap();
        assert!(o.follow && o.previous && !o.timestamps);
        assert_eq!(o.tail_lines, Some(3));
    }

    fn file_with(text: &str) -> (tempfile::NamedTempFile, std::fs::File) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        let file = std::fs::File::open(f.path()).unwrap();
        (f, file)
    }

    fn tail(text: &str, n: u64) -> String {
        let (_keep, file) = file_with(text);
        let start = tail_start(&file, n).unwrap() as usize;
        render_all(&text[start..], &LogOptions::default())
    }

    #[test]
    fn tail_counts_joined_lines_from_the_end() {
        assert_eq!(tail(LOG, 1), "four\n");
        // `err-between` sits between the pieces of `three`: two lines cannot start without it.
        assert_eq!(tail(LOG, 2), "err-between\nthree\nfour\n");
        assert_eq!(tail(LOG, 3), "err-between\nthree\nfour\n");
        assert_eq!(tail(LOG, 4), "two\nerr-between\nthree\nfour\n");
        assert_eq!(tail(LOG, 100), render_all(LOG, &LogOptions::default()));
        assert_eq!(tail(LOG, 0), "");
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn tail_reaches_across_blocks_of_a_large_file() {
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!("2024-05-01T09:00:00.000000000Z stdout F line {i}\n"));
        }
        assert_eq!(tail(&text, 2), "line 19998\nline 19999\n");
        let out = tail(&text, 15_000);
        assert!(out.starts_with("line 5000\n") && out.ends_with("line 19999\n"), "{}", &out[..40]);
    }

    #[test]
    fn tail_counts_an_unfinished_last_line() {
        let text =
            "2024-05-01T09:00:00Z stdout F a\n2024-05-01T09:00:00Z stdout F b\n2024-05-01T09:00:01Z stdout P c\n";
        assert_eq!(tail(text, 1), "c");
        assert_eq!(tail(text, 2), "b\nc");
    }

    fn running_while(flag: Arc<AtomicBool>) -> RunningCheck {
        Arc::new(move || {
            let flag = flag.clone();
            Box::pin(async move { flag.load(Ordering::SeqCst) })
        })
    }

    async fn collect(mut rx: mpsc::Receiver<Bytes>) -> String {
        let mut all = Vec::new();
        while let Some(b) = rx.recv().await {
            all.extend_from_slice(&b);
        }
        String::from_utf8(all).unwrap()
    }

    #[tokio::test]
    async fn following_serves_new_lines_and_ends_once_the_container_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2024-05-01T09:00:00Z stdout F first\n").unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let reader = LogReader::open(path.clone(), LogOptions { follow: true, ..Default::default() }).await.unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(reader.stream(running_while(running.clone()), tx));
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"first\n"));
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        // A record written in two parts is served once complete.
        f.write_all(b"2024-05-01T09:00:01Z stdout F sec").unwrap();
        f.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        f.write_all(b"ond\n").unwrap();
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"second\n"));
        f.write_all(b"2024-05-01T09:00:02Z stdout F last words\n").unwrap();
        running.store(false, Ordering::SeqCst);
        assert_eq!(collect(rx).await, "last words\n");
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
    }

    #[tokio::test]
    async fn following_moves_to_the_new_file_after_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2024-05-01T09:00:00Z stdout F old\n").unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let reader = LogReader::open(path.clone(), LogOptions { follow: true, ..Default::default() }).await.unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(reader.stream(running_while(running.clone()), tx));
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"old\n"));
        std::fs::rename(&path, dir.path().join("0.log.20240501-090001")).unwrap();
        std::fs::write(&path, "2024-05-01T09:00:01Z stdout F new\n").unwrap();
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"new\n"));
        running.store(false, Ordering::SeqCst);
        assert_eq!(collect(rx).await, "");
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn following_with_tail_zero_serves_only_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, LOG).unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let o = LogOptions { follow: true, tail_lines: Some(0), ..Default::default() };
        let reader = LogReader::open(path.clone(), o).await.unwrap();
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::spawn(reader.stream(running_while(running.clone()), tx));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"2024-05-01T10:00:00Z stdout F fresh\n").unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        running.store(false, Ordering::SeqCst);
        assert_eq!(collect(rx).await, "fresh\n");
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_missing_log_file_is_an_open_error_naming_the_path() {
        let err = LogReader::open(PathBuf::from("/nonexistent/0.log"), LogOptions::default()).await.err().unwrap();
        assert_eq!(err.to_string(), "failed to open log file \"/nonexistent/0.log\"");
    }
}
