//! berth's side of the OCI runtime interface: a typed, synchronous driver of runtime binaries
//! ([`runtime`]) and the generator of the `config.json` they run ([`spec`]).
//!
//! Synchronous on purpose: the per-container monitor (a small binary with no async runtime) uses
//! it as is, and the async CRI runtime calls it through `spawn_blocking`.

pub mod runtime;
pub mod spec;

pub use runtime::{CreateOptions, ExecOptions, ExecOutput, OciError, OciRuntime, State, Status, Version};
pub use spec::{ContainerSpec, SpecError, container_spec};
