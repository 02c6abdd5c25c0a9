//! One module per subcommand, each with its arguments and its `run`.

pub mod server;
