//! The `berth` binary: one subcommand per part.
fn main() {}
