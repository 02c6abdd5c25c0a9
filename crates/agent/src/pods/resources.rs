//! A pod's cpu and memory requests and limits as CRI Linux resources, computed as kubelet does
//! for cgroupfs: shares from requests, CFS quota from limits, memory limit, OOM score by QoS.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use berth_api::validation::Quantity as Parsed;

/// kubelet's constants (`pkg/kubelet/cm/helpers_linux.go`, `pkg/kubelet/qos/policy.go`).
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;
const SHARES_PER_CPU: i64 = 1024;
const QUOTA_PERIOD: i64 = 100_000;
const MIN_QUOTA: i64 = 1000;
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// A cpu or memory amount of one container or pod, in milli-cpus and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_millis: Option<i64>,
    pub memory_bytes: Option<i64>,
}

impl Amounts {
    fn of(list: Option<&std::collections::BTreeMap<String, Quantity>>) -> Self {
        let get = |name: &str| list.and_then(|l| l.get(name)).and_then(|q| Parsed::parse(&q.0).ok());
        Amounts {
            // Nano-units: 1 cpu = 10^9, so milli-cpus round up as Kubernetes' MilliValue does.
            cpu_millis: get("cpu").map(|q| i64::try_from(div_ceil(q.0, 1_000_000)).unwrap_or(i64::MAX)),
            memory_bytes: get("memory").map(|q| i64::try_from(div_ceil(q.0, 1_000_000_000)).unwrap_or(i64::MAX)),
        }
    }

    fn add(self, other: Amounts) -> Amounts {
        let sum = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        Amounts {
            cpu_millis: sum(self.cpu_millis, other.cpu_millis),
            memory_bytes: sum(self.memory_bytes, other.memory_bytes),
        }
    }
}

fn div_ceil(n: i128, d: i128) -> i128 {
    if n <= 0 { n / d } else { (n + d - 1) / d }
}

/// Requests of a container (limits stand in for missing requests, as the API server defaults them).
pub fn requests(c: &core::Container) -> Amounts {
    let r = c.resources.as_ref();
    let req = Amounts::of(r.and_then(|r| r.requests.as_ref()));
    let lim = Amounts::of(r.and_then(|r| r.limits.as_ref()));
    Amounts { cpu_millis: req.cpu_millis.or(lim.cpu_millis), memory_bytes: req.memory_bytes.or(lim.memory_bytes) }
}

pub fn limits(c: &core::Container) -> Amounts {
    Amounts::of(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

/// cgroup v1 `cpu.shares` for milli-cpus requested.
pub fn cpu_shares(milli: Option<i64>) -> i64 {
    match milli {
        None | Some(0) => MIN_SHARES,
        Some(m) => (m * SHARES_PER_CPU / 1000).clamp(MIN_SHARES, MAX_SHARES),
    }
}

/// CFS quota for a milli-cpu limit over kubelet's 100 ms period.
pub fn cpu_quota(milli: i64) -> i64 {
    (milli * QUOTA_PERIOD / 1000).max(MIN_QUOTA)
}

/// The OOM score adjustment of a container of a pod in `qos` on a node with `memory_capacity` bytes.
pub fn oom_score_adj(qos: &str, container_memory_request: Option<i64>, memory_capacity: i64) -> i64 {
    match qos {
        "Guaranteed" => GUARANTEED_OOM_SCORE_ADJ,
        "BestEffort" => BEST_EFFORT_OOM_SCORE_ADJ,
        _ => {
            let request = container_memory_request.unwrap_or(0);
            let adj = if memory_capacity > 0 { 1000 - 1000 * request / memory_capacity } else { 1000 };
            // Burstable stays strictly between Guaranteed and BestEffort.
            if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
                1000 + GUARANTEED_OOM_SCORE_ADJ
            } else if adj == BEST_EFFORT_OOM_SCORE_ADJ {
                adj - 1
            } else {
                adj
            }
        }
    }
}

/// CRI resources of one container.
pub fn container_resources(c: &core::Container, qos: &str, memory_capacity: i64) -> cri::LinuxContainerResources {
    let (req, lim) = (requests(c), limits(c));
    let mut r = cri::LinuxContainerResources {
        cpu_shares: cpu_shares(req.cpu_millis),
        memory_limit_in_bytes: lim.memory_bytes.unwrap_or(0),
        oom_score_adj: oom_score_adj(qos, req.memory_bytes, memory_capacity),
        ..Default::default()
    };
    if let Some(milli) = lim.cpu_millis.filter(|m| *m > 0) {
        r.cpu_period = QUOTA_PERIOD;
        r.cpu_quota = cpu_quota(milli);
    }
    r
}

/// The pod's overhead (from its RuntimeClass, set at admission) as CRI resources.
pub fn overhead(spec: &core::PodSpec) -> Option<cri::LinuxContainerResources> {
    let o = Amounts::of(spec.overhead.as_ref());
    if o == Amounts::default() {
        return None;
    }
    Some(amounts_to_resources(o, o))
}

/// The pod's total resources for its sandbox (`LinuxPodSandboxConfig.resources`): the sum of its
/// containers' (an init container counts if it alone needs more), plus the overhead. `None`
/// when nothing is asked for.
pub fn pod_resources(spec: &core::PodSpec) -> Option<cri::LinuxContainerResources> {
    let sum = |f: fn(&core::Container) -> Amounts| {
        let containers = spec.containers.iter().map(f).fold(Amounts::default(), Amounts::add);
        spec.init_containers.iter().flatten().map(f).fold(containers, |acc, i| Amounts {
            cpu_millis: max_opt(acc.cpu_millis, i.cpu_millis),
            memory_bytes: max_opt(acc.memory_bytes, i.memory_bytes),
        })
    };
    let overhead = Amounts::of(spec.overhead.as_ref());
    let (req, lim) = (sum(requests).add(overhead), sum(limits));
    if req == Amounts::default() && lim == Amounts::default() {
        return None;
    }
    // A limit holds only if every container has one; else the pod is unbounded there.
    let all_limited = |f: fn(&Amounts) -> Option<i64>| spec.containers.iter().all(|c| f(&limits(c)).is_some());
    let lim = Amounts {
        cpu_millis: lim
            .cpu_millis
            .filter(|_| all_limited(|a| a.cpu_millis))
            .map(|m| m + overhead.cpu_millis.unwrap_or(0)),
        memory_bytes: lim
            .memory_bytes
            .filter(|_| all_limited(|a| a.memory_bytes))
            .map(|m| m + overhead.memory_bytes.unwrap_or(0)),
    };
    Some(amounts_to_resources(req, lim))
}

fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn amounts_to_resources(req: Amounts, lim: Amounts) -> cri::LinuxContainerResources {
    let mut r = cri::LinuxContainerResources {
        cpu_shares: cpu_shares(req.cpu_millis),
        memory_limit_in_bytes: lim.memory_bytes.unwrap_or(0),
        ..Default::default()
    };
    if let Some(milli) = lim.cpu_millis.filter(|m| *m > 0) {
        r.cpu_period = QUOTA_PERIOD;
        r.cpu_quota = cpu_quota(milli);
    }
    r
}

/// The node's memory in bytes (`MemTotal` of /proc/meminfo), 0 if unreadable.
pub fn node_memory_capacity() -> i64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> core::Container {
        let list = |kv: &[(&str, &str)]| {
            (!kv.is_empty())
                .then(|| kv.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect::<BTreeMap<_, _>>())
        };
        core::Container {
            name: "c".into(),
            resources: Some(core::ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn requests_become_shares_and_limits_become_quota_and_memory_limit() {
        let c = container(&[("cpu", "250m"), ("memory", "64Mi")], &[("cpu", "500m"), ("memory", "128Mi")]);
        let r = container_resources(&c, "Burstable", 1 << 30);
        assert_eq!(r.cpu_shares, 256);
        assert_eq!((r.cpu_period, r.cpu_quota), (100_000, 50_000));
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
        assert_eq!(r.oom_score_adj, 1000 - 1000 * (64 << 20) / (1 << 30));
    }

    #[test]
    fn best_effort_gets_minimum_shares_no_limits_and_the_highest_oom_score() {
        let r = container_resources(&container(&[], &[]), "BestEffort", 1 << 30);
        assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes, r.oom_score_adj), (2, 0, 0, 1000));
    }

    #[test]
    fn a_tiny_cpu_limit_gets_the_minimum_quota_and_guaranteed_the_lowest_oom_score() {
        let c = container(&[], &[("cpu", "1m"), ("memory", "10Mi")]);
        let r = container_resources(&c, "Guaranteed", 1 << 30);
        assert_eq!(r.cpu_quota, 1000);
        assert_eq!(r.cpu_shares, 2, "1m of a cpu is below the minimum share");
        assert_eq!(r.oom_score_adj, -997);
    }

    #[test]
    fn burstable_oom_scores_stay_between_the_other_classes() {
        assert_eq!(oom_score_adj("Burstable", Some(1 << 30), 1 << 30), 3);
        assert_eq!(oom_score_adj("Burstable", None, 1 << 30), 999);
    }

    #[test]
    fn pod_resources_sum_containers_take_the_largest_init_container_and_add_overhead() {
        let spec = core::PodSpec {
            containers: vec![
                container(&[("cpu", "100m")], &[("cpu", "200m"), ("memory", "100Mi")]),
                container(&[("cpu", "100m")], &[("cpu", "300m"), ("memory", "50Mi")]),
            ],
            init_containers: Some(vec![container(&[("cpu", "1")], &[("cpu", "1"), ("memory", "10Mi")])]),
            overhead: Some(BTreeMap::from([("cpu".to_string(), Quantity("250m".into()))])),
            ..Default::default()
        };
        let r = pod_resources(&spec).unwrap();
        assert_eq!(r.cpu_shares, (1000 + 250) * 1024 / 1000, "the init container's 1 cpu beats 200m, plus overhead");
        assert_eq!(r.cpu_quota, (1000 + 250) * 100, "limits: max(500m, 1) plus 250m");
        assert_eq!(r.memory_limit_in_bytes, 150 << 20);
        let o = overhead(&spec).unwrap();
        assert_eq!((o.cpu_shares, o.cpu_quota), (256, 25_000));
    }

    #[test]
    fn a_pod_with_one_unlimited_container_has_no_pod_limit() {
        let spec = core::PodSpec {
            containers: vec![container(&[], &[("memory", "100Mi")]), container(&[("memory", "1Mi")], &[])],
            ..Default::default()
        };
        assert_eq!(pod_resources(&spec).unwrap().memory_limit_in_bytes, 0);
        assert!(
            pod_resources(&core::PodSpec { containers: vec![container(&[], &[])], ..Default::default() }).is_none()
        );
    }
}
