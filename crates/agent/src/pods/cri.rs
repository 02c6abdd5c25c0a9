//! The CRI calls the pod workers make on one endpoint (through its [`Cri`](crate::endpoint::Cri)),
//! with errors that name the call and the endpoint, and "not found" turned into `None` where CRI
//! allows it.

use std::collections::HashMap;

use k8s_cri::v1 as cri;

use super::labels;
use crate::endpoint::Endpoint;

/// A CRI call failed.
#[derive(Debug, thiserror::Error)]
#[error("CRI {call} on runtime {endpoint}")]
pub struct CriError {
    pub call: &'static str,
    pub endpoint: String,
    #[source]
    pub status: tonic::Status,
}

impl CriError {
    /// The error as kubelet shows gRPC errors: `rpc error: code = NotFound desc = …`.
    pub fn rpc(&self) -> String {
        rpc_message(&self.status)
    }

    pub fn is_not_found(&self) -> bool {
        self.status.code() == tonic::Code::NotFound
    }
}

pub fn rpc_message(status: &tonic::Status) -> String {
    format!("rpc error: code = {:?} desc = {}", status.code(), status.message())
}

type Result<T> = std::result::Result<T, CriError>;

fn err<'a>(call: &'static str, ep: &'a Endpoint) -> impl FnOnce(tonic::Status) -> CriError + 'a {
    move |status| CriError { call, endpoint: ep.name.clone(), status }
}

fn not_found_is_none<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

fn uid_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(labels::POD_UID.to_string(), uid.to_string())])
}

/// The sandboxes this node's agent made (all pods, or the one with `uid`).
pub async fn node_sandboxes(ep: &Endpoint, node: &str) -> Result<Vec<cri::PodSandbox>> {
    let filter = cri::PodSandboxFilter {
        label_selector: HashMap::from([(labels::NODE.to_string(), node.to_string())]),
        ..Default::default()
    };
    let resp = ep.cri.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await;
    Ok(resp.map_err(err("ListPodSandbox", ep))?.items)
}

/// The containers this node's agent made.
pub async fn node_containers(ep: &Endpoint, node: &str) -> Result<Vec<cri::Container>> {
    let filter = cri::ContainerFilter {
        label_selector: HashMap::from([(labels::NODE.to_string(), node.to_string())]),
        ..Default::default()
    };
    let resp = ep.cri.list_containers(cri::ListContainersRequest { filter: Some(filter) }).await;
    Ok(resp.map_err(err("ListContainers", ep))?.containers)
}

pub async fn list_sandboxes(ep: &Endpoint, uid: Option<&str>) -> Result<Vec<cri::PodSandbox>> {
    let filter = uid.map(|u| cri::PodSandboxFilter { label_selector: uid_selector(u), ..Default::default() });
    let resp = ep.cri.list_pod_sandbox(cri::ListPodSandboxRequest { filter }).await;
    Ok(resp.map_err(err("ListPodSandbox", ep))?.items)
}

pub async fn sandbox_status(ep: &Endpoint, id: &str) -> Result<Option<cri::PodSandboxStatus>> {
    let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
    let resp = ep.cri.pod_sandbox_status(req).await.map_err(err("PodSandboxStatus", ep));
    Ok(not_found_is_none(resp)?.and_then(|r| r.status))
}

pub async fn run_sandbox(ep: &Endpoint, config: cri::PodSandboxConfig, handler: &str) -> Result<String> {
    let req = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: handler.to_string() };
    Ok(ep.cri.run_pod_sandbox(req).await.map_err(err("RunPodSandbox", ep))?.pod_sandbox_id)
}

pub async fn stop_sandbox(ep: &Endpoint, id: &str) -> Result<()> {
    let req = cri::StopPodSandboxRequest { pod_sandbox_id: id.to_string() };
    not_found_is_none(ep.cri.stop_pod_sandbox(req).await.map_err(err("StopPodSandbox", ep)))?;
    Ok(())
}

pub async fn remove_sandbox(ep: &Endpoint, id: &str) -> Result<()> {
    let req = cri::RemovePodSandboxRequest { pod_sandbox_id: id.to_string() };
    not_found_is_none(ep.cri.remove_pod_sandbox(req).await.map_err(err("RemovePodSandbox", ep)))?;
    Ok(())
}

pub async fn list_containers(ep: &Endpoint, uid: Option<&str>) -> Result<Vec<cri::Container>> {
    let filter = uid.map(|u| cri::ContainerFilter { label_selector: uid_selector(u), ..Default::default() });
    let resp = ep.cri.list_containers(cri::ListContainersRequest { filter }).await;
    Ok(resp.map_err(err("ListContainers", ep))?.containers)
}

pub async fn container_status(ep: &Endpoint, id: &str) -> Result<Option<cri::ContainerStatus>> {
    let req = cri::ContainerStatusRequest { container_id: id.to_string(), verbose: false };
    let resp = ep.cri.container_status(req).await.map_err(err("ContainerStatus", ep));
    Ok(not_found_is_none(resp)?.and_then(|r| r.status))
}

pub async fn create_container(
    ep: &Endpoint,
    sandbox_id: &str,
    config: cri::ContainerConfig,
    sandbox_config: &cri::PodSandboxConfig,
) -> Result<String> {
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.to_string(),
        config: Some(config),
        sandbox_config: Some(sandbox_config.clone()),
    };
    Ok(ep.cri.create_container(req).await.map_err(err("CreateContainer", ep))?.container_id)
}

pub async fn start_container(ep: &Endpoint, id: &str) -> Result<()> {
    let req = cri::StartContainerRequest { container_id: id.to_string() };
    ep.cri.start_container(req).await.map_err(err("StartContainer", ep))?;
    Ok(())
}

/// Stops a container, killing it after `grace_seconds`.
pub async fn stop_container(ep: &Endpoint, id: &str, grace_seconds: i64) -> Result<()> {
    let req = cri::StopContainerRequest { container_id: id.to_string(), timeout: grace_seconds };
    not_found_is_none(ep.cri.stop_container(req).await.map_err(err("StopContainer", ep)))?;
    Ok(())
}

pub async fn remove_container(ep: &Endpoint, id: &str) -> Result<()> {
    let req = cri::RemoveContainerRequest { container_id: id.to_string() };
    not_found_is_none(ep.cri.remove_container(req).await.map_err(err("RemoveContainer", ep)))?;
    Ok(())
}

pub async fn image_status(ep: &Endpoint, image: &str, handler: &str) -> Result<Option<cri::Image>> {
    let req = cri::ImageStatusRequest { image: Some(image_spec(image, handler)), verbose: false };
    let resp = ep.cri.image_status(req).await.map_err(err("ImageStatus", ep));
    Ok(not_found_is_none(resp)?.and_then(|r| r.image))
}

/// Pulls `image` for `handler`; returns the image reference to create containers from.
pub async fn pull_image(
    ep: &Endpoint,
    image: &str,
    handler: &str,
    auth: Option<cri::AuthConfig>,
    sandbox_config: &cri::PodSandboxConfig,
) -> Result<String> {
    let req = cri::PullImageRequest {
        image: Some(image_spec(image, handler)),
        auth,
        sandbox_config: Some(sandbox_config.clone()),
    };
    Ok(ep.cri.pull_image(req).await.map_err(err("PullImage", ep))?.image_ref)
}

pub async fn list_images(ep: &Endpoint) -> Result<Vec<cri::Image>> {
    let resp = ep.cri.list_images(cri::ListImagesRequest { filter: None }).await;
    Ok(resp.map_err(err("ListImages", ep))?.images)
}

pub async fn remove_image(ep: &Endpoint, image: &str, handler: &str) -> Result<()> {
    let req = cri::RemoveImageRequest { image: Some(image_spec(image, handler)) };
    not_found_is_none(ep.cri.remove_image(req).await.map_err(err("RemoveImage", ep)))?;
    Ok(())
}

pub async fn image_fs_info(ep: &Endpoint) -> Result<cri::ImageFsInfoResponse> {
    let resp = ep.cri.image_fs_info(cri::ImageFsInfoRequest {}).await;
    resp.map_err(err("ImageFsInfo", ep))
}

pub fn image_spec(image: &str, handler: &str) -> cri::ImageSpec {
    cri::ImageSpec { image: image.to_string(), runtime_handler: handler.to_string(), ..Default::default() }
}
