//! The CRI container log format (`<RFC3339Nano> <stdout|stderr> <P|F>[:tags] <message>`, one
//! record a line): parsing, joining partial records into whole lines per stream, and the
//! selection `crictl logs` applies (`--since`, `--tail`, `--limit-bytes`, `--timestamps`).

use std::collections::VecDeque;

use jiff::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One record of the file.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub time: Timestamp,
    pub stream: Stream,
    /// `P`: the line continues in the next record of the same stream.
    pub partial: bool,
    pub message: &'a [u8],
}

#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    MissingField(&'static str),
    Timestamp(String),
    Stream(String),
    Tag(String),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::MissingField(what) => write!(f, "log record without {what}"),
            ParseError::Timestamp(t) => write!(f, "invalid timestamp {t:?}"),
            ParseError::Stream(s) => write!(f, "invalid stream type {s:?}"),
            ParseError::Tag(t) => write!(f, "invalid tag {t:?}"),
        }
    }
}

fn field<'a>(rest: &mut &'a [u8], what: &'static str) -> Result<&'a [u8], ParseError> {
    let end = rest.iter().position(|b| *b == b' ').ok_or(ParseError::MissingField(what))?;
    let (f, tail) = rest.split_at(end);
    *rest = &tail[1..];
    Ok(f)
}

/// Parses one record; `line` may still end in `\n`.
pub fn parse_record(line: &[u8]) -> Result<Record<'_>, ParseError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut rest = line;
    let time = field(&mut rest, "a timestamp")?;
    let time = std::str::from_utf8(time).map_err(|_| ParseError::Timestamp(String::from_utf8_lossy(time).into()))?;
    let time: Timestamp = time.parse().map_err(|_| ParseError::Timestamp(time.into()))?;
    let stream = match field(&mut rest, "a stream")? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        s => return Err(ParseError::Stream(String::from_utf8_lossy(s).into())),
    };
    // The tags are `P` or `F`, possibly followed by `:`-separated others; an empty message may
    // lose the space after them.
    let tags = match rest.iter().position(|b| *b == b' ') {
        Some(_) => field(&mut rest, "tags")?,
        None => std::mem::take(&mut rest),
    };
    let partial = match tags.split(|b| *b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return Err(ParseError::Tag(String::from_utf8_lossy(tags).into())),
    };
    Ok(Record { time, stream, partial, message: rest })
}

/// A whole line of one stream: partial records joined, `\n` at the end unless the stream ended
/// mid-line. `time` is its first record's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub time: Timestamp,
    pub stream: Stream,
    pub text: Vec<u8>,
}

impl Line {
    /// The bytes `crictl logs` writes for it: `--timestamps` puts the time first.
    pub fn render(&self, timestamps: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 36);
        if timestamps {
            out.extend_from_slice(rfc3339_nano(self.time).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&self.text);
        out
    }
}

/// Go's `time.RFC3339Nano` in UTC: fractional seconds without trailing zeros.
pub fn rfc3339_nano(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.fZ").to_string()
}

/// Turns file bytes, in chunks of any size, into whole lines.
#[derive(Default)]
pub struct Reader {
    /// Bytes after the last `\n` seen: a record still being written.
    unfinished: Vec<u8>,
    /// Partial records per stream (stdout, stderr) awaiting their final one.
    pending: [Option<Line>; 2],
    /// Records that did not parse, skipped as kubelet does.
    pub malformed: usize,
}

impl Reader {
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<Line> {
        let mut out = Vec::new();
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            let (line, rest) = bytes.split_at(end + 1);
            bytes = rest;
            if self.unfinished.is_empty() {
                self.record(line, &mut out);
            } else {
                let mut whole = std::mem::take(&mut self.unfinished);
                whole.extend_from_slice(line);
                self.record(&whole, &mut out);
            }
        }
        self.unfinished.extend_from_slice(bytes);
        out
    }

    fn record(&mut self, line: &[u8], out: &mut Vec<Line>) {
        let Ok(r) = parse_record(line) else {
            self.malformed += 1;
            return;
        };
        let slot = &mut self.pending[r.stream as usize];
        let line = slot.get_or_insert_with(|| Line { time: r.time, stream: r.stream, text: Vec::new() });
        line.text.extend_from_slice(r.message);
        if !r.partial {
            line.text.push(b'\n');
            out.extend(slot.take());
        }
    }

    /// The lines cut off when the log ends: partial records never finished, a record without
    /// its `\n`.
    pub fn finish(&mut self) -> Vec<Line> {
        let mut out = Vec::new();
        if !self.unfinished.is_empty() {
            let mut last = std::mem::take(&mut self.unfinished);
            last.push(b'\n');
            self.record(&last, &mut out);
        }
        out.extend(self.pending.iter_mut().filter_map(Option::take));
        out.sort_by_key(|l| l.time);
        out
    }
}

/// What `crictl logs` shows of a log.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only lines at or after this time.
    pub since: Option<Timestamp>,
    /// Only the last N lines; all when `None`.
    pub tail: Option<usize>,
    /// Stop after this many bytes of output.
    pub limit_bytes: Option<usize>,
    pub timestamps: bool,
}

impl Selection {
    pub fn wants(&self, line: &Line) -> bool {
        self.since.is_none_or(|s| line.time >= s)
    }

    /// The selected lines of a whole log, rendered, each with its stream.
    pub fn apply(&self, lines: impl IntoIterator<Item = Line>) -> Vec<(Stream, Vec<u8>)> {
        let mut kept: VecDeque<Line> = VecDeque::new();
        for line in lines.into_iter().filter(|l| self.wants(l)) {
            if self.tail == Some(0) {
                break;
            }
            kept.push_back(line);
            if self.tail.is_some_and(|n| kept.len() > n) {
                kept.pop_front();
            }
        }
        let mut budget = Budget(self.limit_bytes);
        kept.iter().map_while(|l| budget.take(l.stream, l.render(self.timestamps))).collect()
    }
}

/// What is left of `--limit-bytes`.
#[derive(Clone, Copy, Debug)]
pub struct Budget(pub Option<usize>);

impl Budget {
    /// `bytes` cut to what is left; `None` once nothing is.
    pub fn take(&mut self, stream: Stream, mut bytes: Vec<u8>) -> Option<(Stream, Vec<u8>)> {
        if let Some(left) = &mut self.0 {
            if *left == 0 {
                return None;
            }
            bytes.truncate(*left);
            *left -= bytes.len();
        }
        Some((stream, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2024-01-02T03:04:05.000000001Z stdout F hello
2024-01-02T03:04:06Z stderr P par
2024-01-02T03:04:06.5Z stdout F between
2024-01-02T03:04:07Z stderr P ti
2024-01-02T03:04:08Z stderr F al
2024-01-02T03:04:09+01:00 stdout F last one
";

    fn texts(lines: &[Line]) -> Vec<String> {
        lines.iter().map(|l| String::from_utf8_lossy(&l.text).into_owned()).collect()
    }

    #[test]
    fn records_parse_into_time_stream_tag_and_message() {
        let r = parse_record(b"2024-01-02T03:04:05.123456789Z stderr P:x a b \n").unwrap();
        assert_eq!(r.stream, Stream::Stderr);
        assert!(r.partial);
        assert_eq!(r.message, b"a b ");
        assert_eq!(rfc3339_nano(r.time), "2024-01-02T03:04:05.123456789Z");
        assert_eq!(parse_record(b"2024-01-02T03:04:05Z stdout F").unwrap().message, b"");
        assert_eq!(parse_record(b"2024-01-02T03:04:05Z stdout F ").unwrap().message, b"");
        assert!(matches!(parse_record(b"yesterday stdout F x"), Err(ParseError::Timestamp(_))));
        assert!(matches!(parse_record(b"2024-01-02T03:04:05Z stdin F x"), Err(ParseError::Stream(_))));
        assert!(matches!(parse_record(b"2024-01-02T03:04:05Z stdout X x"), Err(ParseError::Tag(_))));
        assert!(matches!(parse_record(b"2024-01-02T03:04:05Z"), Err(ParseError::MissingField(_))));
    }

    #[test]
    fn partial_records_join_per_stream_across_interleaving() {
        let mut r = Reader::default();
        let lines = r.feed(LOG.as_bytes());
        assert_eq!(texts(&lines), ["hello\n", "between\n", "partial\n", "last one\n"]);
        assert_eq!(lines[2].stream, Stream::Stderr);
        // A joined line carries its first record's time.
        assert_eq!(rfc3339_nano(lines[2].time), "2024-01-02T03:04:06Z");
        assert!(r.finish().is_empty());
    }

    #[test]
    fn chunks_split_anywhere_give_the_same_lines() {
        let whole = Reader::default().feed(LOG.as_bytes());
        for size in [1, 2, 7, 50] {
            let mut r = Reader::default();
            let lines: Vec<Line> = LOG.as_bytes().chunks(size).flat_map(|c| r.feed(c)).collect();
            assert_eq!(lines, whole, "chunks of {size}");
        }
    }

    #[test]
    fn a_log_ending_mid_line_yields_what_was_written() {
        let mut r = Reader::default();
        let lines = r.feed(b"2024-01-02T03:04:05Z stdout P abc\n2024-01-02T03:04:06Z stderr F no newline");
        assert!(lines.is_empty());
        assert_eq!(texts(&r.finish()), ["abc", "no newline\n"]);
    }

    #[test]
    fn malformed_records_are_skipped_and_counted() {
        let mut r = Reader::default();
        let lines = r.feed(b"garbage\n2024-01-02T03:04:05Z stdout F ok\n");
        assert_eq!(texts(&lines), ["ok\n"]);
        assert_eq!(r.malformed, 1);
    }

    #[test]
    fn tail_keeps_the_last_whole_lines() {
        let lines = Reader::default().feed(LOG.as_bytes());
        let sel = Selection { tail: Some(2), ..Default::default() };
        let out = sel.apply(lines.clone());
        assert_eq!(out, [(Stream::Stderr, b"partial\n".to_vec()), (Stream::Stdout, b"last one\n".to_vec())]);
        assert!(Selection { tail: Some(0), ..Default::default() }.apply(lines.clone()).is_empty());
        assert_eq!(Selection { tail: Some(99), ..Default::default() }.apply(lines).len(), 4);
    }

    #[test]
    fn since_timestamps_and_limit_bytes_shape_the_output() {
        let lines = Reader::default().feed(LOG.as_bytes());
        let since: Timestamp = "2024-01-02T03:04:06.5Z".parse().unwrap();
        let sel = Selection { since: Some(since), timestamps: true, ..Default::default() };
        let out = sel.apply(lines.clone());
        // `last one` was written at 02:04:09Z (+01:00), before `since`.
        assert_eq!(out, [(Stream::Stdout, b"2024-01-02T03:04:06.5Z between\n".to_vec())]);
        let sel = Selection { limit_bytes: Some(9), ..Default::default() };
        assert_eq!(sel.apply(lines), [(Stream::Stdout, b"hello\n".to_vec()), (Stream::Stdout, b"bet".to_vec())]);
    }
}
