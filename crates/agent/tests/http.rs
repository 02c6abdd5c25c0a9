//! The agent's kubelet API against a real berth runtime (in-process, runc) and a real API server
//! (in-process, over TLS, with bearer tokens): logs with tail, timestamps, previous and follow,
//! exec over WebSocket, 401 and 403; then kubectl's logs, exec, attach and port-forward through
//! the API server's pod proxy, over WebSocket and over SPDY, for runc and gVisor pods.
//!
//! Pods are made directly through CRI with kubelet's labels, and their Pod objects in the API by
//! hand (no pod worker). Needs root, runc, runsc, the CNI plugins, busybox-static, docker-registry and
//! kubectl; a missing one fails the test.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_agent::endpoint::Endpoint;
use berth_agent::http::{Server, Settings};
use berth_agent::runtimes::{EndpointStatus, RuntimeManager};
use berth_apiserver::authn::TokenAuthenticator;
use berth_apiserver::{ApiState, lifecycle, tls};
use berth_image::Images;
use berth_runtime::config::Config;
use berth_runtime::cri::{Cri, Options, grpc};
use berth_store::sqlite::SqliteStore;
use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use futures::{SinkExt, StreamExt};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

const NODE: &str = "node-http";

/// A runtime, an API server and the agent's API, all on one temp dir. `slot` keeps the pod
/// networks of tests running at the same time apart.
struct Env {
    dir: tempfile::TempDir,
    /// Names the pod network's bridge (`berthht<slot>`).
    slot: u8,
    _registry: Registry,
    image: String,
    cri: RuntimeServiceClient<Channel>,
    _runtime: Arc<Cri>,
    runtime_stop: Option<tokio::sync::oneshot::Sender<()>>,
    api: axum_server::Handle<SocketAddr>,
    api_addr: SocketAddr,
    admin_kubeconfig: PathBuf,
    admin: kube::Client,
    admin_token: String,
    alice_token: String,
    agent: SocketAddr,
    agent_task: tokio::task::JoinHandle<Result<(), berth_agent::http::Error>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.agent_task.abort();
        self.api.shutdown();
        // Containers outlive their runtime (each monitor holds its own), so every pod goes first,
        // also when the test failed. The tests run on multi-threaded runtimes, where this may block.
        let mut cri = self.cri.clone();
        let containers = self.dir.path().join("root/containers");
        let cleanup = async move {
            let pods = cri.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await;
            for pod in pods.map(|p| p.into_inner().items).unwrap_or_default() {
                let _ = cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() }).await;
                let _ = cri.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: pod.id }).await;
            }
            // gVisor containers are deleted in the background: wait for their records to go.
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::fs::read_dir(&containers).is_ok_and(|mut d| d.next().is_some()) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(cleanup));
        if let Some(stop) = self.runtime_stop.take() {
            let _ = stop.send(());
        }
        // The bridge plugin leaves its bridge behind.
        let _ = std::process::Command::new("ip").args(["link", "del", &format!("berthht{}", self.slot)]).output();
    }
}

/// A pod made through CRI: its sandbox, its UID and its containers by name.
struct TestPod {
    name: String,
    uid: String,
    sandbox: String,
    config: cri::PodSandboxConfig,
    containers: HashMap<String, String>,
}

impl Env {
    async fn start(slot: u8) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::start();
        registry.push_image("busybox", "latest", &busybox_image(Format::Oci)).await;

        // The runtime, in-process on a socket of its own.
        let cni_dir = dir.path().join("cni");
        std::fs::create_dir_all(&cni_dir).unwrap();
        let conflist = json!({
            "cniVersion": "1.0.0", "name": format!("berthht{slot}"),
            "plugins": [{
                "type": "bridge", "bridge": format!("berthht{slot}"), "isGateway": true, "ipMasq": false,
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": format!("10.207.{slot}.0/24") }]],
                          "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": dir.path().join("ipam") }
            }]
        });
        std::fs::write(cni_dir.join("10-test.conflist"), conflist.to_string()).unwrap();
        let socket = dir.path().join("run/cri.sock");
        let text = format!(
            "socket = {socket:?}\nroot = {root:?}\ndefault_handler = \"runc\"\n[handlers.runc]\nbinary = \"runc\"\n\
             root = {runc:?}\n[handlers.gvisor]\nbinary = \"runsc\"\nargs = [\"--platform=ptrace\", \"--network=host\"]\n\
             root = {runsc:?}\n[cni]\nconf_dir = {cni_dir:?}\n[registries.\"{host}\"]\ninsecure = true\n",
            root = dir.path().join("root"),
            runc = dir.path().join("runc"),
            runsc = dir.path().join("runsc"),
            host = registry.host(),
        );
        let config = Config::from_toml(&text, OsStr::new("")).unwrap();
        let images = Images::open(config.images_config()).unwrap();
        let listener = berth_runtime::server::bind(&config.socket).await.unwrap();
        let options = Options { monitor_binary: Some(berth_testenv::monitor::monitor_binary()), ..Default::default() };
        let runtime = Cri::open(config, Arc::new(images), options).await.unwrap();
        let (runtime_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(listener.serve(grpc::routes(runtime.clone()), async {
            let _ = stopped.await;
        }));
        let channel = unix_channel(&socket).await;
        let image = registry.reference("busybox:latest");
        ImageServiceClient::new(channel.clone())
            .pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec { image: image.clone(), ..Default::default() }),
                ..Default::default()
            })
            .await
            .unwrap();

        // The API server, over TLS with the admin token, a user `alice` and the node's token.
        let admin_token = "admin-token-http".to_string();
        let alice_token = "alice-token-http".to_string();
        let node_token = "node-token-http".to_string();
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{alice_token},alice,uid-alice\n{node_token},system:node:{NODE},uid-node,system:nodes\n"),
        )
        .unwrap();
        let mut authn = TokenAuthenticator::new(admin_token.clone());
        authn.load_token_file(&tokens).unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), Some(authn));
        lifecycle::bootstrap(&state).await.unwrap();
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let pki = tls::ensure_pki(&dir.path().join("api"), local, &[]).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let api_addr = listener.local_addr().unwrap();
        let url = tls::server_url(local, api_addr.port());
        let api = axum_server::Handle::new();
        let rustls = axum_server::tls_rustls::RustlsConfig::from_config(tls::rustls_config(&pki).unwrap());
        let server = axum_server::from_tcp_rustls(listener, rustls).unwrap().handle(api.clone());
        tokio::spawn(server.serve(berth_apiserver::router(state).into_make_service()));
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        tls::write_kubeconfig(&admin_kubeconfig, &url, &pki.ca_pem, "admin", &admin_token).unwrap();
        let node_kubeconfig = dir.path().join("node.kubeconfig");
        tls::write_kubeconfig(&node_kubeconfig, &url, &pki.ca_pem, "node", &node_token).unwrap();
        let admin = client_from(&admin_kubeconfig).await;

        // The agent's API, reviewing tokens with the node's own credentials.
        let runtimes = Arc::new(RuntimeManager::new(NODE));
        let endpoint = format!("unix://{}", socket.display());
        runtimes.set_endpoints(vec![Endpoint::connect_lazy("container", "berth", &endpoint, "").unwrap()]);
        runtimes.update_status(
            "berth",
            EndpointStatus { ready: true, handlers: vec![String::new(), "runc".into()], ..Default::default() },
        );
        let server = Server::bind(Settings {
            client: client_from(&node_kubeconfig).await,
            node_name: NODE.into(),
            runtimes,
            port: 0,
            bind_address: local,
            cert_dir: dir.path().join("agent/pki"),
        })
        .await
        .unwrap();
        let agent = server.local_addr();
        let agent_task = tokio::spawn(server.run());

        // The Node, where the API server finds the agent.
        let nodes: Api<Node> = Api::all(admin.clone());
        let node: Node = serde_json::from_value(json!({"metadata": {"name": NODE}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": agent.port()}},
        }});
        nodes.patch_status(NODE, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();

        Env {
            dir,
            slot,
            _registry: registry,
            image,
            cri: RuntimeServiceClient::new(channel),
            _runtime: runtime,
            runtime_stop: Some(runtime_stop),
            api,
            api_addr,
            admin_kubeconfig,
            admin,
            admin_token,
            alice_token,
            agent,
            agent_task,
        }
    }

    /// A pod bound to this node in the API (phase Running, for kubectl) and its sandbox and
    /// started containers in the runtime, labelled as kubelet labels them.
    async fn run_pod(&mut self, name: &str, containers: &[(&str, &str)]) -> TestPod {
        self.run_pod_with("runc", name, containers).await
    }

    /// [`Self::run_pod`] under the runtime handler `handler`.
    async fn run_pod_with(&mut self, handler: &str, name: &str, containers: &[(&str, &str)]) -> TestPod {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let spec: Vec<Value> = containers.iter().map(|(c, _)| json!({"name": c, "image": self.image})).collect();
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"nodeName": NODE, "containers": spec}}))
                .unwrap();
        let created = pods.create(&PostParams::default(), &pod).await.unwrap();
        let uid = created.metadata.uid.unwrap();
        let running = json!({"status": {"phase": "Running"}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(running)).await.unwrap();

        let labels = HashMap::from([
            ("io.kubernetes.pod.name".to_string(), name.to_string()),
            ("io.kubernetes.pod.namespace".to_string(), "default".to_string()),
            ("io.kubernetes.pod.uid".to_string(), uid.clone()),
        ]);
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: uid.clone(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self.dir.path().join(format!("logs/default_{name}_{uid}")).to_string_lossy().into_owned(),
            labels,
            ..Default::default()
        };
        let sandbox = self
            .cri
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let mut pod = TestPod { name: name.into(), uid, sandbox, config, containers: HashMap::new() };
        for (container, script) in containers {
            self.start_container(&mut pod, container, 0, script).await;
        }
        pod
    }

    /// Creates and starts attempt `attempt` of `container` running `sh -c script`.
    async fn start_container(&mut self, pod: &mut TestPod, container: &str, attempt: u32, script: &str) -> String {
        let mut labels = pod.config.labels.clone();
        labels.insert("io.kubernetes.container.name".into(), container.into());
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: container.into(), attempt }),
            image: Some(cri::ImageSpec { image: self.image.clone(), ..Default::default() }),
            command: vec!["sh".into(), "-c".into(), script.into()],
            log_path: format!("{container}/{attempt}.log"),
            labels,
            annotations: HashMap::from([("io.kubernetes.container.restartCount".into(), attempt.to_string())]),
            ..Default::default()
        };
        let id = self
            .cri
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.sandbox.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .container_id;
        self.cri.start_container(cri::StartContainerRequest { container_id: id.clone() }).await.unwrap();
        pod.containers.insert(container.into(), id.clone());
        id
    }

    async fn wait_exited(&mut self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self
                .cri
                .container_status(cri::ContainerStatusRequest { container_id: id.into(), verbose: false })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap();
            if status.state == cri::ContainerState::ContainerExited as i32 {
                return;
            }
            assert!(Instant::now() < deadline, "container {id} did not exit: {status:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn agent_url(&self, path: &str) -> String {
        format!("https://{}{path}", self.agent)
    }

    /// GET on the agent's API with `token` (none: no Authorization header).
    async fn get(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut request = https_client().get(self.agent_url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap()
    }

    async fn logs(&self, pod: &str, container: &str, query: &str) -> String {
        let response =
            self.get(&format!("/containerLogs/default/{pod}/{container}?{query}"), Some(&self.admin_token)).await;
        assert_eq!(response.status(), 200, "logs of {pod}/{container}?{query}");
        response.text().await.unwrap()
    }

    /// Runs kubectl against the API server as admin.
    fn kubectl(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.admin_kubeconfig).arg("--request-timeout=60s");
        cmd.kill_on_drop(true);
        cmd
    }
}

async fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    TonicEndpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap()
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The agent's certificate is self-signed: nobody verifies it (as the API server does not).
fn https_client() -> reqwest::Client {
    reqwest::Client::builder().danger_accept_invalid_certs(true).build().unwrap()
}

/// Waits until the file at `path` contains `text`.
async fn wait_for_log(path: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::read_to_string(path).unwrap_or_default().contains(text) {
            return;
        }
        assert!(Instant::now() < deadline, "{} never contained {text:?}", path.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn log_file(env: &Env, pod: &TestPod, container: &str, attempt: u32) -> PathBuf {
    env.dir.path().join(format!("logs/default_{}_{}/{container}/{attempt}.log", pod.name, pod.uid))
}

// ---------------------------------------------------------------------------------------------
// A WebSocket client for exec (`v5.channel.k8s.io`: a channel byte before each message)

async fn tls_to(addr: SocketAddr) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(berth_common::tls::AnyServerCertificate::new(provider)))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap()
}

/// What a WebSocket exec printed and the Status it ended with.
#[derive(Debug, Default)]
struct ExecOutput {
    stdout: String,
    stderr: String,
    status: Value,
}

/// Execs over a WebSocket offering `protocol`; `Err(status code, body)` when the upgrade is refused.
async fn ws_exec(
    addr: SocketAddr,
    path: &str,
    token: &str,
    protocol: &str,
    stdin: Option<&[u8]>,
) -> Result<ExecOutput, (u16, String)> {
    let mut request = format!("wss://{addr}{path}").into_client_request().unwrap();
    request.headers_mut().insert("Authorization", format!("Bearer {token}").parse().unwrap());
    request.headers_mut().insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let ws = match tokio_tungstenite::client_async(request, tls_to(addr).await).await {
        Ok((ws, _)) => ws,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            return Err((response.status().as_u16(), body));
        }
        Err(e) => panic!("websocket exec failed: {e}"),
    };
    let (mut tx, mut rx) = ws.split();
    if let Some(input) = stdin {
        let mut data = vec![0u8];
        data.extend_from_slice(input);
        tx.send(Message::Binary(data.into())).await.unwrap();
        // v5: closing the stdin channel is a message on channel 255 naming channel 0.
        tx.send(Message::Binary(vec![255u8, 0].into())).await.unwrap();
    }
    let mut out = ExecOutput::default();
    let deadline = tokio::time::sleep(Duration::from_secs(30));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            message = rx.next() => match message {
                Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                    let text = String::from_utf8_lossy(&data[1..]).into_owned();
                    match data[0] {
                        1 => out.stdout.push_str(&text),
                        2 => out.stderr.push_str(&text),
                        3 => out.status = serde_json::from_str(&text).unwrap_or(Value::String(text)),
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return Ok(out),
                Some(Ok(_)) => {}
            },
            _ = &mut deadline => panic!("websocket exec did not end: {out:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The agent's API

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_served_whole_tailed_with_timestamps_and_from_the_previous_attempt() {
    let mut env = Env::start(1).await;
    let script = "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; printf 'no newline'";
    let mut pod = env.run_pod("logs", &[("app", script)]).await;
    let first = pod.containers["app"].clone();
    env.wait_exited(&first).await;

    assert_eq!(env.logs("logs", "app", "").await, "one\ntwo\nthree\nno newline\n");
    assert_eq!(env.logs("logs", "app", "tailLines=2").await, "three\nno newline\n");
    assert_eq!(env.logs("logs", "app", "limitBytes=6").await, "one\ntw");
    let stamped = env.logs("logs", "app", "timestamps=true&tailLines=1").await;
    let (stamp, text) = stamped.split_once(' ').unwrap();
    assert_eq!(text, "no newline\n");
    assert_eq!(stamp.len(), "2024-05-01T10:00:00.123456789Z".len(), "nine fraction digits: {stamp}");
    assert!(stamp.parse::<jiff::Timestamp>().is_ok(), "{stamp}");

    // No second attempt yet: kubelet's message, as a 400.
    let response = env.get("/containerLogs/default/logs/app?previous=true", Some(&env.admin_token)).await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.text().await.unwrap().trim(),
        "previous terminated container \"app\" in pod \"logs\" not found"
    );

    let second = env.start_container(&mut pod, "app", 1, "echo second life").await;
    env.wait_exited(&second).await;
    assert_eq!(env.logs("logs", "app", "").await, "second life\n");
    assert_eq!(env.logs("logs", "app", "previous=true&tailLines=1").await, "no newline\n");

    let response = env.get("/containerLogs/default/nope/app", Some(&env.admin_token)).await;
    assert_eq!(response.status(), 404);
    assert_eq!(response.text().await.unwrap().trim(), "pod \"nope\" does not exist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_a_log_streams_new_lines_and_ends_when_the_container_exits() {
    let mut env = Env::start(2).await;
    let pod = env.run_pod("follow", &[("app", "echo start; sleep 2; echo end; sleep 1")]).await;
    wait_for_log(&log_file(&env, &pod, "app", 0), "start").await;
    let response = env.get("/containerLogs/default/follow/app?follow=true", Some(&env.admin_token)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/plain");
    let started = Instant::now();
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(&first[..], b"start\n", "what was there is sent at once");
    let mut rest = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(20), body.next()).await.expect("follow ended") {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(String::from_utf8(rest).unwrap(), "end\n");
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(2), "the stream lasted until the container exited ({took:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_websocket_prints_the_commands_output_and_exit_status() {
    let mut env = Env::start(3).await;
    env.run_pod("exec", &[("app", "sleep 300")]).await;
    let token = env.admin_token.clone();
    let path = "/exec/default/exec/app?command=sh&command=-c&command=echo%20out%3B%20echo%20err%20%3E%262%3B%20exit%203&output=1&error=1";
    let out = ws_exec(env.agent, path, &token, "v5.channel.k8s.io", None).await.unwrap();
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");
    assert_eq!(out.status["status"], "Failure", "{:?}", out.status);
    assert_eq!(out.status["reason"], "NonZeroExitCode");
    assert_eq!(out.status["details"]["causes"][0]["message"], "3");

    // stdin through to `cat`, closed with v5's close message.
    let path = "/exec/default/exec/app?command=cat&input=1&output=1";
    let out = ws_exec(env.agent, path, &token, "v5.channel.k8s.io", Some(b"piped\n")).await.unwrap();
    assert_eq!(out.stdout, "piped\n");
    assert_eq!(out.status["status"], "Success");

    // A protocol the runtime does not speak: its refusal reaches the client, not a 101.
    let path = "/exec/default/exec/app?command=true&output=1";
    let (code, body) = ws_exec(env.agent, path, &token, "v9.channel.k8s.io", None).await.unwrap_err();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("unable to negotiate protocol"), "{body}");

    let (code, body) =
        ws_exec(env.agent, "/exec/default/exec/nope?command=true&output=1", &token, "v5.channel.k8s.io", None)
            .await
            .unwrap_err();
    assert_eq!((code, body.trim()), (500, "container not found (\"nope\")"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_need_an_admin_or_node_token_but_healthz_is_open() {
    let env = Env::start(4).await;
    let response = env.get("/healthz", None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok");

    let response = env.get("/pods", None).await;
    assert_eq!(response.status(), 401);
    let status: Value = response.json().await.unwrap();
    assert_eq!((status["kind"].as_str(), status["code"].as_i64()), (Some("Status"), Some(401)));
    assert_eq!(env.get("/containerLogs/default/x/y", Some("wrong-token")).await.status(), 401);

    let response = env.get("/pods", Some(&env.alice_token)).await;
    assert_eq!(response.status(), 403);
    let status: Value = response.json().await.unwrap();
    assert_eq!(status["message"], "Forbidden (user=alice, verb=get, resource=nodes, subresource=proxy)");

    let response = env.get("/pods", Some(&env.admin_token)).await;
    assert_eq!(response.status(), 200);
    let pods: Value = response.json().await.unwrap();
    assert_eq!(pods["kind"], "PodList");

    let metrics = env.get("/metrics", Some(&env.admin_token)).await.text().await.unwrap();
    assert!(metrics.contains("agent_running_pods{endpoint=\"berth\"} 0"), "{metrics}");
    assert!(metrics.contains("agent_http_requests_total{route=\"pods\",code=\"403\"} 1"), "{metrics}");
}

// ---------------------------------------------------------------------------------------------
// End to end: kubectl through the API server's pod proxy (WebSocket first, then SPDY)

async fn kubectl_output(mut cmd: tokio::process::Command) -> (bool, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output()).await.expect("kubectl hung").unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl with its streaming protocols chosen: WebSocket (kubectl 1.32's default) or SPDY.
fn with_protocols(mut cmd: tokio::process::Command, websocket: bool) -> tokio::process::Command {
    let value = if websocket { "true" } else { "false" };
    cmd.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", value).env("KUBECTL_PORT_FORWARD_WEBSOCKETS", value);
    cmd
}

async fn kubectl_streams(env: &Env, websocket: bool) {
    let mut exec = with_protocols(env.kubectl(), websocket);
    exec.args(["exec", "web", "-c", "app", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    let (ok, stdout, stderr) = kubectl_output(exec).await;
    assert!(!ok);
    assert_eq!(stdout, "out\n");
    assert!(stderr.starts_with("err\n") && stderr.contains("command terminated with exit code 3"), "{stderr}");

    let mut cat = with_protocols(env.kubectl(), websocket);
    cat.args(["exec", "-i", "web", "-c", "app", "--", "cat"]).stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = cat.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"through stdin\n").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through stdin\n");

    // Port-forward to busybox httpd in the pod.
    let mut forward = with_protocols(env.kubectl(), websocket);
    forward.args(["port-forward", "pod/web", ":8080"]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = forward.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.unwrap().unwrap().unwrap();
    // `Forwarding from 127.0.0.1:40123 -> 8080`
    let port: u16 = line.split(':').nth(1).and_then(|p| p.split(' ').next()).unwrap().parse().unwrap();
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n").await.unwrap();
    let mut page = String::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_string(&mut page)).await.unwrap().unwrap();
    assert!(page.starts_with("HTTP/1.") && page.ends_with("served from the pod\n"), "{page}");
    child.kill().await.unwrap();

    // Attach to a container that prints a line every 200 ms.
    let mut attach = with_protocols(env.kubectl(), websocket);
    attach.args(["attach", "web", "-c", "ticker"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = attach.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.unwrap().unwrap().unwrap();
    assert_eq!(line, "tick");
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_exec_attach_and_port_forward_work_through_the_api_server() {
    let mut env = Env::start(5).await;
    let serve =
        "mkdir -p /www && echo 'served from the pod' > /www/index.html && echo ready && exec httpd -f -p 8080 -h /www";
    let pod = env.run_pod("web", &[("app", serve), ("ticker", "while true; do echo tick; sleep 0.2; done")]).await;
    wait_for_log(&log_file(&env, &pod, "app", 0), "ready").await;

    let mut logs = env.kubectl();
    logs.args(["logs", "web", "-c", "app"]);
    assert_eq!(kubectl_output(logs).await, (true, "ready\n".into(), String::new()));
    // kubectl picks a container itself; the API names the choices when none is given.
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), "default");
    let err = pods.logs("web", &Default::default()).await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("{err:?}") };
    assert_eq!(status.code, 400);
    assert_eq!(status.message, "a container name must be specified for pod web, choose one of: [app ticker]");

    let mut follow_pod = env.run_pod("short", &[("main", "echo begin; sleep 2; echo finish")]).await;
    let id = follow_pod.containers.remove("main").unwrap();
    let mut follow = env.kubectl();
    follow.args(["logs", "-f", "short"]);
    let started = Instant::now();
    let (ok, stdout, stderr) = kubectl_output(follow).await;
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "begin\nfinish\n");
    assert!(started.elapsed() < Duration::from_secs(30));
    env.wait_exited(&id).await;

    kubectl_streams(&env, true).await;
    kubectl_streams(&env, false).await;

    // A runtime's refusal of a protocol reaches the client through both proxies as it was, which
    // is what makes kubectl fall back from WebSocket to SPDY (containerd 1.6 has no v5).
    let path = "/api/v1/namespaces/default/pods/web/exec?container=app&command=true&stdout=true";
    let (code, body) = ws_exec(env.api_addr, path, &env.admin_token, "v9.channel.k8s.io", None).await.unwrap_err();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("unable to negotiate protocol"), "{body}");
    let out = ws_exec(
        env.api_addr,
        path.replace("true&stdout", "hostname&stdout").as_str(),
        &env.admin_token,
        "v5.channel.k8s.io",
        None,
    )
    .await
    .unwrap();
    assert_eq!(out.stdout, "web\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_pods_logs_and_exec_come_from_inside_gvisor() {
    let mut env = Env::start(6).await;
    let pod = env.run_pod_with("gvisor", "sandboxed", &[("app", "dmesg; echo logged; sleep 300")]).await;
    wait_for_log(&log_file(&env, &pod, "app", 0), "logged").await;

    let mut logs = env.kubectl();
    logs.args(["logs", "sandboxed", "--tail=-1"]);
    let (ok, stdout, stderr) = kubectl_output(logs).await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Starting gVisor"), "dmesg in the pod is gVisor's: {stdout}");

    for websocket in [true, false] {
        let mut exec = with_protocols(env.kubectl(), websocket);
        exec.args(["exec", "sandboxed", "--", "dmesg"]);
        let (ok, stdout, stderr) = kubectl_output(exec).await;
        assert!(ok, "{stderr}");
        assert!(stdout.contains("Starting gVisor"), "websocket={websocket}: {stdout}");
    }
}
