//! The `kube` crate as a client of the router, in-process: CRUD, selectors, pagination, and a
//! watcher that survives a forced compaction (410 → relist) without losing an event.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;

async fn setup() -> (kube::Client, Arc<ApiState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    let client = kube::Client::new(router(state.clone()), "default");
    (client, state, dir)
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": {"app": "x"}}, "data": {"k": name}}))
        .unwrap()
}

#[tokio::test]
async fn kube_client_creates_lists_pages_and_deletes() {
    let (client, _state, _dir) = setup().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    for i in 0..7 {
        api.create(&PostParams::default(), &cm(&format!("cm-{i}"))).await.unwrap();
    }
    let page = api.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(page.items.len(), 3);
    let token = page.metadata.continue_.clone().expect("a continue token");
    let rest = api.list(&ListParams::default().limit(10).continue_token(&token)).await.unwrap();
    assert_eq!(rest.items.len(), 4);
    assert!(rest.metadata.continue_.as_deref().unwrap_or("").is_empty());
    let one = api.list(&ListParams::default().fields("metadata.name=cm-4")).await.unwrap();
    assert_eq!(one.items.len(), 1);
    api.delete("cm-4", &DeleteParams::default()).await.unwrap();
    let err = api.get("cm-4").await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 404), "{err:?}");
}

#[tokio::test]
async fn watcher_survives_forced_compaction_without_losing_an_event() {
    let (client, state, _dir) = setup().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let secrets: Api<Secret> = Api::default_namespaced(client);
    api.create(&PostParams::default(), &cm("before")).await.unwrap();

    // Short server-side timeouts make the watcher reconnect often, from its last resourceVersion.
    let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
    let inits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = inits.clone();
    let stream = watcher(api.clone(), watcher::Config::default().timeout(1))
        .inspect(move |ev| {
            if matches!(ev, Ok(watcher::Event::Init)) {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
        .boxed();
    let reflected = kube::runtime::reflector(writer, stream);
    let task = tokio::spawn(reflected.for_each(|_| async {}));
    reader.wait_until_ready().await.unwrap();

    // Move the store's revision on without touching configmaps, then forget all history: the
    // watcher's next resume point is compacted away.
    for i in 0..5 {
        let s: Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("noise-{i}")}})).unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let rev = state.store.current_revision().await.unwrap();
    state.store.compact(rev).await.unwrap();

    // Wait for the 410 → relist.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while inits.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the watcher never relisted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Changes around and after the relist all arrive.
    for i in 0..10 {
        api.create(&PostParams::default(), &cm(&format!("after-{i}"))).await.unwrap();
    }
    api.delete("before", &DeleteParams::default()).await.unwrap();
    let want: BTreeSet<String> = (0..10).map(|i| format!("after-{i}")).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let have: BTreeSet<String> = reader.state().iter().map(|c| c.metadata.name.clone().unwrap()).collect();
        if have == want {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "reflector has {have:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
}

/// Lists longer than one store read are written chunk by chunk: every object once, one
/// resourceVersion, selectors across chunks, and the same items as JSON, Table and protobuf.
#[tokio::test]
async fn a_list_of_many_chunks_has_every_object_once_as_json_table_and_protobuf() {
    let (client, state, _dir) = setup().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let total = 1234;
    let creates = (0..total).map(|i| {
        let api = api.clone();
        async move {
            let mut cm = cm(&format!("cm-{i:04}"));
            cm.metadata.labels.as_mut().unwrap().insert("odd".into(), (i % 2 == 1).to_string());
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
    });
    futures::stream::iter(creates).buffer_unordered(16).collect::<Vec<()>>().await;
    let whole = api.list(&ListParams::default()).await.unwrap();
    let names: BTreeSet<String> = whole.items.iter().map(|c| c.metadata.name.clone().unwrap()).collect();
    assert_eq!((whole.items.len(), names.len()), (total, total));
    let rv: i64 = whole.metadata.resource_version.unwrap().parse().unwrap();
    assert!(whole.items.iter().all(|c| c.metadata.resource_version.as_ref().unwrap().parse::<i64>().unwrap() <= rv));
    let odd = api.list(&ListParams::default().labels("odd=true")).await.unwrap();
    assert_eq!(odd.items.len(), total / 2);

    let get = |accept: &'static str| {
        http::Request::get("/api/v1/namespaces/default/configmaps").header("accept", accept).body(Vec::new()).unwrap()
    };
    let table: serde_json::Value =
        client.request(get("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")).await.unwrap();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"].as_array().unwrap().len(), total);
    assert_eq!(table["rows"][0]["object"]["metadata"]["name"], "cm-0000");

    let req = http::Request::get("/api/v1/namespaces/default/configmaps")
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(router(state), req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/vnd.kubernetes.protobuf");
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    let decoded = berth_apiserver::protobuf::decode(&bytes).unwrap();
    assert_eq!(decoded["kind"], "ConfigMapList");
    assert_eq!(decoded["items"].as_array().unwrap().len(), total);
    assert_eq!(decoded["items"][1233]["data"]["k"], "cm-1233");
}
