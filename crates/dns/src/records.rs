//! The pure index: Services and EndpointSlices in, DNS answers out. No IO, no clock.
//!
//! Names follow the Kubernetes DNS specification as CoreDNS's `kubernetes` plugin answers them
//! (`pods insecure` mode), under one zone (the cluster domain):
//!
//! | name                                     | answer                                                          |
//! |------------------------------------------|-----------------------------------------------------------------|
//! | `<svc>.<ns>.svc.<zone>`                  | ClusterIPs; ready endpoints if headless; CNAME if ExternalName  |
//! | `<host>.<svc>.<ns>.svc.<zone>`           | headless endpoint by hostname, or by dashed IP when it has none |
//! | `_<port>._<proto>.<svc>.<ns>.svc.<zone>` | SRV for a named port                                            |
//! | `<a-b-c-d>.<ns>.pod.<zone>`              | the IP spelled by the name, unchecked                           |
//! | `d.c.b.a.in-addr.arpa.`, `….ip6.arpa.`   | PTR for ClusterIPs and headless endpoint IPs                    |
//!
//! Lookups go through maps keyed by namespace and name; only a headless service's own endpoints
//! are scanned. Each change bumps the SOA serial.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// TTL of every answer and of the SOA's negative-caching minimum, as CoreDNS's default.
pub const TTL: u32 = 5;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `(namespace, name)` of an object.
pub type Key = (String, String);

/// What the index says about one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The name has records of the asked type; `additionals` are addresses of SRV targets.
    Records { answers: Vec<Record>, additionals: Vec<Record> },
    /// The name exists in the zone but has no record of the asked type (NOERROR, empty answer).
    NoData { soa: Record },
    /// The name is in the zone and does not exist.
    NxDomain { soa: Record },
    /// Not ours to answer: relay it upstream.
    NotInZone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    ClusterIp(Vec<IpAddr>),
    Headless,
    ExternalName(Name),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Port {
    name: String,
    /// Lower case, as it appears in SRV names.
    protocol: String,
    port: u16,
}

#[derive(Debug, Clone)]
struct ServiceEntry {
    kind: Kind,
    ports: Vec<Port>,
}

#[derive(Debug, Clone)]
struct EndpointEntry {
    ips: Vec<IpAddr>,
    hostname: Option<String>,
    ready: bool,
}

#[derive(Debug, Clone)]
struct SliceEntry {
    service: Option<String>,
    endpoints: Vec<EndpointEntry>,
    ports: Vec<Port>,
}

/// The cluster's DNS data, updated from watch events and queried per request.
#[derive(Debug)]
pub struct Records {
    zone: Name,
    zone_text: String,
    services: HashMap<Key, ServiceEntry>,
    slices: HashMap<Key, SliceEntry>,
    slices_by_service: HashMap<Key, BTreeSet<String>>,
    services_per_namespace: HashMap<String, usize>,
    ptr: HashMap<IpAddr, BTreeSet<Name>>,
    ptr_by_service: HashMap<Key, Vec<(IpAddr, Name)>>,
    serial: u32,
}

impl Records {
    /// An empty index for `zone` (e.g. `cluster.local`, with or without the trailing dot).
    pub fn new(zone: &str) -> Result<Records, hickory_proto::ProtoError> {
        let zone_text = zone.trim_end_matches('.').to_ascii_lowercase();
        // The root would claim every name and leave nothing to relay.
        if zone_text.is_empty() {
            return Err("the cluster zone must not be the root".into());
        }
        let zone = Name::from_ascii(format!("{zone_text}."))?;
        Ok(Records {
            zone,
            zone_text,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            services_per_namespace: HashMap::new(),
            ptr: HashMap::new(),
            ptr_by_service: HashMap::new(),
            serial: 1,
        })
    }

    /// The zone's apex name, lower case and fully qualified.
    pub fn zone(&self) -> &Name {
        &self.zone
    }

    /// Adds or replaces a Service.
    pub fn apply_service(&mut self, svc: &Service) {
        let Some(key) = key_of(&svc.metadata) else { return };
        match service_entry(svc) {
            Some(entry) => {
                if self.services.insert(key.clone(), entry).is_none() {
                    *self.services_per_namespace.entry(key.0.clone()).or_default() += 1;
                }
            }
            // An ExternalName without a valid target answers nothing, like a deleted Service.
            None => {
                self.delete_service(&key.0, &key.1);
                return;
            }
        }
        self.reindex_ptr(&key);
        self.bump();
    }

    /// Removes a Service; its EndpointSlices stay indexed for when it comes back.
    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if self.services.remove(&key).is_none() {
            return;
        }
        if let Some(n) = self.services_per_namespace.get_mut(namespace) {
            *n -= 1;
            if *n == 0 {
                self.services_per_namespace.remove(namespace);
            }
        }
        self.reindex_ptr(&key);
        self.bump();
    }

    /// Adds or replaces an EndpointSlice.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let Some(key) = key_of(&slice.metadata) else { return };
        let entry = slice_entry(slice);
        let new_service = entry.service.clone();
        let old = self.slices.insert(key.clone(), entry);
        let old_service = old.and_then(|o| o.service);
        if old_service != new_service
            && let Some(old_service) = old_service
        {
            self.unlink_slice(&key, &old_service);
        }
        if let Some(service) = new_service {
            let svc_key = (key.0.clone(), service);
            self.slices_by_service.entry(svc_key.clone()).or_default().insert(key.1.clone());
            self.reindex_ptr(&svc_key);
        }
        self.bump();
    }

    /// Removes an EndpointSlice.
    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(old) = self.slices.remove(&key) else { return };
        if let Some(service) = old.service {
            self.unlink_slice(&key, &service);
        }
        self.bump();
    }

    /// Drops every Service not in `keep`: what a relist no longer lists was deleted meanwhile.
    pub fn retain_services(&mut self, keep: &HashSet<Key>) {
        let gone: Vec<Key> = self.services.keys().filter(|k| !keep.contains(*k)).cloned().collect();
        for (ns, name) in gone {
            self.delete_service(&ns, &name);
        }
    }

    /// Drops every EndpointSlice not in `keep`.
    pub fn retain_slices(&mut self, keep: &HashSet<Key>) {
        let gone: Vec<Key> = self.slices.keys().filter(|k| !keep.contains(*k)).cloned().collect();
        for (ns, name) in gone {
            self.delete_slice(&ns, &name);
        }
    }

    /// The zone's SOA record, as CoreDNS shapes it.
    pub fn soa(&self) -> Record {
        let z = &self.zone_text;
        let mname = Name::from_ascii(format!("ns.dns.{z}.")).unwrap_or_else(|_| self.zone.clone());
        let rname = Name::from_ascii(format!("hostmaster.{z}.")).unwrap_or_else(|_| self.zone.clone());
        let soa = SOA::new(mname, rname, self.serial, 7200, 1800, 86400, TTL);
        Record::from_rdata(self.zone.clone(), TTL, RData::SOA(soa))
    }

    /// Answers one question. Matching ignores case; answer records carry `qname` as asked.
    pub fn answer(&self, qname: &Name, qtype: RecordType) -> Answer {
        let lower = qname.to_lowercase();
        if qtype == RecordType::PTR
            && let Some(answer) = self.reverse(qname, &lower)
        {
            return answer;
        }
        if !self.zone.zone_of(&lower) {
            return Answer::NotInZone;
        }
        let depth = lower.iter().count() - self.zone.iter().count();
        let labels: Option<Vec<&str>> = lower.iter().take(depth).map(|l| std::str::from_utf8(l).ok()).collect();
        let Some(labels) = labels else { return self.nxdomain() };
        match labels.as_slice() {
            [] if qtype == RecordType::SOA => records(vec![self.soa()], vec![]),
            [] | ["svc"] | ["pod"] => self.nodata(),
            [ns, "svc" | "pod"] => {
                if self.services_per_namespace.contains_key(*ns) {
                    self.nodata()
                } else {
                    self.nxdomain()
                }
            }
            [ip, _ns, "pod"] => self.pod(qname, ip, qtype),
            [svc, ns, "svc"] => self.service(qname, ns, svc, qtype),
            [proto, svc, ns, "svc"] if proto.starts_with('_') => self.proto_node(ns, svc, &proto[1..]),
            [host, svc, ns, "svc"] => self.endpoint(qname, ns, svc, host, qtype),
            [port, proto, svc, ns, "svc"] if port.starts_with('_') && proto.starts_with('_') => {
                self.named_port(qname, ns, svc, &port[1..], &proto[1..], qtype)
            }
            _ => self.nxdomain(),
        }
    }

    fn service(&self, qname: &Name, ns: &str, svc: &str, qtype: RecordType) -> Answer {
        let key = (ns.to_string(), svc.to_string());
        let Some(entry) = self.services.get(&key) else { return self.nxdomain() };
        let Some(fqdn) = self.service_name(ns, svc) else { return self.nxdomain() };
        match &entry.kind {
            Kind::ExternalName(target) => {
                // A CNAME stands in for every type at its name.
                let cname = Record::from_rdata(qname.clone(), TTL, RData::CNAME(CNAME(target.clone())));
                records(vec![cname], vec![])
            }
            Kind::ClusterIp(ips) => match qtype {
                RecordType::SRV => {
                    let ports = entry.ports.iter().map(|p| (fqdn.clone(), p.port));
                    let addresses = address_records(&fqdn, ips);
                    self.or_nodata(srv_records(qname, ports), addresses)
                }
                _ => self.or_nodata(addresses_of_type(qname, ips, qtype), vec![]),
            },
            Kind::Headless => match qtype {
                RecordType::SRV => {
                    let (srvs, additionals) = self.headless_srv(qname, &key, &fqdn, |_| true);
                    self.or_nodata(srvs, additionals)
                }
                _ => {
                    let ips: Vec<IpAddr> =
                        self.ready_endpoints(&key).flat_map(|(_, ep)| ep.ips.iter().copied()).collect();
                    self.or_nodata(addresses_of_type(qname, &dedup(ips), qtype), vec![])
                }
            },
        }
    }

    /// `_<proto>.<svc>.<ns>.svc.<zone>` exists as an empty node when some port uses that protocol.
    fn proto_node(&self, ns: &str, svc: &str, proto: &str) -> Answer {
        let key = (ns.to_string(), svc.to_string());
        let Some(entry) = self.services.get(&key) else { return self.nxdomain() };
        let in_spec = entry.ports.iter().any(|p| !p.name.is_empty() && p.protocol == proto);
        let in_slices = matches!(entry.kind, Kind::Headless)
            && self.slices_of(&key).any(|s| s.ports.iter().any(|p| !p.name.is_empty() && p.protocol == proto));
        if in_spec || in_slices { self.nodata() } else { self.nxdomain() }
    }

    fn endpoint(&self, qname: &Name, ns: &str, svc: &str, host: &str, qtype: RecordType) -> Answer {
        let key = (ns.to_string(), svc.to_string());
        match self.services.get(&key) {
            Some(ServiceEntry { kind: Kind::Headless, .. }) => {}
            _ => return self.nxdomain(),
        }
        let ips: Vec<IpAddr> = self
            .ready_endpoints(&key)
            .flat_map(|(_, ep)| ep.ips.iter().filter(move |ip| host_label(ep, ip) == host).copied())
            .collect();
        if ips.is_empty() {
            return self.nxdomain();
        }
        self.or_nodata(addresses_of_type(qname, &dedup(ips), qtype), vec![])
    }

    fn named_port(&self, qname: &Name, ns: &str, svc: &str, port: &str, proto: &str, qtype: RecordType) -> Answer {
        let key = (ns.to_string(), svc.to_string());
        let Some(entry) = self.services.get(&key) else { return self.nxdomain() };
        let Some(fqdn) = self.service_name(ns, svc) else { return self.nxdomain() };
        let wanted = |p: &Port| !p.name.is_empty() && p.name == port && p.protocol == proto;
        let in_spec = entry.ports.iter().any(wanted);
        // A Service with an address or an alias answers SRV from its own ports.
        let srv_to = |target: &Name, additionals| {
            if !in_spec {
                return self.nxdomain();
            }
            if qtype != RecordType::SRV {
                return self.nodata();
            }
            let ports = entry.ports.iter().filter(|p| wanted(p)).map(|p| (target.clone(), p.port));
            self.or_nodata(srv_records(qname, ports), additionals)
        };
        match &entry.kind {
            Kind::ClusterIp(ips) => srv_to(&fqdn, address_records(&fqdn, ips)),
            Kind::ExternalName(target) => srv_to(target, vec![]),
            Kind::Headless => {
                let in_slices = self.slices_of(&key).any(|s| s.ports.iter().any(wanted));
                if !in_spec && !in_slices {
                    return self.nxdomain();
                }
                if qtype != RecordType::SRV {
                    return self.nodata();
                }
                let (srvs, additionals) = self.headless_srv(qname, &key, &fqdn, wanted);
                self.or_nodata(srvs, additionals)
            }
        }
    }

    /// One SRV per ready endpoint name and matching slice port, with the endpoints' addresses.
    fn headless_srv(
        &self,
        qname: &Name,
        key: &Key,
        fqdn: &Name,
        wanted: impl Fn(&Port) -> bool,
    ) -> (Vec<Record>, Vec<Record>) {
        let mut targets: BTreeMap<(Name, u16), ()> = BTreeMap::new();
        let mut addresses: BTreeMap<Name, Vec<IpAddr>> = BTreeMap::new();
        for (slice, ep) in self.ready_endpoints(key) {
            for ip in &ep.ips {
                let Some(target) = Name::from_ascii(host_label(ep, ip)).ok().and_then(|h| h.append_domain(fqdn).ok())
                else {
                    continue;
                };
                let mut matched = false;
                for port in slice.ports.iter().filter(|p| wanted(p)) {
                    targets.insert((target.clone(), port.port), ());
                    matched = true;
                }
                if matched {
                    addresses.entry(target).or_default().push(*ip);
                }
            }
        }
        let srvs = srv_records(qname, targets.into_keys());
        let additionals = addresses.into_iter().flat_map(|(name, ips)| address_records(&name, &dedup(ips))).collect();
        (srvs, additionals)
    }

    fn pod(&self, qname: &Name, dashed: &str, qtype: RecordType) -> Answer {
        let v4 = dashed.replace('-', ".").parse::<Ipv4Addr>().map(IpAddr::V4);
        match v4.or_else(|_| dashed.replace('-', ":").parse::<Ipv6Addr>().map(IpAddr::V6)) {
            Ok(ip) => self.or_nodata(addresses_of_type(qname, &[ip], qtype), vec![]),
            Err(_) => self.nxdomain(),
        }
    }

    /// PTR for an address we know; `None` lets unknown addresses go upstream.
    fn reverse(&self, qname: &Name, lower: &Name) -> Option<Answer> {
        let net = lower.parse_arpa_name().ok()?;
        if net.prefix_len() != net.max_prefix_len() {
            return None;
        }
        let names = self.ptr.get(&net.addr())?;
        let answers =
            names.iter().map(|n| Record::from_rdata(qname.clone(), TTL, RData::PTR(PTR(n.clone())))).collect();
        Some(records(answers, vec![]))
    }

    fn ready_endpoints<'a>(&'a self, key: &Key) -> impl Iterator<Item = (&'a SliceEntry, &'a EndpointEntry)> + 'a {
        self.slices_of(key).flat_map(|s| s.endpoints.iter().filter(|e| e.ready).map(move |e| (s, e)))
    }

    fn slices_of<'a>(&'a self, key: &Key) -> impl Iterator<Item = &'a SliceEntry> + 'a {
        let ns = key.0.clone();
        self.slices_by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(move |name| self.slices.get(&(ns.clone(), name.clone())))
    }

    fn unlink_slice(&mut self, slice: &Key, service: &str) {
        let svc_key = (slice.0.clone(), service.to_string());
        if let Some(set) = self.slices_by_service.get_mut(&svc_key) {
            set.remove(&slice.1);
            if set.is_empty() {
                self.slices_by_service.remove(&svc_key);
            }
        }
        self.reindex_ptr(&svc_key);
    }

    /// Recomputes the reverse names one Service contributes.
    fn reindex_ptr(&mut self, key: &Key) {
        for (ip, name) in self.ptr_by_service.remove(key).unwrap_or_default() {
            if let Some(set) = self.ptr.get_mut(&ip) {
                set.remove(&name);
                if set.is_empty() {
                    self.ptr.remove(&ip);
                }
            }
        }
        let Some(entry) = self.services.get(key) else { return };
        let Some(fqdn) = self.service_name(&key.0, &key.1) else { return };
        let pairs: Vec<(IpAddr, Name)> = match &entry.kind {
            Kind::ClusterIp(ips) => ips.iter().map(|ip| (*ip, fqdn.clone())).collect(),
            Kind::Headless => self
                .ready_endpoints(key)
                .flat_map(|(_, ep)| {
                    ep.ips.iter().filter_map(|ip| {
                        let name = Name::from_ascii(host_label(ep, ip)).ok()?.append_domain(&fqdn).ok()?;
                        Some((*ip, name))
                    })
                })
                .collect(),
            Kind::ExternalName(_) => vec![],
        };
        for (ip, name) in &pairs {
            self.ptr.entry(*ip).or_default().insert(name.clone());
        }
        if !pairs.is_empty() {
            self.ptr_by_service.insert(key.clone(), pairs);
        }
    }

    fn service_name(&self, ns: &str, svc: &str) -> Option<Name> {
        Name::from_ascii(format!("{svc}.{ns}.svc.{}.", self.zone_text)).ok()
    }

    fn or_nodata(&self, answers: Vec<Record>, additionals: Vec<Record>) -> Answer {
        if answers.is_empty() { self.nodata() } else { records(answers, additionals) }
    }

    fn nodata(&self) -> Answer {
        Answer::NoData { soa: self.soa() }
    }

    fn nxdomain(&self) -> Answer {
        Answer::NxDomain { soa: self.soa() }
    }

    fn bump(&mut self) {
        self.serial = self.serial.wrapping_add(1).max(1);
    }
}

fn records(answers: Vec<Record>, additionals: Vec<Record>) -> Answer {
    Answer::Records { answers, additionals }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Key> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

fn service_entry(svc: &Service) -> Option<ServiceEntry> {
    let spec = svc.spec.as_ref()?;
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let target = spec.external_name.as_deref()?.trim_end_matches('.').to_ascii_lowercase();
        Kind::ExternalName(Name::from_ascii(format!("{target}.")).ok()?)
    } else if spec.cluster_ip.as_deref() == Some("None") {
        Kind::Headless
    } else {
        let listed = spec.cluster_ips.clone().filter(|ips| !ips.is_empty());
        let ips = listed.unwrap_or_else(|| spec.cluster_ip.iter().cloned().collect());
        Kind::ClusterIp(ips.iter().filter_map(|ip| ip.parse().ok()).collect())
    };
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(Port {
                name: p.name.clone().unwrap_or_default().to_ascii_lowercase(),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: u16::try_from(p.port).ok()?,
            })
        })
        .collect();
    Some(ServiceEntry { kind, ports })
}

fn slice_entry(slice: &EndpointSlice) -> SliceEntry {
    let service = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).cloned();
    // FQDN slices name hosts, not addresses; DNS has nothing to serve from them.
    let endpoints = if slice.address_type == "FQDN" {
        vec![]
    } else {
        slice
            .endpoints
            .iter()
            .map(|ep| EndpointEntry {
                ips: ep.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                hostname: ep.hostname.clone().filter(|h| !h.is_empty()).map(|h| h.to_ascii_lowercase()),
                // Unset means ready: the API says consumers should treat unknown as ready.
                ready: ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
            })
            .collect()
    };
    let ports = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(Port {
                name: p.name.clone().unwrap_or_default().to_ascii_lowercase(),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: u16::try_from(p.port?).ok()?,
            })
        })
        .collect();
    SliceEntry { service, endpoints, ports }
}

/// The first label naming an endpoint: its hostname, else its address with dashes.
fn host_label(ep: &EndpointEntry, ip: &IpAddr) -> String {
    match &ep.hostname {
        Some(h) => h.clone(),
        None => dashed(ip),
    }
}

fn dashed(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

fn dedup(ips: Vec<IpAddr>) -> Vec<IpAddr> {
    let mut seen = HashSet::new();
    ips.into_iter().filter(|ip| seen.insert(*ip)).collect()
}

fn addresses_of_type(owner: &Name, ips: &[IpAddr], qtype: RecordType) -> Vec<Record> {
    ips.iter()
        .filter_map(|ip| match (ip, qtype) {
            (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(*v4))),
            (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(*v6))),
            _ => None,
        })
        .map(|rdata| Record::from_rdata(owner.clone(), TTL, rdata))
        .collect()
}

fn address_records(owner: &Name, ips: &[IpAddr]) -> Vec<Record> {
    let mut out = addresses_of_type(owner, ips, RecordType::A);
    out.extend(addresses_of_type(owner, ips, RecordType::AAAA));
    out
}

/// SRV records sharing the weight evenly, as CoreDNS does.
fn srv_records(owner: &Name, targets: impl Iterator<Item = (Name, u16)>) -> Vec<Record> {
    let targets: BTreeSet<(Name, u16)> = targets.collect();
    let weight = u16::try_from(100 / targets.len().max(1)).unwrap_or(1).max(1);
    targets
        .into_iter()
        .map(|(target, port)| Record::from_rdata(owner.clone(), TTL, RData::SRV(SRV::new(0, weight, port, target))))
        .collect()
}

#[cfg(test)]
mod tests;
