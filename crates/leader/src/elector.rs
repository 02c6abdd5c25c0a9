//! The election loop: campaign for the Lease, lead while renewals succeed, step down, campaign again.
//!
//! [`LeaderElector::run`] alternates two phases:
//!
//! - **Campaigning**: a round now, then every `retry_period` × [1, 2.2) until one writes the Lease
//!   naming us. Shutdown ends the loop.
//! - **Leading**: `lead()` is polled beside a renewal round every `retry_period`. The term ends on
//!   shutdown (lease released), on `lead` returning (lease released, campaign again), or on loss —
//!   no successful round for `renew_deadline`, or a read naming another holder (campaign again).
//!
//! Between terms the elector waits one jittered `retry_period`, so a `lead` that returns at once
//! does not spin and other candidates get a fair chance at a released lease.

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::LeaseConfig;
use crate::record::{self, Decision, Observer};

/// client-go's `JitterFactor`: campaign rounds are `retry_period` apart plus up to 1.2× more.
pub(crate) const JITTER_FACTOR: f64 = 1.2;
/// How long after a holder's expiry a waiting candidate reads the Lease again.
const EXPIRY_MARGIN: Duration = Duration::from_millis(50);

/// One candidate in the election for one Lease.
///
/// Watch leadership with [`leading`](Self::leading) (take the receiver before calling
/// [`run`](Self::run), which consumes the elector); it is `true` exactly while a `lead` future is
/// alive.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    observer: Observer,
    leading: watch::Sender<bool>,
}

/// How a round ended, short of an error.
enum Round {
    /// The Lease now names us (created, renewed or taken over).
    Held,
    /// Another holder's lease is live until `expires_at` by our clock.
    HeldBy { holder: String, expires_at: Instant },
    /// Another write came first (409); read again next round.
    Raced,
}

/// Why a term of leadership ended.
enum TermEnd {
    Shutdown,
    LeadReturned,
    Lost(Loss),
}

enum Loss {
    RenewDeadline,
    TakenBy(String),
}

/// A round's request that failed, naming the step.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("reading lease")]
    Read(#[source] kube::Error),
    #[error("creating lease")]
    Create(#[source] kube::Error),
    #[error("updating lease")]
    Update(#[source] kube::Error),
}

impl LeaderElector {
    /// A candidate for `config`'s Lease, talking to the API server through `client`.
    pub fn new(client: kube::Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        let (leading, _) = watch::channel(false);
        Self { api, config, observer: Observer::default(), leading }
    }

    /// Whether this candidate is leading now: `true` from just before `lead()` is called until just
    /// after its future is dropped, and `false` once `run` has returned or its own future has been
    /// dropped. Take the receiver before [`run`](Self::run).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Whether this candidate is leading now (see [`leading`](Self::leading)).
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Runs `lead` each time this process becomes leader; the future is dropped (cancelled) as soon
    /// as leadership is lost (renewal did not succeed within `renew_deadline`, or another identity
    /// holds the Lease), then the elector campaigns again.
    ///
    /// If the `lead` future completes on its own, the lease is released and the elector campaigns
    /// again (calling `lead` anew if it wins), so a leader whose work has ended does not keep the
    /// lease from candidates that could do it.
    ///
    /// Returns only when `shutdown` resolves; the `lead` future is dropped first, then a held lease
    /// is released (holderIdentity cleared, leaseDurationSeconds 1, as client-go's
    /// `ReleaseOnCancel`) so another candidate takes over at once. Release is bounded by
    /// `renew_deadline`; if it fails, others take over after the lease duration.
    pub async fn run<F, Fut>(mut self, mut lead: F, shutdown: impl Future<Output = ()>)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        let _reset = NotLeadingOnDrop(self.leading.clone());
        let mut shutdown = pin!(shutdown);
        loop {
            let acquired_at = tokio::select! {
                biased;
                () = shutdown.as_mut() => return,
                at = self.campaign() => at,
            };
            self.leading.send_replace(true);
            info!(lease = %self.key(), identity = %self.config.identity, "acquired leadership");
            let end = {
                let term = pin!(lead());
                self.lead_term(term, shutdown.as_mut(), acquired_at).await
            };
            self.leading.send_replace(false);
            match end {
                TermEnd::Shutdown => {
                    self.release().await;
                    return;
                }
                TermEnd::LeadReturned => {
                    info!(lease = %self.key(), identity = %self.config.identity, "lead returned; stepping down");
                    self.release().await;
                }
                TermEnd::Lost(Loss::RenewDeadline) => warn!(
                    lease = %self.key(),
                    identity = %self.config.identity,
                    renew_deadline = ?self.config.renew_deadline,
                    "lost leadership: no renewal within the renew deadline"
                ),
                TermEnd::Lost(Loss::TakenBy(holder)) => warn!(
                    lease = %self.key(),
                    identity = %self.config.identity,
                    holder = %holder,
                    "lost leadership: lease taken by another holder"
                ),
            }
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return,
                () = tokio::time::sleep(jittered(self.config.retry_period)) => {}
            }
        }
    }

    /// Rounds until one leaves the Lease naming us; returns when that round started.
    async fn campaign(&mut self) -> Instant {
        loop {
            let started = Instant::now();
            let mut wait = jittered(self.config.retry_period);
            match self.round().await {
                Ok(Round::Held) => return started,
                Ok(Round::HeldBy { holder, expires_at }) => {
                    debug!(lease = %self.key(), holder = %holder, "lease held by another");
                    // Read again right when it would expire, not up to a jittered period later:
                    // a dead holder's pods wait that much less.
                    wait = wait.min(expires_at.saturating_duration_since(Instant::now()) + EXPIRY_MARGIN);
                }
                Ok(Round::Raced) => debug!(lease = %self.key(), "another candidate won this round"),
                Err(e) => warn!(lease = %self.key(), error = &e as &dyn std::error::Error, "acquiring lease"),
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Polls `lead` while renewing every `retry_period`, until shutdown, `lead` returns, or loss.
    async fn lead_term(
        &mut self,
        mut lead: Pin<&mut impl Future<Output = ()>>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
        acquired_at: Instant,
    ) -> TermEnd {
        let mut renewed_at = acquired_at;
        loop {
            let deadline = renewed_at + self.config.renew_deadline;
            let retry_period = self.config.retry_period;
            let renewal = tokio::time::timeout_at(deadline, async {
                tokio::time::sleep(retry_period).await;
                let started = Instant::now();
                (started, self.round().await)
            });
            let outcome = tokio::select! {
                biased;
                () = shutdown.as_mut() => return TermEnd::Shutdown,
                () = lead.as_mut() => return TermEnd::LeadReturned,
                outcome = renewal => outcome,
            };
            match outcome {
                Err(_elapsed) => return TermEnd::Lost(Loss::RenewDeadline),
                Ok((started, Ok(Round::Held))) => renewed_at = started,
                Ok((_, Ok(Round::HeldBy { holder, .. }))) => return TermEnd::Lost(Loss::TakenBy(holder)),
                Ok((_, Ok(Round::Raced))) => debug!(lease = %self.key(), "renewal raced with another write"),
                Ok((_, Err(e))) => warn!(lease = %self.key(), error = &e as &dyn std::error::Error, "renewing lease"),
            }
        }
    }

    /// One read-decide-write round against the Lease.
    async fn round(&mut self) -> Result<Round, RoundError> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await.map_err(RoundError::Read)? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(record::created(Timestamp::now(), &self.config)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => {
                    self.observer.observe(&written.spec.unwrap_or_default(), Instant::now());
                    Ok(Round::Held)
                }
                Err(e) if is_409(&e) => Ok(Round::Raced),
                Err(e) => Err(RoundError::Create(e)),
            };
        };
        let now = Instant::now();
        let current = lease.spec.take().unwrap_or_default();
        let observed_at = self.observer.observe(&current, now);
        match record::decide(&current, observed_at, now, Timestamp::now(), &self.config) {
            Decision::Wait { holder, expires_at } => Ok(Round::HeldBy { holder, expires_at }),
            Decision::Write(spec) => {
                lease.spec = Some(spec);
                // `lease` keeps the resourceVersion we read: the write is conditional on it.
                match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
                    Ok(written) => {
                        self.observer.observe(&written.spec.unwrap_or_default(), Instant::now());
                        Ok(Round::Held)
                    }
                    Err(e) if is_409(&e) => Ok(Round::Raced),
                    Err(e) => Err(RoundError::Update(e)),
                }
            }
        }
    }

    /// Gives the lease up if the Lease still names us, within `renew_deadline`.
    async fn release(&mut self) {
        let deadline = self.config.renew_deadline;
        match tokio::time::timeout(deadline, self.try_release()).await {
            Ok(Ok(true)) => info!(lease = %self.key(), identity = %self.config.identity, "released leadership"),
            Ok(Ok(false)) => debug!(lease = %self.key(), "lease no longer ours; nothing to release"),
            Ok(Err(e)) => warn!(lease = %self.key(), error = &e as &dyn std::error::Error, "releasing lease"),
            Err(_) => warn!(lease = %self.key(), timeout = ?deadline, "releasing lease timed out"),
        }
    }

    async fn try_release(&mut self) -> Result<bool, RoundError> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await.map_err(RoundError::Read)? else {
            return Ok(false);
        };
        let current = lease.spec.take().unwrap_or_default();
        if current.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        lease.spec = Some(record::released(&current, Timestamp::now()));
        let written =
            self.api.replace(&self.config.name, &PostParams::default(), &lease).await.map_err(RoundError::Update)?;
        self.observer.observe(&written.spec.unwrap_or_default(), Instant::now());
        Ok(true)
    }

    fn key(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }
}

/// Clears the leading flag when `run`'s future is dropped mid-term (an aborted task) rather than
/// ended by shutdown, so watchers never see a stale `true`.
struct NotLeadingOnDrop(watch::Sender<bool>);

impl Drop for NotLeadingOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// A 409: AlreadyExists on create, Conflict on update — either way another write won.
fn is_409(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// `period` plus a random part of up to `JITTER_FACTOR` × `period`, as client-go's `wait.Jitter`.
fn jittered(period: Duration) -> Duration {
    period + period.mul_f64(JITTER_FACTOR * fastrand::f64())
}
