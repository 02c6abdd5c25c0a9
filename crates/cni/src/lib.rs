//! Pod networking through the standard CNI plugins: network namespaces, network configs, and
//! running a network's plugins for ADD, CHECK and DEL.
//!
//! [`Cni`] is the entry point the CRI runtime uses; it blocks on plugin processes, so async code
//! calls it under `spawn_blocking`. Only [`netns`] touches the kernel, behind [`NetnsOps`].

pub mod cni;
pub mod config;
pub mod exec;
pub mod netns;
pub mod result;

pub use cni::{Attachment, Cni, CniError, Command, NetworkStatus, PortMapping, SandboxNetwork};
pub use config::{ConfigError, DefaultNetwork, NetworkConfigList, PodCidrOutcome, follow_pod_cidr, write_default};
pub use exec::{PluginOutput, PluginRunner, ProcessRunner};
pub use netns::{KernelNetns, NetnsError, NetnsOps, RecordingNetns};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
