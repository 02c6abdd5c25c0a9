//! Memory and CPU of the processes of a run over time: the server, the bench itself and etcd
//! (where it runs), read from `/proc` once a second.

use std::time::{Duration, Instant};

use crate::agent::cluster::{ProcMemory, cpu_time};

/// How often the processes are read.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One process's reading.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    pub rss_kib: u64,
    pub cpu: Duration,
    /// Open file descriptors (mostly the connections of the watches).
    pub fds: usize,
}

impl Reading {
    fn read(pid: u32) -> Option<Self> {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
        Some(Self { rss_kib: ProcMemory::read(pid).ok()?.rss, cpu: cpu_time(pid).ok()?, fds })
    }
}

/// The readings of one second: per process, in the order of the sampler's pids.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Duration,
    pub readings: Vec<Option<Reading>>,
}

/// A process's memory and CPU over a window of the run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// End of the window, since the sampler started.
    pub at: Duration,
    pub rss_mib: f64,
    /// CPU used in the window ÷ its length: 1.0 is one core busy.
    pub cores: f64,
}

/// Reads the processes `pids` every [`SAMPLE_EVERY`] until aborted.
pub fn sample(
    pids: Vec<u32>,
    origin: Instant,
) -> (std::sync::Arc<std::sync::Mutex<Vec<Sample>>>, tokio::task::JoinHandle<()>) {
    let samples: std::sync::Arc<std::sync::Mutex<Vec<Sample>>> = Default::default();
    let out = samples.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tick.tick().await;
            let readings = pids.iter().map(|&p| Reading::read(p)).collect();
            out.lock().unwrap().push(Sample { at: origin.elapsed(), readings });
        }
    });
    (samples, task)
}

/// Process `p`'s series in windows of `every`: RSS at the window's end, cores used within it.
pub fn windows(samples: &[Sample], p: usize, every: Duration) -> Vec<Window> {
    let readings: Vec<(Duration, Reading)> =
        samples.iter().filter_map(|s| s.readings.get(p).copied().flatten().map(|r| (s.at, r))).collect();
    let mut out = Vec::new();
    let Some(&(mut start_at, mut start)) = readings.first() else { return out };
    for &(at, r) in &readings[1..] {
        let last = readings.last().map(|l| l.0) == Some(at);
        if at - start_at >= every || last {
            let span = (at - start_at).as_secs_f64();
            let cores = if span > 0.0 { r.cpu.saturating_sub(start.cpu).as_secs_f64() / span } else { 0.0 };
            out.push(Window { at, rss_mib: r.rss_kib as f64 / 1024.0, cores });
            (start_at, start) = (at, r);
        }
    }
    out
}

/// Process `p`'s most open file descriptors.
pub fn peak_fds(samples: &[Sample], p: usize) -> Option<usize> {
    samples.iter().filter_map(|s| s.readings.get(p).copied().flatten()).map(|r| r.fds).max()
}

/// Process `p`'s peak RSS in MiB and its mean cores over all samples.
pub fn peak_and_mean(samples: &[Sample], p: usize) -> (Option<f64>, Option<f64>) {
    let readings: Vec<(Duration, Reading)> =
        samples.iter().filter_map(|s| s.readings.get(p).copied().flatten().map(|r| (s.at, r))).collect();
    let peak = readings.iter().map(|(_, r)| r.rss_kib).max().map(|k| k as f64 / 1024.0);
    let mean = match (readings.first(), readings.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => {
            Some(b.1.cpu.saturating_sub(a.1.cpu).as_secs_f64() / (b.0 - a.0).as_secs_f64())
        }
        _ => None,
    };
    (peak, mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64, rss_kib: u64, cpu_ms: u64) -> Sample {
        Sample {
            at: Duration::from_secs(secs),
            readings: vec![Some(Reading { rss_kib, cpu: Duration::from_millis(cpu_ms), fds: 10 })],
        }
    }

    #[test]
    fn windows_give_rss_at_their_end_and_cores_used_within() {
        let samples: Vec<Sample> = (0..=25).map(|t| s(t, 1024 * (t + 1), t * 500)).collect();
        let w = windows(&samples, 0, Duration::from_secs(10));
        assert_eq!(w.len(), 3);
        assert_eq!(w[0].at, Duration::from_secs(10));
        assert!((w[0].cores - 0.5).abs() < 1e-9);
        assert!((w[0].rss_mib - 11.0).abs() < 1e-9);
        assert_eq!(w[2].at, Duration::from_secs(25), "the last, shorter window is kept");
        let (peak, mean) = peak_and_mean(&samples, 0);
        assert_eq!(peak, Some(26.0));
        assert!((mean.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(peak_fds(&samples, 0), Some(10));
        assert!(windows(&samples, 1, Duration::from_secs(10)).is_empty());
    }
}
