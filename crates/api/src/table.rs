//! Server-side printing: the columns and cells `kubectl get` shows for each resource.
// STUB: to be implemented (see signatures).

use serde_json::Value;

use crate::ResourceType;

/// `TableColumnDefinition`s for `rt`, as JSON objects.
pub fn columns(_rt: &ResourceType) -> Vec<Value> {
    unimplemented!()
}

/// The cells of one row for `obj`, aligned with [`columns`]; ages are relative to `now`.
pub fn cells(_rt: &ResourceType, _obj: &Value, _now: jiff::Timestamp) -> Vec<Value> {
    unimplemented!()
}
