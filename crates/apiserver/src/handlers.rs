//! The REST verbs on every resource: get, list, create, update, patch, delete, deletecollection,
//! and the `status`, `scale`, `binding` and `finalize` subresources.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use berth_api::resources::{NAMESPACES, PODS, SERVICES};
use berth_api::selector::{FieldSelector, LabelSelector};
use berth_api::{FieldError, ResourceType, kinds};
use berth_store::{ListOptions, StoreError};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use crate::objects::{self, meta_mut};
use crate::request::{self, FieldValidation, Output, Query, Target};
use crate::{ApiError, ApiResult, ApiState, admission, delete, services, watch};

/// `/api/v1/...`
pub async fn core_entry(
    State(state): State<Arc<ApiState>>,
    Path(rest): Path<String>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    entry(state, "", "v1", &rest, method, query, headers, body).await
}

/// `/apis/<group>/<version>/...`
pub async fn group_entry(
    State(state): State<Arc<ApiState>>,
    Path((group, version, rest)): Path<(String, String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    entry(state, &group, &version, &rest, method, query, headers, body).await
}

#[allow(clippy::too_many_arguments)]
async fn entry(
    state: Arc<ApiState>,
    group: &str,
    version: &str,
    rest: &str,
    method: Method,
    query: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let target = match request::parse_target(group, version, rest) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let q = Query::parse(query.as_deref());
    let verb = verb_name(&method, &target, &q);
    let resource = match &target.subresource {
        Some(s) => format!("{}/{s}", target.rt.plural),
        None => target.rt.plural.to_string(),
    };
    let result = dispatch(&state, &target, method, &q, &headers, body).await;
    let response = match result {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(verb, resource, code = e.code, message = %e.message, "request failed");
            e.into_response()
        }
    };
    if verb != "watch" {
        state.metrics.observe_request(verb, &resource, response.status().as_u16(), started.elapsed());
    }
    response
}

fn verb_name(method: &Method, t: &Target, q: &Query) -> &'static str {
    match *method {
        Method::GET if t.name.is_none() && q.flag("watch") => "watch",
        Method::GET if t.name.is_none() => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if t.name.is_none() => "deletecollection",
        Method::DELETE => "delete",
        _ => "other",
    }
}

async fn dispatch(
    state: &Arc<ApiState>,
    t: &Target,
    method: Method,
    q: &Query,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let out = request::output(headers);
    match (&method, t.name.as_deref(), t.subresource.as_deref()) {
        (&Method::GET, None, None) if q.flag("watch") => watch::serve(state.clone(), t.clone(), q.clone(), out).await,
        (&Method::GET, None, None) => list(state, t, q, headers, out).await,
        (&Method::GET, Some(_), Some("scale")) => get_scale(state, t).await,
        (&Method::GET, Some(_), _) => get(state, t, out).await,
        (&Method::POST, None, None) => create(state, t, q, headers, &request::read_body(body).await?).await,
        (&Method::POST, Some(_), Some("binding")) => bind(state, t, q, headers, &request::read_body(body).await?).await,
        (&Method::PUT, Some(_), Some("scale")) => {
            let body = request::decode_body(headers, &request::read_body(body).await?)?;
            update_scale(state, t, q, ScaleChange::Replace(body)).await
        }
        (&Method::PUT, Some(_), sub) => {
            let bytes = request::read_body(body).await?;
            update(state, t, q, headers, &bytes, sub).await
        }
        (&Method::PATCH, Some(_), Some("scale")) => {
            let bytes = request::read_body(body).await?;
            update_scale(state, t, q, ScaleChange::Patch(request::content_type(headers), bytes.to_vec())).await
        }
        (&Method::PATCH, Some(_), sub @ (None | Some("status"))) => {
            let bytes = request::read_body(body).await?;
            patch(state, t, q, headers, &bytes, sub).await
        }
        (&Method::DELETE, Some(_), None) => delete::delete(state, t, q, &request::read_body(body).await?).await,
        (&Method::DELETE, None, None) => delete::delete_collection(state, t, q, &request::read_body(body).await?).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
            t.rt.plural
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - {w:?}");
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append("warning", v);
        }
    }
    r
}

fn render_one(rt: &ResourceType, obj: Value, out: Output) -> Value {
    match out {
        Output::Object => obj,
        Output::Table => {
            let rv = objects::resource_version(&obj).unwrap_or("").to_string();
            crate::watch::table(rt, std::slice::from_ref(&obj), &rv, None, true)
        }
        Output::PartialMetadata => partial_metadata(&obj),
    }
}

pub(crate) fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": objects::meta(obj),
    })
}

pub(crate) async fn load(state: &ApiState, t: &Target, name: &str) -> ApiResult<(Value, i64)> {
    let key = objects::key(t.rt, t.namespace.as_deref(), name);
    let started = Instant::now();
    let kv = state.store.get(&key).await.map_err(|e| ApiError::from_store(e, t.rt, name))?;
    state.metrics.observe_store("get", started.elapsed());
    let kv = kv.ok_or_else(|| ApiError::not_found(t.rt, name))?;
    Ok((objects::decode_kv(t.rt, &kv)?, kv.mod_revision))
}

async fn get(state: &ApiState, t: &Target, out: Output) -> ApiResult<Response> {
    let name = t.name.as_deref().unwrap_or_default();
    let (obj, _) = load(state, t, name).await?;
    Ok(json_response(StatusCode::OK, &render_one(t.rt, obj, out)))
}

/// Parsed `labelSelector` and `fieldSelector`, with field names checked against the resource.
pub(crate) struct Selectors {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Selectors {
    pub(crate) fn from_query(rt: &ResourceType, q: &Query) -> ApiResult<Self> {
        let labels = q
            .get("labelSelector")
            .map(LabelSelector::parse)
            .transpose()
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let fields = q
            .get("fieldSelector")
            .map(FieldSelector::parse)
            .transpose()
            .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?;
        if let Some(f) = &fields {
            let supported = kinds::supported_fields(rt);
            for field in f.fields() {
                if !supported.contains(&field) {
                    return Err(ApiError::bad_request(format!("field label not supported: {field}")));
                }
            }
        }
        Ok(Selectors { labels, fields })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.labels.as_ref().is_none_or(LabelSelector::is_empty)
            && self.fields.as_ref().is_none_or(FieldSelector::is_empty)
    }

    /// The node a pod watch selects when its selectors say nothing else: `spec.nodeName=NODE`
    /// alone, as every node agent's watch is. Such a watch needs no decoded object.
    pub(crate) fn node_alone(&self, rt: &ResourceType) -> Option<&str> {
        if !std::ptr::eq(rt, &berth_api::resources::PODS) {
            return None;
        }
        let terms = self.fields.as_ref()?.terms();
        match terms {
            [t] if !t.not && t.field == "spec.nodeName" && self.labels.as_ref().is_none_or(LabelSelector::is_empty) => {
                Some(&t.value)
            }
            _ => None,
        }
    }

    pub(crate) fn matches(&self, rt: &ResourceType, obj: &Value) -> bool {
        self.labels.as_ref().is_none_or(|l| l.matches(&objects::labels(obj)))
            && self.fields.as_ref().is_none_or(|f| f.matches(&kinds::field_set(rt, obj)))
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: i64,
    start: String,
}

fn encode_continue(rv: i64, start: &str) -> String {
    use base64::Engine;
    let json = serde_json::to_vec(&ContinueToken { rv, start: start.to_string() }).expect("serializable");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

fn decode_continue(token: &str) -> ApiResult<ContinueToken> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| ApiError::bad_request("continue key is not valid: illegal base64 data"))
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response to the next list request.";

/// One page of a list: matching objects, the snapshot revision, and where the next page starts.
pub(crate) struct Page {
    pub items: Vec<Value>,
    pub revision: i64,
    pub next: Option<String>,
}

pub(crate) async fn list_objects(
    state: &ApiState,
    t: &Target,
    sel: &Selectors,
    limit: Option<i64>,
    cont: Option<&str>,
) -> ApiResult<Page> {
    let prefix = objects::prefix(t.rt, t.namespace.as_deref());
    let (mut revision, mut start) = match cont {
        Some(c) => {
            let tok = decode_continue(c)?;
            if !tok.start.starts_with(&prefix) {
                return Err(ApiError::bad_request("continue key is not valid: key is not under the requested prefix"));
            }
            (Some(tok.rv), Some(tok.start))
        }
        None => (None, None),
    };
    let limit = limit.filter(|l| *l > 0).map(|l| l as usize);
    let mut items = Vec::new();
    let started = Instant::now();
    loop {
        let chunk = limit.map(|l| (l - items.len()).max(if sel.is_empty() { 1 } else { 256 }));
        let opts = ListOptions { revision, start_key: start.clone(), limit: chunk };
        let res = state.store.list(&prefix, &opts).await.map_err(|e| match e {
            StoreError::Compacted { .. } if cont.is_some() => ApiError::gone(CONTINUE_EXPIRED),
            e => ApiError::from_store(e, t.rt, ""),
        })?;
        revision = Some(res.revision);
        let mut stopped_at: Option<String> = None;
        let n = res.items.len();
        for (i, kv) in res.items.iter().enumerate() {
            if limit.is_some_and(|l| items.len() >= l) {
                stopped_at = Some(kv.key.clone());
                break;
            }
            let obj = objects::decode_kv(t.rt, kv)?;
            if sel.matches(t.rt, &obj) {
                items.push(obj);
            }
            if i + 1 == n && res.more {
                stopped_at = Some(objects::key_after(&kv.key));
            }
        }
        state.metrics.observe_store("list", started.elapsed());
        let rev = res.revision;
        match stopped_at {
            // The page is full: the next one starts at the first key not returned.
            Some(next) if limit.is_some_and(|l| items.len() >= l) => {
                return Ok(Page { items, revision: rev, next: Some(encode_continue(rev, &next)) });
            }
            Some(next) => start = Some(next),
            None => return Ok(Page { items, revision: rev, next: None }),
        }
    }
}

async fn list(state: &Arc<ApiState>, t: &Target, q: &Query, headers: &HeaderMap, out: Output) -> ApiResult<Response> {
    let sel = Selectors::from_query(t.rt, q)?;
    let include_object = q.get("includeObject") != Some("None");
    if q.int("limit")?.is_none_or(|l| l <= 0) && q.get("continue").is_none() {
        let protobuf = crate::negotiation::Accept::from_headers(headers).protobuf;
        return crate::list_stream::serve(state, t, sel, out, protobuf, include_object).await;
    }
    let page = list_objects(state, t, &sel, q.int("limit")?, q.get("continue")).await?;
    let rv = page.revision.to_string();
    let body = match out {
        Output::Table => watch::table(t.rt, &page.items, &rv, page.next.as_deref(), include_object),
        Output::PartialMetadata => {
            let items: Vec<Value> = page.items.iter().map(partial_metadata).collect();
            let mut m = json!({"resourceVersion": rv});
            if let Some(c) = &page.next {
                m["continue"] = json!(c);
            }
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": m, "items": items})
        }
        Output::Object => {
            let mut m = json!({"resourceVersion": rv});
            if let Some(c) = &page.next {
                m["continue"] = json!(c);
            }
            json!({"kind": t.rt.list_kind(), "apiVersion": t.rt.api_version(), "metadata": m, "items": page.items})
        }
    };
    Ok(json_response(StatusCode::OK, &body))
}

// ---------------------------------------------------------------------------------------------
// Decoding and checking a written object

/// Paths of fields in `input` that decoding as the kind dropped: unknown fields.
fn unknown_fields(input: &Value, decoded: &Value, path: &str, out: &mut Vec<String>) {
    match (input, decoded) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match b.get(k) {
                    None if !v.is_null() => out.push(p),
                    Some(d) => unknown_fields(v, d, &p, out),
                    None => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                unknown_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Checks `apiVersion`/`kind` against the endpoint and decodes the body as the kind. Returns the
/// normalised object and the warnings for unknown fields and for the `duplicates` the body named
/// twice (an error under `Strict`).
pub(crate) fn check_object(
    rt: &ResourceType,
    mut obj: Value,
    duplicates: &[String],
    fv: FieldValidation,
) -> ApiResult<(Value, Vec<String>)> {
    crate::request::check_type_meta(&mut obj, &rt.api_version(), rt.kind)?;
    let handled_as = |why: String| {
        ApiError::bad_request(format!(
            "{} in version {:?} cannot be handled as a {}: {why}",
            rt.kind, rt.version, rt.kind
        ))
    };
    let decoded = rt.roundtrip(&obj).map_err(handled_as)?;
    let mut unknown = Vec::new();
    if fv != FieldValidation::Ignore {
        unknown_fields(&obj, &decoded, "", &mut unknown);
    }
    let mut warnings: Vec<String> = unknown.iter().map(|p| format!("unknown field {p:?}")).collect();
    if fv != FieldValidation::Ignore {
        warnings.extend(duplicates.iter().map(|p| format!("duplicate field {p:?}")));
    }
    if fv == FieldValidation::Strict && !warnings.is_empty() {
        return Err(handled_as(format!("strict decoding error: {}", warnings.join(", "))));
    }
    Ok((decoded, warnings))
}

const NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Tries of a create whose generated name is taken, the first included (kube-apiserver's).
const GENERATE_NAME_ATTEMPTS: u32 = 8;

fn generate_name(base: &str) -> String {
    let id = uuid::Uuid::new_v4();
    let suffix: String =
        id.as_bytes().iter().take(5).map(|b| NAME_CHARS[*b as usize % NAME_CHARS.len()] as char).collect();
    let base = if base.len() > 58 { &base[..58] } else { base };
    format!("{base}{suffix}")
}

// ---------------------------------------------------------------------------------------------
// Writing

async fn create(state: &ApiState, t: &Target, q: &Query, headers: &HeaderMap, body: &[u8]) -> ApiResult<Response> {
    let fv = FieldValidation::from_query(q)?;
    let duplicates = request::duplicate_fields(headers, body);
    let (mut obj, warnings) = check_object(t.rt, request::decode_body(headers, body)?, &duplicates, fv)?;
    let rt = t.rt;
    // The `generateName` base, when the name was generated here.
    let mut generated = None;
    {
        let m = meta_mut(&mut obj);
        let given_ns = m.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
        match (&t.namespace, given_ns) {
            (Some(url_ns), Some(ns)) if *url_ns != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            (Some(url_ns), _) if rt.namespaced => {
                m.insert("namespace".into(), json!(url_ns));
            }
            (None, _) if rt.namespaced => {
                return Err(ApiError::bad_request(format!(
                    "the server could not find the requested resource: {} must be created in a namespace",
                    rt.plural
                )));
            }
            _ => {
                m.remove("namespace");
            }
        }
        let name = m.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        let generate = m.get("generateName").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty() && !generate.is_empty() {
            m.insert("name".into(), json!(generate_name(&generate)));
            generated = Some(generate);
        }
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert("creationTimestamp".into(), json!(berth_common::time::now_rfc3339()));
        for k in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
            m.remove(k);
        }
    }
    let mut name = objects::name(&obj).to_string();
    if name.is_empty() {
        let e = FieldError::required("metadata.name", "name or generateName is required");
        return Err(ApiError::invalid(rt, "", &[e]));
    }
    kinds::prepare_for_create(rt, &mut obj);
    admission::create(state, t, &mut obj, |obj| {
        let errors = kinds::validate_create(rt, obj);
        if errors.is_empty() { Ok(()) } else { Err(ApiError::invalid(rt, &name, &errors)) }
    })
    .await?;
    if q.dry_run() {
        return Ok(with_warnings(json_response(StatusCode::CREATED, &obj), &warnings));
    }
    let claimed =
        if std::ptr::eq(rt, &SERVICES) { services::allocate(state, &mut obj, None).await? } else { Vec::new() };
    let started = Instant::now();
    let mut attempts = 1;
    let kv = loop {
        let key = objects::key(rt, t.namespace.as_deref(), &name);
        match state.store.create(&key, objects::encode(rt, &obj)).await {
            Ok(kv) => break kv,
            // A generated name that is taken is generated again, as kube-apiserver does
            // (RetryGenerateName): five random characters collide among tens of thousands of pods.
            Err(StoreError::AlreadyExists { .. }) if attempts < GENERATE_NAME_ATTEMPTS && generated.is_some() => {
                attempts += 1;
                name = generate_name(generated.as_deref().unwrap_or_default());
                meta_mut(&mut obj).insert("name".into(), json!(name));
            }
            Err(e) => {
                services::undo(state, &claimed).await;
                return Err(ApiError::from_store(e, rt, &name));
            }
        }
    };
    state.metrics.observe_store("create", started.elapsed());
    objects::set_resource_version(&mut obj, kv.mod_revision);
    Ok(with_warnings(json_response(StatusCode::CREATED, &obj), &warnings))
}

/// What an update may not change in metadata: carried over from the stored object.
fn keep_system_metadata(new: &mut Value, old: &Value) {
    let old_meta = objects::meta(old).clone();
    let m = meta_mut(new);
    for k in
        ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "generateName"]
    {
        match old_meta.get(k) {
            Some(v) => {
                m.insert(k.into(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
}

/// The object is being deleted and nothing holds it any more: it can leave the store.
pub(crate) fn ready_to_remove(rt: &ResourceType, obj: &Value) -> bool {
    if !objects::is_deleting(obj) || !objects::finalizers(obj).is_empty() {
        return false;
    }
    if std::ptr::eq(rt, &NAMESPACES) {
        let spec_finalizers = obj.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        return !spec_finalizers;
    }
    if std::ptr::eq(rt, &PODS) {
        // A pod with grace left waits for its node to confirm (a delete with grace 0).
        let grace = objects::meta(obj).get("deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
        return grace == 0;
    }
    true
}

/// Writes `new` over `old` (revision `rev`) and removes it if it is finished deleting.
pub(crate) async fn write_update(
    state: &ApiState,
    t: &Target,
    name: &str,
    mut new: Value,
    old: &Value,
    rev: i64,
    dry_run: bool,
) -> ApiResult<Value> {
    let rt = t.rt;
    if objects::same_content(&new, old) {
        return Ok(old.clone());
    }
    if dry_run {
        return Ok(new);
    }
    let key = objects::key(rt, t.namespace.as_deref(), name);
    if ready_to_remove(rt, &new) {
        let started = Instant::now();
        let deleted = state.store.delete(&key, Some(rev)).await.map_err(|e| ApiError::from_store(e, rt, name))?;
        state.metrics.observe_store("delete", started.elapsed());
        objects::set_resource_version(&mut new, deleted.revision);
        return Ok(new);
    }
    let started = Instant::now();
    let kv = state
        .store
        .update(&key, objects::encode(rt, &new), rev)
        .await
        .map_err(|e| ApiError::from_store(e, rt, name))?;
    state.metrics.observe_store("update", started.elapsed());
    objects::set_resource_version(&mut new, kv.mod_revision);
    Ok(new)
}

/// Shared by PUT and PATCH: turns the client's `new` into what is written over `old`.
fn prepare_update(rt: &ResourceType, mut new: Value, old: &Value, sub: Option<&str>) -> Value {
    match sub {
        Some("status") if kinds::status_update_takes_metadata(rt) => {
            // Everything but the spec goes through, as on the main resource.
            keep_system_metadata(&mut new, old);
            kinds::prepare_for_status_update(rt, &mut new, old);
            let generation = old.pointer("/metadata/generation").cloned();
            let m = meta_mut(&mut new);
            match generation {
                Some(g) => m.insert("generation".into(), g),
                None => m.remove("generation"),
            };
        }
        Some("status") => {
            // Only status changes through /status.
            let status = new.get("status").cloned();
            let rv = objects::resource_version(&new).map(str::to_string);
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            if let Some(rv) = rv {
                meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
            }
        }
        Some("finalize") => {
            let finalizers = new.pointer("/spec/finalizers").cloned();
            let rv = objects::resource_version(&new).map(str::to_string);
            new = old.clone();
            new["spec"]["finalizers"] = finalizers.unwrap_or(json!([]));
            if let Some(rv) = rv {
                meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
            }
        }
        _ => {
            keep_system_metadata(&mut new, old);
            if rt.has_status {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(o) = new.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            kinds::prepare_for_update(rt, &mut new, old);
        }
    }
    new
}

/// Shared by PUT and PATCH: the kind's validation of an update of the main resource (the
/// `status` and `finalize` subresources change only what their preparation let through, but a
/// status update that takes metadata changes has them validated as on the main resource).
fn validate_update(rt: &ResourceType, new: &Value, old: &Value, sub: Option<&str>) -> ApiResult<()> {
    let metadata_changes = sub == Some("status") && kinds::status_update_takes_metadata(rt);
    if matches!(sub, Some("status" | "finalize")) && !metadata_changes {
        return Ok(());
    }
    let errors = kinds::validate_update(rt, new, old);
    if errors.is_empty() { Ok(()) } else { Err(ApiError::invalid(rt, objects::name(old), &errors)) }
}

/// A Service whose main resource changes may need a new cluster IP or node ports.
async fn allocate_on_update(
    state: &ApiState,
    rt: &ResourceType,
    new: &mut Value,
    old: &Value,
    sub: Option<&str>,
    dry_run: bool,
) -> ApiResult<Vec<String>> {
    if !std::ptr::eq(rt, &SERVICES) || sub.is_some() || dry_run {
        return Ok(Vec::new());
    }
    services::allocate(state, new, Some(old)).await
}

fn check_precondition(rt: &ResourceType, name: &str, new: &Value, current_rev: i64) -> ApiResult<()> {
    if objects::resource_version(new).is_some_and(|rv| rv != current_rev.to_string()) {
        return Err(ApiError::conflict(rt, name));
    }
    Ok(())
}

async fn update(
    state: &ApiState,
    t: &Target,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
    sub: Option<&str>,
) -> ApiResult<Response> {
    let rt = t.rt;
    let name = t.name.as_deref().unwrap_or_default();
    let fv = FieldValidation::from_query(q)?;
    let duplicates = request::duplicate_fields(headers, body);
    let (new, warnings) = check_object(rt, request::decode_body(headers, body)?, &duplicates, fv)?;
    let body_name = objects::name(&new);
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if let (Some(url_ns), Some(ns)) = (&t.namespace, objects::meta_str(&new, "namespace"))
        && url_ns != ns
    {
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let (old, rev) = load(state, t, name).await?;
    check_precondition(rt, name, &new, rev)?;
    let mut new = prepare_update(rt, new, &old, sub);
    admission::update(state, t, &old, &mut new, |new| validate_update(rt, new, &old, sub)).await?;
    let claimed = allocate_on_update(state, rt, &mut new, &old, sub, q.dry_run()).await?;
    let written = match write_update(state, t, name, new, &old, rev, q.dry_run()).await {
        Ok(w) => w,
        Err(e) => {
            services::undo(state, &claimed).await;
            return Err(e);
        }
    };
    Ok(with_warnings(json_response(StatusCode::OK, &written), &warnings))
}

pub(crate) fn apply_patch(rt: &ResourceType, content_type: &str, original: &Value, patch: &[u8]) -> ApiResult<Value> {
    let parse = |b: &[u8]| -> ApiResult<Value> {
        serde_json::from_slice(b).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
    };
    match content_type {
        "application/merge-patch+json" => {
            let p = parse(patch)?;
            let mut out = original.clone();
            json_patch::merge(&mut out, &p);
            Ok(out)
        }
        "application/json-patch+json" => {
            let p: json_patch::Patch = serde_json::from_slice(patch)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let mut out = original.clone();
            json_patch::patch(&mut out, &p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            Ok(out)
        }
        "application/strategic-merge-patch+json" => {
            let p = parse(patch)?;
            berth_api::strategic_merge::apply(rt, original, &p).map_err(ApiError::bad_request)
        }
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "server-side apply is not supported by this server yet; use client-side apply",
        )),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

async fn patch(
    state: &ApiState,
    t: &Target,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
    sub: Option<&str>,
) -> ApiResult<Response> {
    let rt = t.rt;
    let name = t.name.as_deref().unwrap_or_default();
    let fv = FieldValidation::from_query(q)?;
    let ct = request::content_type(headers);
    for _attempt in 0..16 {
        let (old, rev) = load(state, t, name).await?;
        let patched = apply_patch(rt, &ct, &old, body)?;
        let (mut new, warnings) = check_object(rt, patched, &[], fv)?;
        // A patch that names a resourceVersion is a precondition; otherwise retry on conflict.
        let explicit_rv = objects::resource_version(&new).is_some_and(|v| v != rev.to_string());
        if explicit_rv {
            return Err(ApiError::conflict(rt, name));
        }
        if objects::name(&new) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                objects::name(&new)
            )));
        }
        objects::set_resource_version(&mut new, rev);
        let mut new = prepare_update(rt, new, &old, sub);
        admission::update(state, t, &old, &mut new, |new| validate_update(rt, new, &old, sub)).await?;
        let claimed = allocate_on_update(state, rt, &mut new, &old, sub, q.dry_run()).await?;
        let result = write_update(state, t, name, new, &old, rev, q.dry_run()).await;
        if result.is_err() {
            services::undo(state, &claimed).await;
        }
        match result {
            Ok(written) => return Ok(with_warnings(json_response(StatusCode::OK, &written), &warnings)),
            Err(e) if e.code == 409 && e.reason == "Conflict" => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::conflict(rt, name))
}

// ---------------------------------------------------------------------------------------------
// Subresources

async fn bind(state: &ApiState, t: &Target, q: &Query, headers: &HeaderMap, body: &[u8]) -> ApiResult<Response> {
    let name = t.name.as_deref().unwrap_or_default();
    let mut binding = request::decode_body(headers, body)?;
    let node = binding.pointer("/target/name").and_then(Value::as_str).unwrap_or("").to_string();
    admission::create(state, t, &mut binding, |_| {
        if node.is_empty() {
            return Err(ApiError::invalid(&PODS, name, &[FieldError::required("target.name", "")]));
        }
        Ok(())
    })
    .await?;
    for _ in 0..16 {
        let (old, rev) = load(state, t, name).await?;
        if objects::is_deleting(&old) {
            return Err(ApiError::conflict_with(
                &PODS,
                name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        if let Some(current) = old.pointer("/spec/nodeName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            return Err(ApiError::conflict_with(
                &PODS,
                name,
                &format!("pod {name} is already assigned to node {current:?}"),
            ));
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!(node);
        let conds = new["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
        conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": berth_common::time::now_rfc3339()}));
        new["status"]["conditions"] = json!(conds);
        match write_update(state, t, name, new, &old, rev, q.dry_run()).await {
            Ok(_) => {
                let status =
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
                return Ok(json_response(StatusCode::CREATED, &status));
            }
            Err(e) if e.code == 409 && e.reason == "Conflict" => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::conflict(&PODS, name))
}

fn scale_of(obj: &Value) -> Value {
    let m = objects::meta(obj);
    let selector = obj.pointer("/spec/selector");
    // A replication controller selects with a plain label map; apps/v1 kinds with a LabelSelector.
    let is_label_selector =
        selector.is_some_and(|s| s.get("matchLabels").is_some() || s.get("matchExpressions").is_some());
    let selector = if is_label_selector {
        selector
            .and_then(|s| {
                serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(s.clone()).ok()
            })
            .map(|s| selector_string(&s))
            .unwrap_or_default()
    } else {
        let mut pairs: Vec<String> = selector
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect();
        pairs.sort();
        pairs.join(",")
    };
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m.get("name"), "namespace": m.get("namespace"), "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"), "creationTimestamp": m.get("creationTimestamp"),
        },
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {"replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)), "selector": selector},
    })
}

/// A `metav1.LabelSelector` in query syntax, as `Scale.status.selector` shows it.
fn selector_string(sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> String {
    let mut parts: Vec<String> = sel.match_labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

async fn get_scale(state: &ApiState, t: &Target) -> ApiResult<Response> {
    let (obj, _) = load(state, t, t.name.as_deref().unwrap_or_default()).await?;
    Ok(json_response(StatusCode::OK, &scale_of(&obj)))
}

enum ScaleChange {
    Replace(Value),
    Patch(String, Vec<u8>),
}

async fn update_scale(state: &ApiState, t: &Target, q: &Query, change: ScaleChange) -> ApiResult<Response> {
    let rt = t.rt;
    let name = t.name.as_deref().unwrap_or_default();
    for _ in 0..16 {
        let (old, rev) = load(state, t, name).await?;
        let scale = match &change {
            ScaleChange::Replace(s) => {
                check_precondition(rt, name, s, rev)?;
                s.clone()
            }
            ScaleChange::Patch(ct, p) => {
                let ct =
                    if ct == "application/strategic-merge-patch+json" { "application/merge-patch+json" } else { ct };
                apply_patch(rt, ct, &scale_of(&old), p)?
            }
        };
        let replicas = scale.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                rt,
                name,
                &[FieldError::invalid_raw("spec.replicas", replicas.to_string(), "must be greater than or equal to 0")],
            ));
        }
        let mut new = old.clone();
        new["spec"]["replicas"] = json!(replicas);
        let mut new = prepare_update(rt, new, &old, None);
        admission::update(state, t, &old, &mut new, |new| validate_update(rt, new, &old, None)).await?;
        match write_update(state, t, name, new, &old, rev, q.dry_run()).await {
            Ok(written) => return Ok(json_response(StatusCode::OK, &scale_of(&written))),
            Err(e) if e.code == 409 && matches!(change, ScaleChange::Patch(..)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::conflict(rt, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_reported_with_their_paths() {
        let input = json!({"spec": {"containers": [{"name": "a", "bogus": 1}], "extra": true}, "metadata": {"name": "x", "creationTimestamp": null}});
        let decoded = json!({"spec": {"containers": [{"name": "a"}]}, "metadata": {"name": "x"}});
        let mut out = Vec::new();
        unknown_fields(&input, &decoded, "", &mut out);
        assert_eq!(out, vec!["spec.containers[0].bogus".to_string(), "spec.extra".to_string()]);
    }

    #[test]
    fn generated_names_keep_the_prefix_and_add_five_characters() {
        let n = generate_name("web-");
        assert!(n.starts_with("web-"));
        assert_eq!(n.len(), 9);
    }
}
