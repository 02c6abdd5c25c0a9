//! Part 3: A queries from concurrent UDP clients against the cluster DNS, next to the same load
//! against a UDP echo server on loopback in this process: what the packet path alone costs.
//!
//! Clients and the echo server are plain threads with blocking sockets, so the floor carries
//! no scheduler of its own; each client builds and parses every message, against both servers.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

use crate::stats::Latencies;

/// How long a client waits for one reply before counting it lost.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

pub struct Settings {
    pub name: String,
    pub clients: usize,
    pub duration: Duration,
}

/// One server under the load.
pub struct Load {
    pub lat: Latencies,
    pub elapsed: Duration,
    /// Replies lost, late, or not a positive answer.
    pub failed: u64,
}

pub struct Figures {
    pub name: String,
    pub clients: usize,
    pub target: Option<SocketAddr>,
    /// What the cluster DNS answered the first query with.
    pub first_answer: Option<String>,
    pub cluster: Option<Load>,
    pub floor: Load,
}

/// The cluster DNS's UDP endpoint, from the `kube-system/kube-dns` EndpointSlice.
pub async fn cluster_dns(client: &kube::Client) -> anyhow::Result<SocketAddr> {
    // Listed across namespaces: berth's apiserver serves its own kube-dns slice there but not
    // (yet) in a list or get of kube-system alone.
    let api: Api<EndpointSlice> = Api::all(client.clone());
    let slices = api.list(&ListParams::default().labels("kubernetes.io/service-name=kube-dns")).await?;
    for slice in slices.into_iter().filter(|s| s.metadata.namespace.as_deref() == Some("kube-system")) {
        let port =
            slice.ports.iter().flatten().find(|p| p.protocol.as_deref().unwrap_or("TCP") == "UDP").and_then(|p| p.port);
        let address = slice.endpoints.iter().flat_map(|e| e.addresses.iter()).next();
        if let (Some(port), Some(address)) = (port, address) {
            return Ok(SocketAddr::new(address.parse()?, u16::try_from(port)?));
        }
    }
    bail!("no UDP endpoint in the kube-system/kube-dns EndpointSlices (try --dns ADDR:PORT)")
}

pub async fn run(target: Option<SocketAddr>, settings: Settings, stop: Arc<AtomicBool>) -> anyhow::Result<Figures> {
    let name = Name::from_ascii(&settings.name).context("--dns-name")?;
    tokio::task::spawn_blocking(move || {
        let mut figures = Figures {
            name: settings.name.clone(),
            clients: settings.clients,
            target,
            first_answer: None,
            cluster: None,
            floor: Load { lat: Latencies::default(), elapsed: Duration::ZERO, failed: 0 },
        };
        if let Some(addr) = target {
            figures.first_answer = Some(probe(addr, &name)?);
            eprintln!("DNS: {} clients against {addr} for {:?}", settings.clients, settings.duration);
            figures.cluster = Some(load(addr, &name, &settings, true, &stop));
        }
        let echo = Echo::start()?;
        eprintln!("DNS floor: {} clients against a UDP echo on {}", settings.clients, echo.addr);
        figures.floor = load(echo.addr, &name, &settings, false, &stop);
        drop(echo);
        Ok(figures)
    })
    .await?
}

fn query(name: &Name, id: u16) -> Vec<u8> {
    let mut msg = Message::query();
    msg.metadata.id = id;
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name.clone(), RecordType::A));
    msg.to_vec().expect("a query encodes")
}

/// One query, to show what the server answers (and that it answers at all).
fn probe(addr: SocketAddr, name: &Name) -> anyhow::Result<String> {
    let socket = UdpSocket::bind(("0.0.0.0", 0))?;
    socket.connect(addr)?;
    socket.set_read_timeout(Some(REPLY_TIMEOUT))?;
    socket.send(&query(name, 1))?;
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).with_context(|| format!("no answer from {addr}"))?;
    let reply = Message::from_vec(&buf[..n])?;
    let answers: Vec<String> = reply.answers.iter().map(|r| r.data.to_string()).collect();
    Ok(format!("{} [{}]", reply.metadata.response_code, answers.join(", ")))
}

/// `settings.clients` threads, each one query in flight at a time, for `settings.duration`.
/// `positive`: a reply counts only as NOERROR with an answer (the echo returns the query).
fn load(addr: SocketAddr, name: &Name, settings: &Settings, positive: bool, stop: &AtomicBool) -> Load {
    let began = Instant::now();
    let deadline = began + settings.duration;
    let results: Vec<(Latencies, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..settings.clients).map(|c| s.spawn(move || client(addr, name, c, deadline, positive, stop))).collect();
        handles.into_iter().map(|h| h.join().expect("a DNS client thread")).collect()
    });
    let elapsed = began.elapsed();
    let mut lat = Latencies::default();
    let mut failed = 0;
    for (l, f) in &results {
        lat.add(l);
        failed += f;
    }
    Load { lat, elapsed, failed }
}

fn client(
    addr: SocketAddr,
    name: &Name,
    c: usize,
    deadline: Instant,
    positive: bool,
    stop: &AtomicBool,
) -> (Latencies, u64) {
    let mut lat = Latencies::default();
    let mut failed = 0;
    let bind = if addr.ip().is_loopback() { "127.0.0.1" } else { "0.0.0.0" };
    let Ok(socket) = UdpSocket::bind((bind, 0)) else { return (lat, 1) };
    if socket.connect(addr).is_err() || socket.set_read_timeout(Some(REPLY_TIMEOUT)).is_err() {
        return (lat, 1);
    }
    let mut buf = [0u8; 4096];
    // Ids differ per client so a late reply is told from the current one.
    let mut id = (c as u16).wrapping_mul(7919);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        id = id.wrapping_add(1);
        let began = Instant::now();
        let ok = socket.send(&query(name, id)).is_ok() && await_reply(&socket, &mut buf, id, positive);
        if ok {
            lat.record(began.elapsed());
        } else {
            failed += 1;
        }
    }
    (lat, failed)
}

/// Reads until the reply to `id` (skipping late ones) or the timeout.
fn await_reply(socket: &UdpSocket, buf: &mut [u8], id: u16, positive: bool) -> bool {
    loop {
        let Ok(n) = socket.recv(buf) else { return false };
        let Ok(msg) = Message::from_vec(&buf[..n]) else { continue };
        if msg.metadata.id != id {
            continue;
        }
        return !positive || (msg.metadata.response_code == ResponseCode::NoError && !msg.answers.is_empty());
    }
}

/// A UDP echo server on loopback, stopped when dropped.
struct Echo {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    fn start() -> anyhow::Result<Echo> {
        let socket = UdpSocket::bind(("127.0.0.1", 0))?;
        // Wakes up now and then to see whether it should stop.
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let addr = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(&buf[..n], from);
                    }
                }
            }
        });
        Ok(Echo { addr, stop, thread: Some(thread) })
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
