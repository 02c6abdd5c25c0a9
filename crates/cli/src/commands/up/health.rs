//! Health of the three parts as their own interfaces report it: the API server's `/readyz`, the
//! runtime's CRI `Status`, the agent's `/healthz` on its kubelet port.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use k8s_cri::v1 as cri;

use super::cluster::{client, get_text};
use crate::commands::cri::Context as CriContext;

const TIMEOUT: Duration = Duration::from_secs(3);

/// `/readyz` of the API server behind `kubeconfig`: `Ok` when it says ok.
pub async fn server_readyz(kubeconfig: &Path) -> anyhow::Result<()> {
    let client = client(kubeconfig).await?;
    let text = get_text(&client, "/readyz").await?;
    anyhow::ensure!(text.trim() == "ok", "/readyz: {}", text.trim());
    Ok(())
}

/// The runtime's CRI `Status` on `socket`.
pub async fn runtime_status(socket: &Path) -> anyhow::Result<cri::StatusResponse> {
    let ctx = CriContext::new(&format!("unix://{}", socket.display()), TIMEOUT);
    let mut runtime = ctx.runtime().await?;
    let status = runtime.status(ctx.request(cri::StatusRequest { verbose: false })).await.context("CRI Status")?;
    Ok(status.into_inner())
}

/// The conditions of a CRI status that are not true, as `Type (reason: message)`.
pub fn unready_conditions(status: &cri::StatusResponse) -> Vec<String> {
    status
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| !c.status)
        .map(|c| format!("{} ({}: {})", c.r#type, c.reason, c.message))
        .collect()
}

/// `GET https://127.0.0.1:<port>/healthz` of the agent (its certificate is self-signed).
pub async fn agent_healthz(port: u16) -> anyhow::Result<()> {
    let url: http::Uri = format!("https://127.0.0.1:{port}").parse().context("agent URL")?;
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(TIMEOUT);
    config.read_timeout = Some(TIMEOUT);
    let client = kube::Client::try_from(config).context("cannot build a client for the agent")?;
    let text = get_text(&client, "/healthz").await?;
    anyhow::ensure!(text.trim() == "ok", "/healthz: {}", text.trim());
    Ok(())
}
