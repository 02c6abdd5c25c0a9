//! Which runtime a pod goes to: its RuntimeClass's handler, or the runtime that holds it already.

use super::*;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::DeleteParams;

async fn runtime_class(h: &Harness, name: &str, handler: &str) {
    let rc: RuntimeClass =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "handler": handler})).unwrap();
    Api::<RuntimeClass>::all(h.client.clone()).create(&PostParams::default(), &rc).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_handler_no_runtime_serves_waits_with_runtime_handler_not_found() {
    let h = Harness::new().await;
    runtime_class(&h, "kata", "kata").await;
    let ctx = h.context();
    let spec =
        serde_json::json!({"runtimeClassName": "kata", "containers": [{"name": "app", "image": "busybox:1.36"}]});
    let mut pod = h.pod(&ctx, "kata", spec).await;

    assert_eq!(pod.step().await, Next::After(Duration::from_secs(1)));
    assert!(matches!(pod.state(), State::NoRuntime(..)), "{:?}", pod.state());
    let status = h.status(&mut pod).await;
    let c = condition(&status, "PodReadyToStartContainers");
    assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("RuntimeHandlerNotFound")));
    assert!(c.message.as_deref().unwrap().starts_with("runtime handler \"kata\" is not served"), "{c:?}");

    assert_eq!(pod.step().await, Next::Now, "looked for again");
    assert_eq!(pod.step().await, Next::After(Duration::from_secs(2)), "with back-off");
    assert!(h.runtime.calls().is_empty(), "{:?}", h.runtime.calls());
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_runtime_class_was_deleted_fails_with_runtime_class_not_found() {
    let h = Harness::new().await;
    runtime_class(&h, "gvisor", "runsc").await;
    let ctx = h.context();
    let spec =
        serde_json::json!({"runtimeClassName": "gvisor", "containers": [{"name": "app", "image": "busybox:1.36"}]});
    let mut pod = h.pod(&ctx, "sandboxed", spec).await;
    Api::<RuntimeClass>::all(h.client.clone()).delete("gvisor", &DeleteParams::default()).await.unwrap();

    assert_eq!(pod.step().await, Next::Idle);

    assert!(matches!(pod.state(), State::Finished(super::super::Finished::Stopped(None))), "{:?}", pod.state());
    let status = h.status(&mut pod).await;
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("RuntimeClassNotFound"));
    assert_eq!(status.message.as_deref(), Some("RuntimeClass \"gvisor\" not found"));
    assert!(h.runtime.calls().is_empty(), "{:?}", h.runtime.calls());
}

#[tokio::test(start_paused = true)]
async fn after_an_agent_restart_the_pod_adopts_its_running_sandbox_and_container_and_starts_nothing() {
    let h = Harness::new().await;
    h.runtime.add_image("busybox:1.36");
    let before = h.context();
    let mut pod = h.pod(&before, "survivor", one_container()).await;
    pod.settle().await;
    h.status(&mut pod).await;
    drop(pod);
    h.runtime.clear_calls();

    let ctx = h.context();
    recover(&ctx).await;
    let mut pod = h.worker(&ctx, h.pods().get("survivor").await.unwrap());
    assert_eq!(pod.settle().await, POLL_WAIT);

    assert!(h.runtime.changes().is_empty(), "nothing made or started: {:?}", h.runtime.changes());
    assert!(h.runtime.calls().contains(&"ListPodSandbox".to_string()), "looked for: {:?}", h.runtime.calls());
    let State::Running(running) = pod.state() else { panic!("{:?}", pod.state()) };
    assert_eq!(running.sandbox.held().map(|s| s.id.as_str()), Some("sandbox-0"));
    let status = h.status(&mut pod).await;
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref(), Some("10.88.0.2"));
    assert!(container_status(&status.container_statuses, "app").ready);
}
