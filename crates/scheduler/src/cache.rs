//! The scheduler's picture of the cluster: nodes with the pods bound to them, plus pods it has
//! assumed onto a node before the API confirms the binding, so a decision never waits on a
//! round trip and two decisions never give one node's last room twice.
//!
//! Assumed pods: `assume` when a node is chosen; `finish_binding` when the binding was written
//! (the pod then expires after [`ASSUMED_TTL`] unless the watch confirms it); `forget` when the
//! binding failed. `add_pod` of the bound pod from the watch confirms an assumed one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::framework::{Snapshot, ZonePods};
use crate::node_info::LABEL_ZONE;
use crate::node_info::{NodeInfo, NodeSpec};
use crate::pod_info::PodInfo;

/// How long a bound pod stays assumed without the watch confirming it.
pub const ASSUMED_TTL: Duration = Duration::from_secs(30);

struct PodState {
    pod: Arc<PodInfo>,
    assumed: bool,
    /// Set once the binding of an assumed pod was written.
    expires: Option<Instant>,
}

#[derive(Default)]
pub struct Cache {
    nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    pods: HashMap<String, PodState>,
    /// Pods bound to a node the cache does not know (yet): attached when it appears.
    waiting: HashMap<String, Vec<String>>,
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
    image_nodes: HashMap<String, usize>,
    /// Handler name → its bit; handlers are numbered as nodes first report them (64 at most).
    handler_bits: HashMap<String, u64>,
    zone_pods: ZonePods,
}

/// The zone a node's pods count in for the default spreading.
fn zone_of(node: &NodeSpec) -> &str {
    node.labels.get(LABEL_ZONE).map_or("", String::as_str)
}

/// The controller a pod counts for in [`ZonePods`] (and in [`NodeInfo::controller_pods`]).
fn counted_owner(pod: &PodInfo) -> Option<&str> {
    pod.controller_uid.as_deref().filter(|_| !pod.terminating)
}

fn count_zone(zone_pods: &mut ZonePods, zone: &str, owner: &str, delta: i64) {
    if delta == 0 {
        return;
    }
    let zones = match zone_pods.get_mut(owner) {
        Some(zones) => zones,
        None => zone_pods.entry(owner.to_string()).or_default(),
    };
    let n = match zones.get_mut(zone) {
        Some(n) => n,
        None => zones.entry(zone.to_string()).or_default(),
    };
    *n += delta;
    if *n == 0 {
        zones.remove(zone);
        if zones.is_empty() {
            zone_pods.remove(owner);
        }
    }
}

impl Cache {
    pub fn new() -> Cache {
        Cache::default()
    }

    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            nodes: &self.nodes,
            namespace_labels: &self.namespace_labels,
            image_nodes: &self.image_nodes,
            handler_bits: &self.handler_bits,
            zone_pods: Some(&self.zone_pods),
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }

    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.name())
    }

    /// The bits of a node's handlers; `None` for every handler, or when one has no bit.
    fn handler_mask(&mut self, spec: &NodeSpec) -> Option<u64> {
        let mut mask = 0u64;
        for handler in spec.runtime_handlers.as_ref()? {
            let next = self.handler_bits.len();
            let bit = match self.handler_bits.get(handler) {
                Some(bit) => *bit,
                None if next < 64 => *self.handler_bits.entry(handler.clone()).or_insert(1 << next),
                None => return None,
            };
            mask |= bit;
        }
        Some(mask)
    }

    /// Adds a node or updates one; returns whether anything the plugins read changed.
    pub fn set_node(&mut self, spec: NodeSpec) -> bool {
        let mask = self.handler_mask(&spec);
        if let Some(&i) = self.index.get(&spec.name) {
            if self.nodes[i].node == spec {
                return false;
            }
            self.count_images(&self.nodes[i].node.images.keys().cloned().collect::<Vec<_>>(), false);
            self.count_images(&spec.images.keys().cloned().collect::<Vec<_>>(), true);
            let (old_zone, new_zone) = (zone_of(&self.nodes[i].node), zone_of(&spec));
            if old_zone != new_zone {
                for (owner, &n) in &self.nodes[i].controller_pods {
                    count_zone(&mut self.zone_pods, old_zone, owner, -i64::from(n));
                    count_zone(&mut self.zone_pods, new_zone, owner, i64::from(n));
                }
            }
            self.nodes[i].set_node(spec);
            self.nodes[i].handler_mask = mask;
            return true;
        }
        self.count_images(&spec.images.keys().cloned().collect::<Vec<_>>(), true);
        let name = spec.name.clone();
        let mut info = NodeInfo::new(spec);
        info.handler_mask = mask;
        for uid in self.waiting.remove(&name).unwrap_or_default() {
            if let Some(state) = self.pods.get(&uid) {
                if let Some(owner) = counted_owner(&state.pod) {
                    count_zone(&mut self.zone_pods, zone_of(&info.node), owner, 1);
                }
                info.add_pod(state.pod.clone());
            }
        }
        self.index.insert(name, self.nodes.len());
        self.nodes.push(info);
        true
    }

    pub fn remove_node(&mut self, name: &str) -> bool {
        let Some(i) = self.index.remove(name) else { return false };
        let info = self.nodes.swap_remove(i);
        if let Some(moved) = self.nodes.get(i) {
            self.index.insert(moved.name().to_string(), i);
        }
        self.count_images(&info.node.images.keys().cloned().collect::<Vec<_>>(), false);
        for (owner, &n) in &info.controller_pods {
            count_zone(&mut self.zone_pods, zone_of(&info.node), owner, -i64::from(n));
        }
        let uids: Vec<String> = info.pods.iter().map(|p| p.uid.clone()).collect();
        if !uids.is_empty() {
            self.waiting.insert(name.to_string(), uids);
        }
        true
    }

    fn count_images(&mut self, images: &[String], add: bool) {
        for image in images {
            if add {
                *self.image_nodes.entry(image.clone()).or_default() += 1;
            } else if let Some(n) = self.image_nodes.get_mut(image) {
                *n -= 1;
                if *n == 0 {
                    self.image_nodes.remove(image);
                }
            }
        }
    }

    /// A pod bound to a node, as the watch reports it: confirms an assumed pod, or adds or
    /// updates one. Returns true if it was not in the cache before (assumed counts as in).
    pub fn add_pod(&mut self, pod: PodInfo) -> bool {
        let pod = Arc::new(pod);
        let existed = self.remove_from_node(&pod.uid);
        self.place(&pod);
        self.pods.insert(pod.uid.clone(), PodState { pod, assumed: false, expires: None });
        !existed
    }

    /// Removes a pod (deleted, finished, or no longer bound); true if it was there.
    pub fn remove_pod(&mut self, uid: &str) -> bool {
        let existed = self.remove_from_node(uid);
        self.pods.remove(uid);
        existed
    }

    pub fn assume(&mut self, pod: PodInfo) {
        let pod = Arc::new(pod);
        self.remove_from_node(&pod.uid);
        self.place(&pod);
        self.pods.insert(pod.uid.clone(), PodState { pod, assumed: true, expires: None });
    }

    pub fn is_assumed(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|s| s.assumed)
    }

    pub fn contains_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    pub fn finish_binding(&mut self, uid: &str, now: Instant) {
        if let Some(state) = self.pods.get_mut(uid).filter(|s| s.assumed) {
            state.expires = Some(now + ASSUMED_TTL);
        }
    }

    /// Drops an assumed pod whose binding failed.
    pub fn forget(&mut self, uid: &str) {
        if self.is_assumed(uid) {
            self.remove_pod(uid);
        }
    }

    /// Drops assumed pods the watch has not confirmed in time; returns their UIDs.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, s)| s.assumed && s.expires.is_some_and(|t| t <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &expired {
            self.remove_pod(uid);
        }
        expired
    }

    /// UIDs of the pods the watch has reported (not merely assumed), for resyncs.
    pub fn confirmed_pods(&self) -> Vec<String> {
        self.pods.iter().filter(|(_, s)| !s.assumed).map(|(uid, _)| uid.clone()).collect()
    }

    pub fn set_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) -> bool {
        self.namespace_labels.insert(name.to_string(), labels.clone()) != Some(labels)
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.namespace_labels.remove(name);
    }

    fn place(&mut self, pod: &Arc<PodInfo>) {
        match self.index.get(&pod.node_name) {
            Some(&i) => {
                if let Some(owner) = counted_owner(pod) {
                    count_zone(&mut self.zone_pods, zone_of(&self.nodes[i].node), owner, 1);
                }
                self.nodes[i].add_pod(pod.clone());
            }
            None => self.waiting.entry(pod.node_name.clone()).or_default().push(pod.uid.clone()),
        }
    }

    fn remove_from_node(&mut self, uid: &str) -> bool {
        let Some(state) = self.pods.get(uid) else { return false };
        let node = &state.pod.node_name;
        match self.index.get(node) {
            Some(&i) => {
                if self.nodes[i].remove_pod(uid)
                    && let Some(owner) = counted_owner(&state.pod)
                {
                    count_zone(&mut self.zone_pods, zone_of(&self.nodes[i].node), owner, -1);
                }
            }
            None => {
                if let Some(w) = self.waiting.get_mut(node) {
                    w.retain(|u| u != uid);
                    if w.is_empty() {
                        self.waiting.remove(node);
                    }
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    fn node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            allocatable: Resources { milli_cpu: 1000, memory: 1000, ephemeral_storage: 0 },
            allowed_pods: 10,
            ..Default::default()
        }
    }

    fn pod(uid: &str, node: &str, cpu: i64) -> PodInfo {
        PodInfo {
            uid: uid.into(),
            node_name: node.into(),
            requests: Resources { milli_cpu: cpu, ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn assumed_pods_take_room_until_confirmed_or_forgotten() {
        let mut c = Cache::new();
        c.set_node(node("n1"));
        c.assume(pod("a", "n1", 300));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 300);
        assert!(c.is_assumed("a"));
        // The watch confirms it: still counted once.
        c.add_pod(pod("a", "n1", 300));
        assert!(!c.is_assumed("a"));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 300);
        c.assume(pod("b", "n1", 200));
        c.forget("b");
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 300);
        // Forgetting a confirmed pod does nothing.
        c.forget("a");
        assert_eq!(c.node("n1").unwrap().pods.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfirmed_binding_expires_after_the_ttl() {
        let mut c = Cache::new();
        c.set_node(node("n1"));
        c.assume(pod("a", "n1", 100));
        assert!(c.expire(Instant::now() + ASSUMED_TTL * 2).is_empty(), "not expired while binding");
        c.finish_binding("a", Instant::now());
        tokio::time::advance(ASSUMED_TTL).await;
        assert_eq!(c.expire(Instant::now()), vec!["a".to_string()]);
        assert!(c.node("n1").unwrap().pods.is_empty());
    }

    #[test]
    fn pods_of_an_unknown_node_are_attached_when_it_appears() {
        let mut c = Cache::new();
        c.add_pod(pod("a", "late", 100));
        assert!(c.node("late").is_none());
        c.set_node(node("late"));
        assert_eq!(c.node("late").unwrap().requested.milli_cpu, 100);
        c.remove_node("late");
        c.set_node(node("late"));
        assert_eq!(c.node("late").unwrap().pods.len(), 1, "pods survive their node's removal and return");
    }

    #[test]
    fn removing_a_node_keeps_the_index_of_the_others() {
        let mut c = Cache::new();
        for n in ["a", "b", "c"] {
            c.set_node(node(n));
        }
        c.remove_node("a");
        assert_eq!(c.node("c").unwrap().name(), "c");
        assert_eq!(c.node("b").unwrap().name(), "b");
        assert_eq!(c.node_count(), 2);
    }

    #[test]
    fn a_node_update_says_whether_it_changed_and_counts_images() {
        let mut c = Cache::new();
        let mut n = node("a");
        n.images.insert("img:1".into(), 10);
        assert!(c.set_node(n.clone()));
        assert!(!c.set_node(n.clone()));
        assert_eq!(c.snapshot().image_nodes.get("img:1"), Some(&1));
        n.images.clear();
        assert!(c.set_node(n));
        assert_eq!(c.snapshot().image_nodes.get("img:1"), None);
    }

    #[test]
    fn the_zone_counts_follow_pods_nodes_and_zone_labels() {
        let zoned = |name: &str, zone: Option<&str>| {
            let mut n = node(name);
            if let Some(z) = zone {
                n.labels.insert(LABEL_ZONE.into(), z.into());
            }
            n
        };
        let owned =
            |uid: &str, node: &str, owner: &str| PodInfo { controller_uid: Some(owner.into()), ..pod(uid, node, 10) };
        let counts = |c: &Cache, owner: &str| -> Vec<(String, i64)> {
            let mut v: Vec<(String, i64)> =
                c.zone_pods.get(owner).into_iter().flatten().map(|(z, n)| (z.clone(), *n)).collect();
            v.sort();
            v
        };
        let mut c = Cache::new();
        c.set_node(zoned("a1", Some("a")));
        c.set_node(zoned("b1", Some("b")));
        c.set_node(zoned("x", None));
        c.add_pod(owned("p1", "a1", "rs"));
        c.assume(owned("p2", "b1", "rs"));
        c.add_pod(owned("p3", "x", "rs"));
        c.add_pod(owned("p4", "late", "rs"));
        c.add_pod(pod("free", "a1", 10));
        assert_eq!(
            counts(&c, "rs"),
            [("".into(), 1), ("a".into(), 1), ("b".into(), 1)],
            "unlabelled nodes count as \"\""
        );
        c.set_node(zoned("late", Some("a")));
        assert_eq!(counts(&c, "rs")[1], ("a".into(), 2), "a late node brings its pods");
        c.set_node(zoned("a1", Some("b")));
        assert_eq!(
            counts(&c, "rs"),
            [("".into(), 1), ("a".into(), 1), ("b".into(), 2)],
            "a relabelled node moves its pods"
        );
        c.forget("p2");
        c.remove_node("late");
        let mut terminating = owned("p1", "a1", "rs");
        terminating.terminating = true;
        c.add_pod(terminating);
        assert_eq!(counts(&c, "rs"), [("".into(), 1)]);
        c.remove_pod("p3");
        assert!(c.zone_pods.is_empty(), "no empty entries are left behind");
    }

    #[test]
    fn a_moved_pod_leaves_its_old_node() {
        let mut c = Cache::new();
        c.set_node(node("n1"));
        c.set_node(node("n2"));
        c.add_pod(pod("a", "n1", 100));
        c.add_pod(pod("a", "n2", 100));
        assert!(c.node("n1").unwrap().pods.is_empty());
        assert_eq!(c.node("n2").unwrap().pods.len(), 1);
        assert!(c.remove_pod("a"));
        assert!(c.node("n2").unwrap().pods.is_empty());
    }
}
