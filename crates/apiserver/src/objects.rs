//! Objects as JSON values: metadata access, storage keys, and (de)serialisation to store bytes.

use std::collections::BTreeMap;

use berth_api::ResourceType;
use berth_api::resources::EVENTS_V1;
use berth_store::{KeyValue, Revision};
use serde_json::{Value, json};

use crate::ApiError;

pub fn meta(obj: &Value) -> &Value {
    obj.get("metadata").unwrap_or(&Value::Null)
}

pub fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata is an object")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).get(field).and_then(Value::as_str).filter(|s| !s.is_empty())
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub fn labels(obj: &Value) -> BTreeMap<String, String> {
    meta(obj)
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default()
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

pub fn set_resource_version(obj: &mut Value, rev: Revision) {
    meta_mut(obj).insert("resourceVersion".into(), json!(rev.to_string()));
}

pub fn resource_version(obj: &Value) -> Option<&str> {
    meta_str(obj, "resourceVersion")
}

pub fn is_deleting(obj: &Value) -> bool {
    meta(obj).get("deletionTimestamp").is_some_and(|v| !v.is_null())
}

pub fn key(rt: &ResourceType, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if rt.namespaced => format!("/registry/{}/{ns}/{name}", rt.storage),
        _ => format!("/registry/{}/{name}", rt.storage),
    }
}

/// The first store key after `key`: where the next page of a list starts.
pub fn key_after(key: &str) -> String {
    format!("{key}\0")
}

/// The prefix of every object of `rt`, in `namespace` if given.
pub fn prefix(rt: &ResourceType, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if rt.namespaced => format!("/registry/{}/{ns}/", rt.storage),
        _ => format!("/registry/{}/", rt.storage),
    }
}

/// Store bytes for an object as seen through `rt`: stored without `resourceVersion`, events
/// always in their core/v1 form.
pub fn encode(rt: &ResourceType, obj: &Value) -> Vec<u8> {
    let mut stored = if std::ptr::eq(rt, &EVENTS_V1) { berth_api::kinds::event_v1_to_core(obj) } else { obj.clone() };
    if let Some(m) = stored.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(&stored).expect("json values serialize")
}

/// Appends to `out` the object in store bytes as [`decode`] serves it (`kind`, `apiVersion`,
/// `metadata.resourceVersion` = `rev`), copied from the stored JSON instead of built as a
/// [`Value`] and encoded again: a watch event goes out to its watchers this way. False, with
/// `out` as it was, when the bytes are not an object with an object `metadata`, or `rt` is a
/// converted view; [`decode`] then says what is wrong.
pub fn write_served(out: &mut Vec<u8>, rt: &ResourceType, stored: &[u8], rev: Revision) -> bool {
    if std::ptr::eq(rt, &EVENTS_V1) {
        return false;
    }
    let Ok(Entries(top)) = serde_json::from_slice::<Entries>(stored) else { return false };
    let Some((_, metadata)) = top.iter().find(|(k, _)| k.0 == "metadata") else { return false };
    let Ok(Entries(metadata)) = serde_json::from_str::<Entries>(metadata.get()) else { return false };
    out.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut *out, rt.kind).expect("a string encodes");
    out.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut *out, &rt.api_version()).expect("a string encodes");
    for (key, value) in &top {
        match key.0.as_ref() {
            "kind" | "apiVersion" => continue,
            "metadata" => {
                out.extend_from_slice(b",\"metadata\":{");
                for (key, value) in metadata.iter().filter(|(k, _)| k.0 != "resourceVersion") {
                    write_entry(out, &key.0, value);
                    out.push(b',');
                }
                out.extend_from_slice(format!("\"resourceVersion\":\"{rev}\"}}").as_bytes());
            }
            _ => {
                out.push(b',');
                write_entry(out, &key.0, value);
            }
        }
    }
    out.push(b'}');
    true
}

fn write_entry(out: &mut Vec<u8>, key: &str, value: &serde_json::value::RawValue) {
    serde_json::to_writer(&mut *out, key).expect("a string encodes");
    out.push(b':');
    out.extend_from_slice(value.get().as_bytes());
}

/// A JSON object's members in order, each value left as its text.
struct Entries<'a>(Vec<(Key<'a>, &'a serde_json::value::RawValue)>);

/// A member name, borrowed from the text unless it has escapes.
#[derive(serde::Deserialize)]
struct Key<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Entries<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Entries(members))
            }
        }
        d.deserialize_map(Members)
    }
}

/// The object in store bytes as seen through `rt`, with `resourceVersion` = `rev`.
pub fn decode(rt: &ResourceType, bytes: &[u8], rev: Revision) -> Result<Value, ApiError> {
    let mut obj: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::internal(format!("stored object is not valid JSON: {e}")))?;
    if std::ptr::eq(rt, &EVENTS_V1) {
        obj = berth_api::kinds::event_core_to_v1(&obj);
    }
    obj["apiVersion"] = json!(rt.api_version());
    obj["kind"] = json!(rt.kind);
    set_resource_version(&mut obj, rev);
    Ok(obj)
}

pub fn decode_kv(rt: &ResourceType, kv: &KeyValue) -> Result<Value, ApiError> {
    decode(rt, &kv.value, kv.mod_revision)
}

/// Equal ignoring `resourceVersion` and `managedFields`: an update that changes nothing is not written.
/// Compared in place: copying both objects to strip those fields cost more than the comparison.
pub fn same_content(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return a == b };
    let ignored = |k: &str| k == "resourceVersion" || k == "managedFields";
    let same_meta = |x: Option<&Value>, y: Option<&Value>| match (x.map(Value::as_object), y.map(Value::as_object)) {
        (Some(Some(x)), Some(Some(y))) => {
            let count = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| !ignored(k)).count();
            count(x) == count(y) && x.iter().filter(|(k, _)| !ignored(k)).all(|(k, v)| y.get(k) == Some(v))
        }
        (x, y) => x == y,
    };
    a.len() == b.len()
        && a.iter().all(|(k, v)| if k == "metadata" { same_meta(Some(v), b.get(k)) } else { b.get(k) == Some(v) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_written_from_its_stored_bytes_is_the_object_decode_serves() {
        use berth_api::resources::{NAMESPACES, PODS};
        let cases = [
            (
                &PODS,
                json!({"metadata": {"name": "p", "namespace": "n", "labels": {"a\"b": "c"}}, "spec": {"nodeName": "x"}}),
            ),
            (
                &PODS,
                json!({"apiVersion": "v0", "kind": "Old", "metadata": {"resourceVersion": "3", "name": "p"}, "status": {}}),
            ),
            (&PODS, json!({"metadata": {}})),
            (&NAMESPACES, json!({"spec": {"finalizers": ["kubernetes"]}, "metadata": {"name": "nsé", "we\"ird": "u"}})),
        ];
        for (rt, obj) in cases {
            let stored = serde_json::to_vec(&obj).unwrap();
            let mut out = b"prefix".to_vec();
            assert!(write_served(&mut out, rt, &stored, 42), "{obj}");
            let written: Value = serde_json::from_slice(&out[6..]).unwrap();
            assert_eq!(written, decode(rt, &stored, 42).unwrap(), "{obj}");
        }
    }

    #[test]
    fn bytes_that_are_not_an_object_with_object_metadata_are_left_to_decode() {
        use berth_api::resources::PODS;
        for stored in [&b"not json"[..], b"[1]", b"{\"metadata\":[]}", b"{\"spec\":{}}", b"{\"metadata\":{}"] {
            let mut out = b"kept".to_vec();
            assert!(!write_served(&mut out, &PODS, stored, 1), "{}", String::from_utf8_lossy(stored));
            assert_eq!(out, b"kept");
        }
        let mut out = Vec::new();
        assert!(!write_served(&mut out, &EVENTS_V1, b"{\"metadata\":{}}", 1), "a converted view");
    }

    #[test]
    fn content_is_the_same_whatever_the_resource_version_and_managed_fields() {
        let a = json!({"metadata": {"name": "a", "resourceVersion": "1", "managedFields": [1]}, "spec": {"x": 1}});
        let b = json!({"metadata": {"name": "a", "resourceVersion": "2"}, "spec": {"x": 1}});
        assert!(same_content(&a, &b));
        assert!(same_content(&b, &a));
    }

    #[test]
    fn content_differs_by_any_other_field_or_a_missing_one() {
        let a = json!({"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"x": 1}});
        for b in [
            json!({"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"x": 2}}),
            json!({"metadata": {"name": "a", "resourceVersion": "1", "labels": {}}, "spec": {"x": 1}}),
            json!({"metadata": {"name": "b"}, "spec": {"x": 1}}),
            json!({"metadata": {"name": "a"}}),
            json!({"spec": {"x": 1}}),
            json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "status": {}}),
        ] {
            assert!(!same_content(&a, &b), "{b}");
            assert!(!same_content(&b, &a), "{b}");
        }
    }
}
