//! What a resource request asks for: the target (resource, namespace, name, subresource), query
//! options, the decoded body, and the response format the client accepts.

use std::collections::HashMap;

use axum::body::Body;
use berth_api::ResourceType;
use berth_api::resources;
use http::HeaderMap;
use serde_json::Value;

use crate::{ApiError, MAX_BODY_BYTES};

/// The object or collection a request addresses.
#[derive(Debug, Clone)]
pub struct Target {
    pub rt: &'static ResourceType,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

fn not_found() -> ApiError {
    ApiError::new(404, "NotFound", "the server could not find the requested resource")
}

/// Parses the path after `/api/v1/` or `/apis/<g>/<v>/`.
pub fn parse_target(group: &str, version: &str, rest: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    let find = |plural: &str| resources::find(group, version, plural).ok_or_else(not_found);
    let target = |rt, ns: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
        rt,
        namespace: ns.map(str::to_string),
        name: name.map(str::to_string),
        subresource: sub.map(str::to_string),
    };
    let t = match segs.as_slice() {
        [plural] => target(find(plural)?, None, None, None),
        ["namespaces", ns, plural] if !matches!(*plural, "status" | "finalize") || !group.is_empty() => {
            let rt = find(plural)?;
            if !rt.namespaced {
                return Err(not_found());
            }
            target(rt, Some(ns), None, None)
        }
        ["namespaces", ns, plural, name] => {
            let rt = find(plural)?;
            if !rt.namespaced {
                return Err(not_found());
            }
            target(rt, Some(ns), Some(name), None)
        }
        ["namespaces", ns, plural, name, sub] => {
            let rt = find(plural)?;
            if !rt.namespaced {
                return Err(not_found());
            }
            target(rt, Some(ns), Some(name), Some(sub))
        }
        [plural, name] => {
            let rt = find(plural)?;
            if rt.namespaced {
                return Err(not_found());
            }
            target(rt, None, Some(name), None)
        }
        [plural, name, sub] => {
            let rt = find(plural)?;
            if rt.namespaced {
                return Err(not_found());
            }
            target(rt, None, Some(name), Some(sub))
        }
        _ => return Err(not_found()),
    };
    if let Some(sub) = &t.subresource {
        let ok = match sub.as_str() {
            "status" => t.rt.has_status,
            "scale" => t.rt.has_scale,
            "binding" => t.rt.kind == "Pod",
            "finalize" => t.rt.kind == "Namespace",
            _ => false,
        };
        if !ok {
            return Err(not_found());
        }
    }
    Ok(t)
}

/// Query parameters, last value wins.
#[derive(Debug, Default, Clone)]
pub struct Query(pub HashMap<String, String>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        Query(url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()).into_owned().collect())
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
    pub fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        self.get(k)
            .map(|v| v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid value for {k}: {v:?}"))))
            .transpose()
    }
}

/// How unknown fields in a body are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn from_query(q: &Query) -> Result<Self, ApiError> {
        match q.get("fieldValidation") {
            None | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}. Must be one of: Ignore, Warn, Strict"
            ))),
        }
    }
}

/// Reads the body up to the 3 MiB limit (413 above it).
pub async fn read_body(body: Body) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        let mut src: Option<&dyn std::error::Error> = Some(&e);
        while let Some(err) = src {
            if err.is::<http_body_util::LengthLimitError>() {
                return ApiError::too_large();
            }
            src = err.source();
        }
        ApiError::bad_request(format!("failed to read request body: {e}"))
    })
}

pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Decodes a JSON or YAML body into a value (a JSON object is required).
pub fn decode_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type(headers);
    let value: Value = match ct.as_str() {
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?,
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body)
            .map_err(|e| ApiError::bad_request(format!("failed to decode protobuf body: {e}")))?,
        _ => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}")))?,
    };
    if !value.is_object() {
        return Err(ApiError::bad_request("couldn't get version/kind; json parse error: expected an object"));
    }
    Ok(value)
}

/// Paths of the fields a JSON body names twice in one object (`spec.replicas`,
/// `spec.containers[0].image`), in the order met; decoding keeps the last value, as Go's does.
/// Other media types (YAML refuses duplicate keys when decoding) have none here.
pub fn duplicate_fields(headers: &HeaderMap, body: &[u8]) -> Vec<String> {
    let ct = content_type(headers);
    if !matches!(ct.as_str(), "" | "application/json" | "*/*") {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    // A body that does not parse is rejected by `decode_body` with its own message.
    let _ = serde::de::DeserializeSeed::deserialize(DuplicateScan { path: String::new(), out: &mut out }, &mut de);
    out
}

/// Walks a JSON document, noting keys met twice in one object.
struct DuplicateScan<'a> {
    path: String,
    out: &'a mut Vec<String>,
}

impl<'de> serde::de::DeserializeSeed<'de> for DuplicateScan<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DuplicateScan<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(DuplicateScan { path: format!("{}[{i}]", self.path), out: &mut *self.out })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() { key.clone() } else { format!("{}.{key}", self.path) };
            if !seen.insert(key) {
                self.out.push(path.clone());
            }
            map.next_value_seed(DuplicateScan { path, out: &mut *self.out })?;
        }
        Ok(())
    }
}

/// The response shape the client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Object,
    Table,
    PartialMetadata,
}

pub fn output(headers: &HeaderMap) -> Output {
    let accept = headers.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    // Clients list preferences in order; take the first media range we can serve.
    for range in accept.split(',') {
        let params: Vec<&str> = range.split(';').map(str::trim).collect();
        let media = params.first().copied().unwrap_or("");
        if media != "application/json" && media != "*/*" && media != "application/*" {
            continue;
        }
        let get = |k: &str| params.iter().find_map(|p| p.strip_prefix(k).and_then(|v| v.strip_prefix('=')));
        match (get("as"), get("g"), get("v")) {
            (None, _, _) => return Output::Object,
            (Some("Table"), Some("meta.k8s.io"), Some("v1" | "v1beta1")) => return Output::Table,
            (
                Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                Some("meta.k8s.io"),
                Some("v1" | "v1beta1"),
            ) => {
                return Output::PartialMetadata;
            }
            _ => continue,
        }
    }
    Output::Object
}

/// Checks a body's `apiVersion` and `kind` against the endpoint's, filling in the absent ones, with
/// kube-apiserver's messages for a mismatch.
pub(crate) fn check_type_meta(obj: &mut Value, api_version: &str, kind: &str) -> Result<(), ApiError> {
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        Some(_) => {}
        None => obj["apiVersion"] = serde_json::json!(api_version),
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != kind => Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): kind {k:?} does not match"
        ))),
        Some(_) => Ok(()),
        None => {
            obj["kind"] = serde_json::json!(kind);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_object_paths_are_parsed() {
        let t = parse_target("", "v1", "namespaces/default/pods/web/status").unwrap();
        assert_eq!(t.rt.plural, "pods");
        assert_eq!(t.namespace.as_deref(), Some("default"));
        assert_eq!(t.name.as_deref(), Some("web"));
        assert_eq!(t.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn namespace_subresources_are_not_mistaken_for_collections() {
        let t = parse_target("", "v1", "namespaces/foo/finalize").unwrap();
        assert_eq!(t.rt.plural, "namespaces");
        assert_eq!(t.name.as_deref(), Some("foo"));
        assert_eq!(t.subresource.as_deref(), Some("finalize"));
        let t = parse_target("", "v1", "namespaces/foo").unwrap();
        assert_eq!(t.name.as_deref(), Some("foo"));
    }

    #[test]
    fn cluster_scoped_resources_reject_namespaced_paths() {
        assert!(parse_target("node.k8s.io", "v1", "namespaces/x/runtimeclasses").is_err());
        assert!(parse_target("node.k8s.io", "v1", "runtimeclasses/gvisor").is_ok());
        assert!(parse_target("", "v1", "pods/x").is_err());
    }

    #[test]
    fn fields_named_twice_are_found_at_every_depth_with_their_paths() {
        let body = br#"{"spec": {"replicas": 2, "replicas": 3, "template": {"spec": {"containers": [{"name": "a", "image": "x", "image": "y"}]}}}, "kind": "Deployment"}"#;
        assert_eq!(
            duplicate_fields(&HeaderMap::new(), body),
            vec!["spec.replicas".to_string(), "spec.template.spec.containers[0].image".to_string()]
        );
        let unique = br#"{"a": {"b": 1}, "c": {"b": 2}}"#;
        assert!(duplicate_fields(&HeaderMap::new(), unique).is_empty());
    }

    #[test]
    fn kubectl_table_accept_header_selects_tables() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
                .parse()
                .unwrap(),
        );
        assert_eq!(output(&h), Output::Table);
        h.insert(http::header::ACCEPT, "application/json".parse().unwrap());
        assert_eq!(output(&h), Output::Object);
    }
}
