//! End-to-end: `berth server token create` against a running `berth server`, and what the node
//! kubeconfig it prints may and may not do, through the real kubectl and the `kube` crate.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{Server, stderr, stdout};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};

fn token_create(data_dir: &Path, node: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["server", "token", "create", "--node", node, "--data-dir"])
        .arg(data_dir)
        .output()
        .expect("running berth server token create")
}

/// Creates a token for `node` and writes the printed kubeconfig to `file` next to the data dir.
fn node_kubeconfig(s: &Server, node: &str, file: &str) -> PathBuf {
    let out = token_create(&s.data_dir(), node);
    assert!(out.status.success(), "token create failed: {}", stderr(&out));
    let path = s.dir.path().join(file);
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

fn kubectl_as(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.unwrap_or_default().as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

fn ok(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> String {
    let out = kubectl_as(kubeconfig, args, input);
    assert!(out.status.success(), "kubectl {args:?} failed: {}{}", stderr(&out), stdout(&out));
    stdout(&out)
}

/// Runs kubectl expecting a 403 and returns kubectl's error line.
fn forbidden(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> String {
    let out = kubectl_as(kubeconfig, args, input);
    assert!(!out.status.success(), "kubectl {args:?} succeeded: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.starts_with("Error from server (Forbidden): "), "kubectl {args:?}: {err}");
    err.trim_end().to_string()
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    kube::Client::try_from(cfg).unwrap()
}

const SETUP: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-b
---
apiVersion: v1
kind: Secret
metadata:
  name: mounted
stringData:
  password: hunter2
---
apiVersion: v1
kind: Secret
metadata:
  name: unrelated
stringData:
  password: other
---
apiVersion: v1
kind: Pod
metadata:
  name: web-a
spec:
  nodeName: node-a
  containers:
  - name: c
    image: busybox
  volumes:
  - name: creds
    secret:
      secretName: mounted
---
apiVersion: v1
kind: Pod
metadata:
  name: web-b
spec:
  nodeName: node-b
  containers:
  - name: c
    image: busybox
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_node_kubeconfig_made_while_the_server_runs_may_do_what_a_kubelet_needs_and_nothing_more() {
    let s = Server::start();
    let out = s.apply(SETUP);
    assert!(out.status.success(), "{}", stderr(&out));
    let kc = node_kubeconfig(&s, "node-a", "node-a.kubeconfig");

    // The printed kubeconfig is the admin's cluster with a node user.
    let admin: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(s.kubeconfig()).unwrap()).unwrap();
    let node: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&kc).unwrap()).unwrap();
    assert_eq!(node["clusters"][0]["cluster"], admin["clusters"][0]["cluster"]);
    assert_eq!(node["users"][0]["name"].as_str(), Some("system:node:node-a"));
    let tokens = s.data_dir().join("node-tokens.csv");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&tokens).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // What a kubelet does, through kubectl.
    ok(
        &kc,
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\n  labels:\n    kubernetes.io/hostname: node-a\n"),
    );
    let nodes = ok(&kc, &["get", "nodes", "-o", "name"], None);
    assert_eq!(nodes.lines().collect::<Vec<_>>(), ["node/node-a", "node/node-b"]);
    assert_eq!(ok(&kc, &["get", "secret", "mounted", "-o", "jsonpath={.data.password}"], None), "aHVudGVyMg==");

    // What a kubelet does, through the kube crate (as berth's agent does). kubectl cannot patch
    // pod status as a node: it reads pods/status first, which Kubernetes does not let nodes do.
    let client = client(&kc).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-a"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let renew = serde_json::json!({"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}});
    leases.patch("node-a", &PatchParams::default(), &Patch::Merge(&renew)).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("web-a", &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap();
    let err = pods.patch_status("web-b", &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("{err:?}") };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        r#"pods "web-b" is forbidden: node "node-a" can only update pod status for pods with spec.nodeName set to itself"#
    );

    // What it may not do: 403 with Kubernetes' messages, and nothing changes.
    assert_eq!(
        forbidden(
            &kc,
            &["patch", "node", "node-b", "--type=merge", "-p", r#"{"metadata":{"labels":{"x":"y"}}}"#],
            None
        ),
        r#"Error from server (Forbidden): nodes "node-b" is forbidden: node "node-a" is not allowed to modify node "node-b""#
    );
    assert_eq!(
        forbidden(&kc, &["label", "node", "node-a", "node-restriction.kubernetes.io/pool=gpu"], None),
        r#"Error from server (Forbidden): nodes "node-a" is forbidden: is not allowed to modify labels: node-restriction.kubernetes.io/pool"#
    );
    assert_eq!(
        forbidden(&kc, &["get", "secret", "unrelated"], None),
        r#"Error from server (Forbidden): secrets "unrelated" is forbidden: User "system:node:node-a" cannot get resource "secrets" in API group "" in the namespace "default": no relationship found between node 'node-a' and this object"#
    );
    assert_eq!(
        forbidden(&kc, &["run", "sneaky", "--image=busybox"], None),
        r#"Error from server (Forbidden): pods "sneaky" is forbidden: pod does not have "kubernetes.io/config.mirror" annotation, node "node-a" can only create mirror pods"#
    );
    assert_eq!(s.kubectl_ok(&["get", "node", "node-b", "-o", "jsonpath={.metadata.labels}"]), "");
    assert_eq!(
        s.kubectl_ok(&["get", "node", "node-a", "-o", "jsonpath={.metadata.labels}"]),
        r#"{"kubernetes.io/hostname":"node-a"}"#
    );
    assert_eq!(
        s.kubectl_ok(&["get", "lease", "node-a", "-n", "kube-node-lease", "-o", "jsonpath={.spec.renewTime}"]),
        "2026-01-01T00:00:00.000000Z"
    );
    assert_eq!(s.kubectl_ok(&["get", "pod", "web-a", "-o", "jsonpath={.status.conditions[0].type}"]), "Ready");
    assert_eq!(s.kubectl_ok(&["get", "pod", "web-b", "-o", "jsonpath={.status.conditions}"]), "");
    assert!(!s.kubectl_ok(&["get", "pods", "-o", "name"]).contains("sneaky"));
}

#[test]
fn a_second_token_for_a_node_works_alongside_the_first() {
    let s = Server::start();
    let first = node_kubeconfig(&s, "node-a", "first.kubeconfig");
    let second = node_kubeconfig(&s, "node-a", "second.kubeconfig");
    assert_ne!(std::fs::read(&first).unwrap(), std::fs::read(&second).unwrap());
    for kc in [&first, &second] {
        ok(kc, &["get", "nodes"], None);
    }
    s.kubectl_ok(&["get", "nodes"]);
}

#[test]
fn a_bad_node_name_or_a_data_dir_without_a_server_is_a_clear_error() {
    let s = Server::start();
    let out = token_create(&s.data_dir(), "Node_A");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(r#"invalid node name "Node_A": a lowercase RFC 1123 subdomain must consist of"#),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
    assert!(!s.data_dir().join("node-tokens.csv").exists());

    let empty = tempfile::tempdir().unwrap();
    let out = token_create(empty.path(), "node-a");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("admin.kubeconfig (has `berth server --data-dir"), "{}", stderr(&out));
    assert!(!empty.path().join("node-tokens.csv").exists());
}
