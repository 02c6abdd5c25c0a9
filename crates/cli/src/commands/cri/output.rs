//! crictl's output forms: CRI messages as protobuf JSON (camelCase names, 64-bit integers as
//! strings, unset messages as `null`, every field emitted), its YAML, and its aligned tables.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use serde_json::{Map, Value, json};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Yaml,
    Table,
}

/// Prints `value` as crictl does for `-o json` (two-space indent) or `-o yaml`.
pub fn print(value: &Value, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Yaml => print!("{}", serde_yaml::to_string(value)?),
        Format::Json | Format::Table => println!("{}", serde_json::to_string_pretty(value)?),
    }
    Ok(())
}

/// crictl's `{"status": …, <info key>: <info JSON>…}`: info values that are JSON are embedded,
/// others kept as strings; keys sorted.
pub fn status_info(status: Value, extra: Vec<(&str, Value)>, info: &HashMap<String, String>) -> Value {
    let mut out = Map::new();
    out.insert("status".into(), status);
    for (k, v) in extra {
        out.insert(k.into(), v);
    }
    let mut keys: Vec<_> = info.keys().collect();
    keys.sort();
    for k in keys {
        let v = serde_json::from_str(&info[k]).unwrap_or_else(|_| Value::String(info[k].clone()));
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

fn string_map(m: &HashMap<String, String>) -> Value {
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    Value::Object(keys.into_iter().map(|k| (k.clone(), json!(m[k]))).collect())
}

pub fn image_spec(s: Option<&cri::ImageSpec>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "image": s.image,
            "annotations": string_map(&s.annotations),
            "userSpecifiedImage": s.user_specified_image,
            "runtimeHandler": s.runtime_handler,
        }),
    }
}

pub fn image(i: &cri::Image) -> Value {
    json!({
        "id": i.id,
        "repoTags": i.repo_tags,
        "repoDigests": i.repo_digests,
        "size": i.size.to_string(),
        "uid": i.uid.as_ref().map(|u| json!({"value": u.value.to_string()})),
        "username": i.username,
        "spec": image_spec(i.spec.as_ref()),
        "pinned": i.pinned,
    })
}

pub fn list_images(r: &cri::ListImagesResponse) -> Value {
    json!({ "images": r.images.iter().map(image).collect::<Vec<_>>() })
}

fn uint64(v: Option<&cri::UInt64Value>) -> Value {
    v.map_or(Value::Null, |v| json!({"value": v.value.to_string()}))
}

fn filesystem_usage(f: &cri::FilesystemUsage) -> Value {
    json!({
        "timestamp": f.timestamp.to_string(),
        "fsId": f.fs_id.as_ref().map(|id| json!({"mountpoint": id.mountpoint})),
        "usedBytes": uint64(f.used_bytes.as_ref()),
        "inodesUsed": uint64(f.inodes_used.as_ref()),
    })
}

pub fn image_fs_info(r: &cri::ImageFsInfoResponse) -> Value {
    json!({
        "imageFilesystems": r.image_filesystems.iter().map(filesystem_usage).collect::<Vec<_>>(),
        "containerFilesystems": r.container_filesystems.iter().map(filesystem_usage).collect::<Vec<_>>(),
    })
}

pub fn runtime_status(s: Option<&cri::RuntimeStatus>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "conditions": s.conditions.iter().map(|c| json!({
                "type": c.r#type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
            })).collect::<Vec<_>>(),
        }),
    }
}

pub fn runtime_handlers(h: &[cri::RuntimeHandler]) -> Value {
    h.iter()
        .map(|h| {
            json!({
                "name": h.name,
                "features": h.features.as_ref().map(|f| json!({
                    "recursiveReadOnlyMounts": f.recursive_read_only_mounts,
                    "userNamespaces": f.user_namespaces,
                })),
            })
        })
        .collect()
}

/// Sizes as crictl shows them (go-units `HumanSizeWithPrecision(size, 3)`): decimal units,
/// three significant digits.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1000.0 && unit < UNITS.len() - 1 {
        size /= 1000.0;
        unit += 1;
    }
    format!("{}{}", go_g3(size), UNITS[unit])
}

/// Go's `%.3g`: three significant digits, trailing zeros dropped.
fn go_g3(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let exp = v.abs().log10().floor() as i32;
    let rounded = format!("{:.*e}", 2, v);
    let (mantissa, e) = rounded.split_once('e').unwrap_or((&rounded, "0"));
    let e: i32 = e.parse().unwrap_or(exp);
    if !(-4..3).contains(&e) {
        let m = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let decimals = (2 - e).max(0) as usize;
    let s = format!("{:.*}", decimals, v);
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// crictl's short ids: the prefix dropped, 13 characters kept.
pub fn truncate_id(id: &str, prefix: &str) -> String {
    id.strip_prefix(prefix).unwrap_or(id).chars().take(13).collect()
}

/// crictl's `normalizeRepoDigest`: the image name and digest of the first repo digest.
pub fn repo_digest(digests: &[String]) -> (String, String) {
    match digests.first() {
        None => ("<none>".into(), "<none>".into()),
        Some(d) => match d.split_once('@') {
            Some((name, digest)) if !digest.contains('@') => (name.into(), digest.into()),
            _ => ("errorName".into(), "errorRepoDigest".into()),
        },
    }
}

/// crictl's `normalizeRepoTagPair`: (repository, tag) per tag, `<none>` when untagged.
pub fn repo_tag_pairs(tags: &[String], image_name: &str) -> Vec<(String, String)> {
    if tags.is_empty() {
        return vec![(image_name.into(), "<none>".into())];
    }
    tags.iter()
        .map(|t| match t.rsplit_once(':') {
            None => ("errorRepoTag".into(), "errorRepoTag".into()),
            Some((name, tag)) => (if name == "<none>" { image_name.into() } else { name.into() }, tag.into()),
        })
        .collect()
}

/// Go's `tabwriter.NewWriter(out, 20, 1, 3, ' ', 0)` as crictl uses it: every column but the
/// last padded to max(20, widest cell + 3).
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(row.len().saturating_sub(1)) {
            widths[i] = widths[i].max((cell.chars().count() + 3).max(20));
        }
    }
    let mut out = String::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                out.push_str(&format!("{cell:<width$}", width = widths[i]));
            } else {
                out.push_str(cell);
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_crictl() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(999), "999B");
        assert_eq!(human_size(1000), "1kB");
        assert_eq!(human_size(2_231_050), "2.23MB");
        assert_eq!(human_size(772_788), "773kB");
        assert_eq!(human_size(1_500_000), "1.5MB");
        assert_eq!(human_size(72_796_813), "72.8MB");
        assert_eq!(human_size(1_220_000_000), "1.22GB");
        assert_eq!(human_size(999_999), "1e+03kB");
    }

    #[test]
    fn ids_are_truncated_to_thirteen_characters() {
        assert_eq!(truncate_id("sha256:0123456789abcdef0123", "sha256:"), "0123456789abc");
        assert_eq!(truncate_id("abc", "sha256:"), "abc");
    }

    #[test]
    fn repo_tags_split_at_the_last_colon() {
        let tags = vec!["127.0.0.1:5000/app:1.0".to_string()];
        assert_eq!(repo_tag_pairs(&tags, "x"), [("127.0.0.1:5000/app".to_string(), "1.0".to_string())]);
        assert_eq!(repo_tag_pairs(&[], "127.0.0.1:5000/app"), [("127.0.0.1:5000/app".into(), "<none>".into())]);
        let digests = vec!["127.0.0.1:5000/app@sha256:abc".to_string()];
        assert_eq!(repo_digest(&digests), ("127.0.0.1:5000/app".into(), "sha256:abc".into()));
        assert_eq!(repo_digest(&[]), ("<none>".into(), "<none>".into()));
    }

    #[test]
    fn tables_align_like_go_tabwriter() {
        let rows = vec![
            vec!["IMAGE".to_string(), "TAG".into(), "SIZE".into()],
            vec!["127.0.0.1:5000/a-long-repository-name".to_string(), "1.0".into(), "2.23MB".into()],
        ];
        // First column: the 37-character name + 3; second: the minimum of 20; last: unpadded.
        let expected = format!("{:<40}{:<20}SIZE\n{:<40}{:<20}2.23MB\n", "IMAGE", "TAG", rows[1][0], "1.0");
        assert_eq!(table(&rows), expected);
    }

    #[test]
    fn images_use_protobuf_json_names_and_string_integers() {
        let i = cri::Image {
            id: "sha256:a".into(),
            size: 42,
            uid: Some(cri::Int64Value { value: 0 }),
            spec: Some(cri::ImageSpec { runtime_handler: "gvisor".into(), ..Default::default() }),
            ..Default::default()
        };
        let v = image(&i);
        assert_eq!(v["size"], "42");
        assert_eq!(v["uid"], json!({"value": "0"}));
        assert_eq!(v["spec"]["runtimeHandler"], "gvisor");
        assert_eq!(v["repoTags"], json!([]));
        assert_eq!(image(&cri::Image::default())["uid"], Value::Null);
    }

    #[test]
    fn info_values_are_embedded_as_json_after_status() {
        let info = HashMap::from([("info".to_string(), r#"{"a":1}"#.to_string()), ("b".into(), "plain".into())]);
        let v = status_info(json!({"id": "x"}), vec![], &info);
        assert_eq!(v, json!({"status": {"id": "x"}, "b": "plain", "info": {"a": 1}}));
        assert_eq!(v.as_object().unwrap().keys().next().unwrap(), "status");
    }
}
