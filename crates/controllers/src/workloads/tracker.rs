//! Turns a watcher's events into the add/update/delete changes client-go's informer handlers
//! receive (with the previous state on updates), and those changes into what the ReplicaSet and
//! Deployment controllers do about them.
//!
//! kube's watcher reports `Apply` for both adds and updates and, after a relist, only the objects
//! that exist; the controllers need the old labels and controller of an updated object (to wake
//! the controller it left) and the objects that vanished during a relist (to strike them off
//! their expectations). The tracker remembers that much of every object, and reports a relist
//! as one batch of changes at `InitDone`, when the reflector store swaps its contents, so no
//! change is acted on before the store shows it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::runtime::watcher::Event;

use super::controller_of;

/// The part of an object the reactions depend on.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub controller: Option<OwnerReference>,
    pub deleting: bool,
}

impl Seen {
    pub fn of<K: Resource>(obj: &K) -> Seen {
        let m = obj.meta();
        Seen {
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            resource_version: m.resource_version.clone().unwrap_or_default(),
            labels: m.labels.clone().unwrap_or_default(),
            controller: controller_of(m).cloned(),
            deleting: m.deletion_timestamp.is_some(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One change, as an informer's `OnAdd`/`OnUpdate`/`OnDelete` would see it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Added(Seen),
    Updated { old: Box<Seen>, new: Box<Seen> },
    Deleted(Seen),
}

/// Remembers what it has seen of every object of one watch.
#[derive(Debug, Default)]
pub struct Tracker {
    known: HashMap<(String, String), Seen>,
    /// The objects listed so far during a relist.
    relisting: Option<HashMap<(String, String), Seen>>,
}

impl Tracker {
    /// The changes one watcher event makes, in order.
    pub fn observe<K: Resource>(&mut self, event: &Event<K>) -> Vec<Change> {
        match event {
            Event::Apply(obj) => self.applied(obj),
            Event::Delete(obj) => self.deleted(obj),
            Event::Init => {
                self.relisting = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                let seen = Seen::of(obj);
                self.relisting
                    .get_or_insert_with(HashMap::new)
                    .insert((seen.namespace.clone(), seen.name.clone()), seen);
                Vec::new()
            }
            Event::InitDone => self.relisted(),
        }
    }

    /// The changes of an object added or updated.
    fn applied<K: Resource>(&mut self, obj: &K) -> Vec<Change> {
        let seen = Seen::of(obj);
        let id = (seen.namespace.clone(), seen.name.clone());
        replaced(self.known.insert(id, seen.clone()), seen)
    }

    /// The change of an object deleted.
    fn deleted<K: Resource>(&mut self, obj: &K) -> Vec<Change> {
        let seen = Seen::of(obj);
        self.known.remove(&(seen.namespace.clone(), seen.name.clone()));
        vec![Change::Deleted(seen)]
    }

    /// The changes of a relist, once it is complete.
    fn relisted(&mut self) -> Vec<Change> {
        let listed = self.relisting.take().unwrap_or_default();
        let mut changes = Vec::new();
        let mut old = std::mem::take(&mut self.known);
        for (id, seen) in &listed {
            match old.remove(id) {
                Some(before) if before.uid == seen.uid => {
                    if before != *seen {
                        changes.push(Change::Updated { old: Box::new(before), new: Box::new(seen.clone()) });
                    }
                }
                Some(before) => {
                    changes.push(Change::Deleted(before));
                    changes.push(Change::Added(seen.clone()));
                }
                None => changes.push(Change::Added(seen.clone())),
            }
        }
        // What the relist no longer lists was deleted while the watch was down.
        changes.extend(old.into_values().map(Change::Deleted));
        self.known = listed;
        changes
    }
}

/// The changes from `old` to `new`, given both, as the pod cache gives them (so pods need no
/// tracker).
pub fn between<K: Resource>(old: Option<&K>, new: &K) -> Vec<Change> {
    replaced(old.map(Seen::of), Seen::of(new))
}

/// An object seen as `old` seen again as `new`: the same object (UID) updated, or another.
fn replaced(old: Option<Seen>, new: Seen) -> Vec<Change> {
    match old {
        Some(old) if old.uid == new.uid => vec![Change::Updated { old: Box::new(old), new: Box::new(new) }],
        Some(old) => vec![Change::Deleted(old), Change::Added(new)],
        None => vec![Change::Added(new)],
    }
}

/// What a controller does about a change of one of its children. `namespace` is the child's,
/// and so its controller's.
#[derive(Clone, Debug, PartialEq)]
pub enum Reaction {
    /// The controller saw one of its creations (expectations).
    CreationObserved { owner: OwnerReference, namespace: String },
    /// The controller saw this child (`namespace/name`) deleted or marked for deletion.
    DeletionObserved { owner: OwnerReference, namespace: String, child: String },
    /// Sync the controller.
    Enqueue { owner: OwnerReference, namespace: String },
    /// Sync every controller in the namespace whose selector matches these labels (an orphan
    /// may be adopted).
    EnqueueMatching { namespace: String, labels: BTreeMap<String, String> },
}

/// The ReplicaSet controller's pod handlers (`addPod`, `updatePod`, `deletePod`); the
/// Deployment controller's ReplicaSet handlers are the same without the expectations.
pub fn reactions(change: &Change) -> Vec<Reaction> {
    let mut out = Vec::new();
    match change {
        Change::Added(new) => {
            if new.deleting {
                // A controller-manager restart may find a pod already being deleted: that is no
                // creation to observe.
                deleted(new, &mut out);
            } else if let Some(c) = &new.controller {
                out.push(Reaction::CreationObserved { owner: c.clone(), namespace: new.namespace.clone() });
                out.push(Reaction::Enqueue { owner: c.clone(), namespace: new.namespace.clone() });
            } else {
                out.push(Reaction::EnqueueMatching { namespace: new.namespace.clone(), labels: new.labels.clone() });
            }
        }
        Change::Updated { old, new } => {
            if old.resource_version == new.resource_version {
                return out;
            }
            let labels_changed = old.labels != new.labels;
            if new.deleting {
                // A graceful delete first sets the deletion timestamp: replacements are made at
                // once, not when the node is done with the pod.
                deleted(new, &mut out);
                if labels_changed {
                    deleted(old, &mut out);
                }
                return out;
            }
            let controller_changed = old.controller != new.controller;
            if controller_changed && let Some(c) = &old.controller {
                out.push(Reaction::Enqueue { owner: c.clone(), namespace: old.namespace.clone() });
            }
            if let Some(c) = &new.controller {
                out.push(Reaction::Enqueue { owner: c.clone(), namespace: new.namespace.clone() });
            } else if labels_changed || controller_changed {
                out.push(Reaction::EnqueueMatching { namespace: new.namespace.clone(), labels: new.labels.clone() });
            }
        }
        Change::Deleted(old) => deleted(old, &mut out),
    }
    out
}

fn deleted(seen: &Seen, out: &mut Vec<Reaction>) {
    if let Some(c) = &seen.controller {
        out.push(Reaction::DeletionObserved { owner: c.clone(), namespace: seen.namespace.clone(), child: seen.key() });
        out.push(Reaction::Enqueue { owner: c.clone(), namespace: seen.namespace.clone() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn owner(name: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn pod(name: &str, uid: &str, rv: &str, app: &str, rs: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                owner_references: rs.map(|r| vec![owner(r)]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn deleting(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        p
    }

    #[test]
    fn apply_is_an_add_the_first_time_and_an_update_after() {
        let mut t = Tracker::default();
        let a = t.observe(&Event::Apply(pod("p", "u1", "1", "web", Some("rs"))));
        assert!(matches!(&a[..], [Change::Added(s)] if s.name == "p"));
        let b = t.observe(&Event::Apply(pod("p", "u1", "2", "db", Some("rs"))));
        assert!(
            matches!(&b[..], [Change::Updated { old, new }] if old.labels["app"] == "web" && new.labels["app"] == "db")
        );
        let c = t.observe(&Event::Delete(pod("p", "u1", "3", "db", Some("rs"))));
        assert!(matches!(&c[..], [Change::Deleted(s)] if s.resource_version == "3"));
    }

    #[test]
    fn a_recreated_object_is_a_delete_then_an_add() {
        let mut t = Tracker::default();
        t.observe(&Event::Apply(pod("p", "u1", "1", "web", None)));
        let c = t.observe(&Event::Apply(pod("p", "u2", "5", "web", None)));
        assert!(matches!(&c[..], [Change::Deleted(o), Change::Added(n)] if o.uid == "u1" && n.uid == "u2"));
    }

    #[test]
    fn a_change_between_two_versions_is_an_add_an_update_or_a_replacement() {
        let v1 = pod("p", "u1", "1", "web", Some("rs"));
        assert!(matches!(&between(None, &v1)[..], [Change::Added(s)] if s.uid == "u1"));
        let v2 = pod("p", "u1", "2", "db", Some("rs"));
        let up = between(Some(&v1), &v2);
        assert!(
            matches!(&up[..], [Change::Updated { old, new }] if old.labels["app"] == "web" && new.labels["app"] == "db")
        );
        let other = pod("p", "u2", "3", "web", None);
        let re = between(Some(&v2), &other);
        assert!(matches!(&re[..], [Change::Deleted(o), Change::Added(n)] if o.uid == "u1" && n.uid == "u2"));
    }

    #[test]
    fn a_relist_reports_its_changes_at_init_done_including_objects_gone_meanwhile() {
        let mut t = Tracker::default();
        t.observe(&Event::Apply(pod("kept", "u1", "1", "web", Some("rs"))));
        t.observe(&Event::Apply(pod("changed", "u2", "1", "web", Some("rs"))));
        t.observe(&Event::Apply(pod("gone", "u3", "1", "web", Some("rs"))));
        assert!(t.observe::<Pod>(&Event::Init).is_empty());
        assert!(t.observe(&Event::InitApply(pod("kept", "u1", "1", "web", Some("rs")))).is_empty());
        assert!(t.observe(&Event::InitApply(pod("changed", "u2", "7", "web", Some("rs")))).is_empty());
        assert!(t.observe(&Event::InitApply(pod("new", "u4", "8", "web", Some("rs")))).is_empty());
        let mut changes = t.observe::<Pod>(&Event::InitDone);
        changes.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes.iter().any(|c| matches!(c, Change::Added(s) if s.name == "new")));
        assert!(changes.iter().any(|c| matches!(c, Change::Deleted(s) if s.name == "gone")));
        assert!(changes.iter().any(|c| matches!(c, Change::Updated { new, .. } if new.name == "changed")));
        // After the relist the tracker knows exactly what was listed.
        let d = t.observe(&Event::Apply(pod("gone", "u3", "9", "web", None)));
        assert!(matches!(&d[..], [Change::Added(_)]));
    }

    #[test]
    fn an_added_pod_with_a_controller_is_a_creation_and_an_orphan_wakes_matching_controllers() {
        let added = Seen::of(&pod("p", "u", "1", "web", Some("rs")));
        assert_eq!(
            reactions(&Change::Added(added)),
            vec![
                Reaction::CreationObserved { owner: owner("rs"), namespace: "ns".into() },
                Reaction::Enqueue { owner: owner("rs"), namespace: "ns".into() }
            ]
        );
        let orphan = Seen::of(&pod("p", "u", "1", "web", None));
        assert_eq!(
            reactions(&Change::Added(orphan)),
            vec![Reaction::EnqueueMatching { namespace: "ns".into(), labels: [("app".into(), "web".into())].into() }]
        );
    }

    #[test]
    fn a_pod_added_while_being_deleted_is_a_deletion_not_a_creation() {
        let seen = Seen::of(&deleting(pod("p", "u", "1", "web", Some("rs"))));
        assert_eq!(
            reactions(&Change::Added(seen)),
            vec![
                Reaction::DeletionObserved { owner: owner("rs"), namespace: "ns".into(), child: "ns/p".into() },
                Reaction::Enqueue { owner: owner("rs"), namespace: "ns".into() }
            ]
        );
    }

    #[test]
    fn marking_a_pod_for_deletion_is_observed_as_its_deletion() {
        let old = Seen::of(&pod("p", "u", "1", "web", Some("rs")));
        let new = Seen::of(&deleting(pod("p", "u", "2", "web", Some("rs"))));
        let r = reactions(&Change::Updated { old: Box::new(old), new: Box::new(new) });
        assert_eq!(
            r[0],
            Reaction::DeletionObserved { owner: owner("rs"), namespace: "ns".into(), child: "ns/p".into() }
        );
    }

    #[test]
    fn a_released_pod_wakes_its_old_controller_and_the_matching_ones() {
        let old = Seen::of(&pod("p", "u", "1", "web", Some("rs")));
        let new = Seen::of(&pod("p", "u", "2", "other", None));
        assert_eq!(
            reactions(&Change::Updated { old: Box::new(old), new: Box::new(new) }),
            vec![
                Reaction::Enqueue { owner: owner("rs"), namespace: "ns".into() },
                Reaction::EnqueueMatching { namespace: "ns".into(), labels: [("app".into(), "other".into())].into() }
            ]
        );
    }

    #[test]
    fn an_update_that_changes_nothing_is_ignored() {
        let s = Seen::of(&pod("p", "u", "1", "web", Some("rs")));
        assert!(reactions(&Change::Updated { old: Box::new(s.clone()), new: Box::new(s) }).is_empty());
    }
}
