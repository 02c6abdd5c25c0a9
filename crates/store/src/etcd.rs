//! The etcd v3 backend: maps the store contract onto etcd transactions, ranges and watches.
//!
//! Revisions are etcd's own. Compare-and-swap is a txn on `mod_revision`; lists are ranges at a
//! revision; watches start at `after + 1` with `prev_kv`. All keys live under an optional
//! key prefix, so several stores (or tests) can share one etcd cluster.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, PutOptions,
    Txn, TxnOp, TxnOpResponse, WatchOptions,
};

use crate::sqlite::prefix_end;
use crate::{
    Deleted, Event, EventKind, KeyValue, ListOptions, ListResult, Result, Revision, Store, StoreError, WatchStream,
};

/// How [`EtcdStore`] connects and where its keys live.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Prepended to every key; stripped from every key returned.
    pub key_prefix: String,
    /// Bound on connecting and on every unary request; beyond it the store is `Unavailable`.
    pub request_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self { key_prefix: String::new(), request_timeout: Duration::from_secs(10) }
    }
}

/// The etcd-backed store.
pub struct EtcdStore {
    client: Client,
    options: EtcdOptions,
    keys: Keys,
    /// The highest compacted revision this store has done or learned about.
    compacted: AtomicI64,
}

/// etcd reports these conditions only through the status message.
const MSG_COMPACTED: &str = "required revision has been compacted";
const MSG_FUTURE: &str = "required revision is a future revision";

fn message_contains(e: &etcd_client::Error, what: &str) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains(what))
}

/// gRPC status codes (etcd-client does not re-export tonic's `Code`).
const GRPC_CANCELLED: i32 = 1;
const GRPC_INVALID_ARGUMENT: i32 = 3;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_OUT_OF_RANGE: i32 = 11;
const GRPC_UNAVAILABLE: i32 = 14;

fn map_err(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(ref s) => match s.code() as i32 {
            GRPC_UNAVAILABLE | GRPC_DEADLINE_EXCEEDED | GRPC_CANCELLED => StoreError::Unavailable(Box::new(e)),
            GRPC_INVALID_ARGUMENT | GRPC_OUT_OF_RANGE => StoreError::Invalid(s.message().to_owned()),
            _ => StoreError::Internal(Box::new(e)),
        },
        E::TransportError(_) | E::IoError(_) | E::EndpointError(_) => StoreError::Unavailable(Box::new(e)),
        E::InvalidArgs(_) | E::InvalidUri(_) => StoreError::Invalid(e.to_string()),
        _ => StoreError::Internal(Box::new(e)),
    }
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision> {
    header.map(|h| h.revision()).ok_or_else(|| StoreError::Internal("etcd response without header".into()))
}

impl EtcdStore {
    /// Connects to `endpoints` (e.g. `http://127.0.0.1:2379`) with default options.
    pub async fn connect(endpoints: &[String]) -> Result<Self> {
        Self::connect_with(endpoints, EtcdOptions::default()).await
    }

    /// Connects to `endpoints` and checks that the cluster answers.
    pub async fn connect_with(endpoints: &[String], options: EtcdOptions) -> Result<Self> {
        let timeout = options.request_timeout;
        let connect =
            ConnectOptions::new().with_connect_timeout(timeout).with_keep_alive(Duration::from_secs(10), timeout);
        let client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(connect)))
            .await
            .map_err(|_| StoreError::Unavailable("timed out connecting to etcd".into()))?
            .map_err(|e| match map_err(e) {
                StoreError::Internal(e) => StoreError::Unavailable(e),
                other => other,
            })?;
        let keys = Keys { prefix: options.key_prefix.clone() };
        let store = Self { client, options, keys, compacted: AtomicI64::new(0) };
        // The channel connects lazily; one request proves the cluster is there.
        store.current_revision().await?;
        Ok(store)
    }

    /// Runs one unary request with the request timeout.
    async fn call<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> std::result::Result<T, CallError> {
        match tokio::time::timeout(self.options.request_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if message_contains(&e, MSG_COMPACTED) => Err(CallError::Compacted),
            Ok(Err(e)) if message_contains(&e, MSG_FUTURE) => Err(CallError::Future),
            Ok(Err(e)) => Err(CallError::Other(map_err(e))),
            Err(_) => Err(CallError::Other(StoreError::Unavailable("etcd request timed out".into()))),
        }
    }

    /// The etcd range `[start, end)` of the user keys under `prefix` from `start_key` on.
    fn range(&self, prefix: &str, start_key: Option<&str>) -> (Vec<u8>, Vec<u8>) {
        let full_prefix = self.full_key(prefix);
        // `[0]` as range end means "to the end of the keyspace" in etcd.
        let end = prefix_end(&full_prefix).unwrap_or_else(|| vec![0]);
        let mut start = match start_key {
            Some(s) if s > prefix => self.full_key(s),
            _ => full_prefix,
        };
        if start.is_empty() {
            start = vec![0];
        }
        (start, end)
    }

    /// Whether the snapshot at `revision` is still readable, i.e. not compacted.
    async fn readable(&self, revision: Revision) -> Result<bool> {
        let opts = GetOptions::new().with_revision(revision).with_count_only();
        let mut kv = self.client.kv_client();
        match self.call(kv.get(self.probe_key(), Some(opts))).await {
            Ok(_) | Err(CallError::Future) => Ok(true),
            Err(CallError::Compacted) => Ok(false),
            Err(CallError::Other(e)) => Err(e),
        }
    }

    /// etcd does not report its compacted revision directly: it is the oldest readable
    /// revision, found by bisection (about log2(current) cheap count-only reads).
    async fn probe_compacted(&self) -> Result<Revision> {
        let known = self.compacted.load(Ordering::SeqCst);
        let current = self.current_revision().await?;
        let (mut lo, mut hi) = (known.max(1), current.max(1));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.readable(mid).await? {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        // Revision 1 readable means nothing (that matters) was compacted.
        let found = if lo <= 1 { known } else { lo };
        self.compacted.fetch_max(found, Ordering::SeqCst);
        Ok(found.max(known))
    }

    async fn compacted_error(&self, requested: Revision) -> StoreError {
        let compacted = match self.probe_compacted().await {
            Ok(c) => c,
            Err(e) => return e,
        };
        StoreError::Compacted { requested, compacted }
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        self.keys.full(key)
    }

    fn to_kv(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue> {
        self.keys.kv(kv)
    }

    /// Some key for requests that only want the header or a revision check (etcd refuses an
    /// empty key).
    fn probe_key(&self) -> Vec<u8> {
        let k = self.full_key("");
        if k.is_empty() { vec![0] } else { k }
    }

    /// The answer to a CAS txn whose compare failed: its `or_else` get says what is there.
    fn failed_precondition(&self, key: &str, get: Option<&TxnOpResponse>) -> StoreError {
        let current = match get {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|k| self.to_kv(k)),
            _ => None,
        };
        match current {
            None => StoreError::NotFound { key: key.to_owned() },
            Some(Ok(kv)) => StoreError::Conflict { key: key.to_owned(), current: Some(kv) },
            Some(Err(e)) => e,
        }
    }
}

/// Maps user keys to etcd keys under the store's key prefix, and etcd records back.
#[derive(Clone, Debug)]
struct Keys {
    prefix: String,
}

impl Keys {
    fn full(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    fn user(&self, key: &[u8]) -> Result<String> {
        let key = std::str::from_utf8(key).map_err(|e| StoreError::Internal(Box::new(e)))?;
        key.strip_prefix(self.prefix.as_str())
            .map(str::to_owned)
            .ok_or_else(|| StoreError::Internal(format!("key {key:?} outside prefix").into()))
    }

    fn kv(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue> {
        Ok(KeyValue {
            key: self.user(kv.key())?,
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        })
    }

    fn event(&self, ev: &etcd_client::Event) -> Result<Event> {
        let kv = ev.kv().ok_or_else(|| StoreError::Internal("etcd watch event without kv".into()))?;
        let prev = ev.prev_kv();
        let kind = match ev.event_type() {
            EventType::Put => EventKind::Put,
            EventType::Delete => EventKind::Delete,
        };
        Ok(Event {
            kind,
            key: self.user(kv.key())?,
            revision: kv.mod_revision(),
            create_revision: match kind {
                EventKind::Put => kv.create_revision(),
                // etcd's tombstone has no create revision; the deleted incarnation's is prev's.
                EventKind::Delete => prev.map_or(0, |p| p.create_revision()),
            },
            value: (kind == EventKind::Put).then(|| kv.value().to_vec()),
            prev_value: prev.map(|p| p.value().to_vec()),
        })
    }
}

/// A request's failure, with the two revision conditions etcd reports by message singled out.
enum CallError {
    Compacted,
    Future,
    Other(StoreError),
}

impl CallError {
    fn plain(self) -> StoreError {
        match self {
            CallError::Compacted => StoreError::Invalid(MSG_COMPACTED.into()),
            CallError::Future => StoreError::Invalid(MSG_FUTURE.into()),
            CallError::Other(e) => e,
        }
    }
}

/// State of a watch stream: etcd's stream (whose request half must stay alive) and events
/// received but not yet yielded.
struct EtcdWatch {
    stream: etcd_client::WatchStream,
    keys: Keys,
    queued: VecDeque<Result<Event>>,
    /// The revision of the last event received, reported if the watch is compacted away.
    last: Revision,
    done: bool,
}

impl EtcdWatch {
    /// Queues the events (or the end) that one etcd watch response carries.
    fn absorb(&mut self, resp: etcd_client::WatchResponse) {
        if resp.canceled() {
            self.done = true;
            let err = if resp.compact_revision() > 0 {
                StoreError::Compacted { requested: self.last, compacted: resp.compact_revision() }
            } else {
                StoreError::Unavailable(format!("etcd canceled the watch: {}", resp.cancel_reason()).into())
            };
            self.queued.push_back(Err(err));
            return;
        }
        for ev in resp.events() {
            let ev = self.keys.event(ev);
            if let Ok(ev) = &ev {
                self.last = ev.revision;
            }
            self.queued.push_back(ev);
        }
    }

    async fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                if item.is_err() {
                    self.done = true;
                    self.queued.clear();
                }
                return Some(item);
            }
            if self.done {
                return None;
            }
            match self.stream.message().await {
                Ok(Some(resp)) => self.absorb(resp),
                Ok(None) => {
                    self.done = true;
                    return Some(Err(StoreError::Unavailable("etcd closed the watch stream".into())));
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(StoreError::Unavailable(Box::new(e))));
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut kv = self.client.kv_client();
        let resp = self.call(kv.get(self.full_key(key), None)).await.map_err(CallError::plain)?;
        resp.kvs().first().map(|k| self.to_kv(k)).transpose()
    }

    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult> {
        let revision = match opts.revision {
            Some(r) if r < 0 => return Err(StoreError::Invalid(format!("negative revision {r}"))),
            Some(r) if r > 0 => Some(r),
            _ => None,
        };
        let (start, end) = self.range(prefix, opts.start_key.as_deref());
        let mut get = GetOptions::new().with_range(end);
        if let Some(r) = revision {
            get = get.with_revision(r);
        }
        if let Some(n) = opts.limit.filter(|n| *n > 0) {
            get = get.with_limit(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut kv = self.client.kv_client();
        let resp = match self.call(kv.get(start, Some(get))).await {
            Ok(resp) => resp,
            Err(CallError::Compacted) => {
                return Err(self.compacted_error(revision.unwrap_or(0)).await);
            }
            Err(CallError::Future) => {
                return Err(StoreError::Invalid(format!(
                    "revision {} is newer than the current revision",
                    revision.unwrap_or(0)
                )));
            }
            Err(CallError::Other(e)) => return Err(e),
        };
        let items = resp.kvs().iter().map(|k| self.to_kv(k)).collect::<Result<Vec<_>>>()?;
        Ok(ListResult {
            items,
            revision: match revision {
                Some(r) => r,
                None => header_revision(resp.header())?,
            },
            more: resp.more(),
        })
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        let k = self.full_key(key);
        let txn = Txn::new().when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            k,
            value.clone(),
            None,
        )]);
        let mut kv = self.client.kv_client();
        let resp = self.call(kv.txn(txn)).await.map_err(CallError::plain)?;
        if !resp.succeeded() {
            return Err(StoreError::AlreadyExists { key: key.to_owned() });
        }
        let rev = header_revision(resp.header())?;
        Ok(KeyValue { key: key.to_owned(), value, create_revision: rev, mod_revision: rev })
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        let k = self.full_key(key);
        // `version > 0`: a missing key has mod_revision 0, which must not let an update create.
        let txn = Txn::new()
            .when([
                Compare::version(k.clone(), CompareOp::Greater, 0),
                Compare::mod_revision(k.clone(), CompareOp::Equal, expected),
            ])
            .and_then([TxnOp::put(k.clone(), value.clone(), Some(PutOptions::new().with_prev_key()))])
            .or_else([TxnOp::get(k, None)]);
        let mut kv = self.client.kv_client();
        let resp = self.call(kv.txn(txn)).await.map_err(CallError::plain)?;
        let responses = resp.op_responses();
        if resp.succeeded() {
            let create_revision = match responses.first() {
                Some(TxnOpResponse::Put(p)) => p.prev_key().map(|p| p.create_revision()),
                _ => None,
            }
            .ok_or_else(|| StoreError::Internal("etcd put without prev_kv".into()))?;
            let rev = header_revision(resp.header())?;
            return Ok(KeyValue { key: key.to_owned(), value, create_revision, mod_revision: rev });
        }
        Err(self.failed_precondition(key, responses.first()))
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Deleted> {
        let k = self.full_key(key);
        let mut when = vec![Compare::version(k.clone(), CompareOp::Greater, 0)];
        if let Some(e) = expected {
            when.push(Compare::mod_revision(k.clone(), CompareOp::Equal, e));
        }
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::delete(k.clone(), Some(DeleteOptions::new().with_prev_key()))])
            .or_else([TxnOp::get(k, None)]);
        let mut kv = self.client.kv_client();
        let resp = self.call(kv.txn(txn)).await.map_err(CallError::plain)?;
        let responses = resp.op_responses();
        if resp.succeeded() {
            let prev = match responses.first() {
                Some(TxnOpResponse::Delete(d)) => d.prev_kvs().first().map(|p| self.to_kv(p)),
                _ => None,
            }
            .ok_or_else(|| StoreError::Internal("etcd delete without prev_kv".into()))??;
            return Ok(Deleted { prev, revision: header_revision(resp.header())? });
        }
        Err(self.failed_precondition(key, responses.first()))
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        if after < 0 {
            return Err(StoreError::Invalid(format!("negative revision {after}")));
        }
        let known = self.compacted.load(Ordering::SeqCst);
        // etcd would still serve `after + 1 == compacted`; the contract says `after` itself
        // must not be compacted, which a read at `after` tells exactly.
        if after < known || !self.readable(after.max(1)).await? {
            return Err(self.compacted_error(after).await);
        }
        let (start, end) = self.range(prefix, None);
        let opts = WatchOptions::new().with_range(end).with_start_revision(after + 1).with_prev_key();
        let mut wc = self.client.watch_client();
        let mut stream = match tokio::time::timeout(self.options.request_timeout, wc.watch(start, Some(opts))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(map_err(e)),
            Err(_) => return Err(StoreError::Unavailable("etcd watch timed out".into())),
        };
        // Wait for etcd to confirm (or refuse) the watch so a refusal fails this call.
        let first = tokio::time::timeout(self.options.request_timeout, stream.message())
            .await
            .map_err(|_| StoreError::Unavailable("etcd watch was not confirmed".into()))?
            .map_err(map_err)?
            .ok_or_else(|| StoreError::Unavailable("etcd closed the watch".into()))?;
        if first.canceled() && first.compact_revision() > 0 {
            self.compacted.fetch_max(first.compact_revision(), Ordering::SeqCst);
            return Err(StoreError::Compacted { requested: after, compacted: first.compact_revision() });
        }
        let mut state =
            EtcdWatch { stream, keys: self.keys.clone(), queued: VecDeque::new(), last: after, done: false };
        state.absorb(first);
        Ok(Box::pin(futures::stream::unfold(state, |mut w| async move { w.next().await.map(|item| (item, w)) })))
    }

    async fn current_revision(&self) -> Result<Revision> {
        let mut kv = self.client.kv_client();
        let opts = GetOptions::new().with_count_only();
        let resp = self.call(kv.get(self.probe_key(), Some(opts))).await.map_err(CallError::plain)?;
        header_revision(resp.header())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut kv = self.client.kv_client();
        // Physical: return only once the history is gone, so later reads see it gone.
        let opts = CompactionOptions::new().with_physical();
        match self.call(kv.compact(revision, Some(opts))).await {
            // Already compacted at or beyond `revision`: nothing left to do.
            Ok(_) | Err(CallError::Compacted) => {
                self.compacted.fetch_max(revision, Ordering::SeqCst);
                Ok(())
            }
            Err(CallError::Future) => {
                Err(StoreError::Invalid(format!("cannot compact to {revision}: newer than the current revision")))
            }
            Err(CallError::Other(e)) => Err(e),
        }
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.probe_compacted().await
    }
}
