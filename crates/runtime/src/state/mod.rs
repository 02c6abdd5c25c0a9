//! The runtime's records of pod sandboxes and containers: the CRI state machine, name
//! reservation, id lookup, list filters, their files on disk and their reconciliation after a
//! restart.
//!
//! Nothing here touches the kernel or spawns a process. The RPC layer drives it:
//!
//! ```text
//! RunPodSandbox    store.create_sandbox(record)  → claim   (reserves the name, persists `Creating`)
//!                  … netns, CNI, infra process …
//!                  claim.commit(|s| { s.ips = …; s.mark_ready() })         or claim.remove() on failure
//! CreateContainer  store.create_container(record) → claim  (sandbox must be Ready, name reserved)
//!                  … rootfs, spec, monitor + `create` …
//!                  claim.commit(|c| { c.pid = …; Ok(()) })                 or claim.remove() on failure
//! StartContainer   store.begin_start_container(id) → claim; `start`; claim.commit(|c| c.start(pid, now))
//! StopContainer    if store.container(id)?.state().can_stop() { kill…; store.update_container(id, |c| c.mark_exited(exit)) }
//! RemoveContainer  store.begin_remove_container(id) → claim; delete…; claim.remove()
//! StopPodSandbox   store.begin_stop_sandbox(id) → claim; stop containers, teardown…; claim.commit(|s| s.stop())
//! RemovePodSandbox store.begin_remove_sandbox(id) → claim; remove containers…; claim.remove()
//! startup          Store::recover(root), then store.reconcile(&reality, now_ns())
//! ```
//!
//! # Concurrency
//!
//! A [`Store`] is shared as `Arc<Store>`. Its methods are synchronous:
//!
//! - Reads (`sandbox`, `container`, `list_*`) and claims (`begin_*`) only take a short in-memory
//!   lock and never wait for the disk; they may be called from async code directly.
//! - Mutations (`create_*`, `update_*`, `Claim::commit`, `Claim::remove`, `reconcile`) serialize on
//!   one writer lock held across the record's write (a small file; one fsync for a commit or an
//!   unclaimed update, none for a create or a claim's intermediate update), and change the
//!   in-memory view only after the disk has changed, so readers see either the old or the new record
//!   and never one the disk lacks. Call them inside `spawn_blocking`, next to the OCI runtime call
//!   they follow.
//! - A slow verb holds a [`Claim`] on its record from the guard check to the final transition;
//!   another claim on the same record meanwhile fails with [`StateError::Busy`] (start racing
//!   remove, two removes). Unclaimed updates (an exit seen by a watcher, StopContainer) still apply.

mod container;
mod disk;
mod error;
mod filter;
mod reconcile;
mod sandbox;
mod store;

use std::time::{SystemTime, UNIX_EPOCH};

pub use container::{ContainerMetadata, ContainerRecord, ContainerState, Exit, ExitReason, MountRecord};
pub use error::{Action, Kind, Op, StateError};
pub use filter::{ContainerFilter, SandboxFilter};
pub use reconcile::{
    Change, ContainerFix, Observed, ObservedSandbox, Reality, ReconcileReport, decide_container, decide_sandbox,
};
pub use sandbox::{NamespaceModes, SandboxMetadata, SandboxRecord, SandboxState};
pub use store::{Claim, ContainerClaim, Record, RecoveryReport, SandboxClaim, Skipped, Store};

/// The exit code recorded when a container's exit could not be observed (containerd's
/// `unknownExitCode`).
pub const UNKNOWN_EXIT_CODE: i32 = 255;

/// Nanoseconds since the Unix epoch, the unit of every CRI timestamp.
pub fn now_ns() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

/// A new sandbox or container id: 64 lower-case hex digits, as containerd's, from 244 random bits
/// (two v4 UUIDs) spread evenly by SHA-256.
pub fn new_id() -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(uuid::Uuid::new_v4().as_bytes());
    h.update(uuid::Uuid::new_v4().as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `id` has the shape [`new_id`] gives (what a record's directory name must be).
pub fn is_valid_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_64_hex_digits_and_differ() {
        let a = new_id();
        let b = new_id();
        assert!(is_valid_id(&a) && is_valid_id(&b), "{a} {b}");
        assert_ne!(a, b);
    }

    #[test]
    fn ids_of_the_wrong_shape_are_not_valid() {
        assert!(!is_valid_id(""));
        assert!(!is_valid_id(&"A".repeat(64)));
        assert!(!is_valid_id(&"a".repeat(63)));
        assert!(!is_valid_id(&format!("{}/", "a".repeat(63))));
    }
}
