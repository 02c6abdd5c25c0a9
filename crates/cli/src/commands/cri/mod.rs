//! `berth cri`: a crictl-style CRI client — endpoints, timeout and the connection resolved once
//! into a [`Context`], then one module per verb with crictl's flags and output.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

mod imagefsinfo;
mod images;
mod info;
mod inspecti;
mod output;
mod pull;
mod rmi;
mod version;

pub const DEFAULT_ENDPOINT: &str = "unix:///run/berth/runtime.sock";

#[derive(clap::Args)]
pub struct Args {
    /// Runtime endpoint.
    #[arg(short = 'r', long, global = true, env = "CONTAINER_RUNTIME_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    runtime_endpoint: String,
    /// Image endpoint; the runtime endpoint when not set.
    #[arg(short = 'i', long, global = true, env = "IMAGE_SERVICE_ENDPOINT")]
    image_endpoint: Option<String>,
    /// Timeout of connecting and of each call except pulls (`2s`, `500ms`, `1m`, or seconds).
    #[arg(short = 't', long, global = true, default_value = "2s", value_parser = parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Pull an image from a registry for one runtime handler.
    Pull(pull::Args),
    /// List images, with the runtime handler each was pulled for.
    Images(images::Args),
    /// Remove images (for one runtime handler, or all).
    Rmi(rmi::Args),
    /// Show the status of images.
    Inspecti(inspecti::Args),
    /// Show the image filesystem's usage.
    Imagefsinfo(imagefsinfo::Args),
    /// Show the runtime's name and versions.
    Version,
    /// Show the runtime's status and handlers.
    Info(info::Args),
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let ctx = Context {
        runtime_endpoint: args.runtime_endpoint.clone(),
        image_endpoint: args.image_endpoint.clone().unwrap_or(args.runtime_endpoint),
        timeout: args.timeout,
    };
    match args.verb {
        Verb::Pull(a) => pull::run(&ctx, a).await,
        Verb::Images(a) => images::run(&ctx, a).await,
        Verb::Rmi(a) => rmi::run(&ctx, a).await,
        Verb::Inspecti(a) => inspecti::run(&ctx, a).await,
        Verb::Imagefsinfo(a) => imagefsinfo::run(&ctx, a).await,
        Verb::Version => version::run(&ctx).await,
        Verb::Info(a) => info::run(&ctx, a).await,
    }
}

/// What every verb needs: where to connect and how long to wait.
pub struct Context {
    runtime_endpoint: String,
    image_endpoint: String,
    timeout: Duration,
}

impl Context {
    pub async fn images(&self) -> anyhow::Result<ImageServiceClient<Channel>> {
        Ok(ImageServiceClient::new(connect(&self.image_endpoint, self.timeout).await?))
    }

    pub async fn runtime(&self) -> anyhow::Result<RuntimeServiceClient<Channel>> {
        Ok(RuntimeServiceClient::new(connect(&self.runtime_endpoint, self.timeout).await?))
    }

    /// A channel to the image endpoint for berth's own services (the streaming pull).
    pub async fn image_channel(&self) -> anyhow::Result<Channel> {
        connect(&self.image_endpoint, self.timeout).await
    }

    /// `message` with this context's call timeout.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        r.set_timeout(self.timeout);
        r
    }

    /// The name of the runtime's default handler, for images whose `runtime_handler` is empty.
    /// berth and containerd put it in the verbose status under `config`.
    pub async fn default_handler(&self) -> String {
        let status = async {
            let mut rt = self.runtime().await.ok()?;
            rt.status(self.request(cri::StatusRequest { verbose: true })).await.ok()
        };
        let Some(status) = status.await else { return "default".into() };
        let config: Option<serde_json::Value> =
            status.get_ref().info.get("config").and_then(|c| serde_json::from_str(c).ok());
        config
            .and_then(|c| {
                let name = c.get("defaultRuntimeName").or_else(|| c.pointer("/containerd/defaultRuntimeName"))?;
                name.as_str().map(str::to_string)
            })
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into())
    }
}

/// The socket path of `unix:///path` (or a bare absolute path).
fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if path.is_empty() {
            bail!("endpoint {endpoint:?} names no socket");
        }
        return Ok(PathBuf::from(path));
    }
    if endpoint.starts_with('/') {
        return Ok(PathBuf::from(endpoint));
    }
    bail!("endpoint {endpoint:?} is not unix:///path/to/socket")
}

async fn connect(endpoint: &str, timeout: Duration) -> anyhow::Result<Channel> {
    let path = socket_path(endpoint)?;
    // The URI is required but unused: every connection goes to the socket.
    let endpoint_uri = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let channel =
        endpoint_uri.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }));
    tokio::time::timeout(timeout, channel)
        .await
        .map_err(|_| anyhow::anyhow!("timed out"))
        .and_then(|r| r.map_err(anyhow::Error::from))
        .with_context(|| format!("connecting to {endpoint}"))
}

/// Go-style durations as crictl takes them: `2s`, `500ms`, `1m30s`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return Ok(Duration::from_secs_f64(secs.max(0.0)));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(digits);
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("invalid duration {s:?} (units: ms, s, m, h)")),
        };
        total += Duration::from_secs_f64(n * scale);
        rest = tail;
    }
    Ok(total)
}

/// A failed call as crictl reports it.
pub fn rpc_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("rpc error: code = {:?} desc = {}", s.code(), s.message())
}

/// The `ImageSpec` a verb sends: the reference and the handler (`""` = the runtime's default).
fn image_spec(image: &str, handler: &str) -> cri::ImageSpec {
    cri::ImageSpec { image: image.into(), runtime_handler: handler.into(), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("2x").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(socket_path("unix:///run/berth/runtime.sock").unwrap(), PathBuf::from("/run/berth/runtime.sock"));
        assert_eq!(socket_path("/tmp/x.sock").unwrap(), PathBuf::from("/tmp/x.sock"));
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("unix://").is_err());
    }
}
