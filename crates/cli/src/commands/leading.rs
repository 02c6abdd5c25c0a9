//! Running a control-plane part while this process holds its Lease in `kube-system` (leader
//! election as kube-scheduler and kube-controller-manager do it), or always without election.

use std::future::Future;
use std::time::Duration;

use berth_leader::{LeaderElector, LeaseConfig, default_identity};

const LEASE_NAMESPACE: &str = "kube-system";

/// Runs `work` while leading on the Lease `kube-system/<lease>` (or all the time when
/// `leader_elect` is false) until `shutdown`; a `work` that returns is started again a second
/// later (after giving the Lease up, with election).
pub async fn lead<F, Fut>(
    client: kube::Client,
    lease: &str,
    leader_elect: bool,
    work: F,
    shutdown: impl Future<Output = ()>,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut work = work;
    let mut pausing = move || {
        let run = work();
        async move {
            run.await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    if leader_elect {
        let config = LeaseConfig::new(LEASE_NAMESPACE, lease, default_identity());
        LeaderElector::new(client, config).run(pausing, shutdown).await;
    } else {
        tokio::select! {
            _ = async { loop { pausing().await } } => {}
            _ = shutdown => {}
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else { return std::future::pending().await };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The client of `path`, or of kube's inference (KUBECONFIG, in-cluster) without one.
pub async fn client(path: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("cannot use kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("cannot find a kubeconfig (give --kubeconfig)")?,
    };
    kube::Client::try_from(config).context("cannot build the API client")
}

/// A duration as Go's `time.ParseDuration` reads it (`50s`, `1m30s`, `500ms`, `2h`), as
/// kube-controller-manager's duration flags take them.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (examples: 50s, 1m30s, 500ms)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let value: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_kubernetes_flags_take_them() {
        assert_eq!(parse_go_duration("50s"), Ok(Duration::from_secs(50)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert!(parse_go_duration("50").is_err());
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("5 s").is_err());
    }
}
