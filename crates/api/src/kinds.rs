//! Per-kind defaulting, validation and selectable fields for every served resource.
// STUB: to be implemented (see signatures).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{FieldError, ResourceType};

/// Fills defaults and resets what a create may not set, as Kubernetes' strategy for the kind.
pub fn prepare_for_create(_rt: &ResourceType, _obj: &mut Value) {
    unimplemented!()
}

/// Validation of a new object, metadata included.
pub fn validate_create(_rt: &ResourceType, _obj: &Value) -> Vec<FieldError> {
    unimplemented!()
}

/// Fills defaults on an update of the main resource and keeps what it may not change.
pub fn prepare_for_update(_rt: &ResourceType, _new: &mut Value, _old: &Value) {
    unimplemented!()
}

/// Validation of an update: the new object is valid and changes only mutable fields.
pub fn validate_update(_rt: &ResourceType, _new: &Value, _old: &Value) -> Vec<FieldError> {
    unimplemented!()
}

/// Field selector values of an object (`metadata.name`, `spec.nodeName`, ...).
pub fn field_set(_rt: &ResourceType, _obj: &Value) -> BTreeMap<String, String> {
    unimplemented!()
}
