//! Resource amounts as the scheduler counts them: a pod's effective requests (containers, init
//! containers, sidecars, overhead) and a node's allocatable, in milli-cpus and bytes.

use std::collections::BTreeMap;

use berth_api::validation::Quantity as Parsed;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Requests the scoring plugins assume for a container that names none (Kubernetes'
/// `DefaultMilliCPURequest` and `DefaultMemoryRequest`), so empty pods still spread.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// Amounts of the resources the scheduler fits: cpu, memory and ephemeral storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
}

impl Resources {
    pub fn is_zero(&self) -> bool {
        *self == Resources::default()
    }

    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_add(other.milli_cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_add(other.ephemeral_storage);
    }

    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_sub(other.milli_cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_sub(other.ephemeral_storage);
    }

    fn max(&self, other: &Resources) -> Resources {
        Resources {
            milli_cpu: self.milli_cpu.max(other.milli_cpu),
            memory: self.memory.max(other.memory),
            ephemeral_storage: self.ephemeral_storage.max(other.ephemeral_storage),
        }
    }

    fn plus(mut self, other: &Resources) -> Resources {
        self.add(other);
        self
    }

    /// Reads `cpu`, `memory` and `ephemeral-storage` of a resource list; absent ones are 0.
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Resources {
        let Some(list) = list else { return Resources::default() };
        Resources {
            milli_cpu: list.get("cpu").map_or(0, milli_value),
            memory: list.get("memory").map_or(0, value),
            ephemeral_storage: list.get("ephemeral-storage").map_or(0, value),
        }
    }
}

/// A quantity in whole units, rounded up (Kubernetes' `Value`).
pub fn value(q: &Quantity) -> i64 {
    scaled(q, 1_000_000_000)
}

/// A quantity in thousandths, rounded up (Kubernetes' `MilliValue`).
pub fn milli_value(q: &Quantity) -> i64 {
    scaled(q, 1_000_000)
}

fn scaled(q: &Quantity, divisor: i128) -> i64 {
    let Ok(nanos) = Parsed::parse(&q.0) else { return 0 };
    let n = nanos.0;
    let v = if n <= 0 { n / divisor } else { (n + divisor - 1) / divisor };
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// What one container asks for: its requests, with limits standing in for missing requests as
/// the API server defaults them; `non_zero` fills cpu and memory that are not named at all with
/// the scoring defaults (an explicit 0 stays 0, as Kubernetes' `GetNonzeroRequests`).
fn container_requests(c: &core::Container) -> (Resources, Resources) {
    let r = c.resources.as_ref();
    let requests = r.and_then(|r| r.requests.as_ref());
    let limits = r.and_then(|r| r.limits.as_ref());
    let get = |name: &str| requests.and_then(|l| l.get(name)).or_else(|| limits.and_then(|l| l.get(name)));
    let req = Resources {
        milli_cpu: get("cpu").map_or(0, milli_value),
        memory: get("memory").map_or(0, value),
        ephemeral_storage: get("ephemeral-storage").map_or(0, value),
    };
    let non_zero = Resources {
        milli_cpu: if get("cpu").is_some() { req.milli_cpu } else { DEFAULT_MILLI_CPU_REQUEST },
        memory: if get("memory").is_some() { req.memory } else { DEFAULT_MEMORY_REQUEST },
        ephemeral_storage: 0,
    };
    (req, non_zero)
}

fn is_sidecar(c: &core::Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// A pod's effective requests as Kubernetes' `PodRequests` computes them, and the same with the
/// scoring defaults: the sum of its containers and sidecars, or the largest init step if more
/// (an init container runs beside the sidecars started before it), plus `spec.overhead`.
pub fn pod_requests(spec: &core::PodSpec) -> (Resources, Resources) {
    let mut reqs = Resources::default();
    let mut non_zero = Resources::default();
    for c in &spec.containers {
        let (r, n) = container_requests(c);
        reqs.add(&r);
        non_zero.add(&n);
    }
    let (mut sidecars, mut sidecars_nz) = (Resources::default(), Resources::default());
    let (mut init_max, mut init_max_nz) = (Resources::default(), Resources::default());
    for c in spec.init_containers.iter().flatten() {
        let (r, n) = container_requests(c);
        let (step, step_nz) = if is_sidecar(c) {
            reqs.add(&r);
            non_zero.add(&n);
            sidecars.add(&r);
            sidecars_nz.add(&n);
            (sidecars, sidecars_nz)
        } else {
            (r.plus(&sidecars), n.plus(&sidecars_nz))
        };
        init_max = init_max.max(&step);
        init_max_nz = init_max_nz.max(&step_nz);
    }
    let mut reqs = reqs.max(&init_max);
    let mut non_zero = non_zero.max(&init_max_nz);
    let overhead = Resources::from_list(spec.overhead.as_ref());
    reqs.add(&overhead);
    non_zero.add(&overhead);
    (reqs, non_zero)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(json: serde_json::Value) -> core::Container {
        serde_json::from_value(json).unwrap()
    }

    fn spec(json: serde_json::Value) -> core::PodSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn quantities_round_up_to_millis_and_units() {
        assert_eq!(milli_value(&Quantity("1".into())), 1000);
        assert_eq!(milli_value(&Quantity("250m".into())), 250);
        assert_eq!(milli_value(&Quantity("0.0001".into())), 1);
        assert_eq!(value(&Quantity("1Gi".into())), 1 << 30);
        assert_eq!(value(&Quantity("1k".into())), 1000);
        assert_eq!(value(&Quantity("bogus".into())), 0);
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        let (r, _) = container_requests(&container(serde_json::json!({
            "name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}
        })));
        assert_eq!(r, Resources { milli_cpu: 1000, memory: 1 << 30, ephemeral_storage: 0 });
    }

    #[test]
    fn containers_without_requests_get_the_scoring_defaults_but_explicit_zero_stays() {
        let (r, n) = container_requests(&container(serde_json::json!({"name": "a"})));
        assert!(r.is_zero());
        assert_eq!((n.milli_cpu, n.memory), (DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST));
        let (_, n) = container_requests(&container(serde_json::json!({
            "name": "a", "resources": {"requests": {"cpu": "0"}}
        })));
        assert_eq!((n.milli_cpu, n.memory), (0, DEFAULT_MEMORY_REQUEST));
    }

    #[test]
    fn pod_requests_take_the_largest_init_container_and_add_overhead() {
        let s = spec(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m", "memory": "100Mi"}}}
            ],
            "initContainers": [
                {"name": "i1", "resources": {"requests": {"cpu": "500m", "memory": "10Mi"}}},
                {"name": "i2", "resources": {"requests": {"cpu": "100m", "memory": "300Mi"}}}
            ],
            "overhead": {"cpu": "50m", "memory": "1Mi"}
        }));
        let (r, _) = pod_requests(&s);
        assert_eq!(r.milli_cpu, 550);
        assert_eq!(r.memory, (300 << 20) + (1 << 20));
    }

    #[test]
    fn sidecars_add_to_the_containers_and_to_every_later_init_step() {
        let s = spec(serde_json::json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}],
            "initContainers": [
                {"name": "first", "resources": {"requests": {"cpu": "300m"}}},
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "after", "resources": {"requests": {"cpu": "250m"}}}
            ]
        }));
        let (r, _) = pod_requests(&s);
        // Running: 100m + 200m sidecar = 300m; init steps: 300m, 200m, 250m + 200m = 450m.
        assert_eq!(r.milli_cpu, 450);
    }
}
