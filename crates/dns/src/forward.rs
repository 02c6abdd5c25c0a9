//! Relay of names outside the cluster to the upstream resolvers, bytes in, bytes out.
//!
//! Upstreams are tried in order, each with its own timeout; the first reply that carries the
//! request's ID wins and goes back untouched (a truncated UDP reply included: the client then
//! retries over TCP, which we relay over TCP).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// How long one upstream gets to answer.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The transport a request came in on, and so the one it is relayed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// Relays `request` to the first upstream that answers; `None` when none does.
pub(crate) async fn relay(upstreams: &[SocketAddr], request: &[u8], transport: Transport) -> Option<Vec<u8>> {
    if request.len() < 2 {
        return None;
    }
    for upstream in upstreams {
        let attempt = async {
            match transport {
                Transport::Udp => over_udp(*upstream, request).await,
                Transport::Tcp => over_tcp(*upstream, request).await,
            }
        };
        match tokio::time::timeout(UPSTREAM_TIMEOUT, attempt).await {
            Ok(Ok(reply)) => return Some(reply),
            Ok(Err(e)) => tracing::debug!(%upstream, error = %e, "upstream dns failed"),
            Err(_) => tracing::debug!(%upstream, "upstream dns timed out"),
        }
    }
    None
}

async fn over_udp(upstream: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = UdpSocket::bind(local).await?;
    // Connected, so only the upstream's datagrams arrive and ICMP unreachable fails fast.
    socket.connect(upstream).await?;
    socket.send(request).await?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = socket.recv(&mut buf).await?;
        if is_reply_to(&buf[..n], request) {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

async fn over_tcp(upstream: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    write_frame(&mut stream, request).await?;
    let reply = read_frame(&mut stream).await?;
    if is_reply_to(&reply, request) { Ok(reply) } else { Err(std::io::Error::other("reply id does not match")) }
}

/// Reads one length-prefixed DNS message from a TCP stream.
pub(crate) async fn read_frame<R: AsyncReadExt + Unpin>(stream: &mut R) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Writes one length-prefixed DNS message to a TCP stream.
pub(crate) async fn write_frame<W: AsyncWriteExt + Unpin>(stream: &mut W, message: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(message.len()).map_err(|_| std::io::Error::other("message too long"))?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await
}

/// Same ID and the QR bit set.
fn is_reply_to(reply: &[u8], request: &[u8]) -> bool {
    reply.len() >= 12 && reply[..2] == request[..2] && reply[2] & 0x80 != 0
}
