//! `berth cri inspect`: crictl's container status document — `status` (the CRI
//! `ContainerStatus`, times as RFC 3339) and the runtime's verbose `info` — or its table view.

use k8s_cri::v1 as cri;
use serde_json::Value;

use super::output::{self, StatusFormat};
use super::{Context, protojson, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Output format.
    #[arg(short, long, value_enum, default_value = "json")]
    output: StatusFormat,
    /// Do not show verbose information.
    #[arg(short, long)]
    quiet: bool,
    /// The template for -o go-template (field paths such as {{.status.state}}).
    #[arg(long)]
    template: Option<String>,
    /// CONTAINER-ID [CONTAINER-ID...]; a unique prefix is enough.
    #[arg(required = true)]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    for id in &args.ids {
        let req = cri::ContainerStatusRequest { container_id: id.clone(), verbose: !args.quiet };
        let r = rt
            .container_status(ctx.request(req))
            .await
            .map_err(|s| wrap(format!("getting the status of the container {id:?}"), rpc_error(s)))?
            .into_inner();
        let status = r.status.unwrap_or_default();
        if args.output == StatusFormat::Table {
            table(&status, (!args.quiet).then_some(&r.info));
            continue;
        }
        let doc = output::status_info(status_json(&status), vec![], &r.info);
        output::print_status(&doc, args.output, args.template.as_deref())?;
    }
    Ok(())
}

/// The status with crictl's readable times: `startedAt` only once started, `finishedAt` only
/// once exited (Go's zero time otherwise).
pub fn status_json(s: &cri::ContainerStatus) -> Value {
    let mut v = protojson::to_value(s);
    let state = cri::ContainerState::try_from(s.state).unwrap_or(cri::ContainerState::ContainerUnknown);
    let started = state != cri::ContainerState::ContainerCreated;
    let finished = state == cri::ContainerState::ContainerExited
        || (state == cri::ContainerState::ContainerUnknown && s.finished_at > 0);
    let time = |reached: bool, ns: i64| {
        Value::String(if reached { output::rfc3339_local(ns) } else { output::GO_ZERO_TIME.into() })
    };
    v["createdAt"] = time(true, s.created_at);
    v["startedAt"] = time(started, s.started_at);
    v["finishedAt"] = time(finished, s.finished_at);
    v
}

fn table(s: &cri::ContainerStatus, info: Option<&std::collections::HashMap<String, String>>) {
    let now = output::now_ns();
    println!("ID: {}", s.id);
    if let Some(m) = &s.metadata {
        if !m.name.is_empty() {
            println!("Name: {}", m.name);
        }
        if m.attempt != 0 {
            println!("Attempt: {}", m.attempt);
        }
    }
    let state = cri::ContainerState::try_from(s.state).unwrap_or(cri::ContainerState::ContainerUnknown);
    println!("State: {}", state.as_str_name());
    println!("Created: {}", output::ago(s.created_at, now));
    if state != cri::ContainerState::ContainerCreated {
        println!("Started: {}", output::ago(s.started_at, now));
    }
    if state == cri::ContainerState::ContainerExited {
        if s.finished_at > 0 {
            println!("Finished: {}", output::ago(s.finished_at, now));
        }
        println!("Exit Code: {}", s.exit_code);
    }
    output::print_map("Labels", &s.labels);
    output::print_map("Annotations", &s.annotations);
    if let Some(info) = info {
        println!("Info: {}", output::go_map(info));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc3339_and_unreached_ones_as_go_zero_time() {
        let s = cri::ContainerStatus {
            id: "abc".into(),
            state: cri::ContainerState::ContainerRunning as i32,
            created_at: 1_700_000_000_000_000_000,
            started_at: 1_700_000_001_000_000_000,
            finished_at: 0,
            ..Default::default()
        };
        let v = status_json(&s);
        assert_eq!(v["state"], "CONTAINER_RUNNING");
        assert!(v["createdAt"].as_str().unwrap().starts_with("2023-11-1"), "{v}");
        assert_ne!(v["startedAt"], output::GO_ZERO_TIME);
        assert_eq!(v["finishedAt"], output::GO_ZERO_TIME);
        // Field order stays the proto's: id first, createdAt where the proto has it.
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys[0], "id");
        assert!(keys.iter().position(|k| k == "createdAt") < keys.iter().position(|k| k == "startedAt"));
        let created = cri::ContainerStatus { state: cri::ContainerState::ContainerCreated as i32, ..s };
        assert_eq!(status_json(&created)["startedAt"], output::GO_ZERO_TIME);
    }
}
