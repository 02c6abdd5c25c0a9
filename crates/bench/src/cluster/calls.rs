//! The API calls the bench makes during a run, timed by the bench itself: latency by call and
//! verb class, and the failures by status code.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::stats::Latencies;

/// The calls the bench times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    CreateNode,
    CreateLease,
    RenewLease,
    GetLease,
    PatchNodeStatus,
    PatchPodStatus,
    GetPod,
    ListPods,
}

/// The classes the API's latency objectives are stated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// The nodes' registration, before the pods: apart from the steady writes.
    Registration,
    Mutating,
    Get,
    List,
}

impl Call {
    pub fn name(self) -> &'static str {
        match self {
            Call::CreateNode => "POST nodes",
            Call::CreateLease => "POST leases",
            Call::RenewLease => "PUT leases",
            Call::GetLease => "GET lease",
            Call::PatchNodeStatus => "PATCH nodes/status",
            Call::PatchPodStatus => "PATCH pods/status",
            Call::GetPod => "GET pod",
            Call::ListPods => "LIST pods (all)",
        }
    }

    pub fn verb(self) -> Verb {
        match self {
            Call::CreateNode | Call::CreateLease => Verb::Registration,
            Call::RenewLease | Call::PatchNodeStatus | Call::PatchPodStatus => Verb::Mutating,
            Call::GetLease | Call::GetPod => Verb::Get,
            Call::ListPods => Verb::List,
        }
    }
}

/// Latencies and failures of one call.
#[derive(Default)]
pub struct CallStats {
    pub latencies: Latencies,
    /// Failures by HTTP status code, or by kind of transport error.
    pub failures: BTreeMap<String, u64>,
}

#[derive(Default)]
pub struct ApiCalls {
    calls: Mutex<BTreeMap<Call, CallStats>>,
}

impl ApiCalls {
    /// One call that took `took`, and its error if it failed (failures are timed too).
    pub fn record(&self, call: Call, took: Duration, error: Option<&kube::Error>) {
        let mut calls = self.calls.lock().unwrap();
        let stats = calls.entry(call).or_default();
        stats.latencies.record(took);
        if let Some(e) = error {
            *stats.failures.entry(failure_kind(e)).or_default() += 1;
        }
    }

    /// Hands the recorded calls over, leaving none.
    pub fn take(&self) -> BTreeMap<Call, CallStats> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

/// A failure as the report counts it: the status code of an API error, else the kind of error.
pub fn failure_kind(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.code.to_string(),
        kube::Error::HyperError(_) | kube::Error::Service(_) => "transport".into(),
        kube::Error::SerdeError(_) => "decode".into(),
        _ => "other".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_grouped_by_verb_and_failures_by_code() {
        let calls = ApiCalls::default();
        let conflict = kube::Error::Api(kube::core::Status::failure("conflict", "Conflict").with_code(409).boxed());
        calls.record(Call::RenewLease, Duration::from_millis(3), None);
        calls.record(Call::RenewLease, Duration::from_millis(5), Some(&conflict));
        let taken = calls.take();
        let lease = &taken[&Call::RenewLease];
        assert_eq!(lease.latencies.len(), 2);
        assert_eq!(lease.failures.get("409"), Some(&1));
        assert!(calls.take().is_empty());
        assert_eq!(Call::PatchPodStatus.verb(), Verb::Mutating);
        assert_eq!(Call::GetPod.verb(), Verb::Get);
    }
}
