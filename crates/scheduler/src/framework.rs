//! The vocabulary plugins share: the snapshot they read, a node's rejection with Kubernetes'
//! reason strings, the failure message that counts nodes per reason, and score normalisation.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::node_info::NodeInfo;

/// The highest score a plugin gives a node (Kubernetes' `MaxNodeScore`).
pub const MAX_NODE_SCORE: i64 = 100;

/// What the plugins see of the cluster during one scheduling decision.
#[derive(Clone, Copy)]
pub struct Snapshot<'a> {
    pub nodes: &'a [NodeInfo],
    /// Labels of each namespace, for pod affinity terms with a namespace selector.
    pub namespace_labels: &'a HashMap<String, BTreeMap<String, String>>,
    /// How many nodes hold each image, for image locality.
    pub image_nodes: &'a HashMap<String, usize>,
    /// A bit for each handler some node reports (the first 64), so the RuntimeClass filter
    /// tests a node with one AND instead of a string lookup.
    pub handler_bits: &'a HashMap<String, u64>,
    /// Pods per controller per zone, over every node, when the cache keeps them (see
    /// [`ZonePods`]); `None`: plugins count node by node.
    pub zone_pods: Option<&'a ZonePods>,
}

/// Controller UID → `topology.kubernetes.io/zone` value ("" for nodes without the label) →
/// that controller's pods that are not terminating on the nodes of the zone: the default
/// spreading's zone counts, kept as pods come and go instead of summed over every node for
/// every pod scheduled.
pub type ZonePods = HashMap<String, HashMap<String, i64>>;

/// Why one node cannot take the pod: the plugin that said no and its reasons, in the words
/// Kubernetes uses (`Insufficient cpu`, `node(s) had untolerated taint {k: v}`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub plugin: &'static str,
    pub reasons: Vec<Cow<'static, str>>,
}

impl Rejection {
    pub fn new(plugin: &'static str, reason: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection { plugin, reasons: vec![reason.into()] }
    }
}

pub type FilterResult = Result<(), Rejection>;

/// Why no node could take a pod: how many nodes failed for each reason, and which plugins
/// rejected any (the queue moves the pod back when an event could satisfy one of them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FitError {
    pub num_all_nodes: usize,
    pub reasons: BTreeMap<Cow<'static, str>, usize>,
    pub plugins: Vec<&'static str>,
}

impl FitError {
    pub fn record(&mut self, rejection: Rejection) {
        for reason in rejection.reasons {
            *self.reasons.entry(reason).or_default() += 1;
        }
        if !self.plugins.contains(&rejection.plugin) {
            self.plugins.push(rejection.plugin);
        }
    }

    pub fn merge(&mut self, other: FitError) {
        for (reason, n) in other.reasons {
            *self.reasons.entry(reason).or_default() += n;
        }
        for p in other.plugins {
            if !self.plugins.contains(&p) {
                self.plugins.push(p);
            }
        }
    }
}

impl fmt::Display for FitError {
    /// `0/5 nodes are available: 2 Insufficient memory, 3 node(s) didn't support RuntimeClass "gvisor".`:
    /// each reason with its count, the whole strings sorted as Kubernetes sorts them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.num_all_nodes == 0 {
            return write!(f, "no nodes available to schedule pods");
        }
        let mut parts: Vec<String> = self.reasons.iter().map(|(reason, n)| format!("{n} {reason}")).collect();
        parts.sort();
        write!(f, "0/{} nodes are available:", self.num_all_nodes)?;
        if !parts.is_empty() {
            write!(f, " {}.", parts.join(", "))?;
        }
        Ok(())
    }
}

/// Kubernetes' `DefaultNormalizeScore`: scales scores to 0..=100 by the highest; `reverse`
/// turns the scale around (fewer is better). All zero stays zero, or becomes 100 if reversed.
pub fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        let scaled = MAX_NODE_SCORE * *s / max;
        *s = if reverse { MAX_NODE_SCORE - scaled } else { scaled };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_message_counts_nodes_per_reason_sorted_as_strings() {
        let mut e = FitError { num_all_nodes: 5, ..Default::default() };
        for _ in 0..3 {
            e.record(Rejection::new("RuntimeClass", "node(s) didn't support RuntimeClass \"gvisor\""));
        }
        for _ in 0..2 {
            e.record(Rejection::new("NodeResourcesFit", "Insufficient memory"));
        }
        assert_eq!(
            e.to_string(),
            "0/5 nodes are available: 2 Insufficient memory, 3 node(s) didn't support RuntimeClass \"gvisor\"."
        );
        assert_eq!(e.plugins, vec!["RuntimeClass", "NodeResourcesFit"]);
    }

    #[test]
    fn a_node_may_count_under_several_reasons_of_one_plugin() {
        let mut e = FitError { num_all_nodes: 1, ..Default::default() };
        e.record(Rejection {
            plugin: "NodeResourcesFit",
            reasons: vec!["Insufficient cpu".into(), "Insufficient memory".into()],
        });
        assert_eq!(e.to_string(), "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.");
    }

    #[test]
    fn counts_sort_as_strings_as_kubernetes_does() {
        let mut e = FitError { num_all_nodes: 12, ..Default::default() };
        for _ in 0..10 {
            e.record(Rejection::new("NodeUnschedulable", "node(s) were unschedulable"));
        }
        for _ in 0..2 {
            e.record(Rejection::new("NodeResourcesFit", "Too many pods"));
        }
        assert_eq!(e.to_string(), "0/12 nodes are available: 10 node(s) were unschedulable, 2 Too many pods.");
    }

    #[test]
    fn no_nodes_at_all_has_its_own_message() {
        assert_eq!(FitError::default().to_string(), "no nodes available to schedule pods");
    }

    #[test]
    fn normalisation_scales_to_the_highest_and_reverses() {
        let mut s = vec![0, 5, 10];
        default_normalize(&mut s, false);
        assert_eq!(s, vec![0, 50, 100]);
        let mut s = vec![0, 5, 10];
        default_normalize(&mut s, true);
        assert_eq!(s, vec![100, 50, 0]);
        let mut s = vec![0, 0];
        default_normalize(&mut s, true);
        assert_eq!(s, vec![100, 100]);
    }
}
