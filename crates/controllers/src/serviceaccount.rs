//! The ServiceAccount controller: a ServiceAccount named `default` in every active namespace,
//! made again when deleted and otherwise left alone — kube-controller-manager's `serviceaccount`
//! controller, through the API only (the shell is [`crate::per_namespace`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::Context;
use crate::per_namespace::{self, Ensured};

/// The ServiceAccount every namespace gets.
pub const DEFAULT: &str = "default";

struct DefaultServiceAccount;

impl Ensured for DefaultServiceAccount {
    type Object = ServiceAccount;
    const CONTROLLER: &'static str = "serviceaccount";
    const NAME: &'static str = DEFAULT;

    fn desired(&self) -> ServiceAccount {
        desired()
    }

    fn repaired(&self, _existing: &ServiceAccount) -> Option<ServiceAccount> {
        None
    }
}

/// The `default` ServiceAccount as it is created: a name and nothing else.
pub fn desired() -> ServiceAccount {
    ServiceAccount { metadata: ObjectMeta { name: Some(DEFAULT.into()), ..Default::default() }, ..Default::default() }
}

/// Runs the ServiceAccount controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    per_namespace::run(ctx, DefaultServiceAccount).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_service_account_is_created_with_only_its_name() {
        assert_eq!(
            serde_json::to_value(desired()).unwrap(),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        );
    }

    #[test]
    fn an_existing_default_service_account_is_left_as_it_is() {
        let edited: ServiceAccount = serde_json::from_value(json!({
            "metadata": {"name": "default", "namespace": "x", "labels": {"mine": "yes"}},
            "automountServiceAccountToken": false
        }))
        .unwrap();
        assert!(DefaultServiceAccount.repaired(&edited).is_none());
    }
}
