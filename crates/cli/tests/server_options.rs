//! End-to-end: `berth server` on a real etcd, and with a static token file.

mod common;

use common::{Etcd, Server, stderr};

#[test]
fn kubectl_works_against_a_server_on_etcd_and_data_survives_a_restart() {
    let etcd = Etcd::start();
    let mut s = Server::start_with(&["--etcd-servers", &etcd.endpoint]);
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: gvisor\nhandler: runsc\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    s.kubectl_ok(&["run", "p", "--image=busybox"]);
    s.restart();
    assert!(s.kubectl_ok(&["get", "runtimeclasses"]).contains("runsc"));
    assert!(s.kubectl_ok(&["get", "pods", "-o", "name"]).contains("pod/p"));
    let ns = s.kubectl_ok(&["get", "ns", "-o", "name"]);
    assert_eq!(ns.lines().filter(|l| l.contains("namespace/default")).count(), 1, "{ns}");
}

#[test]
fn tokens_from_the_token_file_authenticate_and_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.csv");
    std::fs::write(&file, "# users\nnode-token-123,system:node:n1,uid-n1,\"system:nodes\"\n").unwrap();
    let s = Server::start_with(&["--token-auth-file", file.to_str().unwrap()]);
    let server = format!("https://127.0.0.1:{}", s.port);
    let ca = s.data_dir().join("pki/ca.crt");
    let as_user = |token: &str| {
        std::process::Command::new("kubectl")
            .args(["--server", &server, "--certificate-authority", ca.to_str().unwrap(), "--token", token])
            .args(["--kubeconfig", "/dev/null", "get", "namespaces", "-o", "name"])
            .output()
            .unwrap()
    };
    let ok = as_user("node-token-123");
    assert!(ok.status.success(), "{}", stderr(&ok));
    let refused = as_user("not-a-token");
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("Unauthorized") || stderr(&refused).contains("must be logged in"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn the_service_account_admission_plugin_is_on_unless_disabled_and_the_issuer_follows_the_flag() {
    let s = Server::start_with(&["--service-account-issuer", "https://issuer.example"]);
    let missing = r#"{"spec": {"serviceAccountName": "nobody"}}"#;
    let out = s.kubectl(&["run", "early", "--image=busybox", "--overrides", missing]);
    assert!(!out.status.success(), "a pod naming a missing ServiceAccount is refused");
    let err = stderr(&out);
    assert!(
        err.contains("error looking up service account default/nobody: serviceaccount \"nobody\" not found"),
        "{err}"
    );
    let out = s.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n");
    assert!(out.status.success(), "{}", stderr(&out));
    s.kubectl_ok(&["run", "web", "--image=busybox"]);
    let mounts = s.kubectl_ok(&["get", "pod", "web", "-o", "jsonpath={.spec.containers[0].volumeMounts[0].mountPath}"]);
    assert_eq!(mounts, "/var/run/secrets/kubernetes.io/serviceaccount");
    let token = s.kubectl_ok(&["create", "token", "default"]);
    let token = token.trim();
    assert!(s.kubectl(&["--token", token, "get", "pods"]).status.success(), "the issuer is also the API's audience");

    let off = Server::start_with(&["--controllers=-*", "--disable-admission-plugins", "ServiceAccount"]);
    off.kubectl_ok(&["run", "early", "--image=busybox", "--overrides", missing]);
    let volumes = off.kubectl_ok(&["get", "pod", "early", "-o", "jsonpath={.spec.volumes}"]);
    assert_eq!(volumes, "", "nothing is mounted with the plugin off");
}
