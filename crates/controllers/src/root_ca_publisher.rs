//! The root CA publisher: a ConfigMap `kube-root-ca.crt` in every active namespace whose `ca.crt`
//! is the cluster's CA bundle, so pods can verify the API server; made again when deleted, its
//! data put back when edited — kube-controller-manager's `root-ca-cert-publisher`, through the
//! API only (the shell is [`crate::per_namespace`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::Context;
use crate::per_namespace::{self, Ensured};

/// The ConfigMap every namespace gets.
pub const CONFIG_MAP: &str = "kube-root-ca.crt";
/// Its one key: the CA bundle, PEM.
pub const KEY: &str = "ca.crt";
/// The annotation that says what the ConfigMap is for.
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
/// Its value when the publisher writes it.
pub const DESCRIPTION: &str = "The cluster's CA bundle, for verifying the API server at the kubernetes Service \
     (kubernetes.default.svc); published to every namespace by the controller manager.";

struct RootCa {
    ca: String,
}

impl Ensured for RootCa {
    type Object = ConfigMap;
    const CONTROLLER: &'static str = "root-ca-cert-publisher";
    const NAME: &'static str = CONFIG_MAP;

    fn desired(&self) -> ConfigMap {
        desired(&self.ca)
    }

    fn repaired(&self, existing: &ConfigMap) -> Option<ConfigMap> {
        repaired(existing, &self.ca)
    }
}

fn data(ca: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(KEY.to_string(), ca.to_string())])
}

/// The ConfigMap as it is created: the CA bundle under `ca.crt`, and the description.
pub fn desired(ca: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            annotations: Some(BTreeMap::from([(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into())])),
            ..Default::default()
        },
        data: Some(data(ca)),
        ..Default::default()
    }
}

/// `existing` with its data set to exactly the CA bundle and a description added, or `None`
/// when it has both already. Other annotations, labels and `binaryData` are kept, and so is a
/// description someone else wrote.
pub fn repaired(existing: &ConfigMap, ca: &str) -> Option<ConfigMap> {
    let data = data(ca);
    let described = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
        .is_some_and(|d| !d.is_empty());
    if existing.data.as_ref() == Some(&data) && described {
        return None;
    }
    let mut cm = existing.clone();
    cm.data = Some(data);
    cm.metadata.annotations.get_or_insert_default().insert(DESCRIPTION_ANNOTATION.into(), DESCRIPTION.into());
    Some(cm)
}

/// Runs the root CA publisher with the CA bundle `ca` (PEM) until the future is dropped.
pub async fn run(ctx: Arc<Context>, ca: String) {
    per_namespace::run(ctx, RootCa { ca }).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn config_map(v: serde_json::Value) -> ConfigMap {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_config_map_is_created_with_the_ca_bundle_and_a_description() {
        let cm = desired(CA);
        assert_eq!(cm.metadata.name.as_deref(), Some("kube-root-ca.crt"));
        assert_eq!(cm.data, Some(BTreeMap::from([("ca.crt".to_string(), CA.to_string())])));
        assert_eq!(cm.metadata.annotations.unwrap()["kubernetes.io/description"], DESCRIPTION);
    }

    #[test]
    fn a_config_map_as_published_needs_nothing() {
        assert!(repaired(&desired(CA), CA).is_none());
    }

    #[test]
    fn an_edited_ca_bundle_is_put_back_keeping_labels_and_other_annotations() {
        let edited = config_map(json!({
            "metadata": {"name": "kube-root-ca.crt", "resourceVersion": "7", "labels": {"team": "a"},
                "annotations": {"kubernetes.io/description": "theirs", "other": "kept"}},
            "data": {"ca.crt": "forged"}
        }));
        let cm = repaired(&edited, CA).expect("the data differs");
        assert_eq!(cm.data.unwrap()["ca.crt"], CA);
        assert_eq!(cm.metadata.resource_version.as_deref(), Some("7"), "the update is conditional");
        assert_eq!(cm.metadata.labels.unwrap()["team"], "a");
        let annotations = cm.metadata.annotations.unwrap();
        assert_eq!(annotations["other"], "kept");
        assert_eq!(annotations["kubernetes.io/description"], DESCRIPTION);
    }

    #[test]
    fn an_added_key_is_removed() {
        let edited = config_map(json!({
            "metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": "d"}},
            "data": {"ca.crt": CA, "extra": "x"}
        }));
        let cm = repaired(&edited, CA).expect("an extra key");
        assert_eq!(cm.data.unwrap().keys().collect::<Vec<_>>(), ["ca.crt"]);
    }

    #[test]
    fn a_missing_description_is_added_and_one_someone_wrote_is_kept() {
        let bare = config_map(json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": CA}}));
        let cm = repaired(&bare, CA).expect("no description");
        assert_eq!(cm.metadata.annotations.unwrap()["kubernetes.io/description"], DESCRIPTION);
        let theirs = config_map(json!({
            "metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": "theirs"}},
            "data": {"ca.crt": CA}
        }));
        assert!(repaired(&theirs, CA).is_none());
    }
}
