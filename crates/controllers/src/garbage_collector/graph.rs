//! The owner graph: every object the collector has seen, with its owners and dependents, as
//! kube-controller-manager's GraphBuilder keeps it.
//!
//! Nodes are keyed by UID. An owner that is referenced but not (yet) seen is a *virtual* node,
//! known only from the reference's coordinates; the collector checks it with a live GET and
//! reports [`Change::Absent`] when it does not exist. Applying a [`Change`] returns the
//! [`Work`] it makes necessary; the graph itself never talks to the API.

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

pub type Uid = String;

/// The finalizer an owner carries while its dependents are orphaned (`--cascade=orphan`).
pub const ORPHAN_FINALIZER: &str = "orphan";
/// The finalizer an owner carries while its dependents are deleted first (foreground).
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// Which object a node is: its coordinates and UID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub api_version: String,
    pub kind: String,
    /// `None` for cluster-scoped objects. A virtual node carries its first dependent's
    /// namespace; whether the owner's kind is namespaced is decided when it is looked up.
    pub namespace: Option<String>,
    pub name: String,
    pub uid: Uid,
}

impl Identity {
    /// The API group of `api_version` (`apps` of `apps/v1`, empty for `v1`).
    pub fn group(&self) -> &str {
        group_of(&self.api_version)
    }

    /// The identity an owner reference points at, seen from a dependent in `namespace`.
    pub fn of_owner(r: &OwnerReference, namespace: Option<&str>) -> Identity {
        Identity {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: namespace.map(str::to_string),
            name: r.name.clone(),
            uid: r.uid.clone(),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{} ({})", self.kind, ns, self.name, self.uid),
            None => write!(f, "{} {} ({})", self.kind, self.name, self.uid),
        }
    }
}

/// The group of an `apiVersion`.
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// What a watch said about one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub identity: Identity,
    pub owners: Vec<OwnerReference>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

/// What happened, as the graph learns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// An object was listed, added or modified.
    Upsert(Observed),
    /// A watch reported an object deleted.
    Delete(Uid),
    /// A watch listed every object of a kind again: observed nodes of that group and kind that
    /// are not among `present` were deleted while the watch was down.
    Relisted { group: String, kind: String, present: HashSet<Uid> },
    /// A live GET found no object with this identity (upstream's virtual delete event).
    Absent(Identity),
}

/// What the collector has to look at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    /// Check the object's owners (delete it if they are all gone), or, for an owner deleting
    /// in the foreground, whether its blocking dependents are gone.
    AttemptToDelete(Uid),
    /// Remove the references to this owner from its dependents, then its `orphan` finalizer.
    AttemptToOrphan(Uid),
}

#[derive(Clone, Debug)]
struct Node {
    identity: Identity,
    owners: Vec<OwnerReference>,
    dependents: BTreeSet<Uid>,
    /// Seen through a watch (false: a virtual node made from references to it).
    observed: bool,
    being_deleted: bool,
    /// Being deleted with the `foregroundDeletion` finalizer.
    deleting_dependents: bool,
}

/// A dependent as an owner's check needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Dependent {
    pub identity: Identity,
    pub deleting_dependents: bool,
    /// Its reference to the owner has `blockOwnerDeletion: true`.
    pub blocking: bool,
}

/// What one [`Work::AttemptToDelete`] needs from the graph, taken when it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub identity: Identity,
    pub observed: bool,
    pub deleting_dependents: bool,
    /// Its dependents other than itself.
    pub dependents: Vec<Dependent>,
    /// Those of its owners the collector itself orphaned their dependents for (filled in by the
    /// collector, which remembers them; the graph forgets an owner once it is gone).
    pub orphaned_owners: Vec<Uid>,
}

impl NodeView {
    pub fn blocking_dependents(&self) -> impl Iterator<Item = &Dependent> {
        self.dependents.iter().filter(|d| d.blocking)
    }
}

#[derive(Debug, Default)]
pub struct Graph {
    nodes: HashMap<Uid, Node>,
}

fn blocks(r: &OwnerReference) -> bool {
    r.block_owner_deletion == Some(true)
}

impl Graph {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn view(&self, uid: &str) -> Option<NodeView> {
        let n = self.nodes.get(uid)?;
        let dependents = n
            .dependents
            .iter()
            .filter(|d| *d != uid)
            .filter_map(|d| self.nodes.get(d))
            .map(|d| Dependent {
                identity: d.identity.clone(),
                deleting_dependents: d.deleting_dependents,
                blocking: d.owners.iter().any(|r| r.uid == uid && blocks(r)),
            })
            .collect();
        Some(NodeView {
            identity: n.identity.clone(),
            observed: n.observed,
            deleting_dependents: n.deleting_dependents,
            dependents,
            orphaned_owners: Vec::new(),
        })
    }

    /// The UIDs of the owners `uid` refers to.
    pub fn owners_of(&self, uid: &str) -> impl Iterator<Item = &Uid> {
        self.nodes.get(uid).into_iter().flat_map(|n| n.owners.iter().map(|r| &r.uid))
    }

    /// Applies one change; returns the work it makes necessary.
    pub fn apply(&mut self, change: Change) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Upsert(o) => self.upsert(o, &mut work),
            Change::Delete(uid) => self.remove(&uid, &mut work),
            Change::Relisted { group, kind, present } => {
                let gone: Vec<Uid> = self
                    .nodes
                    .values()
                    .filter(|n| n.observed && n.identity.kind == kind && n.identity.group() == group)
                    .filter(|n| !present.contains(&n.identity.uid))
                    .map(|n| n.identity.uid.clone())
                    .collect();
                for uid in gone {
                    self.remove(&uid, &mut work);
                }
            }
            Change::Absent(identity) => match self.nodes.get(&identity.uid) {
                None => {}
                // A real object has this UID: the references used other coordinates. Each
                // dependent checks its own reference again.
                Some(n) if n.observed => {
                    work.extend(
                        n.dependents.iter().filter(|d| **d != identity.uid).cloned().map(Work::AttemptToDelete),
                    );
                }
                Some(_) => self.remove(&identity.uid, &mut work),
            },
        }
        work
    }

    fn upsert(&mut self, o: Observed, work: &mut Vec<Work>) {
        let uid = o.identity.uid.clone();
        let foreground = o.deleting && o.finalizers.iter().any(|f| f == FOREGROUND_FINALIZER);
        let orphan = o.deleting && o.finalizers.iter().any(|f| f == ORPHAN_FINALIZER);
        let was_deleting_dependents;
        match self.nodes.get_mut(&uid) {
            None => {
                was_deleting_dependents = false;
                let added = o.owners.clone();
                self.nodes.insert(
                    uid.clone(),
                    Node {
                        identity: o.identity.clone(),
                        owners: o.owners,
                        dependents: BTreeSet::new(),
                        observed: true,
                        being_deleted: o.deleting,
                        deleting_dependents: false,
                    },
                );
                self.add_to_owners(&o.identity, &added, work);
            }
            Some(n) => {
                was_deleting_dependents = n.deleting_dependents;
                n.observed = true;
                n.identity = o.identity.clone();
                n.being_deleted |= o.deleting;
                let old = std::mem::replace(&mut n.owners, o.owners.clone());
                let removed: Vec<OwnerReference> =
                    old.iter().filter(|r| !o.owners.iter().any(|x| x.uid == r.uid)).cloned().collect();
                let added: Vec<OwnerReference> =
                    o.owners.iter().filter(|r| !old.iter().any(|x| x.uid == r.uid)).cloned().collect();
                // An owner waiting for its blocking dependents may be free now.
                let unblocked = old.iter().filter(|r| {
                    blocks(r) && o.owners.iter().find(|x| x.uid == r.uid).is_none_or(|x| !blocks(x)) && r.uid != uid
                });
                let unblocked: Vec<Uid> = unblocked.map(|r| r.uid.clone()).collect();
                for r in &removed {
                    if let Some(owner) = self.nodes.get_mut(&r.uid) {
                        owner.dependents.remove(&uid);
                    }
                }
                for owner in unblocked {
                    if self.nodes.contains_key(&owner) {
                        work.push(Work::AttemptToDelete(owner));
                    }
                }
                self.add_to_owners(&o.identity, &added, work);
            }
        }
        if orphan {
            work.push(Work::AttemptToOrphan(uid));
        } else if foreground {
            let dependents: Vec<Uid> = match self.nodes.get_mut(&uid) {
                Some(n) => {
                    n.deleting_dependents = true;
                    n.dependents.iter().filter(|d| **d != uid).cloned().collect()
                }
                None => Vec::new(),
            };
            if !was_deleting_dependents {
                work.extend(dependents.into_iter().map(Work::AttemptToDelete));
            }
            work.push(Work::AttemptToDelete(uid));
        }
    }

    /// Records `dependent` with each of `owners`, making virtual nodes for owners not seen yet
    /// (each to be checked).
    fn add_to_owners(&mut self, dependent: &Identity, owners: &[OwnerReference], work: &mut Vec<Work>) {
        for r in owners {
            match self.nodes.get_mut(&r.uid) {
                Some(owner) => {
                    owner.dependents.insert(dependent.uid.clone());
                }
                None => {
                    let mut dependents = BTreeSet::new();
                    dependents.insert(dependent.uid.clone());
                    self.nodes.insert(
                        r.uid.clone(),
                        Node {
                            identity: Identity::of_owner(r, dependent.namespace.as_deref()),
                            owners: Vec::new(),
                            dependents,
                            observed: false,
                            being_deleted: false,
                            deleting_dependents: false,
                        },
                    );
                    work.push(Work::AttemptToDelete(r.uid.clone()));
                }
            }
        }
    }

    fn remove(&mut self, uid: &str, work: &mut Vec<Work>) {
        let Some(node) = self.nodes.remove(uid) else { return };
        for r in &node.owners {
            if let Some(owner) = self.nodes.get_mut(&r.uid) {
                owner.dependents.remove(uid);
                if owner.deleting_dependents {
                    work.push(Work::AttemptToDelete(r.uid.clone()));
                }
            }
        }
        work.extend(node.dependents.into_iter().filter(|d| d != uid).map(Work::AttemptToDelete));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(kind: &str, name: &str, uid: &str) -> Identity {
        Identity {
            api_version: if kind == "ReplicaSet" { "apps/v1".into() } else { "v1".into() },
            kind: kind.into(),
            namespace: Some("default".into()),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn owner(o: &Identity, block: bool) -> OwnerReference {
        OwnerReference {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
            block_owner_deletion: block.then_some(true),
            controller: Some(true),
        }
    }

    fn seen(identity: &Identity, owners: Vec<OwnerReference>) -> Change {
        Change::Upsert(Observed { identity: identity.clone(), owners, deleting: false, finalizers: vec![] })
    }

    fn deleting(identity: &Identity, owners: Vec<OwnerReference>, finalizer: &str) -> Change {
        Change::Upsert(Observed {
            identity: identity.clone(),
            owners,
            deleting: true,
            finalizers: vec![finalizer.into()],
        })
    }

    #[test]
    fn a_dependent_of_an_unseen_owner_makes_a_virtual_node_to_check() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        let pod = id("Pod", "p", "u-p");
        let work = g.apply(seen(&pod, vec![owner(&rs, true)]));
        assert_eq!(work, vec![Work::AttemptToDelete("u-rs".into())]);
        let v = g.view("u-rs").unwrap();
        assert!(!v.observed);
        assert_eq!(v.identity, rs);
        assert_eq!(v.dependents.len(), 1);
        assert!(v.dependents[0].blocking);
        // Once the owner is seen, adding more dependents needs no check.
        assert!(g.apply(seen(&rs, vec![])).is_empty());
        assert!(g.view("u-rs").unwrap().observed);
        assert!(g.apply(seen(&id("Pod", "q", "u-q"), vec![owner(&rs, false)])).is_empty());
    }

    #[test]
    fn deleting_an_owner_queues_its_dependents() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        g.apply(seen(&rs, vec![]));
        g.apply(seen(&id("Pod", "a", "u-a"), vec![owner(&rs, true)]));
        g.apply(seen(&id("Pod", "b", "u-b"), vec![owner(&rs, true)]));
        let mut work = g.apply(Change::Delete("u-rs".into()));
        work.sort();
        assert_eq!(work, vec![Work::AttemptToDelete("u-a".into()), Work::AttemptToDelete("u-b".into())]);
        assert!(g.view("u-rs").is_none());
    }

    #[test]
    fn an_owner_with_the_orphan_finalizer_being_deleted_is_orphaned() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        g.apply(seen(&rs, vec![]));
        assert_eq!(g.apply(deleting(&rs, vec![], ORPHAN_FINALIZER)), vec![Work::AttemptToOrphan("u-rs".into())]);
    }

    #[test]
    fn foreground_deletion_queues_the_dependents_once_and_the_owner_each_time() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        g.apply(seen(&rs, vec![]));
        g.apply(seen(&id("Pod", "a", "u-a"), vec![owner(&rs, true)]));
        let work = g.apply(deleting(&rs, vec![], FOREGROUND_FINALIZER));
        assert_eq!(work, vec![Work::AttemptToDelete("u-a".into()), Work::AttemptToDelete("u-rs".into())]);
        assert!(g.view("u-rs").unwrap().deleting_dependents);
        assert_eq!(g.apply(deleting(&rs, vec![], FOREGROUND_FINALIZER)), vec![Work::AttemptToDelete("u-rs".into())]);
        // The dependent going away wakes the waiting owner.
        assert_eq!(g.apply(Change::Delete("u-a".into())), vec![Work::AttemptToDelete("u-rs".into())]);
    }

    #[test]
    fn dropping_a_blocking_reference_wakes_the_owner() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        let pod = id("Pod", "a", "u-a");
        g.apply(seen(&rs, vec![]));
        g.apply(seen(&pod, vec![owner(&rs, true)]));
        assert_eq!(g.apply(seen(&pod, vec![owner(&rs, false)])), vec![Work::AttemptToDelete("u-rs".into())]);
        assert!(!g.view("u-rs").unwrap().dependents[0].blocking);
        assert_eq!(g.apply(seen(&pod, vec![])), Vec::<Work>::new());
        assert!(g.view("u-rs").unwrap().dependents.is_empty());
    }

    #[test]
    fn an_absent_virtual_owner_is_dropped_and_its_dependents_checked() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        g.apply(seen(&id("Pod", "a", "u-a"), vec![owner(&rs, false)]));
        assert_eq!(g.apply(Change::Absent(rs.clone())), vec![Work::AttemptToDelete("u-a".into())]);
        assert!(g.view("u-rs").is_none());
        // An observed object with that UID stays; the references are checked again.
        g.apply(seen(&rs, vec![]));
        g.apply(seen(&id("Pod", "b", "u-b"), vec![owner(&rs, false)]));
        assert_eq!(g.apply(Change::Absent(rs)), vec![Work::AttemptToDelete("u-b".into())]);
        assert!(g.view("u-rs").is_some());
    }

    #[test]
    fn a_relist_removes_objects_of_that_kind_deleted_while_the_watch_was_down() {
        let mut g = Graph::default();
        let rs = id("ReplicaSet", "rs", "u-rs");
        g.apply(seen(&rs, vec![]));
        g.apply(seen(&id("Pod", "a", "u-a"), vec![owner(&rs, false)]));
        let none = HashSet::new();
        let work = g.apply(Change::Relisted { group: "apps".into(), kind: "ReplicaSet".into(), present: none.clone() });
        assert_eq!(work, vec![Work::AttemptToDelete("u-a".into())]);
        // Another kind's relist leaves them alone.
        assert!(g.apply(Change::Relisted { group: "".into(), kind: "ConfigMap".into(), present: none }).is_empty());
        assert!(g.view("u-a").is_some());
    }

    #[test]
    fn an_object_owning_itself_is_neither_its_own_dependent_nor_blocks_itself() {
        let mut g = Graph::default();
        let me = id("ConfigMap", "me", "u-me");
        let work = g.apply(seen(&me, vec![owner(&me, true)]));
        assert!(work.is_empty(), "{work:?}");
        assert!(g.view("u-me").unwrap().dependents.is_empty());
        let work = g.apply(deleting(&me, vec![owner(&me, true)], FOREGROUND_FINALIZER));
        assert_eq!(work, vec![Work::AttemptToDelete("u-me".into())]);
        assert_eq!(g.apply(Change::Delete("u-me".into())), Vec::<Work>::new());
        assert!(g.is_empty());
    }
}
