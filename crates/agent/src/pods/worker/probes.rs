//! The probe tasks of the pod's running containers, and the [`Target`] that probes and hooks
//! reach a container through.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;

use super::{PodRuntime, Running, Sandbox, Shell, field_path};
use crate::pods::actions::{self, Action, Outcome, Target};
use crate::pods::probe::{self, Prober, Sink};
use crate::pods::status::{Instance, InstanceState};
use berth_events::{self as events, PodEvent};

/// A container's probes, running until dropped.
pub(super) struct ProbeTask {
    task: tokio::task::JoinHandle<()>,
    pub(super) sink: Arc<Sink>,
}

impl Drop for ProbeTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shell {
    pub(super) fn target(
        &self,
        runtime: &PodRuntime,
        sandbox: Option<&Sandbox>,
        container_id: &str,
        c: Option<&core::Container>,
    ) -> Target {
        let ctx = self.pod_context(sandbox);
        Target {
            endpoint: runtime.endpoint.clone(),
            container_id: container_id.to_string(),
            pod_ip: ctx.pod_ips.first().cloned().unwrap_or_else(|| "127.0.0.1".into()),
            ports: c.and_then(|c| c.ports.clone()).unwrap_or_default(),
        }
    }

    /// Keeps one probe task per running container of the current sandbox that has probes.
    pub(super) fn sync_probes(&mut self, r: &Running, instances: &[Instance]) {
        let sandbox = r.sandbox.held().map(|s| s.id.as_str()).unwrap_or("");
        let mut running = HashSet::new();
        for i in instances.iter().filter(|i| i.state == InstanceState::Running && i.sandbox_id == sandbox) {
            let Some(c) = self.container_spec(&i.name).cloned() else { continue };
            if c.liveness_probe.is_none() && c.readiness_probe.is_none() && c.startup_probe.is_none() {
                continue;
            }
            running.insert(i.id.clone());
            if self.probes.contains_key(&i.id) {
                continue;
            }
            let now = self.now();
            let started_at = i.started_at.map_or(tokio::time::Instant::now(), |t| {
                let ago = Duration::try_from(now.duration_since(t)).unwrap_or_default();
                tokio::time::Instant::now().checked_sub(ago).unwrap_or_else(tokio::time::Instant::now)
            });
            let (events, (name, ns)) = (self.ctx.events.clone(), self.names());
            let (uid, path) = (self.uid.clone(), field_path(&c.name, self.is_init(&c.name)));
            let sink = Arc::new(Sink {
                results: Mutex::new(probe::Results::default()),
                changed: self.probe_changed.clone(),
                on_failure: Box::new(move |kind, msg| {
                    events.emit(PodEvent {
                        namespace: ns.clone(),
                        pod_name: name.clone(),
                        pod_uid: uid.clone(),
                        field_path: path.clone(),
                        type_: events::Type::Warning,
                        reason: "Unhealthy".into(),
                        message: format!("{} probe failed: {msg}", kind.name()),
                    })
                }),
            });
            let target = self.target(&r.runtime, r.sandbox.held(), &i.id, Some(&c));
            let prober: Arc<dyn Prober> = Arc::new(CriProber { target });
            let task = tokio::spawn(probe::run(c, started_at, prober, sink.clone()));
            self.probes.insert(i.id.clone(), ProbeTask { task, sink });
        }
        self.probes.retain(|id, _| running.contains(id));
    }
}

/// Probes through CRI and the network.
struct CriProber {
    target: Target,
}

impl Prober for CriProber {
    fn probe<'a>(
        &'a self,
        action: &'a Action,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + 'a>> {
        Box::pin(actions::run(action, &self.target, timeout))
    }
}
