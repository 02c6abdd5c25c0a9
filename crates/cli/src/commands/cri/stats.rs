//! `berth cri stats`: containers' resource usage, crictl's way — two samples `--seconds` apart,
//! CPU % from the difference of their CPU time, MEM the working set, DISK and INODES the
//! writable layer's; `-w` repeats until interrupted.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::{Context, protojson, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Show all containers (default: running ones).
    #[arg(short, long)]
    all: bool,
    /// Filter by container id.
    #[arg(long, default_value = "")]
    id: String,
    /// Filter by pod id.
    #[arg(short, long, default_value = "")]
    pod: String,
    /// Filter by key=value label.
    #[arg(long)]
    label: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
    /// Sample duration for CPU usage in seconds.
    #[arg(short, long, default_value_t = 1)]
    seconds: u64,
    /// Watch resource usage.
    #[arg(short, long)]
    watch: bool,
    /// ID: the same as --id.
    id_arg: Option<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let id = if args.id.is_empty() { args.id_arg.clone().unwrap_or_default() } else { args.id.clone() };
    let filter = cri::ContainerStatsFilter {
        id,
        pod_sandbox_id: args.pod.clone(),
        label_selector: output::parse_labels(&args.label)?,
    };
    let once = || display(ctx, &filter, &args);
    watch(args.watch, once).await.map_err(|e| wrap("get container stats", e))
}

/// Runs `once`, or with `watch` again and again until Ctrl-C.
pub async fn watch<F, Fut>(watch: bool, mut once: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    if !watch {
        return once().await;
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            r = once() => r?,
            _ = &mut ctrl_c => return Ok(()),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = &mut ctrl_c => return Ok(()),
        }
    }
}

/// crictl clears the screen before each table; only where a screen is.
pub fn clear_screen() {
    if std::io::stdout().is_terminal() {
        print!("\x1b[2J\x1b[H");
    }
}

async fn list(ctx: &Context, filter: &cri::ContainerStatsFilter) -> anyhow::Result<Vec<cri::ContainerStats>> {
    let mut rt = ctx.runtime().await?;
    let req = cri::ListContainerStatsRequest { filter: Some(filter.clone()) };
    let mut stats = rt.list_container_stats(ctx.request(req)).await.map_err(rpc_error)?.into_inner().stats;
    stats.sort_by(|a, b| id_of(a).cmp(id_of(b)));
    Ok(stats)
}

fn id_of(s: &cri::ContainerStats) -> &str {
    s.attributes.as_ref().map_or("", |a| a.id.as_str())
}

async fn display(ctx: &Context, filter: &cri::ContainerStatsFilter, args: &Args) -> anyhow::Result<()> {
    let first = list(ctx, filter).await?;
    if args.output != Format::Table {
        let doc = protojson::to_value(&cri::ListContainerStatsResponse { stats: first });
        return output::print(&doc, args.output);
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let second = list(ctx, filter).await?;
    let rows = rows(&first, &second, args.all)?;
    clear_screen();
    print!("{}", output::table(&rows));
    Ok(())
}

fn cpu(s: &cri::ContainerStats) -> (u64, i64) {
    s.cpu.as_ref().map_or((0, 0), |c| (c.usage_core_nano_seconds.as_ref().map_or(0, |v| v.value), c.timestamp))
}

/// CPU % over the sample: CPU nanoseconds used per nanosecond passed, ×100.
pub fn cpu_percent(old: (u64, i64), new: (u64, i64)) -> anyhow::Result<f64> {
    if new.0 == 0 {
        return Ok(0.0);
    }
    let elapsed = new.1 - old.1;
    if elapsed == 0 {
        bail!("cpu stat is not updated during sample");
    }
    Ok(new.0.saturating_sub(old.0) as f64 / elapsed as f64 * 100.0)
}

/// The table: containers in both samples, stopped ones (no CPU, no memory) only with `all`.
fn rows(first: &[cri::ContainerStats], second: &[cri::ContainerStats], all: bool) -> anyhow::Result<Vec<Vec<String>>> {
    let old: HashMap<&str, &cri::ContainerStats> = first.iter().map(|s| (id_of(s), s)).collect();
    let mut rows = vec![["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"].map(String::from).to_vec()];
    for s in second {
        let (cpu_now, mem) =
            (cpu(s), s.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref()).map_or(0, |v| v.value));
        if !all && cpu_now.0 == 0 && mem == 0 {
            continue;
        }
        let Some(old) = old.get(id_of(s)) else { continue };
        let layer = s.writable_layer.as_ref();
        let disk = layer.and_then(|l| l.used_bytes.as_ref()).map_or(0, |v| v.value);
        let inodes = layer.and_then(|l| l.inodes_used.as_ref()).map_or(0, |v| v.value);
        let name = s.attributes.as_ref().and_then(|a| a.metadata.as_ref()).map_or("", |m| m.name.as_str());
        rows.push(vec![
            output::truncate_id(id_of(s), ""),
            name.into(),
            format!("{:.2}", cpu_percent(cpu(old), cpu_now)?),
            output::human_size4(mem),
            output::human_size4(disk),
            inodes.to_string(),
        ]);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(id: &str, cpu_ns: u64, ts: i64, mem: u64) -> cri::ContainerStats {
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: id.into(),
                metadata: Some(cri::ContainerMetadata { name: format!("n-{id}"), attempt: 0 }),
                ..Default::default()
            }),
            cpu: Some(cri::CpuUsage {
                timestamp: ts,
                usage_core_nano_seconds: Some(cri::UInt64Value { value: cpu_ns }),
                ..Default::default()
            }),
            memory: Some(cri::MemoryUsage {
                working_set_bytes: Some(cri::UInt64Value { value: mem }),
                ..Default::default()
            }),
            writable_layer: Some(cri::FilesystemUsage {
                used_bytes: Some(cri::UInt64Value { value: 12_288 }),
                inodes_used: Some(cri::UInt64Value { value: 7 }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_percent_is_cpu_time_over_wall_time() {
        // Half a core for one second.
        assert_eq!(cpu_percent((1_000, 0), (500_001_000, 1_000_000_000)).unwrap(), 50.0);
        assert_eq!(cpu_percent((5, 0), (0, 10)).unwrap(), 0.0);
        assert!(cpu_percent((1, 5), (2, 5)).is_err());
    }

    #[test]
    fn table_skips_stopped_and_new_containers_unless_asked() {
        let first = [stats("aaaaaaaaaaaaaaaaaaaa", 0, 0, 1_000), stats("stopped", 0, 0, 0)];
        let second = [
            stats("aaaaaaaaaaaaaaaaaaaa", 250_000_000, 1_000_000_000, 1_234_567),
            stats("new", 1, 1, 1),
            stats("stopped", 0, 1_000_000_000, 0),
        ];
        let r = rows(&first, &second, false).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], ["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"]);
        assert_eq!(r[1], ["aaaaaaaaaaaaa", "n-aaaaaaaaaaaaaaaaaaaa", "25.00", "1.235MB", "12.29kB", "7"]);
        let r = rows(&first, &second, true).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[2][2], "0.00");
    }
}
