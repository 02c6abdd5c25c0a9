//! Whole lists (no `limit`) written while they are read: the store is read in chunks at one
//! revision and each object is encoded and sent as it comes, so a list takes a few chunks of
//! memory, never its whole body or a tree of every object. A protobuf list's length prefix needs
//! the size of every item first: it reads the list twice at that revision, counting, then
//! writing. kube-apiserver streams list responses the same way since 1.33.
//!
//! A failure after the first chunk cannot change the status any more: the connection is cut, as
//! kube-apiserver does, and clients see a truncated body rather than a wrong one.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use berth_api::ResourceType;
use berth_store::{KeyValue, ListOptions};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc::Sender;

use crate::handlers::{Selectors, partial_metadata};
use crate::protobuf::{self, ListEncoder};
use crate::request::{Output, Target};
use crate::watch_events::pod_node_name;
use crate::{ApiError, ApiResult, ApiState, objects};

/// A list this long gives the memory it took back to the OS once written.
const TRIM_AFTER: usize = 5_000;

/// How the items of one list are written.
enum Encoder {
    /// JSON `<Kind>List` or `PartialObjectMetadataList`.
    Json {
        partial: bool,
    },
    Table {
        include_object: bool,
        now: jiff::Timestamp,
    },
    Protobuf(ListEncoder),
}

impl Encoder {
    fn new(rt: &'static ResourceType, out: Output, protobuf: bool, include_object: bool) -> Encoder {
        match out {
            Output::Table => Encoder::Table { include_object, now: jiff::Timestamp::now() },
            Output::PartialMetadata => Encoder::Json { partial: true },
            Output::Object if protobuf => match ListEncoder::new(&rt.api_version(), &rt.list_kind(), rt.kind) {
                Ok(e) => Encoder::Protobuf(e),
                // The negotiation layer answers JSON or 406.
                Err(_) => Encoder::Json { partial: false },
            },
            Output::Object => Encoder::Json { partial: false },
        }
    }

    fn content_type(&self) -> &'static str {
        match self {
            Encoder::Protobuf(_) => protobuf::MEDIA_TYPE,
            _ => "application/json",
        }
    }

    /// What comes before the first item; a protobuf head needs the items' total size.
    fn head(&self, rt: &ResourceType, rv: &str, items_len: usize) -> ApiResult<Vec<u8>> {
        let meta = json!({"resourceVersion": rv});
        let (open, field) = match self {
            Encoder::Json { partial: false } => {
                (json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": meta}), "items")
            }
            Encoder::Json { partial: true } => (
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta}),
                "items",
            ),
            Encoder::Table { .. } => (
                json!({
                    "kind": "Table",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    "columnDefinitions": crate::watch::table_columns(rt),
                }),
                "rows",
            ),
            Encoder::Protobuf(e) => return e.head(&meta, items_len).map_err(|e| ApiError::internal(e.to_string())),
        };
        // The object without its closing brace, then the array to fill.
        let mut text = open.to_string();
        text.pop();
        text.push_str(&format!(",\"{field}\":["));
        Ok(text.into_bytes())
    }

    /// Appends `obj`, the `index`th item written, to `out`.
    fn item(&self, rt: &ResourceType, obj: &Value, index: usize, out: &mut Vec<u8>) -> ApiResult<()> {
        let json = |out: &mut Vec<u8>, v: &Value| {
            if index > 0 {
                out.push(b',');
            }
            serde_json::to_writer(out, v).map_err(|e| ApiError::internal(format!("encoding a list item: {e}")))
        };
        match self {
            Encoder::Json { partial: false } => json(out, obj),
            Encoder::Json { partial: true } => json(out, &partial_metadata(obj)),
            Encoder::Table { include_object, now } => {
                json(out, &crate::watch::table_row(rt, obj, *now, *include_object))
            }
            Encoder::Protobuf(e) => e.item(obj, out).map_err(|e| ApiError::internal(e.to_string())),
        }
    }

    /// What comes after the last item.
    fn tail(&self) -> Vec<u8> {
        match self {
            Encoder::Protobuf(e) => e.tail(),
            _ => b"]}".to_vec(),
        }
    }
}

/// What [`Listing::copy_stored`] did with an object.
enum Copied {
    Written,
    /// Not in the selection: nothing to write.
    Unselected,
    /// Left to decoding, which also reports what is wrong with the bytes.
    No,
}

/// One list being answered: what, at which revision, and how.
struct Listing {
    state: Arc<ApiState>,
    rt: &'static ResourceType,
    prefix: String,
    sel: Selectors,
    encoder: Encoder,
}

/// One chunk of the list from the store and where the next one starts.
struct Chunk {
    items: Vec<KeyValue>,
    revision: i64,
    next: Option<String>,
}

impl Listing {
    async fn read(&self, revision: Option<i64>, start: Option<String>) -> ApiResult<Chunk> {
        let started = Instant::now();
        let opts = ListOptions { revision, start_key: start, limit: Some(self.state.store.list_chunk()) };
        let res = self.state.store.list(&self.prefix, &opts).await.map_err(|e| ApiError::from_store(e, self.rt, ""))?;
        self.state.metrics.observe_store("list", started.elapsed());
        let next = if res.more { res.items.last().map(|kv| objects::key_after(&kv.key)) } else { None };
        Ok(Chunk { items: res.items, revision: res.revision, next })
    }

    /// Encodes the objects of `chunk` that match the selectors; returns how many were written
    /// in all.
    fn encode(&self, chunk: &Chunk, mut written: usize, out: &mut Vec<u8>) -> ApiResult<usize> {
        for kv in &chunk.items {
            match self.copy_stored(kv, written, out) {
                Copied::Written => {
                    written += 1;
                    continue;
                }
                Copied::Unselected => continue,
                Copied::No => {}
            }
            let obj = objects::decode_kv(self.rt, kv)?;
            if self.sel.matches(self.rt, &obj) {
                self.encoder.item(self.rt, &obj, written, out)?;
                written += 1;
            }
        }
        Ok(written)
    }

    /// Writes `kv` to a plain JSON list from its stored bytes when the selectors need no decoded
    /// object (none, or a pod list's `spec.nodeName=NODE` alone): most of a list's cost was
    /// decoding each object and encoding it again.
    fn copy_stored(&self, kv: &KeyValue, written: usize, out: &mut Vec<u8>) -> Copied {
        if !matches!(self.encoder, Encoder::Json { partial: false }) {
            return Copied::No;
        }
        if !self.sel.is_empty() {
            let Some(node) = self.sel.node_alone(self.rt) else { return Copied::No };
            match pod_node_name(&kv.value) {
                Some(n) if n == node => {}
                Some(_) => return Copied::Unselected,
                None => return Copied::No,
            }
        }
        let mark = out.len();
        if written > 0 {
            out.push(b',');
        }
        if objects::write_served(out, self.rt, &kv.value, kv.mod_revision) {
            return Copied::Written;
        }
        out.truncate(mark);
        Copied::No
    }

    /// The size of every item's encoding, for a protobuf head: the list read once to count.
    async fn count(&self, first: &Chunk) -> ApiResult<usize> {
        let mut scratch = Vec::new();
        let mut written = self.encode(first, 0, &mut scratch)?;
        let mut size = scratch.len();
        let mut start = first.next.clone();
        while let Some(from) = start.take() {
            let chunk = self.read(Some(first.revision), Some(from)).await?;
            scratch.clear();
            written = self.encode(&chunk, written, &mut scratch)?;
            size += scratch.len();
            start = chunk.next;
        }
        Ok(size)
    }

    /// Writes the whole list into `tx`, chunk by chunk, from `first` on. Returns how many objects
    /// it had, or `None` if the client went away.
    async fn write(
        &self,
        first: Chunk,
        items_len: usize,
        tx: &Sender<Result<Bytes, std::io::Error>>,
    ) -> ApiResult<Option<usize>> {
        let mut out = self.encoder.head(self.rt, &first.revision.to_string(), items_len)?;
        let mut written = self.encode(&first, 0, &mut out)?;
        let mut start = first.next.clone();
        loop {
            if tx.send(Ok(Bytes::from(std::mem::take(&mut out)))).await.is_err() {
                return Ok(None);
            }
            let Some(from) = start.take() else { break };
            let chunk = self.read(Some(first.revision), Some(from)).await?;
            written = self.encode(&chunk, written, &mut out)?;
            start = chunk.next;
        }
        if tx.send(Ok(Bytes::from(self.encoder.tail()))).await.is_err() {
            return Ok(None);
        }
        Ok(Some(written))
    }
}

/// Answers a whole list of `t`. The first chunk is read (and a protobuf list counted) before
/// answering, so that those errors (410, 503) are proper responses; the rest is written as it is
/// read.
pub(crate) async fn serve(
    state: &Arc<ApiState>,
    t: &Target,
    sel: Selectors,
    out: Output,
    protobuf: bool,
    include_object: bool,
) -> ApiResult<Response> {
    let rt = t.rt;
    let listing = Listing {
        state: state.clone(),
        rt,
        prefix: objects::prefix(rt, t.namespace.as_deref()),
        sel,
        encoder: Encoder::new(rt, out, protobuf, include_object),
    };
    let content_type = listing.encoder.content_type();
    let first = listing.read(None, None).await?;
    if first.next.is_none() {
        let mut items = Vec::new();
        listing.encode(&first, 0, &mut items)?;
        let mut body = listing.encoder.head(rt, &first.revision.to_string(), items.len())?;
        body.extend(items);
        body.extend(listing.encoder.tail());
        return Ok(([(http::header::CONTENT_TYPE, content_type)], body).into_response());
    }
    let items_len = match listing.encoder {
        Encoder::Protobuf(_) => listing.count(&first).await?,
        _ => 0,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    tokio::spawn(async move {
        match listing.write(first, items_len, &tx).await {
            Ok(Some(written)) if written >= TRIM_AFTER => crate::memory::trim(),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(resource = rt.plural, code = e.code, message = %e.message, "a list failed while it was written");
                let _ = tx.send(Err(std::io::Error::other(e.message))).await;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(http::header::CONTENT_TYPE, content_type)], body).into_response())
}
