//! Resolve: the pod's RuntimeClass → its handler → the endpoint that holds the pod already
//! (recovered) or the one the runtime manager selects; or why there is none.

use std::time::Duration;

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::{
    Finished, INVENTORY_WAIT, Next, PodRuntime, Running, Selecting, Shell, Shown, State, Stepped, WorkerError,
};
use crate::pods::status;
use crate::runtimes::{SERVICE_ANNOTATION, SelectError};
use berth_events as events;

impl Shell {
    /// The handler of the pod's RuntimeClass (`""` without one); `Err(name)` if the class is missing.
    async fn handler(&self) -> Result<Result<String, String>, WorkerError> {
        let Some(class) = self.spec().runtime_class_name.clone().filter(|c| !c.is_empty()) else {
            return Ok(Ok(String::new()));
        };
        if let Some(rc) = self.ctx.runtime_classes.get(&ObjectRef::new(&class)) {
            return Ok(Ok(rc.handler.clone()));
        }
        // The cache may lag behind a class created a moment ago: the API decides.
        let api: Api<RuntimeClass> = Api::all(self.ctx.client.clone());
        match api.get_opt(&class).await {
            Ok(Some(rc)) => Ok(Ok(rc.handler)),
            Ok(None) => Ok(Err(class)),
            Err(source) => Err(WorkerError::Api { action: "reading the RuntimeClass", pod: self.pod_ref(), source }),
        }
    }

    /// Whether an agent took this pod up before (it has a `startTime`) while a runtime whose pods
    /// were never listed (unreachable since this agent started) may hold its sandbox.
    pub(super) fn may_run_on_an_unlisted_runtime(&mut self) -> bool {
        let started = self.status.as_ref().is_some_and(|s| s.start_time.is_some());
        let unlisted: Vec<String> = self.ctx.runtimes.uninventoried().iter().map(|e| e.name.clone()).collect();
        if !started || unlisted.is_empty() {
            return false;
        }
        if !self.reported_unlisted {
            self.reported_unlisted = true;
            tracing::info!(pod = %self.pod_ref(), runtimes = ?unlisted, "waiting for runtimes that may hold the pod to answer before starting it");
        }
        true
    }

    pub(super) async fn resolve(&mut self, selecting: &mut Selecting) -> Result<Stepped, WorkerError> {
        let finished = matches!(self.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        if finished && self.ctx.runtimes.endpoint_of(&self.uid).is_none() {
            // Finished before this agent started and nothing of it on the node: nothing to do.
            return Ok(Stepped::to(State::Finished(Finished::Stopped(None)), Next::Idle));
        }
        let handler = match self.handler().await? {
            Ok(h) => h,
            Err(class) => {
                // The seed's choice over today's kubelet (which retries forever): fail the pod.
                let message = format!("RuntimeClass {class:?} not found");
                self.event(events::Type::Warning, "", "RuntimeClassNotFound", &message);
                let observed = self.observed(Shown::default(), &[], false);
                let mut status = status::pod_status(&self.pod, &observed, self.status.as_ref(), self.now());
                status.phase = Some("Failed".into());
                status.reason = Some("RuntimeClassNotFound".into());
                status.message = Some(message);
                self.write_status(status, false).await?;
                return Ok(Stepped::to(State::Finished(Finished::Stopped(None)), Next::Idle));
            }
        };
        let pinned = self.pod.metadata.annotations.as_ref().and_then(|a| a.get(SERVICE_ANNOTATION)).cloned();
        let nothing_on_node =
            self.ctx.runtimes.endpoint_name_of(&self.uid).is_none() && self.ctx.runtimes.uninventoried().is_empty();
        let endpoint = match self.ctx.runtimes.endpoint_of(&self.uid) {
            Some(ep) => ep,
            None if self.may_run_on_an_unlisted_runtime() => {
                // Starting it elsewhere could run it twice: wait until those runtimes answer.
                return Ok(Stepped::stay(Next::After(INVENTORY_WAIT)));
            }
            None => match self.ctx.runtimes.select(&handler, pinned.as_deref()) {
                Ok(ep) => ep,
                Err(e) => return self.no_runtime(e, selecting).await,
            },
        };
        self.ctx.runtimes.remember(&self.uid, &endpoint.name);
        tracing::debug!(pod = %self.pod_ref(), endpoint = %endpoint.name, handler, "pod resolved");
        let runtime_name = self.ctx.runtime_name(&endpoint);
        let runtime = PodRuntime { endpoint, handler, runtime_name };
        let state = if finished {
            State::Finished(Finished::Stopping(super::OnNode { runtime, sandbox: None }))
        } else {
            State::Running(Running::new(runtime, nothing_on_node))
        };
        Ok(Stepped::to(state, Next::Now))
    }

    async fn no_runtime(&mut self, error: SelectError, selecting: &mut Selecting) -> Result<Stepped, WorkerError> {
        let message = error.to_string();
        if selecting.reported.as_deref() != Some(message.as_str()) {
            tracing::info!(pod = %self.pod_ref(), %message, "no runtime for the pod's handler");
            self.event(events::Type::Warning, "", error.reason(), &message);
            selecting.reported = Some(message);
        }
        self.report(Shown { blocked: Some(&error), ..Shown::default() }, &[], false).await?;
        let wait = selecting.retry;
        selecting.retry = (selecting.retry * 2).min(Duration::from_secs(60));
        Ok(Stepped::to(State::NoRuntime(error, selecting.clone()), Next::After(wait)))
    }
}
