//! Small helpers that several berth parts need alike, each with one owner here instead of a copy
//! in every crate that uses it.
//!
//! A leaf crate: it depends on no other berth crate, so any of them may use it. The TLS and time
//! helpers sit behind the `tls` and `time` features, so that parts which need neither (the
//! container monitor, CNI) do not build rustls or jiff for the rest.

pub mod error;
pub mod fs;
#[cfg(feature = "time")]
pub mod time;
#[cfg(feature = "tls")]
pub mod tls;
