//! The Service proxy (kube-proxy's job): Services and EndpointSlices as nftables rules on the node, synced incrementally.
//!
//! [`model`] reads what a Service serves, [`rules`] turns it into chains and map entries,
//! [`table`] owns the table's fixed part and the `nft -j` commands, [`sync`] computes the one
//! transaction that brings the kernel to the wanted state as [`command`]s, [`netlink`] writes
//! those to the kernel directly, [`proxier`] runs the watches and applies (full rebuilds through
//! `nft`, changes through netlink), [`conntrack`] drops the UDP flows a change leaves stale, and
//! [`host`] checks the kernel settings the rules rely on.

pub mod command;
pub mod conntrack;
pub mod host;
pub mod model;
pub mod netlink;
pub mod proxier;
pub mod rules;
pub mod sync;
pub mod table;

pub use proxier::{Config, ProxyError, apply, remove_table, run};
