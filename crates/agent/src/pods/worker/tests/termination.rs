//! A deleted pod's end on the node: hooks, grace period, teardown, and the API object removed.

use super::*;
use kube::api::DeleteParams;

#[tokio::test(start_paused = true)]
async fn deleting_a_pod_runs_its_pre_stop_hook_then_stops_it_with_what_is_left_of_the_grace_period() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    h.runtime.set_exec_takes(Duration::from_secs(10));
    let ctx = h.context();
    let spec = serde_json::json!({
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": "app", "image": "busybox:1.36",
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "drain"]}}},
        }],
    });
    let mut pod = h.pod(&ctx, "graceful", spec).await;
    pod.settle().await;
    h.runtime.clear_calls();

    h.pods().delete("graceful", &DeleteParams::default()).await.unwrap();
    h.refresh(&mut pod).await;
    let started = tokio::time::Instant::now();
    assert_eq!(pod.step().await, Next::Exit);

    assert_eq!(
        h.runtime.changes(),
        [
            "ExecSync app-0 sh -c drain",
            "StopContainer app-0 timeout=20",
            "StopPodSandbox sandbox-0",
            "RemovePodSandbox sandbox-0",
        ],
        "the hook took 10 of the 30 seconds"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert!(matches!(pod.state(), State::Done));
    assert!(h.pods().get_opt("graceful").await.unwrap().is_none(), "the pod object is deleted");
    assert_eq!(h.runtime.container_state("app-0"), None, "removed with its sandbox");
}
