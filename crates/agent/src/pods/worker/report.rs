//! The pod's status: what the worker observed, handed to [`status::pod_status`] and written
//! through the pod's [`StatusWriter`] when it changed.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;

use super::{Shell, Shown, WorkerError};
use crate::pods::env::PodContext;
use crate::pods::status::{self, ContainerView, Instance, Observed, Waiting};
use crate::pods::status_writer::StatusWriter;

impl Shell {
    /// The IPs and node resources the pod's containers see.
    pub(super) fn pod_context(&self, sandbox: Option<&super::Sandbox>) -> PodContext {
        let host_ips = self.ctx.host_ips();
        let pod_ips = if self.spec().host_network == Some(true) {
            host_ips.clone()
        } else {
            sandbox.map(|s| s.ips.clone()).unwrap_or_default()
        };
        PodContext {
            host_ips,
            pod_ips,
            node_cpu_millis: self.ctx.cpu_millis,
            node_memory_bytes: self.ctx.memory_capacity,
        }
    }

    pub(super) fn observed(&self, shown: Shown<'_>, instances: &[Instance], terminal: bool) -> Observed {
        let ctx = self.pod_context(shown.sandbox);
        let mut containers = HashMap::new();
        let spec = self.spec();
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            let mut of_name = instances.iter().filter(|i| i.name == c.name);
            let current = of_name.next().cloned();
            let previous = of_name.next().cloned();
            let results = current
                .as_ref()
                .and_then(|i| self.probes.get(&i.id))
                .map(|p| p.sink.results.lock().unwrap_or_else(|e| e.into_inner()).clone());
            let (started, ready) = match results {
                Some(r) => (r.started, r.ready),
                // No probe task: probes not configured (or not yet started) decide.
                None => (c.startup_probe.is_none(), c.readiness_probe.is_none() && c.startup_probe.is_none()),
            };
            let waiting = self.waiting.get(&c.name).cloned();
            containers.insert(c.name.clone(), ContainerView { current, previous, waiting, ready, started });
        }
        Observed {
            sandbox_ready: shown.sandbox.is_some_and(|s| s.ready),
            pod_ips: ctx.pod_ips,
            host_ips: ctx.host_ips,
            containers,
            runtime_name: shown.runtime.map(|r| r.runtime_name.clone()).unwrap_or_default(),
            sandbox_blocked: shown.blocked.map(|e| Waiting::new(e.reason(), e.to_string())),
            terminal,
            deadline_exceeded: self.deadline().is_some_and(|d| d <= self.now()),
        }
    }

    /// When the pod's `activeDeadlineSeconds` runs out: from the start time it reported.
    pub(super) fn deadline(&self) -> Option<Timestamp> {
        let started = self.status.as_ref().or(self.pod.status.as_ref()).and_then(|s| s.start_time.as_ref());
        status::active_deadline(self.spec(), started.map(|t| t.0))
    }

    /// Computes the status from `instances` and writes it if it changed.
    pub(super) async fn report(
        &mut self,
        shown: Shown<'_>,
        instances: &[Instance],
        terminal: bool,
    ) -> Result<core::PodStatus, WorkerError> {
        self.report_with(shown, instances, terminal, false).await
    }

    /// [`Self::report`], possibly `deferred` (see [`StatusWriter::write`]).
    pub(super) async fn report_with(
        &mut self,
        shown: Shown<'_>,
        instances: &[Instance],
        terminal: bool,
        deferred: bool,
    ) -> Result<core::PodStatus, WorkerError> {
        let observed = self.observed(shown, instances, terminal);
        let status = status::pod_status(&self.pod, &observed, self.status.as_ref(), self.now());
        self.write_status(status.clone(), deferred).await?;
        Ok(status)
    }

    /// Records `status` as the pod's and hands it to the pod's status writer when it changed;
    /// does not wait for the API (see [`StatusWriter`]).
    pub(super) async fn write_status(&mut self, status: core::PodStatus, deferred: bool) -> Result<(), WorkerError> {
        if self.status.as_ref() == Some(&status) || !self.in_api {
            self.status = Some(status);
            return Ok(());
        }
        let writer = match &mut self.status_writer {
            Some(w) => w,
            None => {
                let (name, ns) = self.names();
                self.status_writer.insert(StatusWriter::spawn(
                    self.ctx.client.clone(),
                    self.ctx.api_writes.clone(),
                    &ns,
                    &name,
                    self.pod_ref(),
                ))
            }
        };
        writer.write(status.clone(), deferred);
        self.status = Some(status);
        Ok(())
    }
}
