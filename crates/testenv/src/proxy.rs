//! A TCP proxy on loopback that forwards to another address (a [`crate::Registry`]) with the
//! server-to-client direction limited to a shared rate, and counts what it forwards. Tests use it
//! to make a pull slow enough to interrupt mid-download, and to see how many bytes a retried pull
//! fetched again (a resumed download fetches only the rest).
//!
//! ```no_run
//! # async fn demo() {
//! use berth_testenv::{Registry, ThrottledProxy};
//! let reg = Registry::start();
//! let big = reg.push_big(60).await;
//! let proxy = ThrottledProxy::start(reg.host(), 20 << 20);   // 20 MiB/s over all connections
//! let reference = proxy.reference("big:1.0");               // "127.0.0.1:PROXYPORT/big:1.0"
//! // ... pull `reference` ...
//! let fetched = proxy.bytes_down();                          // registry → client bytes so far
//! proxy.set_rate(None);                                      // unlimited from now on
//! # let _ = (big, reference, fetched); }
//! ```
//!
//! Plain TCP: HTTP keeps working (the `Host` header names the proxy, which the registry does not
//! care about). Threads, not tasks, so it works from sync and async tests alike. Dropping it stops
//! accepting; connections in flight end when either side closes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes copied per read; small so the rate is smooth.
const CHUNK: usize = 16 << 10;

struct Shared {
    /// Bytes per second registry → client over all connections; 0 means unlimited.
    rate: AtomicU64,
    /// The token bucket: when the current budget started and what was sent since.
    budget: Mutex<(Instant, u64)>,
    down: AtomicU64,
    up: AtomicU64,
    connections: AtomicU64,
    stopping: AtomicBool,
}

impl Shared {
    /// Waits until sending `n` more bytes keeps to the rate.
    fn pace(&self, n: usize) {
        let rate = self.rate.load(Ordering::Relaxed);
        if rate == 0 {
            return;
        }
        let due = {
            let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
            // After an idle spell, do not let a burst through: restart the budget from now.
            let now = Instant::now();
            let (start, sent) = *budget;
            let on_time = start + Duration::from_secs_f64(sent as f64 / rate as f64);
            if on_time + Duration::from_millis(100) < now {
                *budget = (now, 0);
            }
            budget.1 += n as u64;
            budget.0 + Duration::from_secs_f64(budget.1 as f64 / rate as f64)
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

/// A rate-limited TCP forwarder; see the module docs.
pub struct ThrottledProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ThrottledProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThrottledProxy")
            .field("addr", &self.addr)
            .field("rate", &self.shared.rate.load(Ordering::Relaxed))
            .finish()
    }
}

impl ThrottledProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`host:port`), registry → client at most `bytes_per_sec` (0: unlimited).
    pub fn start(upstream: &str, bytes_per_sec: u64) -> ThrottledProxy {
        let upstream: SocketAddr = upstream.parse().unwrap_or_else(|e| panic!("proxy upstream {upstream:?}: {e}"));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy port");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            rate: AtomicU64::new(bytes_per_sec),
            budget: Mutex::new((Instant::now(), 0)),
            down: AtomicU64::new(0),
            up: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let accept_shared = shared.clone();
        std::thread::Builder::new()
            .name("throttled-proxy".into())
            .spawn(move || accept_loop(listener, upstream, accept_shared))
            .expect("spawn proxy thread");
        ThrottledProxy { addr, shared }
    }

    /// `127.0.0.1:PORT`: use it as the registry part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT/<name>`.
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{name}", self.addr)
    }

    /// Changes the limit for bytes sent from now on (`None`: unlimited).
    pub fn set_rate(&self, bytes_per_sec: Option<u64>) {
        *self.shared.budget.lock().unwrap_or_else(|e| e.into_inner()) = (Instant::now(), 0);
        self.shared.rate.store(bytes_per_sec.unwrap_or(0), Ordering::Relaxed);
    }

    /// Bytes forwarded upstream → client so far (responses: manifests, blobs, headers).
    pub fn bytes_down(&self) -> u64 {
        self.shared.down.load(Ordering::Relaxed)
    }

    /// Bytes forwarded client → upstream so far (requests).
    pub fn bytes_up(&self) -> u64 {
        self.shared.up.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

impl Drop for ThrottledProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = client else { continue };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let _ = std::thread::Builder::new().name("throttled-proxy-conn".into()).spawn(move || {
            let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
                let _ = client.shutdown(Shutdown::Both);
                return;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else { return };
            let up_shared = shared.clone();
            let up = std::thread::spawn(move || pump(client2, server2, &up_shared, false));
            pump(server, client, &shared, true);
            let _ = up.join();
        });
    }
}

/// Copies `from` → `to` until either end closes, pacing when `down` (registry → client).
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, down: bool) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if down {
            shared.pace(n);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        let counter = if down { &shared.down } else { &shared.up };
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
    // Half-close: the other direction may still be sending.
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_both_ways_at_the_limited_rate_and_counts_bytes() {
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream_addr = upstream.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut req = [0u8; 5];
            s.read_exact(&mut req).unwrap();
            assert_eq!(&req, b"hello");
            s.write_all(&vec![7u8; 512 << 10]).unwrap();
        });
        let proxy = ThrottledProxy::start(&upstream_addr, 1 << 20);
        let started = Instant::now();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.write_all(b"hello").unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        let elapsed = started.elapsed();
        server.join().unwrap();
        assert_eq!(got.len(), 512 << 10);
        assert!(got.iter().all(|&b| b == 7));
        // 512 KiB at 1 MiB/s: about half a second, never much less.
        assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
        assert_eq!(proxy.bytes_down(), 512 << 10);
        assert_eq!(proxy.bytes_up(), 5);
        assert_eq!(proxy.connections(), 1);
    }
}
