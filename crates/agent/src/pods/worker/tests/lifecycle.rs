//! A pod from Pending to Running, and what its containers and sandbox do meanwhile.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_pending_pod_gets_a_sandbox_and_its_pulled_container_runs() {
    let h = Harness::new().await;
    let ctx = h.context();
    let mut pod = h.pod(&ctx, "web", one_container()).await;

    assert_eq!(pod.step().await, Next::Now, "resolved");
    assert!(matches!(pod.state(), State::Running(_)), "{:?}", pod.state());
    assert_eq!(pod.settle().await, POLL_WAIT);

    assert_eq!(
        h.runtime.calls(),
        [
            "RunPodSandbox attempt=0 handler=",
            "PodSandboxStatus sandbox-0",
            "ImageStatus busybox:1.36",
            "PullImage busybox:1.36",
            "ImageStatus busybox:1.36",
            "CreateContainer app-0 in sandbox-0 image=busybox:1.36",
            "StartContainer app-0",
            "ContainerStatus app-0",
        ],
        "a pod new to the node is not looked for: its sandbox and image are asked for at once"
    );
    let status = h.status(&mut pod).await;
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref(), Some("10.88.0.2"));
    let app = container_status(&status.container_statuses, "app");
    assert!(app.ready && app.state.as_ref().unwrap().running.is_some(), "{app:?}");
    assert_eq!(condition(&status, "Ready").status, "True");
}

#[tokio::test(start_paused = true)]
async fn a_new_pod_whose_volume_is_missing_keeps_its_sandbox_and_starts_in_it_once_the_volume_is_there() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    let ctx = h.context();
    let spec = serde_json::json!({
        "containers": [{"name": "app", "image": "busybox:1.36", "volumeMounts": [{"name": "conf", "mountPath": "/conf"}]}],
        "volumes": [{"name": "conf", "configMap": {"name": "settings"}}],
    });
    let mut pod = h.pod(&ctx, "web", spec).await;

    assert_eq!(pod.step().await, Next::Now, "resolved");
    assert!(matches!(pod.settle().await, Next::After(_)));
    assert_eq!(
        h.runtime.calls(),
        ["RunPodSandbox attempt=0 handler=", "PodSandboxStatus sandbox-0", "ImageStatus busybox:1.36"],
        "the sandbox is made while the volumes are set up; no container without its volume"
    );

    let config_maps: Api<core::ConfigMap> = Api::namespaced(h.client.clone(), "default");
    let settings = serde_json::from_value(serde_json::json!({"metadata": {"name": "settings"}, "data": {"a": "1"}}));
    config_maps.create(&PostParams::default(), &settings.unwrap()).await.unwrap();
    tokio::time::advance(Duration::from_secs(10)).await;
    pod.settle().await;

    let calls = h.runtime.calls();
    assert!(!calls[3..].iter().any(|c| c.starts_with("RunPodSandbox")), "one sandbox: {calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("CreateContainer app-0 in sandbox-0 ")), "{calls:?}");
    assert!(calls.contains(&"StartContainer app-0".to_string()), "{calls:?}");
    assert_eq!(h.status(&mut pod).await.phase.as_deref(), Some("Running"));
}

#[tokio::test(start_paused = true)]
async fn an_init_container_that_fails_is_run_again_and_the_app_starts_once_it_succeeds() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    h.runtime.exit_on_start("init", &[1, 0]);
    let ctx = h.context();
    let spec = serde_json::json!({
        "initContainers": [{"name": "init", "image": "busybox:1.36"}],
        "containers": [{"name": "app", "image": "busybox:1.36"}],
    });
    let mut pod = h.pod(&ctx, "init", spec).await;

    assert_eq!(pod.settle().await, POLL_WAIT);

    assert_eq!(
        h.runtime.changes(),
        [
            "RunPodSandbox attempt=0 handler=",
            "CreateContainer init-0 in sandbox-0 image=sha256:busybox:1.36",
            "StartContainer init-0",
            "CreateContainer init-1 in sandbox-0 image=sha256:busybox:1.36",
            "StartContainer init-1",
            "CreateContainer app-0 in sandbox-0 image=sha256:busybox:1.36",
            "StartContainer app-0",
        ]
    );
    let status = h.status(&mut pod).await;
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let init = container_status(&status.init_container_statuses, "init");
    assert_eq!(init.restart_count, 1);
    let done = init.state.as_ref().unwrap().terminated.as_ref().expect("init terminated");
    assert_eq!((done.exit_code, done.reason.as_deref()), (0, Some("Completed")));
    assert_eq!(condition(&status, "Initialized").status, "True");
}

#[tokio::test(start_paused = true)]
async fn a_crashing_container_is_restarted_after_a_back_off_of_10s_then_20s() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    h.runtime.exit_on_start("app", &[1, 1, 1]);
    let ctx = h.context();
    let mut pod = h.pod(&ctx, "crash", one_container()).await;
    let starts = |h: &Harness| h.runtime.changes().into_iter().filter(|c| c.starts_with("StartContainer")).count();

    pod.settle().await;
    assert_eq!(starts(&h), 2, "the first restart is at once");
    let status = h.status(&mut pod).await;
    let waiting = container_status(&status.container_statuses, "app").state.clone().unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
    assert!(waiting.message.as_deref().unwrap().starts_with("back-off 10s restarting failed container=app"));

    tokio::time::advance(Duration::from_secs(9)).await;
    pod.settle().await;
    assert_eq!(starts(&h), 2, "not within the back-off");
    tokio::time::advance(Duration::from_secs(1)).await;
    pod.settle().await;
    assert_eq!(starts(&h), 3, "at its end");
    let status = h.status(&mut pod).await;
    let app = container_status(&status.container_statuses, "app");
    assert_eq!(app.restart_count, 2);
    let waiting = app.state.clone().unwrap().waiting.unwrap();
    assert!(waiting.message.as_deref().unwrap().starts_with("back-off 20s"), "doubled: {waiting:?}");

    tokio::time::advance(Duration::from_secs(19)).await;
    pod.settle().await;
    assert_eq!(starts(&h), 3);
    tokio::time::advance(Duration::from_secs(1)).await;
    pod.settle().await;
    assert_eq!(starts(&h), 4);
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_sandbox_dies_gets_a_new_one_with_the_next_attempt_and_its_container_again() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    let ctx = h.context();
    let mut pod = h.pod(&ctx, "phoenix", one_container()).await;
    pod.settle().await;
    h.runtime.clear_calls();

    h.runtime.kill_sandbox("sandbox-0");
    assert_eq!(pod.settle().await, POLL_WAIT);

    assert_eq!(
        h.runtime.changes(),
        [
            "StopPodSandbox sandbox-0",
            "RunPodSandbox attempt=1 handler=",
            "CreateContainer app-1 in sandbox-1 image=sha256:busybox:1.36",
            "StartContainer app-1",
        ]
    );
    let status = h.status(&mut pod).await;
    assert_eq!(status.pod_ip.as_deref(), Some("10.88.0.3"), "the new sandbox's address");
    let app = container_status(&status.container_statuses, "app");
    assert_eq!(app.restart_count, 1);
    assert!(app.state.as_ref().unwrap().running.is_some(), "{app:?}");
    let last = app.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("the killed one");
    assert_eq!(last.exit_code, 137);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_goes_away_mid_step_fails_the_step_and_the_pod_starts_once_it_is_back() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    h.runtime.go_down_at("CreateContainer");
    let ctx = h.context();
    let mut pod = h.pod(&ctx, "flaky", one_container()).await;

    assert_eq!(pod.step().await, Next::Now);
    let failed = pod.try_step().await.expect_err("the runtime went away");
    assert!(matches!(&failed, WorkerError::Cri(e) if e.status.code() == tonic::Code::Unavailable), "{failed:?}");
    assert!(pod.try_step().await.is_err(), "still away");
    h.runtime.set_down(false);
    assert_eq!(pod.settle().await, POLL_WAIT);

    assert_eq!(
        h.runtime.changes(),
        [
            "RunPodSandbox attempt=0 handler=",
            "CreateContainer app-0 in sandbox-0 image=sha256:busybox:1.36",
            "StartContainer app-0",
        ],
        "the sandbox made before the runtime went away is used"
    );
    let status = h.status(&mut pod).await;
    assert_eq!(status.phase.as_deref(), Some("Running"));
}
