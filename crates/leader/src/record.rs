//! The pure core of a round: given the Lease spec as read and when we saw it change, what to write.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use crate::LeaseConfig;

/// The last record read and the local instant it was first seen in that exact form.
///
/// This is client-go's `observedRecord`/`observedTime`: expiry is judged from it, never from the
/// `renewTime` written by another machine's clock.
#[derive(Debug, Default)]
pub(crate) struct Observer {
    last: Option<(LeaseSpec, Instant)>,
}

impl Observer {
    /// Notes `spec` as read at `now`; returns when it was first seen unchanged.
    pub(crate) fn observe(&mut self, spec: &LeaseSpec, now: Instant) -> Instant {
        match &self.last {
            Some((seen, at)) if seen == spec => *at,
            _ => {
                self.last = Some((spec.clone(), now));
                now
            }
        }
    }
}

/// The outcome of [`decide`].
#[derive(Debug, PartialEq)]
pub(crate) enum Decision {
    /// Another holder's lease has not expired by our clock; try again later.
    Wait { holder: String, expires_at: Instant },
    /// Write this spec: a renewal if we hold the lease, else a takeover.
    Write(LeaseSpec),
}

/// What to do with a Lease whose spec is `current`, first seen unchanged at `observed_at`.
pub(crate) fn decide(
    current: &LeaseSpec,
    observed_at: Instant,
    now: Instant,
    wall: Timestamp,
    config: &LeaseConfig,
) -> Decision {
    let holder = current.holder_identity.as_deref().unwrap_or("");
    let ours = holder == config.identity;
    if !holder.is_empty() && !ours {
        let expires_at = observed_at + expiry(current, config);
        if now < expires_at {
            return Decision::Wait { holder: holder.to_string(), expires_at };
        }
    }
    let stamp = MicroTime(wall);
    let transitions = current.lease_transitions.unwrap_or(0);
    let (acquire_time, lease_transitions) = if ours {
        (current.acquire_time.clone().unwrap_or_else(|| stamp.clone()), transitions)
    } else {
        (stamp.clone(), transitions.saturating_add(1))
    };
    Decision::Write(LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(whole_seconds(config.lease_duration)),
        acquire_time: Some(acquire_time),
        renew_time: Some(stamp),
        lease_transitions: Some(lease_transitions),
        ..LeaseSpec::default()
    })
}

/// The spec of a Lease we create: held by us, no transitions yet.
pub(crate) fn created(wall: Timestamp, config: &LeaseConfig) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(whole_seconds(config.lease_duration)),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    }
}

/// The spec that gives a held lease up, as client-go's `ReleaseOnCancel`: no holder, a 1 s
/// duration, the transition count kept (the next holder increments it).
pub(crate) fn released(current: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: current.lease_transitions,
        ..LeaseSpec::default()
    }
}

/// How long a record must stay unchanged before another candidate may take it: the longer of what
/// the holder declared and what we were configured with, so neither side's setting is undercut.
fn expiry(current: &LeaseSpec, config: &LeaseConfig) -> Duration {
    let declared = current.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
    Duration::from_secs(declared).max(config.lease_duration)
}

/// `leaseDurationSeconds` for a duration: rounded up, so a client-go peer (which trusts the
/// record) never waits less than we promised; at least 1, as validation demands.
fn whole_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_millis().div_ceil(1000)).unwrap_or(i32::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(identity: &str) -> LeaseConfig {
        LeaseConfig::new("kube-system", "kube-scheduler", identity)
    }

    fn held_by(holder: &str, transitions: i32, at: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(at)),
            renew_time: Some(MicroTime(at)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn wall(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("a valid timestamp")
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_is_waited_for_by_our_clock_even_when_its_renew_time_is_ancient() {
        let me = config("b");
        // The holder's clock runs a day behind: its renewTime looks long expired.
        let spec = held_by("a", 3, wall(-86_400));
        let mut observer = Observer::default();
        let first = observer.observe(&spec, Instant::now());
        match decide(&spec, first, Instant::now(), wall(0), &me) {
            Decision::Wait { holder, expires_at } => {
                assert_eq!(holder, "a");
                assert_eq!(expires_at, first + Duration::from_secs(15));
            }
            other => panic!("took a live lease: {other:?}"),
        }

        tokio::time::advance(Duration::from_secs(14)).await;
        let seen = observer.observe(&spec, Instant::now());
        assert_eq!(seen, first, "an unchanged record keeps its first observation time");
        assert!(matches!(decide(&spec, seen, Instant::now(), wall(14), &me), Decision::Wait { .. }));

        tokio::time::advance(Duration::from_secs(1)).await;
        let Decision::Write(new) = decide(&spec, seen, Instant::now(), wall(15), &me) else {
            panic!("did not take an expired lease");
        };
        assert_eq!(new.holder_identity.as_deref(), Some("b"));
        assert_eq!(new.lease_transitions, Some(4));
        assert_eq!(new.acquire_time, Some(MicroTime(wall(15))));
        assert_eq!(new.renew_time, Some(MicroTime(wall(15))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_record_restarts_the_wait() {
        let me = config("b");
        let mut observer = Observer::default();
        let first = observer.observe(&held_by("a", 0, wall(0)), Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        let renewed = held_by("a", 0, wall(10));
        let seen = observer.observe(&renewed, Instant::now());
        assert_eq!(seen, first + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(matches!(decide(&renewed, seen, Instant::now(), wall(20), &me), Decision::Wait { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_longer_declared_duration_is_respected() {
        let mut me = config("b");
        me.lease_duration = Duration::from_secs(2);
        let spec = held_by("a", 0, wall(0));
        let now = Instant::now();
        assert_eq!(
            decide(&spec, now, now + Duration::from_secs(3), wall(3), &me),
            Decision::Wait { holder: "a".into(), expires_at: now + Duration::from_secs(15) }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renewing_keeps_acquire_time_and_transitions() {
        let me = config("a");
        let spec = held_by("a", 2, wall(0));
        let now = Instant::now();
        let Decision::Write(new) = decide(&spec, now, now, wall(5), &me) else { panic!("did not renew") };
        assert_eq!(new.acquire_time, Some(MicroTime(wall(0))));
        assert_eq!(new.renew_time, Some(MicroTime(wall(5))));
        assert_eq!(new.lease_transitions, Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_at_once_and_counts_a_transition() {
        let me = config("b");
        let spec = released(&held_by("a", 1, wall(0)), wall(1));
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_duration_seconds, Some(1));
        let now = Instant::now();
        let Decision::Write(new) = decide(&spec, now, now, wall(1), &me) else { panic!("waited on a free lease") };
        assert_eq!(new.holder_identity.as_deref(), Some("b"));
        assert_eq!(new.lease_transitions, Some(2));
    }

    #[test]
    fn lease_duration_seconds_round_up_and_are_at_least_one() {
        assert_eq!(whole_seconds(Duration::from_secs(15)), 15);
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(10)), 1);
        assert_eq!(whole_seconds(Duration::ZERO), 1);
    }

    #[test]
    fn a_created_lease_names_us_with_no_transitions() {
        let spec = created(wall(0), &config("a"));
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.acquire_time, spec.renew_time);
    }
}
