//! Strategic merge patch for the served kinds: merge keys, directives, and list semantics.
// STUB: to be implemented (see signatures).

use serde_json::Value;

use crate::ResourceType;

/// Applies a strategic merge patch to `original`, an object of type `rt`.
pub fn apply(_rt: &ResourceType, _original: &Value, _patch: &Value) -> Result<Value, String> {
    unimplemented!()
}
