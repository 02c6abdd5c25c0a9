//! `berth cri`: a crictl-style CRI client — endpoints, timeout and the connection resolved once
//! into a [`Context`], then one module per verb with crictl's flags and output.
//!
//! The global flags go before the verb, as with crictl: verbs reuse `-r`, `-i` and `-t`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

mod attach;
mod config;
mod create;
mod crilog;
mod exec;
mod imagefsinfo;
mod images;
mod info;
mod inspect;
mod inspecti;
mod inspectp;
mod logs;
mod output;
mod pods;
mod port_forward;
mod protojson;
mod ps;
mod pull;
mod rm;
mod rmi;
mod rmp;
mod runp;
mod start;
mod stats;
mod statsp;
mod stop;
mod stopp;
mod stream;
mod version;

pub const DEFAULT_ENDPOINT: &str = "unix:///run/berth/runtime.sock";

#[derive(clap::Args)]
pub struct Args {
    /// Runtime endpoint.
    #[arg(short = 'r', long, env = "CONTAINER_RUNTIME_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    runtime_endpoint: String,
    /// Image endpoint; the runtime endpoint when not set.
    #[arg(short = 'i', long, env = "IMAGE_SERVICE_ENDPOINT")]
    image_endpoint: Option<String>,
    /// Timeout of connecting and of each call except pulls (`2s`, `500ms`, `1m`, or seconds).
    #[arg(short = 't', long, default_value = "2s", value_parser = parse_duration)]
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
    /// Run a new pod.
    Runp(runp::Args),
    /// Create a new container in a pod.
    Create(create::CreateArgs),
    /// Run a new container inside a new pod (runp, create, start).
    Run(create::RunArgs),
    /// Start one or more created containers.
    Start(start::Args),
    /// Stop one or more running containers.
    Stop(stop::Args),
    /// Remove one or more containers.
    Rm(rm::Args),
    /// Stop one or more running pods.
    Stopp(stopp::Args),
    /// Remove one or more pods.
    Rmp(rmp::Args),
    /// List containers.
    Ps(ps::Args),
    /// List pods.
    Pods(pods::Args),
    /// Display the status of one or more containers.
    Inspect(inspect::Args),
    /// Display the status of one or more pods.
    Inspectp(inspectp::Args),
    /// Fetch the logs of a container.
    Logs(logs::Args),
    /// Run a command in a running container.
    Exec(exec::Args),
    /// Attach to a running container.
    Attach(attach::Args),
    /// Forward local ports to a pod.
    PortForward(port_forward::Args),
    /// List containers' resource usage.
    Stats(stats::Args),
    /// List pods' resource usage.
    Statsp(statsp::Args),
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let ctx = Context {
        runtime_endpoint: args.runtime_endpoint.clone(),
        image_endpoint: args.image_endpoint.clone().unwrap_or(args.runtime_endpoint),
        timeout: args.timeout,
    };
    let result = match args.verb {
        Verb::Pull(a) => pull::run(&ctx, a).await,
        Verb::Images(a) => images::run(&ctx, a).await,
        Verb::Rmi(a) => rmi::run(&ctx, a).await,
        Verb::Inspecti(a) => inspecti::run(&ctx, a).await,
        Verb::Imagefsinfo(a) => imagefsinfo::run(&ctx, a).await,
        Verb::Version => version::run(&ctx).await,
        Verb::Info(a) => info::run(&ctx, a).await,
        Verb::Runp(a) => runp::run(&ctx, a).await,
        Verb::Create(a) => create::run_create(&ctx, a).await,
        Verb::Run(a) => create::run_run(&ctx, a).await,
        Verb::Start(a) => start::run(&ctx, a).await,
        Verb::Stop(a) => stop::run(&ctx, a).await,
        Verb::Rm(a) => rm::run(&ctx, a).await,
        Verb::Stopp(a) => stopp::run(&ctx, a).await,
        Verb::Rmp(a) => rmp::run(&ctx, a).await,
        Verb::Ps(a) => ps::run(&ctx, a).await,
        Verb::Pods(a) => pods::run(&ctx, a).await,
        Verb::Inspect(a) => inspect::run(&ctx, a).await,
        Verb::Inspectp(a) => inspectp::run(&ctx, a).await,
        Verb::Logs(a) => logs::run(&ctx, a).await,
        Verb::Exec(a) => exec::run(&ctx, a).await,
        Verb::Attach(a) => attach::run(&ctx, a).await,
        Verb::PortForward(a) => port_forward::run(&ctx, a).await,
        Verb::Stats(a) => stats::run(&ctx, a).await,
        Verb::Statsp(a) => statsp::run(&ctx, a).await,
    };
    // A command's own exit status (exec) leaves as the process's, without an error message.
    if let Err(e) = &result
        && let Some(Exit(code)) = e.downcast_ref::<Exit>()
    {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        std::process::exit(*code);
    }
    result
}

/// Ends `berth cri` with this exit status and no message.
#[derive(Debug)]
pub struct Exit(pub i32);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// What every verb needs: where to connect and how long to wait.
pub struct Context {
    runtime_endpoint: String,
    image_endpoint: String,
    timeout: Duration,
}

impl Context {
    /// One endpoint for both services, with `timeout` for connecting and for each call.
    pub fn new(endpoint: &str, timeout: Duration) -> Context {
        Context { runtime_endpoint: endpoint.to_string(), image_endpoint: endpoint.to_string(), timeout }
    }

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
        self.request_with(message, Some(self.timeout))
    }

    /// `message` with its own deadline, or none.
    pub fn request_with<T>(&self, message: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(t) = timeout {
            r.set_timeout(t);
        }
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

/// `what: cause` on one line, as crictl's wrapped Go errors read.
pub fn wrap(what: impl std::fmt::Display, cause: anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!("{what}: {cause:#}")
}

/// crictl's `--cancel-timeout`: a verb's own deadline, else the global one.
fn cancel_timeout(ctx: &Context, own: Option<Duration>) -> Duration {
    own.filter(|d| !d.is_zero()).unwrap_or(ctx.timeout)
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

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        use clap::{Args as _, FromArgMatches as _};
        let cmd = Args::augment_args(clap::Command::new("cri"));
        Args::from_arg_matches(&cmd.try_get_matches_from(std::iter::once("cri").chain(args.iter().copied()))?)
    }

    #[test]
    fn every_verb_has_consistent_flags() {
        use clap::Args as _;
        Args::augment_args(clap::Command::new("cri")).debug_assert();
    }

    #[test]
    fn global_flags_go_before_the_verb_and_verbs_keep_their_short_flags() {
        let a = parse(&["-t", "5s", "-r", "unix:///x.sock", "stop", "-t", "10", "abc"]).unwrap();
        assert_eq!(a.timeout, Duration::from_secs(5));
        assert_eq!(a.runtime_endpoint, "unix:///x.sock");
        let Verb::Stop(_) = a.verb else { panic!("not stop") };
        assert!(parse(&["logs", "-t", "-f", "abc"]).is_ok());
        assert!(parse(&["exec", "-i", "-t", "abc", "sh"]).is_ok());
        assert!(parse(&["runp", "-r", "gvisor", "pod.json"]).is_ok());
    }

    #[test]
    fn exec_passes_the_commands_own_flags_through() {
        let a = parse(&["exec", "-s", "abc", "sh", "-c", "echo -n x"]).unwrap();
        let Verb::Exec(e) = a.verb else { panic!("not exec") };
        assert_eq!(format!("{:?}", e.cmd()), r#"["sh", "-c", "echo -n x"]"#);
    }

    #[test]
    fn create_refuses_no_pull_with_with_pull() {
        assert!(parse(&["create", "--no-pull", "--with-pull", "pod", "c.json", "p.json"]).is_err());
        assert!(parse(&["create", "--with-pull", "pod", "c.json", "p.json"]).is_ok());
    }

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(socket_path("unix:///run/berth/runtime.sock").unwrap(), PathBuf::from("/run/berth/runtime.sock"));
        assert_eq!(socket_path("/tmp/x.sock").unwrap(), PathBuf::from("/tmp/x.sock"));
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("unix://").is_err());
    }
}
