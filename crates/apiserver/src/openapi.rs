//! OpenAPI documents, as much as clients need: kubectl reads `/openapi/v3` to learn that the
//! server validates fields itself (`fieldValidation`), and falls back to its compiled-in types
//! for strategic merge patches when a schema is absent.

use axum::Json;
use axum::extract::Path;
use berth_api::resources::{self, ALL};
use serde_json::{Value, json};

use crate::ApiError;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// Changes whenever the served documents change, so clients' caches are refreshed.
const DOC_HASH: &str = concat!("berth-", env!("CARGO_PKG_VERSION"), "-1");

pub async fn v3_index() -> Json<Value> {
    let mut paths = serde_json::Map::new();
    for (g, v) in resources::groups() {
        let p = gv_path(g, v);
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={DOC_HASH}")}));
    }
    Json(json!({"paths": paths}))
}

pub async fn v3_document(Path(path): Path<String>) -> Result<Json<Value>, ApiError> {
    let (group, version) = match path.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource")),
    };
    if !resources::groups().iter().any(|(g, v)| *g == group && *v == version) {
        return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
    }
    Ok(Json(group_document(&group, &version)))
}

fn query_param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn group_document(group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for rt in ALL.iter().filter(|r| r.group == group && r.version == version) {
        let gvk = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
        let base = format!("/{}", gv_path(group, version));
        let item = if rt.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{base}/{}/{{name}}", rt.plural)
        };
        let params = json!([query_param("dryRun"), query_param("fieldManager"), query_param("fieldValidation")]);
        let op = |id: &str| {
            json!({
                "operationId": format!("{id}{}", rt.kind),
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": id,
                "x-kubernetes-group-version-kind": gvk,
            })
        };
        paths.insert(item, json!({"patch": op("patch"), "put": op("replace"), "get": op("read")}));
        let collection = if rt.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", rt.plural)
        } else {
            format!("{base}/{}", rt.plural)
        };
        paths.insert(collection, json!({"post": op("create")}));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": crate::KUBE_GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    })
}

/// A valid but schema-less Swagger 2.0 document: clients find no model and use their own types.
pub async fn v2() -> Json<Value> {
    Json(json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": crate::KUBE_GIT_VERSION},
        "paths": {},
        "definitions": {},
    }))
}
