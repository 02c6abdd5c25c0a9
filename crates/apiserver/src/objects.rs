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
pub fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        v
    };
    strip(a) == strip(b)
}
