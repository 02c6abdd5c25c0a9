//! Services: kube-apiserver's defaulting and validation of core/v1 Services, the service
//! address and node port ranges, and the addresses allocation fills in. Pure functions; the
//! store-backed allocator lives in the API server.
//!
//! Only single-stack IPv4 is served: `ipFamilies` is `[IPv4]` and `ipFamilyPolicy`
//! `SingleStack` for every Service that has a cluster IP (headless ones included), as
//! kube-apiserver does on a single-stack IPv4 cluster.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::FieldError;
use crate::validation::{
    inclusive_range_error, invalid_each, is_dns1123_subdomain, is_valid_port_name, validate_object_meta,
    validate_object_meta_update,
};

pub const CLUSTER_IP: &str = "ClusterIP";
pub const NODE_PORT: &str = "NodePort";
pub const LOAD_BALANCER: &str = "LoadBalancer";
pub const EXTERNAL_NAME: &str = "ExternalName";
/// `clusterIP: None`: a headless Service.
pub const NONE: &str = "None";

const TYPES: &[&str] = &[CLUSTER_IP, EXTERNAL_NAME, LOAD_BALANCER, NODE_PORT];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const AFFINITIES: &[&str] = &["ClientIP", "None"];
const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];
const IP_FAMILY_POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
const DEFAULT_AFFINITY_TIMEOUT: i32 = 10800;

/// An IPv4 service address range such as `10.96.0.0/12`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpRange {
    network: u32,
    prefix: u8,
}

impl IpRange {
    /// Parses a CIDR; the address is masked to the network (`10.96.0.1/12` is `10.96.0.0/12`).
    pub fn parse(cidr: &str) -> Result<IpRange, String> {
        let (addr, prefix) = cidr.split_once('/').ok_or_else(|| format!("invalid CIDR address: {cidr}"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| format!("invalid CIDR address: {cidr} (only IPv4 is served)"))?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 30).ok_or_else(|| {
            format!("invalid CIDR address: {cidr} (the prefix must leave room for addresses: at most /30)")
        })?;
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        Ok(IpRange { network: u32::from(addr) & mask, prefix })
    }

    /// How many addresses can be handed out: all but the network and broadcast addresses.
    pub fn size(&self) -> u32 {
        (1u32 << (32 - self.prefix)) - 2
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.offset(ip).is_some()
    }

    /// The position of `ip` among the addresses that can be handed out.
    pub fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        let v = u32::from(ip);
        let off = v.wrapping_sub(self.network);
        (v >= self.network && off >= 1 && off <= self.size()).then(|| off - 1)
    }

    /// The address at `offset` (0 is the first usable address, the `kubernetes` Service's).
    pub fn nth(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.network + 1 + offset)
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.network), self.prefix)
    }
}

/// A node port range such as `30000-32767`, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub base: u16,
    pub last: u16,
}

impl PortRange {
    /// Parses `30000-32767` (or a single port).
    pub fn parse(s: &str) -> Result<PortRange, String> {
        let bad = || format!("invalid port range {s:?}: want <first>-<last>, such as 30000-32767");
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let base: u16 = a.trim().parse().map_err(|_| bad())?;
        let last: u16 = b.trim().parse().map_err(|_| bad())?;
        if base == 0 || last < base {
            return Err(bad());
        }
        Ok(PortRange { base, last })
    }

    pub fn size(&self) -> u32 {
        u32::from(self.last - self.base) + 1
    }

    pub fn contains(&self, port: i32) -> bool {
        port >= i32::from(self.base) && port <= i32::from(self.last)
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.base, self.last)
    }
}

pub fn type_of(svc: &core::Service) -> &str {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or(CLUSTER_IP)
}

/// Node ports are allocated for `NodePort` and `LoadBalancer` Services.
pub fn needs_node_ports(svc: &core::Service) -> bool {
    matches!(type_of(svc), NODE_PORT | LOAD_BALANCER)
}

/// A cluster IP is allocated for every type but `ExternalName`, unless the Service is headless.
pub fn needs_cluster_ip(svc: &core::Service) -> bool {
    type_of(svc) != EXTERNAL_NAME && !is_headless(svc)
}

pub fn is_headless(svc: &core::Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some(NONE)
}

/// The cluster IP asked for (`clusterIP`, else `clusterIPs[0]`), if any.
pub fn requested_cluster_ip(svc: &core::Service) -> Option<&str> {
    let spec = svc.spec.as_ref()?;
    spec.cluster_ip
        .as_deref()
        .filter(|s| !s.is_empty())
        .or_else(|| spec.cluster_ips.as_ref().and_then(|ips| ips.first()).map(String::as_str))
        .filter(|s| !s.is_empty())
}

/// kube-apiserver's defaults for a Service (`SetDefaults_Service` and the strategy's
/// `PrepareForCreate`): applied on create and on update.
pub fn default_service(svc: &mut core::Service) {
    let spec = svc.spec.get_or_insert_with(Default::default);
    let ty = spec.type_.get_or_insert_with(|| CLUSTER_IP.into()).clone();
    spec.session_affinity.get_or_insert_with(|| "None".into());
    if spec.session_affinity.as_deref() == Some("ClientIP") {
        let cfg = spec.session_affinity_config.get_or_insert_with(Default::default);
        let client = cfg.client_ip.get_or_insert_with(Default::default);
        client.timeout_seconds.get_or_insert(DEFAULT_AFFINITY_TIMEOUT);
    }
    for p in spec.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
        if p.target_port
            .as_ref()
            .is_none_or(|t| matches!(t, IntOrString::Int(0)) || *t == IntOrString::String(String::new()))
        {
            p.target_port = Some(IntOrString::Int(p.port));
        }
    }
    if ty != EXTERNAL_NAME {
        spec.internal_traffic_policy.get_or_insert_with(|| "Cluster".into());
    }
    if matches!(ty.as_str(), NODE_PORT | LOAD_BALANCER) {
        spec.external_traffic_policy.get_or_insert_with(|| "Cluster".into());
    }
    if ty == LOAD_BALANCER {
        spec.allocate_load_balancer_node_ports.get_or_insert(true);
    }
    // A single given clusterIP fills clusterIPs and the other way round.
    match (spec.cluster_ip.as_deref().filter(|s| !s.is_empty()), spec.cluster_ips.as_ref().filter(|l| !l.is_empty())) {
        (Some(ip), None) => spec.cluster_ips = Some(vec![ip.to_string()]),
        (None, Some(ips)) => spec.cluster_ip = Some(ips[0].clone()),
        _ => {}
    }
    if svc.status.is_none() {
        svc.status = Some(core::ServiceStatus { load_balancer: Some(Default::default()), ..Default::default() });
    }
}

/// The address fields once the cluster IP is known (allocated, `None`, or absent for
/// ExternalName): `clusterIP`, `clusterIPs`, `ipFamilies`, `ipFamilyPolicy`.
pub fn set_cluster_ip(svc: &mut core::Service, ip: Option<&str>) {
    let spec = svc.spec.get_or_insert_with(Default::default);
    match ip {
        Some(ip) => {
            spec.cluster_ip = Some(ip.to_string());
            spec.cluster_ips = Some(vec![ip.to_string()]);
            spec.ip_families = Some(vec!["IPv4".into()]);
            spec.ip_family_policy.get_or_insert_with(|| "SingleStack".into());
        }
        None => {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
            spec.ip_families = None;
            spec.ip_family_policy = None;
        }
    }
}

/// Kubernetes' message for a name that is not a DNS-1035 label.
const DNS1035_ERROR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// Service names are DNS-1035 labels: at most 63 characters, a letter first.
fn is_dns1035_label(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

fn port_name(p: &core::ServicePort) -> &str {
    p.name.as_deref().unwrap_or("")
}

fn validate_ports(svc: &core::Service, spec: &core::ServiceSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ports = spec.ports.as_deref().unwrap_or_default();
    let ty = type_of(svc);
    if ports.is_empty() && !is_headless(svc) && ty != EXTERNAL_NAME {
        errs.push(FieldError::required("spec.ports", ""));
    }
    let mut names = BTreeSet::new();
    let mut node_ports = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        let name = port_name(p);
        if ports.len() > 1 && name.is_empty() {
            errs.push(FieldError::required(format!("{path}.name"), ""));
        } else if !name.is_empty() {
            for m in crate::validation::is_dns1123_label(name) {
                errs.push(FieldError::invalid(format!("{path}.name"), name, m));
            }
            if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("{path}.name"), name));
            }
        }
        if !(1..=65535).contains(&p.port) {
            errs.push(FieldError::invalid_raw(
                format!("{path}.port"),
                p.port.to_string(),
                inclusive_range_error(1, 65535),
            ));
        }
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        if !PROTOCOLS.contains(&proto) {
            errs.push(FieldError::not_supported(format!("{path}.protocol"), proto, PROTOCOLS));
        }
        match &p.target_port {
            Some(IntOrString::Int(t)) if !(1..=65535).contains(t) => {
                errs.push(FieldError::invalid_raw(
                    format!("{path}.targetPort"),
                    t.to_string(),
                    inclusive_range_error(1, 65535),
                ));
            }
            Some(IntOrString::String(s)) => {
                errs.extend(invalid_each(&format!("{path}.targetPort"), s, is_valid_port_name(s)));
            }
            _ => {}
        }
        if let Some(np) = p.node_port.filter(|n| *n != 0) {
            if !needs_node_ports(svc) {
                errs.push(FieldError::forbidden(
                    format!("{path}.nodePort"),
                    "may not be used when `type` is 'ClusterIP'",
                ));
            } else if !(1..=65535).contains(&np) {
                errs.push(FieldError::invalid_raw(
                    format!("{path}.nodePort"),
                    np.to_string(),
                    inclusive_range_error(1, 65535),
                ));
            } else if !node_ports.insert((np, proto.to_string())) {
                errs.push(FieldError {
                    error_type: crate::ErrorType::Duplicate,
                    field: format!("{path}.nodePort"),
                    bad_value: Some(np.to_string()),
                    detail: String::new(),
                });
            }
        }
        if !seen.insert((p.port, proto.to_string())) {
            errs.push(FieldError {
                error_type: crate::ErrorType::Duplicate,
                field: format!("spec.ports[{i}]"),
                bad_value: Some(format!("core.ServicePort{{Name:{name:?}, Protocol:{proto:?}, Port:{}}}", p.port)),
                detail: String::new(),
            });
        }
    }
    errs
}

/// The IPs a client gave, checked for form (allocation checks the range later).
fn validate_cluster_ips(svc: &core::Service, spec: &core::ServiceSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ty = type_of(svc);
    let ips = spec.cluster_ips.as_deref().unwrap_or_default();
    if let (Some(ip), Some(first)) = (spec.cluster_ip.as_deref().filter(|s| !s.is_empty()), ips.first())
        && ip != first
    {
        errs.push(FieldError::invalid("spec.clusterIPs", first, "first value must match `clusterIP`"));
    }
    if ips.len() > 1 {
        errs.push(FieldError::invalid_raw(
            "spec.clusterIPs",
            format!("[]string{{{}}}", ips.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")),
            "only single-stack IPv4 is served: at most one value",
        ));
    }
    for (i, ip) in ips.iter().enumerate() {
        if ip == NONE {
            if ty != EXTERNAL_NAME && ty != CLUSTER_IP {
                errs.push(FieldError::invalid(
                    format!("spec.clusterIPs[{i}]"),
                    ip,
                    format!("may not be set to 'None' for {ty} services"),
                ));
            }
            continue;
        }
        if ip.parse::<std::net::IpAddr>().is_err() {
            errs.push(FieldError::invalid(
                format!("spec.clusterIPs[{i}]"),
                ip,
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ));
        }
    }
    errs
}

fn validate_spec(svc: &core::Service) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(spec) = svc.spec.as_ref() else {
        return vec![FieldError::required("spec", "")];
    };
    let ty = type_of(svc);
    if !TYPES.contains(&ty) {
        errs.push(FieldError::not_supported("spec.type", ty, TYPES));
    }
    if ty == EXTERNAL_NAME {
        match spec.external_name.as_deref().filter(|s| !s.is_empty()) {
            None => errs.push(FieldError::required("spec.externalName", "")),
            Some(name) => {
                let name = name.strip_suffix('.').unwrap_or(name);
                errs.extend(invalid_each("spec.externalName", name, is_dns1123_subdomain(name)));
            }
        }
        if spec.cluster_ip.as_deref().is_some_and(|ip| !ip.is_empty()) {
            errs.push(FieldError::forbidden("spec.clusterIPs", "may not be set for ExternalName services"));
        }
    } else {
        errs.extend(validate_cluster_ips(svc, spec));
    }
    errs.extend(validate_ports(svc, spec));
    let affinity = spec.session_affinity.as_deref().unwrap_or("None");
    if !AFFINITIES.contains(&affinity) {
        errs.push(FieldError::not_supported("spec.sessionAffinity", affinity, AFFINITIES));
    }
    if let Some(t) =
        spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref()).and_then(|c| c.timeout_seconds)
        && !(1..=86400).contains(&t)
    {
        errs.push(FieldError::invalid_raw(
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            t.to_string(),
            inclusive_range_error(1, 86400),
        ));
    }
    if let Some(p) = spec.internal_traffic_policy.as_deref()
        && !TRAFFIC_POLICIES.contains(&p)
    {
        errs.push(FieldError::not_supported("spec.internalTrafficPolicy", p, TRAFFIC_POLICIES));
    }
    if let Some(p) = spec.external_traffic_policy.as_deref().filter(|p| !p.is_empty()) {
        if !needs_node_ports(svc) {
            errs.push(FieldError::invalid(
                "spec.externalTrafficPolicy",
                p,
                "may only be set for externally-accessible services",
            ));
        } else if !TRAFFIC_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported("spec.externalTrafficPolicy", p, TRAFFIC_POLICIES));
        }
    }
    if let Some(p) = spec.ip_family_policy.as_deref()
        && !IP_FAMILY_POLICIES.contains(&p)
    {
        errs.push(FieldError::not_supported("spec.ipFamilyPolicy", p, IP_FAMILY_POLICIES));
    }
    for (i, f) in spec.ip_families.iter().flatten().enumerate() {
        if f != "IPv4" {
            errs.push(FieldError::not_supported(format!("spec.ipFamilies[{i}]"), f, &["IPv4"]));
        }
    }
    if let Some(sel) = &spec.selector {
        errs.extend(crate::validation::validate_labels(sel, "spec.selector"));
    }
    errs
}

/// Validation of a new Service: metadata (the name is a DNS label) and spec.
pub fn validate_service(svc: &core::Service) -> Vec<FieldError> {
    let mut errs = validate_object_meta(&svc.metadata, true, true);
    if let Some(name) = svc.metadata.name.as_deref().filter(|n| !n.is_empty())
        && !is_dns1035_label(name)
    {
        errs.retain(|e| !(e.field == "metadata.name" && e.error_type == crate::ErrorType::Invalid));
        errs.insert(0, FieldError::invalid("metadata.name", name, DNS1035_ERROR));
    }
    errs.extend(validate_spec(svc));
    errs
}

/// Validation of an update: the new Service is valid and its cluster IP is unchanged (unless it
/// becomes or stops being an ExternalName).
pub fn validate_service_update(new: &core::Service, old: &core::Service) -> Vec<FieldError> {
    let mut errs = validate_object_meta_update(&new.metadata, &old.metadata);
    errs.extend(validate_spec(new));
    let ips = |s: &core::Service| s.spec.as_ref().and_then(|s| s.cluster_ips.clone()).unwrap_or_default();
    let (new_ips, old_ips) = (ips(new), ips(old));
    if type_of(new) != EXTERNAL_NAME && type_of(old) != EXTERNAL_NAME && !old_ips.is_empty() && new_ips != old_ips {
        let shown = format!("[]string{{{}}}", new_ips.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", "));
        errs.push(FieldError::invalid_raw("spec.clusterIPs[0]", shown, "may not change once set"));
    }
    errs
}

/// What an update keeps from the stored Service when the client left it out, as kube-apiserver's
/// `patchAllocatedValues`: the cluster IPs (unless the type becomes ExternalName) and the node
/// ports of ports that still exist.
///
/// Then, as its `dropTypeDependentFields`, what the new type does not use is dropped if the
/// client left it as it was: the cluster IPs when becoming an ExternalName, the node ports and
/// `externalTrafficPolicy` when becoming a ClusterIP or ExternalName Service.
pub fn keep_allocated(new: &mut core::Service, old: &core::Service) {
    let old_spec = old.spec.clone().unwrap_or_default();
    let new_type = type_of(new).to_string();
    let spec = new.spec.get_or_insert_with(Default::default);
    if new_type == EXTERNAL_NAME && type_of(old) != EXTERNAL_NAME {
        if spec.cluster_ip == old_spec.cluster_ip {
            spec.cluster_ip = None;
        }
        if spec.cluster_ips == old_spec.cluster_ips {
            spec.cluster_ips = None;
        }
        if spec.ip_families == old_spec.ip_families {
            spec.ip_families = None;
        }
        if spec.ip_family_policy == old_spec.ip_family_policy {
            spec.ip_family_policy = None;
        }
        if spec.internal_traffic_policy == old_spec.internal_traffic_policy {
            spec.internal_traffic_policy = None;
        }
    }
    let old_had_node_ports = matches!(type_of(old), NODE_PORT | LOAD_BALANCER);
    if old_had_node_ports && !matches!(new_type.as_str(), NODE_PORT | LOAD_BALANCER) {
        let old_ports = old_spec.ports.clone().unwrap_or_default();
        for p in spec.ports.iter_mut().flatten() {
            let unchanged = old_ports.iter().any(|o| o.port == p.port && o.node_port == p.node_port);
            if unchanged {
                p.node_port = None;
            }
        }
        if spec.external_traffic_policy == old_spec.external_traffic_policy {
            spec.external_traffic_policy = None;
        }
    }
    if new_type != EXTERNAL_NAME && type_of(old) != EXTERNAL_NAME {
        if spec.cluster_ip.as_deref().is_none_or(str::is_empty) && spec.cluster_ips.as_ref().is_none_or(Vec::is_empty) {
            spec.cluster_ip = old_spec.cluster_ip.clone();
            spec.cluster_ips = old_spec.cluster_ips.clone();
        }
        if spec.ip_families.as_ref().is_none_or(Vec::is_empty) {
            spec.ip_families = old_spec.ip_families.clone();
        }
        if spec.ip_family_policy.is_none() {
            spec.ip_family_policy = old_spec.ip_family_policy.clone();
        }
    }
    if matches!(new_type.as_str(), NODE_PORT | LOAD_BALANCER) {
        let old_ports = old_spec.ports.unwrap_or_default();
        for p in spec.ports.iter_mut().flatten() {
            if p.node_port.is_some_and(|n| n != 0) {
                continue;
            }
            let same = old_ports.iter().find(|o| {
                o.port == p.port && o.protocol.as_deref().unwrap_or("TCP") == p.protocol.as_deref().unwrap_or("TCP")
            });
            if let Some(np) = same.and_then(|o| o.node_port) {
                p.node_port = Some(np);
            }
        }
    }
}

/// `kubectl get services`' PORT(S) cell: `80/TCP`, `80:30080/TCP`, comma-separated.
pub fn ports_cell(svc: &core::Service) -> String {
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
    if ports.is_empty() {
        return "<none>".into();
    }
    ports
        .iter()
        .map(|p| {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            match p.node_port.filter(|n| *n != 0) {
                Some(np) => format!("{}:{np}/{proto}", p.port),
                None => format!("{}/{proto}", p.port),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `kubectl get services`' EXTERNAL-IP cell.
pub fn external_ip_cell(svc: &core::Service) -> String {
    let spec = svc.spec.clone().unwrap_or_default();
    let external = spec.external_ips.unwrap_or_default();
    let lb: Vec<String> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|ing| ing.iter().filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone())).collect())
        .unwrap_or_default();
    match type_of(svc) {
        CLUSTER_IP | NODE_PORT if !external.is_empty() => external.join(","),
        CLUSTER_IP | NODE_PORT => "<none>".into(),
        LOAD_BALANCER => {
            let mut all = lb;
            all.extend(external);
            if all.is_empty() { "<pending>".into() } else { all.join(",") }
        }
        EXTERNAL_NAME => spec.external_name.unwrap_or_default(),
        _ => "<unknown>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> core::Service {
        serde_json::from_value(v).unwrap()
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn defaults_fill_type_affinity_protocol_target_port_and_traffic_policies() {
        let mut s = svc(
            json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}),
        );
        default_service(&mut s);
        let spec = s.spec.unwrap();
        assert_eq!(spec.session_affinity.as_deref(), Some("None"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].target_port, Some(IntOrString::Int(80)));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
        let mut c = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}}));
        default_service(&mut c);
        let spec = c.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.external_traffic_policy, None);
    }

    #[test]
    fn a_named_target_port_is_kept_and_client_ip_affinity_gets_the_default_timeout() {
        let mut s =
            svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"sessionAffinity": "ClientIP",
            "ports": [{"port": 80, "targetPort": "http"}]}}));
        default_service(&mut s);
        let spec = s.spec.unwrap();
        assert_eq!(spec.ports.unwrap()[0].target_port, Some(IntOrString::String("http".into())));
        let timeout = spec.session_affinity_config.unwrap().client_ip.unwrap().timeout_seconds;
        assert_eq!(timeout, Some(10800));
    }

    #[test]
    fn validation_reports_kubernetes_field_paths_and_messages() {
        let mut s = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"ports": [
            {"name": "http", "port": 0}, {"name": "http", "port": 81}]}}));
        default_service(&mut s);
        let m = messages(&validate_service(&s));
        assert!(
            m.contains(&"spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive".to_string()),
            "{m:?}"
        );
        assert!(m.contains(&"spec.ports[1].name: Duplicate value: \"http\"".to_string()), "{m:?}");
    }

    #[test]
    fn ports_are_required_unless_headless_or_external_name() {
        let mut s = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {}}));
        default_service(&mut s);
        assert_eq!(messages(&validate_service(&s)), ["spec.ports: Required value"]);
        let mut h = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterIP": "None"}}));
        default_service(&mut h);
        assert!(validate_service(&h).is_empty());
        let mut e = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"type": "ExternalName"}}));
        default_service(&mut e);
        assert_eq!(messages(&validate_service(&e)), ["spec.externalName: Required value"]);
    }

    #[test]
    fn several_ports_need_names_and_a_bad_cluster_ip_is_named() {
        let mut s = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterIP": "abc",
            "ports": [{"port": 80}, {"port": 81, "name": "b"}]}}));
        default_service(&mut s);
        let m = messages(&validate_service(&s));
        assert!(m.contains(&"spec.ports[0].name: Required value".to_string()), "{m:?}");
        assert!(
            m.contains(&"spec.clusterIPs[0]: Invalid value: \"abc\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".to_string()),
            "{m:?}"
        );
    }

    #[test]
    fn a_node_port_on_a_cluster_ip_service_is_forbidden() {
        let mut s = svc(
            json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"ports": [{"port": 80, "nodePort": 30001}]}}),
        );
        default_service(&mut s);
        assert_eq!(
            messages(&validate_service(&s)),
            ["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"]
        );
    }

    #[test]
    fn changing_the_cluster_ip_is_refused_and_leaving_it_out_keeps_it() {
        let mut old = svc(
            json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}}),
        );
        default_service(&mut old);
        let mut changed = svc(
            json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.6", "ports": [{"port": 80}]}}),
        );
        default_service(&mut changed);
        keep_allocated(&mut changed, &old);
        assert_eq!(
            messages(&validate_service_update(&changed, &old)),
            ["spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.6\"}: may not change once set"]
        );
        let mut omitted =
            svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}}));
        default_service(&mut omitted);
        keep_allocated(&mut omitted, &old);
        assert_eq!(omitted.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("10.96.0.5"));
        assert!(validate_service_update(&omitted, &old).is_empty());
    }

    #[test]
    fn ranges_exclude_the_network_and_broadcast_addresses() {
        let r = IpRange::parse("10.96.0.0/12").unwrap();
        assert_eq!(r.nth(0), Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(r.size(), (1 << 20) - 2);
        assert!(!r.contains(Ipv4Addr::new(10, 96, 0, 0)));
        assert!(!r.contains(Ipv4Addr::new(10, 111, 255, 255)));
        assert!(r.contains(Ipv4Addr::new(10, 111, 255, 254)));
        assert!(!r.contains(Ipv4Addr::new(10, 112, 0, 1)));
        assert_eq!(r.to_string(), "10.96.0.0/12");
        assert_eq!(PortRange::parse("30000-32767").unwrap().size(), 2768);
        assert!(PortRange::parse("32767-30000").is_err());
    }

    #[test]
    fn the_ports_cell_shows_node_ports() {
        let s = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"type": "NodePort",
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}}));
        assert_eq!(ports_cell(&s), "80:30080/TCP,53/UDP");
        assert_eq!(external_ip_cell(&s), "<none>");
    }

    #[test]
    fn becoming_cluster_ip_drops_untouched_node_ports_and_external_traffic_policy() {
        let mut old = svc(json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"type": "NodePort",
            "clusterIP": "10.96.0.5", "ports": [{"port": 80, "nodePort": 30001}]}}));
        default_service(&mut old);
        let mut new = old.clone();
        new.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        keep_allocated(&mut new, &old);
        default_service(&mut new);
        let spec = new.spec.as_ref().unwrap();
        assert_eq!(spec.ports.as_ref().unwrap()[0].node_port, None);
        assert_eq!(spec.external_traffic_policy, None);
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.5"));
        assert!(validate_service_update(&new, &old).is_empty(), "{:?}", validate_service_update(&new, &old));
    }

    #[test]
    fn becoming_an_external_name_drops_the_untouched_cluster_ip() {
        let mut old = svc(
            json!({"metadata": {"name": "a", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}}),
        );
        default_service(&mut old);
        set_cluster_ip(&mut old, Some("10.96.0.5"));
        let mut new = old.clone();
        new.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        new.spec.as_mut().unwrap().external_name = Some("example.com".into());
        keep_allocated(&mut new, &old);
        default_service(&mut new);
        assert_eq!(new.spec.as_ref().unwrap().cluster_ip, None);
        assert!(validate_service_update(&new, &old).is_empty(), "{:?}", validate_service_update(&new, &old));
    }

    #[test]
    fn a_service_name_must_start_with_a_letter() {
        let mut s =
            svc(json!({"metadata": {"name": "1abc", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}}));
        default_service(&mut s);
        let m = messages(&validate_service(&s));
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].starts_with("metadata.name: Invalid value: \"1abc\": a DNS-1035 label must consist of"), "{m:?}");
    }
}
