//! What the collector does with one object once live reads have told it how its owners are:
//! keep it, drop its references to owners that are gone, or delete it (upstream's
//! `attemptToDeleteItem` and `processDeletingDependentsItem` as functions), and the patches that
//! carry those decisions out.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::PropagationPolicy;
use serde_json::{Value, json};

use super::graph::{FOREGROUND_FINALIZER, NodeView, ORPHAN_FINALIZER, Uid};

/// How one owner reference stands, after a live GET of the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// No such owner, or one with another UID.
    Dangling,
    /// The owner exists and is not waiting for its dependents.
    Solid,
    /// The owner is being deleted in the foreground: it waits for its dependents.
    WaitingForDependents,
}

/// Where an object's references stand.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Classified {
    pub solid: Vec<OwnerReference>,
    pub dangling: Vec<OwnerReference>,
    pub waiting: Vec<OwnerReference>,
    /// Gone owners that were deleted with orphan propagation: their references are removed,
    /// never a reason to delete.
    pub orphaned: Vec<OwnerReference>,
}

impl Classified {
    pub fn push(&mut self, r: OwnerReference, state: OwnerState) {
        match state {
            OwnerState::Dangling => self.dangling.push(r),
            OwnerState::Solid => self.solid.push(r),
            OwnerState::WaitingForDependents => self.waiting.push(r),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Its owners keep it.
    Keep,
    /// Some owner keeps it: only the references to owners that are gone or deleting their
    /// dependents are removed.
    RemoveReferences(Vec<Uid>),
    /// No owner keeps it. `unblock_first`: one of its own dependents waits for it in the
    /// foreground too, so its blocking references are made non-blocking first to break the
    /// cycle.
    Delete { policy: PropagationPolicy, unblock_first: bool },
}

/// The decision for an object with owner references, as upstream's `attemptToDeleteItem`.
/// `dependents` are the object's own dependents in the graph.
pub fn decide(c: &Classified, finalizers: &[String], view: &NodeView) -> Decision {
    if !c.orphaned.is_empty() {
        // A dependent the orphaning missed (its watch event came after the owner's). The other
        // references are decided on once these are gone.
        return Decision::RemoveReferences(c.orphaned.iter().map(|r| r.uid.clone()).collect());
    }
    if !c.solid.is_empty() {
        if c.dangling.is_empty() && c.waiting.is_empty() {
            return Decision::Keep;
        }
        let uids = c.dangling.iter().chain(&c.waiting).map(|r| r.uid.clone()).collect();
        return Decision::RemoveReferences(uids);
    }
    if !c.waiting.is_empty() && !view.dependents.is_empty() {
        // An owner waits for it and it has dependents of its own: it goes in the foreground too.
        let unblock_first = view.dependents.iter().any(|d| d.deleting_dependents);
        return Decision::Delete { policy: PropagationPolicy::Foreground, unblock_first };
    }
    let has = |f: &str| finalizers.iter().any(|x| x == f);
    let policy = if has(ORPHAN_FINALIZER) {
        PropagationPolicy::Orphan
    } else if has(FOREGROUND_FINALIZER) {
        PropagationPolicy::Foreground
    } else {
        PropagationPolicy::Background
    };
    Decision::Delete { policy, unblock_first: false }
}

/// The next step of an owner deleting in the foreground.
#[derive(Clone, Debug, PartialEq)]
pub enum ForegroundStep {
    /// No blocking dependent is left: its `foregroundDeletion` finalizer goes.
    RemoveFinalizer,
    /// Blocking dependents remain; those not themselves deleting their dependents are checked.
    Wait { check: Vec<Uid> },
}

pub fn foreground_step(view: &NodeView) -> ForegroundStep {
    let blocking: Vec<_> = view.blocking_dependents().collect();
    if blocking.is_empty() {
        return ForegroundStep::RemoveFinalizer;
    }
    ForegroundStep::Wait {
        check: blocking.iter().filter(|d| !d.deleting_dependents).map(|d| d.identity.uid.clone()).collect(),
    }
}

/// `owners` without the references to `uids`.
pub fn without_references(owners: &[OwnerReference], uids: &[Uid]) -> Vec<OwnerReference> {
    owners.iter().filter(|r| !uids.contains(&r.uid)).cloned().collect()
}

/// `owners` with every `blockOwnerDeletion` turned off.
pub fn unblocked(owners: &[OwnerReference]) -> Vec<OwnerReference> {
    owners
        .iter()
        .cloned()
        .map(|mut r| {
            if r.block_owner_deletion == Some(true) {
                r.block_owner_deletion = Some(false);
            }
            r
        })
        .collect()
}

/// A JSON merge patch setting one metadata field, applied only at `resource_version` (the
/// whole list is replaced, so the precondition keeps concurrent changes from being lost).
pub fn metadata_patch(resource_version: &str, field: &str, value: impl serde::Serialize) -> Value {
    let value = serde_json::to_value(value).unwrap_or(Value::Null);
    json!({"metadata": {"resourceVersion": resource_version, field: value}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::garbage_collector::graph::{Dependent, Identity};

    fn r(uid: &str, block: bool) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: uid.into(),
            uid: uid.into(),
            block_owner_deletion: Some(block),
            controller: None,
        }
    }

    fn ident(uid: &str) -> Identity {
        Identity {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("default".into()),
            name: uid.into(),
            uid: uid.into(),
        }
    }

    fn view(dependents: Vec<Dependent>) -> NodeView {
        NodeView {
            identity: ident("me"),
            observed: true,
            deleting_dependents: false,
            dependents,
            orphaned_owners: vec![],
        }
    }

    fn dep(uid: &str, blocking: bool, deleting_dependents: bool) -> Dependent {
        Dependent { identity: ident(uid), deleting_dependents, blocking }
    }

    fn classified(solid: &[&str], dangling: &[&str], waiting: &[&str]) -> Classified {
        let refs = |u: &[&str]| u.iter().map(|u| r(u, true)).collect();
        Classified { solid: refs(solid), dangling: refs(dangling), waiting: refs(waiting), orphaned: vec![] }
    }

    #[test]
    fn a_reference_to_an_owner_deleted_with_orphan_propagation_is_removed_and_never_deletes_the_object() {
        let mut c = classified(&[], &["b"], &[]);
        c.orphaned.push(r("a", true));
        assert_eq!(decide(&c, &[], &view(vec![])), Decision::RemoveReferences(vec!["a".into()]));
    }

    #[test]
    fn an_object_with_a_live_owner_is_kept_and_loses_only_references_to_owners_that_are_gone() {
        assert_eq!(decide(&classified(&["a"], &[], &[]), &[], &view(vec![])), Decision::Keep);
        assert_eq!(
            decide(&classified(&["a"], &["b"], &["c"]), &[], &view(vec![])),
            Decision::RemoveReferences(vec!["b".into(), "c".into()])
        );
    }

    #[test]
    fn an_object_whose_owners_are_all_gone_is_deleted_in_the_background_unless_its_finalizers_say_otherwise() {
        let gone = classified(&[], &["a", "b"], &[]);
        let d = |f: &[&str]| decide(&gone, &f.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &view(vec![]));
        assert_eq!(d(&[]), Decision::Delete { policy: PropagationPolicy::Background, unblock_first: false });
        assert_eq!(d(&["orphan"]), Decision::Delete { policy: PropagationPolicy::Orphan, unblock_first: false });
        assert_eq!(
            d(&["foregroundDeletion"]),
            Decision::Delete { policy: PropagationPolicy::Foreground, unblock_first: false }
        );
    }

    #[test]
    fn a_dependent_with_dependents_of_its_own_goes_in_the_foreground_when_its_owner_waits() {
        let waiting = classified(&[], &[], &["a"]);
        assert_eq!(
            decide(&waiting, &[], &view(vec![dep("x", true, false)])),
            Decision::Delete { policy: PropagationPolicy::Foreground, unblock_first: false }
        );
        // Without dependents it just goes.
        assert_eq!(
            decide(&waiting, &[], &view(vec![])),
            Decision::Delete { policy: PropagationPolicy::Background, unblock_first: false }
        );
        // A dependent waiting for it in turn (a cycle): its references are unblocked first.
        assert_eq!(
            decide(&waiting, &[], &view(vec![dep("x", true, true)])),
            Decision::Delete { policy: PropagationPolicy::Foreground, unblock_first: true }
        );
    }

    #[test]
    fn a_foreground_owner_waits_only_for_blocking_dependents() {
        assert_eq!(foreground_step(&view(vec![dep("x", false, false)])), ForegroundStep::RemoveFinalizer);
        assert_eq!(
            foreground_step(&view(vec![dep("x", true, false), dep("y", true, true), dep("z", false, false)])),
            ForegroundStep::Wait { check: vec!["x".into()] }
        );
    }

    #[test]
    fn patches_replace_the_whole_list_at_a_resource_version() {
        let owners = vec![r("a", true), r("b", true)];
        let left = without_references(&owners, &["a".into()]);
        assert_eq!(left, vec![r("b", true)]);
        assert_eq!(unblocked(&owners), vec![r("a", false), r("b", false)]);
        let p = metadata_patch("42", "finalizers", Vec::<String>::new());
        assert_eq!(p, json!({"metadata": {"resourceVersion": "42", "finalizers": []}}));
    }
}
