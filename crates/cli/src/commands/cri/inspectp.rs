//! `berth cri inspectp`: crictl's pod status document — `status` (the CRI `PodSandboxStatus`,
//! `createdAt` as RFC 3339) and the runtime's verbose `info` — or its table view.

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
    /// POD-ID [POD-ID...]; a unique prefix is enough.
    #[arg(required = true)]
    ids: Vec<String>,
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let mut rt = ctx.runtime().await?;
    for id in &args.ids {
        let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id.clone(), verbose: !args.quiet };
        let r = rt
            .pod_sandbox_status(ctx.request(req))
            .await
            .map_err(|s| wrap(format!("getting the pod sandbox status for {id:?}"), rpc_error(s)))?
            .into_inner();
        let status = r.status.unwrap_or_default();
        if args.output == StatusFormat::Table {
            table(&status, (!args.quiet).then_some(&r.info));
            continue;
        }
        let mut extra = Vec::new();
        // Runtimes that report the containers' statuses with the pod's (CRI 1.28+) get them shown.
        if !r.containers_statuses.is_empty() {
            let list = r.containers_statuses.iter().map(super::inspect::status_json).collect();
            extra.push(("containersStatuses", Value::Array(list)));
        }
        let doc = output::status_info(status_json(&status), extra, &r.info);
        output::print_status(&doc, args.output, args.template.as_deref())?;
    }
    Ok(())
}

pub fn status_json(s: &cri::PodSandboxStatus) -> Value {
    let mut v = protojson::to_value(s);
    v["createdAt"] = Value::String(output::rfc3339_local(s.created_at));
    v
}

fn table(s: &cri::PodSandboxStatus, info: Option<&std::collections::HashMap<String, String>>) {
    println!("ID: {}", s.id);
    if let Some(m) = &s.metadata {
        if !m.name.is_empty() {
            println!("Name: {}", m.name);
        }
        if !m.uid.is_empty() {
            println!("UID: {}", m.uid);
        }
        if !m.namespace.is_empty() {
            println!("Namespace: {}", m.namespace);
        }
        println!("Attempt: {}", m.attempt);
    }
    let state = cri::PodSandboxState::try_from(s.state).unwrap_or(cri::PodSandboxState::SandboxNotready);
    println!("Status: {}", state.as_str_name());
    println!("Created: {}", output::rfc3339_local(s.created_at));
    if let Some(n) = &s.network {
        println!("IP Addresses: {}", n.ip);
        for ip in &n.additional_ips {
            println!("Additional IP: {}", ip.ip);
        }
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
    fn pod_status_has_state_name_and_readable_creation_time() {
        let s = cri::PodSandboxStatus {
            id: "p".into(),
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: 1_700_000_000_000_000_000,
            runtime_handler: "runc".into(),
            ..Default::default()
        };
        let v = status_json(&s);
        assert_eq!(v["state"], "SANDBOX_READY");
        assert_eq!(v["runtimeHandler"], "runc");
        assert!(v["createdAt"].as_str().unwrap().starts_with("2023-11-1"), "{v}");
        assert_eq!(v["network"], Value::Null);
    }
}
