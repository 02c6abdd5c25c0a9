//! Label and field selectors: parsing Kubernetes' query syntax and matching objects.
// STUB: to be implemented (see signatures).

use std::collections::BTreeMap;

/// A parsed label selector (`a=b,c!=d,e in (f,g),!h`), or one built from a `metav1.LabelSelector`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector {}

impl LabelSelector {
    pub fn parse(_s: &str) -> Result<Self, String> {
        unimplemented!()
    }
    pub fn from_k8s(_sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> Result<Self, String> {
        unimplemented!()
    }
    pub fn is_empty(&self) -> bool {
        unimplemented!()
    }
    pub fn matches(&self, _labels: &BTreeMap<String, String>) -> bool {
        unimplemented!()
    }
}

/// A parsed field selector (`spec.nodeName=n1,status.phase!=Running`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector {}

impl FieldSelector {
    pub fn parse(_s: &str) -> Result<Self, String> {
        unimplemented!()
    }
    pub fn is_empty(&self) -> bool {
        unimplemented!()
    }
    /// The field names the selector mentions, to check them against what a resource supports.
    pub fn fields(&self) -> Vec<&str> {
        unimplemented!()
    }
    pub fn matches(&self, _fields: &BTreeMap<String, String>) -> bool {
        unimplemented!()
    }
}
