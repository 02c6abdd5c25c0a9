//! The end of a pod on this node: a finished pod's containers and sandbox stopped (kept for
//! their logs), and a deleted pod torn down: preStop hooks and `StopContainer` within the grace
//! period, the final status, sandboxes, containers, cgroup and volumes removed, then the API
//! object deleted.

use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use kube::api::{Api, DeleteParams, Preconditions};

use super::{
    Finished, INVENTORY_WAIT, MIN_GRACE_SECONDS, Next, OnNode, PodRuntime, Shell, Shown, State, Stepped, WorkerError,
    field_path,
};
use crate::endpoint::Endpoint;
use crate::pods::actions::{self, Action, Outcome, Target};
use crate::pods::cgroups;
use crate::pods::cri as cricalls;
use crate::pods::status::InstanceState;
use crate::pods::volumes;
use berth_events as events;

/// How long the final status may take to be written before the pod object is deleted anyway.
const FINAL_STATUS_WAIT: Duration = Duration::from_secs(10);

impl Shell {
    /// Stops a finished pod's running containers and its sandboxes.
    pub(super) async fn finish(&mut self, node: &mut OnNode) -> Result<Stepped, WorkerError> {
        self.probes.clear();
        let instances = self.observe(&node.runtime).await?;
        let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
        for i in instances.iter().filter(|i| i.state == InstanceState::Running) {
            let c = self.container_spec(&i.name).cloned();
            let target = self.target(&node.runtime, node.sandbox.as_ref(), &i.id, c.as_ref());
            stop_with_hook(&node.runtime.endpoint, &i.id, c.as_ref(), target, grace, None).await?;
        }
        // Containers stay (for their logs) until the pod is deleted; the sandbox stops.
        for s in cricalls::list_sandboxes(&node.runtime.endpoint, Some(&self.uid)).await? {
            cricalls::stop_sandbox(&node.runtime.endpoint, &s.id).await?;
        }
        if let Some(s) = node.sandbox.as_mut() {
            s.ready = false;
        }
        let instances = self.observe(&node.runtime).await?;
        self.report(Shown::on_node(Some(node)), &instances, true).await?;
        Ok(Stepped::to(State::Finished(Finished::Stopped(Some(node.clone()))), Next::Idle))
    }

    fn grace_seconds(&self) -> i64 {
        if !self.in_api {
            return MIN_GRACE_SECONDS;
        }
        self.pod.metadata.deletion_grace_period_seconds.or(self.spec().termination_grace_period_seconds).unwrap_or(30)
    }

    /// Tears the pod down from `node`, or from the endpoint the runtime manager knows it on.
    pub(super) async fn terminate(&mut self, node: Option<&OnNode>) -> Result<Stepped, WorkerError> {
        let node = match node {
            Some(n) => Some(n.clone()),
            None => self.ctx.runtimes.endpoint_of(&self.uid).map(|endpoint| OnNode {
                runtime: PodRuntime {
                    runtime_name: self.ctx.runtime_name(&endpoint),
                    endpoint,
                    handler: String::new(),
                },
                sandbox: None,
            }),
        };
        if node.is_none() && self.may_run_on_an_unlisted_runtime() {
            // Its containers may run there: the API object goes only once they are stopped.
            return Ok(Stepped::stay(Next::After(INVENTORY_WAIT)));
        }
        if let Some(node) = &node {
            self.stop_all(node).await?;
        }
        let (root, uid, mounter) = (self.ctx.root_dir.clone(), self.uid.clone(), self.ctx.mounter.clone());
        tokio::task::spawn_blocking(move || volumes::clean_up(&root, &uid, mounter.as_ref()))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(|source| WorkerError::Cleanup { pod: self.pod_ref(), source })?;
        self.ctx.runtimes.forget(&self.uid);
        if self.in_api {
            self.delete_from_api().await?;
        }
        tracing::info!(pod = %self.pod_ref(), "pod removed from the node");
        Ok(Stepped::to(State::Done, Next::Exit))
    }

    /// Stops the containers within the grace period, reports the final status, and removes the
    /// pod's sandboxes, containers and cgroup.
    async fn stop_all(&mut self, node: &OnNode) -> Result<(), WorkerError> {
        let ep = &node.runtime.endpoint;
        let instances = self.observe(&node.runtime).await?;
        let grace = self.grace_seconds();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let mut stops = Vec::new();
        for i in instances.iter().filter(|i| matches!(i.state, InstanceState::Running | InstanceState::Created)) {
            let c = self.container_spec(&i.name).cloned();
            let init = self.is_init(&i.name);
            self.event(
                events::Type::Normal,
                &field_path(&i.name, init),
                "Killing",
                format!("Stopping container {}", i.name),
            );
            let target = self.target(&node.runtime, node.sandbox.as_ref(), &i.id, c.as_ref());
            let id = i.id.clone();
            stops.push(async move { stop_with_hook(ep, &id, c.as_ref(), target, grace, Some(deadline)).await });
        }
        for r in futures::future::join_all(stops).await {
            r?;
        }
        self.probes.clear();
        if self.in_api {
            let instances = self.observe(&node.runtime).await?;
            self.report(Shown::on_node(Some(node)), &instances, true).await?;
        }
        for s in cricalls::list_sandboxes(ep, Some(&self.uid)).await? {
            cricalls::stop_sandbox(ep, &s.id).await?;
            cricalls::remove_sandbox(ep, &s.id).await?;
        }
        for c in cricalls::list_containers(ep, Some(&self.uid)).await? {
            cricalls::remove_container(ep, &c.id).await?;
        }
        // Every QoS class's path: an orphan's class is not known any more.
        for qos in ["Guaranteed", "Burstable", "BestEffort"] {
            if let Err(e) = self.ctx.cgroups.remove(&cgroups::pod_path(qos, &self.uid)) {
                tracing::debug!(pod = %self.pod_ref(), error = %e, "pod cgroup not removed");
            }
        }
        Ok(())
    }

    /// Deletes the pod object with grace 0, once its final status is written (kubelet's order).
    async fn delete_from_api(&mut self) -> Result<(), WorkerError> {
        if let Some(writer) = &mut self.status_writer
            && !writer.flush(FINAL_STATUS_WAIT).await
        {
            tracing::warn!(pod = %self.pod_ref(), "the final status was not written in time; deleting anyway");
        }
        let (name, ns) = self.names();
        let api: Api<core::Pod> = Api::namespaced(self.ctx.client.clone(), &ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(self.uid.clone()), resource_version: None }),
            ..Default::default()
        };
        let permit = self.ctx.api_writes.acquire().await;
        let deleted = api.delete(&name, &params).await;
        drop(permit);
        match deleted {
            Ok(_) => Ok(()),
            // Already gone, or a new pod of the same name.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(source) => Err(WorkerError::Api { action: "deleting", pod: self.pod_ref(), source }),
        }
    }
}

/// Stops one container: its preStop hook (bounded by the grace period or `deadline`), then
/// `StopContainer` with what is left of the grace (at least kubelet's 2 s).
pub(super) async fn stop_with_hook(
    endpoint: &Endpoint,
    id: &str,
    c: Option<&core::Container>,
    target: Target,
    grace: i64,
    deadline: Option<tokio::time::Instant>,
) -> Result<(), WorkerError> {
    let deadline = deadline
        .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0)));
    if let Some(hook) = c.and_then(|c| c.lifecycle.as_ref()).and_then(|l| l.pre_stop.as_ref()) {
        let action = Action::of_handler(hook);
        let budget = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !budget.is_zero()
            && let Outcome::Failure(message) = actions::run(&action, &target, budget).await
        {
            tracing::info!(container = id, %message, "preStop hook failed");
        }
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now()).as_secs();
    let timeout = i64::try_from(left).unwrap_or(0).max(MIN_GRACE_SECONDS.min(grace.max(0)));
    cricalls::stop_container(endpoint, id, timeout).await?;
    Ok(())
}
