//! The [`Store`] of sandbox and container records: the in-memory tables with their name
//! reservations and id-prefix index, each change written to disk before it becomes visible,
//! claims that keep two slow verbs off one record, and `recover` at startup.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::container::ContainerRecord;
use super::disk;
pub use super::disk::Skipped;
use super::error::{Action, Kind, Op, StateError};
use super::filter::{ContainerFilter, SandboxFilter};
use super::is_valid_id;
use super::sandbox::{SandboxRecord, SandboxState};

/// A kind of record the store keeps: [`SandboxRecord`] or [`ContainerRecord`].
pub trait Record: private::Sealed + Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static {
    const KIND: Kind;
    /// The directory under the store's root with one directory per record.
    const DIR: &'static str;
    /// The record's file in its directory.
    const FILE: &'static str;
    fn id(&self) -> &str;
    fn reservation_key(&self) -> String;
    fn display_name(&self) -> String;
    fn created_at(&self) -> i64;
}

impl Record for SandboxRecord {
    const KIND: Kind = Kind::Sandbox;
    const DIR: &'static str = "sandboxes";
    const FILE: &'static str = "sandbox.json";
    fn id(&self) -> &str {
        &self.id
    }
    fn reservation_key(&self) -> String {
        SandboxRecord::reservation_key(self)
    }
    fn display_name(&self) -> String {
        SandboxRecord::display_name(self)
    }
    fn created_at(&self) -> i64 {
        self.created_at
    }
}

impl Record for ContainerRecord {
    const KIND: Kind = Kind::Container;
    const DIR: &'static str = "containers";
    const FILE: &'static str = "container.json";
    fn id(&self) -> &str {
        &self.id
    }
    fn reservation_key(&self) -> String {
        ContainerRecord::reservation_key(self)
    }
    fn display_name(&self) -> String {
        ContainerRecord::display_name(self)
    }
    fn created_at(&self) -> i64 {
        self.created_at
    }
}

mod private {
    use super::{Action, ContainerRecord, Inner, SandboxRecord, StateError, Table};

    /// Which table of the store holds a kind of record (and that no one else implements `Record`).
    pub trait Sealed: Sized {
        fn table(inner: &Inner) -> &Table<Self>;
        fn table_mut(inner: &mut Inner) -> &mut Table<Self>;
        /// Whether the record may be removed now, given the others.
        fn check_remove(&self, inner: &Inner) -> Result<(), StateError>;
    }

    impl Sealed for SandboxRecord {
        fn table(inner: &Inner) -> &Table<Self> {
            &inner.sandboxes
        }
        fn table_mut(inner: &mut Inner) -> &mut Table<Self> {
            &mut inner.sandboxes
        }
        fn check_remove(&self, inner: &Inner) -> Result<(), StateError> {
            self.ensure(Action::Remove)?;
            let containers = inner.container_ids_in(&self.id);
            if containers.is_empty() {
                Ok(())
            } else {
                Err(StateError::SandboxHasContainers { id: self.id.clone(), containers })
            }
        }
    }

    impl Sealed for ContainerRecord {
        fn table(inner: &Inner) -> &Table<Self> {
            &inner.containers
        }
        fn table_mut(inner: &mut Inner) -> &mut Table<Self> {
            &mut inner.containers
        }
        fn check_remove(&self, _: &Inner) -> Result<(), StateError> {
            self.ensure(Action::Remove)
        }
    }
}

pub struct Entry<R> {
    record: R,
    /// The slow operation holding the record, if any (memory only: a restart ends them all).
    busy: Option<Op>,
    /// The record's last write was not synced: the next synced update writes it even unchanged.
    unsynced: bool,
}

// `pub` only to appear in the sealed trait: the module is private, so it is not nameable.
pub struct Table<R> {
    /// Ordered, so that the ids with a prefix are one range.
    records: BTreeMap<String, Entry<R>>,
    /// Reservation key → id of the record holding the name.
    names: HashMap<String, String>,
}

impl<R> Default for Table<R> {
    fn default() -> Self {
        Table { records: BTreeMap::new(), names: HashMap::new() }
    }
}

impl<R: Record> Table<R> {
    /// The one id that is `prefix` or starts with it.
    fn resolve(&self, prefix: &str) -> Result<&str, StateError> {
        if prefix.is_empty() {
            return Err(StateError::Invalid { kind: R::KIND, reason: "the id is empty" });
        }
        use std::ops::Bound;
        let mut ids = self
            .records
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .map(|(id, _)| id.as_str())
            .take_while(|id| id.starts_with(prefix));
        match (ids.next(), ids.next()) {
            (Some(id), None) => Ok(id),
            (None, _) => Err(StateError::NotFound { kind: R::KIND, id: prefix.to_string() }),
            (Some(_), Some(_)) => {
                let count = 2 + ids.count();
                Err(StateError::Ambiguous { kind: R::KIND, prefix: prefix.to_string(), count })
            }
        }
    }

    fn entry(&self, prefix: &str) -> Result<&Entry<R>, StateError> {
        let id = self.resolve(prefix)?;
        Ok(&self.records[id])
    }

    /// `NameReserved` if another record holds `record`'s name.
    fn check_name(&self, record: &R) -> Result<(), StateError> {
        match self.names.get(&record.reservation_key()) {
            Some(by_id) if by_id != record.id() => {
                Err(StateError::NameReserved { kind: R::KIND, name: record.display_name(), by_id: by_id.clone() })
            }
            _ => Ok(()),
        }
    }

    /// Adds a record written without a sync, or loaded from a file that may still be one.
    fn insert(&mut self, record: R, busy: Option<Op>) {
        self.names.entry(record.reservation_key()).or_insert_with(|| record.id().to_string());
        self.records.insert(record.id().to_string(), Entry { record, busy, unsynced: true });
    }

    /// Removes the record and releases its name if it held it.
    fn remove(&mut self, id: &str) -> Option<R> {
        let entry = self.records.remove(id)?;
        let key = entry.record.reservation_key();
        if self.names.get(&key).is_some_and(|holder| holder == id) {
            self.names.remove(&key);
        }
        Some(entry.record)
    }

    fn sorted(&self, keep: impl Fn(&R) -> bool) -> Vec<R> {
        let mut out: Vec<R> = self.records.values().map(|e| &e.record).filter(|r| keep(r)).cloned().collect();
        out.sort_by(|a, b| (a.created_at(), a.id()).cmp(&(b.created_at(), b.id())));
        out
    }
}

#[derive(Default)]
pub struct Inner {
    sandboxes: Table<SandboxRecord>,
    containers: Table<ContainerRecord>,
}

impl Inner {
    fn container_ids_in(&self, sandbox_id: &str) -> Vec<String> {
        let records = self.containers.records.values().map(|e| &e.record);
        records.filter(|c| c.sandbox_id == sandbox_id).map(|c| c.id.clone()).collect()
    }
}

/// What [`Store::recover`] found.
#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub sandboxes: usize,
    pub containers: usize,
    /// Record files that could not be loaded (and directories that are not records).
    pub skipped: Vec<Skipped>,
    /// Record directories without a record file: leftovers of a removal to finish.
    pub stray_dirs: Vec<PathBuf>,
    /// Containers whose sandbox has no record (its file was skipped); they are kept and listed.
    pub orphan_containers: Vec<String>,
    /// Records loaded without their name because an older record holds it.
    pub name_conflicts: Vec<String>,
}

/// The records of all pod sandboxes and containers, in memory and under `root`. See the module
/// docs of [`state`](super) for the locking rules.
pub struct Store {
    root: PathBuf,
    /// Serializes mutations; taken before `inner` and held across the disk write.
    write: Mutex<()>,
    inner: Mutex<Inner>,
}

/// A sandbox held by a slow operation.
pub type SandboxClaim = Claim<SandboxRecord>;
/// A container held by a slow operation.
pub type ContainerClaim = Claim<ContainerRecord>;

/// Every change to `Inner` is made on a copy and swapped in, so a panic never leaves it half
/// changed and a poisoned lock is safe to take over.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store {
    /// Loads every record under `root` (creating the directories on first use), reserves their
    /// names, and reports what it skipped. Run [`Store::reconcile`] next, before serving.
    pub fn recover(root: impl Into<PathBuf>) -> Result<(Arc<Store>, RecoveryReport), StateError> {
        let root = root.into();
        for dir in [SandboxRecord::DIR, ContainerRecord::DIR] {
            let dir = root.join(dir);
            std::fs::create_dir_all(&dir).map_err(StateError::io("creating", &dir))?;
        }
        let mut report = RecoveryReport::default();
        let mut inner = Inner::default();
        load_into::<SandboxRecord>(&root, &mut inner, &mut report)?;
        load_into::<ContainerRecord>(&root, &mut inner, &mut report)?;
        report.sandboxes = inner.sandboxes.records.len();
        report.containers = inner.containers.records.len();
        let orphans = inner.containers.records.values().map(|e| &e.record);
        report.orphan_containers =
            orphans.filter(|c| !inner.sandboxes.records.contains_key(&c.sandbox_id)).map(|c| c.id.clone()).collect();
        for s in &report.skipped {
            tracing::warn!(path = %s.path.display(), reason = %s.reason, "skipped a record that does not load");
        }
        for id in &report.orphan_containers {
            tracing::warn!(container = %id, "container record whose sandbox has no record");
        }
        let store = Store { root, write: Mutex::new(()), inner: Mutex::new(inner) };
        Ok((Arc::new(store), report))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/sandboxes/<id>`: the record's directory, where the RPC layer may keep the
    /// sandbox's other files (it must remove them before the record).
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.root.join(SandboxRecord::DIR).join(id)
    }

    /// `<root>/containers/<id>`, as [`Store::sandbox_dir`].
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.root.join(ContainerRecord::DIR).join(id)
    }

    fn file<R: Record>(&self, id: &str) -> PathBuf {
        self.root.join(R::DIR).join(id).join(R::FILE)
    }

    fn persist<R: Record>(&self, record: &R, sync: disk::Sync) -> Result<(), StateError> {
        let mut bytes = serde_json::to_vec_pretty(record).expect("a record serializes");
        bytes.push(b'\n');
        disk::write_atomic(&self.file::<R>(record.id()), &bytes, sync)
    }

    // ---- reads ----

    /// The full id that `id_or_prefix` names.
    pub fn resolve<R: Record>(&self, id_or_prefix: &str) -> Result<String, StateError> {
        R::table(&lock(&self.inner)).resolve(id_or_prefix).map(str::to_string)
    }

    /// The record that `id_or_prefix` names.
    pub fn get<R: Record>(&self, id_or_prefix: &str) -> Result<R, StateError> {
        R::table(&lock(&self.inner)).entry(id_or_prefix).map(|e| e.record.clone())
    }

    pub fn sandbox(&self, id_or_prefix: &str) -> Result<SandboxRecord, StateError> {
        self.get(id_or_prefix)
    }

    pub fn container(&self, id_or_prefix: &str) -> Result<ContainerRecord, StateError> {
        self.get(id_or_prefix)
    }

    /// ListPodSandbox: the matching sandboxes, oldest first.
    pub fn list_sandboxes(&self, filter: &SandboxFilter) -> Vec<SandboxRecord> {
        let inner = lock(&self.inner);
        let mut filter = filter.clone();
        if let Some(prefix) = &filter.id {
            match inner.sandboxes.resolve(prefix) {
                Ok(id) => filter.id = Some(id.to_string()),
                Err(_) => return Vec::new(),
            }
        }
        inner.sandboxes.sorted(|s| filter.matches(s))
    }

    /// ListContainers: the matching containers, oldest first. A sandbox id that names no
    /// sandbox is compared whole, so orphaned containers can still be listed by it.
    pub fn list_containers(&self, filter: &ContainerFilter) -> Vec<ContainerRecord> {
        let inner = lock(&self.inner);
        let mut filter = filter.clone();
        if let Some(prefix) = &filter.id {
            match inner.containers.resolve(prefix) {
                Ok(id) => filter.id = Some(id.to_string()),
                Err(_) => return Vec::new(),
            }
        }
        if let Some(prefix) = &filter.sandbox_id {
            match inner.sandboxes.resolve(prefix) {
                Ok(id) => filter.sandbox_id = Some(id.to_string()),
                Err(StateError::NotFound { .. }) => {}
                Err(_) => return Vec::new(),
            }
        }
        inner.containers.sorted(|c| filter.matches(c))
    }

    /// The containers of a sandbox (full id), oldest first.
    pub fn containers_in(&self, sandbox_id: &str) -> Vec<ContainerRecord> {
        lock(&self.inner).containers.sorted(|c| c.sandbox_id == sandbox_id)
    }

    // ---- creation ----

    /// Records a new sandbox (state `Creating`, from [`SandboxRecord::new`]) and reserves its
    /// name; the returned claim is finished with `commit(|s| s.mark_ready())` or, when setup
    /// fails, `remove()`.
    pub fn create_sandbox(self: &Arc<Self>, record: SandboxRecord) -> Result<SandboxClaim, StateError> {
        if record.state() != SandboxState::Creating {
            return Err(StateError::Invalid { kind: Kind::Sandbox, reason: "a new sandbox must be creating" });
        }
        self.create(record, |_| Ok(()))
    }

    /// Records a new container (state `Created`, from [`ContainerRecord::new`]) in a ready
    /// sandbox and reserves its name; the returned claim is finished with `commit` once the OCI
    /// runtime created it or, when that fails, `remove()`.
    pub fn create_container(self: &Arc<Self>, record: ContainerRecord) -> Result<ContainerClaim, StateError> {
        if record.state() != super::ContainerState::Created {
            return Err(StateError::Invalid { kind: Kind::Container, reason: "a new container must be created" });
        }
        let sandbox_id = record.sandbox_id.clone();
        self.create(record, |inner| sandbox_allows(inner, &sandbox_id, Action::CreateContainerIn))
    }

    fn create<R: Record>(
        self: &Arc<Self>,
        record: R,
        check: impl FnOnce(&Inner) -> Result<(), StateError>,
    ) -> Result<Claim<R>, StateError> {
        if !is_valid_id(record.id()) {
            return Err(StateError::Invalid { kind: R::KIND, reason: "the id is not 64 lower-case hex digits" });
        }
        let _write = lock(&self.write);
        {
            let inner = lock(&self.inner);
            let table = R::table(&inner);
            if table.records.contains_key(record.id()) {
                return Err(StateError::Invalid { kind: R::KIND, reason: "the id is already in use" });
            }
            table.check_name(&record)?;
            check(&inner)?;
        }
        // Not synced: the claim's commit is what the RPC acknowledges.
        self.persist(&record, disk::Sync::PageCache)?;
        R::table_mut(&mut lock(&self.inner)).insert(record.clone(), Some(Op::Create));
        Ok(Claim { store: Arc::clone(self), id: record.id().to_string(), op: Op::Create, record })
    }

    // ---- claims ----

    /// Claims a container for StartContainer: it must be `Created`, in a ready sandbox. Finish
    /// with `commit(|c| c.start(pid, now_ns()))`.
    pub fn begin_start_container(self: &Arc<Self>, id_or_prefix: &str) -> Result<ContainerClaim, StateError> {
        self.begin(id_or_prefix, Op::Start, |inner, c: &ContainerRecord| {
            c.ensure(Action::Start)?;
            sandbox_allows(inner, &c.sandbox_id, Action::StartContainerIn)
        })
    }

    /// Claims a container for RemoveContainer: it must be `Created` or `Exited` (stop it first).
    /// Finish with `remove()`.
    pub fn begin_remove_container(self: &Arc<Self>, id_or_prefix: &str) -> Result<ContainerClaim, StateError> {
        self.begin(id_or_prefix, Op::Remove, |_, c: &ContainerRecord| c.ensure(Action::Remove))
    }

    /// Claims a sandbox for StopPodSandbox (any state: stop is idempotent). Finish with
    /// `commit(|s| Ok(s.stop()))`.
    pub fn begin_stop_sandbox(self: &Arc<Self>, id_or_prefix: &str) -> Result<SandboxClaim, StateError> {
        self.begin(id_or_prefix, Op::Stop, |_, _: &SandboxRecord| Ok(()))
    }

    /// Claims a sandbox for RemovePodSandbox (any state). Finish with `remove()` once its
    /// containers are removed.
    pub fn begin_remove_sandbox(self: &Arc<Self>, id_or_prefix: &str) -> Result<SandboxClaim, StateError> {
        self.begin(id_or_prefix, Op::Remove, |_, s: &SandboxRecord| s.ensure(Action::Remove))
    }

    fn begin<R: Record>(
        self: &Arc<Self>,
        id_or_prefix: &str,
        op: Op,
        guard: impl FnOnce(&Inner, &R) -> Result<(), StateError>,
    ) -> Result<Claim<R>, StateError> {
        let mut inner = lock(&self.inner);
        let entry = R::table(&inner).entry(id_or_prefix)?;
        let id = entry.record.id().to_string();
        if let Some(busy) = entry.busy {
            return Err(StateError::Busy { kind: R::KIND, id, op: busy });
        }
        guard(&inner, &entry.record)?;
        let record = entry.record.clone();
        R::table_mut(&mut inner).records.get_mut(&id).expect("resolved above").busy = Some(op);
        Ok(Claim { store: Arc::clone(self), id, op, record })
    }

    fn release<R: Record>(&self, id: &str, op: Op) {
        let mut inner = lock(&self.inner);
        let entry = R::table_mut(&mut inner).records.get_mut(id);
        if let Some(entry) = entry.filter(|e| e.busy == Some(op)) {
            entry.busy = None;
        }
    }

    // ---- updates ----

    /// Applies `f` to the sandbox and persists the result (if it changed) before anyone sees it.
    /// For changes that need no claim: recording the network, an idempotent stop.
    pub fn update_sandbox<T>(
        &self,
        id_or_prefix: &str,
        f: impl FnOnce(&mut SandboxRecord) -> Result<T, StateError>,
    ) -> Result<(T, SandboxRecord), StateError> {
        self.update(id_or_prefix, disk::Sync::Data, f)
    }

    /// Applies `f` to the container and persists the result (if it changed) before anyone sees
    /// it. For changes that need no claim: an exit seen by a watcher, StopContainer's exit.
    pub fn update_container<T>(
        &self,
        id_or_prefix: &str,
        f: impl FnOnce(&mut ContainerRecord) -> Result<T, StateError>,
    ) -> Result<(T, ContainerRecord), StateError> {
        self.update(id_or_prefix, disk::Sync::Data, f)
    }

    fn update<R: Record, T>(
        &self,
        id_or_prefix: &str,
        sync: disk::Sync,
        f: impl FnOnce(&mut R) -> Result<T, StateError>,
    ) -> Result<(T, R), StateError> {
        let _write = lock(&self.write);
        let (old, unsynced) = {
            let inner = lock(&self.inner);
            let entry = R::table(&inner).entry(id_or_prefix)?;
            (entry.record.clone(), entry.unsynced)
        };
        let mut new = old.clone();
        let out = f(&mut new)?;
        if new.id() != old.id() || new.reservation_key() != old.reservation_key() {
            return Err(StateError::Invalid { kind: R::KIND, reason: "an update must not change the id or the name" });
        }
        if new != old || (unsynced && sync == disk::Sync::Data) {
            self.persist(&new, sync)?;
            // Present: removal also takes the write lock.
            let mut inner = lock(&self.inner);
            let entry = R::table_mut(&mut inner).records.get_mut(old.id()).expect("held by the write lock");
            entry.record = new.clone();
            entry.unsynced = sync == disk::Sync::PageCache;
        }
        Ok((out, new))
    }

    fn remove<R: Record>(&self, id: &str) -> Result<R, StateError> {
        let _write = lock(&self.write);
        let record = {
            let inner = lock(&self.inner);
            let entry = R::table(&inner).entry(id)?;
            entry.record.check_remove(&inner)?;
            entry.record.clone()
        };
        disk::remove_record(&self.file::<R>(record.id()))?;
        R::table_mut(&mut lock(&self.inner)).remove(record.id());
        Ok(record)
    }

    // Used by reconcile, which needs no claim.
    pub(crate) fn all<R: Record>(&self) -> Vec<R> {
        R::table(&lock(&self.inner)).sorted(|_| true)
    }
}

/// `Ok` if the sandbox exists, is in a state that allows `action`, and is not being stopped or
/// removed.
fn sandbox_allows(inner: &Inner, sandbox_id: &str, action: Action) -> Result<(), StateError> {
    let entry = inner
        .sandboxes
        .records
        .get(sandbox_id)
        .ok_or_else(|| StateError::NotFound { kind: Kind::Sandbox, id: sandbox_id.to_string() })?;
    entry.record.ensure(action)?;
    match entry.busy {
        Some(op @ (Op::Stop | Op::Remove)) => Err(StateError::Busy { kind: Kind::Sandbox, id: sandbox_id.into(), op }),
        _ => Ok(()),
    }
}

fn load_into<R: Record>(root: &Path, inner: &mut Inner, report: &mut RecoveryReport) -> Result<(), StateError> {
    let mut loaded = disk::load_all::<R>(&root.join(R::DIR), R::FILE, |r| r.id())?;
    // Oldest first, so that of two records claiming one name the older keeps it.
    loaded.records.sort_by(|a, b| (a.created_at(), a.id()).cmp(&(b.created_at(), b.id())));
    let table = R::table_mut(inner);
    for record in loaded.records {
        if let Err(e) = table.check_name(&record) {
            tracing::warn!(kind = %R::KIND, id = record.id(), error = %e, "record loaded without its name");
            report.name_conflicts.push(record.id().to_string());
            table.records.insert(record.id().to_string(), Entry { record, busy: None, unsynced: true });
        } else {
            table.insert(record, None);
        }
    }
    report.skipped.extend(loaded.skipped);
    report.stray_dirs.extend(loaded.stray);
    Ok(())
}

/// A record held by a slow operation (see [`Op`]): another claim on it fails with
/// [`StateError::Busy`] until this one is committed, removed or dropped. Dropping it unfinished
/// only releases the record (a dropped `Create` claim leaves the record, `Creating`/`Created`, to
/// be stopped and removed like any other).
pub struct Claim<R: Record> {
    store: Arc<Store>,
    id: String,
    op: Op,
    record: R,
}

impl<R: Record> Claim<R> {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn op(&self) -> Op {
        self.op
    }

    /// The record as it was when claimed.
    pub fn record(&self) -> &R {
        &self.record
    }

    /// Applies the operation's final transition, persists it and releases the record.
    pub fn commit<T>(self, f: impl FnOnce(&mut R) -> Result<T, StateError>) -> Result<(T, R), StateError> {
        self.store.update(&self.id, disk::Sync::Data, f)
    }

    /// Applies an intermediate change (e.g. the netns path once it exists, so that a crash
    /// leaves it recorded for cleanup) and keeps the claim.
    pub fn update<T>(&mut self, f: impl FnOnce(&mut R) -> Result<T, StateError>) -> Result<T, StateError> {
        // Not synced: the commit that follows is what the RPC acknowledges.
        let (out, record) = self.store.update(&self.id, disk::Sync::PageCache, f)?;
        self.record = record;
        Ok(out)
    }

    /// Removes the record, releasing its name: the end of a remove, or the undoing of a failed
    /// create. A container must be `Created` or `Exited`; a sandbox must have no containers left.
    pub fn remove(self) -> Result<R, StateError> {
        self.store.remove::<R>(&self.id)
    }
}

impl<R: Record> Drop for Claim<R> {
    fn drop(&mut self) {
        self.store.release::<R>(&self.id, self.op);
    }
}

impl<R: Record> std::fmt::Debug for Claim<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim").field("kind", &R::KIND).field("id", &self.id).field("op", &self.op).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::state::container::tests::{container_config, container_in};
    use crate::state::sandbox::tests::{pod_config, sandbox};
    use crate::state::{ContainerState, Exit};

    fn store() -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let (store, report) = Store::recover(dir.path()).unwrap();
        assert_eq!((report.sandboxes, report.containers), (0, 0));
        (dir, store)
    }

    fn ready(store: &Arc<Store>, name: &str) -> SandboxRecord {
        let claim = store.create_sandbox(sandbox(name)).unwrap();
        claim.commit(|s| s.mark_ready()).unwrap().1
    }

    fn created(store: &Arc<Store>, sandbox: &SandboxRecord, name: &str) -> ContainerRecord {
        // Distinct creation times, so that lists (oldest first) come in creation order.
        static CLOCK: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(10_000);
        let mut record = container_in(sandbox, name);
        record.created_at = CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claim = store.create_container(record).unwrap();
        claim
            .commit(|c| {
                c.pid = Some(10);
                Ok(())
            })
            .unwrap()
            .1
    }

    fn running(store: &Arc<Store>, sandbox: &SandboxRecord, name: &str) -> ContainerRecord {
        let c = created(store, sandbox, name);
        store.begin_start_container(&c.id).unwrap().commit(|c| c.start(Some(11), 5_000)).unwrap().1
    }

    fn with_id(mut s: SandboxRecord, id: &str) -> SandboxRecord {
        s.id = id.to_string();
        s
    }

    #[test]
    fn a_created_sandbox_is_on_disk_and_listed_as_creating() {
        let (dir, store) = store();
        let claim = store.create_sandbox(sandbox("web")).unwrap();
        let id = claim.id().to_string();
        let file = dir.path().join("sandboxes").join(&id).join("sandbox.json");
        let on_disk: SandboxRecord = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        assert_eq!(on_disk.state(), SandboxState::Creating);
        assert_eq!(store.list_sandboxes(&SandboxFilter::default()), vec![on_disk]);
        claim.commit(|s| s.mark_ready()).unwrap();
        let on_disk: SandboxRecord = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        assert_eq!(on_disk.state(), SandboxState::Ready);
        assert_eq!(store.sandbox(&id).unwrap(), on_disk);
        assert_eq!(store.sandbox_dir(&id), file.parent().unwrap());
    }

    #[test]
    fn a_duplicate_sandbox_name_is_reserved_until_the_holder_is_removed() {
        let (_dir, store) = store();
        let first = ready(&store, "web");
        let err = store.create_sandbox(sandbox("web")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(r#"the pod sandbox name "web_default_uid-web_0" is already in use by {}"#, first.id)
        );
        assert!(matches!(err, StateError::NameReserved { by_id, .. } if by_id == first.id));
        // Another attempt is another name.
        store.create_sandbox(SandboxRecord::new(&pod_config("web", 1), "runc", 1).unwrap()).unwrap();
        store.update_sandbox(&first.id, |s| Ok(s.stop())).unwrap();
        store.begin_remove_sandbox(&first.id).unwrap().remove().unwrap();
        store.create_sandbox(sandbox("web")).unwrap();
    }

    #[test]
    fn a_duplicate_container_name_is_reserved_per_sandbox_until_removed() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let db = ready(&store, "db");
        let first = created(&store, &web, "app");
        let err = store.create_container(container_in(&web, "app")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(r#"the container name "app_{}_0" is already in use by {}"#, web.id, first.id)
        );
        created(&store, &db, "app");
        let next_attempt = ContainerRecord::new(&container_config("app", 1), &web, 3).unwrap();
        store.create_container(next_attempt).unwrap();
        store.begin_remove_container(&first.id).unwrap().remove().unwrap();
        created(&store, &web, "app");
    }

    #[test]
    fn a_failed_create_undone_by_remove_releases_the_name() {
        let (dir, store) = store();
        let claim = store.create_sandbox(sandbox("web")).unwrap();
        let id = claim.id().to_string();
        claim.remove().unwrap();
        assert!(!dir.path().join("sandboxes").join(&id).exists());
        assert!(matches!(store.sandbox(&id), Err(StateError::NotFound { .. })));
        ready(&store, "web");
    }

    #[test]
    fn containers_are_created_only_in_an_existing_ready_sandbox() {
        let (_dir, store) = store();
        let creating = store.create_sandbox(sandbox("web")).unwrap();
        let err = store.create_container(container_in(creating.record(), "app")).unwrap_err();
        assert!(matches!(err, StateError::IllegalTransition { kind: Kind::Sandbox, from: "creating", .. }), "{err}");
        drop(creating);
        let gone = sandbox("gone");
        let err = store.create_container(container_in(&gone, "app")).unwrap_err();
        assert!(matches!(err, StateError::NotFound { kind: Kind::Sandbox, .. }), "{err}");
        let web = ready(&store, "db");
        let stopping = store.begin_stop_sandbox(&web.id).unwrap();
        let err = store.create_container(container_in(&web, "app")).unwrap_err();
        assert!(matches!(err, StateError::Busy { kind: Kind::Sandbox, op: Op::Stop, .. }), "{err}");
        stopping.commit(|s| Ok(s.stop())).unwrap();
        let err = store.create_container(container_in(&web, "app")).unwrap_err();
        assert!(matches!(err, StateError::IllegalTransition { from: "not ready", .. }), "{err}");
    }

    #[test]
    fn a_new_record_must_be_in_its_initial_state_with_a_proper_id() {
        let (_dir, store) = store();
        let mut s = sandbox("web");
        s.mark_ready().unwrap();
        assert!(matches!(store.create_sandbox(s), Err(StateError::Invalid { .. })));
        assert!(matches!(store.create_sandbox(with_id(sandbox("web"), "x")), Err(StateError::Invalid { .. })));
    }

    #[test]
    fn ids_resolve_from_any_unique_prefix() {
        let (_dir, store) = store();
        let a = format!("ab{}", "0".repeat(62));
        let b = format!("ab{}", "1".repeat(62));
        let c = format!("cd{}", "2".repeat(62));
        for (id, name) in [(&a, "a"), (&b, "b"), (&c, "c")] {
            store.create_sandbox(with_id(sandbox(name), id)).unwrap();
        }
        assert_eq!(store.sandbox("c").unwrap().id, c);
        assert_eq!(store.sandbox("ab0").unwrap().id, a);
        assert_eq!(store.sandbox(&b).unwrap().id, b);
        let err = store.sandbox("ab").unwrap_err();
        assert!(matches!(err, StateError::Ambiguous { count: 2, .. }), "{err}");
        let err = store.sandbox("ef").unwrap_err();
        assert!(matches!(err, StateError::NotFound { .. }), "{err}");
        assert_eq!(err.to_string(), r#"pod sandbox "ef" not found"#);
        assert!(matches!(store.sandbox(""), Err(StateError::Invalid { .. })));
        assert!(matches!(store.container("ab"), Err(StateError::NotFound { kind: Kind::Container, .. })));
        assert_eq!(store.resolve::<SandboxRecord>("cd").unwrap(), c);
    }

    #[test]
    fn a_claim_keeps_other_slow_verbs_off_its_record() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let c = created(&store, &web, "app");
        let start = store.begin_start_container(&c.id[..8]).unwrap();
        assert_eq!((start.id(), start.op()), (c.id.as_str(), Op::Start));
        let err = store.begin_remove_container(&c.id).unwrap_err();
        assert_eq!(err.to_string(), format!("container {} is already being started", c.id));
        assert!(matches!(store.begin_start_container(&c.id), Err(StateError::Busy { op: Op::Start, .. })));
        // Reads and unclaimed updates go on.
        assert_eq!(store.container(&c.id).unwrap().state(), ContainerState::Created);
        drop(start);
        let start = store.begin_start_container(&c.id).unwrap();
        start.commit(|c| c.start(Some(12), 6_000)).unwrap();
        let remove = store.begin_remove_container(&c.id);
        assert!(matches!(remove, Err(StateError::IllegalTransition { from: "running", .. })));
    }

    #[test]
    fn a_create_claim_is_busy_until_committed() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let claim = store.create_container(container_in(&web, "app")).unwrap();
        let err = store.begin_start_container(claim.id()).unwrap_err();
        assert!(matches!(err, StateError::Busy { op: Op::Create, .. }), "{err}");
        let (_, c) = claim
            .commit(|c| {
                c.pid = Some(3);
                Ok(())
            })
            .unwrap();
        store.begin_start_container(&c.id).unwrap();
    }

    #[test]
    fn a_container_starts_only_in_a_ready_sandbox() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let c = created(&store, &web, "app");
        store.update_sandbox(&web.id, |s| Ok(s.stop())).unwrap();
        let err = store.begin_start_container(&c.id).unwrap_err();
        assert_eq!(err.to_string(), format!("cannot start a container in pod sandbox {}: it is not ready", web.id));
    }

    #[test]
    fn every_container_verb_follows_the_state_machine_through_the_store() {
        let (dir, store) = store();
        let web = ready(&store, "web");
        let c = running(&store, &web, "app");
        assert!(matches!(store.begin_start_container(&c.id), Err(StateError::IllegalTransition { .. })));
        let (_, c) = store.update_container(&c.id, |c| c.mark_exited(Exit::observed(0, 9_000, false))).unwrap();
        assert_eq!((c.state(), c.reason()), (ContainerState::Exited, "Completed"));
        let again = store.update_container(&c.id, |c| c.mark_exited(Exit::observed(1, 9_500, false)));
        assert!(matches!(again, Err(StateError::IllegalTransition { .. })));
        assert_eq!(store.container(&c.id).unwrap().exit_code(), 0, "a refused transition changes nothing");
        store.begin_remove_container(&c.id).unwrap().remove().unwrap();
        assert!(!dir.path().join("containers").join(&c.id).exists());
        assert!(matches!(store.begin_remove_container(&c.id), Err(StateError::NotFound { .. })));
    }

    #[test]
    fn a_sandbox_is_removed_only_after_its_containers() {
        let (dir, store) = store();
        let web = ready(&store, "web");
        let c = created(&store, &web, "app");
        let claim = store.begin_remove_sandbox(&web.id).unwrap();
        // Removal in progress keeps new containers out.
        let err = store.create_container(container_in(&web, "other")).unwrap_err();
        assert!(matches!(err, StateError::Busy { op: Op::Remove, .. }), "{err}");
        let err = claim.remove().unwrap_err();
        assert_eq!(err.to_string(), format!("pod sandbox {} still has 1 container(s): {}", web.id, c.id));
        store.begin_remove_container(&c.id).unwrap().remove().unwrap();
        let claim = store.begin_remove_sandbox(&web.id).unwrap();
        assert_eq!(claim.remove().unwrap().id, web.id);
        assert!(!dir.path().join("sandboxes").join(&web.id).exists());
        assert!(store.list_sandboxes(&SandboxFilter::default()).is_empty());
    }

    #[test]
    fn an_update_cannot_change_identity_and_unchanged_records_are_not_rewritten() {
        let (dir, store) = store();
        let web = ready(&store, "web");
        let err = store
            .update_sandbox(&web.id, |s| {
                s.metadata.name = "other".into();
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(err, StateError::Invalid { .. }), "{err}");
        let file = dir.path().join("sandboxes").join(&web.id).join("sandbox.json");
        fs::remove_file(&file).unwrap();
        store.update_sandbox(&web.id, |_| Ok(())).unwrap();
        assert!(!file.exists(), "a no-op update wrote the file");
        store
            .update_sandbox(&web.id, |s| {
                s.ips = vec!["10.88.0.2".into()];
                Ok(())
            })
            .unwrap();
        assert!(file.exists());
    }

    #[test]
    fn a_write_that_fails_leaves_the_record_unchanged_in_memory() {
        let (dir, store) = store();
        let web = ready(&store, "web");
        let record_dir = dir.path().join("sandboxes").join(&web.id);
        fs::remove_dir_all(&record_dir).unwrap();
        fs::write(&record_dir, b"not a directory").unwrap();
        let err = store.update_sandbox(&web.id, |s| Ok(s.stop())).unwrap_err();
        assert!(matches!(err, StateError::Io { .. }), "{err}");
        assert_eq!(store.sandbox(&web.id).unwrap().state(), SandboxState::Ready);
    }

    #[test]
    fn a_claim_can_record_progress_before_it_commits() {
        let (_dir, store) = store();
        let mut claim = store.create_sandbox(sandbox("web")).unwrap();
        claim
            .update(|s| {
                s.netns_path = Some("/run/netns/berth-x".into());
                Ok(())
            })
            .unwrap();
        assert_eq!(claim.record().netns_path.as_deref(), Some(Path::new("/run/netns/berth-x")));
        let id = claim.id().to_string();
        assert!(store.sandbox(&id).unwrap().netns_path.is_some());
        assert!(matches!(store.begin_remove_sandbox(&id), Err(StateError::Busy { op: Op::Create, .. })));
    }

    #[test]
    fn sandbox_lists_filter_by_id_prefix_state_and_labels() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let db = ready(&store, "db");
        let creating = store.create_sandbox(sandbox("cache")).unwrap();
        store.update_sandbox(&db.id, |s| Ok(s.stop())).unwrap();
        let ids = |f: SandboxFilter| store.list_sandboxes(&f).into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(SandboxFilter::default()).len(), 3);
        assert_eq!(ids(SandboxFilter { id: Some(web.id[..6].into()), ..Default::default() }), vec![web.id.clone()]);
        assert!(ids(SandboxFilter { id: Some("zz".into()), ..Default::default() }).is_empty());
        let ready_only = SandboxFilter { state: Some(cri_ready()), ..Default::default() };
        assert_eq!(ids(ready_only), vec![web.id.clone()]);
        let not_ready = SandboxFilter { state: Some(cri_ready() + 1), ..Default::default() };
        assert_eq!(ids(not_ready).len(), 2, "stopped and creating");
        let labels = SandboxFilter { labels: [("app".into(), "cache".into())].into(), ..Default::default() };
        assert_eq!(ids(labels), vec![creating.id().to_string()]);
    }

    fn cri_ready() -> i32 {
        k8s_cri::v1::PodSandboxState::SandboxReady as i32
    }

    #[test]
    fn container_lists_filter_by_id_sandbox_state_and_labels() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let db = ready(&store, "db");
        let app = running(&store, &web, "app");
        let side = created(&store, &web, "side");
        let sql = created(&store, &db, "sql");
        let ids = |f: ContainerFilter| store.list_containers(&f).into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(ContainerFilter::default()), vec![app.id.clone(), side.id.clone(), sql.id.clone()]);
        let in_web = ContainerFilter { sandbox_id: Some(web.id[..5].into()), ..Default::default() };
        assert_eq!(ids(in_web.clone()), vec![app.id.clone(), side.id.clone()]);
        let running_state = Some(ContainerState::Running.to_cri() as i32);
        assert_eq!(ids(ContainerFilter { state: running_state, ..in_web.clone() }), vec![app.id.clone()]);
        let by_label = ContainerFilter { labels: [("role".into(), "sql".into())].into(), ..Default::default() };
        assert_eq!(ids(by_label), vec![sql.id.clone()]);
        assert_eq!(ids(ContainerFilter { id: Some(side.id[..7].into()), ..Default::default() }), vec![side.id.clone()]);
        let wrong_pair = ContainerFilter { id: Some(sql.id.clone()), ..in_web };
        assert!(ids(wrong_pair).is_empty());
        assert_eq!(store.containers_in(&db.id).len(), 1);
    }

    #[test]
    fn records_survive_a_restart_with_their_names_reserved() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::recover(dir.path()).unwrap();
        let web = ready(&store, "web");
        let app = running(&store, &web, "app");
        let done = running(&store, &web, "done");
        let (_, done) = store.update_container(&done.id, |c| c.mark_exited(Exit::observed(2, 7_000, true))).unwrap();
        let stopped = ready(&store, "old");
        let (_, stopped) = store.update_sandbox(&stopped.id, |s| Ok(s.stop())).unwrap();
        let before_s = store.list_sandboxes(&SandboxFilter::default());
        let before_c = store.list_containers(&ContainerFilter::default());
        drop(store);

        let (store, report) = Store::recover(dir.path()).unwrap();
        assert_eq!((report.sandboxes, report.containers), (2, 2));
        assert!(report.skipped.is_empty() && report.stray_dirs.is_empty() && report.orphan_containers.is_empty());
        assert_eq!(store.list_sandboxes(&SandboxFilter::default()), before_s);
        assert_eq!(store.list_containers(&ContainerFilter::default()), before_c);
        assert_eq!(store.container(&done.id).unwrap().reason(), "OOMKilled");
        assert_eq!(store.sandbox(&stopped.id).unwrap().state(), SandboxState::NotReady);
        assert_eq!(store.container(&app.id).unwrap().config, app.config);
        assert!(matches!(store.create_sandbox(sandbox("web")), Err(StateError::NameReserved { .. })));
        assert!(matches!(store.create_container(container_in(&web, "app")), Err(StateError::NameReserved { .. })));
    }

    #[test]
    fn recovery_skips_and_reports_what_does_not_load() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::recover(dir.path()).unwrap();
        let good = ready(&store, "good");
        let corrupt = ready(&store, "corrupt");
        let moved = ready(&store, "moved");
        let stray = ready(&store, "stray");
        let orphan = created(&store, &corrupt, "app");
        drop(store);
        let sandboxes = dir.path().join("sandboxes");
        fs::write(sandboxes.join(&corrupt.id).join("sandbox.json"), b"{\"id\": ").unwrap();
        // Another ID than its own (a random ID may itself start with "ff").
        let prefix = if moved.id.starts_with("ff") { "ee" } else { "ff" };
        let elsewhere = format!("{prefix}{}", &moved.id[2..]);
        fs::rename(sandboxes.join(&moved.id), sandboxes.join(&elsewhere)).unwrap();
        fs::remove_file(sandboxes.join(&stray.id).join("sandbox.json")).unwrap();
        fs::write(sandboxes.join(&stray.id).join("resolv.conf"), b"").unwrap();
        fs::create_dir(sandboxes.join("lost+found")).unwrap();
        fs::write(sandboxes.join(&good.id).join(".sandbox.json.tmp"), b"half a wri").unwrap();

        let (store, report) = Store::recover(dir.path()).unwrap();
        assert_eq!((report.sandboxes, report.containers), (1, 1));
        let mut skipped: Vec<_> = report.skipped.iter().map(|s| s.path.clone()).collect();
        skipped.sort();
        let mut expected = vec![
            sandboxes.join(&corrupt.id).join("sandbox.json"),
            sandboxes.join(&elsewhere).join("sandbox.json"),
            sandboxes.join("lost+found"),
        ];
        expected.sort();
        assert_eq!(skipped, expected);
        assert!(report.skipped.iter().any(|s| s.reason.starts_with("parsing")), "{:?}", report.skipped);
        assert_eq!(report.stray_dirs, vec![sandboxes.join(&stray.id)]);
        assert_eq!(report.orphan_containers, vec![orphan.id.clone()]);
        assert!(!sandboxes.join(&good.id).join(".sandbox.json.tmp").exists());
        assert_eq!(store.sandbox(&good.id).unwrap(), good);
        // The orphan is still listed, by its sandbox id too, and can be removed.
        let by_sandbox = ContainerFilter { sandbox_id: Some(corrupt.id.clone()), ..Default::default() };
        assert_eq!(store.list_containers(&by_sandbox).len(), 1);
        store.begin_remove_container(&orphan.id).unwrap().remove().unwrap();
        // The corrupt record's directory is left for inspection.
        assert!(sandboxes.join(&corrupt.id).exists());
    }

    #[test]
    fn of_two_recovered_records_with_one_name_the_older_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::recover(dir.path()).unwrap();
        let first = ready(&store, "web");
        drop(store);
        // A copy under another id, as a hand edit or a bug could leave it.
        let mut copy = first.clone();
        copy.id = format!("ee{}", &first.id[2..]);
        copy.created_at += 1;
        let path = dir.path().join("sandboxes").join(&copy.id).join("sandbox.json");
        disk::write_atomic(&path, &serde_json::to_vec(&copy).unwrap(), disk::Sync::Data).unwrap();
        let (store, report) = Store::recover(dir.path()).unwrap();
        assert_eq!(report.name_conflicts, vec![copy.id.clone()]);
        // Removing the newer one does not release the older one's name.
        store.begin_remove_sandbox(&copy.id).unwrap().remove().unwrap();
        let err = store.create_sandbox(sandbox("web")).unwrap_err();
        assert!(matches!(err, StateError::NameReserved { by_id, .. } if by_id == first.id));
    }

    #[test]
    fn concurrent_creates_of_one_name_let_exactly_one_through() {
        let (_dir, store) = store();
        let web = ready(&store, "web");
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let store = Arc::clone(&store);
                    let web = web.clone();
                    scope.spawn(move || store.create_container(container_in(&web, "app")).map(|c| c.id().to_string()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results.iter().filter_map(|r| r.as_ref().err()).all(|e| matches!(e, StateError::NameReserved { .. })));
        assert_eq!(store.containers_in(&web.id).len(), 1);
    }
}
