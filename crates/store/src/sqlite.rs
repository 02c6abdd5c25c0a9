//! The embedded SQLite backend: current state, event history, grouped commits and in-process watch.
//!
//! Layout: `kv` holds the current value of every live key, `events` the history of every write
//! (one row per revision, kept until compacted), `meta` the current and compacted revisions.
//! All writes go through one writer thread that drains its queue into one transaction per
//! round and fsyncs once (WAL, `synchronous=FULL`), so N concurrent clients pay for one commit.
//! Reads run on a few reader threads with a connection each, which WAL lets proceed next to the
//! writer.
//! After a commit the writer publishes the round's events on a broadcast channel; a watch
//! replays history from the `events` table and then follows that channel.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::{
    Deleted, Event, EventKind, KeyValue, ListOptions, ListResult, PROGRESS_INTERVAL, ProgressStream, Result, Revision,
    Store, StoreError, WatchItem, WatchStream,
};

/// Tuning knobs of [`SqliteStore`]; the defaults suit a control plane.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// Most write requests committed in one transaction.
    pub max_batch: usize,
    /// Read connections (concurrent reads).
    pub read_connections: usize,
    /// Committed batches buffered for live watchers before a slow one must re-read history.
    pub watch_buffer: usize,
    /// History rows a watcher reads from the database at a time while catching up.
    pub replay_chunk: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self { max_batch: 1024, read_connections: 4, watch_buffer: 1024, replay_chunk: 512 }
    }
}

/// The embedded store. Cheap to share behind an `Arc`; dropping it finishes the pending writes
/// and stops the writer thread (watch streams then end with `Unavailable`).
pub struct SqliteStore {
    writer: Option<mpsc::UnboundedSender<WriteRequest>>,
    writer_thread: Option<JoinHandle<()>>,
    reads: Arc<ReadPool>,
    events: broadcast::Sender<Batch>,
    counters: Arc<Counters>,
    replay_chunk: usize,
}

/// The events of one committed transaction, in revision order.
type Batch = Arc<Vec<Event>>;

/// Committed revisions, for answers that need no database read.
struct Counters {
    current: AtomicI64,
    compacted: AtomicI64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    revision INTEGER PRIMARY KEY,
    key BLOB NOT NULL,
    kind INTEGER NOT NULL,
    value BLOB,
    prev_value BLOB,
    create_revision INTEGER NOT NULL,
    prev_mod_revision INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_key ON events (key, revision);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0), ('compacted', 0);
";

const KIND_PUT: i64 = 0;
const KIND_DELETE: i64 = 1;

fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
    StoreError::Internal(e.into())
}

fn sql_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(ref f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    | rusqlite::ErrorCode::CannotOpen
            ) =>
        {
            StoreError::Unavailable(Box::new(e))
        }
        _ => StoreError::Internal(Box::new(e)),
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("sqlite writer thread has stopped".into())
}

/// The first key after every key that starts with `prefix`, or `None` when no such bound
/// exists (empty prefix, or only 0xff bytes).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The key range `[lo, hi)` a list or watch of `prefix` reads, starting at `start_key` if it
/// lies after the prefix's beginning.
fn key_range(prefix: &str, start_key: Option<&str>) -> (Vec<u8>, Option<Vec<u8>>) {
    let hi = prefix_end(prefix.as_bytes());
    let lo = match start_key {
        Some(s) if s > prefix => s.as_bytes().to_vec(),
        _ => prefix.as_bytes().to_vec(),
    };
    (lo, hi)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: the WAL is fsynced at every commit, so an acknowledged write survives a crash.
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(())
}

/// Deletes up to [`PURGE_CHUNK`] rows of history at or below `compacted`; how many went.
fn purge_history(conn: &Connection, compacted: Revision) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM events WHERE revision IN \
         (SELECT revision FROM events WHERE revision <= ?1 ORDER BY revision LIMIT ?2)",
    )?
    .execute(params![compacted, PURGE_CHUNK])
}

fn read_meta(conn: &Connection, name: &str) -> rusqlite::Result<Revision> {
    conn.prepare_cached("SELECT value FROM meta WHERE name = ?1")?.query_row([name], |r| r.get(0))
}

fn key_string(bytes: Vec<u8>) -> rusqlite::Result<String> {
    String::from_utf8(bytes)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e)))
}

fn row_to_kv(row: &Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: key_string(row.get(0)?)?,
        value: row.get(1)?,
        create_revision: row.get(2)?,
        mod_revision: row.get(3)?,
    })
}

fn row_to_event(row: &Row<'_>) -> rusqlite::Result<Event> {
    let kind: i64 = row.get(2)?;
    Ok(Event {
        revision: row.get(0)?,
        key: key_string(row.get(1)?)?,
        kind: if kind == KIND_DELETE { EventKind::Delete } else { EventKind::Put },
        value: row.get(3)?,
        prev_value: row.get(4)?,
        create_revision: row.get(5)?,
    })
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with default options.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens (creating if needed) the database at `path`.
    pub fn open_with(path: &Path, options: SqliteOptions) -> Result<Self> {
        let conn = Connection::open(path).map_err(sql_err)?;
        configure(&conn).map_err(sql_err)?;
        conn.execute_batch(SCHEMA).map_err(sql_err)?;
        let current = read_meta(&conn, "revision").map_err(sql_err)?;
        let compacted = read_meta(&conn, "compacted").map_err(sql_err)?;
        let counters = Arc::new(Counters { current: AtomicI64::new(current), compacted: AtomicI64::new(compacted) });

        let (events, _) = broadcast::channel(options.watch_buffer.max(1));
        let (tx, rx) = mpsc::unbounded_channel();
        let mut writer = Writer {
            conn,
            revision: current,
            compacted,
            events: events.clone(),
            counters: counters.clone(),
            max_batch: options.max_batch.max(1),
            // Rows a stop left behind are purged after the first write.
            purge_pending: true,
        };
        let writer_thread = std::thread::Builder::new()
            .name("berth-sqlite-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(internal)?;

        let reads = Arc::new(ReadPool::start(path, options.read_connections)?);
        Ok(Self {
            writer: Some(tx),
            writer_thread: Some(writer_thread),
            reads,
            events,
            counters,
            replay_chunk: options.replay_chunk.max(1),
        })
    }

    async fn write(&self, op: WriteOp) -> Result<Outcome> {
        let (reply, answer) = oneshot::channel();
        let writer = self.writer.as_ref().ok_or_else(closed)?;
        writer.send(WriteRequest { op, reply }).map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and exit; joining it means a
        // reopen of the same file right after sees every acknowledged write.
        self.writer.take();
        if let Some(handle) = self.writer_thread.take()
            && handle.join().is_err()
        {
            tracing::error!("sqlite writer thread panicked");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Writes

enum WriteOp {
    Create { key: String, value: Vec<u8> },
    Update { key: String, value: Vec<u8>, expected: Revision },
    Delete { key: String, expected: Option<Revision> },
    Compact { revision: Revision },
}

enum Outcome {
    Put(KeyValue),
    Deleted(Deleted),
    Compacted,
}

struct WriteRequest {
    op: WriteOp,
    reply: oneshot::Sender<Result<Outcome>>,
}

/// How long the writer waits for more writes when the last batch was larger than this one.
const LINGER: std::time::Duration = std::time::Duration::from_micros(150);

struct Writer {
    conn: Connection,
    revision: Revision,
    compacted: Revision,
    events: broadcast::Sender<Batch>,
    counters: Arc<Counters>,
    max_batch: usize,
    /// History at or below `compacted` may still be in `events`: compaction only moves the
    /// mark, and the rows go [`PURGE_CHUNK`] at a time between write rounds, so that forgetting
    /// minutes of history at once never holds up the writes queued behind it.
    purge_pending: bool,
}

/// History rows deleted per transaction after a compaction.
const PURGE_CHUNK: i64 = 256;

/// What one op did inside a transaction: its answer and, if it wrote, its event.
type Applied = (Result<Outcome>, Option<Event>);

impl Writer {
    fn run(&mut self, mut rx: mpsc::UnboundedReceiver<WriteRequest>) {
        let mut previous = 1;
        loop {
            let first = match rx.try_recv() {
                Ok(req) => req,
                // Idle: purge compacted history until there is none, then wait.
                Err(mpsc::error::TryRecvError::Empty) if self.purge_pending => {
                    self.purge_chunk();
                    continue;
                }
                Err(mpsc::error::TryRecvError::Empty) => match rx.blocking_recv() {
                    Some(req) => req,
                    None => break,
                },
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            };
            let mut batch = vec![first];
            self.drain(&mut rx, &mut batch);
            // Under concurrent load the clients answered by the last commit are sending their
            // next writes right now: waiting a moment lets one fsync cover them all. A lone
            // writer (previous batch of one) never waits.
            if previous > 1 && batch.len() < previous {
                std::thread::sleep(LINGER);
                self.drain(&mut rx, &mut batch);
            }
            previous = batch.len();
            // Busy: the round's transaction also purges a chunk of history (see `apply_all`).
            self.commit_batch(batch);
        }
    }

    /// Deletes up to [`PURGE_CHUNK`] rows of history at or below the compacted revision, in a
    /// transaction of its own: for an idle writer.
    fn purge_chunk(&mut self) {
        let deleted = purge_history(&self.conn, self.compacted);
        match deleted {
            Ok(n) => self.purge_pending = n as i64 == PURGE_CHUNK,
            Err(e) => {
                // Left for the next compaction: the rows are out of reach already.
                tracing::warn!(error = %e, "purging compacted history failed");
                self.purge_pending = false;
            }
        }
    }

    fn drain(&self, rx: &mut mpsc::UnboundedReceiver<WriteRequest>, batch: &mut Vec<WriteRequest>) {
        while batch.len() < self.max_batch {
            match rx.try_recv() {
                Ok(req) => batch.push(req),
                Err(_) => break,
            }
        }
    }

    fn commit_batch(&mut self, batch: Vec<WriteRequest>) {
        match self.apply_all(&batch) {
            Ok(applied) => self.publish(batch, applied),
            Err(e) if batch.len() > 1 => {
                // A database error (not a failed precondition) aborted the whole transaction;
                // retry each op alone so only the ones that really fail report it.
                tracing::warn!(error = %e, size = batch.len(), "sqlite batch failed, retrying singly");
                for req in batch {
                    self.commit_batch(vec![req]);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "sqlite write failed");
                let msg = e.to_string();
                for req in batch {
                    let _ = req.reply.send(Err(internal(msg.clone())));
                }
            }
        }
    }

    /// Runs every op of `batch` in one transaction and commits it. On error nothing is
    /// committed and the writer's revision counters are unchanged.
    fn apply_all(&mut self, batch: &[WriteRequest]) -> rusqlite::Result<Vec<Applied>> {
        let mut revision = self.revision;
        let mut compacted = self.compacted;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut applied = Vec::with_capacity(batch.len());
        for req in batch {
            applied.push(apply_op(&tx, &req.op, &mut revision, &mut compacted)?);
        }
        if revision != self.revision {
            tx.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'revision'")?.execute([revision])?;
        }
        if compacted != self.compacted {
            tx.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'compacted'")?.execute([compacted])?;
        }
        // A chunk of compacted history goes with the round, not in a commit (and fsync) of its
        // own, so history still goes while writes keep coming at no extra commit.
        let purged = match self.purge_pending.then(|| purge_history(&tx, self.compacted)) {
            Some(Err(e)) => {
                // Left for the next compaction: the rows are out of reach already.
                tracing::warn!(error = %e, "purging compacted history failed");
                Some(0)
            }
            Some(Ok(n)) => Some(n),
            None => None,
        };
        tx.commit()?;
        self.revision = revision;
        if let Some(n) = purged {
            self.purge_pending = n as i64 == PURGE_CHUNK;
        }
        self.purge_pending |= compacted != self.compacted;
        self.compacted = compacted;
        Ok(applied)
    }

    fn publish(&mut self, batch: Vec<WriteRequest>, applied: Vec<Applied>) {
        self.counters.current.store(self.revision, Ordering::SeqCst);
        self.counters.compacted.store(self.compacted, Ordering::SeqCst);
        let mut answers = Vec::with_capacity(applied.len());
        let mut events = Vec::new();
        for (answer, event) in applied {
            answers.push(answer);
            events.extend(event);
        }
        // Publish before answering: a client that saw its write acknowledged and then starts a
        // watch must find the write either in history or in the live channel.
        if !events.is_empty() {
            let _ = self.events.send(Arc::new(events));
        }
        for (req, answer) in batch.into_iter().zip(answers) {
            let _ = req.reply.send(answer);
        }
    }
}

fn current_kv(conn: &Connection, key: &str) -> rusqlite::Result<Option<KeyValue>> {
    conn.prepare_cached("SELECT key, value, create_revision, mod_revision FROM kv WHERE key = ?1")?
        .query_row([key.as_bytes()], row_to_kv)
        .optional()
}

fn insert_event(conn: &Connection, ev: &Event, prev_mod_revision: Revision) -> rusqlite::Result<()> {
    let kind = match ev.kind {
        EventKind::Put => KIND_PUT,
        EventKind::Delete => KIND_DELETE,
    };
    conn.prepare_cached(
        "INSERT INTO events (revision, key, kind, value, prev_value, create_revision, \
         prev_mod_revision) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        ev.revision,
        ev.key.as_bytes(),
        kind,
        ev.value,
        ev.prev_value,
        ev.create_revision,
        prev_mod_revision
    ])?;
    Ok(())
}

fn apply_op(
    conn: &Connection,
    op: &WriteOp,
    revision: &mut Revision,
    compacted: &mut Revision,
) -> rusqlite::Result<Applied> {
    match op {
        WriteOp::Create { key, value } => {
            if current_kv(conn, key)?.is_some() {
                return Ok((Err(StoreError::AlreadyExists { key: key.clone() }), None));
            }
            *revision += 1;
            let rev = *revision;
            conn.prepare_cached("INSERT INTO kv (key, value, create_revision, mod_revision) VALUES (?1, ?2, ?3, ?3)")?
                .execute(params![key.as_bytes(), value, rev])?;
            let ev = Event {
                kind: EventKind::Put,
                key: key.clone(),
                revision: rev,
                create_revision: rev,
                value: Some(value.clone()),
                prev_value: None,
            };
            insert_event(conn, &ev, 0)?;
            let kv = KeyValue { key: key.clone(), value: value.clone(), create_revision: rev, mod_revision: rev };
            Ok((Ok(Outcome::Put(kv)), Some(ev)))
        }
        WriteOp::Update { key, value, expected } => {
            let Some(cur) = current_kv(conn, key)? else {
                return Ok((Err(StoreError::NotFound { key: key.clone() }), None));
            };
            if cur.mod_revision != *expected {
                return Ok((Err(StoreError::Conflict { key: key.clone(), current: Some(cur) }), None));
            }
            *revision += 1;
            let rev = *revision;
            conn.prepare_cached("UPDATE kv SET value = ?2, mod_revision = ?3 WHERE key = ?1")?.execute(params![
                key.as_bytes(),
                value,
                rev
            ])?;
            let ev = Event {
                kind: EventKind::Put,
                key: key.clone(),
                revision: rev,
                create_revision: cur.create_revision,
                value: Some(value.clone()),
                prev_value: Some(cur.value),
            };
            insert_event(conn, &ev, cur.mod_revision)?;
            let kv = KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: cur.create_revision,
                mod_revision: rev,
            };
            Ok((Ok(Outcome::Put(kv)), Some(ev)))
        }
        WriteOp::Delete { key, expected } => {
            let Some(cur) = current_kv(conn, key)? else {
                return Ok((Err(StoreError::NotFound { key: key.clone() }), None));
            };
            if expected.is_some_and(|e| e != cur.mod_revision) {
                return Ok((Err(StoreError::Conflict { key: key.clone(), current: Some(cur) }), None));
            }
            *revision += 1;
            let rev = *revision;
            conn.prepare_cached("DELETE FROM kv WHERE key = ?1")?.execute([key.as_bytes()])?;
            let ev = Event {
                kind: EventKind::Delete,
                key: key.clone(),
                revision: rev,
                create_revision: cur.create_revision,
                value: None,
                prev_value: Some(cur.value.clone()),
            };
            insert_event(conn, &ev, cur.mod_revision)?;
            Ok((Ok(Outcome::Deleted(Deleted { prev: cur, revision: rev })), Some(ev)))
        }
        WriteOp::Compact { revision: target } => {
            if *target > *revision {
                let msg = format!("cannot compact to {target}: current revision is {revision}");
                return Ok((Err(StoreError::Invalid(msg)), None));
            }
            // Only the mark moves here; the writer purges the rows after the commit.
            if *target > *compacted {
                *compacted = *target;
            }
            Ok((Ok(Outcome::Compacted), None))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reads

/// A job for a reader thread: it gets that thread's connection, or why there is none.
type ReadJob = Box<dyn FnOnce(Result<&mut Connection>) + Send>;

/// Reader threads, each with its own connection, taking jobs from one queue. A reader goes from
/// one query to the next without waiting for the async runtime: with the runtime busy, handing
/// connections out through an async semaphore made every read also wait for the runtime to
/// poll the task next in line, and reads queued for most of a second.
struct ReadPool {
    jobs: crossbeam_channel::Sender<ReadJob>,
}

impl ReadPool {
    /// Starts `threads` readers; they end once the pool is dropped and the queue is empty.
    fn start(path: &Path, threads: usize) -> Result<ReadPool> {
        let (jobs, queue) = crossbeam_channel::unbounded::<ReadJob>();
        for i in 0..threads.max(1) {
            let (queue, path) = (queue.clone(), path.to_path_buf());
            std::thread::Builder::new()
                .name(format!("berth-sqlite-rd{i}"))
                .spawn(move || read_jobs(&path, &queue))
                .map_err(internal)?;
        }
        Ok(ReadPool { jobs })
    }

    /// Runs `f` on a reader's connection.
    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            let _ = reply.send(conn.and_then(f));
        });
        self.jobs.send(job).map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// A reader thread: runs jobs on its connection, opened on first use and again after a job left
/// it inside a transaction (an error midway) or panicked.
fn read_jobs(path: &Path, queue: &crossbeam_channel::Receiver<ReadJob>) {
    let mut conn: Option<Connection> = None;
    while let Ok(job) = queue.recv() {
        if conn.is_none() {
            match connect_reader(path) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    job(Err(sql_err(e)));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Ok(c))));
        if ran.is_err() || !c.is_autocommit() {
            conn = None;
        }
    }
}

fn connect_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "query_only", true)?;
    // Each reader keeps its own page cache, and a large list spreads its pages over all of
    // them: 512 KiB each (SQLite's default is 2 MiB) holds the upper levels of the indexes, and
    // the rest comes from the OS's cache of the file.
    conn.pragma_update(None, "cache_size", -512)?;
    Ok(conn)
}

/// Reads the current and compacted revisions of the snapshot `conn` is reading.
fn snapshot_revisions(conn: &Connection) -> rusqlite::Result<(Revision, Revision)> {
    Ok((read_meta(conn, "revision")?, read_meta(conn, "compacted")?))
}

/// The `AND key ...` clause of a range over `[lo, hi)`, with `lo` as `?1` and `hi` as `?2`.
fn range_clause(column: &str, hi: &Option<Vec<u8>>) -> String {
    match hi {
        Some(_) => format!("{column} >= ?1 AND {column} < ?2"),
        None => format!("{column} >= ?1 AND ?2 IS NULL"),
    }
}

fn list_at(conn: &mut Connection, prefix: &str, opts: &ListOptions) -> Result<ListResult> {
    let tx = conn.transaction().map_err(sql_err)?;
    let (current, compacted) = snapshot_revisions(&tx).map_err(sql_err)?;
    let revision = match opts.revision {
        None | Some(0) => current,
        Some(r) if r < 0 => return Err(StoreError::Invalid(format!("negative revision {r}"))),
        Some(r) if r < compacted => {
            return Err(StoreError::Compacted { requested: r, compacted });
        }
        Some(r) if r > current => {
            return Err(StoreError::Invalid(format!("revision {r} is newer than the current revision {current}")));
        }
        Some(r) => r,
    };
    let (lo, hi) = key_range(prefix, opts.start_key.as_deref());
    // One row more than asked tells whether more follow.
    let fetch = match opts.limit {
        Some(n) if n > 0 => i64::try_from(n).unwrap_or(i64::MAX - 1) + 1,
        _ => -1,
    };
    let mut items = if revision == current {
        let sql = format!(
            "SELECT key, value, create_revision, mod_revision FROM kv WHERE {} ORDER BY key LIMIT ?3",
            range_clause("key", &hi)
        );
        let mut stmt = tx.prepare_cached(&sql).map_err(sql_err)?;
        let rows = stmt.query_map(params![lo, hi, fetch], row_to_kv);
        rows.and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>()).map_err(sql_err)?
    } else {
        snapshot_page(&tx, &lo, &hi, fetch, revision).map_err(sql_err)?
    };
    tx.finish().map_err(sql_err)?;
    let more = fetch > 0 && items.len() as i64 == fetch;
    if more {
        items.pop();
    }
    Ok(ListResult { items, revision, more })
}

/// A page of the snapshot at `revision`: `fetch` keys from `lo` on, or every key to `hi` for a
/// negative `fetch`. Keys untouched since `revision` are as they are now; a key touched since
/// is as its first later event found it (absent if that event created it).
///
/// The snapshot query sorts every key of its range, so a page of a large prefix is asked for a
/// range that ends at the `window`th current key from `lo`: the snapshot there has as many keys,
/// less those created since `revision`, plus those deleted since. If that falls short of a
/// page, the window doubles until it holds one or reaches `hi`. A whole list, read page by page,
/// so costs in proportion to its size, not to its size squared.
fn snapshot_page(
    tx: &rusqlite::Transaction<'_>,
    lo: &[u8],
    hi: &Option<Vec<u8>>,
    fetch: i64,
    revision: Revision,
) -> rusqlite::Result<Vec<KeyValue>> {
    let mut window = fetch;
    loop {
        let bound: Option<Vec<u8>> = if window > 0 {
            let nth = format!("SELECT key FROM kv WHERE {} ORDER BY key LIMIT 1 OFFSET ?3", range_clause("key", hi));
            tx.prepare_cached(&nth)?.query_row(params![lo, hi, window - 1], |r| r.get(0)).optional()?
        } else {
            None
        };
        // Up to and including the bound.
        let end = bound.map(|mut b| {
            b.push(0);
            b
        });
        let page_hi = if end.is_some() { &end } else { hi };
        let sql = format!(
            "WITH touched AS (
                 SELECT key, MIN(revision) AS first FROM events
                 WHERE revision > ?4 AND {range} GROUP BY key
             )
             SELECT key, value, create_revision, mod_revision FROM kv
             WHERE {range} AND key NOT IN (SELECT key FROM touched)
             UNION ALL
             SELECT e.key, e.prev_value, e.create_revision, e.prev_mod_revision
             FROM touched t JOIN events e ON e.revision = t.first
             WHERE e.prev_mod_revision > 0
             ORDER BY 1 LIMIT ?3",
            range = range_clause("key", page_hi),
        );
        let mut stmt = tx.prepare_cached(&sql)?;
        let items =
            stmt.query_map(params![lo, page_hi, fetch, revision], row_to_kv)?.collect::<rusqlite::Result<Vec<_>>>()?;
        if end.is_none() || items.len() as i64 >= fetch {
            return Ok(items);
        }
        window = window.saturating_mul(2);
    }
}

/// One chunk of history for a watcher: events under the range after `after`, and the revision
/// of the snapshot they were read from.
fn read_history(
    conn: &mut Connection,
    lo: &[u8],
    hi: &Option<Vec<u8>>,
    after: Revision,
    limit: usize,
) -> Result<(Vec<Event>, Revision)> {
    let tx = conn.transaction().map_err(sql_err)?;
    let (current, compacted) = snapshot_revisions(&tx).map_err(sql_err)?;
    if after < compacted {
        return Err(StoreError::Compacted { requested: after, compacted });
    }
    let sql = format!(
        "SELECT revision, key, kind, value, prev_value, create_revision FROM events \
         WHERE revision > ?3 AND {} ORDER BY revision LIMIT ?4",
        range_clause("key", hi)
    );
    let events = {
        let mut stmt = tx.prepare_cached(&sql).map_err(sql_err)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        stmt.query_map(params![lo, hi, after, limit], row_to_event)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(sql_err)?
    };
    tx.finish().map_err(sql_err)?;
    Ok((events, current))
}

// ---------------------------------------------------------------------------------------------
// Watch

/// A watcher: replays history from the database until caught up, then follows the live
/// channel, re-reading history whenever it fell behind that channel.
struct Watcher {
    reads: Arc<ReadPool>,
    live: broadcast::Receiver<Batch>,
    prefix: String,
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
    /// Every event under the prefix up to this revision has been queued or delivered.
    seen: Revision,
    replaying: bool,
    queued: VecDeque<Event>,
    chunk: usize,
    done: bool,
    /// For a watch with progress: how long `seen` may run ahead of what was reported.
    progress_every: Option<Duration>,
    /// The revision of the last event or progress delivered.
    reported: Revision,
    /// Since when `seen` has been ahead of `reported` with nothing queued.
    ahead_since: Option<tokio::time::Instant>,
}

impl Watcher {
    /// Reads the next history chunk into the queue.
    async fn replay(&mut self) -> Result<()> {
        let (lo, hi, after, chunk) = (self.lo.clone(), self.hi.clone(), self.seen, self.chunk);
        let (events, snapshot) = self.reads.run(move |c| read_history(c, &lo, &hi, after, chunk)).await?;
        if events.len() < chunk {
            // Everything up to the snapshot has been read; the live channel covers the rest.
            self.replaying = false;
            self.seen = self.seen.max(snapshot);
        }
        if let Some(last) = events.last() {
            self.seen = self.seen.max(last.revision);
        }
        self.queued.extend(events);
        Ok(())
    }

    async fn next(&mut self) -> Option<Result<WatchItem>> {
        loop {
            if let Some(ev) = self.queued.pop_front() {
                self.reported = ev.revision;
                return Some(Ok(WatchItem::Event(ev)));
            }
            if self.done {
                return None;
            }
            if self.replaying {
                if let Err(e) = self.replay().await {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            }
            let due = self.ahead_since.zip(self.progress_every).map(|(since, every)| since + every);
            let received = match due {
                Some(due) => tokio::select! {
                    received = self.live.recv() => received,
                    () = tokio::time::sleep_until(due) => {
                        self.ahead_since = None;
                        if self.seen > self.reported {
                            self.reported = self.seen;
                            return Some(Ok(WatchItem::Progress(self.seen)));
                        }
                        continue;
                    }
                },
                None => self.live.recv().await,
            };
            match received {
                Ok(batch) => {
                    for ev in batch.iter() {
                        if ev.revision > self.seen && ev.key.starts_with(&self.prefix) {
                            self.queued.push_back(ev.clone());
                        }
                    }
                    if let Some(last) = batch.last() {
                        self.seen = self.seen.max(last.revision);
                    }
                    if self.progress_every.is_some() && self.ahead_since.is_none() && self.seen > self.reported {
                        self.ahead_since = Some(tokio::time::Instant::now());
                    }
                }
                // Missed batches are committed, so the database has them (or they were
                // compacted, which `replay` reports).
                Err(broadcast::error::RecvError::Lagged(_)) => self.replaying = true,
                Err(broadcast::error::RecvError::Closed) => {
                    self.done = true;
                    return Some(Err(closed()));
                }
            }
        }
    }
}

impl SqliteStore {
    /// The watch behind [`Store::watch`] and [`Store::watch_with_progress`].
    async fn watch_items(
        &self,
        prefix: &str,
        after: Revision,
        progress_every: Option<Duration>,
    ) -> Result<ProgressStream> {
        if after < 0 {
            return Err(StoreError::Invalid(format!("negative revision {after}")));
        }
        let (lo, hi) = key_range(prefix, None);
        let mut watcher = Watcher {
            reads: self.reads.clone(),
            // Subscribe before reading history so nothing committed meanwhile is missed.
            live: self.events.subscribe(),
            prefix: prefix.to_owned(),
            lo,
            hi,
            seen: after,
            replaying: true,
            queued: VecDeque::new(),
            chunk: self.replay_chunk,
            done: false,
            progress_every,
            reported: after,
            ahead_since: None,
        };
        // The first chunk is read now so that a compacted `after` fails the call itself.
        watcher.replay().await?;
        Ok(Box::pin(futures::stream::unfold(watcher, |mut w| async move { w.next().await.map(|item| (item, w)) })))
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let key = key.to_owned();
        self.reads.run(move |c| current_kv(c, &key).map_err(sql_err)).await
    }

    async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListResult> {
        let (prefix, opts) = (prefix.to_owned(), opts.clone());
        self.reads.run(move |c| list_at(c, &prefix, &opts)).await
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        match self.write(WriteOp::Create { key: key.to_owned(), value }).await? {
            Outcome::Put(kv) => Ok(kv),
            _ => Err(internal("unexpected outcome of create")),
        }
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<KeyValue> {
        match self.write(WriteOp::Update { key: key.to_owned(), value, expected }).await? {
            Outcome::Put(kv) => Ok(kv),
            _ => Err(internal("unexpected outcome of update")),
        }
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Deleted> {
        match self.write(WriteOp::Delete { key: key.to_owned(), expected }).await? {
            Outcome::Deleted(d) => Ok(d),
            _ => Err(internal("unexpected outcome of delete")),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        let items = self.watch_items(prefix, after, None).await?;
        Ok(crate::events_only(items))
    }

    async fn watch_with_progress(&self, prefix: &str, after: Revision) -> Result<ProgressStream> {
        self.watch_items(prefix, after, Some(PROGRESS_INTERVAL)).await
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.counters.current.load(Ordering::SeqCst))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        match self.write(WriteOp::Compact { revision }).await? {
            Outcome::Compacted => Ok(()),
            _ => Err(internal("unexpected outcome of compact")),
        }
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.counters.compacted.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/b/"), Some(b"/a/b0".to_vec()));
        assert_eq!(prefix_end(b"a"), Some(b"b".to_vec()));
    }

    #[test]
    fn prefix_end_skips_trailing_ff_bytes() {
        assert_eq!(prefix_end(&[b'a', 0xff, 0xff]), Some(b"b".to_vec()));
        assert_eq!(prefix_end(&[0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn key_range_starts_at_the_later_of_prefix_and_start_key() {
        assert_eq!(key_range("/a/", Some("/a/x")).0, b"/a/x".to_vec());
        assert_eq!(key_range("/a/", Some("/")).0, b"/a/".to_vec());
        assert_eq!(key_range("/a/", None), (b"/a/".to_vec(), Some(b"/a0".to_vec())));
    }

    fn temp_store(options: SqliteOptions) -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open_with(&dir.path().join("db.sqlite"), options).expect("open");
        (dir, store)
    }

    #[tokio::test]
    async fn a_new_store_is_at_revision_zero() {
        let (_dir, store) = temp_store(SqliteOptions::default());
        assert_eq!(store.current_revision().await.expect("rev"), 0);
        assert_eq!(store.compacted_revision().await.expect("compacted"), 0);
    }

    #[tokio::test]
    async fn a_failed_precondition_does_not_fail_its_batch_neighbours() {
        let (_dir, store) = temp_store(SqliteOptions::default());
        let store = Arc::new(store);
        store.create("/k/dup", b"x".to_vec()).await.expect("seed");
        let mut tasks = Vec::new();
        for i in 0..32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                if i % 2 == 0 {
                    store.create("/k/dup", b"y".to_vec()).await.map(|_| ())
                } else {
                    store.create(&format!("/k/{i}"), b"y".to_vec()).await.map(|_| ())
                }
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let res = t.await.expect("join");
            if i % 2 == 0 {
                assert!(matches!(res, Err(StoreError::AlreadyExists { .. })), "{res:?}");
            } else {
                assert!(res.is_ok(), "{res:?}");
            }
        }
        assert_eq!(store.current_revision().await.expect("rev"), 17);
    }

    #[tokio::test]
    async fn a_watcher_that_lags_behind_the_live_channel_rereads_history() {
        // A one-batch live buffer forces every slow watcher into the Lagged path.
        let options = SqliteOptions { watch_buffer: 1, replay_chunk: 3, ..Default::default() };
        let (_dir, store) = temp_store(options);
        let mut watch = store.watch("/lag/", 0).await.expect("watch");
        for i in 0..20 {
            store.create(&format!("/lag/{i:02}"), vec![i]).await.expect("create");
        }
        use futures::StreamExt;
        let mut revisions = Vec::new();
        while revisions.len() < 20 {
            let ev = tokio::time::timeout(Duration::from_secs(5), watch.next())
                .await
                .expect("event in time")
                .expect("stream open")
                .expect("event");
            revisions.push(ev.revision);
        }
        assert_eq!(revisions, (1..=20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_lagging_watcher_whose_gap_was_compacted_ends_with_compacted() {
        let options = SqliteOptions { watch_buffer: 1, ..Default::default() };
        let (_dir, store) = temp_store(options);
        let mut watch = store.watch("/gap/", 0).await.expect("watch");
        for i in 0..5 {
            store.create(&format!("/gap/{i}"), vec![i]).await.expect("create");
        }
        store.compact(4).await.expect("compact");
        use futures::StreamExt;
        let first = watch.next().await.expect("item");
        assert!(matches!(first, Err(StoreError::Compacted { compacted: 4, .. })), "{first:?}");
        assert!(watch.next().await.is_none());
    }

    #[tokio::test]
    async fn compacted_history_is_deleted_after_the_compaction_is_acknowledged_and_later_history_stays() {
        let (dir, store) = temp_store(SqliteOptions::default());
        for i in 0..1000 {
            store.create(&format!("/h/{i:04}"), vec![1; 64]).await.expect("create");
        }
        store.compact(900).await.expect("compact");
        assert_eq!(store.compacted_revision().await.expect("compacted"), 900);
        let probe = Connection::open(dir.path().join("db.sqlite")).expect("open");
        let count = |op: &str| -> i64 {
            probe
                .query_row(&format!("SELECT COUNT(*) FROM events WHERE revision {op} 900"), [], |r| r.get(0))
                .expect("count")
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while count("<=") > 0 {
            assert!(std::time::Instant::now() < deadline, "{} rows at or below 900 are left", count("<="));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(count(">"), 100, "history after the compacted revision stays");
        let mut watch = store.watch("/h/", 900).await.expect("watch from the compacted revision");
        store.create("/h/new", vec![2]).await.expect("create");
        use futures::StreamExt;
        let first = watch.next().await.expect("item").expect("event");
        assert_eq!(first.revision, 901);
    }

    #[tokio::test]
    async fn compacting_beyond_the_current_revision_is_invalid() {
        let (_dir, store) = temp_store(SqliteOptions::default());
        store.create("/c", b"1".to_vec()).await.expect("create");
        let res = store.compact(5).await;
        assert!(matches!(res, Err(StoreError::Invalid(_))), "{res:?}");
        assert_eq!(store.compacted_revision().await.expect("compacted"), 0);
    }
}
