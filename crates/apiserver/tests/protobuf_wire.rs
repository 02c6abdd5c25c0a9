//! The codec's protobuf byte for byte against encodings worked out here from the protobuf wire rules
//! (a key is `field number << 3 | wire type` as a varint; wire type 0 is a varint, 2 a length then the
//! bytes) and the Kubernetes API's field numbers, so a wrong field number or wire type in
//! `proto/k8s.schema` fails here. Fields are written in the order the schema lists them (Go's struct
//! order); a protobuf reader accepts any order.

use berth_apiserver::protobuf;
use serde_json::{Value, json};

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

fn key(field: u32, wire: u8) -> Vec<u8> {
    varint(u64::from(field) << 3 | u64::from(wire))
}

/// A varint field (wire type 0); negative numbers are their 64-bit two's complement.
fn num(field: u32, v: i64) -> Vec<u8> {
    [key(field, 0), varint(v as u64)].concat()
}

/// A length-delimited field (wire type 2) holding `parts` one after another.
fn ld(field: u32, parts: &[Vec<u8>]) -> Vec<u8> {
    let body = parts.concat();
    [key(field, 2), varint(body.len() as u64), body].concat()
}

fn text(field: u32, s: &str) -> Vec<u8> {
    ld(field, &[s.as_bytes().to_vec()])
}

/// `k8s\0`, then runtime.Unknown {1 typeMeta {1 apiVersion, 2 kind}, 2 raw, 3 contentEncoding, 4 contentType}.
fn envelope(api_version: &str, kind: &str, raw: &[Vec<u8>]) -> Vec<u8> {
    [b"k8s\0".to_vec(), ld(1, &[text(1, api_version), text(2, kind)]), ld(2, raw), text(3, ""), text(4, "")].concat()
}

fn check(object: &Value, expected: &[u8]) {
    let got = protobuf::encode(object).unwrap();
    assert_eq!(hex(&got), hex(expected), "{}", object["kind"]);
    assert_eq!(&protobuf::decode(expected).unwrap(), object);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_wire_helpers_follow_the_protobuf_rules() {
    assert_eq!(varint(300), [0xac, 0x02]);
    assert_eq!(key(1, 2), [0x0a]);
    assert_eq!(key(25, 0), [0xc8, 0x01]);
    assert_eq!(num(2, -1), [0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert_eq!(text(2, "hi"), [0x12, 0x02, b'h', b'i']);
}

/// Written out byte by byte.
#[test]
fn a_configmap_encodes_to_the_bytes_worked_out_by_hand() {
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default", "labels": {"app": "web"}},
        "immutable": true, "data": {"a": "1"}, "binaryData": {"b": "aGk="},
    });
    #[rustfmt::skip]
    let expected: Vec<u8> = [
        &b"k8s\0"[..],
        // 1 typeMeta (15 bytes): 1 apiVersion "v1", 2 kind "ConfigMap"
        &[0x0a, 15, 0x0a, 2], b"v1", &[0x12, 9], b"ConfigMap",
        // 2 raw, the ConfigMap (47 bytes)
        &[0x12, 47],
        //   1 metadata (26 bytes): 1 name "cfg", 3 namespace "default", 11 labels {1 key "app", 2 value "web"}
        &[0x0a, 26, 0x0a, 3], b"cfg", &[0x1a, 7], b"default", &[0x5a, 10, 0x0a, 3], b"app", &[0x12, 3], b"web",
        //   4 immutable true (varint)
        &[0x20, 1],
        //   2 data {1 key "a", 2 value "1"}
        &[0x12, 6, 0x0a, 1], b"a", &[0x12, 1], b"1",
        //   3 binaryData {1 key "b", 2 value the bytes "hi"}
        &[0x1a, 7, 0x0a, 1], b"b", &[0x12, 2], b"hi",
        // 3 contentEncoding "", 4 contentType ""
        &[0x1a, 0, 0x22, 0],
    ]
    .concat();
    check(&cm, &expected);
}

#[test]
fn a_pod_encodes_to_the_bytes_worked_out_from_its_field_numbers() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team-a", "creationTimestamp": "2024-01-02T03:04:05Z"},
        "spec": {
            "containers": [{
                "name": "nginx", "image": "nginx:1.27", "args": ["-g", "daemon off;"],
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "500m"}},
            }],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "nodeName": "node-1", "priority": -1,
        },
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    });
    // ObjectMeta: 1 name, 3 namespace, 8 creationTimestamp (Time: 1 seconds).
    let metadata = ld(1, &[text(1, "web"), text(3, "team-a"), ld(8, &[num(1, 1_704_164_645)])]);
    // ContainerPort: 3 containerPort, 4 protocol. ResourceRequirements: 1 limits, a map of Quantity {1 string}.
    let port = ld(6, &[num(3, 8080), text(4, "TCP")]);
    let resources = ld(8, &[ld(1, &[text(1, "cpu"), ld(2, &[text(1, "500m")])])]);
    // Container: 1 name, 2 image, 4 args (repeated: one field per item), 6 ports, 8 resources.
    let container =
        ld(2, &[text(1, "nginx"), text(2, "nginx:1.27"), text(4, "-g"), text(4, "daemon off;"), port, resources]);
    // PodSpec: 2 containers, 3 restartPolicy, 4 terminationGracePeriodSeconds, 10 nodeName, 25 priority.
    let spec = ld(2, &[container, text(3, "Always"), num(4, 30), text(10, "node-1"), num(25, -1)]);
    // PodStatus: 1 phase, 6 podIP.
    let status = ld(3, &[text(1, "Running"), text(6, "10.0.0.5")]);
    check(&pod, &envelope("v1", "Pod", &[metadata, spec, status]));
}

#[test]
fn a_deployment_encodes_int_or_strings_and_a_kept_zero_as_worked_out() {
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app"}]}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"}},
            "revisionHistoryLimit": 10,
        },
        "status": {"replicas": 3, "observedGeneration": 7},
    });
    let labels = || ld(11, &[text(1, "app"), text(2, "web")]);
    // IntOrString: 1 type (0 int, 1 string), 2 intVal, 3 strVal.
    let rolling = ld(2, &[ld(1, &[num(1, 0), num(2, 1)]), ld(2, &[num(1, 1), text(3, "25%")])]);
    // DeploymentSpec: 1 replicas (a Go pointer: its zero is written), 2 selector {1 matchLabels},
    // 3 template {1 metadata, 2 spec {2 containers}}, 4 strategy {1 type, 2 rollingUpdate}, 6 revisionHistoryLimit.
    let spec = ld(
        2,
        &[
            num(1, 0),
            ld(2, &[ld(1, &[text(1, "app"), text(2, "web")])]),
            ld(3, &[ld(1, &[labels()]), ld(2, &[ld(2, &[text(1, "app")])])]),
            ld(4, &[text(1, "RollingUpdate"), rolling]),
            num(6, 10),
        ],
    );
    // DeploymentStatus: 1 observedGeneration, 2 replicas.
    let status = ld(3, &[num(1, 7), num(2, 3)]);
    let metadata = ld(1, &[text(1, "web"), labels()]);
    check(&deployment, &envelope("apps/v1", "Deployment", &[metadata, spec, status]));
}

#[test]
fn every_served_kind_and_its_list_has_a_protobuf_message() {
    for rt in berth_api::resources::ALL {
        let api_version = rt.api_version();
        assert!(protobuf::supports(&api_version, rt.kind), "{api_version} {}", rt.kind);
        assert!(protobuf::supports(&api_version, &rt.list_kind()), "{api_version} {}", rt.list_kind());
    }
    for kind in ["DeleteOptions", "Status", "WatchEvent"] {
        assert!(protobuf::supports("v1", kind), "{kind}");
    }
    assert!(protobuf::supports("apiextensions.k8s.io/v1", "DeleteOptions"));
    assert!(!protobuf::supports("example.com/v1", "Widget"));
    assert!(!protobuf::supports("meta.k8s.io/v1", "Table"));
}
