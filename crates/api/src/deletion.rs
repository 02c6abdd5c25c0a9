//! What a delete asks for an object's dependents (`DeleteOptions.propagationPolicy` and the
//! legacy `orphanDependents`) and the garbage-collection finalizers that follow, as
//! kube-apiserver's generic registry decides them (`ValidateDeleteOptions` in apimachinery,
//! `shouldOrphanDependents`, `shouldDeleteDependents` and
//! `deletionFinalizersForGarbageCollection` in `registry/generic/registry/store.go`, and the
//! namespace registry's own variant).
//!
//! The finalizers are handled by the garbage collector: `orphan` (it removes the object's
//! ownerReferences from the dependents, then the finalizer) and `foregroundDeletion` (it deletes
//! the dependents first, then removes the finalizer).

use crate::FieldError;

/// The garbage collector orphans the dependents, then removes this finalizer.
pub const FINALIZER_ORPHAN_DEPENDENTS: &str = "orphan";
/// The garbage collector deletes the dependents, then removes this finalizer.
pub const FINALIZER_DELETE_DEPENDENTS: &str = "foregroundDeletion";

/// `DeleteOptions.propagationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropagationPolicy {
    /// The object stays (`foregroundDeletion`) until the garbage collector has deleted its
    /// dependents.
    Foreground,
    /// The object goes at once; the garbage collector deletes the dependents afterwards.
    Background,
    /// The object stays (`orphan`) until the garbage collector has released its dependents.
    Orphan,
}

impl PropagationPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PropagationPolicy::Foreground => "Foreground",
            PropagationPolicy::Background => "Background",
            PropagationPolicy::Orphan => "Orphan",
        }
    }
}

/// What one delete request asks for the dependents: at most one of the two options (validation
/// refuses both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Cascade {
    /// Neither option: the object's own finalizers decide, then the kind's default.
    #[default]
    Unset,
    /// The deprecated `orphanDependents`.
    OrphanDependents(bool),
    Policy(PropagationPolicy),
}

impl Cascade {
    /// The request's choice, or Kubernetes' field errors for `DeleteOptions` (the server answers
    /// them as 422 `DeleteOptions.meta.k8s.io "" is invalid: ...`).
    pub fn from_options(
        orphan_dependents: Option<bool>,
        propagation_policy: Option<&str>,
    ) -> Result<Cascade, Vec<FieldError>> {
        let mut errors = Vec::new();
        if let (Some(_), Some(policy)) = (orphan_dependents, propagation_policy) {
            errors.push(FieldError::invalid(
                "propagationPolicy",
                policy,
                "orphanDependents and deletionPropagation cannot be both set",
            ));
        }
        let policy = match propagation_policy {
            None => None,
            Some("Foreground") => Some(PropagationPolicy::Foreground),
            Some("Background") => Some(PropagationPolicy::Background),
            Some("Orphan") => Some(PropagationPolicy::Orphan),
            Some(other) => {
                errors.push(FieldError::not_supported(
                    "propagationPolicy",
                    other,
                    &["Foreground", "Background", "Orphan", "nil"],
                ));
                None
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(match (orphan_dependents, policy) {
            (Some(orphan), _) => Cascade::OrphanDependents(orphan),
            (None, Some(policy)) => Cascade::Policy(policy),
            (None, None) => Cascade::Unset,
        })
    }
}

/// A kind's default for deletes that choose nothing (`rest.GarbageCollectionPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GarbageCollectionPolicy {
    /// Background: the default of every kind served here (apps/v1 workloads included; only the
    /// extensions/v1beta1 and apps/v1beta1/v1beta2 versions defaulted to orphaning).
    DeleteDependents,
    /// Orphan the dependents unless told otherwise.
    OrphanDependents,
    /// The kind takes no garbage-collection finalizers at all (events).
    Unsupported,
}

fn has(finalizers: &[String], name: &str) -> bool {
    finalizers.iter().any(|f| f == name)
}

/// Whether the object should carry `orphan` after this delete: the request's choice, else the
/// object's finalizers, else the kind's default.
pub fn should_orphan_dependents(gc: GarbageCollectionPolicy, finalizers: &[String], cascade: Cascade) -> bool {
    if gc == GarbageCollectionPolicy::Unsupported {
        return false;
    }
    match cascade {
        Cascade::OrphanDependents(orphan) => return orphan,
        Cascade::Policy(policy) => return policy == PropagationPolicy::Orphan,
        Cascade::Unset => {}
    }
    // The first of the two finalizers found decides (validation keeps them exclusive).
    for f in finalizers {
        match f.as_str() {
            FINALIZER_ORPHAN_DEPENDENTS => return true,
            FINALIZER_DELETE_DEPENDENTS => return false,
            _ => {}
        }
    }
    gc == GarbageCollectionPolicy::OrphanDependents
}

/// Whether the object should carry `foregroundDeletion` after this delete. The legacy
/// `orphanDependents: false` means background here, not foreground.
pub fn should_delete_dependents(gc: GarbageCollectionPolicy, finalizers: &[String], cascade: Cascade) -> bool {
    if gc == GarbageCollectionPolicy::Unsupported {
        return false;
    }
    match cascade {
        Cascade::OrphanDependents(_) => return false,
        Cascade::Policy(policy) => return policy == PropagationPolicy::Foreground,
        Cascade::Unset => {}
    }
    for f in finalizers {
        match f.as_str() {
            FINALIZER_DELETE_DEPENDENTS => return true,
            FINALIZER_ORPHAN_DEPENDENTS => return false,
            _ => {}
        }
    }
    false
}

/// The object's finalizers after this delete, or `None` when they stay as they are (compared as
/// sets): both garbage-collection finalizers are taken out and the ones that apply put back at
/// the end, `orphan` first.
pub fn deletion_finalizers(
    gc: GarbageCollectionPolicy,
    finalizers: &[String],
    cascade: Cascade,
) -> Option<Vec<String>> {
    let orphan = should_orphan_dependents(gc, finalizers, cascade);
    let foreground = should_delete_dependents(gc, finalizers, cascade);
    let mut new: Vec<String> = finalizers
        .iter()
        .filter(|f| *f != FINALIZER_ORPHAN_DEPENDENTS && *f != FINALIZER_DELETE_DEPENDENTS)
        .cloned()
        .collect();
    if orphan {
        new.push(FINALIZER_ORPHAN_DEPENDENTS.into());
    }
    if foreground {
        new.push(FINALIZER_DELETE_DEPENDENTS.into());
    }
    let as_set = |v: &[String]| v.iter().cloned().collect::<std::collections::BTreeSet<_>>();
    (as_set(&new) != as_set(finalizers)).then_some(new)
}

/// The finalizers a namespace's first delete leaves it with, or `None` when unchanged. The
/// namespace registry has its own rules: only the request counts (else the finalizers already
/// there), and `orphanDependents: false` asks for foreground.
pub fn namespace_deletion_finalizers(finalizers: &[String], cascade: Cascade) -> Option<Vec<String>> {
    let (orphan, foreground) = match cascade {
        Cascade::OrphanDependents(orphan) => (orphan, !orphan),
        Cascade::Policy(policy) => (policy == PropagationPolicy::Orphan, policy == PropagationPolicy::Foreground),
        Cascade::Unset => (has(finalizers, FINALIZER_ORPHAN_DEPENDENTS), has(finalizers, FINALIZER_DELETE_DEPENDENTS)),
    };
    let mut new = finalizers.to_vec();
    let mut changed = false;
    for (name, wanted) in [(FINALIZER_ORPHAN_DEPENDENTS, orphan), (FINALIZER_DELETE_DEPENDENTS, foreground)] {
        match (has(&new, name), wanted) {
            (false, true) => {
                new.push(name.into());
                changed = true;
            }
            (true, false) => {
                new.retain(|f| f != name);
                changed = true;
            }
            _ => {}
        }
    }
    changed.then_some(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field_error::invalid_message;

    use GarbageCollectionPolicy::{DeleteDependents, Unsupported};
    use PropagationPolicy::{Background, Foreground, Orphan};

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn both_options_at_once_are_invalid_with_kubernetes_message() {
        let errors = Cascade::from_options(Some(true), Some("Foreground")).unwrap_err();
        assert_eq!(
            invalid_message("DeleteOptions.meta.k8s.io", "", &errors),
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Foreground\": orphanDependents and deletionPropagation cannot be both set"
        );
    }

    #[test]
    fn an_unknown_policy_lists_the_supported_ones() {
        let errors = Cascade::from_options(None, Some("Sideways")).unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "propagationPolicy: Unsupported value: \"Sideways\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
        );
        assert_eq!(Cascade::from_options(Some(false), Some("x")).unwrap_err().len(), 2);
    }

    #[test]
    fn valid_options_resolve_to_one_choice() {
        assert_eq!(Cascade::from_options(None, None), Ok(Cascade::Unset));
        assert_eq!(Cascade::from_options(Some(false), None), Ok(Cascade::OrphanDependents(false)));
        assert_eq!(Cascade::from_options(None, Some("Orphan")), Ok(Cascade::Policy(Orphan)));
    }

    #[test]
    fn orphan_and_foreground_set_their_finalizer_and_background_sets_none() {
        let held = list(&["example.com/hold"]);
        assert_eq!(
            deletion_finalizers(DeleteDependents, &held, Cascade::Policy(Orphan)),
            Some(list(&["example.com/hold", "orphan"]))
        );
        assert_eq!(
            deletion_finalizers(DeleteDependents, &held, Cascade::Policy(Foreground)),
            Some(list(&["example.com/hold", "foregroundDeletion"]))
        );
        assert_eq!(deletion_finalizers(DeleteDependents, &held, Cascade::Policy(Background)), None);
        assert_eq!(deletion_finalizers(DeleteDependents, &held, Cascade::Unset), None);
        assert_eq!(
            deletion_finalizers(DeleteDependents, &[], Cascade::OrphanDependents(true)),
            Some(list(&["orphan"]))
        );
        // The legacy false is background for the generic registry.
        assert_eq!(deletion_finalizers(DeleteDependents, &[], Cascade::OrphanDependents(false)), None);
    }

    #[test]
    fn a_new_policy_replaces_the_finalizer_of_an_earlier_one() {
        let foreground = list(&["foregroundDeletion", "x"]);
        assert_eq!(
            deletion_finalizers(DeleteDependents, &foreground, Cascade::Policy(Orphan)),
            Some(list(&["x", "orphan"]))
        );
        assert_eq!(deletion_finalizers(DeleteDependents, &foreground, Cascade::Policy(Background)), Some(list(&["x"])));
        // Without a choice the finalizer already there stands.
        assert_eq!(deletion_finalizers(DeleteDependents, &foreground, Cascade::Unset), None);
        assert!(should_delete_dependents(DeleteDependents, &foreground, Cascade::Unset));
        assert!(should_orphan_dependents(DeleteDependents, &list(&["orphan"]), Cascade::Unset));
    }

    #[test]
    fn kinds_without_garbage_collection_lose_both_finalizers() {
        assert_eq!(deletion_finalizers(Unsupported, &[], Cascade::Policy(Foreground)), None);
        assert_eq!(deletion_finalizers(Unsupported, &list(&["orphan", "a"]), Cascade::Unset), Some(list(&["a"])));
    }

    #[test]
    fn an_orphaning_default_applies_only_without_choice_or_finalizer() {
        let gc = GarbageCollectionPolicy::OrphanDependents;
        assert!(should_orphan_dependents(gc, &[], Cascade::Unset));
        assert!(!should_orphan_dependents(gc, &list(&["foregroundDeletion"]), Cascade::Unset));
        assert!(!should_orphan_dependents(gc, &[], Cascade::Policy(Background)));
    }

    #[test]
    fn namespaces_follow_their_registrys_rules() {
        assert_eq!(namespace_deletion_finalizers(&[], Cascade::Unset), None);
        assert_eq!(namespace_deletion_finalizers(&[], Cascade::Policy(Orphan)), Some(list(&["orphan"])));
        assert_eq!(
            namespace_deletion_finalizers(&[], Cascade::OrphanDependents(false)),
            Some(list(&["foregroundDeletion"]))
        );
        assert_eq!(
            namespace_deletion_finalizers(&list(&["orphan", "a"]), Cascade::Policy(Background)),
            Some(list(&["a"]))
        );
    }
}
