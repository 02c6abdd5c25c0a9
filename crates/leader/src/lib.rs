//! Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does, through the Kubernetes API only.
//!
//! Every candidate runs a [`LeaderElector`] against the same Lease. One round is: read the Lease,
//! decide (the pure core in `record`), write with the read `resourceVersion` as precondition.
//!
//! | Lease as read                                         | Write                                              |
//! |-------------------------------------------------------|----------------------------------------------------|
//! | missing                                               | create: holder = us, `leaseTransitions` 0          |
//! | held by us                                            | update: `renewTime` = now                          |
//! | empty holder (released)                               | update: take over, `leaseTransitions` + 1          |
//! | held by another, unchanged for the lease duration     | update: take over, `leaseTransitions` + 1          |
//! | held by another, changed within the lease duration    | none: wait                                         |
//!
//! "Unchanged for the lease duration" is measured on **our** monotonic clock from the moment we
//! first saw the current record, never from the `renewTime` in it, so clock skew between candidates
//! cannot make a live holder look expired. The duration waited is the longer of the holder's
//! `leaseDurationSeconds` and our own [`LeaseConfig::lease_duration`].
//!
//! A `409` on create (AlreadyExists) or update (Conflict) means another candidate won the round;
//! the next round reads again. Campaigning candidates try every `retry_period` jittered up to
//! 2.2×, as client-go's `JitterUntil(retryPeriod, 1.2)`, or right when the holder's lease would
//! expire if that is sooner (so a dead holder is replaced one lease duration after it was last
//! seen renewing); the leader renews every `retry_period`.
//!
//! Leadership ends, and the `lead` future is dropped, when (a) no renewal has succeeded for
//! `renew_deadline`, counted from the start of the last successful round (a request in flight is
//! abandoned at the deadline), or (b) a read shows another holder — unlike client-go, which keeps
//! retrying until the deadline, we step down at once because the Lease no longer names us.

mod config;
mod elector;
mod record;

pub use config::{InvalidConfig, LeaseConfig, default_identity};
pub use elector::LeaderElector;
