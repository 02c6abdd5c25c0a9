//! Reconciling recovered records with what is really running: the [`Reality`] seam the RPC layer
//! implements (monitor `exit.json`, OCI runtime `state`, netns), and the rules that turn each
//! observation into a transition.
//!
//! # Rules for a container
//!
//! | record \ observed | Created{pid}  | Running{pid}        | Exited{code}    | Gone                 | Unknown{why}  |
//! |-------------------|---------------|---------------------|-----------------|----------------------|---------------|
//! | Created           | keep (pid)    | Running, started now| Exited(code)    | Exited(255, Unknown) | Unknown(why)  |
//! | Running           | Unknown       | keep (pid)          | Exited(code)    | Exited(255, Unknown) | Unknown(why)  |
//! | Unknown           | keep          | Running again       | Exited(code)    | Exited(255, Unknown) | keep          |
//! | Exited            | keep          | keep                | keep            | keep                 | keep          |
//!
//! - An exit is final: an `Exited` record never changes (the first recorded exit wins).
//! - `Created` seen running: the runtime died between the OCI `start` and recording it; the start
//!   time is the reconcile time (the true one is lost).
//! - `Gone` (no process and no exit record, e.g. after a reboot): exited with containerd's unknown
//!   exit code 255 and reason `Unknown`, at the reconcile time.
//! - An observed exit's reason is `OOMKilled`, `Completed` or `Error` ([`ExitReason::from_exit`](super::ExitReason::from_exit));
//!   an exit time of 0 means "unknown" and becomes the reconcile time.
//! - `Running` seen `Created` cannot happen without outside interference: `Unknown`, so that kubelet
//!   stops and replaces it. `Unknown{why}` (the runtime's state could not be read) is CRI's
//!   CONTAINER_UNKNOWN, as containerd reports it.
//!
//! # Rules for a sandbox
//!
//! - `Creating` becomes `NotReady` whatever is observed: its setup was interrupted, and
//!   StopPodSandbox/RemovePodSandbox (idempotent) clean up what exists.
//! - `Ready` seen `Gone` (infra process or netns missing) becomes `NotReady`; kubelet then
//!   replaces the pod's sandbox.
//! - `Ready` seen `Unknown` stays `Ready` and is reported: a sandbox is not known to be broken
//!   because its state could not be read, and marking it NotReady would restart the whole pod.
//! - `NotReady` never changes.
//!
//! Nothing here fails the whole pass: a record whose transition cannot be written is reported in
//! [`ReconcileReport::errors`] and left as it was.

use super::container::{ContainerRecord, ContainerState, Exit};
use super::error::{Kind, StateError};
use super::sandbox::{SandboxRecord, SandboxState};
use super::store::Store;

/// What is really there for a container record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// Created by the OCI runtime, not started (its init waits to exec).
    Created {
        pid: Option<i32>,
    },
    Running {
        pid: i32,
    },
    /// Exited, as the monitor's `exit.json` (or the OCI runtime) tells; `finished_at` in ns, 0 if
    /// unknown.
    Exited {
        exit_code: i32,
        finished_at: i64,
        oom_killed: bool,
    },
    /// Neither a process nor a record of its exit.
    Gone,
    /// The state could not be read.
    Unknown {
        reason: String,
    },
}

/// What is really there for a sandbox record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservedSandbox {
    /// Its namespaces (and infra process, for handlers with one) are there.
    Alive,
    Gone,
    Unknown {
        reason: String,
    },
}

/// The seam to the world outside the records, implemented by the RPC layer (monitor exit files,
/// OCI runtime `state`, netns paths) and by fakes in tests. Calls may block: reconcile runs once,
/// before serving, inside `spawn_blocking`.
pub trait Reality {
    fn container_status(&self, record: &ContainerRecord) -> Observed;
    fn sandbox_status(&self, record: &SandboxRecord) -> ObservedSandbox;
}

/// The transition a container record needs to match an observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerFix {
    /// `Created → Running`.
    Started {
        pid: i32,
    },
    /// `Unknown → Running`.
    Resumed {
        pid: i32,
    },
    /// The same state with a different pid.
    Pid {
        pid: i32,
    },
    Exited(Exit),
    Unknown {
        message: String,
    },
}

const GONE_MESSAGE: &str = "the container's process and its exit record were gone when berth runtime recovered";

/// The rule table of the module docs, for one record and observation at time `now`.
pub fn decide_container(record: &ContainerRecord, observed: &Observed, now: i64) -> Option<ContainerFix> {
    use ContainerState as S;
    let state = record.state();
    if state == S::Exited {
        return None;
    }
    match observed {
        Observed::Created { pid } => match state {
            S::Created => pid.filter(|p| record.pid != Some(*p)).map(|pid| ContainerFix::Pid { pid }),
            S::Running => {
                Some(ContainerFix::Unknown { message: "the OCI runtime reports a started container as created".into() })
            }
            _ => None,
        },
        Observed::Running { pid } => match state {
            S::Created => Some(ContainerFix::Started { pid: *pid }),
            S::Unknown => Some(ContainerFix::Resumed { pid: *pid }),
            _ => (record.pid != Some(*pid)).then_some(ContainerFix::Pid { pid: *pid }),
        },
        Observed::Exited { exit_code, finished_at, oom_killed } => {
            let at = if *finished_at > 0 { *finished_at } else { now };
            Some(ContainerFix::Exited(Exit::observed(*exit_code, at, *oom_killed)))
        }
        Observed::Gone => Some(ContainerFix::Exited(Exit::unknown(now, GONE_MESSAGE))),
        Observed::Unknown { reason } => {
            (state != S::Unknown).then(|| ContainerFix::Unknown { message: reason.clone() })
        }
    }
}

impl ContainerFix {
    fn apply(self, record: &mut ContainerRecord, now: i64) -> Result<(), StateError> {
        match self {
            ContainerFix::Started { pid } => record.start(Some(pid), now),
            ContainerFix::Resumed { pid } => {
                record.resume(pid, now);
                Ok(())
            }
            ContainerFix::Pid { pid } => {
                record.pid = Some(pid);
                Ok(())
            }
            ContainerFix::Exited(exit) => record.mark_exited(exit),
            ContainerFix::Unknown { message } => record.mark_unknown(message),
        }
    }
}

/// The rules for a sandbox: `Some(why)` when it must become `NotReady`.
pub fn decide_sandbox(record: &SandboxRecord, observed: &ObservedSandbox) -> Option<&'static str> {
    match (record.state(), observed) {
        (SandboxState::Creating, _) => Some("its setup was interrupted"),
        (SandboxState::Ready, ObservedSandbox::Gone) => Some("its namespaces or infra process are gone"),
        _ => None,
    }
}

/// One record changed by reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub id: String,
    pub from: &'static str,
    pub to: &'static str,
}

/// What a reconcile pass did.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    pub changes: Vec<Change>,
    /// Records whose state could not be read and were left as they were.
    pub unresolved: Vec<(Kind, String, String)>,
    /// Transitions that could not be written; their records are unchanged.
    pub errors: Vec<StateError>,
}

impl Store {
    /// Brings every record in line with `reality` by the rules of this module, persisting each
    /// change. Run once after [`Store::recover`], before serving, in `spawn_blocking`; `now` is
    /// the time recorded for transitions whose true time is lost.
    pub fn reconcile(&self, reality: &dyn Reality, now: i64) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        for record in self.all::<ContainerRecord>() {
            let observed = reality.container_status(&record);
            let from = record.state().as_str();
            if decide_container(&record, &observed, now).is_none() {
                if let (Observed::Unknown { reason }, true) = (&observed, record.state() != ContainerState::Exited) {
                    report.unresolved.push((Kind::Container, record.id.clone(), reason.clone()));
                }
                continue;
            }
            // Decided again on the current record: a watcher may have recorded an exit meanwhile.
            let applied = self.update_container(&record.id, |c| match decide_container(c, &observed, now) {
                Some(fix) => fix.apply(c, now),
                None => Ok(()),
            });
            match applied {
                Ok(((), c)) if c.state().as_str() != from => {
                    tracing::info!(container = %c.id, from, to = c.state().as_str(), exit_code = c.exit_code(), "reconciled container");
                    report.changes.push(Change { kind: Kind::Container, to: c.state().as_str(), id: c.id, from });
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(container = %record.id, error = %e, "could not reconcile container");
                    report.errors.push(e);
                }
            }
        }
        for record in self.all::<SandboxRecord>() {
            let observed = reality.sandbox_status(&record);
            let from = record.state().as_str();
            let Some(why) = decide_sandbox(&record, &observed) else {
                if let (ObservedSandbox::Unknown { reason }, SandboxState::Ready) = (&observed, record.state()) {
                    report.unresolved.push((Kind::Sandbox, record.id.clone(), reason.clone()));
                }
                continue;
            };
            match self.update_sandbox(&record.id, |s| Ok(s.stop())) {
                Ok((true, s)) => {
                    tracing::info!(sandbox = %s.id, from, to = s.state().as_str(), why, "reconciled sandbox");
                    report.changes.push(Change { kind: Kind::Sandbox, to: s.state().as_str(), id: s.id, from });
                }
                Ok((false, _)) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %record.id, error = %e, "could not reconcile sandbox");
                    report.errors.push(e);
                }
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::state::container::tests::container_in;
    use crate::state::sandbox::tests::sandbox;
    use crate::state::{ContainerFilter, ExitReason, SandboxFilter, UNKNOWN_EXIT_CODE};

    const NOW: i64 = 1_000_000;

    /// Answers from tables; a container it was not told about is `Gone`, a sandbox `Alive`.
    #[derive(Default)]
    struct FakeReality {
        containers: HashMap<String, Observed>,
        sandboxes: HashMap<String, ObservedSandbox>,
    }

    impl Reality for FakeReality {
        fn container_status(&self, record: &ContainerRecord) -> Observed {
            self.containers.get(&record.id).cloned().unwrap_or(Observed::Gone)
        }
        fn sandbox_status(&self, record: &SandboxRecord) -> ObservedSandbox {
            self.sandboxes.get(&record.id).cloned().unwrap_or(ObservedSandbox::Alive)
        }
    }

    fn in_state(state: ContainerState) -> ContainerRecord {
        let mut s = sandbox("web");
        s.mark_ready().unwrap();
        let mut c = container_in(&s, "app");
        c.pid = Some(10);
        match state {
            ContainerState::Created => {}
            ContainerState::Running => c.start(Some(10), 500).unwrap(),
            ContainerState::Exited => {
                c.start(Some(10), 500).unwrap();
                c.mark_exited(Exit::observed(0, 600, false)).unwrap();
            }
            ContainerState::Unknown => c.mark_unknown("lost").unwrap(),
        }
        c
    }

    fn fixed(state: ContainerState, observed: Observed) -> Option<ContainerFix> {
        decide_container(&in_state(state), &observed, NOW)
    }

    #[test]
    fn an_exited_record_never_changes() {
        for observed in [
            Observed::Created { pid: Some(3) },
            Observed::Running { pid: 3 },
            Observed::Exited { exit_code: 1, finished_at: 9, oom_killed: false },
            Observed::Gone,
            Observed::Unknown { reason: "x".into() },
        ] {
            assert_eq!(fixed(ContainerState::Exited, observed), None);
        }
    }

    #[test]
    fn an_observed_exit_is_recorded_with_its_code_time_and_reason() {
        let exited = Observed::Exited { exit_code: 137, finished_at: 777, oom_killed: true };
        for state in [ContainerState::Created, ContainerState::Running, ContainerState::Unknown] {
            let fix = fixed(state, exited.clone());
            assert_eq!(fix, Some(ContainerFix::Exited(Exit::observed(137, 777, true))), "{state:?}");
        }
        let no_time = Observed::Exited { exit_code: 0, finished_at: 0, oom_killed: false };
        assert_eq!(fixed(ContainerState::Running, no_time), Some(ContainerFix::Exited(Exit::observed(0, NOW, false))));
    }

    #[test]
    fn a_vanished_container_exits_with_255_and_reason_unknown_at_reconcile_time() {
        for state in [ContainerState::Created, ContainerState::Running, ContainerState::Unknown] {
            let Some(ContainerFix::Exited(exit)) = fixed(state, Observed::Gone) else { panic!("{state:?}") };
            assert_eq!((exit.code, exit.finished_at, exit.reason), (UNKNOWN_EXIT_CODE, NOW, ExitReason::Unknown));
            assert!(!exit.message.is_empty());
        }
    }

    #[test]
    fn a_created_record_seen_running_was_started_before_the_crash() {
        assert_eq!(
            fixed(ContainerState::Created, Observed::Running { pid: 4 }),
            Some(ContainerFix::Started { pid: 4 })
        );
        assert_eq!(
            fixed(ContainerState::Unknown, Observed::Running { pid: 4 }),
            Some(ContainerFix::Resumed { pid: 4 })
        );
    }

    #[test]
    fn a_matching_observation_changes_nothing_but_a_different_pid() {
        assert_eq!(fixed(ContainerState::Running, Observed::Running { pid: 10 }), None);
        assert_eq!(fixed(ContainerState::Running, Observed::Running { pid: 11 }), Some(ContainerFix::Pid { pid: 11 }));
        assert_eq!(fixed(ContainerState::Created, Observed::Created { pid: Some(10) }), None);
        assert_eq!(fixed(ContainerState::Created, Observed::Created { pid: None }), None);
        assert_eq!(
            fixed(ContainerState::Created, Observed::Created { pid: Some(12) }),
            Some(ContainerFix::Pid { pid: 12 })
        );
        assert_eq!(fixed(ContainerState::Unknown, Observed::Created { pid: Some(12) }), None);
    }

    #[test]
    fn an_unreadable_or_impossible_state_makes_the_container_unknown() {
        let unknown = Observed::Unknown { reason: "runc state: timed out".into() };
        let expected = Some(ContainerFix::Unknown { message: "runc state: timed out".into() });
        assert_eq!(fixed(ContainerState::Running, unknown.clone()), expected);
        assert_eq!(fixed(ContainerState::Created, unknown.clone()), expected);
        assert_eq!(fixed(ContainerState::Unknown, unknown), None);
        let fix = fixed(ContainerState::Running, Observed::Created { pid: Some(10) });
        assert!(matches!(fix, Some(ContainerFix::Unknown { .. })), "{fix:?}");
    }

    #[test]
    fn sandbox_rules_stop_interrupted_and_vanished_sandboxes_only() {
        let creating = sandbox("web");
        let mut ready = sandbox("web");
        ready.mark_ready().unwrap();
        let mut stopped = ready.clone();
        stopped.stop();
        let unknown = ObservedSandbox::Unknown { reason: "x".into() };
        assert!(decide_sandbox(&creating, &ObservedSandbox::Alive).is_some());
        assert!(decide_sandbox(&ready, &ObservedSandbox::Gone).is_some());
        assert!(decide_sandbox(&ready, &ObservedSandbox::Alive).is_none());
        assert!(decide_sandbox(&ready, &unknown).is_none());
        assert!(decide_sandbox(&stopped, &ObservedSandbox::Gone).is_none());
    }

    struct World {
        _dir: tempfile::TempDir,
        store: Arc<Store>,
        reality: FakeReality,
    }

    /// A store as a crashed runtime left it, and what is really running now.
    fn world() -> (World, [String; 5], [String; 4]) {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::recover(dir.path()).unwrap();
        let ready = |name: &str| store.create_sandbox(sandbox(name)).unwrap().commit(|s| s.mark_ready()).unwrap().1;
        let web = ready("web");
        let gone = ready("gone");
        let unreadable = ready("unreadable");
        let interrupted = store.create_sandbox(sandbox("interrupted")).unwrap().id().to_string();
        let create = |name: &str| {
            let c = store.create_container(container_in(&web, name)).unwrap().commit(|_| Ok(())).unwrap().1;
            c.id
        };
        let start = |id: &str| {
            store.begin_start_container(id).unwrap().commit(|c| c.start(Some(20), 500)).unwrap();
        };
        let (still, exited, vanished, started, done) =
            (create("still"), create("exited"), create("vanished"), create("started"), create("done"));
        for id in [&still, &exited, &vanished, &done] {
            start(id);
        }
        store.update_container(&done, |c| c.mark_exited(Exit::observed(0, 600, false))).unwrap();
        let mut reality = FakeReality::default();
        reality.containers.insert(still.clone(), Observed::Running { pid: 20 });
        reality
            .containers
            .insert(exited.clone(), Observed::Exited { exit_code: 3, finished_at: 900, oom_killed: false });
        reality.containers.insert(started.clone(), Observed::Running { pid: 21 });
        reality.sandboxes.insert(gone.id.clone(), ObservedSandbox::Gone);
        reality.sandboxes.insert(unreadable.id.clone(), ObservedSandbox::Unknown { reason: "no answer".into() });
        let world = World { _dir: dir, store, reality };
        (world, [still, exited, vanished, started, done], [web.id, gone.id, unreadable.id, interrupted])
    }

    #[test]
    fn reconcile_applies_every_rule_and_reports_each_change() {
        let (w, [still, exited, vanished, started, done], [web, gone, unreadable, interrupted]) = world();
        let report = w.store.reconcile(&w.reality, NOW);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let c = |id: &str| w.store.container(id).unwrap();
        let s = |id: &str| w.store.sandbox(id).unwrap().state();

        assert_eq!((c(&still).state(), c(&still).pid), (ContainerState::Running, Some(20)));
        assert_eq!((c(&exited).exit_code(), c(&exited).finished_at(), c(&exited).reason()), (3, 900, "Error"));
        assert_eq!(
            (c(&vanished).exit_code(), c(&vanished).finished_at(), c(&vanished).reason()),
            (255, NOW, "Unknown")
        );
        assert_eq!(
            (c(&started).state(), c(&started).started_at(), c(&started).pid),
            (ContainerState::Running, NOW, Some(21))
        );
        assert_eq!((c(&done).exit_code(), c(&done).finished_at()), (0, 600));

        assert_eq!(s(&web), SandboxState::Ready);
        assert_eq!(s(&gone), SandboxState::NotReady);
        assert_eq!(s(&unreadable), SandboxState::Ready);
        assert_eq!(s(&interrupted), SandboxState::NotReady);

        let mut changed: Vec<_> = report.changes.iter().map(|ch| (ch.id.clone(), ch.from, ch.to)).collect();
        changed.sort();
        let mut expected = vec![
            (exited, "running", "exited"),
            (vanished, "running", "exited"),
            (started, "created", "running"),
            (gone, "ready", "not ready"),
            (interrupted, "creating", "not ready"),
        ];
        expected.sort();
        assert_eq!(changed, expected);
        assert_eq!(report.unresolved, vec![(Kind::Sandbox, unreadable, "no answer".to_string())]);
    }

    #[test]
    fn reconciled_states_survive_the_next_restart_and_a_second_pass_changes_nothing() {
        let (w, [_, exited, ..], _) = world();
        w.store.reconcile(&w.reality, NOW);
        let sandboxes = w.store.list_sandboxes(&SandboxFilter::default());
        let containers = w.store.list_containers(&ContainerFilter::default());
        let (store, _) = Store::recover(w.store.root()).unwrap();
        assert_eq!(store.list_sandboxes(&SandboxFilter::default()), sandboxes);
        assert_eq!(store.list_containers(&ContainerFilter::default()), containers);
        assert_eq!(store.container(&exited).unwrap().exit_code(), 3);
        let again = store.reconcile(&w.reality, NOW + 1);
        assert!(again.changes.is_empty(), "{:?}", again.changes);
    }

    #[test]
    fn a_transition_that_cannot_be_written_is_reported_and_the_pass_goes_on() {
        let (w, [_, exited, vanished, ..], _) = world();
        let dir = w.store.container_dir(&exited);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, b"in the way").unwrap();
        let report = w.store.reconcile(&w.reality, NOW);
        assert_eq!(report.errors.len(), 1);
        assert!(matches!(report.errors[0], StateError::Io { .. }));
        assert_eq!(w.store.container(&exited).unwrap().state(), ContainerState::Running);
        assert_eq!(w.store.container(&vanished).unwrap().state(), ContainerState::Exited);
    }
}
