//! The members of an etcd cluster as the store reaches them: one gRPC channel per endpoint, each
//! with its health, so a request goes to a member that answers and moves on when one does not.
//!
//! etcd-client's own balancer keeps sending requests to a dead endpoint; here every request is
//! pinned to the member that answered last (as etcd's Go client pins one), and a member that
//! fails is skipped until a background probe finds it answering again. Every request carries
//! etcd's `hasleader` metadata, so a member cut off from the quorum refuses at once
//! (`etcdserver: no leader`) instead of letting the request wait out its timeout.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};

use crate::{Result, StoreError};

/// etcd reports these conditions only through the status message.
pub(super) const MSG_COMPACTED: &str = "required revision has been compacted";
pub(super) const MSG_FUTURE: &str = "required revision is a future revision";

/// gRPC status codes (etcd-client does not re-export tonic's `Code`).
const GRPC_CANCELLED: i32 = 1;
const GRPC_UNKNOWN: i32 = 2;
const GRPC_INVALID_ARGUMENT: i32 = 3;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_OUT_OF_RANGE: i32 = 11;
const GRPC_UNAVAILABLE: i32 = 14;

/// How often members taken out of service are probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Longest pause between attempts when no member answers.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

pub(super) fn message_contains(e: &etcd_client::Error, what: &str) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains(what))
}

/// The store error for an etcd error that says nothing about the member's health.
pub(super) fn map_err(e: etcd_client::Error) -> StoreError {
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

/// Whether `e` says the member (or its link to the quorum) failed, rather than the request:
/// such a request may be sent to another member.
fn member_failed(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        // Unavailable: no leader, leader changed, server stopping, proposal timed out;
        // Unknown and Cancelled: the connection broke under the call.
        E::GRpcStatus(s) => {
            matches!(s.code() as i32, GRPC_UNAVAILABLE | GRPC_DEADLINE_EXCEEDED | GRPC_UNKNOWN | GRPC_CANCELLED)
        }
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        _ => false,
    }
}

/// What etcd said, without the layers of wrapping around it.
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) if !s.message().is_empty() => s.message().to_owned(),
        other => berth_common::error::error_chain(other),
    }
}

/// A request's failure, with the two revision conditions etcd reports by message singled out.
pub(super) enum CallError {
    Compacted,
    Future,
    Other(StoreError),
}

impl CallError {
    pub(super) fn plain(self) -> StoreError {
        match self {
            CallError::Compacted => StoreError::Invalid(MSG_COMPACTED.into()),
            CallError::Future => StoreError::Invalid(MSG_FUTURE.into()),
            CallError::Other(e) => e,
        }
    }
}

/// How long one attempt may take: a point request, or one whose size is the caller's (a list).
#[derive(Clone, Copy, Debug)]
pub(super) enum Bound {
    Point,
    Whole,
}

/// Time limits of requests.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    /// One attempt of a point request (get, txn, watch creation).
    pub point: Duration,
    /// One attempt of a list, which may be large.
    pub whole: Duration,
    /// After this long, a request that has found no answering member gives up.
    pub failover: Duration,
}

/// A successful answer and how it was reached.
pub(super) struct Answer<T> {
    pub value: T,
    /// An earlier attempt of this request failed: a write may have been applied by it.
    pub retried: bool,
    /// The member that answered.
    pub member: usize,
}

struct Member {
    endpoint: String,
    client: Client,
    /// When the member last failed, while it is out of service.
    down_since: Mutex<Option<Instant>>,
}

impl Member {
    fn down_since(&self) -> Option<Instant> {
        *self.down_since.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn set_down(&self, when: Option<Instant>) {
        *self.down_since.lock().unwrap_or_else(|p| p.into_inner()) = when;
    }
}

/// The cluster's members and which one requests go to.
pub(super) struct Members {
    list: Vec<Member>,
    /// The member that answered last; requests stay on it while it answers.
    current: AtomicUsize,
    timing: Timing,
}

/// `127.0.0.1:2379` means `http://127.0.0.1:2379`, as etcdctl reads it.
fn endpoint_url(endpoint: &str) -> Result<String> {
    if endpoint.starts_with("https://") {
        return Err(StoreError::Invalid(format!("etcd endpoint {endpoint}: TLS to etcd is not supported")));
    }
    Ok(if endpoint.contains("://") { endpoint.to_owned() } else { format!("http://{endpoint}") })
}

impl Members {
    /// One lazily connected channel per endpoint, and the background probe of members out of
    /// service, which ends when the returned value is dropped.
    pub(super) async fn new(endpoints: &[String], timing: Timing) -> Result<Arc<Members>> {
        if endpoints.is_empty() {
            return Err(StoreError::Invalid("no etcd endpoints given".into()));
        }
        let mut list = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let url = endpoint_url(endpoint)?;
            let channel = tonic::transport::Endpoint::from_shared(url.clone())
                .map_err(|e| StoreError::Invalid(format!("etcd endpoint {endpoint:?}: {e}")))?
                .connect_timeout(timing.point)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(timing.point)
                .keep_alive_while_idle(true)
                .tcp_nodelay(true)
                .connect_lazy();
            let options = ConnectOptions::new().with_require_leader(true);
            let client = Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options))
                .await
                .map_err(|e| StoreError::Invalid(format!("etcd endpoint {endpoint:?}: {e}")))?;
            list.push(Member { endpoint: url, client, down_since: Mutex::new(None) });
        }
        let members = Arc::new(Members { list, current: AtomicUsize::new(0), timing });
        tokio::spawn(probe_members(Arc::downgrade(&members)));
        Ok(members)
    }

    /// The member to try next: the current one if in service, else the next in service, else
    /// the one out of service longest.
    fn pick(&self) -> usize {
        let n = self.list.len();
        let current = self.current.load(Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (current + i) % n)
            .find(|&i| self.list[i].down_since().is_none())
            .or_else(|| (0..n).min_by_key(|&i| self.list[i].down_since()))
            .unwrap_or(0)
    }

    pub(super) fn answered(&self, member: usize) {
        if self.list[member].down_since().is_some() {
            tracing::info!(endpoint = %self.list[member].endpoint, "etcd member answers again");
            self.list[member].set_down(None);
        }
        self.current.store(member, Ordering::Relaxed);
    }

    /// Takes `member` out of service until a probe finds it answering.
    pub(super) fn failed(&self, member: usize, why: &str) {
        if self.list[member].down_since().is_none() {
            tracing::warn!(endpoint = %self.list[member].endpoint, error = why, "etcd member failed; trying others");
        }
        self.list[member].set_down(Some(Instant::now()));
    }

    fn all_down(&self) -> bool {
        self.list.iter().all(|m| m.down_since().is_some())
    }

    /// Runs `op` on a member, and again on others while members fail, for up to the failover
    /// time. Callers pass only requests that are safe to repeat: reads, and writes that compare
    /// a revision (which tell by [`Answer::retried`] that an earlier attempt may have applied).
    pub(super) async fn call<T, F, Fut>(&self, bound: Bound, mut op: F) -> std::result::Result<Answer<T>, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let mut failures: u32 = 0;
        // What a live member said (`etcdserver: no leader`) tells more than a refused connection.
        let mut reason: Option<String> = None;
        loop {
            let member = self.pick();
            let why = match self.attempt(bound, member, op(self.list[member].client.clone())).await {
                Ok(Ok(value)) => {
                    self.answered(member);
                    return Ok(Answer { value, retried: failures > 0, member });
                }
                Ok(Err(e)) if message_contains(&e, MSG_COMPACTED) => {
                    self.answered(member);
                    return Err(CallError::Compacted);
                }
                Ok(Err(e)) if message_contains(&e, MSG_FUTURE) => {
                    self.answered(member);
                    return Err(CallError::Future);
                }
                Ok(Err(e)) if member_failed(&e) => describe(&e),
                Ok(Err(e)) => return Err(CallError::Other(map_err(e))),
                Err(why) => why,
            };
            self.failed(member, &why);
            failures += 1;
            if why.starts_with("etcdserver:") {
                reason = Some(why.clone());
            }
            let spent = started.elapsed();
            if spent >= self.timing.failover {
                return Err(CallError::Other(self.unavailable(reason.as_deref().unwrap_or(&why), spent)));
            }
            if self.all_down() {
                let pause = (Duration::from_millis(50) * 2u32.saturating_pow(failures.min(8))).min(MAX_BACKOFF);
                tokio::time::sleep(pause.min(self.timing.failover - spent)).await;
            }
        }
    }

    /// One attempt on `member`. A point request gets the point bound. A list may take longer,
    /// but while it runs the member is asked every point interval whether it still has a
    /// leader: a member cut off from the quorum holds a read for etcd's own 7 s timeout.
    async fn attempt<T>(
        &self,
        bound: Bound,
        member: usize,
        request: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> std::result::Result<std::result::Result<T, etcd_client::Error>, String> {
        let point = self.timing.point;
        if let Bound::Point = bound {
            return tokio::time::timeout(point, request).await.map_err(|_| format!("no answer within {point:?}"));
        }
        let deadline = Instant::now() + self.timing.whole;
        tokio::pin!(request);
        loop {
            tokio::select! {
                r = &mut request => return Ok(r),
                () = tokio::time::sleep(point) => {}
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer within {:?}", self.timing.whole));
            }
            tokio::select! {
                r = &mut request => return Ok(r),
                health = self.healthy(member) => health?,
            }
        }
    }

    /// Whether `member` answers a linearizable read, i.e. is part of a quorum.
    async fn healthy(&self, member: usize) -> std::result::Result<(), String> {
        let mut kv = self.list[member].client.kv_client();
        let probe = kv.get(vec![0], Some(GetOptions::new().with_count_only()));
        match tokio::time::timeout(self.timing.point, probe).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if member_failed(&e) => Err(describe(&e)),
            Ok(Err(_)) => Ok(()),
            Err(_) => Err(format!("no answer within {:?}", self.timing.point)),
        }
    }

    /// The error of a request no member answered: what they said.
    pub(super) fn unavailable(&self, why: &str, spent: Duration) -> StoreError {
        StoreError::Unavailable(
            format!(
                "etcd: {why} (no member of {} answered within {:.1}s)",
                self.list.iter().map(|m| m.endpoint.as_str()).collect::<Vec<_>>().join(", "),
                spent.as_secs_f64()
            )
            .into(),
        )
    }
}

/// Every second, asks each member out of service for a linearizable read (so it must be part
/// of a quorum) and puts those that answer back in service.
async fn probe_members(members: Weak<Members>) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(members) = members.upgrade() else { return };
        for (i, m) in members.list.iter().enumerate() {
            if m.down_since().is_none() {
                continue;
            }
            if members.healthy(i).await.is_ok() {
                tracing::info!(endpoint = %m.endpoint, "etcd member answers again");
                m.set_down(None);
            }
        }
    }
}
