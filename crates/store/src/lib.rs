//! Revisioned key-value store with watch: the one persistence contract of the control plane.
//!
//! Every write gets a new, strictly increasing store-wide revision; the Kubernetes
//! `resourceVersion` of an object is the revision of its last write (`mod_revision`). Writes
//! are compare-and-swap on that revision, lists are consistent snapshots, and watches replay
//! every event after a given revision until that history is compacted away.
//!
//! Backends: [`sqlite::SqliteStore`] (embedded, the default) and [`etcd::EtcdStore`]. Both pass
//! the same conformance suite in `tests/conformance.rs`.

use std::pin::Pin;

use futures::Stream;

pub mod etcd;
pub mod sqlite;

/// A store-wide, strictly increasing write counter. 0 means "no revision".
pub type Revision = i64;

/// One key as stored, with the revisions of its creation and its last modification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

/// The result of a successful delete: the last value and the revision of the deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deleted {
    pub prev: KeyValue,
    pub revision: Revision,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change to one key, as replayed by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub key: String,
    /// The revision of this write.
    pub revision: Revision,
    /// The revision at which the key was created (for a delete: of the deleted incarnation).
    pub create_revision: Revision,
    /// The new value; `None` for a delete.
    pub value: Option<Vec<u8>>,
    /// The value before this write; `None` when the write created the key.
    pub prev_value: Option<Vec<u8>>,
}

/// What a ranged list reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Read the snapshot at this revision; `None` reads the latest. Older than the compacted
    /// revision → [`StoreError::Compacted`]; newer than the current revision → `Invalid`.
    pub revision: Option<Revision>,
    /// Start at this key (inclusive) instead of the prefix's beginning; used by pagination.
    pub start_key: Option<String>,
    /// Return at most this many items, in key order.
    pub limit: Option<usize>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListResult {
    pub items: Vec<KeyValue>,
    /// The revision of the snapshot that was read.
    pub revision: Revision,
    /// More items under the prefix follow the last one returned.
    pub more: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("key {key:?} not found")]
    NotFound { key: String },
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    /// The key's `mod_revision` is not the expected one; `current` is what is there now.
    #[error("key {key:?} was modified concurrently")]
    Conflict { key: String, current: Option<KeyValue> },
    #[error("revision {requested} has been compacted (compacted up to {compacted})")]
    Compacted { requested: Revision, compacted: Revision },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("store unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("store internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Events after a revision, in revision order, without gaps. Ends with an error item when the
/// backend loses the stream (the caller re-lists).
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<Event>> + Send>>;

/// What a watch that reports its progress delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    Event(Event),
    /// Every event under the watched prefix up to this revision has been delivered: what a
    /// watch bookmark may report while the prefix itself is quiet and the store is not.
    Progress(Revision),
}

/// A [`WatchStream`] with progress reports between the events.
pub type ProgressStream = Pin<Box<dyn Stream<Item = Result<WatchItem>> + Send>>;

/// The events of a watch with progress, without the progress reports.
pub fn events_only(items: ProgressStream) -> WatchStream {
    use futures::StreamExt;
    Box::pin(items.filter_map(|item| {
        std::future::ready(match item {
            Ok(WatchItem::Event(ev)) => Some(Ok(ev)),
            Ok(WatchItem::Progress(_)) => None,
            Err(e) => Some(Err(e)),
        })
    }))
}

/// How long a watch with progress lets the store's revision run ahead of what it reported
/// before it reports again.
pub const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The persistence contract. All methods are safe to call concurrently.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Backend name for logs and metrics: "sqlite" or "etcd".
    fn backend(&self) -> &'static str;

    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// How many keys a reader of a whole prefix should ask [`Store::list`] for at a time: few
    /// enough to bound its memory, enough that the backend's cost per limited read stays small
    /// beside the reading of the keys.
    fn list_chunk(&self) -> usize {
        500
    }

    /// Keys starting with `prefix`, in key order.
    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult>;

    /// Creates `key`; `AlreadyExists` if it is there.
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue>;

    /// Replaces `key` if its `mod_revision` is `expected`; `NotFound` or `Conflict` otherwise.
    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue>;

    /// Deletes `key`, if given only when its `mod_revision` is `expected`.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Deleted>;

    /// Every event under `prefix` with a revision greater than `after`, then live ones.
    /// `Compacted` if `after` is older than the compacted revision.
    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream>;

    /// [`Store::watch`], with a [`WatchItem::Progress`] about every [`PROGRESS_INTERVAL`] while
    /// other keys are written, so that a quiet prefix's watchers learn revisions that stay
    /// ahead of compaction. A backend that cannot tell delivers the events alone.
    async fn watch_with_progress(&self, prefix: &str, after: Revision) -> Result<ProgressStream> {
        use futures::StreamExt;
        let events = self.watch(prefix, after).await?;
        Ok(Box::pin(events.map(|item| item.map(WatchItem::Event))))
    }

    /// The revision of the latest write (0 for an empty new store).
    async fn current_revision(&self) -> Result<Revision>;

    /// Forgets history up to `revision`: later watches or lists at older revisions get
    /// `Compacted`. Current values are never removed.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The revision up to which history has been compacted (0 if never).
    async fn compacted_revision(&self) -> Result<Revision>;

    /// Whether history after `revision` is gone, so that a watch from it gets `Compacted`.
    async fn is_compacted(&self, revision: Revision) -> Result<bool> {
        Ok(revision < self.compacted_revision().await?)
    }
}
