//! Deleting: a request's `DeleteOptions` (grace period, preconditions, dry run, and what becomes
//! of the dependents) and what a delete does to one stored object, as kube-apiserver's generic
//! registry (`registry/generic/registry/store.go`, `registry/rest/delete.go`) and its pod and
//! namespace registries do it.
//!
//! | object                                        | the delete                                                  |
//! |-----------------------------------------------|-------------------------------------------------------------|
//! | namespace, not terminating                    | marks it Terminating; the namespace controller empties and finalizes it |
//! | namespace, terminating with spec finalizers   | changes nothing                                             |
//! | bound, running pod                            | sets the grace period (only ever shortened); the node confirms with grace 0 |
//! | pod whose graceful deletion is pending        | changes nothing (finalizers included), unless the grace is shortened |
//! | anything else                                 | removed at once, unless finalizers hold it                 |
//!
//! The answer is the object while it stays (200; 202 when the legacy `orphanDependents: false`
//! asked for its dependents to go). Once it is gone, pods, services, service accounts and
//! namespaces answer with the object as it was, other kinds with a success `Status` naming it
//! (`ReturnDeletedObject` of the kind's registry).
//!
//! Every delete first settles the garbage collector's finalizers from the request's
//! `propagationPolicy` (or legacy `orphanDependents`), the object's finalizers and the kind's
//! default (`berth_api::deletion`): `Orphan` adds `orphan`, `Foreground` adds
//! `foregroundDeletion`, `Background` takes both away. An object that finalizers hold gets its
//! `deletionTimestamp` (kept if earlier) and grace 0, and leaves the store when an update takes the
//! last finalizer away ([`crate::handlers`]' `write_update`).

use std::time::Instant;

use axum::response::Response;
use berth_api::ResourceType;
use berth_api::deletion::{Cascade, deletion_finalizers, namespace_deletion_finalizers};
use berth_api::kinds;
use berth_api::resources::{NAMESPACES, PODS};
use http::StatusCode;
use serde_json::{Value, json};

use crate::handlers::{Selectors, json_response, list_objects, load, ready_to_remove, write_update};
use crate::objects::{self, meta_mut};
use crate::request::{Query, Target};
use crate::{ApiError, ApiResult, ApiState, admission};

/// `DeleteOptions` as they arrive (a body, or query parameters).
#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireOptions {
    grace_period_seconds: Option<i64>,
    preconditions: Option<Preconditions>,
    dry_run: Option<Vec<String>>,
    orphan_dependents: Option<bool>,
    propagation_policy: Option<String>,
}

/// `DeleteOptions.preconditions`: the object must still be this one.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// A delete request's options, validated.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub preconditions: Option<Preconditions>,
    pub dry_run: bool,
    pub cascade: Cascade,
}

/// Go's `strconv.ParseBool`, which decodes boolean query parameters.
fn parse_bool(key: &str, value: &str) -> ApiResult<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ApiError::bad_request(format!("invalid value for {key}: {value:?}"))),
    }
}

impl DeleteOptions {
    /// The options of a delete: from the body, or from the query when the body is empty, as
    /// kube-apiserver reads them; both cascade options at once or an unknown policy is 422.
    pub fn from_request(q: &Query, body: &[u8]) -> ApiResult<Self> {
        let wire: WireOptions = if body.iter().all(u8::is_ascii_whitespace) {
            WireOptions {
                grace_period_seconds: q.int("gracePeriodSeconds")?,
                dry_run: q.get("dryRun").map(|d| vec![d.to_string()]),
                orphan_dependents: q.get("orphanDependents").map(|v| parse_bool("orphanDependents", v)).transpose()?,
                propagation_policy: q.get("propagationPolicy").map(str::to_string),
                preconditions: None,
            }
        } else if body.starts_with(crate::protobuf::MAGIC) {
            // client-go's default wire format; no JSON body starts with the magic.
            let json = crate::protobuf::decode(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
            serde_json::from_value(json)
                .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
        };
        let cascade = Cascade::from_options(wire.orphan_dependents, wire.propagation_policy.as_deref())
            .map_err(|errors| ApiError::invalid_options("DeleteOptions", &errors))?;
        Ok(DeleteOptions {
            grace_period_seconds: wire.grace_period_seconds,
            preconditions: wire.preconditions,
            dry_run: wire.dry_run.as_ref().is_some_and(|d| d.iter().any(|x| x == "All")),
            cascade,
        })
    }

    /// What the 202 Accepted of Kubernetes is kept for: a delete asking (the legacy way) for its
    /// dependents to go, of an object that stays.
    fn accepted(&self, removed: bool) -> bool {
        !removed && self.cascade == Cascade::OrphanDependents(false)
    }
}

/// What a delete does to the stored object.
#[derive(Debug, Clone, PartialEq)]
enum Plan {
    /// Nothing changes (a pending graceful deletion, a terminating namespace): the answer is the
    /// object as stored.
    Unchanged,
    /// The object stays, marked for those who finish it (its node, the garbage collector, the
    /// namespace controller); written as is (it leaves the store if nothing holds it any more).
    Mark(Value),
    /// The object leaves the store now.
    Remove,
}

/// The grace period of a pod's delete.
enum Grace {
    /// A graceful deletion with no longer grace is under way: nothing changes.
    Pending,
    /// Terminate within this many seconds (0: at once), from now.
    Start(i64),
    /// Already terminating with grace 0: like a kind without graceful deletion.
    Done,
}

/// A pod gets its grace period when it is bound and not finished (the request's, else its
/// `terminationGracePeriodSeconds`); a terminating pod's grace can only be shortened.
fn pod_grace(old: &Value, opts: &DeleteOptions) -> Grace {
    let bound = old.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    let finished = matches!(old.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"));
    let default = old.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(30);
    let grace = if !bound || finished { 0 } else { opts.grace_period_seconds.unwrap_or(default).max(0) };
    if objects::is_deleting(old) {
        match objects::meta(old).get("deletionGracePeriodSeconds").and_then(Value::as_i64) {
            None | Some(0) => return Grace::Done,
            Some(existing) if existing <= grace => return Grace::Pending,
            Some(_) => {}
        }
    }
    Grace::Start(grace)
}

fn bump_generation(obj: &mut Value) {
    let m = meta_mut(obj);
    if let Some(g) = m.get("generation").and_then(Value::as_i64).filter(|g| *g > 0) {
        m.insert("generation".into(), json!(g + 1));
    }
}

/// Marks an object that finalizers hold (`markAsDeleting`): a first deletion moves its
/// generation; the deletion timestamp is now unless it is earlier already; grace 0.
fn mark_as_deleting(obj: &mut Value, now: jiff::Timestamp) {
    let existing = objects::meta(obj).get("deletionTimestamp").and_then(Value::as_str).map(str::to_string);
    if existing.is_none() {
        bump_generation(obj);
    }
    let earlier = existing.as_deref().and_then(|t| t.parse::<jiff::Timestamp>().ok()).is_some_and(|t| t <= now);
    let m = meta_mut(obj);
    if !earlier {
        m.insert("deletionTimestamp".into(), json!(berth_common::time::rfc3339(now)));
    }
    m.insert("deletionGracePeriodSeconds".into(), json!(0));
}

fn set_finalizers(obj: &mut Value, finalizers: &[String]) {
    let m = meta_mut(obj);
    if finalizers.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(finalizers));
    }
}

fn plan(rt: &ResourceType, old: &Value, opts: &DeleteOptions, now: jiff::Timestamp) -> Plan {
    let mut new = old.clone();
    if std::ptr::eq(rt, &NAMESPACES) {
        if !objects::is_deleting(old) {
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(berth_common::time::rfc3339(now)));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            new["status"]["phase"] = json!("Terminating");
            if let Some(finalizers) = namespace_deletion_finalizers(&objects::finalizers(old), opts.cascade) {
                set_finalizers(&mut new, &finalizers);
            }
            return Plan::Mark(new);
        }
        // Until its content is gone and it is finalized, a terminating namespace stays as it is.
        if old.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty()) {
            return Plan::Unchanged;
        }
    }
    let graceful = if std::ptr::eq(rt, &PODS) {
        match pod_grace(old, opts) {
            Grace::Pending => return Plan::Unchanged,
            Grace::Done => false,
            Grace::Start(grace) => {
                if !objects::is_deleting(old) {
                    bump_generation(&mut new);
                }
                let at = now.checked_add(jiff::SignedDuration::from_secs(grace)).unwrap_or(now);
                let m = meta_mut(&mut new);
                m.insert("deletionTimestamp".into(), json!(berth_common::time::rfc3339(at)));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                true
            }
        }
    } else {
        false
    };
    let current = objects::finalizers(old);
    let finalizers = match deletion_finalizers(kinds::garbage_collection_policy(rt), &current, opts.cascade) {
        Some(finalizers) => {
            set_finalizers(&mut new, &finalizers);
            finalizers
        }
        None => current,
    };
    if graceful {
        return if ready_to_remove(rt, &new) { Plan::Remove } else { Plan::Mark(new) };
    }
    if finalizers.is_empty() {
        return Plan::Remove;
    }
    mark_as_deleting(&mut new, now);
    Plan::Mark(new)
}

pub(crate) fn success_status(rt: &ResourceType, obj: &Value) -> Value {
    let mut details = json!({"name": objects::name(obj), "kind": rt.plural, "uid": objects::meta(obj).get("uid")});
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

fn check_preconditions(rt: &ResourceType, name: &str, old: &Value, rev: i64, p: &Preconditions) -> ApiResult<()> {
    let uid = objects::meta_str(old, "uid").unwrap_or("");
    if let Some(want) = p.uid.as_deref().filter(|u| *u != uid) {
        return Err(ApiError::conflict_with(
            rt,
            name,
            &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
        ));
    }
    if let Some(want) = p.resource_version.as_deref().filter(|r| *r != rev.to_string()) {
        return Err(ApiError::conflict_with(
            rt,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rev}"
            ),
        ));
    }
    Ok(())
}

/// The outcome of deleting one object.
pub(crate) struct Deleted {
    /// The answer: the object as it stays; when it is gone, the object as it was for the kinds
    /// whose registry returns it (`kinds::returns_deleted_object`), else a success Status.
    pub body: Value,
    /// Whether it left the store.
    pub removed: bool,
}

/// Deletes one object as Kubernetes does (see the module doc).
pub(crate) async fn delete_object(
    state: &ApiState,
    t: &Target,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<Deleted> {
    let rt = t.rt;
    for _ in 0..16 {
        let (old, rev) = load(state, t, name).await?;
        if let Some(p) = &opts.preconditions {
            check_preconditions(rt, name, &old, rev, p)?;
        }
        admission::delete(state, t, &old).await?;
        let written = match plan(rt, &old, opts, jiff::Timestamp::now()) {
            Plan::Unchanged => return Ok(Deleted { body: old, removed: false }),
            Plan::Mark(new) => {
                let removed = ready_to_remove(rt, &new);
                write_update(state, t, name, new, &old, rev, opts.dry_run).await.map(|body| Deleted { body, removed })
            }
            Plan::Remove if opts.dry_run => Ok(Deleted { body: old.clone(), removed: true }),
            Plan::Remove => {
                let key = objects::key(rt, t.namespace.as_deref(), name);
                let started = Instant::now();
                let r = state.store.delete(&key, Some(rev)).await.map_err(|e| ApiError::from_store(e, rt, name));
                state.metrics.observe_store("delete", started.elapsed());
                r.map(|_| Deleted { body: old.clone(), removed: true })
            }
        };
        match written {
            // Gone: the object as it was, or a Status naming it, as the kind's registry answers.
            Ok(Deleted { body, removed: true }) if !kinds::returns_deleted_object(rt) => {
                return Ok(Deleted { body: success_status(rt, &body), removed: true });
            }
            Ok(deleted) => return Ok(deleted),
            Err(e) if e.code == 409 && e.reason == "Conflict" => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::conflict(rt, name))
}

/// `DELETE` of one object.
pub(crate) async fn delete(state: &ApiState, t: &Target, q: &Query, body: &[u8]) -> ApiResult<Response> {
    let name = t.name.as_deref().unwrap_or_default();
    let opts = DeleteOptions::from_request(q, body)?;
    let deleted = delete_object(state, t, name, &opts).await?;
    let code = if opts.accepted(deleted.removed) { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok(json_response(code, &deleted.body))
}

/// `DELETE` of a collection: each selected object as [`delete`] would, with the same options.
pub(crate) async fn delete_collection(state: &ApiState, t: &Target, q: &Query, body: &[u8]) -> ApiResult<Response> {
    let sel = Selectors::from_query(t.rt, q)?;
    let opts = DeleteOptions::from_request(q, body)?;
    let page = list_objects(state, t, &sel, None, None).await?;
    let mut deleted = Vec::new();
    for obj in page.items {
        let name = objects::name(&obj).to_string();
        let mut target = t.clone();
        if t.rt.namespaced {
            target.namespace = objects::meta_str(&obj, "namespace").map(str::to_string);
        }
        match delete_object(state, &target, &name, &opts).await {
            Ok(_) => deleted.push(obj),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let body = json!({"kind": t.rt.list_kind(), "apiVersion": t.rt.api_version(), "metadata": {"resourceVersion": page.revision.to_string()}, "items": deleted});
    Ok(json_response(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::deletion::PropagationPolicy;
    use berth_api::resources::{CONFIGMAPS, DEPLOYMENTS, EVENTS};

    fn now() -> jiff::Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn with(cascade: Cascade) -> DeleteOptions {
        DeleteOptions { cascade, ..Default::default() }
    }

    fn policy(p: PropagationPolicy) -> DeleteOptions {
        with(Cascade::Policy(p))
    }

    fn marked(plan: Plan) -> Value {
        match plan {
            Plan::Mark(v) => v,
            other => panic!("expected the object to stay, got {other:?}"),
        }
    }

    fn deployment() -> Value {
        json!({"metadata": {"name": "web", "generation": 2}, "spec": {}})
    }

    fn bound_pod() -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 20}, "status": {"phase": "Running"}})
    }

    #[test]
    fn background_or_no_choice_removes_an_unheld_object_at_once() {
        assert_eq!(plan(&DEPLOYMENTS, &deployment(), &DeleteOptions::default(), now()), Plan::Remove);
        assert_eq!(plan(&DEPLOYMENTS, &deployment(), &policy(PropagationPolicy::Background), now()), Plan::Remove);
        assert_eq!(plan(&DEPLOYMENTS, &deployment(), &with(Cascade::OrphanDependents(false)), now()), Plan::Remove);
    }

    #[test]
    fn orphan_and_foreground_keep_the_object_with_their_finalizer_and_a_new_generation() {
        for (options, finalizer) in [
            (policy(PropagationPolicy::Orphan), "orphan"),
            (with(Cascade::OrphanDependents(true)), "orphan"),
            (policy(PropagationPolicy::Foreground), "foregroundDeletion"),
        ] {
            let d = marked(plan(&DEPLOYMENTS, &deployment(), &options, now()));
            assert_eq!(d["metadata"]["finalizers"], json!([finalizer]));
            assert_eq!(d["metadata"]["deletionTimestamp"], "2026-01-01T00:00:00Z");
            assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 0);
            assert_eq!(d["metadata"]["generation"], 3);
        }
    }

    #[test]
    fn deleting_again_may_switch_the_policy_but_keeps_the_first_timestamp_and_generation() {
        let foreground = marked(plan(&DEPLOYMENTS, &deployment(), &policy(PropagationPolicy::Foreground), now()));
        let later: jiff::Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let orphaned = marked(plan(&DEPLOYMENTS, &foreground, &policy(PropagationPolicy::Orphan), later));
        assert_eq!(orphaned["metadata"]["finalizers"], json!(["orphan"]));
        assert_eq!(orphaned["metadata"]["deletionTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(orphaned["metadata"]["generation"], 3);
        // No choice: the finalizer already there stands and nothing changes.
        assert_eq!(marked(plan(&DEPLOYMENTS, &foreground, &DeleteOptions::default(), later)), foreground);
        // Background takes the finalizer away: the object goes.
        assert_eq!(plan(&DEPLOYMENTS, &foreground, &policy(PropagationPolicy::Background), later), Plan::Remove);
    }

    #[test]
    fn other_finalizers_hold_the_object_whatever_the_policy() {
        let held = json!({"metadata": {"name": "c", "finalizers": ["example.com/hold"]}});
        let c = marked(plan(&CONFIGMAPS, &held, &policy(PropagationPolicy::Background), now()));
        assert_eq!(c["metadata"]["finalizers"], json!(["example.com/hold"]));
        assert!(c["metadata"].get("generation").is_none());
    }

    #[test]
    fn events_take_no_garbage_collection_finalizer() {
        let event = json!({"metadata": {"name": "e"}});
        assert_eq!(plan(&EVENTS, &event, &policy(PropagationPolicy::Foreground), now()), Plan::Remove);
    }

    #[test]
    fn a_bound_pod_deleted_in_the_foreground_gets_its_grace_period_and_the_finalizer() {
        let p = marked(plan(&PODS, &bound_pod(), &policy(PropagationPolicy::Foreground), now()));
        assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 20);
        assert_eq!(p["metadata"]["deletionTimestamp"], "2026-01-01T00:00:20Z");
        assert_eq!(p["metadata"]["finalizers"], json!(["foregroundDeletion"]));
        // A pending graceful deletion takes no new policy (finalizers are not updated).
        assert_eq!(plan(&PODS, &p, &policy(PropagationPolicy::Orphan), now()), Plan::Unchanged);
        // The node's confirmation (grace 0) shortens it; the finalizer still holds the pod.
        let confirm = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
        let confirmed = marked(plan(&PODS, &p, &confirm, now()));
        assert_eq!(confirmed["metadata"]["deletionGracePeriodSeconds"], 0);
        assert_eq!(confirmed["metadata"]["finalizers"], json!(["foregroundDeletion"]));
        // Terminated with grace 0, a new policy is taken.
        let orphaned = marked(plan(&PODS, &confirmed, &policy(PropagationPolicy::Orphan), now()));
        assert_eq!(orphaned["metadata"]["finalizers"], json!(["orphan"]));
        assert_eq!(plan(&PODS, &confirmed, &policy(PropagationPolicy::Background), now()), Plan::Remove);
    }

    #[test]
    fn an_unbound_pod_goes_at_once_unless_a_finalizer_holds_it() {
        let pending = json!({"metadata": {"name": "p"}, "spec": {}});
        assert_eq!(plan(&PODS, &pending, &DeleteOptions::default(), now()), Plan::Remove);
        let p = marked(plan(&PODS, &pending, &policy(PropagationPolicy::Orphan), now()));
        assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 0);
        assert_eq!(p["metadata"]["finalizers"], json!(["orphan"]));
    }

    #[test]
    fn a_namespace_terminates_with_its_finalizers_and_then_stays_as_it_is() {
        let ns = json!({"metadata": {"name": "team"}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        let terminating = marked(plan(&NAMESPACES, &ns, &policy(PropagationPolicy::Foreground), now()));
        assert_eq!(terminating["status"]["phase"], "Terminating");
        assert_eq!(terminating["metadata"]["finalizers"], json!(["foregroundDeletion"]));
        assert_eq!(plan(&NAMESPACES, &terminating, &policy(PropagationPolicy::Orphan), now()), Plan::Unchanged);
    }

    #[test]
    fn options_come_from_the_body_or_else_from_the_query() {
        let q = Query::parse(Some("propagationPolicy=Orphan&gracePeriodSeconds=5&dryRun=All"));
        let from_query = DeleteOptions::from_request(&q, b"").unwrap();
        assert_eq!(from_query.cascade, Cascade::Policy(PropagationPolicy::Orphan));
        assert_eq!(from_query.grace_period_seconds, Some(5));
        assert!(from_query.dry_run);
        let from_body = DeleteOptions::from_request(&q, br#"{"propagationPolicy": "Foreground"}"#).unwrap();
        assert_eq!(from_body.cascade, Cascade::Policy(PropagationPolicy::Foreground));
        assert_eq!(from_body.grace_period_seconds, None);
        assert!(!from_body.dry_run);
        let legacy = DeleteOptions::from_request(&Query::parse(Some("orphanDependents=false")), b"").unwrap();
        assert_eq!(legacy.cascade, Cascade::OrphanDependents(false));
        assert!(legacy.accepted(false) && !legacy.accepted(true));
    }

    #[test]
    fn conflicting_or_unknown_cascade_options_are_invalid() {
        let both = br#"{"orphanDependents": true, "propagationPolicy": "Background"}"#;
        let e = DeleteOptions::from_request(&Query::default(), both).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(
            e.message,
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Background\": orphanDependents and deletionPropagation cannot be both set"
        );
        assert_eq!(
            e.details,
            Some(json!({"group": "meta.k8s.io", "kind": "DeleteOptions", "causes": [{
                "reason": "FieldValueInvalid",
                "message": "Invalid value: \"Background\": orphanDependents and deletionPropagation cannot be both set",
                "field": "propagationPolicy"
            }]}))
        );
        let e = DeleteOptions::from_request(&Query::parse(Some("propagationPolicy=Later")), b"").unwrap_err();
        assert_eq!(
            e.message,
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Later\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
        );
        let e = DeleteOptions::from_request(&Query::parse(Some("orphanDependents=maybe")), b"").unwrap_err();
        assert_eq!(e.code, 400);
    }
}
