use std::collections::HashSet;
use std::net::IpAddr;

use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use super::{Answer, Records, TTL};

fn records() -> Records {
    Records::new("cluster.local").unwrap()
}

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn service(ns: &str, name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
}

fn cluster_ip(ns: &str, name: &str, ip: &str) -> Service {
    service(
        ns,
        name,
        json!({"clusterIP": ip, "clusterIPs": [ip], "ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"port": 9000}
        ]}),
    )
}

fn headless(ns: &str, name: &str) -> Service {
    service(ns, name, json!({"clusterIP": "None", "ports": [{"name": "peer", "port": 2380}]}))
}

/// `endpoints`: (addresses, hostname, ready) with `ready: None` meaning the condition is unset.
fn slice(ns: &str, name: &str, svc: &str, endpoints: &[(&[&str], Option<&str>, Option<bool>)]) -> EndpointSlice {
    let endpoints: Vec<serde_json::Value> = endpoints
        .iter()
        .map(|(addrs, host, ready)| {
            let mut ep = json!({"addresses": addrs});
            if let Some(h) = host {
                ep["hostname"] = json!(h);
            }
            if let Some(r) = ready {
                ep["conditions"] = json!({"ready": r});
            }
            ep
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "peer", "port": 12380, "protocol": "TCP"}]
    }))
    .unwrap()
}

fn answers(answer: &Answer) -> &[Record] {
    match answer {
        Answer::Records { answers, .. } => answers,
        other => panic!("expected records, got {other:?}"),
    }
}

fn ips(answer: &Answer) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = answers(answer)
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            other => panic!("not an address: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// (target, port) of each SRV answer, sorted.
fn srvs(answer: &Answer) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = answers(answer)
        .iter()
        .map(|r| match &r.data {
            RData::SRV(srv) => (srv.target.to_ascii(), srv.port),
            other => panic!("not an srv: {other:?}"),
        })
        .collect();
    out.sort();
    out
}

fn is_zone_soa(soa: &Record) -> bool {
    soa.record_type() == RecordType::SOA && soa.name == name("cluster.local.")
}

fn is_nxdomain_with_soa(answer: &Answer) -> bool {
    matches!(answer, Answer::NxDomain { soa } if is_zone_soa(soa))
}

fn is_nodata_with_soa(answer: &Answer) -> bool {
    matches!(answer, Answer::NoData { soa } if is_zone_soa(soa))
}

#[test]
fn a_cluster_ip_service_answers_its_cluster_ip_with_ttl_5() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    let answer = r.answer(&name("web.default.svc.cluster.local."), RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.96.0.10")]);
    assert!(answers(&answer).iter().all(|rec| rec.ttl == TTL && TTL == 5));
}

#[test]
fn a_dual_stack_service_answers_aaaa_with_its_ipv6_cluster_ip_only() {
    let mut r = records();
    r.apply_service(&service(
        "default",
        "dual",
        json!({"clusterIP": "10.96.0.11", "clusterIPs": ["10.96.0.11", "fd00::11"]}),
    ));
    let v6 = r.answer(&name("dual.default.svc.cluster.local."), RecordType::AAAA);
    assert_eq!(ips(&v6), vec![ip("fd00::11")]);
    let v4 = r.answer(&name("dual.default.svc.cluster.local."), RecordType::A);
    assert_eq!(ips(&v4), vec![ip("10.96.0.11")]);
}

#[test]
fn names_match_whatever_their_case_and_answers_echo_the_asked_spelling() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    let asked = name("WeB.DeFault.SVC.Cluster.Local.");
    let answer = r.answer(&asked, RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.96.0.10")]);
    assert_eq!(answers(&answer)[0].name.to_ascii(), "WeB.DeFault.SVC.Cluster.Local.");
}

#[test]
fn a_headless_service_answers_only_its_ready_endpoints_counting_unset_as_ready() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice(
        "db",
        "pg-abc",
        "pg",
        &[(&["10.0.0.1"], None, Some(true)), (&["10.0.0.2"], None, Some(false)), (&["10.0.0.3"], None, None)],
    ));
    let answer = r.answer(&name("pg.db.svc.cluster.local."), RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.0.0.1"), ip("10.0.0.3")]);
}

#[test]
fn a_headless_service_gathers_endpoints_from_all_its_slices_once_each() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], None, None)]));
    r.apply_slice(&slice("db", "pg-2", "pg", &[(&["10.0.0.2"], None, None), (&["10.0.0.1"], None, None)]));
    r.apply_slice(&slice("db", "other-1", "other", &[(&["10.0.0.9"], None, None)]));
    let answer = r.answer(&name("pg.db.svc.cluster.local."), RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.0.0.1"), ip("10.0.0.2")]);
}

#[test]
fn a_headless_endpoint_with_a_hostname_answers_under_that_hostname() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice(
        "db",
        "pg-1",
        "pg",
        &[(&["10.0.0.1"], Some("pg-0"), None), (&["10.0.0.2"], Some("pg-1"), None)],
    ));
    let answer = r.answer(&name("pg-1.pg.db.svc.cluster.local."), RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.0.0.2")]);
    assert!(is_nxdomain_with_soa(&r.answer(&name("pg-7.pg.db.svc.cluster.local."), RecordType::A)));
}

#[test]
fn a_headless_endpoint_without_hostname_answers_under_its_dashed_address() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], None, None), (&["10.0.0.2"], Some("pg-1"), None)]));
    let answer = r.answer(&name("10-0-0-1.pg.db.svc.cluster.local."), RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.0.0.1")]);
    // An endpoint with a hostname is named by it only.
    assert!(is_nxdomain_with_soa(&r.answer(&name("10-0-0-2.pg.db.svc.cluster.local."), RecordType::A)));
}

#[test]
fn a_not_ready_endpoint_has_no_hostname_record() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], Some("pg-0"), Some(false))]));
    assert!(is_nxdomain_with_soa(&r.answer(&name("pg-0.pg.db.svc.cluster.local."), RecordType::A)));
}

#[test]
fn endpoint_names_exist_only_under_headless_services() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    r.apply_slice(&slice("default", "web-1", "web", &[(&["10.0.0.1"], Some("web-0"), None)]));
    assert!(is_nxdomain_with_soa(&r.answer(&name("web-0.web.default.svc.cluster.local."), RecordType::A)));
}

#[test]
fn a_named_port_of_a_cluster_ip_service_has_an_srv_to_the_service_name() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    let answer = r.answer(&name("_http._tcp.web.default.svc.cluster.local."), RecordType::SRV);
    assert_eq!(srvs(&answer), vec![("web.default.svc.cluster.local.".to_string(), 80)]);
    let Answer::Records { additionals, .. } = &answer else { unreachable!() };
    assert_eq!(additionals.len(), 1, "the target's address comes along: {additionals:?}");
    let udp = r.answer(&name("_dns._udp.web.default.svc.cluster.local."), RecordType::SRV);
    assert_eq!(srvs(&udp), vec![("web.default.svc.cluster.local.".to_string(), 53)]);
}

#[test]
fn a_port_name_with_the_wrong_protocol_does_not_exist() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    let answer = r.answer(&name("_http._udp.web.default.svc.cluster.local."), RecordType::SRV);
    assert!(is_nxdomain_with_soa(&answer));
}

#[test]
fn a_named_port_of_a_headless_service_has_one_srv_per_ready_endpoint_with_the_endpoint_port() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice(
        "db",
        "pg-1",
        "pg",
        &[(&["10.0.0.1"], Some("pg-0"), None), (&["10.0.0.2"], None, None), (&["10.0.0.3"], None, Some(false))],
    ));
    let answer = r.answer(&name("_peer._tcp.pg.db.svc.cluster.local."), RecordType::SRV);
    assert_eq!(
        srvs(&answer),
        vec![
            ("10-0-0-2.pg.db.svc.cluster.local.".to_string(), 12380),
            ("pg-0.pg.db.svc.cluster.local.".to_string(), 12380),
        ]
    );
}

#[test]
fn an_srv_question_for_the_service_name_lists_every_port() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    let answer = r.answer(&name("web.default.svc.cluster.local."), RecordType::SRV);
    let ports: Vec<u16> = srvs(&answer).into_iter().map(|(_, p)| p).collect();
    assert_eq!(ports, vec![53, 80, 9000]);
}

#[test]
fn an_external_name_service_answers_a_cname_to_its_external_name() {
    let mut r = records();
    r.apply_service(&service("default", "ext", json!({"type": "ExternalName", "externalName": "Example.COM"})));
    let answer = r.answer(&name("ext.default.svc.cluster.local."), RecordType::A);
    match &answers(&answer)[0].data {
        RData::CNAME(c) => assert_eq!(c.0.to_ascii(), "example.com."),
        other => panic!("expected a cname, got {other:?}"),
    }
}

#[test]
fn a_pod_name_answers_the_address_it_spells() {
    let r = records();
    let answer = r.answer(&name("10-244-1-7.anyns.pod.cluster.local."), RecordType::A);
    assert_eq!(ips(&answer), vec![ip("10.244.1.7")]);
    let v6 = r.answer(&name("fd00--7.anyns.pod.cluster.local."), RecordType::AAAA);
    assert_eq!(ips(&v6), vec![ip("fd00::7")]);
    let v6_four_groups = r.answer(&name("fd00--1-2.anyns.pod.cluster.local."), RecordType::AAAA);
    assert_eq!(ips(&v6_four_groups), vec![ip("fd00::1:2")]);
    assert!(is_nxdomain_with_soa(&r.answer(&name("not-an-ip.anyns.pod.cluster.local."), RecordType::A)));
}

#[test]
fn a_missing_service_is_nxdomain_with_the_zone_soa() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    let answer = r.answer(&name("nope.default.svc.cluster.local."), RecordType::A);
    assert!(is_nxdomain_with_soa(&answer));
    let Answer::NxDomain { soa } = answer else { unreachable!() };
    assert_eq!(soa.ttl, 5);
    assert!(is_nxdomain_with_soa(&r.answer(&name("a.b.c.d.e.f.cluster.local."), RecordType::A)));
}

#[test]
fn an_existing_name_without_the_asked_type_is_nodata_with_the_zone_soa() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    assert!(is_nodata_with_soa(&r.answer(&name("web.default.svc.cluster.local."), RecordType::AAAA)));
    assert!(is_nodata_with_soa(&r.answer(&name("web.default.svc.cluster.local."), RecordType::TXT)));
    assert!(is_nodata_with_soa(&r.answer(&name("_http._tcp.web.default.svc.cluster.local."), RecordType::A)));
}

#[test]
fn the_zone_skeleton_exists_without_records() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    assert!(is_nodata_with_soa(&r.answer(&name("svc.cluster.local."), RecordType::A)));
    assert!(is_nodata_with_soa(&r.answer(&name("default.svc.cluster.local."), RecordType::A)));
    assert!(is_nodata_with_soa(&r.answer(&name("_tcp.web.default.svc.cluster.local."), RecordType::A)));
    assert!(is_nxdomain_with_soa(&r.answer(&name("empty.svc.cluster.local."), RecordType::A)));
    let soa = r.answer(&name("cluster.local."), RecordType::SOA);
    assert_eq!(answers(&soa)[0].record_type(), RecordType::SOA);
}

#[test]
fn names_outside_the_zone_are_not_in_zone() {
    let r = records();
    assert_eq!(r.answer(&name("example.com."), RecordType::A), Answer::NotInZone);
    assert_eq!(r.answer(&name("cluster.local.example.com."), RecordType::A), Answer::NotInZone);
}

#[test]
fn deleting_a_service_removes_its_records() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    r.delete_service("default", "web");
    assert!(is_nxdomain_with_soa(&r.answer(&name("web.default.svc.cluster.local."), RecordType::A)));
    assert!(is_nxdomain_with_soa(&r.answer(&name("default.svc.cluster.local."), RecordType::A)));
    assert_eq!(r.answer(&name("10.0.96.10.in-addr.arpa."), RecordType::PTR), Answer::NotInZone);
}

#[test]
fn deleting_a_slice_removes_its_endpoints_but_keeps_the_service() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], Some("pg-0"), None)]));
    r.apply_slice(&slice("db", "pg-2", "pg", &[(&["10.0.0.2"], None, None)]));
    r.delete_slice("db", "pg-1");
    assert_eq!(ips(&r.answer(&name("pg.db.svc.cluster.local."), RecordType::A)), vec![ip("10.0.0.2")]);
    assert!(is_nxdomain_with_soa(&r.answer(&name("pg-0.pg.db.svc.cluster.local."), RecordType::A)));
    r.delete_slice("db", "pg-2");
    assert!(is_nodata_with_soa(&r.answer(&name("pg.db.svc.cluster.local."), RecordType::A)));
}

#[test]
fn updating_a_slice_replaces_its_endpoints() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], None, None)]));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.5"], None, None)]));
    assert_eq!(ips(&r.answer(&name("pg.db.svc.cluster.local."), RecordType::A)), vec![ip("10.0.0.5")]);
}

#[test]
fn a_slice_relabelled_to_another_service_moves_with_its_label() {
    let mut r = records();
    r.apply_service(&headless("db", "pg"));
    r.apply_service(&headless("db", "pg2"));
    r.apply_slice(&slice("db", "s", "pg", &[(&["10.0.0.1"], None, None)]));
    r.apply_slice(&slice("db", "s", "pg2", &[(&["10.0.0.1"], None, None)]));
    assert!(is_nodata_with_soa(&r.answer(&name("pg.db.svc.cluster.local."), RecordType::A)));
    assert_eq!(ips(&r.answer(&name("pg2.db.svc.cluster.local."), RecordType::A)), vec![ip("10.0.0.1")]);
}

#[test]
fn a_service_turned_headless_answers_its_endpoints_instead_of_the_old_cluster_ip() {
    let mut r = records();
    r.apply_service(&cluster_ip("db", "pg", "10.96.0.20"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], None, None)]));
    r.apply_service(&headless("db", "pg"));
    assert_eq!(ips(&r.answer(&name("pg.db.svc.cluster.local."), RecordType::A)), vec![ip("10.0.0.1")]);
}

#[test]
fn retaining_after_a_relist_drops_what_the_list_no_longer_holds() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    r.apply_service(&cluster_ip("default", "gone", "10.96.0.12"));
    r.retain_services(&HashSet::from([("default".to_string(), "web".to_string())]));
    assert!(matches!(r.answer(&name("web.default.svc.cluster.local."), RecordType::A), Answer::Records { .. }));
    assert!(is_nxdomain_with_soa(&r.answer(&name("gone.default.svc.cluster.local."), RecordType::A)));
}

#[test]
fn ptr_names_cluster_ips_and_headless_endpoints() {
    let mut r = records();
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    r.apply_service(&headless("db", "pg"));
    r.apply_slice(&slice("db", "pg-1", "pg", &[(&["10.0.0.1"], Some("pg-0"), None), (&["10.0.0.2"], None, None)]));
    let ptr = |q: &str| match &answers(&r.answer(&name(q), RecordType::PTR))[0].data {
        RData::PTR(p) => p.0.to_ascii(),
        other => panic!("not a ptr: {other:?}"),
    };
    assert_eq!(ptr("10.0.96.10.in-addr.arpa."), "web.default.svc.cluster.local.");
    assert_eq!(ptr("1.0.0.10.in-addr.arpa."), "pg-0.pg.db.svc.cluster.local.");
    assert_eq!(ptr("2.0.0.10.in-addr.arpa."), "10-0-0-2.pg.db.svc.cluster.local.");
    // Unknown addresses belong to the upstream resolvers.
    assert_eq!(r.answer(&name("9.9.9.9.in-addr.arpa."), RecordType::PTR), Answer::NotInZone);
}

#[test]
fn every_change_moves_the_soa_serial_on() {
    let mut r = records();
    let serial = |r: &Records| match &r.soa().data {
        RData::SOA(soa) => soa.serial,
        _ => unreachable!(),
    };
    let before = serial(&r);
    r.apply_service(&cluster_ip("default", "web", "10.96.0.10"));
    assert!(serial(&r) > before);
}

#[test]
fn the_root_is_refused_as_a_cluster_zone() {
    assert!(Records::new(".").is_err());
    assert!(Records::new("").is_err());
    assert_eq!(Records::new("Cluster.Local.").unwrap().zone(), &name("cluster.local."));
}
