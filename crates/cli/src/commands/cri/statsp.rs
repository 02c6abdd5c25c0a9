//! `berth cri statsp`: pods' resource usage, as `stats` but per pod sandbox: POD, POD ID,
//! CPU % and MEM from the pod's Linux cgroup stats.

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::stats::{clear_screen, cpu_percent, watch};
use super::{Context, protojson, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Filter by pod id.
    #[arg(long, default_value = "")]
    id: String,
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
    let filter = cri::PodSandboxStatsFilter { id, label_selector: output::parse_labels(&args.label)? };
    let once = || display(ctx, &filter, &args);
    watch(args.watch, once).await.map_err(|e| wrap("get pod stats", e))
}

async fn list(ctx: &Context, filter: &cri::PodSandboxStatsFilter) -> anyhow::Result<Vec<cri::PodSandboxStats>> {
    let mut rt = ctx.runtime().await?;
    let req = cri::ListPodSandboxStatsRequest { filter: Some(filter.clone()) };
    let mut stats = rt
        .list_pod_sandbox_stats(ctx.request(req))
        .await
        .map_err(|s| wrap("list pod sandbox stats", rpc_error(s)))?
        .into_inner()
        .stats;
    stats.sort_by(|a, b| id_of(a).cmp(id_of(b)));
    Ok(stats)
}

fn id_of(s: &cri::PodSandboxStats) -> &str {
    s.attributes.as_ref().map_or("", |a| a.id.as_str())
}

async fn display(ctx: &Context, filter: &cri::PodSandboxStatsFilter, args: &Args) -> anyhow::Result<()> {
    let first = list(ctx, filter).await?;
    if args.output != Format::Table {
        let doc = protojson::to_value(&cri::ListPodSandboxStatsResponse { stats: first });
        return output::print(&doc, args.output);
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let second = list(ctx, filter).await?;
    let rows = rows(&first, &second)?;
    clear_screen();
    print!("{}", output::table(&rows));
    Ok(())
}

/// (CPU nanoseconds, their timestamp, working set bytes) of a pod.
fn usage(s: &cri::PodSandboxStats) -> (u64, i64, u64) {
    let Some(l) = &s.linux else { return (0, 0, 0) };
    let (cpu, ts) =
        l.cpu.as_ref().map_or((0, 0), |c| (c.usage_core_nano_seconds.as_ref().map_or(0, |v| v.value), c.timestamp));
    let mem = l.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref()).map_or(0, |v| v.value);
    (cpu, ts, mem)
}

/// Pods in both samples that use CPU or memory.
fn rows(first: &[cri::PodSandboxStats], second: &[cri::PodSandboxStats]) -> anyhow::Result<Vec<Vec<String>>> {
    let old: HashMap<&str, &cri::PodSandboxStats> = first.iter().map(|s| (id_of(s), s)).collect();
    let mut rows = vec![["POD", "POD ID", "CPU %", "MEM"].map(String::from).to_vec()];
    for s in second {
        let (cpu, ts, mem) = usage(s);
        if cpu == 0 && mem == 0 {
            continue;
        }
        let Some(old) = old.get(id_of(s)) else { continue };
        let (old_cpu, old_ts, _) = usage(old);
        let name = s.attributes.as_ref().and_then(|a| a.metadata.as_ref()).map_or("", |m| m.name.as_str());
        rows.push(vec![
            name.into(),
            output::truncate_id(id_of(s), ""),
            format!("{:.2}", cpu_percent((old_cpu, old_ts), (cpu, ts))?),
            output::human_size4(mem),
        ]);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str, cpu_ns: u64, ts: i64, mem: u64) -> cri::PodSandboxStats {
        cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: id.into(),
                metadata: Some(cri::PodSandboxMetadata { name: "web".into(), ..Default::default() }),
                ..Default::default()
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: Some(cri::CpuUsage {
                    timestamp: ts,
                    usage_core_nano_seconds: Some(cri::UInt64Value { value: cpu_ns }),
                    ..Default::default()
                }),
                memory: Some(cri::MemoryUsage {
                    working_set_bytes: Some(cri::UInt64Value { value: mem }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            windows: None,
        }
    }

    #[test]
    fn pod_rows_show_name_short_id_cpu_and_memory() {
        let first = [pod("0123456789abcdef", 1_000_000_000, 0, 5), pod("idle", 0, 0, 0)];
        let second = [pod("0123456789abcdef", 3_000_000_000, 2_000_000_000, 2_000_000), pod("idle", 0, 1, 0)];
        let r = rows(&first, &second).unwrap();
        assert_eq!(r, [vec!["POD", "POD ID", "CPU %", "MEM"], vec!["web", "0123456789abc", "100.00", "2MB"]]);
    }
}
