//! Watch over HTTP: initial state, then every change as a JSON line, with bookmarks, timeouts,
//! `410 Gone` for compacted revisions, and selectors applied to old and new object states.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use berth_api::ResourceType;
use berth_api::resources::{EVENTS, EVENTS_V1};
use berth_store::{EventKind, StoreError};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::handlers::{Selectors, list_objects, partial_metadata};
use crate::objects;
use crate::request::{Output, Query, Target};
use crate::{ApiError, ApiResult, ApiState};

const BOOKMARK_EVERY: Duration = Duration::from_secs(10);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A `meta.k8s.io/v1` Table of `items` as `kubectl get` renders it.
pub fn table(rt: &ResourceType, items: &[Value], rv: &str, cont: Option<&str>, include_object: bool) -> Value {
    // Both event views print as core/v1 events.
    let (print_rt, convert) = if std::ptr::eq(rt, &EVENTS_V1) { (&EVENTS, true) } else { (rt, false) };
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = items
        .iter()
        .map(|obj| {
            let printed = if convert { berth_api::kinds::event_v1_to_core(obj) } else { obj.clone() };
            let mut row = json!({"cells": berth_api::table::cells(print_rt, &printed, now)});
            if include_object {
                row["object"] = partial_metadata(obj);
            }
            row
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": berth_api::table::columns(print_rt),
        "rows": rows,
    })
}

fn render(rt: &ResourceType, obj: &Value, out: Output) -> Value {
    match out {
        Output::Object => obj.clone(),
        Output::PartialMetadata => partial_metadata(obj),
        Output::Table => {
            let rv = objects::resource_version(obj).unwrap_or("").to_string();
            table(rt, std::slice::from_ref(obj), &rv, None, true)
        }
    }
}

/// The line a watcher with selectors `sel` and output `out` gets for `ev`, if any: the object
/// entering the selection is ADDED, leaving it DELETED, staying in it MODIFIED. Decoding, and
/// encoding the whole object, are shared with the other watchers of the event.
fn event_line(
    state: &ApiState,
    rt: &'static ResourceType,
    sel: &Selectors,
    out: Output,
    ev: &berth_store::Event,
) -> Option<Bytes> {
    let decoded = state.watch_events.get(rt, ev);
    let new = decoded.new_object(rt, ev);
    let matches = |o: Option<&Value>| o.is_some_and(|o| sel.matches(rt, o));
    // With no selector, only whether there was an old object matters: it need not be decoded.
    let old_matches = || if sel.is_empty() { ev.prev_value.is_some() } else { matches(decoded.old_object(rt, ev)) };
    let (kind, obj) = match ev.kind {
        EventKind::Put => match (matches(new), old_matches()) {
            (true, true) => ("MODIFIED", new),
            (true, false) => ("ADDED", new),
            (false, true) => ("DELETED", new),
            (false, false) => return None,
        },
        EventKind::Delete => match old_matches() {
            true => ("DELETED", decoded.old_object(rt, ev)),
            false => return None,
        },
    };
    let obj = obj?;
    Some(match out {
        Output::Object => decoded.object_line(kind, || line(kind, obj.clone())),
        _ => line(kind, render(rt, obj, out)),
    })
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

/// The ERROR line that ends a watch: `410 Gone` when its revision was compacted (clients list
/// again), else what the store's failure maps to (clients watch again from where they were).
fn expired_line(rt: &ResourceType, err: StoreError) -> Bytes {
    let status = match err {
        StoreError::Compacted { requested, compacted } => {
            ApiError::gone(format!("too old resource version: {requested} ({compacted})"))
        }
        other => ApiError::from_store(other, rt, ""),
    };
    line("ERROR", status.to_status())
}

/// Counts open watches for `/metrics` while alive.
struct WatchGuard {
    state: Arc<ApiState>,
    resource: &'static str,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.state.metrics.watchers(self.resource, -1);
    }
}

pub async fn serve(state: Arc<ApiState>, t: Target, q: Query, out: Output) -> ApiResult<Response> {
    let rt = t.rt;
    let sel = Selectors::from_query(rt, &q)?;
    let bookmarks = q.flag("allowWatchBookmarks");
    let timeout =
        q.int("timeoutSeconds")?.filter(|s| *s > 0).map(|s| Duration::from_secs(s as u64)).unwrap_or(DEFAULT_TIMEOUT);
    let prefix = objects::prefix(rt, t.namespace.as_deref());

    // No resourceVersion, or "0": start with the current state as ADDED events.
    let (initial, start) = match q.get("resourceVersion") {
        None | Some("0") => {
            let page = list_objects(&state, &t, &sel, None, None).await?;
            (page.items, page.revision)
        }
        Some(rv) => {
            let rev =
                rv.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?;
            (Vec::new(), rev)
        }
    };
    let events = match state.store.watch(&prefix, start).await {
        Ok(s) => Some(s),
        Err(e @ StoreError::Compacted { .. }) => {
            let body = Body::from(expired_line(rt, e));
            let mut resp = ([(http::header::CONTENT_TYPE, "application/json")], body).into_response();
            resp.extensions_mut().insert(crate::negotiation::WatchStream);
            return Ok(resp);
        }
        Err(e) => return Err(ApiError::from_store(e, rt, "")),
    };
    state.metrics.watchers(rt.plural, 1);
    let guard = WatchGuard { state: state.clone(), resource: rt.plural };

    let stream = async_stream(state.clone(), rt, sel, out, initial, start, events, bookmarks, timeout, guard);
    let body = Body::from_stream(stream);
    let mut resp = ([(http::header::CONTENT_TYPE, "application/json")], body).into_response();
    resp.extensions_mut().insert(crate::negotiation::WatchStream);
    Ok(resp)
}

#[allow(clippy::too_many_arguments)]
fn async_stream(
    state: Arc<ApiState>,
    rt: &'static ResourceType,
    sel: Selectors,
    out: Output,
    initial: Vec<Value>,
    start: i64,
    events: Option<berth_store::WatchStream>,
    bookmarks: bool,
    timeout: Duration,
    guard: WatchGuard,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let _guard = guard;
        for obj in &initial {
            if tx.send(line("ADDED", render(rt, obj, out))).await.is_err() {
                return;
            }
        }
        let Some(mut events) = events else { return };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_rev = start;
        loop {
            let next = tokio::time::timeout(BOOKMARK_EVERY, events.next());
            let item = tokio::select! {
                r = next => r,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            };
            let ev = match item {
                Err(_idle) => {
                    if bookmarks {
                        let bm = json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": {"resourceVersion": last_rev.to_string()}});
                        if tx.send(line("BOOKMARK", bm)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                Ok(None) => return,
                Ok(Some(Err(e))) => {
                    let _ = tx.send(expired_line(rt, e)).await;
                    return;
                }
                Ok(Some(Ok(ev))) => ev,
            };
            last_rev = ev.revision;
            let Some(bytes) = event_line(&state, rt, &sel, out, &ev) else { continue };
            if tx.send(bytes).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)
}
