//! One module per subcommand, each with its arguments and its `run`.

pub mod agent;
pub mod controller_manager;
pub mod cri;
pub mod down;
pub mod leading;
pub mod runtime;
pub mod scheduler;
pub mod server;
pub mod server_flags;
pub mod status;
pub mod up;
