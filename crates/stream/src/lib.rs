//! The CRI streaming server: serves Exec, Attach and PortForward URLs over SPDY/3.1 and WebSocket, wire-compatible with kubelet's.
//!
//! The CRI runtime calls [`StreamServer::get_exec`] (and friends) from its gRPC handlers to mint a
//! single-use URL; the client (crictl, kubelet, critest) then connects to that URL and the server
//! runs the session against the runtime through the [`Backend`] trait. [`client`] is the other
//! end, as crictl speaks it: what `berth cri exec`, `attach` and `port-forward` connect with.

mod backend;
mod cache;
pub mod client;
mod mux;
mod portforward;
mod remotecommand;
mod server;
mod spdy;
mod websocket;

#[cfg(test)]
mod tests;

pub use backend::{AsyncStream, Backend, BackendError, Streams, TerminalSize};
pub use cache::TOKEN_TTL;
pub use server::StreamServer;
