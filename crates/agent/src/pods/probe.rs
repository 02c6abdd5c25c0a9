//! Liveness, readiness and startup probes of one running container, as kubelet runs them: the
//! startup probe first (the others wait for it), each probe every `periodSeconds` after
//! `initialDelaySeconds` from the container's start, a result flipping only after
//! `successThreshold` / `failureThreshold` equal outcomes in a row. A failed liveness or startup
//! probe asks the worker to restart the container; readiness drives `ready`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::actions::{Action, Outcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }
}

/// Counts outcomes in a row and decides the probe's result (pure).
#[derive(Clone, Debug)]
pub struct Tracker {
    success_threshold: u32,
    failure_threshold: u32,
    last: Option<bool>,
    run: u32,
    result: bool,
    /// Whether `result` came from outcomes (or is still the initial assumption).
    decided: bool,
}

impl Tracker {
    /// Liveness starts out passing; readiness and startup start out failing until they succeed.
    pub fn new(kind: Kind, probe: &core::Probe) -> Tracker {
        let positive =
            |v: Option<i32>, default: u32| v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0).unwrap_or(default);
        Tracker {
            success_threshold: positive(probe.success_threshold, 1),
            failure_threshold: positive(probe.failure_threshold, 3),
            last: None,
            run: 0,
            result: kind == Kind::Liveness,
            decided: false,
        }
    }

    /// Records one outcome; returns the result when it is first decided or when it flips.
    pub fn record(&mut self, success: bool) -> Option<bool> {
        if self.last == Some(success) {
            self.run += 1;
        } else {
            self.last = Some(success);
            self.run = 1;
        }
        let threshold = if success { self.success_threshold } else { self.failure_threshold };
        if self.run >= threshold && (self.result != success || !self.decided) {
            self.result = success;
            self.decided = true;
            return Some(success);
        }
        None
    }

    #[cfg(test)]
    fn result(&self) -> bool {
        self.result
    }
}

/// What the probes of one container found, read by the worker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Results {
    /// The startup probe passed (or there is none).
    pub started: bool,
    /// The readiness probe passes (or there is none).
    pub ready: bool,
    /// A liveness or startup probe failed: kubelet's message for the restart.
    pub failed: Option<(Kind, String)>,
}

/// Runs a probe action; the worker's implementation goes through CRI and the network.
pub trait Prober: Send + Sync {
    fn probe<'a>(&'a self, action: &'a Action, timeout: Duration)
    -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;
}

/// Called with the kind and message of each failed probe.
pub type FailureHook = Box<dyn Fn(Kind, &str) + Send + Sync>;

/// Where probe results and failures are reported.
pub struct Sink {
    pub results: Mutex<Results>,
    /// Wakes the worker when the results change.
    pub changed: Arc<Notify>,
    /// Called on every failed outcome (kubelet's `Unhealthy` event) with the kind and message.
    pub on_failure: FailureHook,
}

impl Sink {
    fn update(&self, f: impl FnOnce(&mut Results)) {
        let mut r = self.results.lock().unwrap_or_else(|e| e.into_inner());
        let before = r.clone();
        f(&mut r);
        if *r != before {
            drop(r);
            self.changed.notify_one();
        }
    }
}

fn seconds(v: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(v.and_then(|n| u64::try_from(n).ok()).filter(|n| *n > 0).unwrap_or(default))
}

/// Probes `c` (started at `started_at`) until a liveness or startup probe fails or the task is
/// dropped. Without probes, the container counts as started and ready at once.
pub async fn run(c: core::Container, started_at: Instant, prober: Arc<dyn Prober>, sink: Arc<Sink>) {
    if let Some(p) = &c.startup_probe
        && !probe_loop(Kind::Startup, p, started_at, prober.as_ref(), &sink).await
    {
        return;
    }
    sink.update(|r| {
        r.started = true;
        r.ready = c.readiness_probe.is_none();
    });
    let liveness = async {
        match &c.liveness_probe {
            Some(p) => probe_loop(Kind::Liveness, p, started_at, prober.as_ref(), &sink).await,
            None => std::future::pending().await,
        }
    };
    let readiness = async {
        if let Some(p) = &c.readiness_probe {
            probe_loop(Kind::Readiness, p, started_at, prober.as_ref(), &sink).await;
        }
    };
    // A failed liveness probe ends both: the container is about to be restarted.
    tokio::select! {
        _ = liveness => {}
        _ = async { readiness.await; std::future::pending::<()>().await } => {}
    }
}

/// One probe's loop. Returns true when a startup probe succeeded, false when a liveness or
/// startup probe failed; readiness loops forever.
async fn probe_loop(kind: Kind, p: &core::Probe, started_at: Instant, prober: &dyn Prober, sink: &Sink) -> bool {
    let action = Action::of_probe(p);
    let period = seconds(p.period_seconds, 10);
    let timeout = seconds(p.timeout_seconds, 1);
    let mut tracker = Tracker::new(kind, p);
    let first =
        started_at + Duration::from_secs(p.initial_delay_seconds.and_then(|n| u64::try_from(n).ok()).unwrap_or(0));
    tokio::time::sleep_until(first).await;
    loop {
        let outcome = match tokio::time::timeout(timeout, prober.probe(&action, timeout)).await {
            Ok(o) => o,
            Err(_) => Outcome::Failure(format!("probe timed out after {}s", timeout.as_secs())),
        };
        if let Outcome::Failure(msg) = &outcome {
            (sink.on_failure)(kind, msg);
        }
        if let Some(result) = tracker.record(outcome.is_success()) {
            match (kind, result) {
                (Kind::Startup, true) => return true,
                (Kind::Startup | Kind::Liveness, false) => {
                    let msg = match &outcome {
                        Outcome::Failure(m) => m.clone(),
                        Outcome::Success => String::new(),
                    };
                    sink.update(|r| r.failed = Some((kind, msg)));
                    return false;
                }
                (Kind::Readiness, ready) => sink.update(|r| r.ready = ready),
                (Kind::Liveness, true) => {}
            }
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn probe(period: i32, initial: i32, success: i32, failure: i32) -> core::Probe {
        core::Probe {
            exec: Some(core::ExecAction { command: Some(vec!["check".into()]) }),
            period_seconds: Some(period),
            initial_delay_seconds: Some(initial),
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            ..Default::default()
        }
    }

    #[test]
    fn results_flip_only_after_the_thresholds_in_a_row() {
        let mut t = Tracker::new(Kind::Readiness, &probe(1, 0, 2, 3));
        assert!(!t.result());
        assert_eq!(t.record(true), None, "one success of two");
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(true));
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(false));
        let mut live = Tracker::new(Kind::Liveness, &probe(1, 0, 1, 1));
        assert!(live.result(), "liveness passes until it fails");
        assert_eq!(live.record(true), Some(true), "decided");
        assert_eq!(live.record(true), None);
        assert_eq!(live.record(false), Some(false));
        let mut startup = Tracker::new(Kind::Startup, &probe(1, 0, 1, 2));
        assert_eq!(startup.record(false), None);
        assert_eq!(startup.record(false), Some(false), "a startup probe fails without ever having passed");
    }

    /// Outcomes per probe command, in order; times they were asked at.
    struct Script {
        outcomes: Mutex<std::collections::HashMap<String, VecDeque<bool>>>,
        asked: Mutex<Vec<(String, Duration)>>,
        start: Instant,
    }

    impl Prober for Script {
        fn probe<'a>(&'a self, action: &'a Action, _: Duration) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'a>> {
            Box::pin(async move {
                let Action::Exec(cmd) = action else { panic!("exec only") };
                let name = cmd[0].clone();
                self.asked.lock().unwrap().push((name.clone(), self.start.elapsed()));
                let ok = self.outcomes.lock().unwrap().get_mut(&name).and_then(VecDeque::pop_front).unwrap_or(true);
                if ok { Outcome::Success } else { Outcome::Failure(format!("{name} said no")) }
            })
        }
    }

    fn command(p: core::Probe, name: &str) -> core::Probe {
        core::Probe { exec: Some(core::ExecAction { command: Some(vec![name.into()]) }), ..p }
    }

    fn setup(outcomes: &[(&str, &[bool])]) -> (Arc<Script>, Arc<Sink>, Arc<Mutex<Vec<String>>>) {
        let script = Arc::new(Script {
            outcomes: Mutex::new(outcomes.iter().map(|(k, v)| (k.to_string(), v.iter().copied().collect())).collect()),
            asked: Mutex::new(Vec::new()),
            start: Instant::now(),
        });
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = events.clone();
        let sink = Arc::new(Sink {
            results: Mutex::new(Results::default()),
            changed: Arc::new(Notify::new()),
            on_failure: Box::new(move |kind, msg| {
                log.lock().unwrap().push(format!("{} probe failed: {msg}", kind.name()))
            }),
        });
        (script, sink, events)
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_without_probes_is_started_and_ready_at_once() {
        let (script, sink, _) = setup(&[]);
        let c = core::Container { name: "app".into(), ..Default::default() };
        tokio::time::timeout(Duration::from_secs(1), run(c, Instant::now(), script, sink.clone())).await.ok();
        assert_eq!(*sink.results.lock().unwrap(), Results { started: true, ready: true, failed: None });
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_fails_after_the_threshold_at_the_probe_period() {
        let (script, sink, events) = setup(&[("live", &[true, false, false, false])]);
        let c = core::Container {
            name: "app".into(),
            liveness_probe: Some(command(probe(5, 3, 1, 3), "live")),
            ..Default::default()
        };
        run(c, Instant::now(), script.clone(), sink.clone()).await;
        let times: Vec<u64> = script.asked.lock().unwrap().iter().map(|(_, t)| t.as_secs()).collect();
        assert_eq!(times, vec![3, 8, 13, 18], "after 3 s, every 5 s; the third failure in a row ends it");
        let r = sink.results.lock().unwrap().clone();
        assert_eq!(r.failed, Some((Kind::Liveness, "live said no".into())));
        assert_eq!(events.lock().unwrap().len(), 3, "one Unhealthy event per failure");
        assert_eq!(events.lock().unwrap()[0], "Liveness probe failed: live said no");
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_waits_for_startup_and_then_follows_its_probe() {
        let (script, sink, _) = setup(&[("start", &[false, true]), ("ready", &[true, false, true])]);
        let c = core::Container {
            name: "app".into(),
            startup_probe: Some(command(probe(2, 0, 1, 5), "start")),
            readiness_probe: Some(command(probe(10, 0, 1, 1), "ready")),
            ..Default::default()
        };
        let task = tokio::spawn(run(c, Instant::now(), script.clone(), sink.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*sink.results.lock().unwrap(), Results::default(), "not started: the startup probe failed once");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*sink.results.lock().unwrap(), Results { started: true, ready: true, failed: None });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!sink.results.lock().unwrap().ready, "one failure at threshold 1");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(sink.results.lock().unwrap().ready);
        let asked: Vec<(String, u64)> =
            script.asked.lock().unwrap().iter().map(|(n, t)| (n.clone(), t.as_secs())).collect();
        let expected: Vec<(String, u64)> = [("start", 0), ("start", 2), ("ready", 2), ("ready", 12), ("ready", 22)]
            .iter()
            .map(|(n, t)| (n.to_string(), *t))
            .collect();
        assert_eq!(asked, expected);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_startup_probe_that_never_passes_fails_the_container() {
        let (script, sink, _) = setup(&[("start", &[false, false])]);
        let c = core::Container {
            name: "app".into(),
            startup_probe: Some(command(probe(1, 0, 1, 2), "start")),
            liveness_probe: Some(command(probe(1, 0, 1, 1), "live")),
            ..Default::default()
        };
        run(c, Instant::now(), script.clone(), sink.clone()).await;
        let r = sink.results.lock().unwrap().clone();
        assert!(!r.started);
        assert_eq!(r.failed.map(|(k, _)| k), Some(Kind::Startup));
        assert!(script.asked.lock().unwrap().iter().all(|(n, _)| n == "start"), "liveness never ran");
    }
}
