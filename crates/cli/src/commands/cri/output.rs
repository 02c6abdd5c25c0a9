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
    format!("{}{}", go_g(size, 3), UNITS[unit])
}

/// Sizes as crictl's stats show them (go-units `HumanSize`): four significant digits.
pub fn human_size4(bytes: u64) -> String {
    const UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1000.0 && unit < UNITS.len() - 1 {
        size /= 1000.0;
        unit += 1;
    }
    format!("{}{}", go_g(size, 4), UNITS[unit])
}

/// Go's `%.<precision>g`: that many significant digits, trailing zeros dropped.
fn go_g(v: f64, precision: i32) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let exp = v.abs().log10().floor() as i32;
    let rounded = format!("{:.*e}", (precision - 1) as usize, v);
    let (mantissa, e) = rounded.split_once('e').unwrap_or((&rounded, "0"));
    let e: i32 = e.parse().unwrap_or(exp);
    if !(-4..precision).contains(&e) {
        let m = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let decimals = (precision - 1 - e).max(0) as usize;
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

/// go-units `HumanDuration`, which crictl's CREATED column shows with " ago".
pub fn human_duration(d: std::time::Duration) -> String {
    let seconds = d.as_secs();
    if seconds < 1 {
        return "Less than a second".into();
    }
    if seconds == 1 {
        return "1 second".into();
    }
    if seconds < 60 {
        return format!("{seconds} seconds");
    }
    let minutes = seconds / 60;
    if minutes == 1 {
        return "About a minute".into();
    }
    if minutes < 60 {
        return format!("{minutes} minutes");
    }
    let hours = (d.as_secs_f64() / 3600.0).round() as u64;
    match hours {
        1 => "About an hour".into(),
        h if h < 48 => format!("{h} hours"),
        h if h < 24 * 7 * 2 => format!("{} days", h / 24),
        h if h < 24 * 30 * 2 => format!("{} weeks", h / 24 / 7),
        h if h < 24 * 365 * 2 => format!("{} months", h / 24 / 30),
        _ => format!("{} years", seconds / 3600 / 24 / 365),
    }
}

/// crictl's CREATED cell: how long before `now_ns` the Unix-nanosecond time `ns` was.
pub fn ago(ns: i64, now_ns: i64) -> String {
    let d = std::time::Duration::from_nanos(now_ns.saturating_sub(ns).max(0) as u64);
    format!("{} ago", human_duration(d))
}

/// Now, in Unix nanoseconds.
pub fn now_ns() -> i64 {
    jiff::Timestamp::now().as_nanosecond() as i64
}

/// Go's `time.Unix(0, ns).Format(time.RFC3339Nano)` in the local time zone, as crictl's
/// inspect shows `createdAt`.
pub fn rfc3339_local(ns: i64) -> String {
    let Ok(t) = jiff::Timestamp::from_nanosecond(ns.into()) else { return ns.to_string() };
    let zoned = t.to_zoned(jiff::tz::TimeZone::system());
    if zoned.offset().seconds() == 0 {
        zoned.strftime("%Y-%m-%dT%H:%M:%S%.fZ").to_string()
    } else {
        zoned.strftime("%Y-%m-%dT%H:%M:%S%.f%:z").to_string()
    }
}

/// Go's zero `time.Time` formatted, which crictl prints for times not reached yet.
pub const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// crictl's `-o` for inspect verbs.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Json,
    Yaml,
    GoTemplate,
    Table,
}

/// Prints an inspect document in `format` (`Table` is the caller's).
pub fn print_status(doc: &Value, format: StatusFormat, template: Option<&str>) -> anyhow::Result<()> {
    match format {
        StatusFormat::Json | StatusFormat::Table => print(doc, Format::Json),
        StatusFormat::Yaml => print(doc, Format::Yaml),
        StatusFormat::GoTemplate => {
            let template = template.ok_or_else(|| anyhow::anyhow!("--template is required with -o go-template"))?;
            println!("{}", go_template(template, doc)?);
            Ok(())
        }
    }
}

/// The part of Go's text/template people use with crictl: literal text and `{{ .a.b }}` field
/// paths (`{{.}}` the whole document); anything else is refused rather than misread.
pub fn go_template(template: &str, doc: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| anyhow::anyhow!("template: unclosed action"))?;
        let action = after[..end].trim().trim_start_matches('-').trim_end_matches('-').trim();
        let Some(path) = action.strip_prefix('.') else {
            anyhow::bail!("template: only field paths like {{{{.status.id}}}} are supported, not {action:?}");
        };
        let mut v = doc;
        for key in path.split('.').filter(|k| !k.is_empty()) {
            v = v.get(key).unwrap_or(&Value::Null);
        }
        match v {
            Value::String(s) => out.push_str(s),
            // Go prints a missing key of a map as `<no value>`.
            Value::Null => out.push_str("<no value>"),
            other => out.push_str(&other.to_string()),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Go's `%v` of a `map[string]string`: `map[a:1 b:2]`, keys sorted.
pub fn go_map(m: &HashMap<String, String>) -> String {
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    let items: Vec<String> = keys.into_iter().map(|k| format!("{k}:{}", m[k])).collect();
    format!("map[{}]", items.join(" "))
}

/// `--label k=v` flags as a selector, crictl's `parseLabelStringSlice`.
pub fn parse_labels(labels: &[String]) -> anyhow::Result<HashMap<String, String>> {
    labels
        .iter()
        .map(|l| match l.split('=').collect::<Vec<_>>()[..] {
            [k, v] => Ok((k.to_string(), v.to_string())),
            _ => anyhow::bail!("incorrectly specified label: {l}"),
        })
        .collect()
}

/// crictl's `matchesRegex`: an empty pattern matches all; an invalid one matches nothing.
pub fn matches_regex(pattern: &str, target: &str) -> bool {
    pattern.is_empty() || regex::Regex::new(pattern).is_ok_and(|r| r.is_match(target))
}

/// Sorted `key -> value` lines of crictl's verbose and table views (nothing for an empty map).
pub fn print_map(title: &str, m: &HashMap<String, String>) {
    if m.is_empty() {
        return;
    }
    println!("{title}:");
    let mut keys: Vec<_> = m.keys().collect();
    keys.sort();
    for k in keys {
        println!("\t{k} -> {}", m[k]);
    }
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

    #[test]
    fn durations_read_like_go_units() {
        use std::time::Duration as D;
        assert_eq!(human_duration(D::from_millis(999)), "Less than a second");
        assert_eq!(human_duration(D::from_secs(1)), "1 second");
        assert_eq!(human_duration(D::from_secs(59)), "59 seconds");
        assert_eq!(human_duration(D::from_secs(60)), "About a minute");
        assert_eq!(human_duration(D::from_secs(119)), "About a minute");
        assert_eq!(human_duration(D::from_secs(120)), "2 minutes");
        assert_eq!(human_duration(D::from_secs(59 * 60 + 59)), "59 minutes");
        assert_eq!(human_duration(D::from_secs(89 * 60)), "About an hour");
        assert_eq!(human_duration(D::from_secs(90 * 60)), "2 hours");
        assert_eq!(human_duration(D::from_secs(47 * 3600)), "47 hours");
        assert_eq!(human_duration(D::from_secs(48 * 3600)), "2 days");
        assert_eq!(human_duration(D::from_secs(14 * 86400)), "2 weeks");
        assert_eq!(human_duration(D::from_secs(60 * 86400)), "2 months");
        assert_eq!(human_duration(D::from_secs(800 * 86400)), "2 years");
        assert_eq!(ago(0, 90_000_000_000), "About a minute ago");
        assert_eq!(ago(10, 0), "Less than a second ago");
    }

    #[test]
    fn stats_sizes_keep_four_digits() {
        assert_eq!(human_size4(1_234_567), "1.235MB");
        assert_eq!(human_size4(4096), "4.096kB");
        assert_eq!(human_size4(0), "0B");
    }

    #[test]
    fn inspect_times_are_rfc3339_with_trimmed_nanoseconds() {
        let s = rfc3339_local(1_700_000_000_500_000_000);
        assert!(s.contains(":20.5"), "{s}");
        assert!(!s.contains(".50"), "{s}");
    }

    #[test]
    fn templates_fill_field_paths_and_refuse_the_rest() {
        let doc = json!({"status": {"id": "abc", "metadata": {"attempt": 2}}});
        assert_eq!(go_template("id={{ .status.id }} n={{.status.metadata.attempt}}", &doc).unwrap(), "id=abc n=2");
        assert_eq!(go_template("{{.nope}}", &doc).unwrap(), "<no value>");
        assert!(go_template("{{range .x}}{{end}}", &doc).is_err());
        assert!(go_template("{{.status", &doc).is_err());
    }

    #[test]
    fn labels_need_exactly_one_equals_sign() {
        let l = parse_labels(&["a=b".into(), "c=".into()]).unwrap();
        assert_eq!(l["a"], "b");
        assert_eq!(l["c"], "");
        assert!(parse_labels(&["a".into()]).is_err());
        assert!(parse_labels(&["a=b=c".into()]).is_err());
    }

    #[test]
    fn name_filters_are_unanchored_regexes() {
        assert!(matches_regex("", "x"));
        assert!(matches_regex("^ap", "app"));
        assert!(matches_regex("p+", "app"));
        assert!(!matches_regex("^x", "app"));
        assert!(!matches_regex("(", "app"));
    }
}
