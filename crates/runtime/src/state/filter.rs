//! The ListPodSandbox and ListContainers filters: CRI's fields, ANDed, over the records.
//!
//! Ids in a filter may be prefixes, as crictl passes them; the [`Store`](super::Store) resolves a
//! prefix to the one id it names (as containerd does: a prefix matching none or several ids lists
//! nothing) before matching.

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;

use super::container::ContainerRecord;
use super::sandbox::SandboxRecord;

/// ListPodSandbox's filter. `state` is a CRI `PodSandboxState` value: an unknown value matches
/// nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    pub id: Option<String>,
    pub state: Option<i32>,
    /// Every pair must be among the record's labels.
    pub labels: BTreeMap<String, String>,
}

impl SandboxFilter {
    /// Whether `record` passes, with `id` compared whole (the store resolves prefixes first).
    pub fn matches(&self, record: &SandboxRecord) -> bool {
        self.id.as_ref().is_none_or(|id| *id == record.id)
            && self.state.is_none_or(|s| s == record.state().to_cri() as i32)
            && labels_match(&self.labels, &record.labels)
    }
}

impl From<cri::PodSandboxFilter> for SandboxFilter {
    fn from(f: cri::PodSandboxFilter) -> Self {
        SandboxFilter {
            id: non_empty(f.id),
            state: f.state.map(|s| s.state),
            labels: f.label_selector.into_iter().collect(),
        }
    }
}

/// ListContainers' filter. `state` is a CRI `ContainerState` value: an unknown value matches
/// nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    pub id: Option<String>,
    pub state: Option<i32>,
    pub sandbox_id: Option<String>,
    /// Every pair must be among the record's labels.
    pub labels: BTreeMap<String, String>,
}

impl ContainerFilter {
    /// Whether `record` passes, with ids compared whole (the store resolves prefixes first).
    pub fn matches(&self, record: &ContainerRecord) -> bool {
        self.id.as_ref().is_none_or(|id| *id == record.id)
            && self.sandbox_id.as_ref().is_none_or(|id| *id == record.sandbox_id)
            && self.state.is_none_or(|s| s == record.state().to_cri() as i32)
            && labels_match(&self.labels, &record.labels)
    }
}

impl From<cri::ContainerFilter> for ContainerFilter {
    fn from(f: cri::ContainerFilter) -> Self {
        ContainerFilter {
            id: non_empty(f.id),
            state: f.state.map(|s| s.state),
            sandbox_id: non_empty(f.pod_sandbox_id),
            labels: f.label_selector.into_iter().collect(),
        }
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn labels_match(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::state::container::tests::container_in;
    use crate::state::sandbox::tests::sandbox;

    #[test]
    fn an_empty_cri_filter_matches_everything() {
        let f = SandboxFilter::from(cri::PodSandboxFilter::default());
        assert_eq!(f, SandboxFilter::default());
        assert!(f.matches(&sandbox("web")));
        let f = ContainerFilter::from(cri::ContainerFilter::default());
        assert!(f.matches(&container_in(&sandbox("web"), "app")));
    }

    #[test]
    fn a_label_selector_needs_every_pair() {
        let s = sandbox("web"); // app=web, tier=web
        let sel = |pairs: &[(&str, &str)]| SandboxFilter {
            labels: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        assert!(sel(&[("app", "web")]).matches(&s));
        assert!(sel(&[("app", "web"), ("tier", "web")]).matches(&s));
        assert!(!sel(&[("app", "web"), ("tier", "db")]).matches(&s));
        assert!(!sel(&[("missing", "")]).matches(&s));
    }

    #[test]
    fn sandbox_state_filters_use_cri_values_and_creating_counts_as_not_ready() {
        let mut s = sandbox("web");
        let state = |st: cri::PodSandboxState| {
            SandboxFilter::from(cri::PodSandboxFilter {
                state: Some(cri::PodSandboxStateValue { state: st as i32 }),
                ..Default::default()
            })
        };
        assert!(state(cri::PodSandboxState::SandboxNotready).matches(&s));
        s.mark_ready().unwrap();
        assert!(state(cri::PodSandboxState::SandboxReady).matches(&s));
        assert!(!state(cri::PodSandboxState::SandboxNotready).matches(&s));
        let unknown = SandboxFilter { state: Some(7), ..Default::default() };
        assert!(!unknown.matches(&s));
    }

    #[test]
    fn container_filters_combine_id_sandbox_state_and_labels() {
        let s = sandbox("web");
        let c = container_in(&s, "app");
        let f = ContainerFilter::from(cri::ContainerFilter {
            id: c.id.clone(),
            pod_sandbox_id: s.id.clone(),
            state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerCreated as i32 }),
            label_selector: HashMap::from([("role".into(), "app".into())]),
        });
        assert!(f.matches(&c));
        assert!(!ContainerFilter { sandbox_id: Some("other".into()), ..f.clone() }.matches(&c));
        assert!(!ContainerFilter { id: Some("other".into()), ..f.clone() }.matches(&c));
        let running = Some(cri::ContainerState::ContainerRunning as i32);
        assert!(!ContainerFilter { state: running, ..f.clone() }.matches(&c));
    }
}
