//! Generic validation: DNS-1123 names, label and annotation syntax, object metadata, quantities
//! and tolerations, with Kubernetes' (1.33) messages.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::FieldError;

/// `apimachineryvalidation.FieldImmutableErrorMsg`.
pub const FIELD_IMMUTABLE: &str = "field is immutable";
/// `apimachineryvalidation.IsNegativeErrorMsg`.
pub const IS_NEGATIVE: &str = "must be greater than or equal to 0";
/// Total size of all annotation keys and values of one object.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
/// Kubernetes' decode-time error for a malformed quantity.
pub const QUANTITY_FORMAT_MSG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// `must be no more than N characters`.
pub fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `must be between lo and hi, inclusive`.
pub fn inclusive_range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// Kubernetes' `RegexError`: the message, examples, then the regex.
pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn is_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && alnum(b[0]) && alnum(b[b.len() - 1]) && b.iter().all(|&c| alnum(c) || c == b'-')
}

fn is_subdomain_shape(s: &str) -> bool {
    s.split('.').all(is_label_shape)
}

fn is_qualified_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Problems with `value` as an RFC 1123 label (namespace names, container names); empty if valid.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !is_label_shape(value) {
        if is_subdomain_shape(value) {
            // A valid subdomain that is not a label: within the length checked, it has dots.
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, &["my-name", "123-abc"]));
        }
    }
    errs
}

/// Problems with `value` as an RFC 1123 subdomain (most object names); empty if valid.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !is_subdomain_shape(value) {
        errs.push(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errs
}

/// Problems with `value` as a qualified name (`[prefix/]name`): label keys, annotation keys,
/// finalizers.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(is_dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !is_qualified_shape(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

/// Problems with `value` as a label value; empty if valid.
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !value.is_empty() && !is_qualified_shape(value) {
        errs.push(regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, &["MyValue", "my_value", "12345"]));
    }
    errs
}

/// Problems with `value` as a ConfigMap or Secret key; empty if valid.
pub fn is_config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 253 {
        errs.push(max_len_error(253));
    }
    let shape_ok =
        !value.is_empty() && value.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.');
    if !shape_ok {
        errs.push(regex_error(CONFIG_KEY_MSG, CONFIG_KEY_FMT, &["key.name", "KEY_NAME", "key-name"]));
    }
    if value == "." {
        errs.push("must not be '.'".to_string());
    } else if value == ".." {
        errs.push("must not be '..'".to_string());
    } else if value.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

/// Problems with `port` as a named port (IANA service name); empty if valid.
pub fn is_valid_port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty() || !port.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-') {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string());
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

/// Each message as an `Invalid` error on `field` showing `value`.
pub fn invalid_each(field: &str, value: &str, msgs: Vec<String>) -> Vec<FieldError> {
    msgs.into_iter().map(|m| FieldError::invalid(field, value, m)).collect()
}

/// `must be greater than or equal to 0` when `value` is negative.
pub fn validate_nonnegative(value: i64, field: &str) -> Vec<FieldError> {
    if value < 0 { vec![FieldError::invalid_raw(field, value.to_string(), IS_NEGATIVE)] } else { Vec::new() }
}

/// Label keys and values, errors on `field` itself as Kubernetes reports them.
pub fn validate_labels(labels: &BTreeMap<String, String>, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        errs.extend(invalid_each(field, k, is_qualified_name(k)));
        errs.extend(invalid_each(field, v, is_valid_label_value(v)));
    }
    errs
}

/// Annotation keys (qualified names, case-insensitive) and their total size.
pub fn validate_annotations(annotations: &BTreeMap<String, String>, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for (k, v) in annotations {
        errs.extend(invalid_each(field, k, is_qualified_name(&k.to_lowercase())));
        total += k.len() + v.len();
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(field, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

/// A `generateName` may end in '-': the generated suffix follows it.
fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') { format!("{}a", &name[..name.len() - 2]) } else { name.to_string() }
}

fn name_errors(name: &str, name_is_label: bool) -> Vec<String> {
    if name_is_label { is_dns1123_label(name) } else { is_dns1123_subdomain(name) }
}

/// Metadata of a new object, as `ValidateObjectMeta`: the name (a DNS label or subdomain) is
/// required (the server has already filled it from `generateName`), the namespace is required
/// exactly when the kind is namespaced, and labels, annotations, owner references and
/// finalizers are well formed.
pub fn validate_object_meta(meta: &ObjectMeta, namespaced: bool, name_is_label: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(gn) = meta.generate_name.as_deref().filter(|g| !g.is_empty()) {
        errs.extend(invalid_each("metadata.generateName", gn, name_errors(&mask_trailing_dash(gn), name_is_label)));
    }
    match meta.name.as_deref() {
        None | Some("") => errs.push(FieldError::required("metadata.name", "name or generateName is required")),
        Some(name) => errs.extend(invalid_each("metadata.name", name, name_errors(name, name_is_label))),
    }
    errs.extend(validate_meta_common(meta, namespaced));
    errs
}

fn validate_meta_common(meta: &ObjectMeta, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ns = meta.namespace.as_deref().unwrap_or("");
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            errs.extend(invalid_each("metadata.namespace", ns, is_dns1123_label(ns)));
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden("metadata.namespace", "not allowed on this type"));
    }
    if let Some(g) = meta.generation {
        errs.extend(validate_nonnegative(g, "metadata.generation"));
    }
    if let Some(labels) = &meta.labels {
        errs.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = &meta.annotations {
        errs.extend(validate_annotations(annotations, "metadata.annotations"));
    }
    for (i, r) in meta.owner_references.iter().flatten().enumerate() {
        let p = format!("metadata.ownerReferences[{i}]");
        if r.api_version.is_empty() {
            errs.push(FieldError::required(format!("{p}.apiVersion"), "must not be empty"));
        }
        if r.kind.is_empty() {
            errs.push(FieldError::required(format!("{p}.kind"), "must not be empty"));
        }
        if r.name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), "must not be empty"));
        }
        if r.uid.is_empty() {
            errs.push(FieldError::required(format!("{p}.uid"), "must not be empty"));
        }
    }
    for f in meta.finalizers.iter().flatten() {
        errs.extend(invalid_each("metadata.finalizers", f, is_qualified_name(f)));
    }
    errs
}

/// Metadata of an update, as `ValidateObjectMetaUpdate`: name and namespace are immutable, the
/// generation does not go back, and the new labels and annotations are well formed.
pub fn validate_object_meta_update(new: &ObjectMeta, old: &ObjectMeta) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(g) = new.generation {
        errs.extend(validate_nonnegative(g, "metadata.generation"));
        if g < old.generation.unwrap_or(0) {
            errs.push(FieldError::invalid_raw("metadata.generation", g.to_string(), "must not be decremented"));
        }
    }
    let (nn, on) = (new.name.as_deref().unwrap_or(""), old.name.as_deref().unwrap_or(""));
    if nn != on {
        errs.push(FieldError::invalid("metadata.name", nn, FIELD_IMMUTABLE));
    }
    let (nns, ons) = (new.namespace.as_deref().unwrap_or(""), old.namespace.as_deref().unwrap_or(""));
    if nns != ons {
        errs.push(FieldError::invalid("metadata.namespace", nns, FIELD_IMMUTABLE));
    }
    if let Some(labels) = &new.labels {
        errs.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = &new.annotations {
        errs.extend(validate_annotations(annotations, "metadata.annotations"));
    }
    errs
}

/// A `metav1.LabelSelector` as `ValidateLabelSelector` checks it.
pub fn validate_label_selector(sel: &LabelSelector, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(ml) = &sel.match_labels {
        errs.extend(validate_labels(ml, &format!("{field}.matchLabels")));
    }
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let p = format!("{field}.matchExpressions[{i}]");
        let values = e.values.as_deref().unwrap_or(&[]);
        match e.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(FieldError::required(
                        format!("{p}.values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(FieldError::forbidden(
                        format!("{p}.values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            op => errs.push(FieldError::invalid(format!("{p}.operator"), op, "not a valid selector operator")),
        }
        errs.extend(invalid_each(&format!("{p}.key"), &e.key, is_qualified_name(&e.key)));
        for (j, v) in values.iter().enumerate() {
            errs.extend(invalid_each(&format!("{p}.values[{j}]"), v, is_valid_label_value(v)));
        }
    }
    errs
}

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// A taint effect, as `validateTaintEffect`.
pub fn validate_taint_effect(effect: &str, allow_empty: bool, field: &str) -> Vec<FieldError> {
    if effect.is_empty() {
        return if allow_empty { Vec::new() } else { vec![FieldError::required(field, "")] };
    }
    if TAINT_EFFECTS.contains(&effect) {
        Vec::new()
    } else {
        vec![FieldError::not_supported(field, effect, TAINT_EFFECTS)]
    }
}

/// Tolerations, as `ValidateTolerations`.
pub fn validate_tolerations(tolerations: &[Toleration], field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, t) in tolerations.iter().enumerate() {
        let p = format!("{field}[{i}]");
        let key = t.key.as_deref().unwrap_or("");
        let op = t.operator.as_deref().unwrap_or("");
        let value = t.value.as_deref().unwrap_or("");
        let effect = t.effect.as_deref().unwrap_or("");
        if !key.is_empty() {
            errs.extend(invalid_each(&format!("{p}.key"), key, is_qualified_name(key)));
        }
        if key.is_empty() && op != "Exists" {
            errs.push(FieldError::invalid(
                format!("{p}.operator"),
                op,
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if t.toleration_seconds.is_some() && effect != "NoExecute" {
            errs.push(FieldError::invalid(
                format!("{p}.effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match op {
            "" | "Equal" => {
                let msgs = is_valid_label_value(value);
                if !msgs.is_empty() {
                    errs.push(FieldError::invalid(format!("{p}.operator"), value, msgs.join(";")));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    // Kubernetes shows the whole toleration as the bad value here.
                    let shown = serde_json::to_string(t).unwrap_or_default();
                    errs.push(FieldError::invalid_raw(
                        format!("{p}.operator"),
                        shown,
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(format!("{p}.operator"), other, &["Equal", "Exists"])),
        }
        errs.extend(validate_taint_effect(effect, true, &format!("{p}.effect")));
    }
    errs
}

/// A parsed `resource.Quantity`, in units of 10^-9 (saturating at the i128 range), enough to
/// compare and sum the quantities found in pod specs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(pub i128);

impl Quantity {
    pub fn parse(s: &str) -> Result<Quantity, String> {
        parse_quantity(s).ok_or_else(|| QUANTITY_FORMAT_MSG.to_string())
    }
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

fn pow10(e: u32) -> Option<i128> {
    10i128.checked_pow(e)
}

fn parse_quantity(s: &str) -> Option<Quantity> {
    let s = s.trim();
    let (neg, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (num, suffix) = rest.split_at(num_end);
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => {
            if f.contains('.') {
                return None;
            }
            (i, f)
        }
        None => (num, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    // Decimal exponent and binary exponent the suffix contributes.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let e = suffix.strip_prefix(['e', 'E'])?;
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            (e.parse::<i32>().ok()?, 0)
        }
    };
    // mantissa * 10^(exp10 - frac digits + 9) * 2^exp2, in nano units.
    let digits: String = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let mut mantissa: i128 = 0;
    let mut dropped = 0i32;
    for c in digits.bytes() {
        match mantissa.checked_mul(10).and_then(|m| m.checked_add(i128::from(c - b'0'))) {
            Some(m) => mantissa = m,
            None => dropped += 1,
        }
    }
    let scale = exp10 - frac_part.len() as i32 + 9 + dropped;
    let mut value = if scale >= 0 {
        pow10(scale as u32).and_then(|p| mantissa.checked_mul(p)).unwrap_or(i128::MAX)
    } else {
        match pow10((-scale) as u32) {
            // Kubernetes rounds up when a value has more precision than it keeps.
            Some(p) => (mantissa + p - 1) / p,
            None => i128::from(mantissa != 0),
        }
    };
    if exp2 > 0 {
        value = value.checked_mul(1i128 << exp2).unwrap_or(i128::MAX);
    }
    Some(Quantity(if neg { -value } else { value }))
}

/// Semantic equality of two resource lists (`1000m` equals `1`), as `apiequality.Semantic`.
pub fn resource_lists_equal(
    a: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    b: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, va)| {
            b.get(k).is_some_and(|vb| match (Quantity::parse(&va.0), Quantity::parse(&vb.0)) {
                (Ok(x), Ok(y)) => x.cmp(&y) == Ordering::Equal,
                _ => va.0 == vb.0,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomain_error_has_kubernetes_wording_and_regex() {
        let errs = is_dns1123_subdomain("Bad_Name");
        assert_eq!(
            errs,
            vec![
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
    }

    #[test]
    fn subdomain_longer_than_253_is_too_long() {
        let long = "a".repeat(254);
        assert_eq!(is_dns1123_subdomain(&long), vec!["must be no more than 253 characters"]);
        assert!(is_dns1123_subdomain("a.b-c.d1").is_empty());
        assert!(!is_dns1123_subdomain("a..b").is_empty());
        assert!(!is_dns1123_subdomain("-a").is_empty());
    }

    #[test]
    fn label_error_has_kubernetes_wording_with_double_space() {
        assert_eq!(
            is_dns1123_label("-x"),
            vec![
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert_eq!(is_dns1123_label("a.b"), vec!["must not contain dots"]);
        assert_eq!(is_dns1123_label(&"a".repeat(64)), vec!["must be no more than 63 characters"]);
    }

    #[test]
    fn qualified_names_accept_prefixes_and_reject_bad_parts() {
        assert!(is_qualified_name("example.com/My_name.1").is_empty());
        assert!(is_qualified_name("app").is_empty());
        assert_eq!(is_qualified_name("/a"), vec!["prefix part must be non-empty"]);
        let errs = is_qualified_name("a/");
        assert_eq!(errs[0], "name part must be non-empty");
        assert!(errs[1].starts_with("name part must consist of alphanumeric characters"));
        assert!(is_qualified_name("a/b/c")[0].starts_with("a qualified name must consist of"));
        assert!(is_qualified_name("Bad_Prefix/x")[0].starts_with("prefix part a lowercase RFC 1123 subdomain"));
    }

    #[test]
    fn label_values_may_be_empty_but_not_malformed() {
        assert!(is_valid_label_value("").is_empty());
        assert!(is_valid_label_value("A-b_c.1").is_empty());
        assert!(is_valid_label_value("-a")[0].starts_with("a valid label must be an empty string"));
        assert_eq!(is_valid_label_value(&"a".repeat(64)), vec!["must be no more than 63 characters"]);
    }

    #[test]
    fn config_keys_reject_slashes_and_dot_dot() {
        assert!(is_config_map_key("key.name_1-2").is_empty());
        assert!(
            is_config_map_key("a/b")[0]
                .starts_with("a valid config key must consist of alphanumeric characters, '-', '_' or '.'")
        );
        assert_eq!(is_config_map_key(".."), vec!["must not be '..'"]);
        assert_eq!(is_config_map_key("..a"), vec!["must not start with '..'"]);
    }

    #[test]
    fn object_meta_requires_name_and_namespace_for_namespaced_kinds() {
        let meta = ObjectMeta::default();
        let errs: Vec<String> = validate_object_meta(&meta, true, false).iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            vec![
                "metadata.name: Required value: name or generateName is required",
                "metadata.namespace: Required value"
            ]
        );
    }

    #[test]
    fn object_meta_forbids_namespace_on_cluster_scoped_kinds() {
        let meta = ObjectMeta { name: Some("n".into()), namespace: Some("x".into()), ..Default::default() };
        let errs = validate_object_meta(&meta, false, false);
        assert_eq!(errs[0].to_string(), "metadata.namespace: Forbidden: not allowed on this type");
    }

    #[test]
    fn object_meta_label_names_use_label_rules_when_asked() {
        let meta = ObjectMeta { name: Some("a.b".into()), ..Default::default() };
        assert!(validate_object_meta(&meta, false, false).is_empty());
        let errs = validate_object_meta(&meta, false, true);
        assert_eq!(errs[0].to_string(), "metadata.name: Invalid value: \"a.b\": must not contain dots");
    }

    #[test]
    fn bad_labels_and_oversized_annotations_are_reported_on_the_map() {
        let meta = ObjectMeta {
            name: Some("n".into()),
            labels: Some([("app".to_string(), "bad value".to_string())].into()),
            annotations: Some([("big".to_string(), "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT))].into()),
            ..Default::default()
        };
        let errs: Vec<String> = validate_object_meta(&meta, false, false).iter().map(|e| e.to_string()).collect();
        assert!(errs[0].starts_with("metadata.labels: Invalid value: \"bad value\": a valid label must be"));
        assert_eq!(errs[1], "metadata.annotations: Too long: may not be more than 262144 bytes");
    }

    #[test]
    fn meta_update_rejects_renames() {
        let old = ObjectMeta { name: Some("a".into()), ..Default::default() };
        let new = ObjectMeta { name: Some("b".into()), ..Default::default() };
        let errs = validate_object_meta_update(&new, &old);
        assert_eq!(errs[0].to_string(), "metadata.name: Invalid value: \"b\": field is immutable");
    }

    #[test]
    fn exists_toleration_with_a_value_is_invalid() {
        let t = Toleration {
            key: Some("k".into()),
            operator: Some("Exists".into()),
            value: Some("v".into()),
            ..Default::default()
        };
        let errs = validate_tolerations(&[t], "spec.tolerations");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.tolerations[0].operator");
        assert!(errs[0].to_string().ends_with(": value must be empty when `operator` is 'Exists'"));
    }

    #[test]
    fn toleration_effects_and_seconds_are_checked() {
        let t = Toleration {
            key: Some("k".into()),
            effect: Some("Sometimes".into()),
            toleration_seconds: Some(5),
            ..Default::default()
        };
        let errs: Vec<String> = validate_tolerations(&[t], "t").iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            vec![
                "t[0].effect: Invalid value: \"Sometimes\": effect must be 'NoExecute' when `tolerationSeconds` is set",
                "t[0].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
            ]
        );
        let keyless = Toleration { operator: Some("Equal".into()), ..Default::default() };
        assert!(
            validate_tolerations(&[keyless], "t")[0]
                .to_string()
                .contains("operator must be Exists when `key` is empty")
        );
    }

    #[test]
    fn quantities_compare_across_suffixes() {
        assert_eq!(Quantity::parse("1").unwrap(), Quantity::parse("1000m").unwrap());
        assert_eq!(Quantity::parse("1Ki").unwrap(), Quantity::parse("1024").unwrap());
        assert_eq!(Quantity::parse("1.5G").unwrap(), Quantity::parse("1500M").unwrap());
        assert_eq!(Quantity::parse("2e3").unwrap(), Quantity::parse("2k").unwrap());
        assert!(Quantity::parse("100m").unwrap() < Quantity::parse("0.2").unwrap());
        assert!(Quantity::parse("-1").unwrap() < Quantity::parse("0").unwrap());
        assert!(Quantity::parse("abc").is_err());
        assert!(Quantity::parse("1.2.3").is_err());
        assert!(Quantity::parse("5Zi").is_err());
    }
}
