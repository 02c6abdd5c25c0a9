//! `berth cri ps`: lists containers as crictl does — running ones unless `-a`/`--state`,
//! newest first, `--name` a regex, in crictl's table, verbose view, JSON or YAML.

use anyhow::bail;
use k8s_cri::v1 as cri;

use super::output::{self, Format};
use super::{Context, protojson, rpc_error, wrap};

#[derive(clap::Args)]
pub struct Args {
    /// Show all containers (default: running ones).
    #[arg(short, long)]
    all: bool,
    /// Filter by container id (a prefix is enough).
    #[arg(long, default_value = "")]
    id: String,
    /// Filter by pod id.
    #[arg(short, long, default_value = "")]
    pod: String,
    /// Filter by container name regular expression pattern.
    #[arg(long, default_value = "")]
    name: String,
    /// Filter by container state: created, running, exited or unknown.
    #[arg(short, long)]
    state: Option<String>,
    /// Filter by key=value label.
    #[arg(long)]
    label: Vec<String>,
    /// Only display container IDs.
    #[arg(short, long)]
    quiet: bool,
    /// Show verbose information for containers.
    #[arg(short, long)]
    verbose: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    output: Format,
    /// Show the most recently created container (includes all states).
    #[arg(short, long)]
    latest: bool,
    /// Show the last n recently created containers (includes all states); 0 for unlimited.
    #[arg(short = 'n', long, default_value_t = 0)]
    last: usize,
    /// Show output without truncating the ID.
    #[arg(long)]
    no_trunc: bool,
}

/// `--state` as the CRI filter value.
fn state_filter(state: &str) -> anyhow::Result<cri::ContainerState> {
    Ok(match state.to_lowercase().as_str() {
        "created" => cri::ContainerState::ContainerCreated,
        "running" => cri::ContainerState::ContainerRunning,
        "exited" => cri::ContainerState::ContainerExited,
        "unknown" => cri::ContainerState::ContainerUnknown,
        _ => bail!("--state should be one of created, running, exited or unknown"),
    })
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<()> {
    let state = match (&args.state, args.all) {
        (Some(s), _) => Some(state_filter(s)?),
        (None, false) => Some(cri::ContainerState::ContainerRunning),
        (None, true) => None,
    };
    // --latest and --last look at every state.
    let state = state.filter(|_| !args.latest && args.last == 0);
    let filter = cri::ContainerFilter {
        id: args.id.clone(),
        pod_sandbox_id: args.pod.clone(),
        state: state.map(|s| cri::ContainerStateValue { state: s as i32 }),
        label_selector: output::parse_labels(&args.label)?,
    };
    let mut rt = ctx.runtime().await?;
    let resp = rt
        .list_containers(ctx.request(cri::ListContainersRequest { filter: Some(filter) }))
        .await
        .map_err(|s| wrap("listing containers", rpc_error(s)))?
        .into_inner();
    let containers = select(resp.containers, &args.name, args.latest, args.last);

    match args.output {
        Format::Json | Format::Yaml => {
            let doc = protojson::to_value(&cri::ListContainersResponse { containers });
            return output::print(&doc, args.output);
        }
        Format::Table => {}
    }
    if args.quiet {
        for c in &containers {
            println!("{}", c.id);
        }
    } else if args.verbose {
        verbose(&containers, output::now_ns());
    } else {
        print!("{}", table(&containers, args.no_trunc, output::now_ns()));
    }
    Ok(())
}

/// crictl's `getContainersList`: name regex, newest first, then `--latest`/`--last`.
fn select(containers: Vec<cri::Container>, name: &str, latest: bool, last: usize) -> Vec<cri::Container> {
    let mut out: Vec<_> = containers
        .into_iter()
        .filter(|c| output::matches_regex(name, c.metadata.as_ref().map_or("", |m| m.name.as_str())))
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

pub fn container_state(state: i32) -> &'static str {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => "Created",
        Ok(cri::ContainerState::ContainerRunning) => "Running",
        Ok(cri::ContainerState::ContainerExited) => "Exited",
        _ => "Unknown",
    }
}

/// The kubelet's pod-name label, or `unknown` for containers not made by a kubelet.
fn pod_name(labels: &std::collections::HashMap<String, String>) -> &str {
    labels.get("io.kubernetes.pod.name").map_or("unknown", String::as_str)
}

/// Image ids (`sha256:<64 hex>`) shortened as crictl does; references are left whole.
fn short_image(image: &str) -> String {
    match image.split_once(':') {
        Some((algo, hex))
            if ["sha256", "sha384", "sha512"].contains(&algo)
                && hex.len() >= 64
                && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            output::truncate_id(image, &format!("{algo}:"))
        }
        _ => image.to_string(),
    }
}

fn table(containers: &[cri::Container], no_trunc: bool, now_ns: i64) -> String {
    let header = ["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"];
    let mut rows = vec![header.map(String::from).to_vec()];
    for c in containers {
        let (mut id, mut pod, mut image) =
            (c.id.clone(), c.pod_sandbox_id.clone(), c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default());
        if !no_trunc {
            id = output::truncate_id(&id, "");
            pod = output::truncate_id(&pod, "");
            image = short_image(&image);
        }
        let (name, attempt) = c.metadata.as_ref().map_or((String::new(), 0), |m| (m.name.clone(), m.attempt));
        rows.push(vec![
            id,
            image,
            output::ago(c.created_at, now_ns),
            container_state(c.state).into(),
            name,
            attempt.to_string(),
            pod,
            pod_name(&c.labels).into(),
        ]);
    }
    output::table(&rows)
}

fn verbose(containers: &[cri::Container], now_ns: i64) {
    for c in containers {
        println!("ID: {}", c.id);
        println!("PodID: {}", c.pod_sandbox_id);
        if let Some(m) = &c.metadata {
            if !m.name.is_empty() {
                println!("Name: {}", m.name);
            }
            println!("Attempt: {}", m.attempt);
        }
        println!("State: {}", container_state(c.state));
        if let Some(i) = &c.image {
            println!("Image: {}", i.image);
        }
        println!("Created: {}", output::ago(c.created_at, now_ns));
        output::print_map("Labels", &c.labels);
        output::print_map("Annotations", &c.annotations);
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000_000;

    fn container(id: &str, name: &str, created_s: i64) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: format!("pod{id}0123456789abcdef"),
            metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 1 }),
            image: Some(cri::ImageSpec { image: format!("sha256:{}", "ab".repeat(32)), ..Default::default() }),
            state: cri::ContainerState::ContainerRunning as i32,
            created_at: created_s * SEC,
            labels: [("io.kubernetes.pod.name".to_string(), "web".to_string())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn table_has_crictls_columns_and_short_ids() {
        let c = container("0123456789abcdef0123", "app", 100);
        let out = table(&[c], false, 190 * SEC);
        let lines: Vec<_> = out.lines().collect();
        assert!(lines[0].starts_with("CONTAINER"), "{out}");
        for col in ["IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"] {
            assert!(lines[0].contains(col), "{col} in {out}");
        }
        assert!(lines[1].starts_with("0123456789abc "), "{out}");
        assert!(lines[1].contains("abababababab"), "{out}");
        assert!(!lines[1].contains("sha256:"), "{out}");
        assert!(lines[1].contains("About a minute ago"), "{out}");
        assert!(lines[1].contains("Running"));
        assert!(lines[1].contains("pod0123456789 "), "{out}");
        assert!(lines[1].trim_end().ends_with("web"));
        // Columns line up with the header.
        assert_eq!(lines[0].find("STATE"), lines[1].find("Running"));
    }

    #[test]
    fn no_trunc_shows_whole_ids_and_images() {
        let c = container("0123456789abcdef0123", "app", 100);
        let out = table(&[c], true, 100 * SEC);
        assert!(out.contains("0123456789abcdef0123"));
        assert!(out.contains(&format!("sha256:{}", "ab".repeat(32))));
    }

    #[test]
    fn image_references_are_not_shortened() {
        assert_eq!(short_image("127.0.0.1:5000/busybox:1.0"), "127.0.0.1:5000/busybox:1.0");
        assert_eq!(short_image(&format!("sha256:{}", "0f".repeat(32))), "0f0f0f0f0f0f0");
    }

    #[test]
    fn selection_sorts_newest_first_and_applies_latest_last_and_name() {
        let cs = || vec![container("a", "app", 1), container("b", "db", 3), container("c", "app2", 2)];
        let ids = |v: Vec<cri::Container>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(select(cs(), "", false, 0)), ["b", "c", "a"]);
        assert_eq!(ids(select(cs(), "", true, 0)), ["b"]);
        assert_eq!(ids(select(cs(), "", false, 2)), ["b", "c"]);
        assert_eq!(ids(select(cs(), "^app", false, 0)), ["c", "a"]);
    }

    #[test]
    fn states_parse_case_insensitively() {
        assert_eq!(state_filter("Exited").unwrap(), cri::ContainerState::ContainerExited);
        assert!(state_filter("gone").is_err());
        assert_eq!(container_state(cri::ContainerState::ContainerCreated as i32), "Created");
        assert_eq!(container_state(42), "Unknown");
    }
}
