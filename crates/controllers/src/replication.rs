//! The ReplicationController controller: the ReplicaSet controller run over ReplicationControllers.
//!
//! As in kube-controller-manager (`pkg/controller/replication`), nothing here is its own logic:
//! an RC's selector is a plain map of labels, its pods are named `<rc>-` and controlled by an
//! owner reference of kind `ReplicationController` (`v1`), its status has the ReplicaSet's
//! counts and `ReplicaFailure` condition, and its events the same reasons. What differs between
//! the two kinds is in `workloads::replicated`; the controller itself is [`crate::replicaset`]'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ReplicationController;

use crate::Context;

/// Runs the ReplicationController controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    crate::replicaset::run_for::<ReplicationController>(ctx).await
}
