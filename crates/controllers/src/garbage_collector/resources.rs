//! The resources the server serves, read through discovery, and the lookup from an owner
//! reference's `apiVersion` and `kind` to the resource to GET it from. Shared by the garbage
//! collector and the namespace controller.

use std::collections::HashMap;

use kube::Client;
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs};

/// One served resource (top-level, not a subresource).
#[derive(Clone, Debug)]
pub struct Served {
    pub resource: ApiResource,
    pub namespaced: bool,
    pub verbs: Vec<String>,
}

impl Served {
    pub fn supports(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }

    pub fn is_event(&self) -> bool {
        self.resource.kind == "Event" && matches!(self.resource.group.as_str(), "" | "events.k8s.io")
    }
}

/// Every resource in its group's preferred version.
pub async fn discover(client: &Client) -> Result<Vec<Served>, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            out.push(served(resource, &caps));
        }
    }
    Ok(out)
}

fn served(resource: ApiResource, caps: &ApiCapabilities) -> Served {
    Served { resource, namespaced: caps.scope == Scope::Namespaced, verbs: caps.operations.clone() }
}

/// The resources the garbage collector watches: those it can list, watch, get, patch and
/// delete, without events (upstream ignores both event resources).
pub fn collectable(all: &[Served]) -> Vec<Served> {
    all.iter()
        .filter(|s| !s.is_event())
        .filter(|s| [verbs::LIST, verbs::WATCH, verbs::GET, verbs::PATCH, verbs::DELETE].iter().all(|v| s.supports(v)))
        .cloned()
        .collect()
}

/// Served resources by group and kind.
#[derive(Clone, Debug, Default)]
pub struct Kinds {
    by_kind: HashMap<(String, String), Served>,
}

impl Kinds {
    pub fn new(all: &[Served]) -> Kinds {
        let by_kind = all.iter().map(|s| ((s.resource.group.clone(), s.resource.kind.clone()), s.clone())).collect();
        Kinds { by_kind }
    }

    /// The resource serving `kind` of the group of `api_version` (any version of the group:
    /// the server serves every object in each version of its group).
    pub fn find(&self, api_version: &str, kind: &str) -> Option<&Served> {
        let group = super::graph::group_of(api_version);
        self.by_kind.get(&(group.to_string(), kind.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(group: &str, version: &str, kind: &str, plural: &str, verbs: &[&str]) -> Served {
        let api_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        Served {
            resource: ApiResource {
                group: group.into(),
                version: version.into(),
                api_version,
                kind: kind.into(),
                plural: plural.into(),
            },
            namespaced: true,
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
        }
    }

    const ALL: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

    #[test]
    fn events_and_resources_that_cannot_be_watched_and_deleted_are_not_collected() {
        let all = vec![
            s("", "v1", "Pod", "pods", ALL),
            s("", "v1", "Event", "events", ALL),
            s("events.k8s.io", "v1", "Event", "events", ALL),
            s("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", &["create"]),
        ];
        let kinds: Vec<String> = collectable(&all).into_iter().map(|s| s.resource.kind).collect();
        assert_eq!(kinds, vec!["Pod"]);
    }

    #[test]
    fn owner_references_find_their_resource_by_group_and_kind_in_any_version() {
        let kinds = Kinds::new(&[s("apps", "v1", "ReplicaSet", "replicasets", ALL), s("", "v1", "Pod", "pods", ALL)]);
        assert_eq!(kinds.find("apps/v1beta2", "ReplicaSet").unwrap().resource.plural, "replicasets");
        assert_eq!(kinds.find("v1", "Pod").unwrap().resource.plural, "pods");
        assert!(kinds.find("extensions/v1beta1", "ReplicaSet").is_none());
        assert!(kinds.find("v1", "ReplicaSet").is_none());
    }
}
