//! Pods get their ServiceAccount's credentials as kubelet gives them: a real `berth server` (its
//! ServiceAccount admission plugin on, as by default, and its controllers giving `default` its
//! ServiceAccount and `kube-root-ca.crt`), a real `berth runtime` and the real `berth agent`
//! running as the node. The agent asks TokenRequest for a token bound to the pod and writes it
//! with the CA and the namespace into the `kube-api-access-*` volume; the container sees them and
//! reads a ConfigMap through the API with them; the token dies with the pod, and an expired one is
//! refused.
//!
//! Needs root, runc, the CNI plugins, busybox-static, docker-registry and kubectl.

mod common;

use berth_apiserver::satoken::{self, Claims, ObjectRef, TokenKeys};
use berth_testenv::Registry;
use berth_testenv::images::{Format, busybox_image};
use common::{Agent, Runtime, Server, agent_toml, condition, eventually};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

const NODE: &str = "node-sa";
const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn apply(server: &Server, manifest: serde_json::Value) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), manifest.to_string()).unwrap();
    server.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
}

/// The server's own signing keys, from its data dir.
fn server_keys(server: &Server) -> TokenKeys {
    let pem = std::fs::read_to_string(server.data_dir().join("pki").join(satoken::SIGNING_KEY_FILE)).unwrap();
    TokenKeys::from_pem(&pem, &[], satoken::DEFAULT_ISSUER, Vec::new()).unwrap()
}

/// `name` on PATH.
fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()).unwrap_or_else(|| panic!("{name} on PATH"))
}

/// kubectl as the holder of `token` (the admin kubeconfig's cluster and CA, its user replaced).
fn kubectl_as(server: &Server, token: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--token", token];
    all.extend_from_slice(args);
    server.kubectl(&all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_a_token_bound_to_it_that_reads_the_api_and_dies_with_the_pod() {
    let registry = Registry::start();
    let image = registry.push_image("busybox", "1.0", &busybox_image(Format::Oci)).await.reference;
    let server = Server::start();
    let runtime = Runtime::builder().insecure_registry(registry.host()).start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = common::node_kubeconfig(&server, NODE, dir.path());
    let agent = Agent::start_as(NODE, &agent_toml(&[("berth", &runtime)], false), &kubeconfig);
    eventually("the node Ready", || async {
        server.node(NODE).await.filter(|n| condition(n, "Ready").is_some_and(|c| c.status == "True"))
    })
    .await;
    eventually("kube-root-ca.crt in default", || async {
        server.kubectl(&["get", "configmap", "kube-root-ca.crt"]).status.success().then_some(())
    })
    .await;
    apply(
        &server,
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "greeting", "namespace": "default"},
                           "data": {"message": "hello-from-the-api"}}),
    );

    // The container shows what it finds at the mount and reads the ConfigMap through the API as
    // any in-cluster client does: kubectl (a static binary, from the host) with no kubeconfig
    // takes the mounted token, CA and namespace and KUBERNETES_SERVICE_HOST/PORT. Those name the
    // server itself (on the host network), since Services do not route yet; busybox wget cannot
    // do HTTPS alone.
    let kubectl = std::fs::canonicalize(which("kubectl")).unwrap();
    let script = format!(
        "cd {MOUNT} && echo \"namespace=$(cat namespace)\" && test -s ca.crt && echo has-ca && \
         echo \"token=$(cat token)\" && echo \"api=$(/kubectl get configmap greeting -o jsonpath={{.data.message}})\" && \
         grep -q \"^123.45.67.89.foo.bar$\" /etc/hosts && head -1 /etc/hosts && \
         exec sleep 3600"
    );
    apply(
        &server,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 2, "hostNetwork": true,
                     "hostAliases": [{"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}],
                     "volumes": [{"name": "kubectl", "hostPath": {"path": kubectl, "type": "File"}}],
                     "containers": [{"name": "app", "image": image, "command": ["sh", "-c", script],
                                     "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                                             {"name": "KUBERNETES_SERVICE_PORT", "value": server.port.to_string()}],
                                     "volumeMounts": [{"name": "kubectl", "mountPath": "/kubectl", "readOnly": true}]}]}}),
    );
    let ready = server.kubectl(&["wait", "--for=condition=Ready", "pod/reader", "--timeout=120s"]);
    assert!(
        ready.status.success(),
        "pod Ready: {}\nagent log:\n{}",
        String::from_utf8_lossy(&ready.stderr),
        agent.log()
    );

    // Admission gave the pod the default ServiceAccount and the kube-api-access volume.
    let spec = server.kubectl_ok(&[
        "get",
        "pod",
        "reader",
        "-o",
        "jsonpath={.spec.serviceAccountName} {.spec.volumes[1].name} {.metadata.uid}",
    ]);
    let [sa, volume, uid]: [&str; 3] = spec.split(' ').collect::<Vec<_>>().try_into().unwrap();
    assert_eq!(sa, "default");
    assert!(volume.starts_with("kube-api-access-"), "{spec}");

    let logs = eventually("the container's view of the mount", || async {
        let out = server.kubectl_ok(&["logs", "reader"]);
        out.contains("api=").then_some(out)
    })
    .await;
    assert!(logs.contains("namespace=default") && logs.contains("has-ca"), "{logs}");
    assert!(logs.contains("api=hello-from-the-api"), "the container read the ConfigMap through the API: {logs}");
    assert!(
        logs.contains("# Kubernetes-managed hosts file (host network)."),
        "/etc/hosts is the pod's, with its aliases: {logs}"
    );
    let seen = logs.lines().find_map(|l| l.strip_prefix("token=")).unwrap().to_string();

    // On the node: kubelet's layout, the volume's mode, a token bound to this pod.
    let volume_dir: PathBuf =
        agent.dir.path().join("root/pods").join(uid).join("volumes/kubernetes.io~projected").join(volume);
    let data = std::fs::read_link(volume_dir.join("..data")).unwrap();
    assert!(data.to_string_lossy().starts_with("..2"), "{data:?}");
    for file in ["token", "ca.crt", "namespace"] {
        assert_eq!(std::fs::read_link(volume_dir.join(file)).unwrap(), PathBuf::from("..data").join(file));
        let mode = std::fs::metadata(volume_dir.join(file)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{file}: the volume's defaultMode");
    }
    let token = std::fs::read_to_string(volume_dir.join("token")).unwrap();
    assert_eq!(token, seen, "the container reads the node's file");
    let keys = server_keys(&server);
    let now = jiff::Timestamp::now().as_second();
    let claims = keys.verify(&token, &keys.api_audiences, now).expect("a token of the server's key for the API");
    assert_eq!(claims.subject(), "system:serviceaccount:default:default");
    assert_eq!(claims.pod, Some(ObjectRef { name: "reader".into(), uid: uid.into() }));
    assert_eq!(claims.node.map(|n| n.name).as_deref(), Some(NODE));
    assert_eq!(claims.expires_at - claims.issued_at, 3607);

    let read = kubectl_as(&server, &token, &["get", "configmap", "greeting", "-o", "jsonpath={.data.message}"]);
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    assert_eq!(String::from_utf8_lossy(&read.stdout), "hello-from-the-api");

    // The pod gone, its token is refused.
    server.kubectl_ok(&["delete", "pod", "reader", "--wait=true", "--timeout=60s"]);
    let refused = kubectl_as(&server, &token, &["get", "configmap", "greeting"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Unauthorized"), "{refused:?}");

    // A token of the server's own key for the same ServiceAccount, expired, is refused too.
    let sa_uid = server.kubectl_ok(&["get", "serviceaccount", "default", "-o", "jsonpath={.metadata.uid}"]);
    let sa_ref = ObjectRef { name: "default".into(), uid: sa_uid };
    let issued =
        |at: i64| keys.sign(&Claims::new(&keys.issuer, keys.api_audiences.clone(), at, 600, "default", sa_ref.clone()));
    let fresh = kubectl_as(&server, &issued(now), &["get", "configmap", "greeting", "-o", "name"]);
    assert!(fresh.status.success(), "the same key's current token works: {}", String::from_utf8_lossy(&fresh.stderr));
    let expired = kubectl_as(&server, &issued(now - 3600), &["get", "configmap", "greeting"]);
    assert!(!expired.status.success());
    assert!(String::from_utf8_lossy(&expired.stderr).contains("Unauthorized"), "{expired:?}");
}
