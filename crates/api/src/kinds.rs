//! Per-kind defaulting, validation and selectable fields for every served resource, plus the
//! conversion between the two views of events.
//!
//! The server calls `prepare_for_create`/`prepare_for_update` before `validate_create`/
//! `validate_update`, as Kubernetes defaults on decode before validating; fields the defaults
//! always fill are therefore not reported as missing.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::node::v1 as nodev1;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as K8sLabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::deletion::GarbageCollectionPolicy;
use crate::field_error::ErrorType;
use crate::selector::LabelSelector;
use crate::validation::{
    FIELD_IMMUTABLE, IS_NEGATIVE, Quantity, inclusive_range_error, invalid_each, is_config_map_key, is_dns1123_label,
    is_dns1123_subdomain, is_qualified_name, is_valid_label_value, is_valid_port_name, regex_error,
    validate_annotations, validate_label_selector, validate_labels, validate_nonnegative, validate_object_meta,
    validate_object_meta_update, validate_taint_effect, validate_tolerations,
};
use crate::{FieldError, ResourceType};

/// The text of Kubernetes' pod spec update error (it appends a diff, which berth omits).
pub const POD_UPDATE_FORBIDDEN: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Largest total size of a Secret's or ConfigMap's data.
pub const MAX_SECRET_SIZE: usize = 1024 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Namespace,
    Pod,
    Node,
    ConfigMap,
    Secret,
    ServiceAccount,
    Event,
    EventV1,
    Lease,
    RuntimeClass,
    Deployment,
    ReplicaSet,
    ReplicationController,
    PodTemplate,
    Service,
    Endpoints,
    EndpointSlice,
    Ingress,
    Other,
}

fn kind_of(rt: &ResourceType) -> Kind {
    match (rt.group, rt.kind) {
        ("", "Namespace") => Kind::Namespace,
        ("", "Pod") => Kind::Pod,
        ("", "Node") => Kind::Node,
        ("", "ConfigMap") => Kind::ConfigMap,
        ("", "Secret") => Kind::Secret,
        ("", "ServiceAccount") => Kind::ServiceAccount,
        ("", "Event") => Kind::Event,
        ("events.k8s.io", "Event") => Kind::EventV1,
        ("coordination.k8s.io", "Lease") => Kind::Lease,
        ("node.k8s.io", "RuntimeClass") => Kind::RuntimeClass,
        ("apps", "Deployment") => Kind::Deployment,
        ("apps", "ReplicaSet") => Kind::ReplicaSet,
        ("", "ReplicationController") => Kind::ReplicationController,
        ("", "PodTemplate") => Kind::PodTemplate,
        ("", "Service") => Kind::Service,
        ("", "Endpoints") => Kind::Endpoints,
        ("discovery.k8s.io", "EndpointSlice") => Kind::EndpointSlice,
        ("networking.k8s.io", "Ingress") => Kind::Ingress,
        _ => Kind::Other,
    }
}

/// Whether a delete that removes the object at once answers with the object as it was, as the
/// kind's registry says (`ReturnDeletedObject`: pods, services, service accounts, namespaces);
/// other kinds answer with a success Status naming what went.
pub fn returns_deleted_object(rt: &ResourceType) -> bool {
    matches!(kind_of(rt), Kind::Pod | Kind::Service | Kind::ServiceAccount | Kind::Namespace)
}

/// Whether an update through `/status` also takes the client's metadata changes (labels,
/// annotations, ...), as the kind's status strategy says: a namespace's, a Service's and an
/// Ingress's reset only their spec; for the other kinds here only the status goes through.
pub fn status_update_takes_metadata(rt: &ResourceType) -> bool {
    matches!(kind_of(rt), Kind::Namespace | Kind::Service | Kind::Ingress)
}

/// The status strategy's preparation of an update through `/status` of a kind that takes
/// metadata changes there: the spec stays as stored; a namespace keeps its name label.
pub fn prepare_for_status_update(rt: &ResourceType, new: &mut Value, old: &Value) {
    match kind_of(rt) {
        Kind::Namespace => {
            let old_ns: Option<core::Namespace> = decode(old);
            edit::<core::Namespace>(new, |ns| {
                label_namespace(ns);
                ns.spec = old_ns.and_then(|o| o.spec);
            })
        }
        Kind::Service | Kind::Ingress => match (new.as_object_mut(), old.get("spec")) {
            (Some(obj), Some(spec)) => {
                obj.insert("spec".into(), spec.clone());
            }
            (Some(obj), None) => {
                obj.remove("spec");
            }
            _ => {}
        },
        _ => {}
    }
}

/// What a delete that chooses no propagation does to the kind's dependents, as the kind's
/// registry strategy says (`DefaultGarbageCollectionPolicy`): events take no garbage-collection
/// finalizers; every other kind served here (apps/v1 workloads included) defaults to background.
pub fn garbage_collection_policy(rt: &ResourceType) -> GarbageCollectionPolicy {
    match kind_of(rt) {
        Kind::Event | Kind::EventV1 => GarbageCollectionPolicy::Unsupported,
        Kind::Namespace
        | Kind::Pod
        | Kind::Node
        | Kind::ConfigMap
        | Kind::Secret
        | Kind::ServiceAccount
        | Kind::Lease
        | Kind::RuntimeClass
        | Kind::Deployment
        | Kind::ReplicaSet
        | Kind::ReplicationController
        | Kind::PodTemplate
        | Kind::Service
        | Kind::Endpoints
        | Kind::EndpointSlice
        | Kind::Ingress
        | Kind::Other => GarbageCollectionPolicy::DeleteDependents,
    }
}

fn decode<T: DeserializeOwned>(v: &Value) -> Option<T> {
    serde_json::from_value(v.clone()).ok()
}

/// Decodes `obj` as `T`, lets `f` change it and writes it back; undecodable input is left alone
/// (the server has already rejected it).
fn edit<T: DeserializeOwned + Serialize>(obj: &mut Value, f: impl FnOnce(&mut T)) {
    if let Some(mut typed) = decode::<T>(obj) {
        f(&mut typed);
        if let Ok(v) = serde_json::to_value(typed) {
            *obj = v;
        }
    }
}

/// Drops what Go's zero values would make equal to absence (null, "", false, empty lists and
/// maps), so two objects compare as `apiequality.Semantic` would see them.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let n = normalize(v);
                if !is_zero(&n) {
                    out.insert(k.clone(), n);
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Number(_) => false,
    }
}

fn semantically_equal<T: Serialize>(a: &T, b: &T) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(x), Ok(y)) => normalize(&x) == normalize(&y),
        _ => false,
    }
}

fn json_of<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn s(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

// ---------------------------------------------------------------------------------------------
// Defaulting

const METADATA_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `SetDefaults_PodSpec` and the container defaults, shared by pods and pod templates.
fn default_pod_spec(spec: &mut core::PodSpec) {
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.security_context.get_or_insert_with(Default::default);
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.scheduler_name.get_or_insert_with(|| "default-scheduler".into());
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        default_container(c);
    }
}

fn default_container(c: &mut core::Container) {
    if c.image_pull_policy.as_deref().unwrap_or("").is_empty() {
        let policy =
            if image_tag(c.image.as_deref().unwrap_or("")) == Some("latest") { "Always" } else { "IfNotPresent" };
        c.image_pull_policy = Some(policy.into());
    }
    if s(&c.termination_message_path).is_empty() {
        c.termination_message_path = Some("/dev/termination-log".into());
    }
    if s(&c.termination_message_policy).is_empty() {
        c.termination_message_policy = Some("File".into());
    }
    for p in c.ports.iter_mut().flatten() {
        if s(&p.protocol).is_empty() {
            p.protocol = Some("TCP".into());
        }
    }
}

/// The tag of an image reference as Kubernetes' parser sees it: `latest` when neither tag nor
/// digest is given, `None` for a digest-only reference.
fn image_tag(image: &str) -> Option<&str> {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, tag)) => Some(tag),
        None if digest.is_some() => None,
        None => Some("latest"),
    }
}

/// `SetDefaults_Pod`: requests default to limits where only limits are given; service links on.
fn default_pod(pod: &mut core::Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    default_pod_spec(spec);
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        if let Some(res) = c.resources.as_mut()
            && let Some(limits) = res.limits.clone()
        {
            let requests = res.requests.get_or_insert_with(Default::default);
            for (k, v) in limits {
                requests.entry(k).or_insert(v);
            }
        }
    }
    spec.enable_service_links.get_or_insert(true);
    if spec.host_network == Some(true) {
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            for p in c.ports.iter_mut().flatten() {
                if p.host_port.unwrap_or(0) == 0 {
                    p.host_port = Some(p.container_port);
                }
            }
        }
    }
}

/// The pod's QoS class from its containers' cpu and memory requests and limits.
pub fn pod_qos_class(spec: &core::PodSpec) -> &'static str {
    let mut requests: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut guaranteed = true;
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        let res = c.resources.clone().unwrap_or_default();
        for (k, v) in res.requests.iter().flatten() {
            let Some(name) = compute_name(k) else { continue };
            if let Some(q) = nonzero(v) {
                let e = requests.entry(name).or_insert(Quantity(0));
                e.0 = e.0.saturating_add(q.0);
            }
        }
        let mut found = BTreeSet::new();
        for (k, v) in res.limits.iter().flatten() {
            let Some(name) = compute_name(k) else { continue };
            if let Some(q) = nonzero(v) {
                found.insert(name);
                let e = limits.entry(name).or_insert(Quantity(0));
                e.0 = e.0.saturating_add(q.0);
            }
        }
        if !(found.contains("cpu") && found.contains("memory")) {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed && requests.iter().all(|(k, v)| limits.get(k) == Some(v)) && requests.len() == limits.len() {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn compute_name(k: &str) -> Option<&'static str> {
    match k {
        "cpu" => Some("cpu"),
        "memory" => Some("memory"),
        _ => None,
    }
}

/// A set, parseable, non-zero quantity; zero counts as unset for QoS.
fn nonzero(q: &K8sQuantity) -> Option<Quantity> {
    Quantity::parse(&q.0).ok().filter(|q| !q.is_zero())
}

fn default_deployment(d: &mut apps::Deployment) {
    let spec = d.spec.get_or_insert_with(Default::default);
    spec.replicas.get_or_insert(1);
    let strategy = spec.strategy.get_or_insert_with(Default::default);
    if s(&strategy.type_).is_empty() {
        strategy.type_ = Some("RollingUpdate".into());
    }
    if strategy.type_.as_deref() == Some("RollingUpdate") {
        let ru = strategy.rolling_update.get_or_insert_with(Default::default);
        ru.max_unavailable.get_or_insert_with(|| IntOrString::String("25%".into()));
        ru.max_surge.get_or_insert_with(|| IntOrString::String("25%".into()));
    }
    spec.revision_history_limit.get_or_insert(10);
    spec.progress_deadline_seconds.get_or_insert(600);
    default_pod_spec(spec.template.spec.get_or_insert_with(Default::default));
}

fn default_replica_set(rs: &mut apps::ReplicaSet) {
    let spec = rs.spec.get_or_insert_with(Default::default);
    spec.replicas.get_or_insert(1);
    if let Some(t) = spec.template.as_mut() {
        default_pod_spec(t.spec.get_or_insert_with(Default::default));
    }
}

/// `SetDefaults_ReplicationController`: with template labels, an empty selector and empty object
/// labels both take them; replicas default to 1.
fn default_replication_controller(rc: &mut core::ReplicationController) {
    let spec = rc.spec.get_or_insert_with(Default::default);
    let template_labels = spec.template.as_ref().and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.clone());
    if let Some(labels) = template_labels {
        if spec.selector.as_ref().is_none_or(BTreeMap::is_empty) {
            spec.selector = Some(labels.clone());
        }
        if rc.metadata.labels.as_ref().is_none_or(BTreeMap::is_empty) {
            rc.metadata.labels = Some(labels);
        }
    }
    spec.replicas.get_or_insert(1);
    if let Some(t) = spec.template.as_mut() {
        default_pod_spec(t.spec.get_or_insert_with(Default::default));
    }
}

fn default_pod_template(pt: &mut core::PodTemplate) {
    if let Some(t) = pt.template.as_mut() {
        default_pod_spec(t.spec.get_or_insert_with(Default::default));
    }
}

/// Secret `stringData` is write-only: its entries replace `data` entries.
fn default_secret(secret: &mut core::Secret) {
    if s(&secret.type_).is_empty() {
        secret.type_ = Some("Opaque".into());
    }
    if let Some(sd) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(Default::default);
        for (k, v) in sd {
            data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
        }
    }
}

fn default_node(node: &mut core::Node) {
    if let Some(status) = node.status.as_mut()
        && status.allocatable.is_none()
    {
        status.allocatable = status.capacity.clone();
    }
}

fn label_namespace(ns: &mut core::Namespace) {
    if let Some(name) = ns.metadata.name.clone().filter(|n| !n.is_empty()) {
        ns.metadata.labels.get_or_insert_with(Default::default).insert(METADATA_NAME_LABEL.into(), name);
    }
}

/// Fills defaults and resets what a create may not set, as Kubernetes' strategy for the kind.
pub fn prepare_for_create(rt: &ResourceType, obj: &mut Value) {
    match kind_of(rt) {
        Kind::Namespace => edit::<core::Namespace>(obj, |ns| {
            label_namespace(ns);
            ns.spec = Some(core::NamespaceSpec { finalizers: Some(vec!["kubernetes".into()]) });
            ns.status = Some(core::NamespaceStatus { phase: Some("Active".into()), ..Default::default() });
        }),
        Kind::Pod => edit::<core::Pod>(obj, |pod| {
            default_pod(pod);
            let spec = pod.spec.get_or_insert_with(Default::default);
            // The Priority admission plugin gives pods without a class priority 0.
            spec.priority.get_or_insert(0);
            let mut status = core::PodStatus {
                phase: Some("Pending".into()),
                qos_class: Some(pod_qos_class(spec).into()),
                ..Default::default()
            };
            if spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()) {
                status.conditions = Some(vec![core::PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("SchedulingGated".into()),
                    message: Some("Scheduling is blocked due to non-empty scheduling gates".into()),
                    ..Default::default()
                }]);
            }
            pod.status = Some(status);
        }),
        Kind::Node => edit::<core::Node>(obj, default_node),
        Kind::Secret => edit::<core::Secret>(obj, default_secret),
        Kind::Deployment => edit::<apps::Deployment>(obj, |d| {
            default_deployment(d);
            d.status = Some(Default::default());
            d.metadata.generation = Some(1);
        }),
        Kind::ReplicaSet => edit::<apps::ReplicaSet>(obj, |rs| {
            default_replica_set(rs);
            rs.status = Some(Default::default());
            rs.metadata.generation = Some(1);
        }),
        Kind::ReplicationController => edit::<core::ReplicationController>(obj, |rc| {
            default_replication_controller(rc);
            rc.status = Some(Default::default());
            rc.metadata.generation = Some(1);
        }),
        Kind::PodTemplate => edit::<core::PodTemplate>(obj, |pt| {
            default_pod_template(pt);
            pt.metadata.generation = Some(1);
        }),
        Kind::Service => edit::<core::Service>(obj, |svc| {
            svc.status = None;
            crate::service::default_service(svc);
        }),
        Kind::ConfigMap
        | Kind::Endpoints
        | Kind::EndpointSlice
        | Kind::ServiceAccount
        | Kind::Event
        | Kind::EventV1
        | Kind::Lease
        | Kind::RuntimeClass
        | Kind::Ingress
        | Kind::Other => {}
    }
}

/// Fills defaults on an update of the main resource and keeps what it may not change.
pub fn prepare_for_update(rt: &ResourceType, new: &mut Value, old: &Value) {
    // Clients cannot set the generation; only spec changes move it.
    let old_generation = old.pointer("/metadata/generation").cloned();
    if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
        match &old_generation {
            Some(g) => meta.insert("generation".into(), g.clone()),
            None => meta.remove("generation"),
        };
    }
    match kind_of(rt) {
        Kind::Namespace => {
            let old_ns: Option<core::Namespace> = decode(old);
            edit::<core::Namespace>(new, |ns| {
                label_namespace(ns);
                // Finalizers change only through the finalize subresource.
                ns.spec = old_ns.and_then(|o| o.spec);
            })
        }
        Kind::Pod => {
            let old_priority = decode::<core::Pod>(old).and_then(|p| p.spec).and_then(|s| s.priority);
            edit::<core::Pod>(new, |pod| {
                default_pod(pod);
                let spec = pod.spec.get_or_insert_with(Default::default);
                if spec.priority.is_none() {
                    spec.priority = old_priority;
                }
            })
        }
        Kind::Node => edit::<core::Node>(new, default_node),
        Kind::Secret => edit::<core::Secret>(new, default_secret),
        Kind::Deployment => {
            let Some(old_d) = decode::<apps::Deployment>(old) else { return };
            edit::<apps::Deployment>(new, |d| {
                default_deployment(d);
                // Kubernetes also counts annotation changes (rollback requests) for deployments.
                if !semantically_equal(&d.spec, &old_d.spec)
                    || !semantically_equal(&d.metadata.annotations, &old_d.metadata.annotations)
                {
                    d.metadata.generation = Some(old_d.metadata.generation.unwrap_or(0) + 1);
                }
            })
        }
        Kind::ReplicaSet => {
            let Some(old_rs) = decode::<apps::ReplicaSet>(old) else { return };
            edit::<apps::ReplicaSet>(new, |rs| {
                default_replica_set(rs);
                if !semantically_equal(&rs.spec, &old_rs.spec) {
                    rs.metadata.generation = Some(old_rs.metadata.generation.unwrap_or(0) + 1);
                }
            })
        }
        Kind::ReplicationController => {
            let Some(old_rc) = decode::<core::ReplicationController>(old) else { return };
            edit::<core::ReplicationController>(new, |rc| {
                default_replication_controller(rc);
                if !semantically_equal(&rc.spec, &old_rc.spec) {
                    rc.metadata.generation = Some(old_rc.metadata.generation.unwrap_or(0) + 1);
                }
            })
        }
        Kind::PodTemplate => {
            let Some(old_pt) = decode::<core::PodTemplate>(old) else { return };
            edit::<core::PodTemplate>(new, |pt| {
                default_pod_template(pt);
                if !semantically_equal(&pt.template, &old_pt.template) {
                    pt.metadata.generation = Some(old_pt.metadata.generation.unwrap_or(0) + 1);
                }
            })
        }
        Kind::Service => {
            let Some(old_svc) = decode::<core::Service>(old) else { return };
            edit::<core::Service>(new, |svc| {
                crate::service::keep_allocated(svc, &old_svc);
                crate::service::default_service(svc);
            })
        }
        Kind::ConfigMap
        | Kind::Endpoints
        | Kind::EndpointSlice
        | Kind::ServiceAccount
        | Kind::Event
        | Kind::EventV1
        | Kind::Lease
        | Kind::RuntimeClass
        | Kind::Ingress
        | Kind::Other => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Validation

fn not_found(field: impl Into<String>, value: &str) -> FieldError {
    FieldError {
        error_type: ErrorType::NotFound,
        field: field.into(),
        bad_value: Some(format!("{value:?}")),
        detail: String::new(),
    }
}

fn validate_dns_subdomain_field(field: &str, value: &str) -> Vec<FieldError> {
    invalid_each(field, value, is_dns1123_subdomain(value))
}

/// One resource list entry: a known name and a well-formed, non-negative quantity.
fn validate_resource_quantity(field: &str, q: &K8sQuantity) -> (Vec<FieldError>, Option<Quantity>) {
    match Quantity::parse(&q.0) {
        Err(msg) => (vec![FieldError::invalid(field, &q.0, msg)], None),
        Ok(v) if v.0 < 0 => (vec![FieldError::invalid(field, &q.0, IS_NEGATIVE)], Some(v)),
        Ok(v) => (Vec::new(), Some(v)),
    }
}

fn validate_container_resource_name(field: &str, name: &str) -> Vec<FieldError> {
    let standard = matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
    if name.contains('/') {
        invalid_each(field, name, is_qualified_name(name))
    } else if !standard {
        vec![FieldError::invalid(field, name, "must be a standard resource for containers")]
    } else {
        Vec::new()
    }
}

/// `ValidateResourceRequirements`: valid quantities, and no request above its limit.
fn validate_resources(res: &core::ResourceRequirements, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut limits = BTreeMap::new();
    for (name, q) in res.limits.iter().flatten() {
        let p = format!("{path}.limits[{name}]");
        errs.extend(validate_container_resource_name(&p, name));
        let (e, v) = validate_resource_quantity(&p, q);
        errs.extend(e);
        if let Some(v) = v {
            limits.insert(name.clone(), (v, q.0.clone()));
        }
    }
    for (name, q) in res.requests.iter().flatten() {
        let p = format!("{path}.requests[{name}]");
        errs.extend(validate_container_resource_name(&p, name));
        let (e, v) = validate_resource_quantity(&p, q);
        errs.extend(e);
        if let (Some(v), Some((limit, shown))) = (v, limits.get(name))
            && v > *limit
        {
            errs.push(FieldError::invalid(&p, &q.0, format!("must be less than or equal to {name} limit of {shown}")));
        }
    }
    errs
}

fn validate_ports(ports: &[core::ContainerPort], path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            let msgs = is_valid_port_name(name);
            if !msgs.is_empty() {
                errs.extend(invalid_each(&format!("{p}.name"), name, msgs));
            } else if !names.insert(name) {
                errs.push(FieldError::duplicate(format!("{p}.name"), name));
            }
        }
        if port.container_port == 0 {
            errs.push(FieldError::required(format!("{p}.containerPort"), ""));
        } else if !(1..=65535).contains(&port.container_port) {
            errs.push(FieldError::invalid_raw(
                format!("{p}.containerPort"),
                port.container_port.to_string(),
                inclusive_range_error(1, 65535),
            ));
        }
        if let Some(hp) = port.host_port.filter(|hp| *hp != 0 && !(1..=65535).contains(hp)) {
            errs.push(FieldError::invalid_raw(
                format!("{p}.hostPort"),
                hp.to_string(),
                inclusive_range_error(1, 65535),
            ));
        }
        let proto = s(&port.protocol);
        if !proto.is_empty() && !["SCTP", "TCP", "UDP"].contains(&proto) {
            errs.push(FieldError::not_supported(format!("{p}.protocol"), proto, &["SCTP", "TCP", "UDP"]));
        }
    }
    errs
}

fn validate_containers(
    containers: &[core::Container],
    path: &str,
    names: &mut BTreeSet<String>,
    volumes: &BTreeSet<String>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, c) in containers.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if c.name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), ""));
        } else {
            errs.extend(invalid_each(&format!("{p}.name"), &c.name, is_dns1123_label(&c.name)));
            if !names.insert(c.name.clone()) {
                errs.push(FieldError::duplicate(format!("{p}.name"), &c.name));
            }
        }
        let image = s(&c.image);
        if image.is_empty() {
            errs.push(FieldError::required(format!("{p}.image"), ""));
        } else if image.trim() != image {
            errs.push(FieldError::invalid(format!("{p}.image"), image, "must not have leading or trailing whitespace"));
        }
        let pull = s(&c.image_pull_policy);
        if !pull.is_empty() && !["Always", "IfNotPresent", "Never"].contains(&pull) {
            errs.push(FieldError::not_supported(
                format!("{p}.imagePullPolicy"),
                pull,
                &["Always", "IfNotPresent", "Never"],
            ));
        }
        let tmp = s(&c.termination_message_policy);
        if !tmp.is_empty() && !["File", "FallbackToLogsOnError"].contains(&tmp) {
            errs.push(FieldError::not_supported(
                format!("{p}.terminationMessagePolicy"),
                tmp,
                &["File", "FallbackToLogsOnError"],
            ));
        }
        errs.extend(validate_ports(c.ports.as_deref().unwrap_or(&[]), &format!("{p}.ports")));
        if let Some(res) = &c.resources {
            errs.extend(validate_resources(res, &format!("{p}.resources")));
        }
        for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
            let mp = format!("{p}.volumeMounts[{j}]");
            if m.name.is_empty() {
                errs.push(FieldError::required(format!("{mp}.name"), ""));
            } else if !volumes.contains(&m.name) {
                errs.push(not_found(format!("{mp}.name"), &m.name));
            }
            if m.mount_path.is_empty() {
                errs.push(FieldError::required(format!("{mp}.mountPath"), ""));
            }
        }
    }
    errs
}

/// `ValidatePodSpec` for the fields berth uses.
fn validate_pod_spec(spec: &core::PodSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut volumes = BTreeSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let p = format!("{path}.volumes[{i}].name");
        if v.name.is_empty() {
            errs.push(FieldError::required(p, ""));
        } else {
            errs.extend(invalid_each(&p, &v.name, is_dns1123_label(&v.name)));
            if !volumes.insert(v.name.clone()) {
                errs.push(FieldError::duplicate(p, &v.name));
            }
        }
    }
    let mut names = BTreeSet::new();
    if spec.containers.is_empty() {
        errs.push(FieldError::required(format!("{path}.containers"), ""));
    }
    errs.extend(validate_containers(&spec.containers, &format!("{path}.containers"), &mut names, &volumes));
    if let Some(init) = &spec.init_containers {
        errs.extend(validate_containers(init, &format!("{path}.initContainers"), &mut names, &volumes));
    }
    let restart = s(&spec.restart_policy);
    if !restart.is_empty() && !["Always", "OnFailure", "Never"].contains(&restart) {
        errs.push(FieldError::not_supported(
            format!("{path}.restartPolicy"),
            restart,
            &["Always", "OnFailure", "Never"],
        ));
    }
    let dns = s(&spec.dns_policy);
    const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
    if !dns.is_empty() && !DNS_POLICIES.contains(&dns) {
        errs.push(FieldError::not_supported(format!("{path}.dnsPolicy"), dns, DNS_POLICIES));
    }
    if dns == "None" && spec.dns_config.is_none() {
        errs.push(FieldError::required(
            format!("{path}.dnsConfig"),
            "must provide `dnsConfig` when `dnsPolicy` is None",
        ));
    }
    if let Some(sel) = &spec.node_selector {
        errs.extend(validate_labels(sel, &format!("{path}.nodeSelector")));
    }
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        errs.extend(validate_dns_subdomain_field(&format!("{path}.nodeName"), n));
    }
    if let Some(n) = spec.service_account_name.as_deref().filter(|n| !n.is_empty()) {
        errs.extend(validate_dns_subdomain_field(&format!("{path}.serviceAccountName"), n));
    }
    if let Some(n) = &spec.runtime_class_name {
        errs.extend(validate_dns_subdomain_field(&format!("{path}.runtimeClassName"), n));
    }
    for (field, v) in [("hostname", &spec.hostname), ("subdomain", &spec.subdomain)] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            errs.extend(invalid_each(&format!("{path}.{field}"), v, is_dns1123_label(v)));
        }
    }
    if let Some(ads) = spec.active_deadline_seconds
        && !(1..=i64::from(i32::MAX)).contains(&ads)
    {
        errs.push(FieldError::invalid_raw(
            format!("{path}.activeDeadlineSeconds"),
            ads.to_string(),
            inclusive_range_error(1, i64::from(i32::MAX)),
        ));
    }
    if let Some(g) = spec.termination_grace_period_seconds {
        errs.extend(validate_nonnegative(g, &format!("{path}.terminationGracePeriodSeconds")));
    }
    if let Some(t) = &spec.tolerations {
        errs.extend(validate_tolerations(t, &format!("{path}.tolerations")));
    }
    for (name, q) in spec.overhead.iter().flatten() {
        errs.extend(validate_resource_quantity(&format!("{path}.overhead[{name}]"), q).0);
    }
    if let Some(sysctls) = spec.security_context.as_ref().and_then(|sc| sc.sysctls.as_ref()) {
        errs.extend(validate_sysctls(sysctls, &format!("{path}.securityContext.sysctls")));
    }
    errs
}

/// Kubernetes' sysctl name pattern, as its validation messages print it.
const SYSCTL_NAME_PATTERN: &str = r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";
const SYSCTL_MAX_LENGTH: usize = 253;

/// Segments of `[a-z0-9]([-_a-z0-9]*[a-z0-9])?` joined by `.` or `/`, at most 253 characters.
fn is_valid_sysctl_name(name: &str) -> bool {
    let segment_ok = |seg: &str| {
        let b = seg.as_bytes();
        let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty() && edge(b[0]) && edge(b[b.len() - 1]) && b.iter().all(|&c| edge(c) || c == b'-' || c == b'_')
    };
    name.len() <= SYSCTL_MAX_LENGTH && name.split(['.', '/']).all(segment_ok)
}

fn validate_sysctls(sysctls: &[core::Sysctl], path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, sysctl) in sysctls.iter().enumerate() {
        let p = format!("{path}[{i}].name");
        if sysctl.name.is_empty() {
            errs.push(FieldError::required(p, ""));
        } else if !is_valid_sysctl_name(&sysctl.name) {
            let detail =
                format!("must have at most {SYSCTL_MAX_LENGTH} characters and match regex {SYSCTL_NAME_PATTERN}");
            errs.push(FieldError::invalid(p, &sysctl.name, detail));
        } else if !seen.insert(sysctl.name.as_str()) {
            errs.push(FieldError::duplicate(p, &sysctl.name));
        }
    }
    errs
}

fn validate_pod_create(pod: &core::Pod) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&pod.metadata, true, false);
    let spec = pod.spec.clone().unwrap_or_default();
    errs.extend(validate_pod_spec(&spec, "spec"));
    if spec.ephemeral_containers.as_ref().is_some_and(|e| !e.is_empty()) {
        errs.push(FieldError::forbidden("spec.ephemeralContainers", "cannot be set on create"));
    }
    if !s(&spec.node_name).is_empty() && spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()) {
        errs.push(FieldError::forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"));
    }
    errs
}

fn container_updates(new: &[core::Container], old: &[core::Container], path: &str) -> (Vec<FieldError>, bool) {
    if new.len() != old.len() {
        return (vec![FieldError::forbidden(path, "pod updates may not add or remove containers")], true);
    }
    let mut errs = Vec::new();
    for (i, c) in new.iter().enumerate() {
        let image = s(&c.image);
        if image.is_empty() {
            errs.push(FieldError::required(format!("{path}[{i}].image"), ""));
        }
        if image.trim() != image {
            errs.push(FieldError::invalid(
                format!("{path}[{i}].image"),
                image,
                "must not have leading or trailing whitespace",
            ));
        }
    }
    (errs, false)
}

fn same_toleration(a: &core::Toleration, b: &core::Toleration) -> bool {
    semantically_equal(a, b)
}

/// `ValidatePodUpdate`: besides images, deadlines, added tolerations, removed scheduling gates
/// and the negative-grace-period repair, the spec is frozen (nodeName included: binding sets it).
fn validate_pod_update(new: &core::Pod, old: &core::Pod) -> Vec<FieldError> {
    let mut errs = validate_object_meta_update(&new.metadata, &old.metadata);
    let new_spec = new.spec.clone().unwrap_or_default();
    let old_spec = old.spec.clone().unwrap_or_default();
    errs.extend(validate_pod_spec(&new_spec, "spec"));

    let (e, stop) = container_updates(&new_spec.containers, &old_spec.containers, "spec.containers");
    errs.extend(e);
    if stop {
        return errs;
    }
    let empty = Vec::new();
    let (e, stop) = container_updates(
        new_spec.init_containers.as_ref().unwrap_or(&empty),
        old_spec.init_containers.as_ref().unwrap_or(&empty),
        "spec.initContainers",
    );
    errs.extend(e);
    if stop {
        return errs;
    }

    match (new_spec.active_deadline_seconds, old_spec.active_deadline_seconds) {
        (Some(n), _) if !(0..=i64::from(i32::MAX)).contains(&n) => {
            errs.push(FieldError::invalid_raw(
                "spec.activeDeadlineSeconds",
                n.to_string(),
                inclusive_range_error(0, i64::from(i32::MAX)),
            ));
            return errs;
        }
        (Some(n), Some(o)) if o < n => {
            errs.push(FieldError::invalid_raw(
                "spec.activeDeadlineSeconds",
                n.to_string(),
                "must be less than or equal to previous value",
            ));
            return errs;
        }
        (None, Some(_)) => errs.push(FieldError::invalid_raw(
            "spec.activeDeadlineSeconds",
            "null",
            "must not update from a positive integer to nil value",
        )),
        _ => {}
    }

    // Tolerations may only be added (an existing one may change its tolerationSeconds).
    let new_tols = new_spec.tolerations.clone().unwrap_or_default();
    for o in old_spec.tolerations.iter().flatten() {
        let kept = new_tols.iter().any(|n| {
            let mut o = o.clone();
            o.toleration_seconds = n.toleration_seconds;
            same_toleration(&o, n)
        });
        if !kept {
            errs.push(FieldError::forbidden(
                "spec.tolerations",
                "existing toleration can not be modified except its tolerationSeconds",
            ));
            break;
        }
    }

    // Scheduling gates may only be removed.
    let old_gates: BTreeSet<String> = old_spec.scheduling_gates.iter().flatten().map(|g| g.name.clone()).collect();
    for (i, g) in new_spec.scheduling_gates.iter().flatten().enumerate() {
        if !old_gates.contains(&g.name) {
            errs.push(FieldError::forbidden(
                format!("spec.schedulingGates[{i}]"),
                "only deletion is allowed, but found new scheduling gate",
            ));
        }
    }

    // Everything else must be unchanged: put back what may change and compare.
    let mut munged = new_spec.clone();
    for (c, o) in munged.containers.iter_mut().zip(&old_spec.containers) {
        c.image = o.image.clone();
    }
    if let (Some(n), Some(o)) = (munged.init_containers.as_mut(), old_spec.init_containers.as_ref()) {
        for (c, o) in n.iter_mut().zip(o) {
            c.image = o.image.clone();
        }
    }
    munged.active_deadline_seconds = old_spec.active_deadline_seconds;
    munged.scheduling_gates = old_spec.scheduling_gates.clone();
    munged.tolerations = old_spec.tolerations.clone();
    if old_spec.termination_grace_period_seconds.is_some_and(|g| g < 0)
        && munged.termination_grace_period_seconds == Some(1)
    {
        munged.termination_grace_period_seconds = old_spec.termination_grace_period_seconds;
    }
    if !old_spec.scheduling_gates.as_ref().is_none_or(|g| g.is_empty()) {
        // A gated pod may gain node selector entries (additions only).
        let old_sel = old_spec.node_selector.clone().unwrap_or_default();
        let new_sel = munged.node_selector.clone().unwrap_or_default();
        if old_sel.iter().all(|(k, v)| new_sel.get(k) == Some(v)) {
            munged.node_selector = old_spec.node_selector.clone();
        }
    }
    if !semantically_equal(&munged, &old_spec) {
        errs.push(FieldError::forbidden("spec", POD_UPDATE_FORBIDDEN));
    }
    errs
}

fn validate_namespace(ns: &core::Namespace) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&ns.metadata, false, true);
    for f in ns.spec.iter().flat_map(|s| s.finalizers.iter().flatten()) {
        errs.extend(invalid_each("spec.finalizers", f, is_qualified_name(f)));
    }
    errs
}

fn validate_node(node: &core::Node) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&node.metadata, false, false);
    for (i, t) in node.spec.iter().flat_map(|s| s.taints.iter().flatten()).enumerate() {
        let p = format!("spec.taints[{i}]");
        errs.extend(invalid_each(&format!("{p}.key"), &t.key, is_qualified_name(&t.key)));
        let v = s(&t.value);
        errs.extend(invalid_each(&format!("{p}.value"), v, is_valid_label_value(v)));
        errs.extend(validate_taint_effect(&t.effect, false, &format!("{p}.effect")));
    }
    errs
}

fn validate_node_update(new: &core::Node, old: &core::Node) -> Vec<FieldError> {
    let mut errs = validate_object_meta_update(&new.metadata, &old.metadata);
    let (ns, os) = (new.spec.clone().unwrap_or_default(), old.spec.clone().unwrap_or_default());
    let old_cidrs = os.pod_cidrs.clone().unwrap_or_default();
    if !old_cidrs.is_empty() && ns.pod_cidrs.clone().unwrap_or_default() != old_cidrs {
        errs.push(FieldError::forbidden(
            "spec.podCIDRs",
            "node updates may not change podCIDR except from \"\" to valid",
        ));
    }
    if !s(&os.provider_id).is_empty() && os.provider_id != ns.provider_id {
        errs.push(FieldError::forbidden(
            "spec.providerID",
            "node updates may not change providerID except from \"\" to valid",
        ));
    }
    errs
}

fn validate_config_map(cm: &core::ConfigMap) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&cm.metadata, true, false);
    let data = cm.data.clone().unwrap_or_default();
    let binary = cm.binary_data.clone().unwrap_or_default();
    let mut total = 0usize;
    for (k, v) in &data {
        let p = format!("data[{k}]");
        errs.extend(invalid_each(&p, k, is_config_map_key(k)));
        if binary.contains_key(k) {
            errs.push(FieldError::invalid(&p, k, "duplicate of key present in binaryData"));
        }
        total += v.len();
    }
    for (k, v) in &binary {
        let p = format!("binaryData[{k}]");
        errs.extend(invalid_each(&p, k, is_config_map_key(k)));
        if data.contains_key(k) {
            errs.push(FieldError::invalid(&p, k, "duplicate of key present in data"));
        }
        total += v.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long("", MAX_SECRET_SIZE));
    }
    errs
}

const IMMUTABLE_SET: &str = "field is immutable when `immutable` is set";

fn validate_config_map_update(new: &core::ConfigMap, old: &core::ConfigMap) -> Vec<FieldError> {
    let mut errs = validate_object_meta_update(&new.metadata, &old.metadata);
    if old.immutable == Some(true) {
        if new.immutable != Some(true) {
            errs.push(FieldError::forbidden("immutable", IMMUTABLE_SET));
        }
        if !semantically_equal(&new.data, &old.data) {
            errs.push(FieldError::forbidden("data", IMMUTABLE_SET));
        }
        if !semantically_equal(&new.binary_data, &old.binary_data) {
            errs.push(FieldError::forbidden("binaryData", IMMUTABLE_SET));
        }
    }
    errs.extend(validate_config_map(new).into_iter().filter(|e| !e.field.starts_with("metadata.")));
    errs
}

fn validate_secret(secret: &core::Secret) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&secret.metadata, true, false);
    let data = secret.data.clone().unwrap_or_default();
    let mut total = 0usize;
    for (k, v) in &data {
        errs.extend(invalid_each(&format!("data[{k}]"), k, is_config_map_key(k)));
        total += v.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long("data", MAX_SECRET_SIZE));
    }
    let need = |errs: &mut Vec<FieldError>, key: &str| {
        if !data.contains_key(key) {
            errs.push(FieldError::required(format!("data[{key}]"), ""));
        }
    };
    match s(&secret.type_) {
        "kubernetes.io/service-account-token" => {
            let has = secret
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.get("kubernetes.io/service-account.name").is_some_and(|v| !v.is_empty()));
            if !has {
                errs.push(FieldError::required("metadata.annotations[kubernetes.io/service-account.name]", ""));
            }
        }
        "kubernetes.io/dockercfg" => need(&mut errs, ".dockercfg"),
        "kubernetes.io/dockerconfigjson" => need(&mut errs, ".dockerconfigjson"),
        "kubernetes.io/basic-auth" if !data.contains_key("username") && !data.contains_key("password") => {
            need(&mut errs, "username");
            need(&mut errs, "password");
        }
        "kubernetes.io/ssh-auth" => need(&mut errs, "ssh-privatekey"),
        "kubernetes.io/tls" => {
            need(&mut errs, "tls.crt");
            need(&mut errs, "tls.key");
        }
        _ => {}
    }
    errs
}

fn validate_secret_update(new: &core::Secret, old: &core::Secret) -> Vec<FieldError> {
    let mut errs = validate_object_meta_update(&new.metadata, &old.metadata);
    let (nt, ot) = (s(&new.type_), s(&old.type_));
    if nt != ot {
        errs.push(FieldError::invalid("type", nt, FIELD_IMMUTABLE));
    }
    if old.immutable == Some(true) {
        if new.immutable != Some(true) {
            errs.push(FieldError::forbidden("immutable", IMMUTABLE_SET));
        }
        if !semantically_equal(&new.data, &old.data) {
            errs.push(FieldError::forbidden("data", IMMUTABLE_SET));
        }
    }
    errs.extend(validate_secret(new).into_iter().filter(|e| !e.field.starts_with("metadata.")));
    errs
}

fn validate_lease_spec(spec: Option<&coordination::LeaseSpec>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(spec) = spec else { return errs };
    if let Some(d) = spec.lease_duration_seconds.filter(|d| *d <= 0) {
        errs.push(FieldError::invalid_raw("spec.leaseDurationSeconds", d.to_string(), "must be greater than 0"));
    }
    if let Some(t) = spec.lease_transitions {
        errs.extend(validate_nonnegative(i64::from(t), "spec.leaseTransitions"));
    }
    errs
}

fn validate_runtime_class(rc: &nodev1::RuntimeClass) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&rc.metadata, false, false);
    if rc.handler.is_empty() {
        errs.push(FieldError::required("handler", ""));
    } else {
        errs.extend(invalid_each("handler", &rc.handler, is_dns1123_label(&rc.handler)));
    }
    for (name, q) in rc.overhead.iter().flat_map(|o| o.pod_fixed.iter().flatten()) {
        let p = format!("overhead.podFixed[{name}]");
        errs.extend(validate_container_resource_name(&p, name));
        errs.extend(validate_resource_quantity(&p, q).0);
    }
    if let Some(sched) = &rc.scheduling {
        if let Some(sel) = &sched.node_selector {
            errs.extend(validate_labels(sel, "scheduling.nodeSelector"));
        }
        errs.extend(validate_tolerations(sched.tolerations.as_deref().unwrap_or(&[]), "scheduling.tolerations"));
    }
    errs
}

/// `ValidatePodTemplateSpecForReplicaSet` plus the selector checks shared by deployments and
/// replica sets. `selector_given` tells whether `spec.selector` was present at all.
fn validate_workload_template(
    selector: &K8sLabelSelector,
    selector_given: bool,
    template: Option<&core::PodTemplateSpec>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !selector_given {
        errs.push(FieldError::required("spec.selector", ""));
    } else {
        errs.extend(validate_label_selector(selector, "spec.selector"));
        let n = selector.match_labels.as_ref().map_or(0, BTreeMap::len)
            + selector.match_expressions.as_ref().map_or(0, Vec::len);
        if n == 0 {
            errs.push(FieldError::invalid_raw(
                "spec.selector",
                json_of(selector),
                "empty selector is invalid for deployment",
            ));
        }
    }
    let parsed = match LabelSelector::from_k8s(selector) {
        Ok(p) => p,
        Err(_) => {
            errs.push(FieldError::invalid_raw("spec.selector", json_of(selector), "invalid label selector"));
            return errs;
        }
    };
    let Some(template) = template else {
        errs.push(FieldError::required("spec.template", ""));
        return errs;
    };
    let meta = template.metadata.clone().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    if !parsed.is_empty() && !parsed.matches(&labels) {
        errs.push(FieldError::invalid_raw(
            "spec.template.metadata.labels",
            json_of(&labels),
            "`selector` does not match template `labels`",
        ));
    }
    errs.extend(validate_labels(&labels, "spec.template.metadata.labels"));
    if let Some(a) = &meta.annotations {
        errs.extend(validate_annotations(a, "spec.template.metadata.annotations"));
    }
    let spec = template.spec.clone().unwrap_or_default();
    errs.extend(validate_pod_spec(&spec, "spec.template.spec"));
    let restart = s(&spec.restart_policy);
    if restart != "Always" {
        errs.push(FieldError::not_supported("spec.template.spec.restartPolicy", restart, &["Always"]));
    }
    if spec.active_deadline_seconds.is_some() {
        errs.push(FieldError::forbidden(
            "spec.template.spec.activeDeadlineSeconds",
            "activeDeadlineSeconds in ReplicaSet is not Supported",
        ));
    }
    errs
}

fn percent_value(v: &IntOrString) -> Option<i64> {
    match v {
        IntOrString::String(s) => {
            let digits = s.strip_suffix('%')?;
            if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        }
        IntOrString::Int(_) => None,
    }
}

fn int_or_percent_value(v: &IntOrString) -> i64 {
    match v {
        IntOrString::Int(i) => i64::from(*i),
        IntOrString::String(s) => percent_value(v).unwrap_or_else(|| s.parse().unwrap_or(0)),
    }
}

fn validate_int_or_percent(v: &IntOrString, field: &str) -> Vec<FieldError> {
    match v {
        IntOrString::String(_) if percent_value(v).is_none() => vec![FieldError::invalid_raw(
            field,
            json_of(v),
            regex_error(
                "a valid percent string must be a numeric string followed by an ending '%'",
                "[0-9]+%",
                &["1%", "93%"],
            ),
        )],
        IntOrString::String(_) => Vec::new(),
        IntOrString::Int(i) => validate_nonnegative(i64::from(*i), field),
    }
}

fn validate_strategy(strategy: &apps::DeploymentStrategy) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match s(&strategy.type_) {
        "Recreate" => {
            if strategy.rolling_update.is_some() {
                errs.push(FieldError::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => match &strategy.rolling_update {
            None => errs
                .push(FieldError::required("spec.strategy.rollingUpdate", "this should be defaulted and never be nil")),
            Some(ru) => {
                let zero = IntOrString::Int(0);
                let mu = ru.max_unavailable.as_ref().unwrap_or(&zero);
                let ms = ru.max_surge.as_ref().unwrap_or(&zero);
                let (pu, ps) = ("spec.strategy.rollingUpdate.maxUnavailable", "spec.strategy.rollingUpdate.maxSurge");
                errs.extend(validate_int_or_percent(mu, pu));
                errs.extend(validate_int_or_percent(ms, ps));
                if int_or_percent_value(mu) == 0 && int_or_percent_value(ms) == 0 {
                    errs.push(FieldError::invalid_raw(pu, json_of(mu), "may not be 0 when `maxSurge` is 0"));
                }
                if percent_value(mu).is_some_and(|p| p > 100) {
                    errs.push(FieldError::invalid_raw(pu, json_of(mu), "must not be greater than 100%"));
                }
            }
        },
        other => errs.push(FieldError::not_supported("spec.strategy", other, &["Recreate", "RollingUpdate"])),
    }
    errs
}

fn selector_given(obj: &Value) -> bool {
    obj.pointer("/spec/selector").is_some_and(|v| !v.is_null())
}

fn validate_deployment(d: &apps::Deployment, raw: &Value) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&d.metadata, true, false);
    let spec = d.spec.clone().unwrap_or_default();
    errs.extend(validate_nonnegative(i64::from(spec.replicas.unwrap_or(0)), "spec.replicas"));
    errs.extend(validate_workload_template(&spec.selector, selector_given(raw), Some(&spec.template)));
    errs.extend(validate_strategy(&spec.strategy.clone().unwrap_or_default()));
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    errs.extend(validate_nonnegative(i64::from(min_ready), "spec.minReadySeconds"));
    if let Some(r) = spec.revision_history_limit {
        errs.extend(validate_nonnegative(i64::from(r), "spec.revisionHistoryLimit"));
    }
    if let Some(p) = spec.progress_deadline_seconds {
        errs.extend(validate_nonnegative(i64::from(p), "spec.progressDeadlineSeconds"));
        if p <= min_ready {
            errs.push(FieldError::invalid_raw(
                "spec.progressDeadlineSeconds",
                p.to_string(),
                "must be greater than minReadySeconds",
            ));
        }
    }
    errs
}

fn validate_replica_set(rs: &apps::ReplicaSet, raw: &Value) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&rs.metadata, true, false);
    let spec = rs.spec.clone().unwrap_or_default();
    errs.extend(validate_nonnegative(i64::from(spec.replicas.unwrap_or(0)), "spec.replicas"));
    errs.extend(validate_nonnegative(i64::from(spec.min_ready_seconds.unwrap_or(0)), "spec.minReadySeconds"));
    errs.extend(validate_workload_template(&spec.selector, selector_given(raw), spec.template.as_ref()));
    errs
}

/// `ValidatePodTemplateSpec`: the template's labels, annotations and pod spec.
fn validate_pod_template_spec(template: &core::PodTemplateSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = template.metadata.clone().unwrap_or_default();
    if let Some(l) = &meta.labels {
        errs.extend(validate_labels(l, &format!("{path}.metadata.labels")));
    }
    if let Some(a) = &meta.annotations {
        errs.extend(validate_annotations(a, &format!("{path}.metadata.annotations")));
    }
    errs.extend(validate_pod_spec(&template.spec.clone().unwrap_or_default(), &format!("{path}.spec")));
    errs
}

/// `ValidateReplicationControllerSpec`: a non-empty selector matching the template's labels,
/// non-negative counts, and a template whose pods always restart and have no deadline.
fn validate_replication_controller(rc: &core::ReplicationController) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&rc.metadata, true, false);
    let spec = rc.spec.clone().unwrap_or_default();
    errs.extend(validate_nonnegative(i64::from(spec.min_ready_seconds.unwrap_or(0)), "spec.minReadySeconds"));
    let selector = spec.selector.clone().unwrap_or_default();
    if selector.is_empty() {
        errs.push(FieldError::required("spec.selector", ""));
    }
    errs.extend(validate_nonnegative(i64::from(spec.replicas.unwrap_or(0)), "spec.replicas"));
    let Some(template) = &spec.template else {
        errs.push(FieldError::required("spec.template", ""));
        return errs;
    };
    let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    if !selector.is_empty() && !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        errs.push(FieldError::invalid_raw(
            "spec.template.metadata.labels",
            json_of(&labels),
            "`selector` does not match template `labels`",
        ));
    }
    errs.extend(validate_pod_template_spec(template, "spec.template"));
    let pod_spec = template.spec.clone().unwrap_or_default();
    let restart = s(&pod_spec.restart_policy);
    if restart != "Always" {
        errs.push(FieldError::not_supported("spec.template.spec.restartPolicy", restart, &["Always"]));
    }
    if pod_spec.active_deadline_seconds.is_some() {
        errs.push(FieldError::forbidden(
            "spec.template.spec.activeDeadlineSeconds",
            "activeDeadlineSeconds in ReplicationController is not Supported",
        ));
    }
    errs
}

/// `ValidatePodTemplate`: metadata and a template (an absent one is validated as empty).
fn validate_pod_template(pt: &core::PodTemplate) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&pt.metadata, true, false);
    errs.extend(validate_pod_template_spec(&pt.template.clone().unwrap_or_default(), "template"));
    errs
}

fn immutable_selector(new: &K8sLabelSelector, old: &K8sLabelSelector) -> Vec<FieldError> {
    if semantically_equal(new, old) {
        Vec::new()
    } else {
        vec![FieldError::invalid_raw("spec.selector", json_of(new), FIELD_IMMUTABLE)]
    }
}

/// Keeps the kind-specific errors of a create-time validation, for reuse on updates whose
/// metadata rules differ.
fn without_meta(errs: Vec<FieldError>) -> Vec<FieldError> {
    errs.into_iter().filter(|e| !e.field.starts_with("metadata.")).collect()
}

/// Validation of a new object, metadata included.
pub fn validate_create(rt: &ResourceType, obj: &Value) -> Vec<FieldError> {
    let meta_only = |namespaced: bool| -> Vec<FieldError> {
        let meta: ObjectMeta = obj.get("metadata").and_then(decode).unwrap_or_default();
        validate_object_meta(&meta, namespaced, false)
    };
    match kind_of(rt) {
        Kind::Namespace => decode(obj).map(|ns| validate_namespace(&ns)).unwrap_or_default(),
        Kind::Pod => decode(obj).map(|p| validate_pod_create(&p)).unwrap_or_default(),
        Kind::Node => decode(obj).map(|n| validate_node(&n)).unwrap_or_default(),
        Kind::ConfigMap => decode(obj).map(|c| validate_config_map(&c)).unwrap_or_default(),
        Kind::Secret => decode(obj).map(|s| validate_secret(&s)).unwrap_or_default(),
        Kind::Lease => decode::<coordination::Lease>(obj)
            .map(|l| {
                let mut errs = validate_object_meta(&l.metadata, true, false);
                errs.extend(validate_lease_spec(l.spec.as_ref()));
                errs
            })
            .unwrap_or_default(),
        Kind::RuntimeClass => decode(obj).map(|rc| validate_runtime_class(&rc)).unwrap_or_default(),
        Kind::Deployment => decode(obj).map(|d| validate_deployment(&d, obj)).unwrap_or_default(),
        Kind::ReplicaSet => decode(obj).map(|rs| validate_replica_set(&rs, obj)).unwrap_or_default(),
        Kind::ReplicationController => decode(obj).map(|rc| validate_replication_controller(&rc)).unwrap_or_default(),
        Kind::PodTemplate => decode(obj).map(|pt| validate_pod_template(&pt)).unwrap_or_default(),
        Kind::Service => decode(obj).map(|s| crate::service::validate_service(&s)).unwrap_or_default(),
        Kind::EndpointSlice => {
            let mut errs = meta_only(true);
            errs.extend(validate_endpoint_slice(obj));
            errs
        }
        Kind::Endpoints => meta_only(true),
        // Events are validated lightly: their metadata only.
        Kind::ServiceAccount | Kind::Event | Kind::EventV1 | Kind::Ingress | Kind::Other => meta_only(rt.namespaced),
    }
}

/// An EndpointSlice's address type is required and one of Kubernetes' three.
fn validate_endpoint_slice(obj: &Value) -> Vec<FieldError> {
    const TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
    match obj.get("addressType").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        None => vec![FieldError::required("addressType", "")],
        Some(t) if !TYPES.contains(&t) => vec![FieldError::not_supported("addressType", t, TYPES)],
        Some(_) => {
            let n = obj.get("endpoints").and_then(Value::as_array).map_or(0, Vec::len);
            if n > 1000 {
                vec![FieldError {
                    error_type: ErrorType::TooMany,
                    field: "endpoints".into(),
                    bad_value: Some(n.to_string()),
                    detail: "must have at most 1000 items".into(),
                }]
            } else {
                Vec::new()
            }
        }
    }
}

fn pair<T: DeserializeOwned>(new: &Value, old: &Value) -> Option<(T, T)> {
    Some((decode(new)?, decode(old)?))
}

/// Validation of an update: the new object is valid and changes only mutable fields.
pub fn validate_update(rt: &ResourceType, new: &Value, old: &Value) -> Vec<FieldError> {
    let meta_update = || -> Vec<FieldError> {
        let n: ObjectMeta = new.get("metadata").and_then(decode).unwrap_or_default();
        let o: ObjectMeta = old.get("metadata").and_then(decode).unwrap_or_default();
        validate_object_meta_update(&n, &o)
    };
    match kind_of(rt) {
        Kind::Namespace => pair::<core::Namespace>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(without_meta(validate_namespace(&n)));
                errs
            })
            .unwrap_or_default(),
        Kind::Pod => pair::<core::Pod>(new, old).map(|(n, o)| validate_pod_update(&n, &o)).unwrap_or_default(),
        Kind::Node => pair::<core::Node>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_node_update(&n, &o);
                errs.extend(without_meta(validate_node(&n)));
                errs
            })
            .unwrap_or_default(),
        Kind::ConfigMap => {
            pair::<core::ConfigMap>(new, old).map(|(n, o)| validate_config_map_update(&n, &o)).unwrap_or_default()
        }
        Kind::Secret => pair::<core::Secret>(new, old).map(|(n, o)| validate_secret_update(&n, &o)).unwrap_or_default(),
        Kind::Lease => pair::<coordination::Lease>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(validate_lease_spec(n.spec.as_ref()));
                errs
            })
            .unwrap_or_default(),
        Kind::RuntimeClass => pair::<nodev1::RuntimeClass>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(without_meta(validate_runtime_class(&n)));
                if n.handler != o.handler {
                    errs.push(FieldError::invalid("handler", &n.handler, FIELD_IMMUTABLE));
                }
                errs
            })
            .unwrap_or_default(),
        Kind::Deployment => pair::<apps::Deployment>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(without_meta(validate_deployment(&n, new)));
                let (ns, os) = (n.spec.unwrap_or_default(), o.spec.unwrap_or_default());
                errs.extend(immutable_selector(&ns.selector, &os.selector));
                errs
            })
            .unwrap_or_default(),
        Kind::ReplicaSet => pair::<apps::ReplicaSet>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(without_meta(validate_replica_set(&n, new)));
                let (ns, os) = (n.spec.unwrap_or_default(), o.spec.unwrap_or_default());
                errs.extend(immutable_selector(&ns.selector, &os.selector));
                errs
            })
            .unwrap_or_default(),
        // A replication controller's selector may change, unlike a replica set's.
        Kind::ReplicationController => pair::<core::ReplicationController>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(without_meta(validate_replication_controller(&n)));
                errs
            })
            .unwrap_or_default(),
        Kind::PodTemplate => pair::<core::PodTemplate>(new, old)
            .map(|(n, o)| {
                let mut errs = validate_object_meta_update(&n.metadata, &o.metadata);
                errs.extend(without_meta(validate_pod_template(&n)));
                errs
            })
            .unwrap_or_default(),
        Kind::Service => pair::<core::Service>(new, old)
            .map(|(n, o)| crate::service::validate_service_update(&n, &o))
            .unwrap_or_default(),
        Kind::EndpointSlice => {
            let mut errs = meta_update();
            errs.extend(validate_endpoint_slice(new));
            if new.get("addressType") != old.get("addressType") {
                errs.push(FieldError::invalid("addressType", &str_at(new, "/addressType"), FIELD_IMMUTABLE));
            }
            errs
        }
        Kind::ServiceAccount | Kind::Endpoints | Kind::Event | Kind::EventV1 | Kind::Ingress | Kind::Other => {
            meta_update()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Field selectors

const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const NODE_FIELDS: &[&str] = &["metadata.name", "spec.unschedulable"];
const NAMESPACE_FIELDS: &[&str] = &["metadata.name", "status.phase"];
const SECRET_FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "type"];
const EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];
/// events.k8s.io/v1 names the same fields after its own schema (`regarding`, `reportingController`).
const EVENT_V1_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "source",
    "type",
];
const REPLICASET_FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "status.replicas"];
const NAMESPACED_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];
const CLUSTER_FIELDS: &[&str] = &["metadata.name"];

/// The field labels a resource supports in field selectors.
pub fn supported_fields(rt: &ResourceType) -> &'static [&'static str] {
    match kind_of(rt) {
        Kind::Pod => POD_FIELDS,
        Kind::Node => NODE_FIELDS,
        Kind::Namespace => NAMESPACE_FIELDS,
        Kind::Secret => SECRET_FIELDS,
        Kind::Event => EVENT_FIELDS,
        Kind::EventV1 => EVENT_V1_FIELDS,
        Kind::ReplicaSet | Kind::ReplicationController => REPLICASET_FIELDS,
        _ if rt.namespaced => NAMESPACED_FIELDS,
        _ => CLUSTER_FIELDS,
    }
}

fn str_at(obj: &Value, pointer: &str) -> String {
    match obj.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Field selector values of an object (`metadata.name`, `spec.nodeName`, ...).
pub fn field_set(rt: &ResourceType, obj: &Value) -> BTreeMap<String, String> {
    let kind = kind_of(rt);
    // Both event views are stored in the core form; accept either here.
    let core_event;
    let obj = if matches!(kind, Kind::Event | Kind::EventV1)
        && obj.get("involvedObject").is_none()
        && obj.get("regarding").is_some()
    {
        core_event = event_v1_to_core(obj);
        &core_event
    } else {
        obj
    };
    let mut out = BTreeMap::new();
    out.insert("metadata.name".to_string(), str_at(obj, "/metadata/name"));
    if rt.namespaced {
        out.insert("metadata.namespace".to_string(), str_at(obj, "/metadata/namespace"));
    }
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), v);
    };
    match kind {
        Kind::Pod => {
            for (k, p) in [
                ("spec.nodeName", "/spec/nodeName"),
                ("spec.restartPolicy", "/spec/restartPolicy"),
                ("spec.schedulerName", "/spec/schedulerName"),
                ("spec.serviceAccountName", "/spec/serviceAccountName"),
                ("status.phase", "/status/phase"),
                ("status.nominatedNodeName", "/status/nominatedNodeName"),
            ] {
                put(k, str_at(obj, p));
            }
            let host_network = obj.pointer("/spec/hostNetwork").and_then(Value::as_bool).unwrap_or(false);
            put("spec.hostNetwork", host_network.to_string());
            let ip = match str_at(obj, "/status/podIPs/0/ip") {
                ip if !ip.is_empty() => ip,
                _ => str_at(obj, "/status/podIP"),
            };
            put("status.podIP", ip);
        }
        Kind::Node => {
            let u = obj.pointer("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false);
            put("spec.unschedulable", u.to_string());
        }
        Kind::Namespace => put("status.phase", str_at(obj, "/status/phase")),
        Kind::Secret => put("type", str_at(obj, "/type")),
        Kind::ReplicaSet | Kind::ReplicationController => {
            let r = obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0);
            put("status.replicas", r.to_string());
        }
        Kind::Event | Kind::EventV1 => {
            let (object, reporter) = if matches!(kind, Kind::Event) {
                ("involvedObject", "reportingComponent")
            } else {
                ("regarding", "reportingController")
            };
            for f in ["kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"] {
                put(&format!("{object}.{f}"), str_at(obj, &format!("/involvedObject/{f}")));
            }
            put("reason", str_at(obj, "/reason"));
            let reporting = str_at(obj, "/reportingComponent");
            // Events recorded through events.k8s.io have no source: they are found by their reporter.
            let source = match str_at(obj, "/source/component") {
                component if !component.is_empty() => component,
                _ => reporting.clone(),
            };
            put(reporter, reporting);
            put("source", source);
            put("type", str_at(obj, "/type"));
        }
        _ => {}
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Events: one store, two views

/// Fields named alike in both views.
const EVENT_SHARED: &[&str] =
    &["metadata", "reportingInstance", "eventTime", "series", "action", "related", "type", "reason"];
/// (core/v1 name, events.k8s.io/v1 name).
const EVENT_RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

fn convert_event(from: &Value, api_version: &str, to_v1: bool) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    for k in EVENT_SHARED {
        if let Some(v) = from.get(*k).filter(|v| !v.is_null()) {
            out.insert((*k).to_string(), v.clone());
        }
    }
    for (core_name, v1_name) in EVENT_RENAMED {
        let (src, dst) = if to_v1 { (core_name, v1_name) } else { (v1_name, core_name) };
        if let Some(v) = from.get(*src).filter(|v| !v.is_null()) {
            out.insert((*dst).to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// A core/v1 Event as the events.k8s.io/v1 view shows it.
pub fn event_core_to_v1(core: &Value) -> Value {
    convert_event(core, "events.k8s.io/v1", true)
}

/// An events.k8s.io/v1 Event in the core/v1 form the store keeps.
pub fn event_v1_to_core(v1: &Value) -> Value {
    convert_event(v1, "v1", false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{
        CONFIGMAPS, DEPLOYMENTS, EVENTS, EVENTS_V1, LEASES, NAMESPACES, NODES, PODS, PODTEMPLATES, REPLICASETS,
        REPLICATIONCONTROLLERS, RUNTIMECLASSES, SECRETS, SERVICEACCOUNTS,
    };
    use k8s_openapi::api::events::v1 as events;

    fn msgs(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.to_string()).collect()
    }

    fn pod() -> Value {
        json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},
               "spec":{"containers":[{"name":"c","image":"nginx:1.25"}]}})
    }

    fn created(rt: &ResourceType, mut v: Value) -> Value {
        prepare_for_create(rt, &mut v);
        v
    }

    #[test]
    fn pod_defaults_match_kubernetes() {
        let p = created(&PODS, pod());
        let spec = &p["spec"];
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["securityContext"], json!({}));
        assert_eq!(spec["enableServiceLinks"], true);
        assert_eq!(spec["priority"], 0);
        let c = &spec["containers"][0];
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(p["status"], json!({"phase":"Pending","qosClass":"BestEffort"}));
    }

    #[test]
    fn image_pull_policy_depends_on_the_tag() {
        assert_eq!(image_tag("nginx"), Some("latest"));
        assert_eq!(image_tag("nginx:latest"), Some("latest"));
        assert_eq!(image_tag("registry:5000/nginx"), Some("latest"));
        assert_eq!(image_tag("registry:5000/nginx:1.2"), Some("1.2"));
        assert_eq!(image_tag("nginx@sha256:abc"), None);
        let mut v = pod();
        v["spec"]["containers"][0]["image"] = json!("nginx");
        v["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80}]);
        let p = created(&PODS, v);
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn requests_default_to_limits_and_qos_is_guaranteed() {
        let mut v = pod();
        v["spec"]["containers"][0]["resources"] = json!({"limits":{"cpu":"1","memory":"1Gi"}});
        let p = created(&PODS, v);
        assert_eq!(p["spec"]["containers"][0]["resources"]["requests"], json!({"cpu":"1","memory":"1Gi"}));
        assert_eq!(p["status"]["qosClass"], "Guaranteed");
    }

    #[test]
    fn partial_resources_make_a_burstable_pod() {
        let mut v = pod();
        v["spec"]["containers"][0]["resources"] = json!({"requests":{"cpu":"100m"}});
        assert_eq!(created(&PODS, v)["status"]["qosClass"], "Burstable");
    }

    #[test]
    fn scheduling_gated_pods_get_a_condition() {
        let mut v = pod();
        v["spec"]["schedulingGates"] = json!([{"name":"wait"}]);
        let p = created(&PODS, v);
        assert_eq!(p["status"]["conditions"][0]["reason"], "SchedulingGated");
    }

    #[test]
    fn valid_pod_passes() {
        assert!(validate_create(&PODS, &created(&PODS, pod())).is_empty());
    }

    #[test]
    fn invalid_sysctl_names_are_refused_and_valid_ones_pass_as_in_kubernetes() {
        let mut v = pod();
        v["spec"]["securityContext"] = json!({"sysctls": [
            {"name": "foo-", "value": "bar"}, {"name": "kernel.shmmax", "value": "1"},
            {"name": "safe-and-unsafe", "value": "1"}, {"name": "bar..", "value": "42"},
            {"name": "net/ipv4/ip_forward", "value": "1"}, {"name": "kernel.shmmax", "value": "2"}]});
        let pattern = r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";
        assert_eq!(
            msgs(&validate_create(&PODS, &created(&PODS, v))),
            vec![
                format!(
                    "spec.securityContext.sysctls[0].name: Invalid value: \"foo-\": must have at most 253 characters and match regex {pattern}"
                ),
                format!(
                    "spec.securityContext.sysctls[3].name: Invalid value: \"bar..\": must have at most 253 characters and match regex {pattern}"
                ),
                "spec.securityContext.sysctls[5].name: Duplicate value: \"kernel.shmmax\"".to_string(),
            ]
        );
    }

    #[test]
    fn pod_without_containers_is_invalid() {
        let v = json!({"metadata":{"name":"p","namespace":"default"},"spec":{"containers":[]}});
        assert_eq!(msgs(&validate_create(&PODS, &created(&PODS, v))), vec!["spec.containers: Required value"]);
    }

    #[test]
    fn container_image_is_required() {
        let mut v = pod();
        v["spec"]["containers"][0].as_object_mut().unwrap().remove("image");
        assert_eq!(msgs(&validate_create(&PODS, &created(&PODS, v))), vec!["spec.containers[0].image: Required value"]);
    }

    #[test]
    fn container_names_must_be_unique_labels() {
        let mut v = pod();
        v["spec"]["containers"] = json!([{"name":"c","image":"a"},{"name":"c","image":"b"},{"name":"Bad","image":"c"}]);
        v["spec"]["initContainers"] = json!([{"name":"c","image":"i"}]);
        let m = msgs(&validate_create(&PODS, &created(&PODS, v)));
        assert!(m.contains(&"spec.containers[1].name: Duplicate value: \"c\"".to_string()), "{m:?}");
        assert!(m.contains(&"spec.initContainers[0].name: Duplicate value: \"c\"".to_string()), "{m:?}");
        assert!(
            m.iter()
                .any(|e| e.starts_with("spec.containers[2].name: Invalid value: \"Bad\": a lowercase RFC 1123 label"))
        );
    }

    #[test]
    fn bad_policies_ports_and_grace_period_are_reported() {
        let mut v = pod();
        v["spec"]["restartPolicy"] = json!("Sometimes");
        v["spec"]["dnsPolicy"] = json!("Weird");
        v["spec"]["terminationGracePeriodSeconds"] = json!(-1);
        v["spec"]["containers"][0]["ports"] = json!([{"containerPort": 70000}]);
        let m = msgs(&validate_create(&PODS, &created(&PODS, v)));
        assert!(m.contains(&"spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive".to_string()), "{m:?}");
        assert!(m.contains(&"spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"".to_string()));
        assert!(m.contains(&"spec.dnsPolicy: Unsupported value: \"Weird\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"".to_string()));
        assert!(m.contains(
            &"spec.terminationGracePeriodSeconds: Invalid value: -1: must be greater than or equal to 0".to_string()
        ));
    }

    #[test]
    fn requests_above_limits_and_negative_quantities_are_invalid() {
        let mut v = pod();
        v["spec"]["containers"][0]["resources"] = json!({"limits":{"cpu":"1"},"requests":{"cpu":"2","memory":"-1"}});
        let m = msgs(&validate_create(&PODS, &created(&PODS, v)));
        assert!(m.contains(&"spec.containers[0].resources.requests[cpu]: Invalid value: \"2\": must be less than or equal to cpu limit of 1".to_string()), "{m:?}");
        assert!(m.contains(&"spec.containers[0].resources.requests[memory]: Invalid value: \"-1\": must be greater than or equal to 0".to_string()));
    }

    #[test]
    fn node_and_runtime_class_names_must_be_subdomains() {
        let mut v = pod();
        v["spec"]["nodeName"] = json!("Node_1");
        v["spec"]["runtimeClassName"] = json!("Fast!");
        let m = msgs(&validate_create(&PODS, &created(&PODS, v)));
        assert!(
            m.iter().any(|e| e.starts_with("spec.nodeName: Invalid value: \"Node_1\": a lowercase RFC 1123 subdomain"))
        );
        assert!(
            m.iter()
                .any(|e| e
                    .starts_with("spec.runtimeClassName: Invalid value: \"Fast!\": a lowercase RFC 1123 subdomain"))
        );
    }

    #[test]
    fn pod_tolerations_are_validated() {
        let mut v = pod();
        v["spec"]["tolerations"] = json!([{"key":"k","operator":"Exists","value":"v"}]);
        let m = msgs(&validate_create(&PODS, &created(&PODS, v)));
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("spec.tolerations[0].operator: Invalid value: {"));
        assert!(m[0].ends_with("value must be empty when `operator` is 'Exists'"));
    }

    #[test]
    fn pod_update_changing_image_is_allowed() {
        let old = created(&PODS, pod());
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("nginx:1.26");
        new["spec"]["tolerations"] = json!([{"key":"k","operator":"Exists"}]);
        prepare_for_update(&PODS, &mut new, &old);
        assert!(validate_update(&PODS, &new, &old).is_empty());
    }

    #[test]
    fn pod_update_of_other_fields_is_forbidden_with_kubernetes_message() {
        let old = created(&PODS, pod());
        let mut new = old.clone();
        new["spec"]["restartPolicy"] = json!("Never");
        prepare_for_update(&PODS, &mut new, &old);
        assert_eq!(msgs(&validate_update(&PODS, &new, &old)), vec![format!("spec: Forbidden: {POD_UPDATE_FORBIDDEN}")]);
        assert!(
            POD_UPDATE_FORBIDDEN
                .starts_with("pod updates may not change fields other than `spec.containers[*].image`,")
        );
    }

    #[test]
    fn pod_update_may_not_set_or_change_node_name() {
        let old = created(&PODS, pod());
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!("n1");
        prepare_for_update(&PODS, &mut new, &old);
        assert_eq!(validate_update(&PODS, &new, &old)[0].field, "spec");
    }

    #[test]
    fn pod_update_may_not_remove_tolerations_or_containers() {
        let mut base = pod();
        base["spec"]["tolerations"] = json!([{"key":"k","operator":"Exists"}]);
        let old = created(&PODS, base);
        let mut new = old.clone();
        new["spec"]["tolerations"] = json!([]);
        prepare_for_update(&PODS, &mut new, &old);
        let m = msgs(&validate_update(&PODS, &new, &old));
        assert_eq!(
            m,
            vec!["spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds"]
        );
        let mut fewer = old.clone();
        fewer["spec"]["containers"] = json!([]);
        let m = msgs(&validate_update(&PODS, &fewer, &old));
        assert!(m.contains(&"spec.containers: Forbidden: pod updates may not add or remove containers".to_string()));
    }

    #[test]
    fn pod_update_keeps_the_old_priority_and_generation() {
        let mut old = created(&PODS, pod());
        old["metadata"]["generation"] = json!(3);
        let mut new = pod();
        new["metadata"]["generation"] = json!(9);
        prepare_for_update(&PODS, &mut new, &old);
        assert_eq!(new["spec"]["priority"], 0);
        assert_eq!(new["metadata"]["generation"], 3);
        assert!(validate_update(&PODS, &new, &old).is_empty(), "{:?}", validate_update(&PODS, &new, &old));
    }

    #[test]
    fn namespace_gets_finalizer_phase_and_name_label() {
        let ns = created(&NAMESPACES, json!({"metadata":{"name":"team-a"}}));
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "team-a");
        assert!(validate_create(&NAMESPACES, &ns).is_empty());
        let bad = created(&NAMESPACES, json!({"metadata":{"name":"a.b"}}));
        assert_eq!(
            msgs(&validate_create(&NAMESPACES, &bad)),
            vec!["metadata.name: Invalid value: \"a.b\": must not contain dots"]
        );
    }

    #[test]
    fn namespace_update_keeps_finalizers() {
        let old = created(&NAMESPACES, json!({"metadata":{"name":"a"}}));
        let mut new = json!({"metadata":{"name":"a"},"spec":{"finalizers":[]}});
        prepare_for_update(&NAMESPACES, &mut new, &old);
        assert_eq!(new["spec"]["finalizers"], json!(["kubernetes"]));
    }

    #[test]
    fn config_map_keys_must_be_valid() {
        let cm = json!({"metadata":{"name":"c","namespace":"d"},"data":{"a/b":"x","ok":"y"}});
        let m = msgs(&validate_create(&CONFIGMAPS, &cm));
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("data[a/b]: Invalid value: \"a/b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"), "{}", m[0]);
    }

    #[test]
    fn immutable_config_map_data_cannot_change() {
        let old = json!({"metadata":{"name":"c","namespace":"d"},"data":{"a":"1"},"immutable":true});
        let mut new = old.clone();
        new["data"]["a"] = json!("2");
        assert_eq!(
            msgs(&validate_update(&CONFIGMAPS, &new, &old)),
            vec!["data: Forbidden: field is immutable when `immutable` is set"]
        );
    }

    #[test]
    fn secret_defaults_to_opaque_and_folds_string_data() {
        let s = created(&SECRETS, json!({"metadata":{"name":"s","namespace":"d"},"stringData":{"k":"v"}}));
        assert_eq!(s["type"], "Opaque");
        assert_eq!(s["data"]["k"], "dg==");
        assert!(s.get("stringData").is_none());
        assert!(validate_create(&SECRETS, &s).is_empty());
    }

    #[test]
    fn immutable_secret_data_cannot_change_and_type_is_fixed() {
        let old =
            created(&SECRETS, json!({"metadata":{"name":"s","namespace":"d"},"data":{"k":"dg=="},"immutable":true}));
        let mut new = old.clone();
        new["data"]["k"] = json!("dw==");
        new["type"] = json!("kubernetes.io/tls");
        let m = msgs(&validate_update(&SECRETS, &new, &old));
        assert!(m.contains(&"type: Invalid value: \"kubernetes.io/tls\": field is immutable".to_string()));
        assert!(m.contains(&"data: Forbidden: field is immutable when `immutable` is set".to_string()));
        assert!(m.contains(&"data[tls.crt]: Required value".to_string()));
    }

    #[test]
    fn runtime_class_handler_is_required_and_immutable() {
        let rc = json!({"metadata":{"name":"rc"},"handler":""});
        assert_eq!(msgs(&validate_create(&RUNTIMECLASSES, &rc)), vec!["handler: Required value"]);
        let old = json!({"metadata":{"name":"rc"},"handler":"runc"});
        let new = json!({"metadata":{"name":"rc"},"handler":"x"});
        assert_eq!(
            msgs(&validate_update(&RUNTIMECLASSES, &new, &old)),
            vec!["handler: Invalid value: \"x\": field is immutable"]
        );
        let bad = json!({"metadata":{"name":"rc"},"handler":"Run.C"});
        assert!(
            msgs(&validate_create(&RUNTIMECLASSES, &bad))[0]
                .starts_with("handler: Invalid value: \"Run.C\": a lowercase RFC 1123 label")
        );
    }

    #[test]
    fn runtime_class_overhead_and_scheduling_are_validated() {
        let rc = json!({"metadata":{"name":"rc"},"handler":"kata",
            "overhead":{"podFixed":{"cpu":"-1"}},
            "scheduling":{"nodeSelector":{"a":"b c"},"tolerations":[{"key":"k","effect":"Never"}]}});
        let m = msgs(&validate_create(&RUNTIMECLASSES, &rc));
        assert!(
            m.contains(
                &"overhead.podFixed[cpu]: Invalid value: \"-1\": must be greater than or equal to 0".to_string()
            ),
            "{m:?}"
        );
        assert!(m.iter().any(|e| e.starts_with("scheduling.nodeSelector: Invalid value: \"b c\"")));
        assert!(m.iter().any(|e| e.starts_with("scheduling.tolerations[0].effect: Unsupported value: \"Never\"")));
    }

    fn deployment() -> Value {
        json!({"metadata":{"name":"d","namespace":"default"},"spec":{
            "selector":{"matchLabels":{"app":"web"}},
            "template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}}})
    }

    #[test]
    fn deployment_defaults_and_generation() {
        let d = created(&DEPLOYMENTS, deployment());
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type":"RollingUpdate","rollingUpdate":{"maxSurge":"25%","maxUnavailable":"25%"}})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert!(d["spec"]["template"]["spec"].get("enableServiceLinks").is_none());
        assert_eq!(d["metadata"]["generation"], 1);
        assert!(validate_create(&DEPLOYMENTS, &d).is_empty(), "{:?}", validate_create(&DEPLOYMENTS, &d));

        let mut same = deployment();
        prepare_for_update(&DEPLOYMENTS, &mut same, &d);
        assert_eq!(same["metadata"]["generation"], 1);
        let mut scaled = deployment();
        scaled["spec"]["replicas"] = json!(3);
        prepare_for_update(&DEPLOYMENTS, &mut scaled, &d);
        assert_eq!(scaled["metadata"]["generation"], 2);
    }

    fn replication_controller() -> Value {
        json!({"metadata":{"name":"rc","namespace":"default"},"spec":{
            "template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}}})
    }

    #[test]
    fn a_replication_controller_takes_its_selector_and_labels_from_the_template_and_one_replica() {
        let rc = created(&REPLICATIONCONTROLLERS, replication_controller());
        assert_eq!(rc["spec"]["replicas"], 1);
        assert_eq!(rc["spec"]["selector"], json!({"app":"web"}));
        assert_eq!(rc["metadata"]["labels"], json!({"app":"web"}));
        assert_eq!(rc["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(rc["status"], json!({"replicas": 0}));
        assert_eq!(rc["metadata"]["generation"], 1);
        assert!(validate_create(&REPLICATIONCONTROLLERS, &rc).is_empty());

        let mut own = replication_controller();
        own["metadata"]["labels"] = json!({"team":"a"});
        own["spec"]["selector"] = json!({"app":"web"});
        own["spec"]["template"]["metadata"]["labels"] = json!({"app":"web","tier":"front"});
        let own = created(&REPLICATIONCONTROLLERS, own);
        assert_eq!(own["metadata"]["labels"], json!({"team":"a"}), "set labels are kept");
        assert_eq!(own["spec"]["selector"], json!({"app":"web"}), "a set selector is kept");
    }

    #[test]
    fn a_replication_controller_selector_must_match_its_template_labels_and_replicas_not_be_negative() {
        let mut v = replication_controller();
        v["spec"]["selector"] = json!({"app":"db"});
        v["spec"]["replicas"] = json!(-1);
        let m = msgs(&validate_create(&REPLICATIONCONTROLLERS, &created(&REPLICATIONCONTROLLERS, v)));
        assert_eq!(
            m,
            vec![
                "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
                "spec.template.metadata.labels: Invalid value: {\"app\":\"web\"}: `selector` does not match template `labels`",
            ]
        );
        let mut no_labels = replication_controller();
        no_labels["spec"]["template"]["metadata"] = json!({});
        let m = msgs(&validate_create(&REPLICATIONCONTROLLERS, &created(&REPLICATIONCONTROLLERS, no_labels)));
        assert_eq!(m, vec!["spec.selector: Required value"]);
    }

    #[test]
    fn a_replication_controller_update_may_change_its_selector_and_moves_the_generation() {
        let old = created(&REPLICATIONCONTROLLERS, replication_controller());
        let mut new = old.clone();
        new["spec"]["selector"] = json!({"app":"web2"});
        new["spec"]["template"]["metadata"]["labels"] = json!({"app":"web2"});
        prepare_for_update(&REPLICATIONCONTROLLERS, &mut new, &old);
        assert_eq!(new["metadata"]["generation"], 2);
        assert!(validate_update(&REPLICATIONCONTROLLERS, &new, &old).is_empty());
    }

    #[test]
    fn a_pod_template_gets_pod_defaults_and_its_pod_spec_validated() {
        let pt = json!({"metadata":{"name":"t","namespace":"default"},
            "template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"nginx"}]}}});
        let pt = created(&PODTEMPLATES, pt);
        assert_eq!(pt["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(pt["template"]["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert!(validate_create(&PODTEMPLATES, &pt).is_empty(), "{:?}", validate_create(&PODTEMPLATES, &pt));
        let empty = created(&PODTEMPLATES, json!({"metadata":{"name":"t","namespace":"default"},"template":{}}));
        let m = msgs(&validate_create(&PODTEMPLATES, &empty));
        assert!(m.iter().any(|e| e.starts_with("template.spec.containers: Required value")), "{m:?}");
    }

    #[test]
    fn selector_must_match_template_labels() {
        let mut v = deployment();
        v["spec"]["template"]["metadata"]["labels"] = json!({"app":"db"});
        let m = msgs(&validate_create(&DEPLOYMENTS, &created(&DEPLOYMENTS, v)));
        assert_eq!(
            m,
            vec![
                "spec.template.metadata.labels: Invalid value: {\"app\":\"db\"}: `selector` does not match template `labels`"
            ]
        );
    }

    #[test]
    fn selector_is_required_and_non_empty() {
        let mut missing = deployment();
        missing["spec"].as_object_mut().unwrap().remove("selector");
        // Only a body that never went through a typed round trip can lack the field.
        let m = msgs(&validate_create(&DEPLOYMENTS, &missing));
        assert!(m.contains(&"spec.selector: Required value".to_string()), "{m:?}");
        let mut empty = deployment();
        empty["spec"]["selector"] = json!({});
        let m = msgs(&validate_create(&REPLICASETS, &created(&REPLICASETS, empty)));
        assert!(
            m.contains(&"spec.selector: Invalid value: {}: empty selector is invalid for deployment".to_string()),
            "{m:?}"
        );
    }

    #[test]
    fn selector_is_immutable_on_update() {
        let old = created(&REPLICASETS, deployment());
        let mut new = deployment();
        new["spec"]["selector"] = json!({"matchLabels":{"app":"web","v":"2"}});
        new["spec"]["template"]["metadata"]["labels"] = json!({"app":"web","v":"2"});
        prepare_for_update(&REPLICASETS, &mut new, &old);
        assert_eq!(
            msgs(&validate_update(&REPLICASETS, &new, &old)),
            vec!["spec.selector: Invalid value: {\"matchLabels\":{\"app\":\"web\",\"v\":\"2\"}}: field is immutable"]
        );
        assert_eq!(new["metadata"]["generation"], 2);
    }

    #[test]
    fn workload_templates_must_restart_always() {
        let mut v = deployment();
        v["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        let m = msgs(&validate_create(&DEPLOYMENTS, &created(&DEPLOYMENTS, v)));
        assert_eq!(
            m,
            vec!["spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\""]
        );
    }

    #[test]
    fn rolling_update_may_not_be_all_zero() {
        let mut v = deployment();
        v["spec"]["strategy"] = json!({"type":"RollingUpdate","rollingUpdate":{"maxSurge":0,"maxUnavailable":0}});
        let m = msgs(&validate_create(&DEPLOYMENTS, &created(&DEPLOYMENTS, v)));
        assert_eq!(
            m,
            vec!["spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0"]
        );
    }

    #[test]
    fn lease_duration_must_be_positive() {
        let l = json!({"metadata":{"name":"l","namespace":"d"},"spec":{"leaseDurationSeconds":0}});
        assert_eq!(
            msgs(&validate_create(&LEASES, &l)),
            vec!["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"]
        );
    }

    #[test]
    fn trivial_kinds_check_metadata_only() {
        assert!(validate_create(&SERVICEACCOUNTS, &json!({"metadata":{"name":"sa","namespace":"d"}})).is_empty());
        assert_eq!(
            msgs(&validate_create(&SERVICEACCOUNTS, &json!({"metadata":{"name":"sa"}}))),
            vec!["metadata.namespace: Required value"]
        );
        let ev = json!({"metadata":{"name":"e.1","namespace":"d"},"involvedObject":{"kind":"Pod"}});
        assert!(validate_create(&EVENTS, &ev).is_empty());
    }

    #[test]
    fn node_taints_and_provider_id_are_checked() {
        let n = json!({"metadata":{"name":"n1"},"spec":{"taints":[{"key":"k","effect":""}],"providerID":"aws://1"}});
        assert_eq!(msgs(&validate_create(&NODES, &n)), vec!["spec.taints[0].effect: Required value"]);
        let old = json!({"metadata":{"name":"n1"},"spec":{"providerID":"aws://1"}});
        let new = json!({"metadata":{"name":"n1"},"spec":{"providerID":"aws://2"}});
        assert_eq!(
            msgs(&validate_update(&NODES, &new, &old)),
            vec!["spec.providerID: Forbidden: node updates may not change providerID except from \"\" to valid"]
        );
    }

    #[test]
    fn pod_field_set_has_kubernetes_fields() {
        let mut p = created(&PODS, pod());
        p["spec"]["nodeName"] = json!("n1");
        p["status"]["podIPs"] = json!([{"ip":"10.0.0.5"}]);
        let f = field_set(&PODS, &p);
        assert_eq!(f["metadata.name"], "p");
        assert_eq!(f["metadata.namespace"], "default");
        assert_eq!(f["spec.nodeName"], "n1");
        assert_eq!(f["spec.restartPolicy"], "Always");
        assert_eq!(f["status.phase"], "Pending");
        assert_eq!(f["status.podIP"], "10.0.0.5");
        assert_eq!(f["spec.hostNetwork"], "false");
        let supported: BTreeSet<&str> = supported_fields(&PODS).iter().copied().collect();
        assert!(f.keys().all(|k| supported.contains(k.as_str())));
    }

    #[test]
    fn other_kinds_expose_their_fields() {
        let n = field_set(&NODES, &json!({"metadata":{"name":"n"},"spec":{"unschedulable":true}}));
        assert_eq!(n["spec.unschedulable"], "true");
        assert!(!n.contains_key("metadata.namespace"));
        let s = field_set(&SECRETS, &json!({"metadata":{"name":"s","namespace":"d"},"type":"Opaque"}));
        assert_eq!(s["type"], "Opaque");
        let ns = field_set(&NAMESPACES, &json!({"metadata":{"name":"x"},"status":{"phase":"Terminating"}}));
        assert_eq!(ns["status.phase"], "Terminating");
        assert_eq!(supported_fields(&LEASES), &["metadata.name", "metadata.namespace"]);
        assert_eq!(supported_fields(&RUNTIMECLASSES), &["metadata.name"]);
    }

    #[test]
    fn events_convert_between_views_and_name_fields_after_their_view() {
        let core_ev = json!({"apiVersion":"v1","kind":"Event","metadata":{"name":"e","namespace":"d"},
            "involvedObject":{"kind":"Pod","name":"p","namespace":"d","uid":"u1"},
            "message":"pulled","reason":"Pulled","type":"Normal","count":3,
            "source":{"component":"kubelet","host":"n1"},"reportingComponent":"kubelet","reportingInstance":"n1",
            "firstTimestamp":"2024-01-01T00:00:00Z","lastTimestamp":"2024-01-01T00:01:00Z"});
        let v1 = event_core_to_v1(&core_ev);
        assert_eq!(v1["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v1["regarding"]["name"], "p");
        assert_eq!(v1["note"], "pulled");
        assert_eq!(v1["deprecatedCount"], 3);
        assert_eq!(v1["deprecatedSource"]["component"], "kubelet");
        assert_eq!(v1["reportingController"], "kubelet");
        assert_eq!(v1["deprecatedFirstTimestamp"], "2024-01-01T00:00:00Z");
        assert!(decode::<events::Event>(&v1).is_some());
        assert_eq!(event_v1_to_core(&v1), core_ev);

        let f_core = field_set(&EVENTS, &core_ev);
        assert_eq!(f_core["involvedObject.name"], "p");
        assert_eq!(f_core["reportingComponent"], "kubelet");
        let f_v1 = field_set(&EVENTS_V1, &v1);
        assert_eq!(f_v1["regarding.name"], "p");
        assert_eq!(f_v1["regarding.uid"], "u1");
        assert_eq!(f_v1["source"], "kubelet");
        assert_eq!(f_v1["reportingController"], "kubelet");
        assert_eq!(f_v1["type"], "Normal");
        // Both views offer exactly the field labels they support.
        for (rt, set) in [(&EVENTS, &f_core), (&EVENTS_V1, &f_v1)] {
            let names: BTreeSet<&str> = set.keys().map(String::as_str).collect();
            assert_eq!(names, supported_fields(rt).iter().copied().collect(), "{}", rt.group);
        }
    }

    #[test]
    fn an_event_without_a_source_is_selected_by_source_as_its_reporting_controller() {
        let ev = json!({"metadata":{"name":"e","namespace":"d"},"involvedObject":{"kind":"Pod","name":"p"},
            "reportingComponent":"berth-scheduler","reportingInstance":"s1","reason":"Scheduled","type":"Normal"});
        assert_eq!(field_set(&EVENTS, &ev)["source"], "berth-scheduler");
        assert_eq!(field_set(&EVENTS_V1, &event_core_to_v1(&ev))["source"], "berth-scheduler");
        let mut with_source = ev.clone();
        with_source["source"] = json!({"component": "kubelet"});
        assert_eq!(field_set(&EVENTS, &with_source)["source"], "kubelet");
    }

    #[test]
    fn events_take_no_garbage_collection_finalizers_and_workloads_default_to_background() {
        assert_eq!(garbage_collection_policy(&EVENTS), GarbageCollectionPolicy::Unsupported);
        assert_eq!(garbage_collection_policy(&EVENTS_V1), GarbageCollectionPolicy::Unsupported);
        for rt in [&DEPLOYMENTS, &REPLICASETS, &PODS, &CONFIGMAPS, &NAMESPACES] {
            assert_eq!(garbage_collection_policy(rt), GarbageCollectionPolicy::DeleteDependents, "{}", rt.plural);
        }
    }

    #[test]
    fn a_services_or_ingresss_status_update_takes_metadata_but_keeps_the_stored_spec() {
        use crate::resources::{INGRESSES, SERVICES};
        for rt in [&SERVICES, &INGRESSES] {
            assert!(status_update_takes_metadata(rt), "{}", rt.kind);
            let old = serde_json::json!({"metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}});
            let mut new = serde_json::json!({"metadata": {"name": "a", "annotations": {"patchedstatus": "true"}},
                "spec": {"ports": [{"port": 81}]}, "status": {"loadBalancer": {}}});
            prepare_for_status_update(rt, &mut new, &old);
            assert_eq!(new["spec"], old["spec"], "{}", rt.kind);
            assert_eq!(new["metadata"]["annotations"]["patchedstatus"], "true");
        }
        assert!(!status_update_takes_metadata(&crate::resources::PODS));
    }
}
