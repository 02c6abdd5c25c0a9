//! `berth cri logs`: reads a container's CRI log file itself (its path from ContainerStatus),
//! stdout records to stdout and stderr records to stderr, partial records joined; `-f` follows
//! the file until the container stops running.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;
use jiff::Timestamp;
use k8s_cri::v1 as cri;

use super::crilog::{Budget, Line, Reader, Selection, Stream};
use super::{Context, rpc_error};

#[derive(clap::Args)]
pub struct Args {
    /// Follow log output.
    #[arg(short, long)]
    follow: bool,
    /// Print the logs of the previous instance of the container in the pod, if there is one.
    #[arg(short, long)]
    previous: bool,
    /// Number of lines to show from the end of the logs (-1: all).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    tail: i64,
    /// Maximum bytes of logs to return (-1: no limit).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    limit_bytes: i64,
    /// Show logs since a timestamp (2013-01-02T13:23:37Z) or for a duration (42m).
    #[arg(long)]
    since: Option<String>,
    /// Show timestamps.
    #[arg(short, long)]
    timestamps: bool,
    /// CONTAINER-ID; a unique prefix is enough.
    id: String,
}

/// How often a followed log is read again when it had nothing new.
const POLL: Duration = Duration::from_millis(100);
/// How often a followed container's state is checked while its log is quiet.
const STATE_CHECK: Duration = Duration::from_secs(1);

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let selection = Selection {
        since: args.since.as_deref().map(|s| parse_since(s, Timestamp::now())).transpose()?,
        tail: usize::try_from(args.tail).ok(),
        limit_bytes: usize::try_from(args.limit_bytes).ok(),
        timestamps: args.timestamps,
    };
    let status = container_status(ctx, &args.id).await?;
    if status.log_path.is_empty() {
        bail!("The container has not set log path");
    }
    let mut path = PathBuf::from(&status.log_path);
    if args.previous {
        let m = status.metadata.clone().unwrap_or_default();
        path = previous_log(&path, m.attempt)
            .ok_or_else(|| anyhow::anyhow!("Previous terminated container {} not found", m.name))?;
    }
    let mut file =
        std::fs::File::open(&path).map_err(|e| anyhow::anyhow!("failed to open log file {:?}: {e}", path))?;
    let mut reader = Reader::default();
    let mut lines = reader.feed(&read_rest(&mut file)?);
    if !args.follow {
        lines.extend(reader.finish());
        write(selection.apply(lines));
        return Ok(());
    }
    // What is already there goes through --tail; what comes later only through --since.
    let first = selection.apply(lines);
    let mut budget = Budget(selection.limit_bytes.map(|l| l.saturating_sub(first.iter().map(|(_, b)| b.len()).sum())));
    write(first);
    let id = status.id.clone();
    let mut last_check = Instant::now();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let bytes = read_rest(&mut file)?;
        if !bytes.is_empty() {
            if !emit(&mut budget, &selection, reader.feed(&bytes)) {
                return Ok(());
            }
            continue;
        }
        if rotated(&path, &mut file) {
            file = std::fs::File::open(&path)?;
            continue;
        }
        if last_check.elapsed() >= STATE_CHECK {
            last_check = Instant::now();
            let running =
                container_status(ctx, &id).await.map(|s| s.state == cri::ContainerState::ContainerRunning as i32);
            // Gone or stopped: what is in the file is all there will be.
            if !running.unwrap_or(false) {
                let mut rest = reader.feed(&read_rest(&mut file)?);
                rest.extend(reader.finish());
                emit(&mut budget, &selection, rest);
                return Ok(());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = &mut ctrl_c => return Ok(()),
        }
    }
}

async fn container_status(ctx: &Context, id: &str) -> anyhow::Result<cri::ContainerStatus> {
    let mut rt = ctx.runtime().await?;
    let req = cri::ContainerStatusRequest { container_id: id.into(), verbose: false };
    let r = rt.container_status(ctx.request(req)).await.map_err(rpc_error)?.into_inner();
    r.status.ok_or_else(|| anyhow::anyhow!("the runtime returned no status for container {id:?}"))
}

/// The log of attempt N-1 beside attempt N's (`<dir>/<attempt-1><ext>`, the kubelet's naming);
/// `None` for a first attempt.
fn previous_log(path: &Path, attempt: u32) -> Option<PathBuf> {
    let previous = attempt.checked_sub(1)?;
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    Some(path.with_file_name(format!("{previous}{ext}")))
}

fn read_rest(file: &mut std::fs::File) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Whether the path now names another file (rotated) or the file shrank (truncated).
fn rotated(path: &Path, file: &mut std::fs::File) -> bool {
    let (Ok(now), Ok(open)) = (std::fs::metadata(path), file.metadata()) else { return false };
    now.ino() != open.ino() || now.dev() != open.dev() || file.stream_position().is_ok_and(|pos| now.len() < pos)
}

/// Writes followed lines that pass `--since`, within `--limit-bytes`; false once the limit is hit.
fn emit(budget: &mut Budget, selection: &Selection, lines: Vec<Line>) -> bool {
    let mut out = Vec::new();
    for line in lines.iter().filter(|l| selection.wants(l)) {
        match budget.take(line.stream, line.render(selection.timestamps)) {
            Some(chunk) => out.push(chunk),
            None => {
                write(out);
                return false;
            }
        }
    }
    write(out);
    true
}

fn write(chunks: Vec<(Stream, Vec<u8>)>) {
    let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr().lock());
    for (stream, bytes) in chunks {
        // A closed pipe (`| head`) ends the output, not the verb with an error.
        let _ = match stream {
            Stream::Stdout => stdout.write_all(&bytes),
            Stream::Stderr => stderr.write_all(&bytes),
        };
    }
    let _ = stdout.flush();
    let _ = stderr.flush();
}

/// `--since` as docker and crictl take it: a duration back from now (`42m`, `1h30m`), a Unix
/// time (`1700000000.5`), an RFC 3339 time, or a local date and time.
pub fn parse_since(s: &str, now: Timestamp) -> anyhow::Result<Timestamp> {
    if let Ok(secs) = s.parse::<f64>() {
        let ns = (secs * 1e9) as i128;
        return Ok(Timestamp::from_nanosecond(ns)?);
    }
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    let tz = jiff::tz::TimeZone::system();
    if let Ok(dt) = s.parse::<jiff::civil::DateTime>() {
        return Ok(dt.to_zoned(tz)?.timestamp());
    }
    if let Ok(d) = s.parse::<jiff::civil::Date>() {
        return Ok(d.to_zoned(tz)?.timestamp());
    }
    match super::parse_duration(s) {
        Ok(d) => Ok(now.checked_sub(jiff::SignedDuration::try_from(d)?)?),
        Err(_) => bail!("invalid --since {s:?}: not a duration (42m), timestamp or date"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_unix_times_and_rfc3339() {
        let now: Timestamp = "2024-05-01T12:00:00Z".parse().unwrap();
        assert_eq!(parse_since("42m", now).unwrap().to_string(), "2024-05-01T11:18:00Z");
        assert_eq!(parse_since("1h30m", now).unwrap().to_string(), "2024-05-01T10:30:00Z");
        assert_eq!(parse_since("1700000000", now).unwrap().as_second(), 1_700_000_000);
        assert_eq!(parse_since("2024-01-02T13:23:37Z", now).unwrap().as_second(), 1_704_201_817);
        assert_eq!(parse_since("2024-01-02T13:23:37+01:00", now).unwrap().as_second(), 1_704_198_217);
        assert!(parse_since("2024-01-02T13:23:37", now).is_ok());
        assert!(parse_since("yesterday", now).is_err());
    }

    #[test]
    fn previous_logs_sit_beside_the_current_one() {
        let p = Path::new("/var/log/pods/x/app/2.log");
        assert_eq!(previous_log(p, 2), Some(PathBuf::from("/var/log/pods/x/app/1.log")));
        assert_eq!(previous_log(p, 0), None);
    }
}
