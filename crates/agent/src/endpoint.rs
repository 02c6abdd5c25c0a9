//! One CRI endpoint: its name, workload type, the gRPC clients of its runtime and image services,
//! and [`Cri`], the calls the pod workers make, behind a trait so that a fake can stand in.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

/// Why an endpoint could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint {endpoint:?} is not unix:///path/to/socket")]
    NotUnix { endpoint: String },
    #[error("connecting to {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// A connected CRI runtime. Clients are cheap to clone; calls on a runtime that went away fail
/// with `Unavailable` and the channel reconnects on the next call.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `container` (the only workload type served in this wave) or another from the seed's list.
    pub workload_type: String,
    /// The endpoint's name in the agent's configuration, e.g. `berth` or `containerd`.
    pub name: String,
    /// The runtime's socket, `unix:///run/berth/runtime.sock`.
    pub address: String,
    /// The image service's socket; empty when it is the runtime's.
    pub image_address: String,
    /// Handlers to assume when the runtime's Status lists none (containerd 1.6).
    pub configured_handlers: Vec<String>,
    /// The clients for what [`Cri`] does not cover (status, events, streaming, logs).
    pub runtime: RuntimeServiceClient<Channel>,
    pub images: ImageServiceClient<Channel>,
    /// The calls of the pod workers, image GC and hooks: the clients above, or a fake.
    pub cri: Arc<dyn Cri>,
    /// True while the runtime's container event stream is connected: its pods' workers are then
    /// woken by events and need to look on their own only now and then.
    pub events_live: Arc<AtomicBool>,
}

impl Endpoint {
    /// Clients for `address` (runtime) and `image_address` (images; empty means the runtime's).
    /// Connects lazily, so an endpoint that is down at start still gets its clients.
    pub fn connect_lazy(
        workload_type: &str,
        name: &str,
        address: &str,
        image_address: &str,
    ) -> Result<Self, EndpointError> {
        let runtime = channel(address)?;
        let images = if image_address.is_empty() || image_address == address {
            runtime.clone()
        } else {
            channel(image_address)?
        };
        let runtime = RuntimeServiceClient::new(runtime).max_decoding_message_size(MAX_MESSAGE);
        let images = ImageServiceClient::new(images).max_decoding_message_size(MAX_MESSAGE);
        Ok(Self {
            workload_type: workload_type.to_string(),
            name: name.to_string(),
            address: address.to_string(),
            image_address: if image_address == address { String::new() } else { image_address.to_string() },
            configured_handlers: Vec::new(),
            cri: Arc::new(Grpc { runtime: runtime.clone(), images: images.clone() }),
            runtime,
            images,
            events_live: Arc::new(AtomicBool::new(false)),
        })
    }

    /// An endpoint whose [`Cri`] calls go to `cri`; its gRPC clients point at `address`, which
    /// need not exist (calls on them fail with `Unavailable`).
    pub fn with_cri(workload_type: &str, name: &str, address: &str, cri: Arc<dyn Cri>) -> Result<Self, EndpointError> {
        Ok(Self { cri, ..Self::connect_lazy(workload_type, name, address, "")? })
    }
}

/// A CRI call's answer.
pub type Call<'a, T> = BoxFuture<'a, Result<T, tonic::Status>>;

/// The CRI calls of the pod workers, image GC and exec hooks and probes, with CRI's own request
/// and response messages. [`Grpc`] makes them over the endpoint's socket.
pub trait Cri: Send + Sync + std::fmt::Debug {
    fn list_pod_sandbox(&self, req: cri::ListPodSandboxRequest) -> Call<'_, cri::ListPodSandboxResponse>;
    fn pod_sandbox_status(&self, req: cri::PodSandboxStatusRequest) -> Call<'_, cri::PodSandboxStatusResponse>;
    fn run_pod_sandbox(&self, req: cri::RunPodSandboxRequest) -> Call<'_, cri::RunPodSandboxResponse>;
    fn stop_pod_sandbox(&self, req: cri::StopPodSandboxRequest) -> Call<'_, cri::StopPodSandboxResponse>;
    fn remove_pod_sandbox(&self, req: cri::RemovePodSandboxRequest) -> Call<'_, cri::RemovePodSandboxResponse>;
    fn list_containers(&self, req: cri::ListContainersRequest) -> Call<'_, cri::ListContainersResponse>;
    fn container_status(&self, req: cri::ContainerStatusRequest) -> Call<'_, cri::ContainerStatusResponse>;
    fn create_container(&self, req: cri::CreateContainerRequest) -> Call<'_, cri::CreateContainerResponse>;
    fn start_container(&self, req: cri::StartContainerRequest) -> Call<'_, cri::StartContainerResponse>;
    fn stop_container(&self, req: cri::StopContainerRequest) -> Call<'_, cri::StopContainerResponse>;
    fn remove_container(&self, req: cri::RemoveContainerRequest) -> Call<'_, cri::RemoveContainerResponse>;
    fn exec_sync(&self, req: cri::ExecSyncRequest) -> Call<'_, cri::ExecSyncResponse>;
    fn image_status(&self, req: cri::ImageStatusRequest) -> Call<'_, cri::ImageStatusResponse>;
    fn pull_image(&self, req: cri::PullImageRequest) -> Call<'_, cri::PullImageResponse>;
    fn list_images(&self, req: cri::ListImagesRequest) -> Call<'_, cri::ListImagesResponse>;
    fn remove_image(&self, req: cri::RemoveImageRequest) -> Call<'_, cri::RemoveImageResponse>;
    fn image_fs_info(&self, req: cri::ImageFsInfoRequest) -> Call<'_, cri::ImageFsInfoResponse>;
}

/// [`Cri`] over gRPC: the runtime and image service clients of an endpoint.
#[derive(Clone, Debug)]
pub struct Grpc {
    pub runtime: RuntimeServiceClient<Channel>,
    pub images: ImageServiceClient<Channel>,
}

/// One [`Cri`] method of [`Grpc`]: a call on a clone of the named client.
macro_rules! grpc_call {
    ($client:ident, $method:ident, $req:ty, $resp:ty) => {
        fn $method(&self, req: $req) -> Call<'_, $resp> {
            let mut client = self.$client.clone();
            Box::pin(async move { Ok(client.$method(req).await?.into_inner()) })
        }
    };
}

impl Cri for Grpc {
    grpc_call!(runtime, list_pod_sandbox, cri::ListPodSandboxRequest, cri::ListPodSandboxResponse);
    grpc_call!(runtime, pod_sandbox_status, cri::PodSandboxStatusRequest, cri::PodSandboxStatusResponse);
    grpc_call!(runtime, run_pod_sandbox, cri::RunPodSandboxRequest, cri::RunPodSandboxResponse);
    grpc_call!(runtime, stop_pod_sandbox, cri::StopPodSandboxRequest, cri::StopPodSandboxResponse);
    grpc_call!(runtime, remove_pod_sandbox, cri::RemovePodSandboxRequest, cri::RemovePodSandboxResponse);
    grpc_call!(runtime, list_containers, cri::ListContainersRequest, cri::ListContainersResponse);
    grpc_call!(runtime, container_status, cri::ContainerStatusRequest, cri::ContainerStatusResponse);
    grpc_call!(runtime, create_container, cri::CreateContainerRequest, cri::CreateContainerResponse);
    grpc_call!(runtime, start_container, cri::StartContainerRequest, cri::StartContainerResponse);
    grpc_call!(runtime, stop_container, cri::StopContainerRequest, cri::StopContainerResponse);
    grpc_call!(runtime, remove_container, cri::RemoveContainerRequest, cri::RemoveContainerResponse);
    grpc_call!(runtime, exec_sync, cri::ExecSyncRequest, cri::ExecSyncResponse);
    grpc_call!(images, image_status, cri::ImageStatusRequest, cri::ImageStatusResponse);
    grpc_call!(images, pull_image, cri::PullImageRequest, cri::PullImageResponse);
    grpc_call!(images, list_images, cri::ListImagesRequest, cri::ListImagesResponse);
    grpc_call!(images, remove_image, cri::RemoveImageRequest, cri::RemoveImageResponse);
    grpc_call!(images, image_fs_info, cri::ImageFsInfoRequest, cri::ImageFsInfoResponse);
}

impl Endpoint {
    /// Clients for an endpoint of the agent's configuration.
    pub fn from_config(config: &crate::config::EndpointConfig) -> Result<Self, EndpointError> {
        Ok(Self::connect_lazy(&config.workload_type, &config.name, &config.endpoint, &config.image_endpoint)?
            .with_configured_handlers(config.handlers.clone()))
    }

    /// Sets the handlers assumed when the runtime's Status lists none.
    pub fn with_configured_handlers(mut self, handlers: Vec<String>) -> Self {
        self.configured_handlers = handlers;
        self
    }

    /// Whether `other` talks to the same sockets under the same name (its status carries over).
    pub fn same_runtime(&self, other: &Endpoint) -> bool {
        self.name == other.name
            && self.workload_type == other.workload_type
            && self.address == other.address
            && self.image_address == other.image_address
    }
}

/// kubelet's limit for CRI responses (large container lists).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// The socket path of a `unix://` endpoint (a bare absolute path is accepted too).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(EndpointError::NotUnix { endpoint: endpoint.to_string() })
    }
}

fn channel(endpoint: &str) -> Result<Channel, EndpointError> {
    let path = socket_path(endpoint)?;
    // The URI is required but unused: every connection goes to the socket.
    let channel = TonicEndpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }));
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_endpoints_and_bare_paths_name_sockets_but_tcp_does_not() {
        assert_eq!(socket_path("unix:///run/x.sock").unwrap(), PathBuf::from("/run/x.sock"));
        assert_eq!(socket_path("/run/x.sock").unwrap(), PathBuf::from("/run/x.sock"));
        assert!(matches!(socket_path("tcp://1.2.3.4:5"), Err(EndpointError::NotUnix { .. })));
        assert!(matches!(socket_path("unix://"), Err(EndpointError::NotUnix { .. })));
    }
}
