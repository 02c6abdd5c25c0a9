//! SPDY/3.1, the multiplexing protocol kubelet-style streaming clients upgrade to: frame codec and connection.

pub mod conn;
pub mod frame;

pub use conn::{Connection, IncomingStream, WriteCmd};
pub use frame::Frame;
