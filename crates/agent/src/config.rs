//! The agent's configuration: flags, the TOML file (re-read on change) and the endpoint list.
