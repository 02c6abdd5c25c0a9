//! Strategic merge patch for the served kinds: merge keys, directives, and list semantics.
//!
//! Semantics follow the API server's handling of `application/strategic-merge-patch+json`
//! (the parallel-list form kubectl has sent since 1.10): maps merge recursively, `null` deletes,
//! lists tagged `patchStrategy: merge` are merged (by merge key for lists of objects, as a set
//! for lists of primitives), every other list is replaced. Directives: `$patch`
//! (`replace`/`delete`/`merge`), `$retainKeys`, `$setElementOrder/<field>` and
//! `$deleteFromPrimitiveList/<field>`.

use serde_json::{Map, Value};

use crate::ResourceType;

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// How a list field is patched, from the `patchStrategy`/`patchMergeKey` tags of its Go type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListMeta {
    /// The field that identifies an element of a list of objects; `None` for lists of
    /// primitives, which merge as sets.
    pub merge_key: Option<&'static str>,
}

/// Merge-strategy lists of `ObjectMeta` (relative to `metadata`).
const OBJECT_META: &[(&str, Option<&str>)] = &[("finalizers", None), ("ownerReferences", Some("uid"))];

/// Merge-strategy lists of `Container` and `EphemeralContainer` (relative to the container).
const CONTAINER: &[(&str, Option<&str>)] = &[
    ("ports", Some("containerPort")),
    ("env", Some("name")),
    ("volumeMounts", Some("mountPath")),
    ("volumeDevices", Some("devicePath")),
];

/// Merge-strategy lists of `PodSpec` other than the containers (relative to the pod spec).
const POD_SPEC: &[(&str, Option<&str>)] = &[
    ("volumes", Some("name")),
    ("imagePullSecrets", Some("name")),
    ("hostAliases", Some("ip")),
    ("topologySpreadConstraints", Some("topologyKey")),
    ("schedulingGates", Some("name")),
    ("resourceClaims", Some("name")),
];

const POD_CONTAINER_LISTS: &[&str] = &["containers", "initContainers", "ephemeralContainers"];

/// Merge-strategy lists of `PodStatus` (relative to the pod status). `containerStatuses` and
/// friends carry no tag and are replaced whole.
const POD_STATUS: &[(&str, Option<&str>)] = &[
    ("conditions", Some("type")),
    ("hostIPs", Some("ip")),
    ("podIPs", Some("ip")),
    ("resourceClaimStatuses", Some("name")),
];

/// Looks up a table of `(relative path, merge key)` under `prefix`.
fn lookup(table: &[(&str, Option<&'static str>)], prefix: &str, path: &str) -> Option<ListMeta> {
    let rest = if prefix.is_empty() { path } else { path.strip_prefix(prefix)?.strip_prefix('.')? };
    table.iter().find(|(p, _)| *p == rest).map(|(_, k)| ListMeta { merge_key: *k })
}

fn pod_spec_meta(prefix: &str, path: &str) -> Option<ListMeta> {
    let rest = path.strip_prefix(prefix)?.strip_prefix('.')?;
    if POD_CONTAINER_LISTS.contains(&rest) {
        return Some(ListMeta { merge_key: Some("name") });
    }
    for list in POD_CONTAINER_LISTS {
        if let Some(field) = rest.strip_prefix(list).and_then(|r| r.strip_prefix('.')) {
            return lookup(CONTAINER, "", field);
        }
    }
    lookup(POD_SPEC, "", rest)
}

/// The patch strategy of the list at `path` (dotted field names; list elements add no segment,
/// so a container's env is `spec.containers.env`). `None` means the list is replaced.
pub fn list_meta(rt: &ResourceType, path: &str) -> Option<ListMeta> {
    if let Some(m) = lookup(OBJECT_META, "metadata", path) {
        return Some(m);
    }
    match (rt.group, rt.kind) {
        ("", "Pod") => pod_spec_meta("spec", path).or_else(|| lookup(POD_STATUS, "status", path)),
        ("", "Node") => lookup(
            &[("spec.podCIDRs", None), ("status.conditions", Some("type")), ("status.addresses", Some("type"))],
            "",
            path,
        ),
        ("", "Namespace") => lookup(&[("status.conditions", Some("type"))], "", path),
        ("", "ServiceAccount") => lookup(&[("secrets", Some("name"))], "", path),
        ("", "Service") => lookup(&[("spec.ports", Some("port")), ("status.conditions", Some("type"))], "", path),
        ("", "PodTemplate") => {
            lookup(OBJECT_META, "template.metadata", path).or_else(|| pod_spec_meta("template.spec", path))
        }
        ("apps", "Deployment" | "ReplicaSet") | ("", "ReplicationController") => {
            lookup(OBJECT_META, "spec.template.metadata", path)
                .or_else(|| pod_spec_meta("spec.template.spec", path))
                .or_else(|| lookup(&[("status.conditions", Some("type"))], "", path))
        }
        _ => None,
    }
}

/// Applies a strategic merge patch to `original`, an object of type `rt`.
pub fn apply(rt: &ResourceType, original: &Value, patch: &Value) -> Result<Value, String> {
    let Value::Object(orig) = original else {
        return Err("the object to patch is not a JSON object".into());
    };
    let Value::Object(patch) = patch else {
        return Err("a strategic merge patch must be a JSON object".into());
    };
    let merger = Merger { rt };
    Ok(Value::Object(merger.merge_map(orig.clone(), patch, "")?))
}

struct Merger<'a> {
    rt: &'a ResourceType,
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() { field.to_string() } else { format!("{path}.{field}") }
}

fn describe(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

impl Merger<'_> {
    fn merge_map(
        &self,
        mut orig: Map<String, Value>,
        patch: &Map<String, Value>,
        path: &str,
    ) -> Result<Map<String, Value>, String> {
        let mut patch = patch.clone();
        if let Some(directive) = patch.remove(PATCH) {
            match directive.as_str() {
                // The patch's own content is the new map; run it through an empty merge so nested
                // directives are consumed and nulls dropped.
                Some("replace") => return self.merge_map(Map::new(), &patch, path),
                Some("delete") => return Ok(Map::new()),
                Some("merge") => {}
                _ => return Err(format!("invalid value for $patch in {}: {directive}", describe(path))),
            }
        }

        if let Some(retain) = patch.remove(RETAIN_KEYS) {
            retain_keys(&mut orig, &patch, &retain, path)?;
        }

        // Lists with an explicit order are merged together with their order directive.
        let mut done: Vec<String> = Vec::new();
        let order_keys: Vec<String> = patch.keys().filter(|k| k.starts_with(SET_ELEMENT_ORDER)).cloned().collect();
        for key in order_keys {
            let field = &key[SET_ELEMENT_ORDER.len()..];
            let Some(Value::Array(order)) = patch.get(&key) else {
                return Err(format!("{key} in {} must be a list", describe(path)));
            };
            let field_path = join(path, field);
            let meta = list_meta(self.rt, &field_path);
            let patch_list = match patch.get(field) {
                Some(Value::Array(l)) => Some(l.as_slice()),
                // The field is being deleted; there is nothing to order.
                Some(Value::Null) => continue,
                None => None,
                Some(_) => return Err(format!("{field_path} must be a list in the patch")),
            };
            let orig_list = match orig.get(field) {
                Some(Value::Array(l)) => l.clone(),
                _ => Vec::new(),
            };
            if patch_list.is_none() && !orig.contains_key(field) {
                done.push(field.to_string());
                continue;
            }
            let Some(meta) = meta else {
                // Not a merging list here (kubectl may know a newer schema): the order means
                // nothing, and the list itself is handled as a plain field below.
                continue;
            };
            let id = match meta.merge_key {
                Some(k) => Identity::Key(k.to_string()),
                None => Identity::Value,
            };
            let merged = match patch_list {
                Some(pl) => {
                    check_order_matches(pl, order, &id, &field_path)?;
                    self.merge_list(orig_list.clone(), pl, meta, &field_path)?
                }
                None => orig_list.clone(),
            };
            let ordered = apply_order(merged, order, &orig_list, &id);
            orig.insert(field.to_string(), Value::Array(ordered));
            done.push(field.to_string());
        }

        let mut deletions: Vec<(String, Value)> = Vec::new();
        for (key, pv) in &patch {
            if key.starts_with(SET_ELEMENT_ORDER) || done.contains(key) {
                continue;
            }
            if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
                // Applied after the plain fields, so that the result does not depend on key order.
                deletions.push((field.to_string(), pv.clone()));
                continue;
            }
            if key.starts_with('$') {
                return Err(format!("unknown patch directive {key} in {}", describe(path)));
            }
            let field_path = join(path, key);
            if pv.is_null() {
                orig.remove(key);
                continue;
            }
            let merged = match (orig.remove(key), pv) {
                (Some(Value::Object(o)), Value::Object(p)) => Value::Object(self.merge_map(o, p, &field_path)?),
                (Some(Value::Array(o)), Value::Array(p)) => match list_meta(self.rt, &field_path) {
                    Some(meta) => Value::Array(self.merge_list(o, p, meta, &field_path)?),
                    None => pv.clone(),
                },
                // Absent, or of another type: the patch value wins, with its directives consumed.
                _ => self.fresh(pv, &field_path)?,
            };
            orig.insert(key.clone(), merged);
        }

        for (field, values) in deletions {
            let Value::Array(values) = values else {
                return Err(format!("{DELETE_FROM_PRIMITIVE_LIST}{field} in {} must be a list", describe(path)));
            };
            if let Some(Value::Array(list)) = orig.get_mut(&field) {
                if list.iter().any(Value::is_object) {
                    return Err(format!(
                        "{DELETE_FROM_PRIMITIVE_LIST}{field}: {} is not a list of primitives",
                        join(path, &field)
                    ));
                }
                list.retain(|v| !values.contains(v));
            }
        }
        Ok(orig)
    }

    /// A patch value with nothing under it in the original: merged into an empty value.
    fn fresh(&self, pv: &Value, path: &str) -> Result<Value, String> {
        Ok(match pv {
            Value::Object(p) => Value::Object(self.merge_map(Map::new(), p, path)?),
            Value::Array(p) => match list_meta(self.rt, path) {
                Some(meta) => Value::Array(self.merge_list(Vec::new(), p, meta, path)?),
                None => pv.clone(),
            },
            _ => pv.clone(),
        })
    }

    fn merge_list(&self, orig: Vec<Value>, patch: &[Value], meta: ListMeta, path: &str) -> Result<Vec<Value>, String> {
        let objects = orig.iter().chain(patch).any(|v| v.is_object() && v.get(PATCH).is_none());
        let primitives = orig.iter().chain(patch).any(|v| !v.is_object());
        if objects && primitives {
            return Err(format!("{path}: list mixes objects and primitive values"));
        }
        match meta.merge_key {
            Some(key) if !primitives => self.merge_object_list(orig, patch, key, path),
            Some(_) => Err(format!("{path}: expected a list of objects")),
            None if objects => Err(format!("cannot merge lists without merge key for {path}")),
            None => merge_primitive_list(orig, patch, path),
        }
    }

    fn merge_object_list(
        &self,
        mut orig: Vec<Value>,
        patch: &[Value],
        key: &str,
        path: &str,
    ) -> Result<Vec<Value>, String> {
        let mut plain: Vec<&Map<String, Value>> = Vec::new();
        let mut replace = false;
        for item in patch {
            let Value::Object(m) = item else {
                return Err(format!("{path}: expected a list of objects"));
            };
            match m.get(PATCH) {
                None => plain.push(m),
                Some(d) => match d.as_str() {
                    Some("delete") => {
                        let Some(kv) = m.get(key) else {
                            return Err(format!("{path}: $patch: delete element does not contain merge key {key}"));
                        };
                        orig.retain(|o| o.get(key) != Some(kv));
                    }
                    Some("replace") => replace = true,
                    // An element saying "merge" is the default behaviour; merge it if it has content.
                    Some("merge") => {
                        if m.len() > 1 {
                            plain.push(m);
                        }
                    }
                    _ => return Err(format!("invalid value for $patch in {path}: {d}")),
                },
            }
        }
        if replace {
            let mut out = Vec::with_capacity(plain.len());
            for m in plain {
                out.push(Value::Object(self.merge_map(Map::new(), m, path)?));
            }
            return Ok(out);
        }

        let mut merged = orig.clone();
        for m in &plain {
            let Some(kv) = m.get(key) else {
                return Err(format!(
                    "{path}: element {} does not contain merge key {key}",
                    Value::Object((*m).clone())
                ));
            };
            match merged.iter().position(|o| o.get(key) == Some(kv)) {
                Some(i) => {
                    let Value::Object(o) = std::mem::take(&mut merged[i]) else {
                        return Err(format!("{path}: expected a list of objects"));
                    };
                    merged[i] = Value::Object(self.merge_map(o, m, path)?);
                }
                None => merged.push(Value::Object(self.merge_map(Map::new(), m, path)?)),
            }
        }
        let id = Identity::Key(key.to_string());
        let order: Vec<Value> = plain.iter().map(|m| Value::Object((*m).clone())).collect();
        Ok(apply_order(merged, &order, &orig, &id))
    }
}

fn merge_primitive_list(orig: Vec<Value>, patch: &[Value], path: &str) -> Result<Vec<Value>, String> {
    let mut plain: Vec<Value> = Vec::new();
    let mut replace = false;
    for item in patch {
        match item.get(PATCH).and_then(Value::as_str) {
            None if item.is_object() => return Err(format!("{path}: unexpected object in a list of primitives")),
            None => plain.push(item.clone()),
            Some("replace") => replace = true,
            Some("merge") => {}
            Some(d) => return Err(format!("invalid value for $patch in {path}: {d}")),
        }
    }
    if replace {
        return Ok(plain);
    }
    let mut merged: Vec<Value> = Vec::new();
    for v in orig.iter().chain(&plain) {
        if !merged.contains(v) {
            merged.push(v.clone());
        }
    }
    Ok(apply_order(merged, &plain, &orig, &Identity::Value))
}

fn retain_keys(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    retain: &Value,
    path: &str,
) -> Result<(), String> {
    let bad = || format!("invalid patch format of retainKeys in {}", describe(path));
    let Value::Array(list) = retain else { return Err(bad()) };
    let keys: Vec<&str> = list.iter().map(Value::as_str).collect::<Option<_>>().ok_or_else(bad)?;
    // Every field the patch sets must be among the retained keys.
    for (k, v) in patch {
        if v.is_null() || k.starts_with('$') {
            continue;
        }
        if !keys.contains(&k.as_str()) {
            return Err(format!("{}: field {k} is set but not listed in $retainKeys", bad()));
        }
    }
    orig.retain(|k, _| keys.contains(&k.as_str()));
    Ok(())
}

/// What identifies a list element when ordering: its merge key's value, or the value itself.
enum Identity {
    Key(String),
    Value,
}

impl Identity {
    fn of<'v>(&self, v: &'v Value) -> Option<&'v Value> {
        match self {
            Identity::Key(k) => v.get(k),
            Identity::Value => Some(v),
        }
    }

    fn index_in(&self, list: &[Value], v: &Value) -> Option<usize> {
        let id = self.of(v)?;
        list.iter().position(|o| self.of(o) == Some(id))
    }
}

/// The elements of the patch list must appear in `$setElementOrder` in the same relative order.
fn check_order_matches(patch: &[Value], order: &[Value], id: &Identity, path: &str) -> Result<(), String> {
    if let Identity::Key(k) = id
        && let Some(bad) = order.iter().find(|o| o.get(k).is_none())
    {
        return Err(format!("$setElementOrder/{path}: element {bad} does not contain merge key {k}"));
    }
    let mut at = 0;
    for item in patch.iter().filter(|v| v.get(PATCH).is_none()) {
        let Some(item_id) = id.of(item) else { continue };
        match order[at..].iter().position(|o| id.of(o) == Some(item_id)) {
            Some(i) => at += i + 1,
            None => {
                return Err(format!("the order of the patch list for {path} does not match its $setElementOrder list"));
            }
        }
    }
    Ok(())
}

/// Orders a merged list: elements named in `order` come in that order; the others (present only
/// on the server) keep their original relative order and are slotted in before the first ordered
/// element that followed them in the original list.
fn apply_order(merged: Vec<Value>, order: &[Value], orig: &[Value], id: &Identity) -> Vec<Value> {
    let (mut ordered, mut server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| id.index_in(order, v).is_some());
    ordered.sort_by_key(|v| id.index_in(order, v));
    server_only.sort_by_key(|v| id.index_in(orig, v));

    let mut out = Vec::with_capacity(ordered.len() + server_only.len());
    let mut server = server_only.into_iter().peekable();
    for item in ordered {
        let item_pos = id.index_in(orig, &item);
        while let Some(s) = server.peek() {
            match (id.index_in(orig, s), item_pos) {
                (Some(sp), Some(ip)) if sp < ip => out.push(server.next().expect("peeked")),
                _ => break,
            }
        }
        out.push(item);
    }
    out.extend(server);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::{CONFIGMAPS, DEPLOYMENTS, NODES, PODS};

    fn pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "namespace": "default",
                "labels": {"app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "team": "core"
                },
                "finalizers": ["example.com/a"]
            },
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": "nginx:1.25",
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "ports": [{"containerPort": 80, "protocol": "TCP"}]
                    },
                    {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "3600"]}
                ],
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                ],
                "nodeName": "n1"
            }
        })
    }

    #[test]
    fn kubectl_apply_of_a_new_image_merges_the_container_by_name_and_keeps_the_order() {
        let patch = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"new\":1}"}},
            "spec": {
                "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}],
                "containers": [{"image": "nginx:1.27", "name": "app"}]
            }
        });
        let out = apply(&PODS, &pod(), &patch).unwrap();
        let cs = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["name"], "app");
        assert_eq!(cs[0]["image"], "nginx:1.27");
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2, "fields not in the patch are kept");
        assert_eq!(cs[1]["name"], "sidecar");
        assert_eq!(out["metadata"]["annotations"]["team"], "core");
        assert_eq!(out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"], "{\"new\":1}");
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn set_element_order_reorders_and_keeps_server_only_elements_in_place() {
        let orig = json!({"spec": {"containers": [
            {"name": "a"}, {"name": "b"}, {"name": "injected"}, {"name": "c"}
        ]}});
        let patch = json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}]}});
        let out = apply(&PODS, &orig, &patch).unwrap();
        let names: Vec<&str> =
            out["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        // `injected` stood before `c` on the server, so it stays before it.
        assert_eq!(names, ["injected", "c", "a", "b"]);
    }

    #[test]
    fn server_only_runs_stay_between_the_elements_they_followed() {
        let names = |v: &Value| -> Vec<String> {
            v["spec"]["volumes"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_string()).collect()
        };
        let vol = |n: &str| json!({"name": n, "emptyDir": {}});
        let orig = json!({"spec": {"volumes": [vol("1"), vol("2"), vol("7"), vol("9"), vol("8"), vol("3"), vol("4")]}});
        let patch =
            json!({"spec": {"$setElementOrder/volumes": [{"name": "2"}, {"name": "1"}, {"name": "4"}, {"name": "3"}]}});
        let out = apply(&PODS, &orig, &patch).unwrap();
        assert_eq!(names(&out), ["2", "1", "7", "9", "8", "4", "3"]);
    }

    #[test]
    fn delete_from_primitive_list_never_creates_the_list() {
        let patch = json!({"spec": {"$deleteFromPrimitiveList/podCIDRs": ["10.0.0.0/24"]}});
        let out = apply(&NODES, &json!({"spec": {}}), &patch).unwrap();
        assert_eq!(out["spec"], json!({}));
    }

    #[test]
    fn an_explicit_merge_directive_merges_as_usual() {
        let patch = json!({"metadata": {"labels": {"$patch": "merge", "tier": "x"}}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "tier": "x"}));
    }

    #[test]
    fn an_env_var_is_deleted_with_a_delete_directive() {
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}],
            "containers": [{
                "$setElementOrder/env": [{"name": "A"}],
                "name": "app",
                "env": [{"$patch": "delete", "name": "B"}]
            }]
        }});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["spec"]["containers"][0]["env"], json!([{"name": "A", "value": "1"}]));
    }

    #[test]
    fn kubectl_label_adds_a_label_and_keeps_the_others() {
        let patch = json!({"metadata": {"labels": {"tier": "frontend"}}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "tier": "frontend"}));
    }

    #[test]
    fn kubectl_annotate_removes_an_annotation_with_null() {
        let patch = json!({"metadata": {"annotations": {"team": null, "absent": null}}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        let ann = out["metadata"]["annotations"].as_object().unwrap();
        assert!(!ann.contains_key("team"));
        assert!(!ann.contains_key("absent"), "nulls for missing keys are not stored");
        assert!(ann.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    }

    #[test]
    fn finalizers_are_unioned_and_can_be_removed_from_the_primitive_list() {
        let out =
            apply(&PODS, &pod(), &json!({"metadata": {"finalizers": ["example.com/b", "example.com/a"]}})).unwrap();
        let f = out["metadata"]["finalizers"].as_array().unwrap();
        assert_eq!(f.len(), 2);
        assert!(f.contains(&json!("example.com/a")) && f.contains(&json!("example.com/b")));

        let patch = json!({"metadata": {
            "$setElementOrder/finalizers": ["example.com/b"],
            "$deleteFromPrimitiveList/finalizers": ["example.com/a"]
        }});
        let out = apply(&PODS, &out, &patch).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["example.com/b"]));
    }

    #[test]
    fn new_finalizers_in_a_plain_patch_go_first_as_on_kubernetes() {
        let out = apply(&PODS, &pod(), &json!({"metadata": {"finalizers": ["example.com/z"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["example.com/z", "example.com/a"]));
    }

    #[test]
    fn retain_keys_on_the_deployment_strategy_drops_rolling_update() {
        let deploy = json!({
            "metadata": {"name": "d"},
            "spec": {
                "replicas": 2,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
            }
        });
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"}}});
        let out = apply(&DEPLOYMENTS, &deploy, &patch).unwrap();
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
        assert_eq!(out["spec"]["replicas"], 2);
    }

    #[test]
    fn retain_keys_rejects_a_patch_setting_an_unlisted_field() {
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 1}}}});
        let err = apply(&DEPLOYMENTS, &json!({"spec": {}}), &patch).unwrap_err();
        assert!(err.contains("retainKeys"), "{err}");
    }

    #[test]
    fn tolerations_have_no_merge_key_and_are_replaced() {
        let patch = json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["spec"]["tolerations"], patch["spec"]["tolerations"]);
    }

    #[test]
    fn a_replace_directive_in_a_merging_list_replaces_the_whole_list() {
        let patch = json!({"spec": {"containers": [{"name": "only", "image": "x"}, {"$patch": "replace"}]}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "only", "image": "x"}]));
    }

    #[test]
    fn a_replace_directive_in_a_map_replaces_the_map() {
        let patch = json!({"metadata": {"labels": {"$patch": "replace", "x": "y"}}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"x": "y"}));
    }

    #[test]
    fn a_delete_directive_in_a_map_empties_it() {
        let patch = json!({"metadata": {"labels": {"$patch": "delete"}}});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({}));
    }

    #[test]
    fn kubectl_scale_patches_replicas() {
        let deploy =
            json!({"metadata": {"name": "d"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}}}});
        let out = apply(&DEPLOYMENTS, &deploy, &json!({"spec": {"replicas": 5}})).unwrap();
        assert_eq!(out["spec"]["replicas"], 5);
        assert_eq!(out["spec"]["selector"], deploy["spec"]["selector"]);
    }

    #[test]
    fn deployment_template_containers_merge_by_name_and_ports_by_container_port() {
        let deploy = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "app", "image": "a:1", "ports": [{"containerPort": 80}, {"containerPort": 443}]}
        ]}}}});
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "app", "ports": [{"containerPort": 443, "name": "https"}]}
        ]}}}});
        let out = apply(&DEPLOYMENTS, &deploy, &patch).unwrap();
        let c = &out["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "a:1");
        assert_eq!(c["ports"].as_array().unwrap().len(), 2);
        assert!(c["ports"].as_array().unwrap().contains(&json!({"containerPort": 443, "name": "https"})));
    }

    #[test]
    fn a_new_container_is_appended_after_set_element_order() {
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}, {"name": "extra"}],
            "containers": [{"name": "extra", "image": "e", "env": [{"$patch": "delete", "name": "X"}]}]
        }});
        let out = apply(&PODS, &pod(), &patch).unwrap();
        let names: Vec<&str> =
            out["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["app", "sidecar", "extra"]);
        assert_eq!(out["spec"]["containers"][2], json!({"name": "extra", "image": "e", "env": []}));
    }

    #[test]
    fn node_status_conditions_merge_by_type() {
        let node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}
        ]}});
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}});
        let out = apply(&NODES, &node, &patch).unwrap();
        let conds = out["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 2);
        let ready = conds.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "True");
        assert_eq!(ready["reason"], "KubeletReady");
    }

    #[test]
    fn configmap_data_merges_as_a_map() {
        let cm = json!({"data": {"a": "1", "b": "2"}});
        let out = apply(&CONFIGMAPS, &cm, &json!({"data": {"b": null, "c": "3"}})).unwrap();
        assert_eq!(out["data"], json!({"a": "1", "c": "3"}));
    }

    #[test]
    fn bad_directives_and_shapes_are_errors() {
        assert!(apply(&PODS, &pod(), &json!({"metadata": {"labels": {"$patch": "explode"}}})).is_err());
        assert!(apply(&PODS, &pod(), &json!({"spec": {"$bogus": 1}})).is_err());
        assert!(apply(&PODS, &pod(), &json!([1])).is_err());
        let missing_key = json!({"spec": {"containers": [{"image": "x"}]}});
        assert!(apply(&PODS, &pod(), &missing_key).unwrap_err().contains("merge key"));
        let wrong_order = json!({"spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}],
            "containers": [{"name": "app", "image": "x"}, {"name": "sidecar", "image": "y"}]
        }});
        assert!(apply(&PODS, &pod(), &wrong_order).unwrap_err().contains("order"));
    }

    #[test]
    fn patch_meta_covers_pod_and_template_fields() {
        let key = |rt, p| list_meta(rt, p).and_then(|m| m.merge_key);
        assert_eq!(key(&PODS, "spec.containers.volumeMounts"), Some("mountPath"));
        assert_eq!(key(&PODS, "spec.initContainers.env"), Some("name"));
        assert_eq!(key(&PODS, "metadata.ownerReferences"), Some("uid"));
        assert_eq!(key(&DEPLOYMENTS, "spec.template.spec.volumes"), Some("name"));
        assert_eq!(key(&DEPLOYMENTS, "spec.template.spec.hostAliases"), Some("ip"));
        assert_eq!(list_meta(&PODS, "metadata.finalizers"), Some(ListMeta { merge_key: None }));
        assert_eq!(list_meta(&PODS, "spec.tolerations"), None);
        assert_eq!(list_meta(&PODS, "status.containerStatuses"), None);
        assert_eq!(list_meta(&NODES, "spec.taints"), None);
    }

    #[test]
    fn service_ports_merge_by_port_number() {
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        let patch = json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}});
        let out = apply(&crate::resources::SERVICES, &svc, &patch).unwrap();
        let ports = out["spec"]["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 2);
        assert!(ports.contains(&json!({"port": 443, "name": "https", "targetPort": 8443})), "{ports:?}");
    }
}
