//! What a running pod needs next, decided from its containers' instances as kubelet's
//! `computePodActions` decides it: the next init container, containers to (re)start under the
//! restart policy and CrashLoopBackOff, containers to kill (failed probes), sidecars (init
//! containers with `restartPolicy: Always`) kept running. Pure.

use std::collections::{HashMap, HashSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;

use super::backoff::{Backoff, Remaining};
use super::labels;
use super::spec::container_hash;
use super::status::{Instance, InstanceState};

/// One thing to do to the pod's containers.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Create and start a new instance of the named container.
    Start { name: String, init: bool, restart_count: i32 },
    /// Start an instance that was created but never started (the agent died in between).
    StartCreated { id: String, name: String },
    /// Stop a running instance (a liveness or startup probe failed).
    Kill { id: String, name: String },
    /// Stop a running instance whose spec changed (a new image) and start it anew, whatever the
    /// restart policy.
    Replace { id: String, name: String, restart_count: i32 },
}

/// The plan for one sync.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Containers held back by CrashLoopBackOff, with the back-off in force.
    pub backing_off: HashMap<String, Remaining>,
    /// An init container failed under `restartPolicy: Never`: the pod has failed.
    pub init_failed: bool,
}

/// What the probes say about running instances, by container ID.
#[derive(Clone, Debug, Default)]
pub struct ProbeView {
    /// A liveness or startup probe failed: restart.
    pub failed: HashSet<String>,
    /// The startup probe has not passed yet.
    pub unstarted: HashSet<String>,
}

/// An init container that keeps running beside the containers (a native sidecar).
pub fn is_sidecar(c: &core::Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether an exited container restarts under `policy`.
pub fn restarts(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// `instances` are the pod's, newest first within each name; only those in `sandbox` count as
/// the current run (a new sandbox starts every container again).
pub fn plan(
    spec: &core::PodSpec,
    instances: &[Instance],
    sandbox: &str,
    probes: &ProbeView,
    backoff: &Backoff,
    now: Timestamp,
) -> Plan {
    let failed_probes = &probes.failed;
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let mut plan = Plan::default();
    let newest =
        |name: &str, here: bool| instances.iter().find(|i| i.name == name && (!here || i.sandbox_id == sandbox));
    let next_count =
        |name: &str| instances.iter().filter(|i| i.name == name).map(|i| i.restart_count + 1).max().unwrap_or(0);

    for c in spec.init_containers.iter().flatten() {
        if is_sidecar(c) {
            // Started before the next init container, then kept running (restarted whatever
            // the pod's policy) without holding the pod up again.
            match newest(&c.name, true) {
                None => {
                    let restart_count = next_count(&c.name);
                    plan.steps.push(Step::Start { name: c.name.clone(), init: true, restart_count });
                    return plan;
                }
                Some(i) => match i.state {
                    InstanceState::Running if failed_probes.contains(&i.id) => {
                        plan.steps.push(Step::Kill { id: i.id.clone(), name: i.name.clone() })
                    }
                    InstanceState::Running if probes.unstarted.contains(&i.id) => return plan,
                    InstanceState::Running | InstanceState::Unknown => {}
                    InstanceState::Created => {
                        plan.steps.push(Step::StartCreated { id: i.id.clone(), name: i.name.clone() });
                        return plan;
                    }
                    InstanceState::Exited => restart(&mut plan, i, true, backoff, now),
                },
            }
            continue;
        }
        match newest(&c.name, true) {
            None => {
                plan.steps.push(Step::Start { name: c.name.clone(), init: true, restart_count: next_count(&c.name) });
                return plan;
            }
            Some(i) => match i.state {
                InstanceState::Exited if i.exit_code == 0 => continue,
                InstanceState::Exited => {
                    // Init containers restart unless the pod's policy is Never.
                    if policy == "Never" {
                        plan.init_failed = true;
                    } else {
                        restart(&mut plan, i, true, backoff, now);
                    }
                    return plan;
                }
                InstanceState::Created => {
                    plan.steps.push(Step::StartCreated { id: i.id.clone(), name: i.name.clone() });
                    return plan;
                }
                InstanceState::Running if failed_probes.contains(&i.id) => {
                    plan.steps.push(Step::Kill { id: i.id.clone(), name: i.name.clone() });
                    return plan;
                }
                InstanceState::Running | InstanceState::Unknown => return plan,
            },
        }
    }

    for c in &spec.containers {
        let Some(i) = newest(&c.name, true) else {
            // Never run in this sandbox. A run in an earlier sandbox that must not restart stays.
            if let Some(old) = newest(&c.name, false)
                && old.state == InstanceState::Exited
                && !restarts(policy, old.exit_code)
            {
                continue;
            }
            plan.steps.push(Step::Start { name: c.name.clone(), init: false, restart_count: next_count(&c.name) });
            continue;
        };
        let changed = i.annotations.get(labels::CONTAINER_HASH).is_some_and(|h| *h != container_hash(c));
        match i.state {
            InstanceState::Running if changed => plan.steps.push(Step::Replace {
                id: i.id.clone(),
                name: i.name.clone(),
                restart_count: i.restart_count + 1,
            }),
            InstanceState::Running if failed_probes.contains(&i.id) => {
                plan.steps.push(Step::Kill { id: i.id.clone(), name: i.name.clone() })
            }
            InstanceState::Running | InstanceState::Unknown => {}
            InstanceState::Created => plan.steps.push(Step::StartCreated { id: i.id.clone(), name: i.name.clone() }),
            InstanceState::Exited => {
                if restarts(policy, i.exit_code) {
                    restart(&mut plan, i, false, backoff, now);
                }
            }
        }
    }
    plan
}

fn restart(plan: &mut Plan, i: &Instance, init: bool, backoff: &Backoff, now: Timestamp) {
    let failed_at = i.finished_at.unwrap_or(now);
    match backoff.remaining(&i.name, failed_at, now) {
        Some(r) => {
            plan.backing_off.insert(i.name.clone(), r);
        }
        None => plan.steps.push(Step::Start { name: i.name.clone(), init, restart_count: i.restart_count + 1 }),
    }
}

/// The exited instances beyond the newest two of each container (current and previous), to
/// be removed; `instances` newest first within each name.
pub fn old_instances(instances: &[Instance]) -> Vec<String> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut doomed = Vec::new();
    for i in instances {
        let n = seen.entry(i.name.as_str()).or_default();
        *n += 1;
        if *n > 2 && i.state == InstanceState::Exited {
            doomed.push(i.id.clone());
        }
    }
    doomed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn spec(containers: &[&str], init: &[&str], policy: &str) -> core::PodSpec {
        let c = |n: &&str| core::Container { name: n.to_string(), ..Default::default() };
        core::PodSpec {
            containers: containers.iter().map(c).collect(),
            init_containers: Some(init.iter().map(c).collect()),
            restart_policy: Some(policy.into()),
            ..Default::default()
        }
    }

    fn inst(name: &str, restarts: i32, state: InstanceState, exit: i32, sandbox: &str) -> Instance {
        Instance {
            id: format!("{name}-{restarts}-{sandbox}"),
            name: name.into(),
            sandbox_id: sandbox.into(),
            restart_count: restarts,
            state,
            created_at: Some(at(restarts.into())),
            started_at: Some(at(restarts.into())),
            finished_at: (state == InstanceState::Exited).then(|| at(i64::from(restarts) + 1)),
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            annotations: HashMap::new(),
        }
    }

    fn start(name: &str, init: bool, restart_count: i32) -> Step {
        Step::Start { name: name.into(), init, restart_count }
    }

    use InstanceState::*;

    #[test]
    fn exited_instances_beyond_the_current_and_previous_of_each_container_are_old() {
        let mut instances = vec![
            inst("app", 3, InstanceState::Running, 0, "s"),
            inst("app", 2, InstanceState::Exited, 1, "s"),
            inst("app", 1, InstanceState::Exited, 1, "s"),
            inst("app", 0, InstanceState::Exited, 1, "s"),
            inst("side", 1, InstanceState::Exited, 1, "s"),
            inst("side", 0, InstanceState::Exited, 1, "s"),
        ];
        crate::pods::status::sort_instances(&mut instances);
        assert_eq!(old_instances(&instances), ["app-1-s", "app-0-s"]);
    }

    #[test]
    fn init_containers_run_one_at_a_time_before_the_containers() {
        let s = spec(&["app", "side"], &["one", "two"], "Always");
        let none = ProbeView::default();
        let b = Backoff::default();
        assert_eq!(plan(&s, &[], "s", &none, &b, at(0)).steps, vec![start("one", true, 0)]);
        let running = vec![inst("one", 0, Running, 0, "s")];
        assert!(plan(&s, &running, "s", &none, &b, at(0)).steps.is_empty(), "wait for it");
        let done = vec![inst("one", 0, Exited, 0, "s")];
        assert_eq!(plan(&s, &done, "s", &none, &b, at(5)).steps, vec![start("two", true, 0)]);
        let all = vec![inst("one", 0, Exited, 0, "s"), inst("two", 0, Exited, 0, "s")];
        assert_eq!(plan(&s, &all, "s", &none, &b, at(5)).steps, vec![start("app", false, 0), start("side", false, 0)]);
    }

    #[test]
    fn a_failed_init_container_fails_the_pod_under_never_and_restarts_otherwise() {
        let failed = vec![inst("one", 0, Exited, 1, "s")];
        let b = Backoff::default();
        let p = plan(&spec(&["app"], &["one"], "Never"), &failed, "s", &ProbeView::default(), &b, at(5));
        assert!(p.init_failed && p.steps.is_empty());
        let p = plan(&spec(&["app"], &["one"], "OnFailure"), &failed, "s", &ProbeView::default(), &b, at(5));
        assert_eq!(p.steps, vec![start("one", true, 1)]);
    }

    #[test]
    fn exited_containers_restart_by_policy_and_wait_out_their_back_off() {
        let none = ProbeView::default();
        let mut b = Backoff::default();
        let ok = vec![inst("app", 0, Exited, 0, "s")];
        let failed = vec![inst("app", 2, Exited, 1, "s"), inst("app", 1, Exited, 1, "s")];
        assert_eq!(
            plan(&spec(&["app"], &[], "Always"), &ok, "s", &none, &b, at(5)).steps,
            vec![start("app", false, 1)]
        );
        assert!(plan(&spec(&["app"], &[], "OnFailure"), &ok, "s", &none, &b, at(5)).steps.is_empty());
        assert!(plan(&spec(&["app"], &[], "Never"), &failed, "s", &none, &b, at(5)).steps.is_empty());
        assert_eq!(
            plan(&spec(&["app"], &[], "OnFailure"), &failed, "s", &none, &b, at(5)).steps,
            vec![start("app", false, 3)]
        );
        b.attempt("app", at(2), at(2));
        let p = plan(&spec(&["app"], &[], "Always"), &failed, "s", &none, &b, at(5));
        assert!(p.steps.is_empty());
        assert_eq!(p.backing_off["app"].until, at(13), "10 s after it finished at 3");
    }

    #[test]
    fn a_failed_probe_kills_and_a_created_instance_is_started() {
        let running = vec![inst("app", 0, Running, 0, "s"), inst("side", 0, Created, 0, "s")];
        let failed = ProbeView { failed: HashSet::from(["app-0-s".to_string()]), ..Default::default() };
        let p = plan(&spec(&["app", "side"], &[], "Always"), &running, "s", &failed, &Backoff::default(), at(5));
        assert_eq!(
            p.steps,
            vec![
                Step::Kill { id: "app-0-s".into(), name: "app".into() },
                Step::StartCreated { id: "side-0-s".into(), name: "side".into() }
            ]
        );
    }

    fn sidecar_spec() -> core::PodSpec {
        let mut s = spec(&["app"], &["proxy", "migrate"], "Never");
        s.init_containers.as_mut().unwrap()[0].restart_policy = Some("Always".into());
        s
    }

    #[test]
    fn a_sidecar_starts_before_the_next_init_container_and_is_restarted_under_never() {
        let s = sidecar_spec();
        let b = Backoff::default();
        let none = ProbeView::default();
        assert_eq!(plan(&s, &[], "s", &none, &b, at(0)).steps, vec![start("proxy", true, 0)]);
        let proxy = inst("proxy", 0, Running, 0, "s");
        let unstarted = ProbeView { unstarted: HashSet::from([proxy.id.clone()]), ..Default::default() };
        assert!(
            plan(&s, std::slice::from_ref(&proxy), "s", &unstarted, &b, at(1)).steps.is_empty(),
            "its startup probe first"
        );
        assert_eq!(
            plan(&s, std::slice::from_ref(&proxy), "s", &none, &b, at(1)).steps,
            vec![start("migrate", true, 0)]
        );
        let initialized = vec![inst("migrate", 0, Exited, 0, "s"), proxy];
        assert_eq!(plan(&s, &initialized, "s", &none, &b, at(2)).steps, vec![start("app", false, 0)]);
        let crashed =
            vec![inst("app", 0, Running, 0, "s"), inst("migrate", 0, Exited, 0, "s"), inst("proxy", 0, Exited, 1, "s")];
        assert_eq!(
            plan(&s, &crashed, "s", &none, &b, at(3)).steps,
            vec![start("proxy", true, 1)],
            "restarted although the pod says Never"
        );
    }

    #[test]
    fn a_running_container_whose_image_changed_is_replaced_under_any_policy() {
        let s = spec(&["app"], &[], "Never");
        let mut running = inst("app", 2, Running, 0, "s");
        running.annotations.insert(labels::CONTAINER_HASH.into(), container_hash(&s.containers[0]));
        let p = plan(&s, &[running.clone()], "s", &ProbeView::default(), &Backoff::default(), at(5));
        assert!(p.steps.is_empty(), "same image");
        let mut s2 = s.clone();
        s2.containers[0].image = Some("busybox:2".into());
        let p = plan(&s2, &[running], "s", &ProbeView::default(), &Backoff::default(), at(5));
        assert_eq!(p.steps, vec![Step::Replace { id: "app-2-s".into(), name: "app".into(), restart_count: 3 }]);
    }

    #[test]
    fn a_new_sandbox_starts_everything_again_counting_on_from_the_old_runs() {
        let old = vec![inst("one", 0, Exited, 0, "old"), inst("app", 4, Exited, 137, "old")];
        let p =
            plan(&spec(&["app"], &["one"], "Always"), &old, "new", &ProbeView::default(), &Backoff::default(), at(9));
        assert_eq!(p.steps, vec![start("one", true, 1)], "init containers run again in a new sandbox");
        let done = vec![inst("app", 0, Exited, 0, "old")];
        let p =
            plan(&spec(&["app"], &[], "OnFailure"), &done, "new", &ProbeView::default(), &Backoff::default(), at(9));
        assert!(p.steps.is_empty(), "a container that succeeded under OnFailure is not run again");
    }
}
