//! A container's environment as kubelet computes it: `envFrom` then `env`, `$(VAR)` references,
//! and values from the pod's fields, its resources, ConfigMaps and Secrets; plus the same field
//! and resource lookups for downwardAPI volumes.
//!
//! Pure: the ConfigMaps and Secrets are fetched beforehand into [`Sources`].

use std::collections::{BTreeMap, HashMap};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1 as core;

use super::resources;
use super::tokens::TokenKey;

/// Why a container cannot be configured: its waiting reason is `CreateContainerConfigError`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound { key: String, namespace: String, name: String },
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound { key: String, namespace: String, name: String },
    #[error("unsupported fieldPath: {0}")]
    UnsupportedField(String),
    #[error("unsupported container resource: {0}")]
    UnsupportedResource(String),
    #[error("container {0:?} not found in the pod")]
    NoSuchContainer(String),
}

/// The ConfigMaps and Secrets a pod refers to, fetched from the API (`None`: it does not exist),
/// and the service account tokens its projected volumes need (`Err`: why there is none).
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub config_maps: HashMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    pub secrets: HashMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    pub tokens: HashMap<TokenKey, Result<String, String>>,
    /// The Services whose variables every container gets ([`service_links`]).
    pub services: Vec<core::Service>,
}

impl Sources {
    pub fn config_map(&self, name: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.config_maps.get(name).and_then(Option::as_ref)
    }
    pub fn secret(&self, name: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.secrets.get(name).and_then(Option::as_ref)
    }
}

/// The data of a ConfigMap, text and binary together, as one map of bytes.
pub fn config_map_data(cm: &core::ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> =
        cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect();
    data.extend(cm.binary_data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())));
    data
}

pub fn secret_data(secret: &core::Secret) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> =
        secret.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    data.extend(secret.string_data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())));
    data
}

/// Names of the ConfigMaps and Secrets the pod's containers take environment from.
pub fn referenced(spec: &core::PodSpec) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        for from in c.env_from.iter().flatten() {
            cms.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(from.secret_ref.as_ref().map(|r| r.name.clone()));
        }
        for var in c.env.iter().flatten() {
            let Some(from) = &var.value_from else { continue };
            cms.extend(from.config_map_key_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(from.secret_key_ref.as_ref().map(|r| r.name.clone()));
        }
    }
    for list in [&mut cms, &mut secrets] {
        list.sort();
        list.dedup();
    }
    (cms, secrets)
}

/// What the downward API can tell about the pod beyond its spec: addresses and the node's size.
#[derive(Clone, Debug, Default)]
pub struct PodContext {
    pub host_ips: Vec<String>,
    pub pod_ips: Vec<String>,
    /// Node allocatable, used for a `limits.*` the container leaves unset.
    pub node_cpu_millis: i64,
    pub node_memory_bytes: i64,
}

/// The value of a `fieldRef` (`metadata.name`, `metadata.labels['app']`, `status.podIP`, …).
pub fn field_value(pod: &core::Pod, ctx: &PodContext, path: &str) -> Result<String, ConfigError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some(key) = subscript(path, "metadata.labels") {
        return Ok(meta.labels.as_ref().and_then(|l| l.get(key)).cloned().unwrap_or_default());
    }
    if let Some(key) = subscript(path, "metadata.annotations") {
        return Ok(meta.annotations.as_ref().and_then(|a| a.get(key)).cloned().unwrap_or_default());
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" => ctx.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => ctx.host_ips.join(","),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        other => return Err(ConfigError::UnsupportedField(other.to_string())),
    })
}

/// `metadata.labels['key']` → `key`.
fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(prefix)?.strip_prefix("['")?.strip_suffix("']")?;
    Some(rest)
}

/// `key="value"` lines, sorted by key, as kubelet writes label and annotation maps.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a `resourceFieldRef` for `container` (divided by the divisor, rounded up).
pub fn resource_value(
    pod: &core::Pod,
    ctx: &PodContext,
    selector: &core::ResourceFieldSelector,
    default_container: Option<&str>,
) -> Result<String, ConfigError> {
    let spec = pod.spec.as_ref();
    let name = selector.container_name.as_deref().filter(|n| !n.is_empty()).or(default_container).unwrap_or("");
    let container = spec
        .into_iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .find(|c| c.name == name)
        .ok_or_else(|| ConfigError::NoSuchContainer(name.to_string()))?;
    let divisor = selector.divisor.as_ref().map(|q| q.0.as_str()).filter(|d| !d.is_empty() && *d != "0");
    let (req, lim) = (resources::requests(container), resources::limits(container));
    let (value, divisor_units) = match selector.resource.as_str() {
        "limits.cpu" => (lim.cpu_millis.unwrap_or(ctx.node_cpu_millis), milli(divisor, 1000)),
        "requests.cpu" => (req.cpu_millis.unwrap_or(0), milli(divisor, 1000)),
        "limits.memory" => (lim.memory_bytes.unwrap_or(ctx.node_memory_bytes), bytes(divisor)),
        "requests.memory" => (req.memory_bytes.unwrap_or(0), bytes(divisor)),
        other => return Err(ConfigError::UnsupportedResource(other.to_string())),
    };
    let divisor_units = divisor_units.max(1);
    Ok(((value + divisor_units - 1) / divisor_units).to_string())
}

fn milli(divisor: Option<&str>, default: i64) -> i64 {
    divisor
        .and_then(|d| berth_api::validation::Quantity::parse(d).ok())
        .map_or(default, |q| i64::try_from((q.0 + 999_999) / 1_000_000).unwrap_or(default))
}

fn bytes(divisor: Option<&str>) -> i64 {
    divisor
        .and_then(|d| berth_api::validation::Quantity::parse(d).ok())
        .map_or(1, |q| i64::try_from((q.0 + 999_999_999) / 1_000_000_000).unwrap_or(1))
}

/// The Services a pod's containers get variables of, as kubelet picks them: the `kubernetes`
/// Service of the `default` namespace always, and with `enableServiceLinks` (the default) every
/// Service of the pod's namespace (which wins over the former on a name clash). `all` holds the
/// candidates from both namespaces.
pub fn service_links(spec: &core::PodSpec, namespace: &str, all: Vec<core::Service>) -> Vec<core::Service> {
    let links = spec.enable_service_links.unwrap_or(true);
    let mut by_name: BTreeMap<String, core::Service> = BTreeMap::new();
    for svc in all {
        let ip = svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()).unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let name = svc.metadata.name.clone().unwrap_or_default();
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        if ns == namespace && links {
            by_name.insert(name, svc);
        } else if ns == "default" && name == "kubernetes" {
            by_name.entry(name).or_insert(svc);
        }
    }
    by_name.into_values().collect()
}

/// The variables of `services` (`<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORT>]` and the
/// Docker-link `<NAME>_PORT…` ones), as kubelet sets them.
pub fn service_variables(services: &[core::Service]) -> Vec<(String, String)> {
    let upper = |s: &str| s.to_uppercase().replace('-', "_");
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let name = upper(svc.metadata.name.as_deref().unwrap_or_default());
        let ports = spec.ports.as_deref().unwrap_or_default();
        out.push((format!("{name}_SERVICE_HOST"), ip.clone()));
        if let Some(first) = ports.first() {
            out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in ports {
            if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{name}_SERVICE_PORT_{}", upper(port_name)), p.port.to_string()));
            }
        }
        for (i, p) in ports.iter().enumerate().rev() {
            let proto = p.protocol.as_deref().unwrap_or("TCP").to_lowercase();
            let url = format!("{proto}://{ip}:{}", p.port);
            let prefix = format!("{name}_PORT_{}_{}", p.port, proto.to_uppercase());
            if i == 0 {
                out.push((format!("{name}_PORT"), url.clone()));
            }
            out.push((prefix.clone(), url));
            out.push((format!("{prefix}_PROTO"), proto));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.clone()));
        }
    }
    out
}

/// The container's environment, in kubelet's order: the Services' variables, then `envFrom`
/// sources in order, then `env` (later entries replace earlier ones of the same name, keeping
/// the first position).
pub fn environment(
    pod: &core::Pod,
    container: &core::Container,
    ctx: &PodContext,
    sources: &Sources,
) -> Result<Vec<cri::KeyValue>, ConfigError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut env: Vec<(String, String)> = service_variables(&sources.services);
    let set =
        |env: &mut Vec<(String, String)>, key: String, value: String| match env.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => env.push((key, value)),
        };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        if let Some(r) = &from.config_map_ref {
            match sources.config_map(&r.name) {
                Some(data) => {
                    for (k, v) in data {
                        set(&mut env, format!("{prefix}{k}"), String::from_utf8_lossy(v).into_owned());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(ConfigError::ConfigMapNotFound(r.name.clone())),
            }
        }
        if let Some(r) = &from.secret_ref {
            match sources.secret(&r.name) {
                Some(data) => {
                    for (k, v) in data {
                        set(&mut env, format!("{prefix}{k}"), String::from_utf8_lossy(v).into_owned());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(ConfigError::SecretNotFound(r.name.clone())),
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let known: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                expand(var.value.as_deref().unwrap_or(""), &|name| known.get(name).map(|v| v.to_string()))
            }
            Some(from) => {
                if let Some(f) = &from.field_ref {
                    field_value(pod, ctx, &f.field_path)?
                } else if let Some(r) = &from.resource_field_ref {
                    resource_value(pod, ctx, r, Some(&container.name))?
                } else if let Some(r) = &from.config_map_key_ref {
                    match sources.config_map(&r.name) {
                        Some(data) => match data.get(&r.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Err(ConfigError::ConfigMapKeyNotFound {
                                    key: r.key.clone(),
                                    namespace: namespace.to_string(),
                                    name: r.name.clone(),
                                });
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Err(ConfigError::ConfigMapNotFound(r.name.clone())),
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    match sources.secret(&r.name) {
                        Some(data) => match data.get(&r.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Err(ConfigError::SecretKeyNotFound {
                                    key: r.key.clone(),
                                    namespace: namespace.to_string(),
                                    name: r.name.clone(),
                                });
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Err(ConfigError::SecretNotFound(r.name.clone())),
                    }
                } else {
                    String::new()
                }
            }
        };
        set(&mut env, var.name.clone(), value);
    }
    Ok(env.into_iter().map(|(key, value)| cri::KeyValue { key, value }).collect())
}

/// Kubernetes' `$(VAR)` expansion: known references are replaced, unknown ones stay as written,
/// `$$` is a literal `$`.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Command or args with `$(VAR)` replaced from the container's environment.
pub fn expand_all(words: Option<&Vec<String>>, env: &[cri::KeyValue]) -> Vec<String> {
    let lookup = |name: &str| env.iter().find(|kv| kv.key == name).map(|kv| kv.value.clone());
    words.into_iter().flatten().map(|w| expand(w, &lookup)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(container: core::Container) -> core::Pod {
        core::Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into()), ("tier".into(), "front".into())])),
                ..Default::default()
            },
            spec: Some(core::PodSpec {
                node_name: Some("node-a".into()),
                containers: vec![container],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn var(name: &str, value: &str) -> core::EnvVar {
        core::EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
    }

    fn from(name: &str, source: core::EnvVarSource) -> core::EnvVar {
        core::EnvVar { name: name.into(), value: None, value_from: Some(source) }
    }

    fn ctx() -> PodContext {
        PodContext {
            host_ips: vec!["192.0.2.10".into()],
            pod_ips: vec!["10.88.0.5".into(), "fd00::5".into()],
            node_cpu_millis: 4000,
            node_memory_bytes: 8 << 30,
        }
    }

    fn sources() -> Sources {
        let data = |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect());
        Sources {
            config_maps: HashMap::from([
                ("settings".into(), data(&[("LEVEL", "debug"), ("MODE", "fast")])),
                ("gone".into(), None),
            ]),
            secrets: HashMap::from([("creds".into(), data(&[("password", "hunter2")]))]),
            ..Default::default()
        }
    }

    fn env_of(c: core::Container) -> Result<Vec<(String, String)>, ConfigError> {
        let p = pod(c.clone());
        Ok(environment(&p, &c, &ctx(), &sources())?.into_iter().map(|kv| (kv.key, kv.value)).collect())
    }

    fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn env_from_comes_first_and_env_overrides_it_in_place() {
        let c = core::Container {
            name: "app".into(),
            env_from: Some(vec![core::EnvFromSource {
                config_map_ref: Some(core::ConfigMapEnvSource { name: "settings".into(), optional: None }),
                prefix: Some("CFG_".into()),
                secret_ref: None,
            }]),
            env: Some(vec![var("CFG_MODE", "slow"), var("GREETING", "level=$(CFG_LEVEL) $(NOPE) $$(CFG_LEVEL)")]),
            ..Default::default()
        };
        assert_eq!(
            env_of(c).unwrap(),
            pairs(&[("CFG_LEVEL", "debug"), ("CFG_MODE", "slow"), ("GREETING", "level=debug $(NOPE) $(CFG_LEVEL)")])
        );
    }

    #[test]
    fn field_resource_configmap_and_secret_references_resolve() {
        let field = |path: &str| core::EnvVarSource {
            field_ref: Some(core::ObjectFieldSelector { field_path: path.into(), api_version: None }),
            ..Default::default()
        };
        let c = core::Container {
            name: "app".into(),
            resources: Some(core::ResourceRequirements {
                limits: Some(BTreeMap::from([("memory".into(), Quantity("64Mi".into()))])),
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("250m".into()))])),
                ..Default::default()
            }),
            env: Some(vec![
                from("NAME", field("metadata.name")),
                from("NS", field("metadata.namespace")),
                from("APP", field("metadata.labels['app']")),
                from("NODE", field("spec.nodeName")),
                from("POD_IP", field("status.podIP")),
                from("POD_IPS", field("status.podIPs")),
                from("HOST_IP", field("status.hostIP")),
                from(
                    "MEM_MI",
                    core::EnvVarSource {
                        resource_field_ref: Some(core::ResourceFieldSelector {
                            resource: "limits.memory".into(),
                            divisor: Some(Quantity("1Mi".into())),
                            container_name: None,
                        }),
                        ..Default::default()
                    },
                ),
                from(
                    "CPU_LIMIT",
                    core::EnvVarSource {
                        resource_field_ref: Some(core::ResourceFieldSelector {
                            resource: "limits.cpu".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
                from(
                    "CPU_REQ_M",
                    core::EnvVarSource {
                        resource_field_ref: Some(core::ResourceFieldSelector {
                            resource: "requests.cpu".into(),
                            divisor: Some(Quantity("1m".into())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
                from(
                    "LEVEL",
                    core::EnvVarSource {
                        config_map_key_ref: Some(core::ConfigMapKeySelector {
                            name: "settings".into(),
                            key: "LEVEL".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                ),
                from(
                    "PASSWORD",
                    core::EnvVarSource {
                        secret_key_ref: Some(core::SecretKeySelector {
                            name: "creds".into(),
                            key: "password".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                ),
            ]),
            ..Default::default()
        };
        assert_eq!(
            env_of(c).unwrap(),
            pairs(&[
                ("NAME", "web"),
                ("NS", "prod"),
                ("APP", "web"),
                ("NODE", "node-a"),
                ("POD_IP", "10.88.0.5"),
                ("POD_IPS", "10.88.0.5,fd00::5"),
                ("HOST_IP", "192.0.2.10"),
                ("MEM_MI", "64"),
                ("CPU_LIMIT", "4"),
                ("CPU_REQ_M", "250"),
                ("LEVEL", "debug"),
                ("PASSWORD", "hunter2"),
            ])
        );
    }

    #[test]
    fn missing_configmaps_secrets_and_keys_are_config_errors_unless_optional() {
        let key_ref = |name: &str, key: &str, optional: Option<bool>| core::EnvVarSource {
            config_map_key_ref: Some(core::ConfigMapKeySelector { name: name.into(), key: key.into(), optional }),
            ..Default::default()
        };
        let with =
            |source| core::Container { name: "app".into(), env: Some(vec![from("X", source)]), ..Default::default() };
        assert_eq!(env_of(with(key_ref("gone", "k", None))).unwrap_err().to_string(), "configmap \"gone\" not found");
        assert_eq!(
            env_of(with(key_ref("settings", "nope", None))).unwrap_err().to_string(),
            "couldn't find key nope in ConfigMap prod/settings"
        );
        assert_eq!(env_of(with(key_ref("gone", "k", Some(true)))).unwrap(), vec![]);
        assert_eq!(env_of(with(key_ref("settings", "nope", Some(true)))).unwrap(), vec![]);
        let secret = core::EnvVarSource {
            secret_key_ref: Some(core::SecretKeySelector { name: "missing".into(), key: "k".into(), optional: None }),
            ..Default::default()
        };
        assert_eq!(env_of(with(secret)).unwrap_err().to_string(), "secret \"missing\" not found");
    }

    #[test]
    fn expansion_keeps_unknown_references_and_unterminated_ones() {
        let lookup = |n: &str| (n == "A").then(|| "1".to_string());
        assert_eq!(expand("$(A)-$(B)-$$-$x-$(A", &lookup), "1-$(B)-$-$x-$(A");
        let env = vec![cri::KeyValue { key: "A".into(), value: "1".into() }];
        assert_eq!(expand_all(Some(&vec!["echo".into(), "$(A)".into()]), &env), vec!["echo", "1"]);
    }

    #[test]
    fn referenced_sources_are_listed_once() {
        let c = core::Container {
            name: "a".into(),
            env_from: Some(vec![core::EnvFromSource {
                secret_ref: Some(core::SecretEnvSource { name: "s".into(), optional: None }),
                ..Default::default()
            }]),
            env: Some(vec![from(
                "X",
                core::EnvVarSource {
                    secret_key_ref: Some(core::SecretKeySelector { name: "s".into(), key: "k".into(), optional: None }),
                    ..Default::default()
                },
            )]),
            ..Default::default()
        };
        assert_eq!(referenced(pod(c).spec.as_ref().unwrap()), (vec![], vec!["s".to_string()]));
    }

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> core::Service {
        serde_json::from_value(serde_json::json!({"metadata": {"namespace": ns, "name": name},
            "spec": {"clusterIP": ip, "ports": ports}}))
        .unwrap()
    }

    #[test]
    fn services_give_kubelets_host_port_and_link_variables() {
        let vars = service_variables(&[svc(
            "ns",
            "foo-service",
            "10.96.0.7",
            serde_json::json!([{"name": "http", "port": 8765}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
        )]);
        let get = |k: &str| vars.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("FOO_SERVICE_SERVICE_HOST"), Some("10.96.0.7"));
        assert_eq!(get("FOO_SERVICE_SERVICE_PORT"), Some("8765"));
        assert_eq!(get("FOO_SERVICE_SERVICE_PORT_HTTP"), Some("8765"));
        assert_eq!(get("FOO_SERVICE_SERVICE_PORT_DNS"), Some("53"));
        assert_eq!(get("FOO_SERVICE_PORT"), Some("tcp://10.96.0.7:8765"));
        assert_eq!(get("FOO_SERVICE_PORT_8765_TCP_ADDR"), Some("10.96.0.7"));
        assert_eq!(get("FOO_SERVICE_PORT_53_UDP"), Some("udp://10.96.0.7:53"));
        assert_eq!(get("FOO_SERVICE_PORT_53_UDP_PROTO"), Some("udp"));
    }

    #[test]
    fn the_kubernetes_service_is_always_linked_and_the_namespaces_only_with_service_links() {
        let all = || {
            vec![
                svc("default", "kubernetes", "10.96.0.1", serde_json::json!([{"name": "https", "port": 443}])),
                svc("team", "web", "10.96.0.9", serde_json::json!([{"port": 80}])),
                svc("team", "headless", "None", serde_json::json!([{"port": 80}])),
                svc("other", "db", "10.96.0.5", serde_json::json!([{"port": 5432}])),
            ]
        };
        let names = |v: Vec<core::Service>| v.into_iter().map(|s| s.metadata.name.unwrap()).collect::<Vec<_>>();
        let mut spec = core::PodSpec::default();
        assert_eq!(names(service_links(&spec, "team", all())), ["kubernetes", "web"]);
        spec.enable_service_links = Some(false);
        assert_eq!(names(service_links(&spec, "team", all())), ["kubernetes"]);
    }

    #[test]
    fn a_containers_own_variable_wins_over_a_services() {
        let sources = Sources {
            services: vec![svc("ns", "web", "10.96.0.9", serde_json::json!([{"port": 80}]))],
            ..Sources::default()
        };
        let pod: core::Pod = serde_json::from_value(serde_json::json!({"metadata": {"namespace": "ns"},
            "spec": {"containers": [{"name": "c", "env": [{"name": "WEB_SERVICE_HOST", "value": "mine"}]}]}}))
        .unwrap();
        let container = pod.spec.as_ref().unwrap().containers[0].clone();
        let env = environment(&pod, &container, &PodContext::default(), &sources).unwrap();
        let host: Vec<&str> =
            env.iter().filter(|kv| kv.key == "WEB_SERVICE_HOST").map(|kv| kv.value.as_str()).collect();
        assert_eq!(host, ["mine"]);
    }
}
