//! `berth-bench image`: image pull and unpack throughput from a loopback registry, next to
//! `skopeo copy` of the same image measured in the same run (issue 3, acceptance 5).
//!
//! Per run: (a) `skopeo copy docker://HOST/big:1.0 dir:…` — download and store the blobs, no
//! unpacking; (b) [`Images::pull`] into a fresh store — download, verify, unpack. From (b)'s
//! progress events (`Downloaded`, then `Unpacked`, per layer) the unpacking is timed apart:
//! each layer unpacks between its two events, several layers at once.
//!
//! Figures are printed (and written as JSON with `--json`), never asserted.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use berth_image::{Images, ImagesConfig, Platform, Progress};
use berth_testenv::Registry;
use berth_testenv::images::Image;
use serde_json::json;

/// Pull throughput berth aims at, relative to `skopeo copy`.
pub const PULL_VS_SKOPEO_TARGET: f64 = 1.0;
/// Unpack throughput berth aims at, MB/s of uncompressed layer data.
pub const UNPACK_TARGET_MB_S: f64 = 200.0;
const MB: f64 = 1e6;

#[derive(clap::Args)]
pub struct ImageArgs {
    /// Image size in MB (of incompressible data; compressed and uncompressed sizes are close).
    #[arg(long, default_value_t = 100)]
    size_mb: usize,
    /// Layers the data is split into (gzip each).
    #[arg(long, default_value_t = 5)]
    layers: usize,
    /// Runs of each measurement; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The skopeo binary.
    #[arg(long, default_value = "skopeo")]
    skopeo: PathBuf,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One run's timings.
#[derive(Debug, Clone, Copy)]
struct Run {
    skopeo: Duration,
    /// `Images::pull` from call to return: resolve, download, verify, unpack.
    pull: Duration,
    /// From the call to the last layer's `Downloaded`.
    download: Duration,
    /// Time during which at least one layer was unpacking.
    unpack_wall: Duration,
    /// Per-layer unpack times added up (one unpacker's speed).
    unpack_layers_sum: Duration,
}

/// Total length of the union of `intervals`.
fn union_length(mut intervals: Vec<(Instant, Instant)>) -> Duration {
    intervals.sort();
    let mut total = Duration::ZERO;
    let mut current: Option<(Instant, Instant)> = None;
    for (start, end) in intervals {
        current = match current {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                total += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total + current.map_or(Duration::ZERO, |(s, e)| e - s)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn rate(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / MB / d.as_secs_f64()
}

async fn skopeo_copy(skopeo: &PathBuf, reference: &str) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("image");
    let started = Instant::now();
    let out = tokio::process::Command::new(skopeo)
        .args(["--insecure-policy", "copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .arg(format!("dir:{}", dest.display()))
        .output()
        .await
        .with_context(|| format!("running {} (scripts/install-deps.sh installs it)", skopeo.display()))?;
    let elapsed = started.elapsed();
    ensure!(out.status.success(), "skopeo copy failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(elapsed)
}

/// Pulls `reference` into a fresh store; returns (pull, download, unpack wall, unpack sum).
async fn berth_pull(reference: &str, image: &Image) -> anyhow::Result<(Duration, Duration, Duration, Duration)> {
    let dir = tempfile::tempdir()?;
    let images = Images::open(ImagesConfig {
        root: dir.path().join("images"),
        handlers: BTreeMap::from([("runc".to_string(), Platform::host())]),
        default_handler: "runc".into(),
        registries: BTreeMap::new(),
    })?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Stamped as they arrive: the receiver runs on another worker thread, microseconds behind.
    let collector = tokio::spawn(async move {
        let mut events = Vec::new();
        while let Some(p) = rx.recv().await {
            events.push((Instant::now(), p));
        }
        events
    });
    let started = Instant::now();
    let record = images.pull(reference, "", None, Some(tx)).await.with_context(|| format!("pulling {reference}"))?;
    let pull = started.elapsed();
    let events = collector.await?;
    ensure!(record.id == image.config_digest, "pulled {} instead of {}", record.id, image.config_digest);

    let mut downloaded: HashMap<String, Instant> = HashMap::new();
    let mut unpacks = Vec::new();
    for (at, event) in events {
        match event {
            Progress::Downloaded { digest } => {
                downloaded.insert(digest, at);
            }
            Progress::Unpacked { digest } => {
                let from = *downloaded.get(&digest).context("Unpacked before Downloaded")?;
                unpacks.push((from, at));
            }
            _ => {}
        }
    }
    ensure!(
        unpacks.len() == image.layers.len(),
        "{} of {} layers reported unpacked",
        unpacks.len(),
        image.layers.len()
    );
    let last_download = downloaded.values().max().context("no layer downloaded")?;
    let download = *last_download - started;
    let unpack_sum = unpacks.iter().map(|(s, e)| *e - *s).sum();
    let unpack_wall = union_length(unpacks);
    drop(images);
    Ok((pull, download, unpack_wall, unpack_sum))
}

pub async fn run(args: ImageArgs) -> anyhow::Result<()> {
    ensure!(args.size_mb > 0 && args.layers > 0 && args.runs > 0, "--size-mb, --layers and --runs must be positive");
    ensure!(args.size_mb >= args.layers, "--size-mb must be at least --layers");
    let started = Instant::now();
    eprintln!("starting docker-registry on loopback");
    let registry = Registry::start();
    eprintln!("building and pushing a {} MB image in {} gzip layers", args.size_mb, args.layers);
    let (size_mb, layers) = (args.size_mb, args.layers);
    let image =
        tokio::task::spawn_blocking(move || berth_testenv::standard::big_image_in_layers(size_mb, layers)).await?;
    let pushed = registry.push_image("big", "1.0", &image).await;
    let reference = pushed.reference.clone();
    let compressed = image.layers_size();
    let uncompressed: u64 = image.layers.iter().map(|l| l.uncompressed_size).sum();

    let mut runs = Vec::new();
    for i in 1..=args.runs {
        eprintln!("run {i}/{}: skopeo copy", args.runs);
        let skopeo = skopeo_copy(&args.skopeo, &reference).await?;
        eprintln!("run {i}/{}: berth pull", args.runs);
        let (pull, download, unpack_wall, unpack_layers_sum) = berth_pull(&reference, &image).await?;
        runs.push(Run { skopeo, pull, download, unpack_wall, unpack_layers_sum });
    }
    drop(registry);

    let report = Report { size_mb: args.size_mb, layers: args.layers, compressed, uncompressed, reference, runs };
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

struct Report {
    size_mb: usize,
    layers: usize,
    compressed: u64,
    uncompressed: u64,
    reference: String,
    runs: Vec<Run>,
}

/// MB/s figures of one run (or medians).
#[derive(Debug, Clone, Copy)]
struct Rates {
    skopeo: f64,
    pull: f64,
    download: f64,
    unpack_wall: f64,
    unpack_layer: f64,
    /// `pull ÷ skopeo` and `download ÷ skopeo` of the same run (their medians are the headline:
    /// both sides of a ratio then saw the same machine load).
    pull_vs_skopeo: f64,
    download_vs_skopeo: f64,
}

impl Report {
    fn rates(&self, r: &Run) -> Rates {
        Rates {
            skopeo: rate(self.compressed, r.skopeo),
            pull: rate(self.compressed, r.pull),
            download: rate(self.compressed, r.download),
            unpack_wall: rate(self.uncompressed, r.unpack_wall),
            unpack_layer: rate(self.uncompressed, r.unpack_layers_sum),
            pull_vs_skopeo: r.skopeo.as_secs_f64() / r.pull.as_secs_f64(),
            download_vs_skopeo: r.skopeo.as_secs_f64() / r.download.as_secs_f64(),
        }
    }

    fn medians(&self) -> Rates {
        let all: Vec<Rates> = self.runs.iter().map(|r| self.rates(r)).collect();
        let m = |f: fn(&Rates) -> f64| median(all.iter().map(f).collect());
        Rates {
            skopeo: m(|r| r.skopeo),
            pull: m(|r| r.pull),
            download: m(|r| r.download),
            unpack_wall: m(|r| r.unpack_wall),
            unpack_layer: m(|r| r.unpack_layer),
            pull_vs_skopeo: m(|r| r.pull_vs_skopeo),
            download_vs_skopeo: m(|r| r.download_vs_skopeo),
        }
    }

    fn print(&self) {
        println!();
        println!(
            "berth-bench image: {} ({} MB in {} gzip layers: {:.1} MB compressed, {:.1} MB unpacked), {} run(s); MB = 10^6 bytes",
            self.reference,
            self.size_mb,
            self.layers,
            self.compressed as f64 / MB,
            self.uncompressed as f64 / MB,
            self.runs.len()
        );
        println!();
        println!(
            "{:<7} {:>9} {:>11} {:>9} {:>11} {:>13} {:>13} {:>17} {:>12}",
            "run",
            "skopeo s",
            "skopeo MB/s",
            "pull s",
            "pull MB/s",
            "download MB/s",
            "unpack MB/s",
            "unpack/layer MB/s",
            "pull÷skopeo"
        );
        println!("{}", "-".repeat(111));
        for (i, run) in self.runs.iter().enumerate() {
            let r = self.rates(run);
            println!(
                "{:<7} {:>9.3} {:>11.1} {:>9.3} {:>11.1} {:>13.1} {:>13.1} {:>17.1} {:>11.2}×",
                i + 1,
                run.skopeo.as_secs_f64(),
                r.skopeo,
                run.pull.as_secs_f64(),
                r.pull,
                r.download,
                r.unpack_wall,
                r.unpack_layer,
                r.pull_vs_skopeo
            );
        }
        let m = self.medians();
        println!(
            "{:<7} {:>9} {:>11.1} {:>9} {:>11.1} {:>13.1} {:>13.1} {:>17.1} {:>11.2}×",
            "median", "", m.skopeo, "", m.pull, m.download, m.unpack_wall, m.unpack_layer, m.pull_vs_skopeo
        );
        println!();
        println!("pull MB/s: compressed layer bytes ÷ the whole Images::pull (download, verify and unpack)");
        println!("download MB/s: compressed layer bytes ÷ time to the last layer downloaded and verified");
        println!("unpack MB/s: uncompressed bytes ÷ the time any layer was unpacking (up to 3 layers unpack at once)");
        println!(
            "unpack/layer MB/s: uncompressed bytes ÷ the layers' unpack times added up (overlapping layers share the CPUs)"
        );
        println!();
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        let ratio = m.pull_vs_skopeo;
        println!(
            "pull ÷ skopeo copy (median of the runs' ratios): {ratio:.2}× (target ≥ {PULL_VS_SKOPEO_TARGET:.1}×: {}); download alone ÷ skopeo: {:.2}×",
            verdict(ratio >= PULL_VS_SKOPEO_TARGET),
            m.download_vs_skopeo
        );
        println!(
            "unpack: {:.1} MB/s (target ≥ {UNPACK_TARGET_MB_S:.0} MB/s: {}); per layer: {:.1} MB/s",
            m.unpack_wall,
            verdict(m.unpack_wall >= UNPACK_TARGET_MB_S),
            m.unpack_layer,
        );
    }

    fn to_json(&self) -> serde_json::Value {
        let rates_json = |r: &Rates| {
            json!({
                "skopeo_mb_s": r.skopeo, "pull_mb_s": r.pull, "download_mb_s": r.download,
                "unpack_mb_s": r.unpack_wall, "unpack_per_layer_mb_s": r.unpack_layer,
                "pull_vs_skopeo": r.pull_vs_skopeo, "download_vs_skopeo": r.download_vs_skopeo,
            })
        };
        let runs: Vec<_> = self
            .runs
            .iter()
            .map(|run| {
                let mut v = rates_json(&self.rates(run));
                let o = v.as_object_mut().expect("object");
                o.insert("skopeo_s".into(), json!(run.skopeo.as_secs_f64()));
                o.insert("pull_s".into(), json!(run.pull.as_secs_f64()));
                o.insert("download_s".into(), json!(run.download.as_secs_f64()));
                o.insert("unpack_wall_s".into(), json!(run.unpack_wall.as_secs_f64()));
                o.insert("unpack_layers_sum_s".into(), json!(run.unpack_layers_sum.as_secs_f64()));
                v
            })
            .collect();
        let m = self.medians();
        json!({
            "image": self.reference,
            "size_mb": self.size_mb,
            "layers": self.layers,
            "compressed_bytes": self.compressed,
            "uncompressed_bytes": self.uncompressed,
            "runs": runs,
            "median": rates_json(&m),
            "targets": {"pull_vs_skopeo": PULL_VS_SKOPEO_TARGET, "unpack_mb_s": UNPACK_TARGET_MB_S},
            "met": {
                "pull_vs_skopeo": m.pull_vs_skopeo >= PULL_VS_SKOPEO_TARGET,
                "unpack": m.unpack_wall >= UNPACK_TARGET_MB_S,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_of_overlapping_intervals_counts_each_instant_once() {
        let t = Instant::now();
        let s = |a: u64, b: u64| (t + Duration::from_millis(a), t + Duration::from_millis(b));
        assert_eq!(union_length(vec![s(0, 10), s(5, 20), s(30, 40), s(35, 36)]), Duration::from_millis(30));
        assert_eq!(union_length(vec![]), Duration::ZERO);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
