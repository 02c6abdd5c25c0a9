//! crictl's pod and container config files: JSON or YAML, field names in snake_case (crictl's
//! examples) or camelCase (protobuf JSON), checked for the metadata crictl requires.

use std::path::Path;

use anyhow::bail;
use k8s_cri::v1 as cri;
use serde_json::Value;

use super::protojson;

/// The document in `text`: JSON when it looks like JSON, else YAML (as Kubernetes' decoder
/// sniffs it).
fn parse_document(text: &str) -> anyhow::Result<Value> {
    if text.trim_start().starts_with('{') {
        return Ok(serde_json::from_str(text)?);
    }
    let v: Value = serde_yaml::from_str(text)?;
    if !v.is_object() {
        bail!("the config is not an object");
    }
    Ok(v)
}

fn read(path: &Path) -> anyhow::Result<Value> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("config at {} not found", path.display()),
        Err(e) => bail!("reading {}: {e}", path.display()),
    };
    parse_document(&text)
}

#[cfg(test)]
fn pod_config_from(text: &str) -> anyhow::Result<cri::PodSandboxConfig> {
    pod_config(&parse_document(text)?)
}

fn pod_config(v: &Value) -> anyhow::Result<cri::PodSandboxConfig> {
    let config: cri::PodSandboxConfig = protojson::from_value(v)?;
    let Some(m) = &config.metadata else { bail!("metadata is not set") };
    if m.name.is_empty() || m.namespace.is_empty() || m.uid.is_empty() {
        bail!("name, namespace or uid is not in metadata {:?}", protojson::to_value(m).to_string());
    }
    Ok(config)
}

#[cfg(test)]
fn container_config_from(text: &str) -> anyhow::Result<cri::ContainerConfig> {
    container_config(&parse_document(text)?)
}

fn container_config(v: &Value) -> anyhow::Result<cri::ContainerConfig> {
    let config: cri::ContainerConfig = protojson::from_value(v)?;
    let Some(m) = &config.metadata else { bail!("metadata is not set") };
    if m.name.is_empty() {
        bail!("name is not in metadata {:?}", protojson::to_value(m).to_string());
    }
    Ok(config)
}

pub fn load_pod_config(path: &Path) -> anyhow::Result<cri::PodSandboxConfig> {
    pod_config(&read(path)?)
}

pub fn load_container_config(path: &Path) -> anyhow::Result<cri::ContainerConfig> {
    container_config(&read(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    // crictl's own example, docs/examples/podsandbox-config.yaml style, in snake_case.
    const POD_YAML: &str = r#"
metadata:
  name: busybox-sandbox
  namespace: default
  attempt: 1
  uid: hdishd83djaidwnduwk28bcsb
log_directory: /tmp
linux:
  security_context:
    namespace_options:
      network: NODE
labels:
  version: 1
"#;

    const POD_JSON: &str = r#"{
  "metadata": {"name": "busybox-sandbox", "namespace": "default", "attempt": 1, "uid": "hdishd83djaidwnduwk28bcsb"},
  "logDirectory": "/tmp",
  "linux": {"securityContext": {"namespaceOptions": {"network": 2}}},
  "labels": {"version": "1"}
}"#;

    #[test]
    fn pod_configs_read_from_yaml_snake_case_and_json_camel_case_alike() {
        let a = pod_config_from(POD_YAML).unwrap();
        let b = pod_config_from(POD_JSON).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.log_directory, "/tmp");
        assert_eq!(a.labels["version"], "1");
        let ns = a.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
    }

    #[test]
    fn container_configs_read_commands_envs_and_mounts() {
        let c = container_config_from(
            r#"{"metadata": {"name": "app"}, "image": {"image": "busybox"}, "command": ["sh", "-c", "echo hi"],
                "envs": [{"key": "A", "value": "b"}], "log_path": "app.log",
                "mounts": [{"container_path": "/d", "host_path": "/tmp", "readonly": true}]}"#,
        )
        .unwrap();
        assert_eq!(c.image.unwrap().image, "busybox");
        assert_eq!(c.command, ["sh", "-c", "echo hi"]);
        assert_eq!(c.envs[0].key, "A");
        assert_eq!(c.log_path, "app.log");
        assert!(c.mounts[0].readonly);
    }

    #[test]
    fn configs_without_the_required_metadata_are_refused_like_crictl() {
        let e = pod_config_from(r#"{"log_directory": "/tmp"}"#).unwrap_err();
        assert_eq!(e.to_string(), "metadata is not set");
        let e = pod_config_from(r#"{"metadata": {"name": "x", "namespace": "y"}}"#).unwrap_err();
        assert!(e.to_string().starts_with("name, namespace or uid is not in metadata"), "{e}");
        let e = container_config_from("metadata:\n  attempt: 1\n").unwrap_err();
        assert!(e.to_string().starts_with("name is not in metadata"), "{e}");
        assert!(pod_config_from("- a list").is_err());
    }

    #[test]
    fn missing_files_are_named() {
        let e = load_pod_config(Path::new("/nonexistent/pod.json")).unwrap_err();
        assert_eq!(e.to_string(), "config at /nonexistent/pod.json not found");
    }
}
