//! The scheduler's Prometheus metrics, under kube-scheduler's names: attempts by result,
//! attempt and end-to-end scheduling latency, pending pods by queue.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::queue::Counts;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: &'static str,
}

/// Outcome of one scheduling attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    Scheduled,
    Unschedulable,
    Error,
}

impl AttemptResult {
    fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Scheduled => "scheduled",
            AttemptResult::Unschedulable => "unschedulable",
            AttemptResult::Error => "error",
        }
    }
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Cheap to clone; every clone updates the same series.
#[derive(Clone)]
pub struct Metrics {
    profile: String,
    attempts: Family<ResultLabels, Counter>,
    attempt_seconds: Family<ResultLabels, Histogram, fn() -> Histogram>,
    e2e_seconds: Family<ResultLabels, Histogram, fn() -> Histogram>,
    pending: Family<QueueLabels, Gauge>,
}

impl Metrics {
    pub fn new(profile: &str) -> Metrics {
        Metrics {
            profile: profile.to_string(),
            attempts: Family::default(),
            attempt_seconds: Family::new_with_constructor(latency_histogram),
            e2e_seconds: Family::new_with_constructor(latency_histogram),
            pending: Family::default(),
        }
    }

    /// Adds the series to `registry` under the `scheduler_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("scheduler");
        sub.register("schedule_attempts", "Scheduling attempts by result", self.attempts.clone());
        sub.register(
            "scheduling_attempt_duration_seconds",
            "Time to decide where one pod goes, by result",
            self.attempt_seconds.clone(),
        );
        sub.register(
            "pod_scheduling_sli_duration_seconds",
            "Time from a pod's first scheduling attempt to its binding (end-to-end scheduling latency)",
            self.e2e_seconds.clone(),
        );
        sub.register(
            "pending_pods",
            "Pods waiting, by queue (active, backoff, unschedulable, gated)",
            self.pending.clone(),
        );
    }

    fn labels(&self, result: AttemptResult) -> ResultLabels {
        ResultLabels { result: result.as_str(), profile: self.profile.clone() }
    }

    pub fn attempt(&self, result: AttemptResult, took: std::time::Duration) {
        self.attempts.get_or_create(&self.labels(result)).inc();
        self.attempt_seconds.get_or_create(&self.labels(result)).observe(took.as_secs_f64());
    }

    pub fn bound(&self, since_first_attempt: std::time::Duration) {
        self.e2e_seconds
            .get_or_create(&self.labels(AttemptResult::Scheduled))
            .observe(since_first_attempt.as_secs_f64());
    }

    pub fn pending(&self, counts: Counts) {
        for (queue, n) in [
            ("active", counts.active),
            ("backoff", counts.backoff),
            ("unschedulable", counts.unschedulable),
            ("gated", counts.gated),
        ] {
            self.pending.get_or_create(&QueueLabels { queue }).set(n as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_carry_kube_scheduler_names() {
        let m = Metrics::new("default-scheduler");
        m.attempt(AttemptResult::Scheduled, std::time::Duration::from_millis(2));
        m.bound(std::time::Duration::from_millis(5));
        m.pending(Counts { active: 1, backoff: 2, unschedulable: 3, gated: 4 });
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("scheduler_schedule_attempts_total{result=\"scheduled\",profile=\"default-scheduler\"} 1"),
            "{text}"
        );
        assert!(text.contains("scheduler_pending_pods{queue=\"unschedulable\"} 3"), "{text}");
        assert!(text.contains("scheduler_pod_scheduling_sli_duration_seconds_count"), "{text}");
    }
}
