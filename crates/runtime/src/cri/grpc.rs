//! The one thin adapter from the generated gRPC traits (CRI v1 `ImageService` and
//! `RuntimeService`, berth's `PullProgress`) to [`Cri`]'s plain methods.

use std::pin::Pin;
use std::sync::Arc;

use berth_image::Progress;
use futures::Stream;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Cri, Error};
use crate::proto;
use crate::proto::pull_progress_server::{PullProgress, PullProgressServer};

/// Every service berth serves on its socket, routed by gRPC service name.
pub fn routes(cri: Arc<Cri>) -> tonic::service::Routes {
    tonic::service::Routes::new(ImageServiceServer::new(Grpc(Arc::clone(&cri))))
        .add_service(RuntimeServiceServer::new(Grpc(Arc::clone(&cri))))
        .add_service(PullProgressServer::new(Grpc(cri)))
}

#[derive(Clone)]
struct Grpc(Arc<Cri>);

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn unimplemented<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    Err(Error::Unimplemented { rpc }.into())
}

#[tonic::async_trait]
impl ImageService for Grpc {
    async fn list_images(
        &self,
        r: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        Ok(Response::new(self.0.list_images(r.into_inner()).await?))
    }

    async fn image_status(
        &self,
        r: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        Ok(Response::new(self.0.image_status(r.into_inner()).await?))
    }

    async fn pull_image(&self, r: Request<cri::PullImageRequest>) -> Result<Response<cri::PullImageResponse>, Status> {
        Ok(Response::new(self.0.pull_image(r.into_inner()).await?))
    }

    async fn remove_image(
        &self,
        r: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        Ok(Response::new(self.0.remove_image(r.into_inner()).await?))
    }

    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        Ok(Response::new(self.0.image_fs_info().await?))
    }
}

#[tonic::async_trait]
impl PullProgress for Grpc {
    type PullStream = EventStream<proto::PullEvent>;

    async fn pull(&self, r: Request<proto::PullRequest>) -> Result<Response<Self::PullStream>, Status> {
        let r = r.into_inner();
        let auth = r.auth.map(cri::AuthConfig::from);
        let mut task = self.0.start_pull(&r.image, &r.handler, auth)?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            // A client that went away stops receiving, not the pull.
            while let Some(p) = task.next_progress().await {
                if let Some(event) = progress_event(p) {
                    let _ = tx.send(Ok(event)).await;
                }
            }
            let handler = task.handler.clone();
            let last = match task.finish().await {
                Ok(record) => Ok(proto::PullEvent {
                    event: Some(proto::pull_event::Event::Done(proto::Done { image_ref: record.id, handler })),
                }),
                Err(e) => Err(Status::from(e)),
            };
            let _ = tx.send(last).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The image store's progress as wire events; its own `Done` is replaced by ours, which follows
/// the stored record.
fn progress_event(p: Progress) -> Option<proto::PullEvent> {
    use proto::pull_event::Event;
    let event = match p {
        Progress::Resolved { manifest, layers } => Event::Resolved(proto::Resolved {
            manifest,
            layers: layers.into_iter().map(|(digest, size)| proto::Layer { digest, size }).collect(),
        }),
        Progress::Downloading { digest, done, total } => Event::Downloading(proto::Downloading { digest, done, total }),
        Progress::Downloaded { digest } => Event::Downloaded(proto::LayerDone { digest }),
        Progress::Unpacked { digest } => Event::Unpacked(proto::LayerDone { digest }),
        Progress::Done { .. } => return None,
    };
    Some(proto::PullEvent { event: Some(event) })
}

#[tonic::async_trait]
impl RuntimeService for Grpc {
    type GetContainerEventsStream = EventStream<cri::ContainerEventResponse>;

    async fn version(&self, r: Request<cri::VersionRequest>) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(self.0.version(r.into_inner())))
    }

    async fn status(&self, r: Request<cri::StatusRequest>) -> Result<Response<cri::StatusResponse>, Status> {
        Ok(Response::new(self.0.status(r.into_inner())))
    }

    async fn get_container_events(
        &self,
        _: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        use futures::StreamExt as _;
        use tokio_stream::wrappers::BroadcastStream;
        // A subscriber too slow to keep up loses events rather than stalling the runtime; it is
        // told so by a DataLoss status item.
        let stream = BroadcastStream::new(self.0.subscribe())
            .map(|item| item.map_err(|e| Status::data_loss(format!("container events were dropped: {e}"))))
            .take_until(self.0.closed());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        Ok(Response::new(self.0.run_pod_sandbox(r.into_inner()).await?))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        Ok(Response::new(self.0.stop_pod_sandbox(r.into_inner()).await?))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        Ok(Response::new(self.0.remove_pod_sandbox(r.into_inner()).await?))
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        Ok(Response::new(self.0.pod_sandbox_status(r.into_inner())?))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        Ok(Response::new(self.0.list_pod_sandbox(r.into_inner())))
    }

    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        Ok(Response::new(self.0.create_container(r.into_inner()).await?))
    }

    async fn start_container(
        &self,
        r: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        Ok(Response::new(self.0.start_container(r.into_inner()).await?))
    }

    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        Ok(Response::new(self.0.stop_container(r.into_inner()).await?))
    }

    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        Ok(Response::new(self.0.remove_container(r.into_inner()).await?))
    }

    async fn list_containers(
        &self,
        r: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        Ok(Response::new(self.0.list_containers(r.into_inner())))
    }

    async fn container_status(
        &self,
        r: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        Ok(Response::new(self.0.container_status(r.into_inner())?))
    }

    async fn update_container_resources(
        &self,
        r: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        Ok(Response::new(self.0.update_container_resources(r.into_inner()).await?))
    }

    async fn reopen_container_log(
        &self,
        r: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        Ok(Response::new(self.0.reopen_container_log(r.into_inner())?))
    }

    async fn exec_sync(&self, r: Request<cri::ExecSyncRequest>) -> Result<Response<cri::ExecSyncResponse>, Status> {
        Ok(Response::new(self.0.exec_sync(r.into_inner()).await?))
    }

    async fn exec(&self, r: Request<cri::ExecRequest>) -> Result<Response<cri::ExecResponse>, Status> {
        Ok(Response::new(self.0.exec(r.into_inner())?))
    }

    async fn attach(&self, r: Request<cri::AttachRequest>) -> Result<Response<cri::AttachResponse>, Status> {
        Ok(Response::new(self.0.attach(r.into_inner())?))
    }

    async fn port_forward(
        &self,
        r: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        Ok(Response::new(self.0.port_forward(r.into_inner())?))
    }

    async fn container_stats(
        &self,
        r: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        Ok(Response::new(self.0.container_stats(r.into_inner())?))
    }

    async fn list_container_stats(
        &self,
        r: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        Ok(Response::new(self.0.list_container_stats(r.into_inner())))
    }

    async fn pod_sandbox_stats(
        &self,
        r: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        Ok(Response::new(self.0.pod_sandbox_stats(r.into_inner())?))
    }

    async fn list_pod_sandbox_stats(
        &self,
        r: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        Ok(Response::new(self.0.list_pod_sandbox_stats(r.into_inner())))
    }

    async fn update_runtime_config(
        &self,
        r: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        Ok(Response::new(self.0.update_runtime_config(r.into_inner())?))
    }

    async fn checkpoint_container(
        &self,
        _: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        unimplemented("CheckpointContainer")
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        Ok(Response::new(self.0.runtime_config()))
    }
}
