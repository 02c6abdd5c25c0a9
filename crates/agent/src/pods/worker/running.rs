//! Running: one level-triggered sync of a pod whose containers run, like kubelet's `SyncPod`:
//! volumes, the sandbox, what runs (observed through CRI), then the [`plan`]'s steps, the
//! status written when it changed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::sandbox::SandboxOutcome;
use super::terminate::stop_with_hook;
use super::{Finished, Next, POLL, PodSandbox, RESYNC, Running, Shell, Shown, State, Stepped, WorkerError, field_path};
use crate::pods::backoff;
use crate::pods::cri as cricalls;
use crate::pods::labels;
use crate::pods::plan::{self, Step};
use crate::pods::probe;
use crate::pods::status::{self, Instance, InstanceState, Waiting};
use berth_events as events;

/// How soon a container that could not start for want of something (a ConfigMap, a Secret, a
/// volume) is tried again.
const BLOCKED_RETRY: Duration = Duration::from_secs(5);

/// What [`Shell::act`] did.
enum Acted {
    /// Started these containers and did nothing else.
    Started(Vec<String>),
    /// The pod's phase is now Succeeded or Failed.
    Finished,
    Next(Next),
}

fn shown(r: &Running) -> Shown<'_> {
    Shown::on(&r.runtime, r.sandbox.held())
}

impl Shell {
    pub(super) async fn sync(&mut self, r: &mut Running) -> Result<Stepped, WorkerError> {
        // Images looked up in an earlier step may have been removed since.
        r.images_looked_up.clear();
        if matches!(r.sandbox, PodSandbox::NothingOnNode) {
            if let Some(next) = self.start_on_node(r).await? {
                return Ok(Stepped::stay(next));
            }
            return self.act_until_waiting(r, Vec::new()).await;
        }
        if let Some(next) = self.ensure_volumes(r).await? {
            self.report(shown(r), &[], false).await?;
            return Ok(Stepped::stay(next));
        }
        let instances = self.observe(&r.runtime).await?;
        let sandbox_ok = match &r.sandbox {
            PodSandbox::JustSeen(s) => {
                r.sandbox = PodSandbox::Held(s.clone());
                true
            }
            PodSandbox::Held(s) if s.ready => self.check_sandbox(r).await?,
            _ => false,
        };
        if !sandbox_ok {
            match self.ensure_sandbox(r, &instances).await? {
                // Nothing ran in the pod yet: what was observed still holds, go on with it.
                SandboxOutcome::Ready if instances.is_empty() => {
                    if let PodSandbox::JustSeen(s) = &r.sandbox {
                        r.sandbox = PodSandbox::Held(s.clone());
                    }
                }
                SandboxOutcome::Ready => return Ok(Stepped::stay(Next::Now)),
                SandboxOutcome::Retry(next) => {
                    self.report(shown(r), &instances, false).await?;
                    return Ok(Stepped::stay(next));
                }
                SandboxOutcome::NotRecreated => {}
            }
        }
        self.act_until_waiting(r, instances).await
    }

    /// A pod new to this node: its sandbox is created while its volumes are set up, the two
    /// longest steps before its first container, as only the containers use the volumes. (So a
    /// pod whose volumes cannot be set up yet has its sandbox already, unlike under kubelet,
    /// which waits for the volumes; the containers wait either way.) `Some` when the pod must
    /// wait before its containers can start.
    async fn start_on_node(&mut self, r: &mut Running) -> Result<Option<Next>, WorkerError> {
        let creation = self.begin_sandbox(r, 0);
        let (volumes, created) = tokio::join!(self.ensure_volumes(r), creation.run());
        // Recorded before anything else can fail: the sandbox exists now.
        let outcome = self.finish_sandbox(r, created);
        if let Some(next) = volumes? {
            self.report(shown(r), &[], false).await?;
            return Ok(Some(next));
        }
        match outcome? {
            SandboxOutcome::Ready | SandboxOutcome::NotRecreated => {
                if let PodSandbox::JustSeen(s) = &r.sandbox {
                    r.sandbox = PodSandbox::Held(s.clone());
                }
                Ok(None)
            }
            SandboxOutcome::Retry(next) => {
                self.report(shown(r), &[], false).await?;
                Ok(Some(next))
            }
        }
    }

    /// Plans and acts on `instances` until the plan waits.
    async fn act_until_waiting(
        &mut self,
        r: &mut Running,
        mut instances: Vec<Instance>,
    ) -> Result<Stepped, WorkerError> {
        loop {
            match self.act(r, &mut instances).await? {
                Acted::Next(next) => return Ok(Stepped::stay(next)),
                Acted::Finished => {
                    return Ok(Stepped::to(State::Finished(Finished::Stopping(r.on_node())), Next::Now));
                }
                // Only starts: one ContainerStatus per started container instead of observing the
                // whole pod again (the status that shows them running is written sooner).
                Acted::Started(ids) => self.refresh(r, &mut instances, &ids).await?,
            }
        }
    }

    /// Looks again at just the containers `ids`, in `instances`.
    async fn refresh(&mut self, r: &Running, instances: &mut Vec<Instance>, ids: &[String]) -> Result<(), WorkerError> {
        let sandbox_id = r.sandbox.held().map(|s| s.id.clone()).unwrap_or_default();
        for id in ids {
            let Some(s) = cricalls::container_status(&r.runtime.endpoint, id).await? else {
                instances.retain(|i| &i.id != id);
                continue;
            };
            let inst = self.instance(&s, sandbox_id.clone());
            match instances.iter_mut().find(|i| &i.id == id) {
                Some(slot) => *slot = inst,
                None => instances.push(inst),
            }
        }
        status::sort_instances(instances);
        Ok(())
    }

    /// Plans from `instances`, reports the status, and takes the plan's steps.
    async fn act(&mut self, r: &mut Running, instances: &mut Vec<Instance>) -> Result<Acted, WorkerError> {
        let sandbox_id = r.sandbox.held().map(|s| s.id.clone()).unwrap_or_default();
        self.sync_probes(r, instances);
        let mut probes = plan::ProbeView::default();
        for (id, task) in &self.probes {
            let results = task.sink.results.lock().unwrap_or_else(|e| e.into_inner());
            if results.failed.is_some() {
                probes.failed.insert(id.clone());
            }
            if !results.started {
                probes.unstarted.insert(id.clone());
            }
        }
        let now = self.now();
        let plan = if r.sandbox.held().is_some() {
            plan::plan(self.spec(), instances, &sandbox_id, &probes, &self.restarts, now)
        } else {
            plan::Plan::default()
        };
        let mut wake_at: Option<jiff::Timestamp> = None;
        for (name, remaining) in &plan.backing_off {
            let message = format!(
                "back-off {} restarting failed container={name} pod={}",
                backoff::go_duration(remaining.delay),
                self.pod_ref()
            );
            if self.waiting.get(name).is_none_or(|w| w.message != message) {
                let init = self.is_init(name);
                self.event(
                    events::Type::Warning,
                    &field_path(name, init),
                    "BackOff",
                    format!("Back-off restarting failed container {name} in pod {}", self.pod_ref()),
                );
            }
            self.waiting.insert(name.clone(), Waiting::new("CrashLoopBackOff", message));
            wake_at = Some(wake_at.map_or(remaining.until, |w| w.min(remaining.until)));
        }
        // With containers to start, what this shows is about to change.
        let only_starts = plan.steps.iter().all(|s| matches!(s, Step::Start { .. } | Step::StartCreated { .. }));
        let deferred = !plan.steps.is_empty() && only_starts;
        let status = self.report_with(shown(r), instances, false, deferred).await?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            if status.reason.as_deref() == Some(status::DEADLINE_EXCEEDED) {
                self.event(events::Type::Normal, "", status::DEADLINE_EXCEEDED, status::DEADLINE_EXCEEDED_MESSAGE);
            }
            tracing::info!(pod = %self.pod_ref(), phase = ?status.phase, "pod finished");
            return Ok(Acted::Finished);
        }
        self.collect_old_instances(r, instances).await?;
        if plan.steps.is_empty() {
            let wake_at = match (wake_at, self.deadline()) {
                (Some(w), Some(d)) => Some(w.min(d)),
                (w, d) => w.or(d),
            };
            let until_wake = wake_at
                .map(|w| Duration::try_from(w.duration_since(self.now())).unwrap_or_default())
                .map(|d| d + Duration::from_millis(50));
            let poll = if r.runtime.endpoint.events_live.load(Ordering::Relaxed) { RESYNC } else { POLL };
            return Ok(Acted::Next(Next::After(until_wake.map_or(poll, |d| d.min(poll)))));
        }
        let mut progressed = false;
        let mut started = Vec::new();
        for step in plan.steps {
            match step {
                Step::Kill { id, name } => {
                    let (kind, _) = self
                        .probes
                        .get(&id)
                        .and_then(|p| p.sink.results.lock().unwrap_or_else(|e| e.into_inner()).failed.clone())
                        .unwrap_or((probe::Kind::Liveness, String::new()));
                    let message =
                        format!("Container {name} failed {} probe, will be restarted", kind.name().to_lowercase());
                    self.kill(r, &id, &name, message).await?;
                    progressed = true;
                }
                Step::Replace { id, name, restart_count } => {
                    let message = format!("Container {name} definition changed, will be restarted");
                    self.kill(r, &id, &name, message).await?;
                    self.restarts.forget(&name);
                    let init = self.is_init(&name);
                    self.start_container(r, &name, init, restart_count).await?;
                    progressed = true;
                }
                Step::StartCreated { id, name } => {
                    cricalls::start_container(&r.runtime.endpoint, &id).await?;
                    self.expected.started(&id);
                    tracing::info!(pod = %self.pod_ref(), container = %name, "started a container created before a restart");
                    progressed = true;
                    started.push(id);
                }
                Step::Start { name, init, restart_count } => {
                    if restart_count > 0 {
                        let finished = instances.iter().find(|i| i.name == name).and_then(|i| i.finished_at);
                        let attempted = self.now();
                        self.restarts.attempt(&name, finished.unwrap_or(now), attempted);
                    }
                    // A container that cannot start now (pull, config) does not hold the others up;
                    // an init container does, by being the only step.
                    if let Some(id) = self.start_container(r, &name, init, restart_count).await? {
                        progressed = true;
                        started.push(id);
                    }
                }
            }
        }
        if progressed {
            // After anything but starts, the whole pod is observed again.
            return Ok(if only_starts { Acted::Started(started) } else { Acted::Next(Next::Now) });
        }
        if std::mem::take(&mut r.sandbox_going) {
            return Ok(Acted::Next(Next::After(Duration::from_millis(200))));
        }
        // Nothing could start: show why, and come back when a back-off ends (or soon, for
        // errors without one, such as a ConfigMap still missing).
        self.report(shown(r), instances, false).await?;
        let now = self.now();
        let pull_retry = self
            .pull_failures
            .iter()
            .filter_map(|(key, (at, _))| self.pulls.remaining(key, *at, now))
            .map(|r| Duration::try_from(r.until.duration_since(now)).unwrap_or_default() + Duration::from_millis(50))
            .min();
        // Within a pull back-off, a step shows ImagePullBackOff; at its end, the pull is retried.
        Ok(Acted::Next(Next::After(pull_retry.map_or(BLOCKED_RETRY, |d| d.min(BLOCKED_RETRY)))))
    }

    /// Stops a running container the plan replaces, saying why.
    async fn kill(&mut self, r: &Running, id: &str, name: &str, message: String) -> Result<(), WorkerError> {
        let init = self.is_init(name);
        self.event(events::Type::Normal, &field_path(name, init), "Killing", message);
        self.probes.remove(id);
        let grace = self.spec().termination_grace_period_seconds.unwrap_or(30);
        let c = self.container_spec(name).cloned();
        let target = self.target(&r.runtime, r.sandbox.held(), id, c.as_ref());
        stop_with_hook(&r.runtime.endpoint, id, c.as_ref(), target, grace, None).await
    }

    /// Every instance of the pod's containers on its endpoint, newest first within each name.
    pub(super) async fn observe(&mut self, runtime: &super::PodRuntime) -> Result<Vec<Instance>, WorkerError> {
        let listed = cricalls::list_containers(&runtime.endpoint, Some(&self.uid)).await?;
        let mut out = Vec::with_capacity(listed.len());
        for c in &listed {
            if let Some(cached) = self.exited.get(&c.id) {
                out.push(cached.clone());
                continue;
            }
            let Some(s) = cricalls::container_status(&runtime.endpoint, &c.id).await? else { continue };
            out.push(self.instance(&s, c.pod_sandbox_id.clone()));
        }
        self.exited.retain(|id, _| listed.iter().any(|c| &c.id == id));
        status::sort_instances(&mut out);
        Ok(out)
    }

    /// The instance a ContainerStatus shows; an exited one is remembered with its message.
    fn instance(&mut self, s: &cri::ContainerStatus, sandbox_id: String) -> Instance {
        let mut inst = Instance::from_cri(s);
        inst.sandbox_id = sandbox_id;
        if inst.state == InstanceState::Exited {
            if inst.message.is_empty() {
                inst.message = termination_message(&inst, &s.log_path);
            }
            self.exited.insert(inst.id.clone(), inst.clone());
        }
        inst
    }

    /// Removes exited instances beyond the newest two of each container (current and previous).
    async fn collect_old_instances(&mut self, r: &Running, instances: &mut Vec<Instance>) -> Result<(), WorkerError> {
        let doomed = plan::old_instances(instances);
        for id in &doomed {
            cricalls::remove_container(&r.runtime.endpoint, id).await?;
            self.exited.remove(id);
        }
        instances.retain(|i| !doomed.contains(&i.id));
        Ok(())
    }
}

/// The message of an exited instance: its termination message file, or (policy
/// `FallbackToLogsOnError`, failed, no file content) the tail of its log.
fn termination_message(inst: &Instance, log_path: &str) -> String {
    const MAX_BYTES: usize = 4096;
    let file = inst.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_FILE);
    let text = file.and_then(|f| std::fs::read(f).ok()).unwrap_or_default();
    if !text.is_empty() {
        let n = text.len().min(MAX_BYTES);
        return String::from_utf8_lossy(&text[..n]).into_owned();
    }
    let fallback = inst
        .annotations
        .get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
        .is_some_and(|p| p == "FallbackToLogsOnError");
    if !fallback || inst.exit_code == 0 || log_path.is_empty() {
        return String::new();
    }
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    // CRI log lines: `<time> <stream> <P|F> <text>`; the last 80 lines, at most 2048 bytes.
    let lines: Vec<&str> = log.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let start = tail.len().saturating_sub(2048);
    let start = (start..=tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(tail.len());
    tail[start..].to_string()
}
