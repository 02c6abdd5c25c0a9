//! Elections against the real API server, in-process (the router as the `kube::Client`), in real
//! time with short durations: lease 1.5 s (written as 2 s), renew deadline 1 s, retry 0.2 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_leader::{LeaderElector, LeaseConfig};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::ServiceExt;

const NAMESPACE: &str = "kube-system";
const NAME: &str = "kube-scheduler";

async fn setup() -> (kube::Client, Arc<ApiState>, tempfile::TempDir) {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("berth_leader=debug").try_init();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    let client = kube::Client::new(router(state.clone()), "default");
    (client, state, dir)
}

/// A client whose requests hang forever while `down` is set, as in a network partition.
fn partitionable_client(state: &Arc<ApiState>) -> (kube::Client, Arc<AtomicBool>) {
    let down = Arc::new(AtomicBool::new(false));
    let app = router(state.clone());
    let flag = down.clone();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let app = app.clone();
        let down = flag.clone();
        async move {
            if down.load(SeqCst) {
                std::future::pending::<()>().await;
            }
            app.oneshot(req).await
        }
    });
    (kube::Client::new(svc, "default"), down)
}

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(200),
        ..LeaseConfig::new(NAMESPACE, NAME, identity)
    }
}

/// Counts `lead` futures started and dropped.
#[derive(Default)]
struct Terms {
    started: AtomicUsize,
    dropped: AtomicUsize,
}

struct Dropped(Arc<Terms>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, SeqCst);
    }
}

/// A candidate running in a task; its `lead` never returns by itself.
struct Candidate {
    leading: watch::Receiver<bool>,
    terms: Arc<Terms>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Candidate {
    fn start(client: kube::Client, identity: &str) -> Self {
        Self::start_with(client, identity, |_| false)
    }

    /// `returns(n)` says whether the n-th (0-based) `lead` future completes at once.
    fn start_with(client: kube::Client, identity: &str, returns: fn(usize) -> bool) -> Self {
        let elector = LeaderElector::new(client, config(identity));
        assert!(!elector.is_leader());
        let leading = elector.leading();
        let terms = Arc::new(Terms::default());
        let counted = terms.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let lead = move || {
            let n = counted.started.fetch_add(1, SeqCst);
            let guard = Dropped(counted.clone());
            async move {
                let _guard = guard;
                if !returns(n) {
                    std::future::pending::<()>().await;
                }
            }
        };
        let task = tokio::spawn(elector.run(lead, async {
            let _ = stopped.await;
        }));
        Self { leading, terms, stop: Some(stop), task }
    }

    /// Waits until leading is `want`; returns how long that took.
    async fn until_leading(&mut self, want: bool, within: Duration) -> Duration {
        let t0 = Instant::now();
        tokio::time::timeout(within, self.leading.wait_for(|l| *l == want))
            .await
            .unwrap_or_else(|_| panic!("leading did not become {want} within {within:?}"))
            .expect("elector alive");
        t0.elapsed()
    }

    fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    fn started(&self) -> usize {
        self.terms.started.load(SeqCst)
    }

    fn dropped(&self) -> usize {
        self.terms.dropped.load(SeqCst)
    }

    /// Resolves the shutdown future and waits for `run` to return.
    async fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(2), &mut self.task)
            .await
            .expect("run returns after shutdown")
            .expect("run did not panic");
    }
}

async fn lease(client: &kube::Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE).get(NAME).await.expect("the lease exists")
}

fn holder(l: &Lease) -> Option<&str> {
    l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty())
}

fn transitions(l: &Lease) -> Option<i32> {
    l.spec.as_ref().and_then(|s| s.lease_transitions)
}

fn acquire_time(l: &Lease) -> Option<MicroTime> {
    l.spec.as_ref().and_then(|s| s.acquire_time.clone())
}

fn renew_time(l: &Lease) -> Option<MicroTime> {
    l.spec.as_ref().and_then(|s| s.renew_time.clone())
}

#[tokio::test]
async fn the_first_candidate_leads_and_creates_the_lease_with_its_identity() {
    let (client, _state, _dir) = setup().await;
    let mut a = Candidate::start(client.clone(), "a");
    a.until_leading(true, Duration::from_secs(2)).await;
    assert_eq!(a.started(), 1);

    let first = lease(&client).await;
    assert_eq!(holder(&first), Some("a"));
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(2), "1.5 s rounds up to whole seconds");
    assert_eq!(spec.lease_transitions, Some(0));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());

    tokio::time::sleep(Duration::from_millis(700)).await;
    let later = lease(&client).await;
    assert_eq!(holder(&later), Some("a"));
    assert!(renew_time(&later) > renew_time(&first), "the leader renews: {later:?}");
    assert_eq!(acquire_time(&later), acquire_time(&first), "renewals keep acquireTime");
    assert_eq!(transitions(&later), Some(0));
    assert!(a.is_leading());
    assert_eq!((a.started(), a.dropped()), (1, 0));
}

#[tokio::test]
async fn a_second_candidate_waits_until_the_holder_stops_renewing() {
    let (client, _state, _dir) = setup().await;
    let mut a = Candidate::start(client.clone(), "a");
    a.until_leading(true, Duration::from_secs(2)).await;
    let first = lease(&client).await;
    let mut b = Candidate::start(client.clone(), "b");

    // Longer than the lease duration: a live holder is never taken over.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert!(a.is_leading());
    assert!(!b.is_leading());
    assert_eq!(b.started(), 0);

    // A crash: the task is gone, nothing is released.
    a.task.abort();
    a.until_leading(false, Duration::from_secs(1)).await;
    assert_eq!(a.dropped(), 1, "the aborted elector dropped its lead future");
    let waited = b.until_leading(true, Duration::from_secs(4)).await;
    assert!(waited >= Duration::from_millis(1500), "took over after only {waited:?}");
    let taken = lease(&client).await;
    assert_eq!(holder(&taken), Some("b"));
    assert_eq!(transitions(&taken), Some(1));
    assert!(acquire_time(&taken) > acquire_time(&first), "a takeover sets acquireTime");
}

#[tokio::test]
async fn shutting_down_drops_the_lead_future_and_releases_the_lease() {
    let (client, _state, _dir) = setup().await;
    let mut a = Candidate::start(client.clone(), "a");
    a.until_leading(true, Duration::from_secs(2)).await;
    a.shut_down().await;
    assert_eq!((a.started(), a.dropped()), (1, 1));
    assert!(!a.is_leading());

    let released = lease(&client).await;
    assert_eq!(holder(&released), None);
    let spec = released.spec.clone().unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(spec.lease_transitions, Some(0));

    // Nobody has to wait out the lease: the first round of a newcomer takes it.
    let mut b = Candidate::start(client.clone(), "b");
    let waited = b.until_leading(true, Duration::from_secs(2)).await;
    assert!(waited < Duration::from_millis(500), "waited {waited:?} for a released lease");
    let taken = lease(&client).await;
    assert_eq!(holder(&taken), Some("b"));
    assert_eq!(transitions(&taken), Some(1));
}

#[tokio::test]
async fn releasing_on_shutdown_lets_a_waiting_candidate_lead_at_once() {
    let (client, _state, _dir) = setup().await;
    let mut a = Candidate::start(client.clone(), "a");
    a.until_leading(true, Duration::from_secs(2)).await;
    let mut b = Candidate::start(client.clone(), "b");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!b.is_leading());

    let t0 = Instant::now();
    a.shut_down().await;
    b.until_leading(true, Duration::from_secs(2)).await;
    let waited = t0.elapsed();
    // Shorter than the lease duration: only the release explains it.
    assert!(waited < Duration::from_millis(1000), "waited {waited:?}");
    let taken = lease(&client).await;
    assert_eq!(holder(&taken), Some("b"));
    assert_eq!(transitions(&taken), Some(1));
}

#[tokio::test]
async fn leadership_is_lost_when_another_identity_takes_the_lease() {
    let (client, _state, _dir) = setup().await;
    let mut a = Candidate::start(client.clone(), "a");
    a.until_leading(true, Duration::from_secs(2)).await;

    // Another identity writes the lease (and then never renews it).
    let api = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    loop {
        let mut l = api.get(NAME).await.unwrap();
        let spec = l.spec.as_mut().unwrap();
        spec.holder_identity = Some("thief".into());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match api.replace(NAME, &PostParams::default(), &l).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("stealing the lease: {e}"),
        }
    }
    let stolen_at = Instant::now();

    let noticed = a.until_leading(false, Duration::from_secs(1)).await;
    assert!(noticed < Duration::from_millis(800), "noticed after {noticed:?}");
    assert_eq!((a.started(), a.dropped()), (1, 1), "the lead future is dropped");
    assert_eq!(holder(&lease(&client).await), Some("thief"), "a loser does not write the lease back");

    // The thief never renews: after its lease expires by a's clock, a campaigns its way back.
    a.until_leading(true, Duration::from_secs(4)).await;
    let waited = stolen_at.elapsed();
    assert!(waited >= Duration::from_millis(1500), "retook a live lease after {waited:?}");
    assert_eq!(a.started(), 2);
    let back = lease(&client).await;
    assert_eq!(holder(&back), Some("a"));
    assert_eq!(transitions(&back), Some(2));
}

#[tokio::test]
async fn a_partitioned_leader_steps_down_before_another_can_take_over() {
    let (client, state, _dir) = setup().await;
    let (partitioned, down) = partitionable_client(&state);
    let mut a = Candidate::start(partitioned, "a");
    a.until_leading(true, Duration::from_secs(2)).await;
    let mut b = Candidate::start(client.clone(), "b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_leading());

    down.store(true, SeqCst);
    let stepped_down = a.until_leading(false, Duration::from_secs(2)).await;
    // One failed round is not enough; the renew deadline (1 s from the last good round) is.
    assert!(stepped_down >= Duration::from_millis(500), "stepped down after {stepped_down:?}");
    assert!(stepped_down <= Duration::from_millis(1300), "stepped down after {stepped_down:?}");
    assert_eq!(a.dropped(), 1);
    assert!(!b.is_leading(), "b led while a still did");

    b.until_leading(true, Duration::from_secs(3)).await;
    let taken = lease(&client).await;
    assert_eq!(holder(&taken), Some("b"));
    assert_eq!(transitions(&taken), Some(1));
}

#[tokio::test]
async fn a_lead_that_returns_gives_the_lease_up_and_campaigns_again() {
    let (client, _state, _dir) = setup().await;
    let mut a = Candidate::start_with(client.clone(), "a", |n| n == 0);
    tokio::time::timeout(Duration::from_secs(3), async {
        while a.started() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("lead is called again after it returned");
    a.until_leading(true, Duration::from_secs(1)).await;
    assert_eq!(a.dropped(), 1, "only the first term has ended");
    let l = lease(&client).await;
    assert_eq!(holder(&l), Some("a"));
    assert_eq!(transitions(&l), Some(1), "release and re-acquire count as a transition");
}
