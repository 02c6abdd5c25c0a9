//! The UDP and TCP listeners: local answers inline, relays in their own tasks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use crate::forward::{self, Transport};
use crate::message::{self, Decision};
use crate::watch::{self, Shared};

/// Relays in flight at once; past it UDP queries are dropped (clients retry) and TCP
/// connections refused, so a flood cannot grow tasks without bound.
const MAX_IN_FLIGHT: usize = 1024;

/// How long a TCP client may stay silent before we close its connection.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// What every listener task needs.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub shared: Arc<Shared>,
    pub upstreams: Arc<[SocketAddr]>,
    pub in_flight: Arc<Semaphore>,
}

impl Context {
    pub fn new(shared: Arc<Shared>, upstreams: Vec<SocketAddr>) -> Context {
        Context { shared, upstreams: upstreams.into(), in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)) }
    }

    fn decide(&self, raw: &[u8], transport: Transport) -> Decision {
        let synced = self.shared.synced.borrow().all();
        message::decide(&watch::read(&self.shared), synced, raw, transport == Transport::Udp)
    }

    /// The upstream's reply, or SERVFAIL when no upstream answers.
    async fn relay(&self, raw: &[u8], transport: Transport) -> Option<Vec<u8>> {
        match forward::relay(&self.upstreams, raw, transport).await {
            Some(reply) => Some(reply),
            None => message::servfail(raw),
        }
    }
}

pub(crate) async fn serve_udp(socket: UdpSocket, ctx: Context) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 65535];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            // Per-datagram errors (e.g. a reply to a vanished client) must not stop the listener.
            Err(e) => {
                tracing::debug!(error = %e, "dns udp receive failed");
                continue;
            }
        };
        let raw = &buf[..n];
        match ctx.decide(raw, Transport::Udp) {
            Decision::Reply(reply) => {
                if let Err(e) = socket.send_to(&reply, peer).await {
                    tracing::debug!(%peer, error = %e, "dns udp reply failed");
                }
            }
            Decision::Drop => {}
            Decision::Forward => {
                let Ok(permit) = ctx.in_flight.clone().try_acquire_owned() else { continue };
                let (ctx, socket, raw) = (ctx.clone(), socket.clone(), raw.to_vec());
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Some(reply) = ctx.relay(&raw, Transport::Udp).await
                        && let Err(e) = socket.send_to(&reply, peer).await
                    {
                        tracing::debug!(%peer, error = %e, "dns udp reply failed");
                    }
                });
            }
        }
    }
}

pub(crate) async fn serve_tcp(listener: TcpListener, ctx: Context) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(got) => got,
            Err(e) => {
                // Running out of descriptors is transient; back off instead of spinning.
                tracing::warn!(error = %e, "dns tcp accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = ctx.in_flight.clone().try_acquire_owned() else { continue };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection(stream, &ctx).await {
                tracing::debug!(%peer, error = %e, "dns tcp connection ended");
            }
        });
    }
}

/// Answers length-prefixed queries one after another until the client closes or idles out.
async fn connection(mut stream: TcpStream, ctx: &Context) -> std::io::Result<()> {
    loop {
        let raw = match tokio::time::timeout(TCP_IDLE, forward::read_frame(&mut stream)).await {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        };
        let reply = match ctx.decide(&raw, Transport::Tcp) {
            Decision::Reply(reply) => Some(reply),
            Decision::Drop => return Ok(()),
            Decision::Forward => ctx.relay(&raw, Transport::Tcp).await,
        };
        match reply {
            Some(reply) => forward::write_frame(&mut stream, &reply).await?,
            None => return Ok(()),
        }
    }
}
