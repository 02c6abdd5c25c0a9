//! Admission: one ordered chain of named plugins, run once per write (create, update, delete,
//! and the `binding`, `status`, `scale` and `finalize` writes), mutating plugins first, then the
//! kind's own validation, then validating plugins, as kube-apiserver runs its chain.
//!
//! The plugins berth has, in kube-apiserver's order (`AllOrderedPlugins` in
//! `pkg/kubeapiserver/options/plugins.go`). Four are on by default there; NodeRestriction is
//! the one clusters turn on themselves (`--enable-admission-plugins=NodeRestriction`, as kubeadm
//! does), and berth always runs it. ServiceAccount is the one `--disable-admission-plugins` may
//! turn off:
//!
//! | plugin                     | phase                | operations             | does                                                        |
//! |----------------------------|----------------------|------------------------|-------------------------------------------------------------|
//! | `NamespaceLifecycle`       | mutating             | create, delete         | no content in missing or terminating namespaces; `default`, `kube-system`, `kube-public` are not deleted |
//! | `ServiceAccount`           | mutating             | create (pods)          | the pod's ServiceAccount must exist; its token volume is mounted (on in `berth server`) |
//! | `NodeRestriction`          | mutating             | create, update, delete | what a node's own user may write                            |
//! | `DefaultTolerationSeconds` | mutating             | create, update (pods)  | `not-ready`/`unreachable` NoExecute tolerations for 300 s   |
//! | `RuntimeClass`             | mutating, validating | create (pods)          | berth's default class; the class's overhead and scheduling; overhead checked |
//!
//! Kubernetes' `Priority` plugin has no PriorityClass to read here: its one effect, priority 0
//! for pods, is part of pod defaulting (`berth_api::kinds::prepare_for_create`). The other
//! default plugins (LimitRanger, ResourceQuota, webhooks, ...) concern resources
//! berth does not serve.
//!
//! The handlers call [`create`], [`update`] or [`delete`] once per write, after defaulting and
//! the strategy's preparation and before storing; an error of any plugin ends the write with
//! nothing stored. Plugins see the requesting user through [`crate::authz::with_request_user`].

pub mod default_toleration_seconds;
pub mod namespace_lifecycle;
pub mod node_restriction;
pub mod runtime_class;
pub mod service_account;

pub use berth_api::admission::DefaultTolerationSeconds;
use serde_json::Value;

use crate::request::Target;
use crate::{ApiResult, ApiState, objects};

/// What a write does, as admission names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// One write as the plugins see it (Kubernetes' `admission.Attributes`); the object being
/// written is passed beside it.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// Resource, namespace and subresource of the request.
    pub target: &'a Target,
    /// The object's name as errors show it: on create the name from the URL (subresources) or
    /// the object's, else its `generateName`, else `Unknown`.
    pub name: &'a str,
    pub operation: Operation,
    /// The stored object an update or delete replaces.
    pub old: Option<&'a Value>,
}

/// The admission plugins berth has, by Kubernetes' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    NamespaceLifecycle,
    ServiceAccount,
    NodeRestriction,
    DefaultTolerationSeconds,
    RuntimeClass,
}

/// The chain, in kube-apiserver's order.
pub const CHAIN: [Plugin; 5] = [
    Plugin::NamespaceLifecycle,
    Plugin::ServiceAccount,
    Plugin::NodeRestriction,
    Plugin::DefaultTolerationSeconds,
    Plugin::RuntimeClass,
];

/// The plugins a server may turn on or off by name; the others always run.
pub const OPTIONAL: [Plugin; 1] = [Plugin::ServiceAccount];

impl Plugin {
    pub fn name(self) -> &'static str {
        match self {
            Plugin::NamespaceLifecycle => "NamespaceLifecycle",
            Plugin::ServiceAccount => "ServiceAccount",
            Plugin::NodeRestriction => "NodeRestriction",
            Plugin::DefaultTolerationSeconds => "DefaultTolerationSeconds",
            Plugin::RuntimeClass => "RuntimeClass",
        }
    }

    /// The operations the plugin registers for (its `admission.NewHandler(...)`).
    pub fn handles(self, op: Operation) -> bool {
        match self {
            // Upstream also handles updates, to refuse those in a namespace that no longer
            // exists; here a namespace leaves the store only once it is empty.
            Plugin::NamespaceLifecycle => matches!(op, Operation::Create | Operation::Delete),
            Plugin::NodeRestriction => true,
            Plugin::DefaultTolerationSeconds => matches!(op, Operation::Create | Operation::Update),
            Plugin::RuntimeClass | Plugin::ServiceAccount => op == Operation::Create,
        }
    }

    /// Has a mutating phase (`Admit`); every plugin here has one.
    pub fn mutates(self) -> bool {
        true
    }

    /// Has a validating phase (`Validate`).
    pub fn validates(self) -> bool {
        self == Plugin::RuntimeClass
    }
}

/// The chain's settings: kube-apiserver's admission flags.
///
/// `Default` leaves the ServiceAccount plugin off: it is the chain of in-process API servers
/// that run no serviceaccount controller (tests), where no namespace gets its `default`
/// ServiceAccount and every pod would be refused. `berth server` starts from
/// [`Admission::server_defaults`], kube-apiserver's, with the plugin on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admission {
    /// `--default-not-ready-toleration-seconds`, `--default-unreachable-toleration-seconds`.
    pub default_toleration_seconds: DefaultTolerationSeconds,
    /// The ServiceAccount plugin runs (`--disable-admission-plugins=ServiceAccount` turns it
    /// off in `berth server`).
    pub service_account: bool,
}

impl Admission {
    /// kube-apiserver's default chain, as `berth server` runs it: ServiceAccount on.
    pub fn server_defaults(default_toleration_seconds: DefaultTolerationSeconds) -> Admission {
        Admission { default_toleration_seconds, service_account: true }
    }

    /// Whether `plugin` runs with these settings.
    pub fn enabled(&self, plugin: Plugin) -> bool {
        plugin != Plugin::ServiceAccount || self.service_account
    }

    /// Applies `--enable-admission-plugins` and `--disable-admission-plugins` (names as
    /// Kubernetes spells them); a name of a plugin berth lacks or always runs is an error.
    pub fn set_plugins(&mut self, enable: &[String], disable: &[String]) -> Result<(), String> {
        for (names, on) in [(enable, true), (disable, false)] {
            for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
                match OPTIONAL.iter().find(|p| p.name() == name) {
                    Some(Plugin::ServiceAccount) => self.service_account = on,
                    Some(_) => {}
                    None if CHAIN.iter().any(|p| p.name() == name) => {
                        if !on {
                            return Err(format!("admission plugin {name:?} cannot be disabled in berth"));
                        }
                    }
                    None => return Err(format!("unknown admission plugin {name:?}")),
                }
            }
        }
        if enable.iter().any(|e| disable.contains(e)) {
            return Err("an admission plugin cannot be both enabled and disabled".into());
        }
        Ok(())
    }
}

/// What one run of the chain carries from the mutating phase to the validating one.
#[derive(Debug, Default)]
struct Run {
    runtime_class: runtime_class::Resolved,
}

/// Admits the create of `obj` at `t`, prepared for create; `validate` is the kind's validation.
pub async fn create(
    state: &ApiState,
    t: &Target,
    obj: &mut Value,
    validate: impl FnOnce(&Value) -> ApiResult<()>,
) -> ApiResult<()> {
    let name = match (t.name.as_deref(), objects::name(obj)) {
        (Some(url_name), _) => url_name.to_string(),
        (None, "") => objects::meta_str(obj, "generateName").unwrap_or("Unknown").to_string(),
        (None, name) => name.to_string(),
    };
    let attrs = Attributes { target: t, name: &name, operation: Operation::Create, old: None };
    run(state, &attrs, Some(obj), validate).await
}

/// Admits the update of the stored `old` to `new` at `t` (the main resource or a subresource),
/// `new` prepared for update; `validate` is the kind's validation of the update.
pub async fn update(
    state: &ApiState,
    t: &Target,
    old: &Value,
    new: &mut Value,
    validate: impl FnOnce(&Value) -> ApiResult<()>,
) -> ApiResult<()> {
    let attrs = Attributes { target: t, name: objects::name(old), operation: Operation::Update, old: Some(old) };
    run(state, &attrs, Some(new), validate).await
}

/// Admits the deletion of the stored `old` at `t`.
pub async fn delete(state: &ApiState, t: &Target, old: &Value) -> ApiResult<()> {
    let attrs = Attributes { target: t, name: objects::name(old), operation: Operation::Delete, old: Some(old) };
    run(state, &attrs, None, |_| Ok(())).await
}

async fn run(
    state: &ApiState,
    attrs: &Attributes<'_>,
    mut obj: Option<&mut Value>,
    validate: impl FnOnce(&Value) -> ApiResult<()>,
) -> ApiResult<()> {
    let mut run = Run::default();
    let enabled = |p: &Plugin| state.admission.enabled(*p) && p.handles(attrs.operation);
    for plugin in CHAIN.into_iter().filter(|p| p.mutates() && enabled(p)) {
        admit(plugin, state, attrs, obj.as_deref_mut(), &mut run).await.inspect_err(|e| rejected(plugin, attrs, e))?;
    }
    if let Some(obj) = obj.as_deref() {
        validate(obj)?;
    }
    for plugin in CHAIN.into_iter().filter(|p| p.validates() && enabled(p)) {
        check(plugin, attrs, obj.as_deref(), &run).inspect_err(|e| rejected(plugin, attrs, e))?;
    }
    Ok(())
}

fn rejected(plugin: Plugin, attrs: &Attributes<'_>, e: &crate::ApiError) {
    tracing::debug!(
        plugin = plugin.name(),
        operation = ?attrs.operation,
        resource = attrs.target.rt.plural,
        name = attrs.name,
        code = e.code,
        "admission rejected the request"
    );
}

/// The mutating phase of one plugin.
async fn admit(
    plugin: Plugin,
    state: &ApiState,
    attrs: &Attributes<'_>,
    obj: Option<&mut Value>,
    run: &mut Run,
) -> ApiResult<()> {
    match plugin {
        Plugin::NamespaceLifecycle => namespace_lifecycle::admit(state, attrs).await,
        Plugin::ServiceAccount => match obj {
            Some(obj) => service_account::admit(state, attrs, obj).await,
            None => Ok(()),
        },
        Plugin::NodeRestriction => node_restriction::admit(attrs, obj.as_deref()),
        Plugin::DefaultTolerationSeconds => match obj {
            Some(obj) => default_toleration_seconds::admit(&state.admission.default_toleration_seconds, attrs, obj),
            None => Ok(()),
        },
        Plugin::RuntimeClass => match obj {
            Some(obj) => runtime_class::admit(state, attrs, obj, &mut run.runtime_class).await,
            None => Ok(()),
        },
    }
}

/// The validating phase of one plugin.
fn check(plugin: Plugin, attrs: &Attributes<'_>, obj: Option<&Value>, run: &Run) -> ApiResult<()> {
    match (plugin, obj) {
        (Plugin::RuntimeClass, Some(obj)) => runtime_class::validate(attrs, obj, &run.runtime_class),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_keeps_kube_apiservers_order() {
        let names: Vec<&str> = CHAIN.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            ["NamespaceLifecycle", "ServiceAccount", "NodeRestriction", "DefaultTolerationSeconds", "RuntimeClass"]
        );
    }

    #[test]
    fn the_service_account_plugin_is_on_in_servers_and_turned_on_or_off_by_name() {
        let mut server = Admission::server_defaults(DefaultTolerationSeconds::default());
        assert!(server.enabled(Plugin::ServiceAccount));
        server.set_plugins(&[], &["ServiceAccount".into()]).unwrap();
        assert!(!server.enabled(Plugin::ServiceAccount), "--disable-admission-plugins=ServiceAccount");
        let mut a = Admission::default();
        assert!(!a.enabled(Plugin::ServiceAccount) && a.enabled(Plugin::NodeRestriction));
        a.set_plugins(&["ServiceAccount".into()], &[]).unwrap();
        assert!(a.enabled(Plugin::ServiceAccount));
        a.set_plugins(&[], &["ServiceAccount".into()]).unwrap();
        assert!(!a.enabled(Plugin::ServiceAccount));
        assert_eq!(
            a.set_plugins(&["AlwaysPullImages".into()], &[]),
            Err("unknown admission plugin \"AlwaysPullImages\"".into())
        );
        assert!(a.set_plugins(&[], &["NodeRestriction".into()]).is_err());
        assert!(a.set_plugins(&["NodeRestriction".into()], &[]).is_ok(), "enabling one that always runs is harmless");
    }

    #[test]
    fn plugins_register_for_kubernetes_operations() {
        assert!(!Plugin::RuntimeClass.handles(Operation::Update));
        assert!(!Plugin::DefaultTolerationSeconds.handles(Operation::Delete));
        assert!(Plugin::NodeRestriction.handles(Operation::Delete));
        assert!(Plugin::NamespaceLifecycle.handles(Operation::Delete));
        assert_eq!(CHAIN.iter().filter(|p| p.validates()).count(), 1);
    }
}
