//! ServiceAccount: every new pod runs as a ServiceAccount of its namespace (`default` unless it
//! names one), which must exist; unless the pod or else its ServiceAccount turns
//! `automountServiceAccountToken` off, a projected `kube-api-access-<suffix>` volume with a
//! token, the cluster CA and the namespace is mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container and init container that
//! has nothing mounted there. A pod without image pull secrets gets its ServiceAccount's.
//! Mirror pods (static pods' API copies) are left alone, as kube-apiserver's plugin does.
//!
//! On in `berth server`, as in kube-apiserver; `--disable-admission-plugins=ServiceAccount` turns
//! it off. A pod refused for want of its ServiceAccount (a namespace the serviceaccount
//! controller has not reached yet) is for the client to create again, as upstream.

use berth_api::resources::{PODS, SERVICEACCOUNTS};
use serde_json::{Value, json};

use super::Attributes;
use crate::{ApiError, ApiResult, ApiState, objects};

/// Where the token, CA and namespace appear in containers.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The projected volume's name before its random suffix.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The token's lifetime the node agent asks for: an hour and seven seconds, as Kubernetes'.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The annotation that marks a mirror pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The ConfigMap with the cluster's CA in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// The mutating phase for pod creates.
pub async fn admit(state: &ApiState, attrs: &Attributes<'_>, pod: &mut Value) -> ApiResult<()> {
    if !std::ptr::eq(attrs.target.rt, &PODS) || attrs.target.subresource.is_some() {
        return Ok(());
    }
    if pod.pointer(&format!("/metadata/annotations/{}", MIRROR_ANNOTATION.replace('/', "~1"))).is_some() {
        return Ok(());
    }
    let namespace = attrs.target.namespace.clone().unwrap_or_default();
    let name = default_service_account_name(pod);
    let key = objects::key(&SERVICEACCOUNTS, Some(&namespace), &name);
    let found = state.store.get(&key).await.map_err(|e| ApiError::from_store(e, &SERVICEACCOUNTS, &name))?;
    let Some(kv) = found else {
        return Err(ApiError::forbidden(
            &PODS,
            attrs.name,
            &format!("error looking up service account {namespace}/{name}: serviceaccount {name:?} not found"),
        ));
    };
    let sa = objects::decode_kv(&SERVICEACCOUNTS, &kv)?;
    mutate(pod, &sa, &random_suffix());
    Ok(())
}

/// Sets `serviceAccountName` (and the deprecated `serviceAccount`) to `default` if unset, and
/// returns it.
pub fn default_service_account_name(pod: &mut Value) -> String {
    let spec = &mut pod["spec"];
    let name = match spec.get("serviceAccountName").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => "default".to_string(),
    };
    spec["serviceAccountName"] = json!(name);
    spec["serviceAccount"] = json!(name);
    name
}

/// Whether the token is mounted: the pod's choice, else the ServiceAccount's, else yes.
pub fn should_automount(pod: &Value, sa: &Value) -> bool {
    pod.pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| sa.get("automountServiceAccountToken").and_then(Value::as_bool))
        .unwrap_or(true)
}

/// The pod's changes for ServiceAccount `sa`; `suffix` names a new token volume.
pub fn mutate(pod: &mut Value, sa: &Value, suffix: &str) {
    let no_pull_secrets =
        pod.pointer("/spec/imagePullSecrets").and_then(Value::as_array).is_none_or(|list| list.is_empty());
    if no_pull_secrets && let Some(secrets) = sa.get("imagePullSecrets").and_then(Value::as_array) {
        let refs: Vec<Value> = secrets.iter().filter_map(|s| s.get("name")).map(|n| json!({"name": n})).collect();
        if !refs.is_empty() {
            pod["spec"]["imagePullSecrets"] = json!(refs);
        }
    }
    if !should_automount(pod, sa) {
        return;
    }
    let existing = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .find(|n| n.starts_with(VOLUME_PREFIX))
        .map(String::from);
    let volume_name = existing.clone().unwrap_or_else(|| format!("{VOLUME_PREFIX}{suffix}"));
    let mut mounted = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = pod["spec"].get_mut(list).and_then(Value::as_array_mut) else { continue };
        for container in containers {
            let has_mount = container
                .get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(MOUNT_PATH));
            if has_mount {
                continue;
            }
            let mount = json!({"name": volume_name, "readOnly": true, "mountPath": MOUNT_PATH});
            match container.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                Some(mounts) => mounts.push(mount),
                None => container["volumeMounts"] = json!([mount]),
            }
            mounted = true;
        }
    }
    if mounted && existing.is_none() {
        let volume = token_volume(&volume_name);
        match pod["spec"].get_mut("volumes").and_then(Value::as_array_mut) {
            Some(volumes) => volumes.push(volume),
            None => pod["spec"]["volumes"] = json!([volume]),
        }
    }
}

/// The projected volume with the token, the CA bundle and the namespace.
pub fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [
                    {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                ]}},
            ],
            "defaultMode": 0o644,
        },
    })
}

/// Five characters from Kubernetes' alphabet for generated names (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5].iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [
                {"name": "app", "image": "nginx"},
                {"name": "own", "image": "nginx", "volumeMounts": [{"name": "mine", "mountPath": MOUNT_PATH}]},
            ],
        }})
    }

    #[test]
    fn the_service_account_defaults_to_default_in_both_fields() {
        let mut p = pod();
        assert_eq!(default_service_account_name(&mut p), "default");
        assert_eq!(
            (&p["spec"]["serviceAccountName"], &p["spec"]["serviceAccount"]),
            (&json!("default"), &json!("default"))
        );
        let mut named = json!({"spec": {"serviceAccountName": "robot"}});
        assert_eq!(default_service_account_name(&mut named), "robot");
    }

    #[test]
    fn the_token_volume_is_added_and_mounted_where_nothing_is_mounted_at_the_path() {
        let mut p = pod();
        mutate(&mut p, &json!({}), "abcde");
        assert_eq!(p["spec"]["volumes"], json!([token_volume("kube-api-access-abcde")]));
        assert_eq!(p["spec"]["volumes"][0]["projected"]["defaultMode"], 420);
        let mount = json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": MOUNT_PATH});
        assert_eq!(p["spec"]["initContainers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(p["spec"]["containers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(p["spec"]["containers"][1]["volumeMounts"], json!([{"name": "mine", "mountPath": MOUNT_PATH}]));
    }

    #[test]
    fn automount_false_on_the_pod_or_else_the_service_account_adds_nothing() {
        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(false);
        mutate(&mut p, &json!({"automountServiceAccountToken": true}), "abcde");
        assert!(p["spec"].get("volumes").is_none());
        let mut p = pod();
        mutate(&mut p, &json!({"automountServiceAccountToken": false}), "abcde");
        assert!(p["spec"]["containers"][0].get("volumeMounts").is_none());
        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(true);
        mutate(&mut p, &json!({"automountServiceAccountToken": false}), "abcde");
        assert!(p["spec"]["volumes"].is_array(), "the pod's choice wins");
    }

    #[test]
    fn a_pod_without_pull_secrets_gets_the_service_accounts() {
        let mut p = pod();
        mutate(&mut p, &json!({"imagePullSecrets": [{"name": "regcred"}]}), "abcde");
        assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
    }

    #[test]
    fn suffixes_are_five_characters_of_the_alphabet() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)), "{s}");
    }
}
