//! This node's Node object: registration, Lease heartbeats and status (conditions, runtime handlers).
