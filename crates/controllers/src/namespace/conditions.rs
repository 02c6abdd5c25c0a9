//! The conditions a terminating namespace carries about its deletion, as upstream's namespace
//! controller words them: one of each type, True with what went wrong or False with its "all
//! well" message; a condition's `lastTransitionTime` moves only when its status flips.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::NamespaceCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What one attempt at deleting a namespace's content found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub discovery_failure: Option<String>,
    /// Resources whose content could not be deleted, each with why.
    pub failures: Vec<String>,
    /// Objects left per resource (`plural.group`).
    pub remaining: BTreeMap<String, usize>,
    /// Objects left per finalizer holding them.
    pub finalizers: BTreeMap<String, usize>,
    /// How long the remaining content is expected to take.
    pub estimate: Option<Duration>,
}

impl Outcome {
    /// Everything that keeps the namespace from being finalized now other than time.
    pub fn errors(&self) -> Vec<String> {
        self.discovery_failure.iter().cloned().chain(self.failures.iter().cloned()).collect()
    }
}

/// Condition type, its reason and message when all is well.
const TYPES: &[(&str, &str, &str)] = &[
    ("NamespaceDeletionDiscoveryFailure", "ResourcesDiscovered", "All resources successfully discovered"),
    ("NamespaceDeletionGroupVersionParsingFailure", "ParsedGroupVersions", "All legacy kube types successfully parsed"),
    (
        "NamespaceDeletionContentFailure",
        "ContentDeleted",
        "All content successfully deleted, may be waiting on finalization",
    ),
    ("NamespaceContentRemaining", "ContentRemoved", "All content successfully removed"),
    ("NamespaceFinalizersRemaining", "ContentHasNoFinalizers", "All content-preserving finalizers finished"),
];

/// The reason and message of each condition type that is True for `outcome`.
fn failing(outcome: &Outcome) -> BTreeMap<&'static str, (&'static str, String)> {
    let mut out = BTreeMap::new();
    if let Some(e) = &outcome.discovery_failure {
        out.insert("NamespaceDeletionDiscoveryFailure", ("DiscoveryFailed", e.clone()));
    }
    if !outcome.failures.is_empty() {
        let mut msgs = outcome.failures.clone();
        msgs.sort();
        let message = format!("Failed to delete all resource types, {} remaining: {}", msgs.len(), msgs.join(", "));
        out.insert("NamespaceDeletionContentFailure", ("ContentDeletionFailed", message));
    }
    let remaining: Vec<String> = outcome
        .remaining
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} has {n} resource instances"))
        .collect();
    if !remaining.is_empty() {
        let message = format!("Some resources are remaining: {}", remaining.join(", "));
        out.insert("NamespaceContentRemaining", ("SomeResourcesRemain", message));
    }
    let held: Vec<String> = outcome
        .finalizers
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(f, n)| format!("{f} in {n} resource instances"))
        .collect();
    if !held.is_empty() {
        let message = format!("Some content in the namespace has finalizers remaining: {}", held.join(", "));
        out.insert("NamespaceFinalizersRemaining", ("SomeFinalizersRemain", message));
    }
    out
}

/// The namespace's conditions after `outcome`; `None` if they would not change.
pub fn updated(old: &[NamespaceCondition], outcome: &Outcome, now: Time) -> Option<Vec<NamespaceCondition>> {
    let failing = failing(outcome);
    let mut out = old.to_vec();
    for (type_, ok_reason, ok_message) in TYPES {
        let (status, reason, message) = match failing.get(type_) {
            Some((reason, message)) => ("True", *reason, message.clone()),
            None => ("False", *ok_reason, ok_message.to_string()),
        };
        match out.iter_mut().find(|c| c.type_ == *type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = Some(now.clone());
                }
                c.status = status.into();
                c.reason = Some(reason.into());
                c.message = Some(message);
            }
            None => out.push(NamespaceCondition {
                type_: (*type_).into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_transition_time: Some(now.clone()),
            }),
        }
    }
    (out != old).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn find<'a>(cs: &'a [NamespaceCondition], type_: &str) -> &'a NamespaceCondition {
        cs.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn remaining_content_and_finalizers_are_named_as_upstream_names_them() {
        let outcome = Outcome {
            remaining: [("configmaps.".to_string(), 2), ("widgets.example.com".to_string(), 1)].into(),
            finalizers: [("example.com/hold".to_string(), 1)].into(),
            estimate: Some(Duration::from_secs(15)),
            ..Outcome::default()
        };
        let cs = updated(&[], &outcome, t("2025-01-01T00:00:00Z")).unwrap();
        assert_eq!(cs.len(), 5);
        let remaining = find(&cs, "NamespaceContentRemaining");
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.reason.as_deref(), Some("SomeResourcesRemain"));
        assert_eq!(
            remaining.message.as_deref(),
            Some(
                "Some resources are remaining: configmaps. has 2 resource instances, widgets.example.com has 1 resource instances"
            )
        );
        assert_eq!(
            find(&cs, "NamespaceFinalizersRemaining").message.as_deref(),
            Some("Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances")
        );
        let ok = find(&cs, "NamespaceDeletionDiscoveryFailure");
        assert_eq!((ok.status.as_str(), ok.reason.as_deref()), ("False", Some("ResourcesDiscovered")));
    }

    #[test]
    fn conditions_change_only_when_the_outcome_does_and_transitions_move_only_on_a_flip() {
        let failed = Outcome { failures: vec!["pods.: boom".into()], ..Outcome::default() };
        let first = updated(&[], &failed, t("2025-01-01T00:00:00Z")).unwrap();
        let content = find(&first, "NamespaceDeletionContentFailure");
        assert_eq!(content.message.as_deref(), Some("Failed to delete all resource types, 1 remaining: pods.: boom"));
        assert!(updated(&first, &failed, t("2025-01-01T00:01:00Z")).is_none());
        let later = updated(&first, &Outcome::default(), t("2025-01-01T00:02:00Z")).unwrap();
        let content = find(&later, "NamespaceDeletionContentFailure");
        assert_eq!(content.status, "False");
        assert_eq!(content.last_transition_time, Some(t("2025-01-01T00:02:00Z")));
        assert_eq!(find(&later, "NamespaceContentRemaining").last_transition_time, Some(t("2025-01-01T00:00:00Z")));
    }
}
