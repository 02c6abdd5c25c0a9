//! `berth cri pods`: lists pod sandboxes as crictl does — newest first, `--name` and
//! `--namespace` as regexes, in crictl's table (with the RUNTIME handler), verbose view, JSON or YAML.

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::{Context, protojson, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Filter by pod id (a prefix is enough).
    #[arg(long, default_value = "")]
    id: String,
    /// Filter by pod name regular expression pattern.
    #[arg(long, default_value = "")]
    name: String,
    /// Filter by pod namespace regular expression pattern.
    #[arg(long, default_value = "")]
    namespace: String,
    /// Filter by pod state: ready or notready.
    #[arg(short, long)]
    state: Option<String>,
    /// Filter by key=value label.
    #[arg(long)]
    label: Vec<String>,
    /// Show verbose info for pods.
    #[arg(short, long)]
    verbose: bool,
    /// List only pod IDs.
    #[arg(short, long)]
    quiet: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
    /// Show the most recently created pod.
    #[arg(short, long)]
    latest: bool,
    /// Show the last n recently created pods; 0 for unlimited.
    #[arg(short = 'n', long, default_value_t = 0)]
    last: usize,
    /// Show output without truncating the ID.
    #[arg(long)]
    no_trunc: bool,
}

fn state_filter(state: &str) -> anyhow::Result<cri::PodSandboxState> {
    Ok(match state.to_lowercase().as_str() {
        "ready" => cri::PodSandboxState::SandboxReady,
        "notready" => cri::PodSandboxState::SandboxNotready,
        _ => bail!("--state should be ready or notready"),
    })
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let state = args.state.as_deref().map(state_filter).transpose()?;
    let filter = cri::PodSandboxFilter {
        id: args.id.clone(),
        state: state.map(|s| cri::PodSandboxStateValue { state: s as i32 }),
        label_selector: output::parse_labels(&args.label)?,
    };
    let mut rt = ctx.runtime().await?;
    let resp = rt
        .list_pod_sandbox(ctx.request(cri::ListPodSandboxRequest { filter: Some(filter) }))
        .await
        .map_err(|s| wrap("listing pod sandboxes", rpc_error(s)))?
        .into_inner();
    let pods = select(resp.items, &args.name, &args.namespace, args.latest, args.last);

    match args.output {
        Format::Json | Format::Yaml => {
            let doc = protojson::to_value(&cri::ListPodSandboxResponse { items: pods });
            return output::print(&doc, args.output);
        }
        Format::Table => {}
    }
    if args.quiet {
        for p in &pods {
            println!("{}", p.id);
        }
    } else if args.verbose {
        verbose(&pods);
    } else {
        print!("{}", table(&pods, args.no_trunc, output::now_ns()));
    }
    Ok(())
}

fn select(pods: Vec<cri::PodSandbox>, name: &str, namespace: &str, latest: bool, last: usize) -> Vec<cri::PodSandbox> {
    let mut out: Vec<_> = pods
        .into_iter()
        .filter(|p| {
            let (n, ns) = p.metadata.as_ref().map_or(("", ""), |m| (m.name.as_str(), m.namespace.as_str()));
            output::matches_regex(name, n) && output::matches_regex(namespace, ns)
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    let n = if last > 0 {
        last
    } else if latest {
        1
    } else {
        out.len()
    };
    out.truncate(n);
    out
}

pub fn pod_state(state: i32) -> &'static str {
    match cri::PodSandboxState::try_from(state) {
        Ok(cri::PodSandboxState::SandboxReady) => "Ready",
        _ => "NotReady",
    }
}

/// crictl shows `(default)` for pods run without naming a handler.
fn handler(p: &cri::PodSandbox) -> &str {
    if p.runtime_handler.is_empty() { "(default)" } else { &p.runtime_handler }
}

fn table(pods: &[cri::PodSandbox], no_trunc: bool, now_ns: i64) -> String {
    let header = ["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"];
    let mut rows = vec![header.map(String::from).to_vec()];
    for p in pods {
        let id = if no_trunc { p.id.clone() } else { output::truncate_id(&p.id, "") };
        let m = p.metadata.clone().unwrap_or_default();
        rows.push(vec![
            id,
            output::ago(p.created_at, now_ns),
            pod_state(p.state).into(),
            m.name,
            m.namespace,
            m.attempt.to_string(),
            handler(p).into(),
        ]);
    }
    output::table(&rows)
}

fn verbose(pods: &[cri::PodSandbox]) {
    for p in pods {
        println!("ID: {}", p.id);
        if let Some(m) = &p.metadata {
            if !m.name.is_empty() {
                println!("Name: {}", m.name);
            }
            if !m.uid.is_empty() {
                println!("UID: {}", m.uid);
            }
            if !m.namespace.is_empty() {
                println!("Namespace: {}", m.namespace);
            }
            if m.attempt != 0 {
                println!("Attempt: {}", m.attempt);
            }
        }
        println!("Status: {}", pod_state(p.state));
        println!("Created: {}", output::rfc3339_local(p.created_at));
        output::print_map("Labels", &p.labels);
        output::print_map("Annotations", &p.annotations);
        println!("Runtime: {}", handler(p));
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str, name: &str, ns: &str, handler: &str, created_s: i64) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                namespace: ns.into(),
                uid: "u".into(),
                attempt: 0,
            }),
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: created_s * 1_000_000_000,
            runtime_handler: handler.into(),
            ..Default::default()
        }
    }

    #[test]
    fn table_has_crictls_columns_and_default_runtime() {
        let pods = [pod("fedcba9876543210fedc", "web", "default", "", 0), pod("b", "db", "kube", "gvisor", 0)];
        let out = table(&pods, false, 3 * 3600 * 1_000_000_000);
        let lines: Vec<Vec<_>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0], ["POD", "ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"]);
        assert_eq!(lines[1], ["fedcba9876543", "3", "hours", "ago", "Ready", "web", "default", "0", "(default)"]);
        assert_eq!(lines[2].last(), Some(&"gvisor"));
    }

    #[test]
    fn name_and_namespace_filter_by_regex() {
        let pods = || vec![pod("a", "web", "default", "", 1), pod("b", "web", "kube-system", "", 2)];
        let ids = |v: Vec<cri::PodSandbox>| v.into_iter().map(|p| p.id).collect::<Vec<_>>();
        assert_eq!(ids(select(pods(), "we", "", false, 0)), ["b", "a"]);
        assert_eq!(ids(select(pods(), "", "^kube", false, 0)), ["b"]);
        assert_eq!(ids(select(pods(), "", "", true, 0)), ["b"]);
        assert!(state_filter("NotReady").is_ok() && state_filter("x").is_err());
    }
}
