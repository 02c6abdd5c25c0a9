//! The CRI server in-process on a temporary unix socket, driven by the generated CRI client:
//! versions, handlers, errors, and pulls from a real registry on loopback for two handlers with
//! different guest platforms.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_image::Images;
use berth_runtime::config::Config;
use berth_runtime::cri::{Cri, Options, grpc};
use berth_runtime::proto;
use berth_runtime::proto::pull_progress_client::PullProgressClient;
use berth_runtime::server;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

/// `runc` sees linux/amd64 and `gvisor` linux/arm64/v8, whatever the host is.
const HANDLERS: &str = r#"
default_handler = "runc"
[handlers.runc]
binary = "runc"
platform = "linux/amd64"
[handlers.gvisor]
binary = "runsc"
args = ["--platform=ptrace", "--network=host"]
platform = "linux/arm64/v8"
"#;

struct Server {
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), server::ServeError>>>,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "socket = {:?}\nroot = {:?}\n{HANDLERS}\n[cni]\nconf_dir = {:?}\n",
            dir.path().join("run/cri.sock"),
            dir.path().join("root"),
            dir.path().join("cni")
        );
        let config = Config::from_toml(&text, OsStr::new("")).unwrap();
        let images = Images::open(config.images_config()).unwrap();
        let listener = server::bind(&config.socket).await.unwrap();
        let cri = Cri::open(config, Arc::new(images), Options::default()).await.unwrap();
        let routes = grpc::routes(cri);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(listener.serve(routes, async {
            let _ = stopped.await;
        }));
        Server { dir, stop: Some(stop), task: Some(task) }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/cri.sock")
    }

    async fn channel(&self) -> Channel {
        let path = self.socket();
        Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                }
            }))
            .await
            .unwrap()
    }

    async fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel().await)
    }

    async fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel().await)
    }

    async fn shutdown(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.task.take().unwrap().await.unwrap().unwrap();
        assert!(!self.socket().exists(), "socket removed on shutdown");
    }
}

fn spec(image: &str, handler: &str) -> Option<cri::ImageSpec> {
    Some(cri::ImageSpec { image: image.into(), runtime_handler: handler.into(), ..Default::default() })
}

fn handler_of(i: &cri::Image) -> &str {
    &i.spec.as_ref().unwrap().runtime_handler
}

async fn list(c: &mut ImageServiceClient<Channel>, image: &str, handler: &str) -> Vec<cri::Image> {
    let filter = Some(cri::ImageFilter { image: spec(image, handler) });
    c.list_images(cri::ListImagesRequest { filter }).await.unwrap().into_inner().images
}

async fn status(c: &mut ImageServiceClient<Channel>, image: &str, handler: &str) -> cri::ImageStatusResponse {
    c.image_status(cri::ImageStatusRequest { image: spec(image, handler), verbose: true }).await.unwrap().into_inner()
}

async fn pull(c: &mut ImageServiceClient<Channel>, image: &str, handler: &str) -> Result<String, tonic::Status> {
    let req = cri::PullImageRequest { image: spec(image, handler), auth: None, sandbox_config: None };
    c.pull_image(req).await.map(|r| r.into_inner().image_ref)
}

#[tokio::test]
async fn version_names_berth_and_cri_v1() {
    let s = Server::start().await;
    let v = s.runtime().await.version(cri::VersionRequest { version: "v1".into() }).await.unwrap().into_inner();
    assert_eq!(v.runtime_name, "berth");
    assert_eq!(v.runtime_api_version, "v1");
    assert_eq!(v.version, "0.1.0");
    assert_eq!(v.runtime_version, env!("CARGO_PKG_VERSION"));
    s.shutdown().await;
}

#[tokio::test]
async fn status_lists_every_configured_handler_and_the_network_of_the_default_conflist() {
    let s = Server::start().await;
    let r = s.runtime().await.status(cri::StatusRequest { verbose: true }).await.unwrap().into_inner();
    let names: Vec<_> = r.runtime_handlers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["", "gvisor", "runc"]);
    assert!(r.runtime_handlers.iter().all(|h| h.features.is_some()));
    let conditions = r.status.unwrap().conditions;
    let ready = conditions.iter().find(|c| c.r#type == "RuntimeReady").unwrap();
    assert!(ready.status);
    // The conf dir was empty: the runtime wrote its default conflist, whose plugins are installed.
    let network = conditions.iter().find(|c| c.r#type == "NetworkReady").unwrap();
    assert!(network.status, "{network:?}");
    assert!(s.dir.path().join("cni/10-berth.conflist").exists());
    let config: serde_json::Value = serde_json::from_str(&r.info["config"]).unwrap();
    assert_eq!(config["defaultRuntimeName"], "runc");
    assert_eq!(config["runtimes"]["gvisor"]["platform"]["architecture"], "arm64");
    s.shutdown().await;
}

#[tokio::test]
async fn the_node_pod_cidr_moves_the_default_conflist_and_garbage_is_invalid() {
    let s = Server::start().await;
    let mut rt = s.runtime().await;
    let update = |cidr: &str| cri::UpdateRuntimeConfigRequest {
        runtime_config: Some(cri::RuntimeConfig { network_config: Some(cri::NetworkConfig { pod_cidr: cidr.into() }) }),
    };
    rt.update_runtime_config(update("10.244.7.0/24")).await.unwrap();
    let text = std::fs::read_to_string(s.dir.path().join("cni/10-berth.conflist")).unwrap();
    let conflist: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.244.7.0/24");
    let r = rt.status(cri::StatusRequest { verbose: true }).await.unwrap().into_inner();
    let config: serde_json::Value = serde_json::from_str(&r.info["config"]).unwrap();
    assert_eq!(config["podCIDR"], "10.244.7.0/24");
    let e = rt.update_runtime_config(update("not-a-cidr")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("\"not-a-cidr\""), "{}", e.message());
    s.shutdown().await;
}

#[tokio::test]
async fn unserved_rpcs_answer_unimplemented_and_a_config_less_sandbox_is_invalid() {
    let s = Server::start().await;
    let mut rt = s.runtime().await;
    let e = rt.run_pod_sandbox(cri::RunPodSandboxRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("RunPodSandbox"), "{}", e.message());
    let e = rt.checkpoint_container(cri::CheckpointContainerRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    assert!(
        rt.list_containers(cri::ListContainersRequest::default()).await.unwrap().into_inner().containers.is_empty()
    );
    s.shutdown().await;
}

#[tokio::test]
async fn unknown_handler_is_invalid_argument_naming_the_configured_handlers() {
    let s = Server::start().await;
    let mut c = s.images().await;
    let e = pull(&mut c, "127.0.0.1:1/app:1.0", "kata").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("\"kata\"") && e.message().contains("gvisor, runc"), "{}", e.message());
    let e = c.image_status(cri::ImageStatusRequest { image: spec("x", "kata"), verbose: false }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = c.remove_image(cri::RemoveImageRequest { image: spec("x", "kata") }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let filter = Some(cri::ImageFilter { image: spec("", "kata") });
    let e = c.list_images(cri::ListImagesRequest { filter }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = pull(&mut c, "", "").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    s.shutdown().await;
}

#[tokio::test]
async fn an_empty_store_lists_nothing_and_removing_a_missing_image_succeeds() {
    let s = Server::start().await;
    let mut c = s.images().await;
    assert!(c.list_images(cri::ListImagesRequest { filter: None }).await.unwrap().into_inner().images.is_empty());
    assert!(list(&mut c, "", "gvisor").await.is_empty());
    let r = status(&mut c, "127.0.0.1:1/missing:1.0", "").await;
    assert!(r.image.is_none() && r.info.is_empty());
    c.remove_image(cri::RemoveImageRequest { image: spec("127.0.0.1:1/missing:1.0", "gvisor") }).await.unwrap();
    s.shutdown().await;
}

#[tokio::test]
async fn image_fs_info_reports_the_store_root() {
    let s = Server::start().await;
    let r = s.images().await.image_fs_info(cri::ImageFsInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(r.image_filesystems.len(), 1);
    let fs = &r.image_filesystems[0];
    assert!(fs.timestamp > 0);
    let mountpoint = fs.fs_id.as_ref().unwrap().mountpoint.clone();
    assert_eq!(Path::new(&mountpoint), s.dir.path().join("root/images"));
    assert!(fs.used_bytes.is_some() && fs.inodes_used.is_some());
    s.shutdown().await;
}

#[tokio::test]
async fn unreachable_registry_is_unavailable_naming_image_and_handler() {
    let s = Server::start().await;
    let port = berth_testenv::daemon::free_port();
    let image = format!("127.0.0.1:{port}/app:1.0");
    let e = pull(&mut s.images().await, &image, "gvisor").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{}", e.message());
    assert!(e.message().contains(&image) && e.message().contains("gvisor"), "{}", e.message());
    s.shutdown().await;
}

#[tokio::test]
async fn one_index_pulled_for_two_handlers_is_two_images_removed_separately() {
    let registry = berth_testenv::Registry::start();
    let set = registry.push_standard_set().await;
    let reference = set.multi.reference.clone();
    let s = Server::start().await;
    let mut c = s.images().await;

    let runc_id = pull(&mut c, &reference, "").await.unwrap();
    let gvisor_id = pull(&mut c, &reference, "gvisor").await.unwrap();
    assert_ne!(runc_id, gvisor_id, "each handler gets its platform's manifest");

    let all = list(&mut c, "", "").await;
    let mut seen: Vec<_> = all.iter().map(|i| (handler_of(i).to_string(), i.id.clone())).collect();
    seen.sort();
    assert_eq!(seen, [("gvisor".to_string(), gvisor_id.clone()), ("runc".to_string(), runc_id.clone())]);
    assert!(all.iter().all(|i| i.repo_tags == [reference.clone()] && i.size > 0));
    let only_gvisor = list(&mut c, "", "gvisor").await;
    assert_eq!(only_gvisor.len(), 1);
    assert_eq!(only_gvisor[0].id, gvisor_id);
    assert_eq!(list(&mut c, &reference, "").await.len(), 2, "filter by reference");
    assert_eq!(list(&mut c, &set.multi.reference.replace(":1.0", ""), "runc").await.len(), 1, "filter by repository");

    let st = status(&mut c, &reference, "gvisor").await;
    let image = st.image.unwrap();
    assert_eq!(image.id, gvisor_id);
    assert_eq!(handler_of(&image), "gvisor");
    let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
    assert_eq!(info["platform"]["architecture"], "arm64");
    assert_eq!(info["imageSpec"]["architecture"], "arm64");
    assert!(info["manifestDigest"].as_str().unwrap().starts_with("sha256:"));
    let st = status(&mut c, &reference, "").await;
    assert_eq!(handler_of(st.image.as_ref().unwrap()), "runc", "the default handler by name");

    c.remove_image(cri::RemoveImageRequest { image: spec(&reference, "gvisor") }).await.unwrap();
    assert!(status(&mut c, &reference, "gvisor").await.image.is_none());
    let left = list(&mut c, "", "").await;
    assert_eq!(left.len(), 1);
    assert_eq!((handler_of(&left[0]), left[0].id.as_str()), ("runc", runc_id.as_str()));
    assert_eq!(status(&mut c, &runc_id, "runc").await.image.unwrap().id, runc_id, "by id");
    s.shutdown().await;
}

#[tokio::test]
async fn streaming_pull_reports_layers_then_the_image_id() {
    let registry = berth_testenv::Registry::start();
    let set = registry.push_standard_set().await;
    let s = Server::start().await;
    let mut client = PullProgressClient::new(s.channel().await);
    let req = proto::PullRequest { image: set.multi.reference.clone(), handler: "gvisor".into(), auth: None };
    let mut stream = client.pull(req).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        events.push(e.event.unwrap());
    }
    use proto::pull_event::Event;
    assert!(matches!(events.first(), Some(Event::Resolved(r)) if !r.layers.is_empty()), "{events:?}");
    let Some(Event::Done(done)) = events.last() else { panic!("{events:?}") };
    assert_eq!(done.handler, "gvisor");
    let listed = list(&mut s.images().await, "", "gvisor").await;
    assert_eq!(listed[0].id, done.image_ref);

    let req = proto::PullRequest { image: set.multi.reference.clone(), handler: "kata".into(), auth: None };
    assert_eq!(client.pull(req).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    s.shutdown().await;
}
