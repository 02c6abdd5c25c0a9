//! RuntimeClass admission of pods, as Kubernetes' built-in plugin, plus berth's default class.
// STUB: to be implemented (see signatures).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;

/// The class marked `runtimeclass.berth.dev/is-default-class: "true"`; the newest if several.
pub fn default_runtime_class(_classes: &[RuntimeClass]) -> Option<&RuntimeClass> {
    unimplemented!()
}

/// Admits a pod on CREATE against the class it names (already looked up; `None` = not found).
/// `Err` carries the message of the 403 Forbidden status.
pub fn admit_runtime_class(_pod: &mut Pod, _class: Option<&RuntimeClass>) -> Result<(), String> {
    unimplemented!()
}
