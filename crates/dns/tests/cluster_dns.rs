//! The DNS server against the real API server in-process: answers over UDP and TCP follow
//! Services and EndpointSlices created, changed and deleted through the `kube` client, and
//! other names are relayed to an upstream (a fake one here).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_dns::{ClusterDns, Config};
use berth_store::sqlite::SqliteStore;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// How long an API change may take to show in answers (in practice about a millisecond).
const PROPAGATION: Duration = Duration::from_secs(1);

async fn api() -> (kube::Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let state = ApiState::new(Arc::new(store), None);
    lifecycle::bootstrap(&state).await.unwrap();
    (kube::Client::new(router(state), "default"), dir)
}

async fn start(client: kube::Client, upstreams: Vec<SocketAddr>) -> ClusterDns {
    let config = Config::new("127.0.0.1:0".parse().unwrap(), upstreams);
    let dns = ClusterDns::start(client, config).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), dns.synced()).await.expect("the watches listed");
    dns
}

fn request(name: &str, qtype: RecordType) -> Message {
    let mut msg = Message::query();
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    msg
}

async fn udp(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let req = request(name, qtype);
    socket.send_to(&req.to_vec().unwrap(), server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf)).await.expect("a udp reply").unwrap();
    let reply = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(reply.metadata.id, req.metadata.id);
    reply
}

async fn tcp(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let mut stream = TcpStream::connect(server).await.unwrap();
    let req = request(name, qtype).to_vec().unwrap();
    stream.write_all(&(req.len() as u16).to_be_bytes()).await.unwrap();
    stream.write_all(&req).await.unwrap();
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

fn addresses(reply: &Message) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = reply
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// Asks over UDP until `done` holds for the reply, failing after `PROPAGATION`.
async fn eventually(server: SocketAddr, name: &str, qtype: RecordType, done: impl Fn(&Message) -> bool) -> Message {
    let deadline = tokio::time::Instant::now() + PROPAGATION;
    loop {
        let reply = udp(server, name, qtype).await;
        if done(&reply) {
            return reply;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} {qtype} still answers {reply:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn service(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn slice(name: &str, svc: &str, endpoints: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "peer", "port": 2380, "protocol": "TCP"}]
    }))
    .unwrap()
}

/// A resolver on one port: over UDP it answers every question with 192.0.2.1, except that
/// names starting with `big.` get an empty reply with TC set; over TCP it answers 192.0.2.2.
async fn fake_upstream() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        loop {
            let (n, peer) = socket.recv_from(&mut buf).await.unwrap();
            let req = Message::from_vec(&buf[..n]).unwrap();
            let reply = if req.queries[0].name().to_ascii().starts_with("big.") {
                let mut reply = upstream_reply(&req, None);
                reply.metadata.truncation = true;
                reply
            } else {
                upstream_reply(&req, Some(A::new(192, 0, 2, 1)))
            };
            socket.send_to(&reply.to_vec().unwrap(), peer).await.unwrap();
        }
    });
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await.unwrap();
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
            stream.read_exact(&mut buf).await.unwrap();
            let req = Message::from_vec(&buf).unwrap();
            let reply = upstream_reply(&req, Some(A::new(192, 0, 2, 2))).to_vec().unwrap();
            stream.write_all(&(reply.len() as u16).to_be_bytes()).await.unwrap();
            stream.write_all(&reply).await.unwrap();
        }
    });
    addr
}

fn upstream_reply(req: &Message, a: Option<A>) -> Message {
    let mut reply = Message::response(req.metadata.id, req.metadata.op_code);
    reply.metadata.recursion_available = true;
    reply.queries = req.queries.clone();
    if let Some(a) = a {
        reply.add_answer(Record::from_rdata(req.queries[0].name().clone(), 60, RData::A(a)));
    }
    reply
}

#[tokio::test]
async fn a_cluster_ip_service_is_answered_over_udp_and_tcp_and_follows_deletion() {
    let (client, _dir) = api().await;
    let dns = start(client.clone(), vec![]).await;
    let server = dns.local_addr();
    let services: Api<Service> = Api::default_namespaced(client);
    let created = services
        .create(&PostParams::default(), &service("web", json!({"ports": [{"name": "http", "port": 80}]})))
        .await
        .unwrap();
    let ip: IpAddr = created.spec.unwrap().cluster_ip.unwrap().parse().unwrap();

    let reply = eventually(server, "web.default.svc.cluster.local.", RecordType::A, |m| !m.answers.is_empty()).await;
    assert_eq!(addresses(&reply), vec![ip]);
    assert!(reply.metadata.authoritative);
    assert_eq!(reply.answers[0].ttl, 5);

    let over_tcp = tcp(server, "WEB.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&over_tcp), vec![ip]);

    let srv = udp(server, "_http._tcp.web.default.svc.cluster.local.", RecordType::SRV).await;
    match &srv.answers[..] {
        [r] => match &r.data {
            RData::SRV(s) => assert_eq!((s.target.to_ascii().as_str(), s.port), ("web.default.svc.cluster.local.", 80)),
            other => panic!("not an srv: {other:?}"),
        },
        other => panic!("expected one srv, got {other:?}"),
    }

    let nodata = udp(server, "web.default.svc.cluster.local.", RecordType::AAAA).await;
    assert_eq!(nodata.metadata.response_code, ResponseCode::NoError);
    assert!(nodata.answers.is_empty());
    assert_eq!(nodata.authorities[0].record_type(), RecordType::SOA);

    services.delete("web", &DeleteParams::default()).await.unwrap();
    let gone = eventually(server, "web.default.svc.cluster.local.", RecordType::A, |m| {
        m.metadata.response_code == ResponseCode::NXDomain
    })
    .await;
    assert_eq!(gone.authorities[0].record_type(), RecordType::SOA);
}

#[tokio::test]
async fn a_headless_service_answers_its_ready_endpoints_and_follows_slice_changes() {
    let (client, _dir) = api().await;
    let dns = start(client.clone(), vec![]).await;
    let server = dns.local_addr();
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client);
    services
        .create(
            &PostParams::default(),
            &service("pg", json!({"clusterIP": "None", "ports": [{"name": "peer", "port": 2380}]})),
        )
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &slice(
                "pg-1",
                "pg",
                json!([
                    {"addresses": ["10.0.0.1"], "hostname": "pg-0", "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.2"]},
                    {"addresses": ["10.0.0.3"], "conditions": {"ready": false}}
                ]),
            ),
        )
        .await
        .unwrap();

    let reply = eventually(server, "pg.default.svc.cluster.local.", RecordType::A, |m| m.answers.len() == 2).await;
    assert_eq!(addresses(&reply), vec!["10.0.0.1".parse::<IpAddr>().unwrap(), "10.0.0.2".parse().unwrap()]);
    let host = udp(server, "pg-0.pg.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&host), vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    let dashed = tcp(server, "10-0-0-2.pg.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&dashed), vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
    let srv = udp(server, "_peer._tcp.pg.default.svc.cluster.local.", RecordType::SRV).await;
    assert_eq!(srv.answers.len(), 2, "{srv:?}");
    assert_eq!(srv.additionals.len(), 2, "the targets' addresses come along: {srv:?}");

    // The endpoint moves: the old address goes, the new one comes.
    let mut moved = slices.get("pg-1").await.unwrap();
    moved.endpoints = serde_json::from_value(json!([{"addresses": ["10.0.0.9"], "hostname": "pg-0"}])).unwrap();
    slices.replace("pg-1", &PostParams::default(), &moved).await.unwrap();
    let reply = eventually(server, "pg-0.pg.default.svc.cluster.local.", RecordType::A, |m| {
        addresses(m) == vec!["10.0.0.9".parse::<IpAddr>().unwrap()]
    })
    .await;
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);

    slices.delete("pg-1", &DeleteParams::default()).await.unwrap();
    let empty = eventually(server, "pg.default.svc.cluster.local.", RecordType::A, |m| m.answers.is_empty()).await;
    assert_eq!(empty.metadata.response_code, ResponseCode::NoError, "the service still exists: NODATA");
}

#[tokio::test]
async fn an_external_name_service_is_a_cname_and_pod_names_answer_their_address() {
    let (client, _dir) = api().await;
    let dns = start(client.clone(), vec![]).await;
    let server = dns.local_addr();
    let services: Api<Service> = Api::default_namespaced(client);
    services
        .create(
            &PostParams::default(),
            &service("ext", json!({"type": "ExternalName", "externalName": "db.example.com"})),
        )
        .await
        .unwrap();
    let reply = eventually(server, "ext.default.svc.cluster.local.", RecordType::A, |m| !m.answers.is_empty()).await;
    match &reply.answers[0].data {
        RData::CNAME(c) => assert_eq!(c.0.to_ascii(), "db.example.com."),
        other => panic!("expected a cname, got {other:?}"),
    }
    let pod = udp(server, "10-244-0-5.default.pod.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&pod), vec!["10.244.0.5".parse::<IpAddr>().unwrap()]);
}

#[tokio::test]
async fn names_outside_the_cluster_are_relayed_to_the_upstream() {
    let (client, _dir) = api().await;
    let upstream = fake_upstream().await;
    let dns = start(client, vec![upstream]).await;
    let reply = udp(dns.local_addr(), "example.com.", RecordType::A).await;
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&reply), vec!["192.0.2.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(reply.queries[0].name().to_ascii(), "example.com.");
}

#[tokio::test]
async fn a_tcp_question_is_relayed_over_tcp() {
    let (client, _dir) = api().await;
    let upstream = fake_upstream().await;
    let dns = start(client, vec![upstream]).await;
    let reply = tcp(dns.local_addr(), "example.com.", RecordType::A).await;
    assert_eq!(addresses(&reply), vec!["192.0.2.2".parse::<IpAddr>().unwrap()]);
}

#[tokio::test]
async fn a_truncated_upstream_reply_reaches_the_client_truncated() {
    let (client, _dir) = api().await;
    let upstream = fake_upstream().await;
    let dns = start(client, vec![upstream]).await;
    let reply = udp(dns.local_addr(), "big.example.com.", RecordType::A).await;
    assert!(reply.metadata.truncation, "TC must pass through so the client retries over TCP");
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
}

#[tokio::test]
async fn a_dead_upstream_is_skipped_for_the_next_one() {
    let (client, _dir) = api().await;
    let dead = UdpSocket::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let upstream = fake_upstream().await;
    let dns = start(client, vec![dead, upstream]).await;
    let reply = udp(dns.local_addr(), "example.org.", RecordType::A).await;
    assert_eq!(addresses(&reply), vec!["192.0.2.1".parse::<IpAddr>().unwrap()]);
}

#[tokio::test]
async fn an_unreachable_upstream_gives_servfail() {
    let (client, _dir) = api().await;
    // Bound then dropped: nothing listens there any more.
    let closed = UdpSocket::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let dns = start(client, vec![closed]).await;
    let reply = udp(dns.local_addr(), "example.com.", RecordType::A).await;
    assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(reply.queries[0].name().to_ascii(), "example.com.");
}

#[tokio::test]
async fn a_silent_upstream_gives_servfail_after_the_timeout() {
    let (client, _dir) = api().await;
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dns = start(client, vec![silent.local_addr().unwrap()]).await;
    let started = tokio::time::Instant::now();
    let reply = udp(dns.local_addr(), "example.com.", RecordType::A).await;
    assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
    assert!(started.elapsed() >= berth_dns::UPSTREAM_TIMEOUT, "answered before the timeout");
    drop(silent);
}
