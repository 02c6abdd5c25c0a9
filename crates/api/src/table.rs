//! Server-side printing: the columns and cells `kubectl get` shows for each resource.
//!
//! Mirrors what Kubernetes' internal printers produce for `as=Table` requests. The server always
//! prints the wide form: every row carries all cells, and kubectl hides the columns of
//! priority > 0 unless asked for `-o wide`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::ResourceType;

const NONE: &str = "<none>";
const UNKNOWN: &str = "<unknown>";

const NAME_DOC: &str = "Name must be unique within a namespace. Cannot be updated.";
const AGE_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created.";
const CONTAINERS_DOC: &str = "Names of each container in the template.";
const IMAGES_DOC: &str = "Images referenced by each container in the template.";
const SELECTOR_DOC: &str = "Label query over pods that should match the replica count.";

/// One column: (name, type, format, priority, description).
type Col = (&'static str, &'static str, &'static str, u32, &'static str);

const fn name_col() -> Col {
    ("Name", "string", "name", 0, NAME_DOC)
}
const fn age_col() -> Col {
    ("Age", "string", "", 0, AGE_DOC)
}
const fn text(name: &'static str, priority: u32, doc: &'static str) -> Col {
    (name, "string", "", priority, doc)
}

fn column_table(rt: &ResourceType) -> Vec<Col> {
    match (rt.group, rt.kind) {
        ("", "Pod") => vec![
            name_col(),
            text("Ready", 0, "The aggregate readiness state of this pod for accepting traffic."),
            text("Status", 0, "The aggregate status of the containers in this pod."),
            text(
                "Restarts",
                0,
                "The number of times the containers in this pod have been restarted and when the last one restarted.",
            ),
            age_col(),
            text("IP", 1, "IP address allocated to the pod. Routable at least within the cluster."),
            text("Node", 1, "The node the pod is bound to."),
            text("Nominated Node", 1, "The node the scheduler nominated for this pod while preempting others."),
            text(
                "Readiness Gates",
                1,
                "Conditions that must be true, besides container readiness, for the pod to be ready.",
            ),
        ],
        ("", "Namespace") => vec![name_col(), text("Status", 0, "The status of the namespace"), age_col()],
        ("", "Node") => vec![
            name_col(),
            text("Status", 0, "The status of the node"),
            text("Roles", 0, "The roles of the node"),
            age_col(),
            text("Version", 0, "Kubelet version reported by the node."),
            text("Internal-IP", 1, "The node's first InternalIP address."),
            text("External-IP", 1, "The node's first ExternalIP address."),
            text("OS-Image", 1, "OS image reported by the node."),
            text("Kernel-Version", 1, "Kernel version reported by the node."),
            text("Container-Runtime", 1, "Container runtime version reported by the node."),
        ],
        ("", "ConfigMap") => vec![name_col(), text("Data", 0, "The number of data and binaryData entries."), age_col()],
        ("", "Secret") => vec![
            name_col(),
            text("Type", 0, "Used to facilitate programmatic handling of secret data."),
            text("Data", 0, "The number of data entries."),
            age_col(),
        ],
        ("", "ServiceAccount") => {
            vec![name_col(), text("Secrets", 0, "The number of secrets referenced by the service account."), age_col()]
        }
        // Both event views print as core/v1 events; their first column is not the name.
        (_, "Event") => vec![
            text("Last Seen", 0, "The time at which the most recent occurrence of this event was recorded."),
            text("Type", 0, "Type of this event (Normal, Warning)."),
            text(
                "Reason",
                0,
                "Short, machine understandable reason for the transition into the object's current status.",
            ),
            text("Object", 0, "The object that this event is about."),
            text("Subobject", 1, "The field of the object the event is about, e.g. a container."),
            text("Source", 1, "The component reporting this event."),
            text("Message", 0, "A human-readable description of the status of this operation."),
            text("First Seen", 1, "The time at which the event was first recorded."),
            text("Count", 1, "The number of times this event has occurred."),
            ("Name", "string", "name", 1, NAME_DOC),
        ],
        ("", "Service") => vec![
            name_col(),
            text("Type", 0, "The type of the service."),
            text("Cluster-IP", 0, "The cluster IP of the service."),
            text("External-IP", 0, "The external IPs of the service."),
            text("Port(s)", 0, "The ports of the service."),
            age_col(),
            text("Selector", 1, "Route service traffic to pods with label keys and values matching this selector."),
        ],
        ("", "Endpoints") => vec![name_col(), text("Endpoints", 0, "Endpoints of the service."), age_col()],
        ("discovery.k8s.io", "EndpointSlice") => vec![
            name_col(),
            text("AddressType", 0, "The type of the addresses in this slice."),
            text("Ports", 0, "The ports of this slice."),
            text("Endpoints", 0, "The addresses of the endpoints in this slice."),
            age_col(),
        ],
        ("coordination.k8s.io", "Lease") => {
            vec![name_col(), text("Holder", 0, "The identity of the holder of the lease."), age_col()]
        }
        ("node.k8s.io", "RuntimeClass") => {
            vec![
                name_col(),
                text("Handler", 0, "The underlying runtime and configuration that handles pods of this class."),
                age_col(),
            ]
        }
        ("apps", "Deployment") => vec![
            name_col(),
            text("Ready", 0, "Number of the pod with ready state"),
            text(
                "Up-to-date",
                0,
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            text(
                "Available",
                0,
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
            ),
            age_col(),
            text("Containers", 1, CONTAINERS_DOC),
            text("Images", 1, IMAGES_DOC),
            text("Selector", 1, SELECTOR_DOC),
        ],
        ("apps", "ReplicaSet") => vec![
            name_col(),
            ("Desired", "integer", "", 0, "The number of desired replicas."),
            ("Current", "integer", "", 0, "The most recently observed number of replicas."),
            ("Ready", "integer", "", 0, "The number of pods targeted by this ReplicaSet with a Ready condition."),
            age_col(),
            text("Containers", 1, CONTAINERS_DOC),
            text("Images", 1, IMAGES_DOC),
            text("Selector", 1, SELECTOR_DOC),
        ],
        ("", "ReplicationController") => vec![
            name_col(),
            ("Desired", "integer", "", 0, "The number of desired replicas"),
            ("Current", "integer", "", 0, "The number of actually running replicas"),
            ("Ready", "integer", "", 0, "The number of ready replicas"),
            age_col(),
            text("Containers", 1, CONTAINERS_DOC),
            text("Images", 1, IMAGES_DOC),
            text("Selector", 1, SELECTOR_DOC),
        ],
        ("", "PodTemplate") => vec![
            name_col(),
            text("Containers", 0, CONTAINERS_DOC),
            text("Images", 0, IMAGES_DOC),
            text("Pod Labels", 0, "The labels for the pod template."),
        ],
        // The generic table Kubernetes falls back to: name and age.
        _ => vec![name_col(), age_col()],
    }
}

/// `TableColumnDefinition`s for `rt`, as JSON objects.
pub fn columns(rt: &ResourceType) -> Vec<Value> {
    column_table(rt)
        .into_iter()
        .map(|(name, ty, format, priority, description)| {
            json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
        })
        .collect()
}

/// The cells of one row for `obj`, aligned with [`columns`]; ages are relative to `now`.
pub fn cells(rt: &ResourceType, obj: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let name = str_at(obj, &["metadata", "name"]);
    let age = age(obj.pointer("/metadata/creationTimestamp"), now);
    match (rt.group, rt.kind) {
        ("", "Pod") => pod_cells(obj, now),
        ("", "Namespace") => vec![name.into(), str_at(obj, &["status", "phase"]).into(), age.into()],
        ("", "Node") => node_cells(obj, now),
        ("", "ConfigMap") => {
            let n = count_keys(obj.get("data")) + count_keys(obj.get("binaryData"));
            vec![name.into(), n.into(), age.into()]
        }
        ("", "Secret") => {
            vec![name.into(), str_at(obj, &["type"]).into(), count_keys(obj.get("data")).into(), age.into()]
        }
        ("", "ServiceAccount") => vec![name.into(), list_len(obj.get("secrets")).into(), age.into()],
        (_, "Event") => event_cells(obj, now),
        ("", "Service") => service_cells(obj, name, age),
        ("", "Endpoints") => vec![name.into(), endpoints_cell(obj).into(), age.into()],
        ("discovery.k8s.io", "EndpointSlice") => endpoint_slice_cells(obj, name, age),
        ("coordination.k8s.io", "Lease") => {
            vec![name.into(), str_at(obj, &["spec", "holderIdentity"]).into(), age.into()]
        }
        ("node.k8s.io", "RuntimeClass") => vec![name.into(), str_at(obj, &["handler"]).into(), age.into()],
        ("apps", "Deployment") => {
            let desired = int_at(obj, &["spec", "replicas"]).unwrap_or(1);
            let ready = int_at(obj, &["status", "readyReplicas"]).unwrap_or(0);
            let mut row = vec![
                name.into(),
                format!("{ready}/{desired}").into(),
                int_at(obj, &["status", "updatedReplicas"]).unwrap_or(0).into(),
                int_at(obj, &["status", "availableReplicas"]).unwrap_or(0).into(),
                age.into(),
            ];
            row.extend(template_cells(obj));
            row
        }
        ("apps", "ReplicaSet") => {
            let mut row = vec![
                name.into(),
                int_at(obj, &["spec", "replicas"]).unwrap_or(1).into(),
                int_at(obj, &["status", "replicas"]).unwrap_or(0).into(),
                int_at(obj, &["status", "readyReplicas"]).unwrap_or(0).into(),
                age.into(),
            ];
            row.extend(template_cells(obj));
            row
        }
        ("", "ReplicationController") => {
            let containers = container_cells(obj, &["spec", "template", "spec", "containers"]);
            let mut row = vec![
                name.into(),
                int_at(obj, &["spec", "replicas"]).unwrap_or(1).into(),
                int_at(obj, &["status", "replicas"]).unwrap_or(0).into(),
                int_at(obj, &["status", "readyReplicas"]).unwrap_or(0).into(),
                age.into(),
            ];
            row.extend(containers);
            row.push(label_set_string(obj.pointer("/spec/selector")).into());
            row
        }
        ("", "PodTemplate") => {
            let mut row = vec![name.into()];
            row.extend(container_cells(obj, &["template", "spec", "containers"]));
            row.push(label_set_string(obj.pointer("/template/metadata/labels")).into());
            row
        }
        _ => vec![name.into(), age.into()],
    }
}

/// The names and the images of the containers listed at `path`, each comma-joined.
fn container_cells(obj: &Value, path: &[&str]) -> [Value; 2] {
    let containers = items(obj, path);
    let names: Vec<&str> = containers.iter().map(|c| c["name"].as_str().unwrap_or("")).collect();
    let images: Vec<&str> = containers.iter().map(|c| c["image"].as_str().unwrap_or("")).collect();
    [names.join(",").into(), images.join(",").into()]
}

/// A label set (a map of strings) as Kubernetes prints it: `k=v` sorted by key, comma-joined;
/// `<none>` when empty.
fn label_set_string(set: Option<&Value>) -> String {
    let Some(m) = set.and_then(Value::as_object).filter(|m| !m.is_empty()) else { return NONE.into() };
    let mut pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect();
    pairs.sort();
    pairs.join(",")
}

/// Kubernetes' `duration.HumanDuration`: a short, coarser-as-it-grows rendering of an age.
pub fn human_duration(d: Duration) -> String {
    human_seconds(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// [`human_duration`] for a signed number of whole seconds: clocks a second apart count as now.
fn human_seconds(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

fn timestamp(v: Option<&Value>) -> Option<jiff::Timestamp> {
    v?.as_str()?.parse().ok()
}

/// Time since `ts`, or `<unknown>` when it is missing (Kubernetes' zero time).
fn age(ts: Option<&Value>, now: jiff::Timestamp) -> String {
    match timestamp(ts) {
        Some(t) => since(t, now),
        None => UNKNOWN.into(),
    }
}

fn since(t: jiff::Timestamp, now: jiff::Timestamp) -> String {
    human_seconds(now.duration_since(t).as_secs())
}

fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    let mut v = obj;
    for p in path {
        match v.get(p) {
            Some(next) => v = next,
            None => return "",
        }
    }
    v.as_str().unwrap_or("")
}

fn int_at(obj: &Value, path: &[&str]) -> Option<i64> {
    let mut v = obj;
    for p in path {
        v = v.get(p)?;
    }
    v.as_i64()
}

fn count_keys(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_object).map_or(0, |m| m.len() as i64)
}

fn list_len(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_array).map_or(0, |l| l.len() as i64)
}

fn items<'a>(obj: &'a Value, path: &[&str]) -> &'a [Value] {
    let mut v = obj;
    for p in path {
        match v.get(p) {
            Some(next) => v = next,
            None => return &[],
        }
    }
    v.as_array().map_or(&[], Vec::as_slice)
}

fn or_none(s: &str) -> Value {
    if s.is_empty() { NONE.into() } else { s.into() }
}

fn condition_true(obj: &Value, ty: &str) -> bool {
    items(obj, &["status", "conditions"]).iter().any(|c| c["type"] == ty && c["status"] == "True")
}

/// Tracks the latest `lastState.terminated.finishedAt` among containers.
fn later_finish(latest: &mut Option<jiff::Timestamp>, status: &Value) {
    if let Some(t) = timestamp(status.pointer("/lastState/terminated/finishedAt"))
        && latest.is_none_or(|l| l < t)
    {
        *latest = Some(t);
    }
}

/// The pod's STATUS column, READY counts and RESTARTS, following kubectl's long-standing rules:
/// phase or reason, then the first init container not done, then the containers (last first),
/// then deletion.
fn pod_cells(pod: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let init_specs = items(pod, &["spec", "initContainers"]);
    // Sidecars: init containers that keep running beside the main ones.
    let is_sidecar = |name: &Value| init_specs.iter().any(|c| &c["name"] == name && c["restartPolicy"] == "Always");
    let mut total = items(pod, &["spec", "containers"]).len();
    total += init_specs.iter().filter(|c| c["restartPolicy"] == "Always").count();
    let mut ready = 0usize;
    let mut restarts: i64 = 0;
    let mut sidecar_restarts: i64 = 0;
    let mut last_restart: Option<jiff::Timestamp> = None;
    let mut last_sidecar_restart: Option<jiff::Timestamp> = None;

    let phase = str_at(pod, &["status", "phase"]);
    let mut reason = match str_at(pod, &["status", "reason"]) {
        "" => phase.to_string(),
        r => r.to_string(),
    };
    if items(pod, &["status", "conditions"])
        .iter()
        .any(|c| c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }

    let mut initializing = false;
    for (i, cs) in items(pod, &["status", "initContainerStatuses"]).iter().enumerate() {
        let count = cs["restartCount"].as_i64().unwrap_or(0);
        restarts += count;
        later_finish(&mut last_restart, cs);
        let sidecar = is_sidecar(&cs["name"]);
        if sidecar {
            sidecar_restarts += count;
            later_finish(&mut last_sidecar_restart, cs);
        }
        let terminated = cs.pointer("/state/terminated");
        let waiting_reason = cs.pointer("/state/waiting/reason").and_then(Value::as_str).unwrap_or("");
        if terminated.is_some_and(|t| t["exitCode"].as_i64().unwrap_or(0) == 0) {
            continue;
        }
        if sidecar && cs["started"] == true {
            if cs["ready"] == true {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = match t["reason"].as_str().unwrap_or("") {
                "" => match t["signal"].as_i64().unwrap_or(0) {
                    0 => format!("Init:ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
                    sig => format!("Init:Signal:{sig}"),
                },
                r => format!("Init:{r}"),
            };
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }

    if !initializing || condition_true(pod, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for cs in items(pod, &["status", "containerStatuses"]).iter().rev() {
            restarts += cs["restartCount"].as_i64().unwrap_or(0);
            later_finish(&mut last_restart, cs);
            let waiting_reason = cs.pointer("/state/waiting/reason").and_then(Value::as_str).unwrap_or("");
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if let Some(t) = cs.pointer("/state/terminated") {
                reason = match t["reason"].as_str().unwrap_or("") {
                    "" => match t["signal"].as_i64().unwrap_or(0) {
                        0 => format!("ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
                        sig => format!("Signal:{sig}"),
                    },
                    r => r.to_string(),
                };
            } else if cs["ready"] == true && cs.pointer("/state/running").is_some() {
                has_running = true;
                ready += 1;
            }
        }
        // A container that completed beside one still running: the pod is not done.
        if reason == "Completed" && has_running {
            reason = if condition_true(pod, "Ready") { "Running".into() } else { "NotReady".into() };
        }
    }

    if pod.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null()) {
        if str_at(pod, &["status", "reason"]) == "NodeLost" {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(t, now)),
        _ => restarts.to_string(),
    };

    let gates = items(pod, &["spec", "readinessGates"]);
    let gates_cell = if gates.is_empty() {
        NONE.to_string()
    } else {
        let conditions = items(pod, &["status", "conditions"]);
        let met = gates
            .iter()
            .filter(|g| {
                conditions.iter().find(|c| c["type"] == g["conditionType"]).is_some_and(|c| c["status"] == "True")
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    let ip = items(pod, &["status", "podIPs"]).first().map_or("", |p| p["ip"].as_str().unwrap_or(""));

    vec![
        str_at(pod, &["metadata", "name"]).into(),
        format!("{ready}/{total}").into(),
        reason.into(),
        restarts_cell.into(),
        age(pod.pointer("/metadata/creationTimestamp"), now).into(),
        or_none(ip),
        or_none(str_at(pod, &["spec", "nodeName"])),
        or_none(str_at(pod, &["status", "nominatedNodeName"])),
        gates_cell.into(),
    ]
}

fn node_cells(node: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let mut status: Vec<&str> = Vec::new();
    if let Some(c) = items(node, &["status", "conditions"]).iter().rev().find(|c| c["type"] == "Ready") {
        status.push(if c["status"] == "True" { "Ready" } else { "NotReady" });
    } else {
        status.push("Unknown");
    }
    if node.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push("SchedulingDisabled");
    }

    let mut roles: Vec<&str> = Vec::new();
    if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let role = match k.strip_prefix("node-role.kubernetes.io/") {
                Some(r) => r,
                None if k == "kubernetes.io/role" => v.as_str().unwrap_or(""),
                None => "",
            };
            if !role.is_empty() && !roles.contains(&role) {
                roles.push(role);
            }
        }
    }
    roles.sort_unstable();
    let roles = if roles.is_empty() { NONE.to_string() } else { roles.join(",") };

    let address = |ty: &str| {
        items(node, &["status", "addresses"])
            .iter()
            .find(|a| a["type"] == ty)
            .map_or("", |a| a["address"].as_str().unwrap_or(""))
    };
    let info = |field: &str| match str_at(node, &["status", "nodeInfo", field]) {
        "" => Value::from(UNKNOWN),
        s => Value::from(s),
    };
    vec![
        str_at(node, &["metadata", "name"]).into(),
        status.join(",").into(),
        roles.into(),
        age(node.pointer("/metadata/creationTimestamp"), now).into(),
        str_at(node, &["status", "nodeInfo", "kubeletVersion"]).into(),
        or_none(address("InternalIP")),
        or_none(address("ExternalIP")),
        info("osImage"),
        info("kernelVersion"),
        info("containerRuntimeVersion"),
    ]
}

fn event_cells(ev: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let first_seen = match timestamp(ev.get("firstTimestamp")) {
        Some(t) => since(t, now),
        None => age(ev.get("eventTime"), now),
    };
    let mut last_seen = match timestamp(ev.get("lastTimestamp")) {
        Some(t) => since(t, now),
        None => first_seen.clone(),
    };
    let mut count = ev["count"].as_i64().unwrap_or(0);
    if let Some(series) = ev.get("series").filter(|s| s.is_object()) {
        last_seen = age(series.get("lastObservedTime"), now);
        count = series["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        // Events written through events.k8s.io without a series happened once.
        count = 1;
    }

    let kind = str_at(ev, &["involvedObject", "kind"]).to_lowercase();
    let target = match str_at(ev, &["involvedObject", "name"]) {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let component = first_non_empty(str_at(ev, &["source", "component"]), str_at(ev, &["reportingComponent"]));
    let instance = first_non_empty(str_at(ev, &["source", "host"]), str_at(ev, &["reportingInstance"]));
    let source = if instance.is_empty() { component.to_string() } else { format!("{component}, {instance}") };

    vec![
        last_seen.into(),
        str_at(ev, &["type"]).into(),
        str_at(ev, &["reason"]).into(),
        target.into(),
        str_at(ev, &["involvedObject", "fieldPath"]).into(),
        source.into(),
        str_at(ev, &["message"]).trim().into(),
        first_seen.into(),
        count.into(),
        str_at(ev, &["metadata", "name"]).into(),
    ]
}

fn first_non_empty<'a>(a: &'a str, b: &'a str) -> &'a str {
    if a.is_empty() { b } else { a }
}

/// The wide cells shared by workload controllers: container names, images, selector.
fn service_cells(obj: &Value, name: &str, age: String) -> Vec<Value> {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(obj.clone()).unwrap_or_default();
    let cluster_ip = match str_at(obj, &["spec", "clusterIP"]) {
        "" => NONE,
        ip => ip,
    };
    let selector = label_set_string(obj.pointer("/spec/selector"));
    vec![
        name.into(),
        crate::service::type_of(&svc).into(),
        cluster_ip.into(),
        crate::service::external_ip_cell(&svc).into(),
        crate::service::ports_cell(&svc).into(),
        age.into(),
        selector.into(),
    ]
}

/// At most three entries, then ` + N more...`, as kubectl's list printers.
fn first_three(entries: Vec<String>, empty: &str) -> String {
    if entries.is_empty() {
        return empty.into();
    }
    let more = entries.len().saturating_sub(3);
    let shown = entries.into_iter().take(3).collect::<Vec<_>>().join(",");
    if more > 0 { format!("{shown} + {more} more...") } else { shown }
}

/// `ip:port` for every ready address and port of every subset.
fn endpoints_cell(obj: &Value) -> String {
    let mut out = Vec::new();
    for subset in items(obj, &["subsets"]) {
        let ports = items(subset, &["ports"]);
        for addr in items(subset, &["addresses"]) {
            let ip = addr["ip"].as_str().unwrap_or("");
            if ports.is_empty() {
                out.push(ip.to_string());
            }
            for p in ports {
                out.push(format!("{ip}:{}", p["port"].as_i64().unwrap_or(0)));
            }
        }
    }
    first_three(out, NONE)
}

fn endpoint_slice_cells(obj: &Value, name: &str, age: String) -> Vec<Value> {
    let ports: Vec<String> = items(obj, &["ports"])
        .iter()
        .map(|p| p.get("port").and_then(Value::as_i64).map_or("<unset>".to_string(), |n| n.to_string()))
        .collect();
    let ports = if ports.is_empty() { "<unset>".to_string() } else { ports.join(",") };
    let addrs: Vec<String> = items(obj, &["endpoints"])
        .iter()
        .flat_map(|e| items(e, &["addresses"]).iter().filter_map(Value::as_str).map(str::to_string))
        .collect();
    vec![
        name.into(),
        str_at(obj, &["addressType"]).into(),
        ports.into(),
        first_three(addrs, "<unset>").into(),
        age.into(),
    ]
}

fn template_cells(obj: &Value) -> Vec<Value> {
    let selector = selector_string(obj.pointer("/spec/selector")).unwrap_or_else(|| "<invalid>".into());
    let mut row = container_cells(obj, &["spec", "template", "spec", "containers"]).to_vec();
    row.push(selector.into());
    row
}

/// A `metav1.LabelSelector` in label-query syntax, requirements sorted by key as Kubernetes
/// prints them; `None` when an operator is unknown.
pub fn selector_string(sel: Option<&Value>) -> Option<String> {
    let Some(sel) = sel.filter(|s| s.is_object()) else { return Some(String::new()) };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for expr in items(sel, &["matchExpressions"]) {
        let key = expr["key"].as_str().unwrap_or("");
        let mut values: Vec<&str> = items(expr, &["values"]).iter().filter_map(Value::as_str).collect();
        values.sort_unstable();
        let values = values.join(",");
        let req = match expr["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        };
        reqs.push((key.to_string(), req));
    }
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    Some(reqs.into_iter().map(|(_, r)| r).collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::{
        ALL, CONFIGMAPS, DEPLOYMENTS, EVENTS, EVENTS_V1, LEASES, NAMESPACES, NODES, PODS, PODTEMPLATES, REPLICASETS,
        REPLICATIONCONTROLLERS, RUNTIMECLASSES, SECRETS, SERVICEACCOUNTS,
    };

    fn now() -> jiff::Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn names(rt: &ResourceType) -> Vec<String> {
        columns(rt).iter().map(|c| c["name"].as_str().unwrap().to_string()).collect()
    }

    fn pod(status: Value) -> Value {
        json!({
            "metadata": {"name": "nginx", "creationTimestamp": "2025-01-01T11:57:40Z"},
            "spec": {"containers": [{"name": "app", "image": "nginx"}], "nodeName": "n1"},
            "status": status
        })
    }

    fn status_of(p: &Value) -> String {
        cells(&PODS, p, now())[2].as_str().unwrap().to_string()
    }

    #[test]
    fn human_duration_follows_kubernetes_boundaries() {
        let s = |n: u64| human_duration(Duration::from_secs(n));
        assert_eq!(s(0), "0s");
        assert_eq!(s(5), "5s");
        assert_eq!(s(119), "119s");
        assert_eq!(s(120), "2m");
        assert_eq!(s(200), "3m20s");
        assert_eq!(s(599), "9m59s");
        assert_eq!(s(600), "10m");
        assert_eq!(s(179 * 60 + 59), "179m");
        assert_eq!(s(3 * 3600), "3h");
        assert_eq!(s(2 * 3600 + 5 * 60 + 60 * 60), "3h5m");
        assert_eq!(s(8 * 3600), "8h");
        assert_eq!(s(47 * 3600 + 3599), "47h");
        assert_eq!(s(48 * 3600), "2d");
        assert_eq!(s(3 * 86400 + 4 * 3600), "3d4h");
        assert_eq!(s(8 * 86400), "8d");
        assert_eq!(s(729 * 86400), "729d");
        assert_eq!(s(730 * 86400), "2y");
        assert_eq!(s(731 * 86400), "2y1d");
        assert_eq!(s(8 * 365 * 86400 + 5 * 86400), "8y");
        assert_eq!(human_seconds(-1), "0s");
        assert_eq!(human_seconds(-2), "<invalid>");
    }

    #[test]
    fn every_resource_has_cells_aligned_with_its_columns() {
        for rt in ALL {
            let cols = columns(rt);
            let row = cells(rt, &json!({"metadata": {"name": "x"}}), now());
            assert_eq!(cols.len(), row.len(), "{}", rt.qualified_plural());
            for c in &cols {
                for field in ["name", "type", "format", "description", "priority"] {
                    assert!(c.get(field).is_some(), "{} lacks {field}", rt.plural);
                }
            }
            if rt.kind != "Event" {
                assert_eq!(cols[0]["name"], "Name");
                assert_eq!(cols[0]["format"], "name");
                assert_eq!(row[0], "x");
            }
        }
    }

    #[test]
    fn a_running_pod_prints_ready_counts_restarts_and_wide_cells() {
        let p = json!({
            "metadata": {"name": "web", "creationTimestamp": "2025-01-01T10:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1", "readinessGates": [{"conditionType": "x/ok"}]},
            "status": {
                "phase": "Running",
                "podIPs": [{"ip": "10.0.0.5"}],
                "conditions": [{"type": "Ready", "status": "False"}, {"type": "x/ok", "status": "True"}],
                "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 5, "state": {"running": {}},
                     "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2025-01-01T11:57:00Z"}}},
                    {"name": "b", "ready": false, "restartCount": 0, "state": {"running": {}}}
                ]
            }
        });
        let row = cells(&PODS, &p, now());
        assert_eq!(
            row,
            vec![
                json!("web"),
                json!("1/2"),
                json!("Running"),
                json!("5 (3m ago)"),
                json!("120m"),
                json!("10.0.0.5"),
                json!("n1"),
                json!("<none>"),
                json!("1/1")
            ]
        );
        assert_eq!(
            names(&PODS),
            ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node", "Nominated Node", "Readiness Gates"]
        );
        assert_eq!(columns(&PODS)[5]["priority"], 1);
    }

    #[test]
    fn a_pending_pod_shows_pending_and_none_for_missing_wide_cells() {
        let p =
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Pending"}});
        let row = cells(&PODS, &p, now());
        assert_eq!(row[1], "0/1");
        assert_eq!(row[2], "Pending");
        assert_eq!(row[3], "0");
        assert_eq!(row[4], "<unknown>");
        assert_eq!(row[5], "<none>");
        assert_eq!(row[6], "<none>");
    }

    #[test]
    fn pod_status_reasons_follow_the_container_states() {
        let waiting = |r: &str| {
            pod(
                json!({"phase": "Pending", "containerStatuses": [{"name": "app", "state": {"waiting": {"reason": r}}}]}),
            )
        };
        assert_eq!(status_of(&waiting("ContainerCreating")), "ContainerCreating");
        assert_eq!(status_of(&waiting("ImagePullBackOff")), "ImagePullBackOff");
        let crash = pod(json!({"phase": "Running", "containerStatuses": [
            {"name": "app", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        ]}));
        assert_eq!(status_of(&crash), "CrashLoopBackOff");
        assert_eq!(cells(&PODS, &crash, now())[3], "4", "no last termination time, so no '(ago)'");
        let done = pod(json!({"phase": "Succeeded", "containerStatuses": [
            {"name": "app", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ]}));
        assert_eq!(status_of(&done), "Completed");
        let failed = pod(json!({"phase": "Failed", "containerStatuses": [
            {"name": "app", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
        ]}));
        assert_eq!(status_of(&failed), "Error");
        let no_reason = pod(json!({"phase": "Failed", "containerStatuses": [
            {"name": "app", "state": {"terminated": {"exitCode": 137}}}
        ]}));
        assert_eq!(status_of(&no_reason), "ExitCode:137");
        let evicted = pod(json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(status_of(&evicted), "Evicted");
    }

    #[test]
    fn a_completed_container_beside_a_running_one_is_running_or_not_ready() {
        let status = |ready: &str| {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": ready}], "containerStatuses": [
                {"name": "a", "ready": true, "state": {"running": {}}},
                {"name": "b", "ready": false, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            ]})
        };
        assert_eq!(status_of(&pod(status("True"))), "Running");
        assert_eq!(status_of(&pod(status("False"))), "NotReady");
    }

    #[test]
    fn init_containers_report_progress_and_failures() {
        let mut p = pod(json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "init", "state": {"running": {}}}
        ]}));
        p["spec"]["initContainers"] = json!([{"name": "init"}]);
        assert_eq!(status_of(&p), "Init:0/1");
        p["status"]["initContainerStatuses"][0]["state"] = json!({"terminated": {"exitCode": 1, "reason": "Error"}});
        assert_eq!(status_of(&p), "Init:Error");
        p["status"]["initContainerStatuses"][0]["state"] = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        assert_eq!(status_of(&p), "Init:CrashLoopBackOff");
        p["status"]["initContainerStatuses"][0]["state"] = json!({"waiting": {"reason": "PodInitializing"}});
        assert_eq!(status_of(&p), "Init:0/1");
    }

    #[test]
    fn a_started_sidecar_counts_as_a_ready_container() {
        let mut p = pod(json!({"phase": "Running", "initContainerStatuses": [
            {"name": "proxy", "started": true, "ready": true, "state": {"running": {}}}
        ], "containerStatuses": [{"name": "app", "ready": true, "state": {"running": {}}}]}));
        p["spec"]["initContainers"] = json!([{"name": "proxy", "restartPolicy": "Always"}]);
        let row = cells(&PODS, &p, now());
        assert_eq!(row[1], "2/2");
        assert_eq!(row[2], "Running");
    }

    #[test]
    fn a_deleted_pod_is_terminating_unless_it_finished() {
        let mut p = pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "app", "ready": true, "state": {"running": {}}}]}),
        );
        p["metadata"]["deletionTimestamp"] = json!("2025-01-01T11:59:00Z");
        assert_eq!(status_of(&p), "Terminating");
        p["status"]["phase"] = json!("Succeeded");
        assert_ne!(status_of(&p), "Terminating");
        p["status"]["reason"] = json!("NodeLost");
        assert_eq!(status_of(&p), "Unknown");
    }

    #[test]
    fn a_scheduling_gated_pod_says_so() {
        let p = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
        );
        assert_eq!(status_of(&p), "SchedulingGated");
    }

    #[test]
    fn nodes_print_status_roles_and_system_info() {
        let node = json!({
            "metadata": {"name": "n1", "creationTimestamp": "2024-12-29T08:00:00Z",
                "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/worker": "", "kubernetes.io/hostname": "n1"}},
            "spec": {"unschedulable": true},
            "status": {
                "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "192.168.1.10"}],
                "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian GNU/Linux 12", "kernelVersion": "6.1.0", "containerRuntimeVersion": "berth://0.1.0"}
            }
        });
        let row = cells(&NODES, &node, now());
        assert_eq!(
            row,
            vec![
                json!("n1"),
                json!("Ready,SchedulingDisabled"),
                json!("control-plane,worker"),
                json!("3d4h"),
                json!("v1.33.0"),
                json!("192.168.1.10"),
                json!("<none>"),
                json!("Debian GNU/Linux 12"),
                json!("6.1.0"),
                json!("berth://0.1.0")
            ]
        );
        let bare = cells(
            &NODES,
            &json!({"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
            now(),
        );
        assert_eq!(bare[1], "NotReady");
        assert_eq!(bare[2], "<none>");
        assert_eq!(bare[7], "<unknown>");
        assert_eq!(cells(&NODES, &json!({"metadata": {"name": "n3"}}), now())[1], "Unknown");
    }

    #[test]
    fn namespaces_configmaps_secrets_and_serviceaccounts_print_counts() {
        let created = json!({"name": "x", "creationTimestamp": "2025-01-01T11:59:55Z"});
        let ns = json!({"metadata": created, "status": {"phase": "Active"}});
        assert_eq!(cells(&NAMESPACES, &ns, now()), vec![json!("x"), json!("Active"), json!("5s")]);
        let cm = json!({"metadata": created, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
        assert_eq!(cells(&CONFIGMAPS, &cm, now()), vec![json!("x"), json!(3), json!("5s")]);
        let secret = json!({"metadata": created, "type": "Opaque", "data": {"k": "dg=="}});
        assert_eq!(cells(&SECRETS, &secret, now()), vec![json!("x"), json!("Opaque"), json!(1), json!("5s")]);
        let sa = json!({"metadata": created});
        assert_eq!(cells(&SERVICEACCOUNTS, &sa, now()), vec![json!("x"), json!(0), json!("5s")]);
        assert_eq!(names(&SECRETS), ["Name", "Type", "Data", "Age"]);
    }

    #[test]
    fn leases_and_runtimeclasses_print_holder_and_handler() {
        let lease = json!({"metadata": {"name": "n1", "creationTimestamp": "2025-01-01T11:00:00Z"}, "spec": {"holderIdentity": "n1"}});
        assert_eq!(cells(&LEASES, &lease, now()), vec![json!("n1"), json!("n1"), json!("60m")]);
        let rc = json!({"metadata": {"name": "gvisor"}, "handler": "runsc"});
        assert_eq!(cells(&RUNTIMECLASSES, &rc, now()), vec![json!("gvisor"), json!("runsc"), json!("<unknown>")]);
    }

    #[test]
    fn events_print_the_object_and_counts_in_the_core_view() {
        let ev = json!({
            "metadata": {"name": "nginx.17a", "creationTimestamp": "2025-01-01T11:50:00Z"},
            "involvedObject": {"kind": "Pod", "name": "nginx", "fieldPath": "spec.containers{app}"},
            "reason": "Pulled", "type": "Normal", "message": "Successfully pulled image \"nginx\"\n",
            "source": {"component": "kubelet", "host": "n1"},
            "firstTimestamp": "2025-01-01T11:50:00Z", "lastTimestamp": "2025-01-01T11:58:00Z", "count": 3
        });
        assert_eq!(
            cells(&EVENTS, &ev, now()),
            vec![
                json!("2m"),
                json!("Normal"),
                json!("Pulled"),
                json!("pod/nginx"),
                json!("spec.containers{app}"),
                json!("kubelet, n1"),
                json!("Successfully pulled image \"nginx\""),
                json!("10m"),
                json!(3),
                json!("nginx.17a")
            ]
        );
        assert_eq!(names(&EVENTS)[..4], ["Last Seen", "Type", "Reason", "Object"]);
        assert_eq!(columns(&EVENTS_V1), columns(&EVENTS));

        // A new-style event: only eventTime, reporting controller, a series.
        let ev = json!({
            "metadata": {"name": "e"}, "involvedObject": {"kind": "Node"}, "eventTime": "2025-01-01T11:00:00.123456Z",
            "reportingComponent": "berth-scheduler", "series": {"count": 7, "lastObservedTime": "2025-01-01T11:59:30.000000Z"}
        });
        let row = cells(&EVENTS, &ev, now());
        assert_eq!(row[0], "30s");
        assert_eq!(row[3], "node");
        assert_eq!(row[5], "berth-scheduler");
        assert_eq!(row[7], "59m", "59m59.9s is truncated");
        assert_eq!(row[8], 7);
    }

    #[test]
    fn deployments_and_replicasets_print_replicas_containers_and_selector() {
        let spec = json!({
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "dev"]}]},
            "template": {"spec": {"containers": [{"name": "app", "image": "nginx:1.27"}, {"name": "log", "image": "busybox"}]}}
        });
        let d = json!({
            "metadata": {"name": "web", "creationTimestamp": "2025-01-01T11:50:00Z"},
            "spec": spec,
            "status": {"readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1}
        });
        assert_eq!(
            cells(&DEPLOYMENTS, &d, now()),
            vec![
                json!("web"),
                json!("1/3"),
                json!(2),
                json!(1),
                json!("10m"),
                json!("app,log"),
                json!("nginx:1.27,busybox"),
                json!("app=web,env in (dev,prod)")
            ]
        );
        assert_eq!(
            names(&DEPLOYMENTS),
            ["Name", "Ready", "Up-to-date", "Available", "Age", "Containers", "Images", "Selector"]
        );
        let rs = json!({"metadata": {"name": "web-abc"}, "spec": spec, "status": {"replicas": 3, "readyReplicas": 2}});
        let row = cells(&REPLICASETS, &rs, now());
        assert_eq!(row[..4], [json!("web-abc"), json!(3), json!(3), json!(2)]);
        assert_eq!(columns(&REPLICASETS)[1]["type"], "integer");
    }

    #[test]
    fn replication_controllers_print_replicas_containers_and_their_label_selector() {
        let rc = json!({
            "metadata": {"name": "web", "creationTimestamp": "2025-01-01T11:50:00Z"},
            "spec": {"replicas": 3, "selector": {"tier": "front", "app": "web"},
                     "template": {"spec": {"containers": [{"name": "app", "image": "nginx:1.27"}, {"name": "log", "image": "busybox"}]}}},
            "status": {"replicas": 2, "readyReplicas": 1}
        });
        assert_eq!(
            cells(&REPLICATIONCONTROLLERS, &rc, now()),
            vec![
                json!("web"),
                json!(3),
                json!(2),
                json!(1),
                json!("10m"),
                json!("app,log"),
                json!("nginx:1.27,busybox"),
                json!("app=web,tier=front")
            ]
        );
        assert_eq!(
            names(&REPLICATIONCONTROLLERS),
            ["Name", "Desired", "Current", "Ready", "Age", "Containers", "Images", "Selector"]
        );
        let wide: Vec<_> = columns(&REPLICATIONCONTROLLERS).iter().map(|c| c["priority"].as_i64().unwrap()).collect();
        assert_eq!(wide, [0, 0, 0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn pod_templates_print_containers_images_and_pod_labels() {
        let pt = json!({
            "metadata": {"name": "t"},
            "template": {"metadata": {"labels": {"b": "2", "a": "1"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
        });
        assert_eq!(cells(&PODTEMPLATES, &pt, now()), vec![json!("t"), json!("c"), json!("nginx"), json!("a=1,b=2")]);
        assert_eq!(names(&PODTEMPLATES), ["Name", "Containers", "Images", "Pod Labels"]);
        let bare = json!({"metadata": {"name": "t"}, "template": {}});
        assert_eq!(cells(&PODTEMPLATES, &bare, now())[3], "<none>");
    }

    #[test]
    fn selectors_print_every_operator() {
        let sel = json!({"matchExpressions": [
            {"key": "b", "operator": "NotIn", "values": ["x"]},
            {"key": "a", "operator": "Exists"},
            {"key": "c", "operator": "DoesNotExist"}
        ]});
        assert_eq!(selector_string(Some(&sel)).unwrap(), "a,b notin (x),!c");
        assert_eq!(selector_string(None).unwrap(), "");
        assert!(selector_string(Some(&json!({"matchExpressions": [{"key": "a", "operator": "Near"}]}))).is_none());
    }
}
