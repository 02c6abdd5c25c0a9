//! Kubernetes object rules on top of k8s-openapi: defaulting, validation, selectors, admission,
//! deletion options, strategic merge patches and server-side tables. Pure functions, no IO.

pub mod admission;
pub mod deletion;
pub mod field_error;
pub mod kinds;
pub mod resources;
pub mod selector;
pub mod service;
pub mod strategic_merge;
pub mod table;
pub mod validation;

pub use field_error::{ErrorType, FieldError};
pub use resources::ResourceType;
