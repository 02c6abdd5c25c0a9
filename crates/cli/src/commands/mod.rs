//! One module per subcommand, each with its arguments and its `run`.

pub mod agent;
pub mod cri;
pub mod runtime;
pub mod scheduler;
pub mod server;
