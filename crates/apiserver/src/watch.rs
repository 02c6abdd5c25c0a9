//! Watch over HTTP: initial state, then every change as a JSON line, with bookmarks, timeouts,
//! `410 Gone` for compacted revisions, and selectors applied to old and new object states.
//! Events come from the resource type's [`WatchHub`](crate::watch_hub::WatchHub) dispatcher, or
//! from a store watch of the watcher's own when it resumes from further back than the hub keeps.

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
use crate::watch_events::Decoded;
use crate::watch_hub::{Message, Slot, Subscription};
use crate::{ApiError, ApiResult, ApiState};

const BOOKMARK_EVERY: Duration = Duration::from_secs(10);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A `meta.k8s.io/v1` Table of `items` as `kubectl get` renders it.
pub fn table(rt: &ResourceType, items: &[Value], rv: &str, cont: Option<&str>, include_object: bool) -> Value {
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = items.iter().map(|obj| table_row(rt, obj, now, include_object)).collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": table_columns(rt),
        "rows": rows,
    })
}

/// The kind a Table prints `rt` as: both event views print as core/v1 events.
fn printed_as(rt: &ResourceType) -> (&ResourceType, bool) {
    if std::ptr::eq(rt, &EVENTS_V1) { (&EVENTS, true) } else { (rt, false) }
}

/// The column definitions of a Table of `rt`.
pub(crate) fn table_columns(rt: &ResourceType) -> Value {
    json!(berth_api::table::columns(printed_as(rt).0))
}

/// One Table row: the cells, and the object's metadata unless `includeObject=None`.
pub(crate) fn table_row(rt: &ResourceType, obj: &Value, now: jiff::Timestamp, include_object: bool) -> Value {
    let (print_rt, convert) = printed_as(rt);
    let cells = if convert {
        berth_api::table::cells(print_rt, &berth_api::kinds::event_v1_to_core(obj), now)
    } else {
        berth_api::table::cells(print_rt, obj, now)
    };
    let mut row = json!({"cells": cells});
    if include_object {
        row["object"] = partial_metadata(obj);
    }
    row
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
    rt: &'static ResourceType,
    sel: &Selectors,
    out: Output,
    ev: &berth_store::Event,
    decoded: &Decoded,
) -> Option<Bytes> {
    if out == Output::Object
        && let Some(line) = stored_event_line(rt, sel, ev, decoded)
    {
        return line;
    }
    decoded_event_line(rt, sel, out, ev, decoded)
}

/// [`event_line`] from the decoded objects.
fn decoded_event_line(
    rt: &'static ResourceType,
    sel: &Selectors,
    out: Output,
    ev: &berth_store::Event,
    decoded: &Decoded,
) -> Option<Bytes> {
    let new = decoded.new_object(rt, ev);
    let matches = |o: Option<&Value>| o.is_some_and(|o| sel.matches(rt, o));
    // With no selector, only whether there was an old object matters: it need not be decoded.
    let old_matches = || if sel.is_empty() { ev.prev_value.is_some() } else { matches(decoded.old_object(rt, ev)) };
    let (kind, of_new) = transition(ev.kind, || matches(new), old_matches)?;
    let obj = if of_new { new } else { decoded.old_object(rt, ev) }?;
    Some(match out {
        Output::Object => decoded.object_line(kind, || line_of(kind, obj)),
        _ => line(kind, render(rt, obj, out)),
    })
}

/// [`event_line`] for the watches most events go to, those without selectors and node agents'
/// watches of their pods, written from the stored bytes without decoding the object: `None`
/// when the watch needs the decoded object, or the bytes are not what [`objects::decode`]
/// takes as is.
fn stored_event_line(
    rt: &'static ResourceType,
    sel: &Selectors,
    ev: &berth_store::Event,
    decoded: &Decoded,
) -> Option<Option<Bytes>> {
    let node = match sel.is_empty() {
        true => None,
        false => Some(sel.node_alone(rt)?),
    };
    // Whether the object after (`new`) or before the write is in the selection.
    let selects = |new: bool| match (node, new) {
        (None, true) => ev.value.is_some(),
        (None, false) => ev.prev_value.is_some(),
        (Some(n), true) => decoded.new_node(ev) == Some(n),
        (Some(n), false) => decoded.old_node(ev) == Some(n),
    };
    let Some((kind, new)) = transition(ev.kind, || selects(true), || selects(false)) else { return Some(None) };
    let stored = if new { ev.value.as_deref() } else { ev.prev_value.as_deref() }?;
    // Not written: the caller decodes instead, and reports what is wrong.
    let line = decoded.try_object_line(kind, || {
        framed(kind, stored.len(), |out| objects::write_served(out, rt, stored, ev.revision))
    })?;
    Some(Some(line))
}

/// The line type of a write as a watcher sees it, from whether the object after the write
/// (`new_in`) and before it (`old_in`) are in its selection: entering is ADDED, leaving
/// DELETED, staying MODIFIED. Also whether the line carries the new object (else the old one,
/// of a delete). `None`: the watcher gets nothing.
fn transition(
    kind: EventKind,
    new_in: impl FnOnce() -> bool,
    old_in: impl FnOnce() -> bool,
) -> Option<(&'static str, bool)> {
    match kind {
        EventKind::Put => match (new_in(), old_in()) {
            (true, true) => Some(("MODIFIED", true)),
            (true, false) => Some(("ADDED", true)),
            (false, true) => Some(("DELETED", true)),
            (false, false) => None,
        },
        EventKind::Delete => old_in().then_some(("DELETED", false)),
    }
}

fn line(kind: &str, object: Value) -> Bytes {
    line_of(kind, &object)
}

/// `{"type":kind,"object":object}` and a newline, written from the object as it is: every
/// watcher of an event shares one decoded object, and a copy of a pod to wrap it cost more
/// than the encoding.
fn line_of(kind: &str, object: &Value) -> Bytes {
    framed(kind, 256, |out| serde_json::to_writer(out, object).is_ok()).expect("json values encode")
}

/// `{"type":kind,"object":…}` and a newline, the object written by `object` (about `size`
/// bytes); `None` if it could not be.
fn framed(kind: &str, size: usize, object: impl FnOnce(&mut Vec<u8>) -> bool) -> Option<Bytes> {
    let mut out = Vec::with_capacity(size + 64);
    out.extend_from_slice(b"{\"type\":");
    serde_json::to_writer(&mut out, kind).expect("a string encodes");
    out.extend_from_slice(b",\"object\":");
    if !object(&mut out) {
        return None;
    }
    out.extend_from_slice(b"}\n");
    Some(Bytes::from(out))
}

/// The ERROR line that ends a watch: `410 Gone` when its revision was compacted (clients list
/// again), else what the store's failure maps to (clients watch again from where they were).
pub(crate) fn expired_line(rt: &ResourceType, err: StoreError) -> Bytes {
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
    let slot = Slot::of(rt, t.namespace.as_deref(), q.get("fieldSelector"));
    let events = match state.watch_hub.subscribe(&state, rt, start, slot.clone()).await {
        Some(sub) => Source::Hub(sub),
        None => match state.store.watch(&prefix, start).await {
            Ok(events) => Source::Store(Behind { events, slot, last_rev: start, since_try: 0 }),
            Err(e @ StoreError::Compacted { .. }) => {
                let body = Body::from(expired_line(rt, e));
                let mut resp = ([(http::header::CONTENT_TYPE, "application/json")], body).into_response();
                resp.extensions_mut().insert(crate::negotiation::WatchStream);
                return Ok(resp);
            }
            Err(e) => return Err(ApiError::from_store(e, rt, "")),
        },
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
    mut events: Source,
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
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_rev = start;
        loop {
            let next = tokio::time::timeout(BOOKMARK_EVERY, events.next(&state, rt));
            let item = tokio::select! {
                r = next => r,
                _ = tokio::time::sleep_until(deadline) => {
                    // A last bookmark, so that the client resumes from where the type is now, not
                    // from its last event: a resume from far back reads the store's history.
                    if bookmarks && let Some(rev) = bookmark_revision(&events, last_rev) {
                        let _ = tx.send(bookmark(rt, rev)).await;
                    }
                    return;
                }
                _ = tx.closed() => return,
            };
            let (ev, decoded) = match item {
                Err(_idle) => {
                    if bookmarks {
                        let Some(rev) = bookmark_revision(&events, last_rev) else { continue };
                        last_rev = rev;
                        if tx.send(bookmark(rt, last_rev)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                Ok(Next::End) => return,
                Ok(Next::Error(line)) => {
                    let _ = tx.send(line).await;
                    return;
                }
                Ok(Next::Event(ev, decoded)) => (ev, decoded),
            };
            last_rev = ev.revision;
            let Some(bytes) = event_line(rt, &sel, out, &ev, &decoded) else { continue };
            if tx.send(bytes).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)
}

/// The resourceVersion a bookmark may report now: events this watcher does not select also move
/// it on, once it has been sent every event it selects. `None` while some are still queued.
fn bookmark_revision(events: &Source, last_rev: i64) -> Option<i64> {
    match events.progress() {
        Some(progress) if events.is_empty() => Some(last_rev.max(progress)),
        Some(_) => None,
        None => Some(last_rev),
    }
}

fn bookmark(rt: &ResourceType, rev: i64) -> Bytes {
    let bm = json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": {"resourceVersion": rev.to_string()}});
    line("BOOKMARK", bm)
}

/// Where a watch's events come from.
enum Source {
    /// The type's shared dispatcher.
    Hub(Subscription),
    /// A store watch of its own, for a start older than the hub keeps, until it has caught up.
    Store(Behind),
}

/// A watch reading the store's history because it resumed from further back than the hub keeps.
/// It decodes every event of the type for itself, so it moves to the hub as soon as it has read
/// up to what the hub still keeps: with thousands of agents resuming their watches, staying on
/// the store cost one decode of every pod update per agent.
struct Behind {
    events: berth_store::WatchStream,
    slot: Slot,
    /// The revision of the last event read from the store (or the start).
    last_rev: i64,
    /// Events read since the last try to move to the hub.
    since_try: usize,
}

/// Events a watch behind the hub reads from the store between tries to move to the hub.
const TRY_HUB_EVERY: usize = 64;

enum Next {
    Event(Arc<berth_store::Event>, Arc<Decoded>),
    /// The ERROR line that ends the watch.
    Error(Bytes),
    End,
}

impl Source {
    async fn next(&mut self, state: &Arc<ApiState>, rt: &'static ResourceType) -> Next {
        loop {
            let join = match self {
                Source::Store(behind) if behind.since_try >= TRY_HUB_EVERY => {
                    behind.since_try = 0;
                    Some((behind.last_rev, behind.slot.clone()))
                }
                _ => None,
            };
            // The hub replays what it keeps after `last_rev` and then sends live events, so
            // dropping the store watch with events still buffered loses none and repeats none.
            if let Some((after, slot)) = join
                && let Some(sub) = state.watch_hub.subscribe(state, rt, after, slot).await
            {
                *self = Source::Hub(sub);
            }
            match self {
                Source::Hub(sub) => {
                    if let Some((ev, decoded)) = sub.replay.pop_front() {
                        return Next::Event(ev, decoded);
                    }
                    return match sub.live.recv().await {
                        Some(Message::Event(ev, decoded)) => Next::Event(ev, decoded),
                        Some(Message::End(line)) => Next::Error(line),
                        // Cut off as too slow (logged by the dispatcher), or the store watch ended.
                        None => Next::End,
                    };
                }
                Source::Store(behind) => match behind.events.next().await {
                    None => return Next::End,
                    Some(Err(e)) => return Next::Error(expired_line(rt, e)),
                    Some(Ok(ev)) => {
                        behind.last_rev = ev.revision;
                        behind.since_try += 1;
                        if behind.slot.may_hold(rt, &ev) {
                            let decoded = state.watch_events.get(rt, &ev);
                            return Next::Event(Arc::new(ev), decoded);
                        }
                    }
                },
            }
        }
    }

    /// The dispatcher's progress, read before [`Source::is_empty`] so that an empty queue then
    /// means every selected event up to it was delivered.
    fn progress(&self) -> Option<i64> {
        match self {
            Source::Hub(sub) => Some(sub.progress()),
            Source::Store(_) => None,
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Source::Hub(sub) => sub.replay.is_empty() && sub.live.is_empty(),
            Source::Store(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_api::resources::{PODS, SERVICES};

    fn pod(node: Option<&str>) -> Vec<u8> {
        let mut obj = json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}}, "spec": {}});
        if let Some(n) = node {
            obj["spec"]["nodeName"] = json!(n);
        }
        serde_json::to_vec(&obj).unwrap()
    }

    fn event(kind: EventKind, value: Option<Vec<u8>>, prev: Option<Vec<u8>>) -> berth_store::Event {
        berth_store::Event {
            kind,
            key: "/registry/pods/ns/p".into(),
            revision: 9,
            create_revision: 3,
            value,
            prev_value: prev,
        }
    }

    fn selectors(rt: &ResourceType, query: &str) -> Selectors {
        Selectors::from_query(rt, &crate::request::Query::parse(Some(query))).unwrap()
    }

    fn parsed(line: Option<Bytes>) -> Option<Value> {
        line.map(|l| serde_json::from_slice(&l).unwrap())
    }

    #[test]
    fn lines_written_from_stored_bytes_say_what_the_decoded_objects_say() {
        let events = [
            event(EventKind::Put, Some(pod(None)), None),
            event(EventKind::Put, Some(pod(Some("n1"))), Some(pod(None))),
            event(EventKind::Put, Some(pod(Some("n1"))), Some(pod(Some("n1")))),
            event(EventKind::Put, Some(pod(Some("n2"))), Some(pod(Some("n1")))),
            event(EventKind::Delete, None, Some(pod(Some("n1")))),
            event(EventKind::Delete, None, Some(pod(Some("n2")))),
        ];
        let mut written = 0;
        for query in ["", "fieldSelector=spec.nodeName%3Dn1", "fieldSelector=spec.nodeName%3D"] {
            let sel = selectors(&PODS, query);
            for ev in &events {
                let stored = stored_event_line(&PODS, &sel, ev, &Decoded::default()).expect("no decoding needed");
                written += usize::from(stored.is_some());
                let decoded = decoded_event_line(&PODS, &sel, Output::Object, ev, &Decoded::default());
                assert_eq!(parsed(stored), parsed(decoded), "{query}: {:?} {:?}", ev.kind, ev.value.is_some());
            }
        }
        assert_eq!(written, 6 + 4 + 2, "every event without a selector, four on n1, two that concern unscheduled pods");
    }

    #[test]
    fn watches_that_need_the_decoded_object_or_bytes_it_cannot_copy_are_left_to_decoding() {
        let ev = event(EventKind::Put, Some(pod(Some("n1"))), None);
        for query in
            ["labelSelector=app%3Dweb", "fieldSelector=spec.nodeName%21%3Dn1", "fieldSelector=metadata.name%3Dp"]
        {
            assert!(stored_event_line(&PODS, &selectors(&PODS, query), &ev, &Decoded::default()).is_none(), "{query}");
        }
        let services = selectors(&SERVICES, "fieldSelector=metadata.name%3Dp");
        assert!(stored_event_line(&SERVICES, &services, &ev, &Decoded::default()).is_none());
        let broken = event(EventKind::Put, Some(b"not json".to_vec()), None);
        let decoded = Decoded::default();
        assert!(stored_event_line(&PODS, &selectors(&PODS, ""), &broken, &decoded).is_none());
        assert_eq!(event_line(&PODS, &selectors(&PODS, ""), Output::Object, &broken, &decoded), None);
    }
}
