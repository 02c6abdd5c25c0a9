//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) to and from the JSON the same object has,
//! for every built-in kind in `proto/k8s.schema`, so the rest of the server only sees JSON.
//!
//! A body is the magic `k8s\0` then a `runtime.Unknown` {1 typeMeta {1 apiVersion, 2 kind}, 2 raw,
//! 3 contentEncoding, 4 contentType}; `raw` is the object's proto2 message.
//!
//! **One mapping, driven by descriptors.** `proto/k8s.schema` lists the wire schema of the k8s.io/api and
//! k8s.io/apimachinery messages (v0.33, as k8s-openapi's `v1_33`) in a line format of ours, described in
//! its header: per message, each field's number, name, label and type. [`descriptor_set`] turns it into a
//! protobuf descriptor set (map fields get their `…Entry` messages, as protoc makes them); [`Schema`]
//! indexes that once and a single walker maps any message to JSON and back. The k8s-pb crate was not
//! used: its prost types have no serde or reflection, so it would need one conversion per kind, and it
//! mirrors one Kubernetes version more. Proto field names are the JSON names already (go-to-protobuf
//! takes them from the `json` tags); what the wire schema cannot tell comes from the Go structs, noted in
//! `proto/go_facts.txt`:
//! - `keep`: a Go pointer or a field without `omitempty`. Go's marshallers write every non-pointer
//!   field, zero or not, while Go's JSON drops zero `omitempty` scalars. So a zero scalar on the wire is
//!   dropped unless kept (`replicas: 0`, `immutable: false` and DeleteOptions' `gracePeriodSeconds: 0` stay).
//! - `inline`: a Go embedded struct (`json:",inline"`, e.g. Probe's `handler`): its fields land in the parent.
//! - `rename`: the few fields whose JSON name differs from the proto name.
//!
//! Messages with custom JSON: `Time` {seconds, nanos} ↔ RFC 3339 (a zero time is written as an empty
//! message and reads as `null`, as Go prints it), `MicroTime` (microseconds), `Duration` (Go's `1h2m3s`),
//! `IntOrString`, `Quantity` (its string), `FieldsV1` and `RawExtension` (raw JSON, or an enveloped
//! protobuf object), and the `items` wrappers of Go slice types (`ExtraValue`, `Verbs`) ↔ a bare array. `bytes` are
//! base64 in JSON. Nested messages are always kept (`strategy: {}`), as Go prints structs. Unknown wire
//! fields and unknown JSON keys are skipped. Custom resources have no descriptor and stay JSON only.

use std::collections::HashMap;
use std::sync::LazyLock;

use base64::Engine;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet, MessageOptions};
use serde_json::{Map, Value};

/// The four bytes before every Kubernetes protobuf message.
pub const MAGIC: &[u8] = b"k8s\0";

/// The media type of Kubernetes protobuf.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

static WIRE_SCHEMA: &str = include_str!("../proto/k8s.schema");
static GO_FACTS: &str = include_str!("../proto/go_facts.txt");
static SCHEMA: LazyLock<Result<Schema, String>> =
    LazyLock::new(|| descriptor_set(WIRE_SCHEMA).and_then(|set| Schema::load(&set, GO_FACTS)));

fn schema() -> Result<&'static Schema, String> {
    SCHEMA.as_ref().map_err(|e| format!("protobuf descriptors: {e}"))
}

/// The proto package of each built-in API group ("" is the core group).
const GROUP_PACKAGES: &[(&str, &str)] = &[
    ("", "k8s.io.api.core"),
    ("apps", "k8s.io.api.apps"),
    ("autoscaling", "k8s.io.api.autoscaling"),
    ("batch", "k8s.io.api.batch"),
    ("policy", "k8s.io.api.policy"),
    ("authentication.k8s.io", "k8s.io.api.authentication"),
    ("authorization.k8s.io", "k8s.io.api.authorization"),
    ("coordination.k8s.io", "k8s.io.api.coordination"),
    ("discovery.k8s.io", "k8s.io.api.discovery"),
    ("events.k8s.io", "k8s.io.api.events"),
    ("networking.k8s.io", "k8s.io.api.networking"),
    ("node.k8s.io", "k8s.io.api.node"),
    ("rbac.authorization.k8s.io", "k8s.io.api.rbac"),
];
const META_PACKAGE: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";
/// meta/v1 kinds a client sends under any group's apiVersion.
const OPTIONS_KINDS: &[&str] =
    &["DeleteOptions", "CreateOptions", "UpdateOptions", "PatchOptions", "GetOptions", "ListOptions"];

/// Whether `apiVersion`/`kind` has a protobuf message (built-in kinds, their lists, and meta/v1 kinds).
pub fn supports(api_version: &str, kind: &str) -> bool {
    schema().is_ok_and(|s| s.find(api_version, kind).is_some())
}

/// Decodes a Kubernetes protobuf body into the object's JSON, `apiVersion` and `kind` included.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body.strip_prefix(MAGIC).ok_or("protobuf body does not start with the k8s\\0 magic")?;
    let (mut api_version, mut kind, mut raw, mut encoding) = (String::new(), String::new(), &[][..], String::new());
    let mut r = Reader { buf: rest };
    while !r.done() {
        let (tag, wire) = r.key()?;
        match (tag, wire) {
            (1, 2) => {
                let mut t = Reader { buf: r.bytes()? };
                while !t.done() {
                    match t.key()? {
                        (1, 2) => api_version = utf8(t.bytes()?)?,
                        (2, 2) => kind = utf8(t.bytes()?)?,
                        (_, w) => t.skip(w)?,
                    }
                }
            }
            (2, 2) => raw = r.bytes()?,
            (3, 2) => encoding = utf8(r.bytes()?)?,
            (_, w) => r.skip(w)?,
        }
    }
    if !encoding.is_empty() {
        return Err(format!("unsupported protobuf contentEncoding {encoding:?}"));
    }
    if kind.is_empty() {
        return Err("protobuf body has no kind in its typeMeta".into());
    }
    let schema = schema()?;
    let msg = schema
        .find(&api_version, &kind)
        .ok_or_else(|| format!("protobuf decoding of {api_version} {kind} is not supported; send JSON"))?;
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), api_version.clone().into());
    obj.insert("kind".into(), kind.clone().into());
    schema.decode_fields(msg, raw, &mut obj).map_err(|e| format!("malformed protobuf {kind}: {e}"))?;
    Ok(Value::Object(obj))
}

/// Why an object cannot be written as protobuf.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The kind has no protobuf message (a custom resource, a Table): answer JSON or 406.
    #[error("{api_version} {kind} has no protobuf encoding")]
    Unsupported { api_version: String, kind: String },
    #[error("encoding {kind} as protobuf: {reason}")]
    Invalid { kind: String, reason: String },
}

/// Encodes an object's JSON (with `apiVersion` and `kind`) as a Kubernetes protobuf body: magic and
/// `runtime.Unknown`, as Go's protobuf serializer writes it.
pub fn encode(obj: &Value) -> Result<Vec<u8>, EncodeError> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let unsupported = || EncodeError::Unsupported { api_version: api_version.into(), kind: kind.into() };
    let schema = schema().map_err(|_| unsupported())?;
    let msg = schema.find(api_version, kind).ok_or_else(unsupported)?;
    let Value::Object(map) = obj else { return Err(unsupported()) };
    let mut raw = Vec::new();
    schema.encode_fields(msg, map, &mut raw).map_err(|reason| EncodeError::Invalid { kind: kind.into(), reason })?;
    Ok(envelope(api_version, kind, &raw))
}

/// A list encoded item by item, so that no JSON tree of the whole list is ever built: the body
/// is [`ListEncoder::head`], the items' [`ListEncoder::item`] bytes, then [`ListEncoder::tail`].
/// The head's length prefix needs the items' total size, so a streamed list encodes its items
/// twice (once to count). Every Kubernetes list message has `metadata` as field 1 and `items` as
/// field 2.
pub struct ListEncoder {
    api_version: String,
    list_kind: String,
    item_kind: String,
}

impl ListEncoder {
    /// `Unsupported` unless both the list and its items have protobuf messages.
    pub fn new(api_version: &str, list_kind: &str, item_kind: &str) -> Result<Self, EncodeError> {
        let unsupported = || EncodeError::Unsupported { api_version: api_version.into(), kind: list_kind.into() };
        let schema = schema().map_err(|_| unsupported())?;
        if schema.find(api_version, list_kind).is_none() || schema.find(api_version, item_kind).is_none() {
            return Err(unsupported());
        }
        Ok(ListEncoder { api_version: api_version.into(), list_kind: list_kind.into(), item_kind: item_kind.into() })
    }

    /// Appends `item` as one `items` field of the list.
    pub fn item(&self, item: &Value, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let invalid = |reason: String| EncodeError::Invalid { kind: self.item_kind.clone(), reason };
        let schema = schema().map_err(invalid)?;
        let msg = schema.find(&self.api_version, &self.item_kind).ok_or_else(|| invalid("no message".into()))?;
        let Value::Object(map) = item else { return Err(invalid("not an object".into())) };
        let mut raw = Vec::new();
        schema.encode_fields(msg, map, &mut raw).map_err(invalid)?;
        put_bytes(out, 2, &raw);
        Ok(())
    }

    /// Magic, `runtime.Unknown`'s typeMeta, and the start of its `raw`: the list's length and
    /// `metadata`, for items of `items_len` bytes in all.
    pub fn head(&self, metadata: &Value, items_len: usize) -> Result<Vec<u8>, EncodeError> {
        let invalid = |reason: String| EncodeError::Invalid { kind: self.list_kind.clone(), reason };
        let schema = schema().map_err(invalid)?;
        let msg = schema.find(&self.api_version, &self.list_kind).ok_or_else(|| invalid("no message".into()))?;
        let mut fields = Map::new();
        fields.insert("metadata".into(), metadata.clone());
        let mut meta = Vec::new();
        schema.encode_fields(msg, &fields, &mut meta).map_err(invalid)?;
        let mut type_meta = Vec::new();
        put_bytes(&mut type_meta, 1, self.api_version.as_bytes());
        put_bytes(&mut type_meta, 2, self.list_kind.as_bytes());
        let mut out = MAGIC.to_vec();
        put_bytes(&mut out, 1, &type_meta);
        put_key(&mut out, 2, 2);
        put_varint(&mut out, (meta.len() + items_len) as u64);
        out.extend_from_slice(&meta);
        Ok(out)
    }

    /// The rest of `runtime.Unknown` after the items: empty content encoding and type.
    pub fn tail(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_bytes(&mut out, 3, b"");
        put_bytes(&mut out, 4, b"");
        out
    }
}

/// `k8s\0` + runtime.Unknown{typeMeta, raw, contentEncoding: "", contentType: ""}.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, raw);
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    out
}

/// One frame of a protobuf watch stream, as client-go's `streaming` decoder reads it: a 4-byte
/// big-endian length, then `meta.v1.WatchEvent{1 type, 2 object: RawExtension{1 raw}}` written by the
/// *raw* serializer (no magic, no `Unknown`), whose `raw` is the object enveloped as by [`encode`].
pub fn watch_frame(event_type: &str, object: &Value) -> Result<Vec<u8>, EncodeError> {
    let enveloped = encode(object)?;
    let mut raw_ext = Vec::new();
    put_bytes(&mut raw_ext, 1, &enveloped);
    let mut event = Vec::new();
    put_bytes(&mut event, 1, event_type.as_bytes());
    put_bytes(&mut event, 2, &raw_ext);
    let len = u32::try_from(event.len())
        .map_err(|_| EncodeError::Invalid { kind: "WatchEvent".into(), reason: "event larger than 4 GiB".into() })?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(&event);
    Ok(out)
}

/// Builds the descriptor set that `schema` (the format of `proto/k8s.schema`, see its header) describes: one
/// file per package, and for each map field a nested `<Field>Entry` message {1 key, 2 value} marked as a map
/// entry, the field itself being a repeated field of that message, as protoc represents `map<K, V>`.
fn descriptor_set(schema: &str) -> Result<FileDescriptorSet, String> {
    let mut files: Vec<FileDescriptorProto> = Vec::new();
    for (i, line) in schema.lines().enumerate() {
        let at = |e: &str| format!("k8s.schema line {}: {e}", i + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            [first, ..] if first.starts_with('#') => {}
            ["package", package] => files.push(FileDescriptorProto {
                name: Some(format!("{package}.schema")),
                package: Some((*package).to_string()),
                syntax: Some("proto2".into()),
                ..Default::default()
            }),
            ["message", name] => {
                let file = files.last_mut().ok_or_else(|| at("a message before any package"))?;
                file.message_type.push(DescriptorProto { name: Some((*name).to_string()), ..Default::default() });
            }
            [number, name, label, types @ ..] => {
                let file = files.last_mut().ok_or_else(|| at("a field before any package"))?;
                let package = file.package().to_string();
                let msg = file.message_type.last_mut().ok_or_else(|| at("a field before any message"))?;
                let number: i32 = number.parse().map_err(|_| at("the field number is not a number"))?;
                match (*label, types) {
                    ("opt", [ty]) => msg.field.push(schema_field(&package, name, number, Label::Optional, ty)),
                    ("rep", [ty]) => msg.field.push(schema_field(&package, name, number, Label::Repeated, ty)),
                    ("map", [key, value]) => {
                        let entry = map_entry_name(name);
                        let type_name = format!(".{package}.{}.{entry}", msg.name());
                        msg.nested_type.push(DescriptorProto {
                            name: Some(entry),
                            field: vec![
                                schema_field(&package, "key", 1, Label::Optional, key),
                                schema_field(&package, "value", 2, Label::Optional, value),
                            ],
                            options: Some(MessageOptions { map_entry: Some(true), ..Default::default() }),
                            ..Default::default()
                        });
                        msg.field.push(FieldDescriptorProto {
                            name: Some((*name).to_string()),
                            number: Some(number),
                            label: Some(Label::Repeated as i32),
                            r#type: Some(Type::Message as i32),
                            type_name: Some(type_name),
                            ..Default::default()
                        });
                    }
                    _ => return Err(at("expected `N NAME opt|rep TYPE` or `N NAME map KEY VALUE`")),
                }
            }
            _ => return Err(at("expected `package P`, `message M` or a field")),
        }
    }
    // Every message type a field names must be in the schema.
    let mut names = std::collections::HashSet::new();
    for file in &files {
        for msg in &file.message_type {
            let name = format!(".{}.{}", file.package(), msg.name());
            names.extend(msg.nested_type.iter().map(|n| format!("{name}.{}", n.name())));
            names.insert(name);
        }
    }
    for file in &files {
        for msg in &file.message_type {
            for f in msg.field.iter().chain(msg.nested_type.iter().flat_map(|n| &n.field)) {
                if f.r#type() == Type::Message && !names.contains(f.type_name()) {
                    return Err(format!(
                        "{}.{}: {} names unknown message {}",
                        file.package(),
                        msg.name(),
                        f.name(),
                        f.type_name()
                    ));
                }
            }
        }
    }
    Ok(FileDescriptorSet { file: files })
}

/// A field of `proto/k8s.schema`: `ty` is a scalar, a message of `package` (bare name) or a full name.
fn schema_field(package: &str, name: &str, number: i32, label: Label, ty: &str) -> FieldDescriptorProto {
    let scalar = match ty {
        "double" => Some(Type::Double),
        "float" => Some(Type::Float),
        "int32" => Some(Type::Int32),
        "int64" => Some(Type::Int64),
        "uint32" => Some(Type::Uint32),
        "uint64" => Some(Type::Uint64),
        "sint32" => Some(Type::Sint32),
        "sint64" => Some(Type::Sint64),
        "fixed32" => Some(Type::Fixed32),
        "fixed64" => Some(Type::Fixed64),
        "sfixed32" => Some(Type::Sfixed32),
        "sfixed64" => Some(Type::Sfixed64),
        "bool" => Some(Type::Bool),
        "string" => Some(Type::String),
        "bytes" => Some(Type::Bytes),
        _ => None,
    };
    let (ty, type_name) = match scalar {
        Some(t) => (t, None),
        None if ty.contains('.') => (Type::Message, Some(format!(".{ty}"))),
        None => (Type::Message, Some(format!(".{package}.{ty}"))),
    };
    FieldDescriptorProto {
        name: Some(name.to_string()),
        number: Some(number),
        label: Some(label as i32),
        r#type: Some(ty as i32),
        type_name,
        ..Default::default()
    }
}

/// protoc's name for the entry message of map field `field`: `binaryData` → `BinaryDataEntry`.
fn map_entry_name(field: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for c in field.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out + "Entry"
}

/// A scalar or message type of a field.
#[derive(Debug, Clone)]
enum Ty {
    Str,
    Bytes,
    Bool,
    I32,
    I64,
    U32,
    U64,
    F32,
    F64,
    /// A message, by full name.
    Msg(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Special {
    None,
    Time,
    MicroTime,
    Duration,
    IntOrString,
    Quantity,
    FieldsV1,
    RawExtension,
    /// `message X { repeated T items = 1; }` standing for a Go `[]T` (`items` in go_facts): a bare array.
    Items,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Card {
    One,
    List,
    /// `map<K, V>`: entries {1 key, 2 value}; `ty` is the value's.
    Map,
}

#[derive(Debug)]
struct Field {
    number: u32,
    json: String,
    ty: Ty,
    card: Card,
    /// A zero scalar on the wire stays in JSON.
    keep_zero: bool,
    /// A Go embedded struct whose fields are the parent's in JSON.
    inline: bool,
}

#[derive(Debug)]
struct Message {
    fields: Vec<Field>,
    special: Special,
}

/// The descriptors, indexed by message full name (no leading dot).
struct Schema {
    messages: HashMap<String, Message>,
}

impl Schema {
    fn load(set: &FileDescriptorSet, go_facts: &str) -> Result<Self, String> {
        let mut keep = std::collections::HashSet::new();
        let mut inline = std::collections::HashSet::new();
        let mut rename = HashMap::new();
        let mut items = std::collections::HashSet::new();
        for line in go_facts.lines() {
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some("keep"), Some(m), Some(f), _) => drop(keep.insert((m, f))),
                (Some("inline"), Some(m), Some(f), _) => drop(inline.insert((m, f))),
                (Some("rename"), Some(m), Some(f), Some(j)) if !j.is_empty() => drop(rename.insert((m, f), j)),
                (Some("items"), Some(m), _, _) => drop(items.insert(m)),
                _ => {}
            }
        }
        // Map entry messages first: a field of that type is a map of its value.
        let mut map_values = HashMap::new();
        let mut all = Vec::new();
        for file in &set.file {
            let package = file.package();
            for msg in &file.message_type {
                let name = format!("{package}.{}", msg.name());
                for nested in &msg.nested_type {
                    let nested_name = format!("{name}.{}", nested.name());
                    if nested.options.as_ref().and_then(|o| o.map_entry) == Some(true) {
                        let value = nested.field.iter().find(|f| f.number() == 2).ok_or("map entry without value")?;
                        map_values.insert(nested_name, value.clone());
                    }
                }
                all.push((name, msg));
            }
        }
        let ty_of = |f: &prost_types::FieldDescriptorProto| -> Result<Ty, String> {
            Ok(match f.r#type() {
                Type::String => Ty::Str,
                Type::Bytes => Ty::Bytes,
                Type::Bool => Ty::Bool,
                Type::Int32 | Type::Sint32 | Type::Sfixed32 => Ty::I32,
                Type::Int64 | Type::Sint64 | Type::Sfixed64 => Ty::I64,
                Type::Uint32 | Type::Fixed32 => Ty::U32,
                Type::Uint64 | Type::Fixed64 => Ty::U64,
                Type::Float => Ty::F32,
                Type::Double => Ty::F64,
                Type::Message => Ty::Msg(f.type_name().trim_start_matches('.').to_string()),
                t => return Err(format!("field {} has unsupported type {t:?}", f.name())),
            })
        };
        let mut messages = HashMap::new();
        for (name, msg) in all {
            let mut fields = Vec::new();
            for f in &msg.field {
                let key = (name.as_str(), f.name());
                let (ty, card) = match map_values.get(f.type_name().trim_start_matches('.')) {
                    Some(value) => (ty_of(value)?, Card::Map),
                    None if f.label() == Label::Repeated => (ty_of(f)?, Card::List),
                    None => (ty_of(f)?, Card::One),
                };
                fields.push(Field {
                    number: u32::try_from(f.number()).map_err(|_| "negative field number")?,
                    json: rename.get(&key).map_or_else(|| f.name().to_string(), |j| (*j).to_string()),
                    ty,
                    card,
                    keep_zero: keep.contains(&key),
                    inline: inline.contains(&key),
                });
            }
            let special = match name.as_str() {
                "k8s.io.apimachinery.pkg.apis.meta.v1.Time" => Special::Time,
                "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => Special::MicroTime,
                "k8s.io.apimachinery.pkg.apis.meta.v1.Duration" => Special::Duration,
                "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1" => Special::FieldsV1,
                "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
                "k8s.io.apimachinery.pkg.api.resource.Quantity" => Special::Quantity,
                "k8s.io.apimachinery.pkg.runtime.RawExtension" => Special::RawExtension,
                n if items.contains(n) && fields.len() == 1 && fields[0].card == Card::List => Special::Items,
                _ => Special::None,
            };
            messages.insert(name, Message { fields, special });
        }
        Ok(Schema { messages })
    }

    /// The message of a top-level object: its group's package, then meta/v1 (DeleteOptions, Status, …).
    fn find(&self, api_version: &str, kind: &str) -> Option<&Message> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let in_group = GROUP_PACKAGES
            .iter()
            .find(|(g, _)| *g == group)
            .and_then(|(_, package)| self.messages.get(&format!("{package}.{version}.{kind}")));
        // Options travel with the typeMeta of the resource's group, custom groups included.
        let builtin = group.is_empty()
            || group == "meta.k8s.io"
            || GROUP_PACKAGES.iter().any(|(g, _)| *g == group)
            || OPTIONS_KINDS.contains(&kind);
        in_group
            .or_else(|| builtin.then(|| self.messages.get(&format!("{META_PACKAGE}.{kind}"))).flatten())
            .filter(|m| m.special == Special::None)
    }

    fn message(&self, name: &str) -> Result<&Message, String> {
        self.messages.get(name).ok_or_else(|| format!("no descriptor for {name}"))
    }

    /// Decodes one message's fields into `out` (the parent object for inlined structs).
    fn decode_fields(&self, msg: &Message, buf: &[u8], out: &mut Map<String, Value>) -> Result<(), String> {
        let mut r = Reader { buf };
        while !r.done() {
            let (tag, wire) = r.key()?;
            match msg.fields.iter().find(|f| f.number == tag) {
                Some(f) => self.field(&mut r, f, wire, out).map_err(|e| match f.inline {
                    true => e,
                    false => format!("{}: {e}", f.json),
                })?,
                None => r.skip(wire)?,
            }
        }
        Ok(())
    }

    fn field(&self, r: &mut Reader, f: &Field, wire: u8, out: &mut Map<String, Value>) -> Result<(), String> {
        if f.inline {
            let Ty::Msg(name) = &f.ty else { return Err("inline field is not a message".into()) };
            return self.decode_fields(self.message(name)?, expect_len(r, wire)?, out);
        }
        match f.card {
            Card::List if f.ty.is_fixed_or_varint() && wire == 2 => {
                // A packed repeated scalar.
                let mut packed = Reader { buf: r.bytes()? };
                while !packed.done() {
                    let wire = if f.ty.is_varint() { 0 } else { f.ty.fixed_wire() };
                    push(out, &f.json, self.value(&mut packed, wire, &f.ty)?)?;
                }
                Ok(())
            }
            Card::List => push(out, &f.json, self.value(r, wire, &f.ty)?),
            Card::Map => {
                let mut entry = Reader { buf: expect_len(r, wire)? };
                let (mut key, mut val) = (String::new(), None);
                while !entry.done() {
                    match entry.key()? {
                        (1, 2) => key = utf8(entry.bytes()?)?,
                        (1, 0) => key = entry.varint()?.to_string(),
                        (2, w) => val = Some(self.value(&mut entry, w, &f.ty)?),
                        (_, w) => entry.skip(w)?,
                    }
                }
                let val = match val {
                    Some(v) => v,
                    None => self.zero(&f.ty)?,
                };
                let map = out.entry(f.json.as_str()).or_insert_with(|| Value::Object(Map::new()));
                let Value::Object(map) = map else { return Err("not a map".into()) };
                map.insert(key, val);
                Ok(())
            }
            Card::One => {
                let v = self.value(r, wire, &f.ty)?;
                let scalar = !matches!(f.ty, Ty::Msg(_));
                if scalar && !f.keep_zero && is_zero(&v) {
                    out.remove(&f.json);
                } else {
                    out.insert(f.json.clone(), v);
                }
                Ok(())
            }
        }
    }

    fn value(&self, r: &mut Reader, wire: u8, ty: &Ty) -> Result<Value, String> {
        let want = match ty {
            Ty::Bool | Ty::I32 | Ty::I64 | Ty::U32 | Ty::U64 => 0,
            Ty::F32 => 5,
            Ty::F64 => 1,
            Ty::Str | Ty::Bytes | Ty::Msg(_) => 2,
        };
        if wire != want {
            return Err(format!("wire type {wire} where {want} was expected"));
        }
        Ok(match ty {
            // proto int32/int64 are two's complement varints; int32 is sign-extended to 64 bits.
            Ty::Bool => Value::Bool(r.varint()? != 0),
            Ty::I32 => Value::from(r.varint()? as i64 as i32),
            Ty::I64 => Value::from(r.varint()? as i64),
            Ty::U32 => Value::from(r.varint()? as u32),
            Ty::U64 => Value::from(r.varint()?),
            Ty::F32 => Value::from(f64::from(f32::from_le_bytes(fixed(r.take(4)?)?))),
            Ty::F64 => Value::from(f64::from_le_bytes(fixed(r.take(8)?)?)),
            Ty::Str => Value::String(utf8(r.bytes()?)?),
            Ty::Bytes => Value::String(base64::engine::general_purpose::STANDARD.encode(r.bytes()?)),
            Ty::Msg(name) => self.message_value(self.message(name)?, r.bytes()?)?,
        })
    }

    fn message_value(&self, msg: &Message, buf: &[u8]) -> Result<Value, String> {
        let mut obj = Map::new();
        if msg.special == Special::FieldsV1 || msg.special == Special::RawExtension {
            // Both are {1 raw bytes}.
            let mut raw = None;
            let mut fr = Reader { buf };
            while !fr.done() {
                match fr.key()? {
                    (1, w) => raw = Some(expect_len(&mut fr, w)?),
                    (_, w) => fr.skip(w)?,
                }
            }
            return match raw {
                Some(raw) if raw.starts_with(MAGIC) => decode(raw),
                Some(raw) => serde_json::from_slice(raw).map_err(|e| format!("raw is not JSON: {e}")),
                None if msg.special == Special::FieldsV1 => Ok(Value::Object(Map::new())),
                None => Ok(Value::Null),
            };
        }
        // The special messages' own fields are plain scalars: decode them keeping zeros.
        let mut r = Reader { buf };
        let mut plain = Map::new();
        if msg.special != Special::None {
            while !r.done() {
                let (tag, wire) = r.key()?;
                match msg.fields.iter().find(|f| f.number == tag) {
                    Some(f) if f.card == Card::List => push(&mut plain, &f.json, self.value(&mut r, wire, &f.ty)?)?,
                    Some(f) => drop(plain.insert(f.json.clone(), self.value(&mut r, wire, &f.ty)?)),
                    None => r.skip(wire)?,
                }
            }
        }
        let int = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_i64).unwrap_or(0);
        Ok(match msg.special {
            Special::None => {
                self.decode_fields(msg, buf, &mut obj)?;
                Value::Object(obj)
            }
            Special::Time | Special::MicroTime => time(
                plain.get("seconds").and_then(Value::as_i64),
                int(&plain, "nanos"),
                msg.special == Special::MicroTime,
            )?,
            Special::Duration => Value::String(go_duration(int(&plain, "duration"))),
            Special::IntOrString => match int(&plain, "type") {
                0 => plain.remove("intVal").unwrap_or_else(|| 0.into()),
                1 => plain.remove("strVal").unwrap_or_else(|| "".into()),
                t => return Err(format!("IntOrString has unknown type {t}")),
            },
            Special::Quantity => plain.remove("string").unwrap_or_else(|| "0".into()),
            Special::Items => plain.remove("items").unwrap_or_else(|| Value::Array(Vec::new())),
            Special::FieldsV1 | Special::RawExtension => unreachable!("handled above"),
        })
    }

    /// A map entry without a value: the value type's zero.
    fn zero(&self, ty: &Ty) -> Result<Value, String> {
        Ok(match ty {
            Ty::Str | Ty::Bytes => "".into(),
            Ty::Bool => false.into(),
            Ty::Msg(name) => self.message_value(self.message(name)?, &[])?,
            _ => 0.into(),
        })
    }

    /// Writes `obj`'s fields as message `msg`; `obj` is the parent object for inlined structs.
    fn encode_fields(&self, msg: &Message, obj: &Map<String, Value>, out: &mut Vec<u8>) -> Result<(), String> {
        for f in &msg.fields {
            if f.inline {
                let Ty::Msg(name) = &f.ty else { return Err("inline field is not a message".into()) };
                let mut sub = Vec::new();
                self.encode_fields(self.message(name)?, obj, &mut sub)?;
                put_bytes(out, f.number, &sub);
                continue;
            }
            let Some(v) = obj.get(&f.json).filter(|v| !v.is_null()) else { continue };
            let at = |e: String| format!("{}: {e}", f.json);
            match f.card {
                Card::One => self.put_value(out, f.number, &f.ty, v).map_err(at)?,
                Card::List => {
                    let items = v.as_array().ok_or_else(|| at("expected an array".into()))?;
                    for item in items {
                        self.put_value(out, f.number, &f.ty, item).map_err(at)?;
                    }
                }
                Card::Map => {
                    let entries = v.as_object().ok_or_else(|| at("expected an object".into()))?;
                    for (k, item) in entries {
                        let mut entry = Vec::new();
                        put_bytes(&mut entry, 1, k.as_bytes());
                        if !item.is_null() {
                            self.put_value(&mut entry, 2, &f.ty, item).map_err(at)?;
                        }
                        put_bytes(out, f.number, &entry);
                    }
                }
            }
        }
        Ok(())
    }

    fn put_value(&self, out: &mut Vec<u8>, number: u32, ty: &Ty, v: &Value) -> Result<(), String> {
        match ty {
            Ty::Str => put_bytes(out, number, v.as_str().ok_or("expected a string")?.as_bytes()),
            Ty::Bytes => {
                let s = v.as_str().ok_or("expected a base64 string")?;
                let raw = base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("base64: {e}"))?;
                put_bytes(out, number, &raw);
            }
            Ty::Bool => put_varint_field(out, number, u64::from(v.as_bool().ok_or("expected a boolean")?)),
            Ty::I32 | Ty::I64 => put_varint_field(out, number, json_int(v)? as u64),
            Ty::U32 | Ty::U64 => put_varint_field(out, number, json_int(v)? as u64),
            Ty::F32 => {
                put_key(out, number, 5);
                out.extend_from_slice(&(v.as_f64().ok_or("expected a number")? as f32).to_le_bytes());
            }
            Ty::F64 => {
                put_key(out, number, 1);
                out.extend_from_slice(&v.as_f64().ok_or("expected a number")?.to_le_bytes());
            }
            Ty::Msg(name) => {
                let mut sub = Vec::new();
                self.put_message(&mut sub, self.message(name)?, v)?;
                put_bytes(out, number, &sub);
            }
        }
        Ok(())
    }

    fn put_message(&self, out: &mut Vec<u8>, msg: &Message, v: &Value) -> Result<(), String> {
        match msg.special {
            Special::None => {
                let obj = v.as_object().ok_or("expected an object")?;
                self.encode_fields(msg, obj, out)?;
            }
            Special::Time | Special::MicroTime => {
                let s = v.as_str().ok_or("expected an RFC 3339 time")?;
                let ts: jiff::Timestamp = s.parse().map_err(|e| format!("time {s:?}: {e}"))?;
                put_varint_field(out, 1, ts.as_second() as u64);
                let nanos = ts.subsec_nanosecond();
                if nanos != 0 {
                    put_varint_field(out, 2, nanos as i64 as u64);
                }
            }
            Special::Duration => {
                let s = v.as_str().ok_or("expected a duration string")?;
                put_varint_field(out, 1, parse_go_duration(s)? as u64);
            }
            Special::IntOrString => match v {
                Value::String(s) => {
                    put_varint_field(out, 1, 1);
                    put_bytes(out, 3, s.as_bytes());
                }
                _ => {
                    put_varint_field(out, 1, 0);
                    put_varint_field(out, 2, json_int(v)? as u64);
                }
            },
            Special::Quantity => {
                let s = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => return Err("expected a quantity".into()),
                };
                put_bytes(out, 1, s.as_bytes());
            }
            Special::FieldsV1 | Special::RawExtension => {
                let raw = serde_json::to_vec(v).map_err(|e| e.to_string())?;
                put_bytes(out, 1, &raw);
            }
            Special::Items => {
                let f = &msg.fields[0];
                for item in v.as_array().ok_or("expected an array")? {
                    self.put_value(out, f.number, &f.ty, item)?;
                }
            }
        }
        Ok(())
    }
}

impl Ty {
    fn is_varint(&self) -> bool {
        matches!(self, Ty::Bool | Ty::I32 | Ty::I64 | Ty::U32 | Ty::U64)
    }
    fn is_fixed_or_varint(&self) -> bool {
        self.is_varint() || matches!(self, Ty::F32 | Ty::F64)
    }
    fn fixed_wire(&self) -> u8 {
        if matches!(self, Ty::F32) { 5 } else { 1 }
    }
}

fn fixed<const N: usize>(b: &[u8]) -> Result<[u8; N], String> {
    b.try_into().map_err(|_| "truncated fixed-width value".to_string())
}

fn json_int(v: &Value) -> Result<i64, String> {
    v.as_i64()
        .or_else(|| v.as_u64().map(|u| u as i64))
        .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
        .ok_or_else(|| format!("expected an integer, got {v}"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, number: u32, wire: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire));
}

fn put_varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    put_key(out, number, 0);
    put_varint(out, v);
}

fn put_bytes(out: &mut Vec<u8>, number: u32, b: &[u8]) {
    put_key(out, number, 2);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// metav1.Time / MicroTime. Go encodes a zero time as an empty message, and prints it as `null`.
fn time(seconds: Option<i64>, nanos: i64, micro: bool) -> Result<Value, String> {
    let Some(seconds) = seconds.filter(|&s| s != GO_ZERO_TIME || nanos != 0) else {
        return Ok(Value::Null);
    };
    let nanos = i32::try_from(nanos).map_err(|_| "nanos out of range")?;
    let ts = jiff::Timestamp::new(seconds, nanos).map_err(|e| format!("time out of range: {e}"))?;
    let whole = ts.strftime("%Y-%m-%dT%H:%M:%S");
    Ok(Value::String(if micro {
        format!("{whole}.{:06}Z", ts.subsec_nanosecond() / 1000)
    } else {
        format!("{whole}Z")
    }))
}

/// Go's `time.Time{}` (0001-01-01T00:00:00Z) as Unix seconds.
const GO_ZERO_TIME: i64 = -62_135_596_800;

/// Go's `time.Duration.String()`: `1h2m3.5s`, `150ms`, `0s`.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (unit, div) = if n < 1_000 {
            ("ns", 1)
        } else if n < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{sign}{}{unit}", frac(n, div));
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, s) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let secs = format!("{}s", frac(s, 1_000_000_000));
    match (h, m) {
        (0, 0) => format!("{sign}{secs}"),
        (0, m) => format!("{sign}{m}m{secs}"),
        (h, m) => format!("{sign}{h}h{m}m{secs}"),
    }
}

fn frac(n: u64, div: u64) -> String {
    let (whole, part) = (n / div, n % div);
    if part == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{part:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Parses Go's duration syntax (`1h30m`, `2.5s`, `-150ms`) into nanoseconds.
fn parse_go_duration(s: &str) -> Result<i64, String> {
    let bad = || format!("invalid duration {s:?}");
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Ok(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        total += num.parse::<f64>().map_err(|_| bad())? * scale;
        rest = tail;
    }
    let total = total.round() as i64;
    Ok(if neg { -total } else { total })
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Bool(b) => !b,
        _ => false,
    }
}

fn push(out: &mut Map<String, Value>, name: &str, v: Value) -> Result<(), String> {
    match out.entry(name).or_insert_with(|| Value::Array(Vec::new())) {
        Value::Array(items) => {
            items.push(v);
            Ok(())
        }
        _ => Err("not a list".into()),
    }
}

fn expect_len<'a>(r: &mut Reader<'a>, wire: u8) -> Result<&'a [u8], String> {
    match wire {
        2 => r.bytes(),
        w => Err(format!("wire type {w} where a length-delimited value was expected")),
    }
}

fn utf8(buf: &[u8]) -> Result<String, String> {
    String::from_utf8(buf.to_vec()).map_err(|_| "string is not valid UTF-8".into())
}

/// A protobuf wire-format reader over one message's bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.buf.is_empty()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let left = self.buf.len();
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| format!("truncated: a field needs {n} bytes but only {left} remain"))?;
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.varint()?;
        self.take(n)
    }

    /// A field key: (field number, wire type).
    fn key(&mut self) -> Result<(u32, u8), String> {
        let k = self.varint()?;
        let tag = u32::try_from(k >> 3).ok().filter(|&t| t != 0).ok_or(format!("invalid field number {}", k >> 3))?;
        Ok((tag, (k & 7) as u8))
    }

    /// Skips a value of an unknown field, groups included.
    fn skip(&mut self, wire: u8) -> Result<(), String> {
        let mut open_groups = 0usize;
        let mut wire = wire;
        loop {
            match wire {
                0 => drop(self.varint()?),
                1 => drop(self.take(8)?),
                2 => drop(self.bytes()?),
                3 => open_groups += 1,
                4 if open_groups > 0 => open_groups -= 1,
                5 => drop(self.take(4)?),
                w => return Err(format!("unexpected wire type {w}")),
            }
            if open_groups == 0 {
                return Ok(());
            }
            wire = self.key()?.1;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const RBAC: &str = "rbac.authorization.k8s.io/v1";

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }
    fn key(tag: u32, wire: u8) -> Vec<u8> {
        varint((u64::from(tag) << 3) | u64::from(wire))
    }
    fn len(tag: u32, body: &[u8]) -> Vec<u8> {
        [key(tag, 2), varint(body.len() as u64), body.to_vec()].concat()
    }
    fn s(tag: u32, v: &str) -> Vec<u8> {
        len(tag, v.as_bytes())
    }
    fn int(tag: u32, v: i64) -> Vec<u8> {
        [key(tag, 0), varint(v as u64)].concat()
    }
    fn msg(tag: u32, parts: &[Vec<u8>]) -> Vec<u8> {
        len(tag, &parts.concat())
    }
    /// A map entry whose value is already encoded as field 2.
    fn entry(tag: u32, k: &str, v: Vec<u8>) -> Vec<u8> {
        msg(tag, &[s(1, k), v])
    }
    /// The body a Go client sends: magic, then runtime.Unknown with empty contentEncoding and contentType.
    fn envelope(api_version: &str, kind: &str, raw: &[Vec<u8>]) -> Vec<u8> {
        [MAGIC.to_vec(), msg(1, &[s(1, api_version), s(2, kind)]), msg(2, raw), s(3, ""), s(4, "")].concat()
    }
    /// ObjectMeta as Go writes it: every value field, zero or not.
    fn go_meta(name: &str, labels: &[(&str, &str)]) -> Vec<u8> {
        let mut parts = vec![s(1, name), s(2, ""), s(3, ""), s(4, ""), s(5, ""), s(6, ""), int(7, 0), msg(8, &[])];
        parts.extend(labels.iter().map(|(k, v)| entry(11, k, s(2, v))));
        msg(1, &parts)
    }

    #[test]
    fn a_namespace_with_labels_decodes_to_its_json() {
        let body = envelope(
            "v1",
            "Namespace",
            &[go_meta("team-a", &[("env", "dev"), ("team", "a")]), msg(2, &[]), msg(3, &[s(1, "")])],
        );
        let expected = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "team-a", "creationTimestamp": null, "labels": {"env": "dev", "team": "a"}},
            "spec": {}, "status": {},
        });
        assert_eq!(decode(&body).unwrap(), expected);
    }

    #[test]
    fn secret_data_becomes_base64_and_present_zero_pointers_stay() {
        let body = envelope(
            "v1",
            "Secret",
            &[
                go_meta("creds", &[]),
                entry(2, "bin", len(2, &[0, 1, 2, 255])),
                entry(2, "empty", len(2, b"")),
                s(3, "Opaque"),
                entry(4, "plain", s(2, "text")),
                int(5, 0),
            ],
        );
        let expected = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "creationTimestamp": null},
            "data": {"bin": "AAEC/w==", "empty": ""}, "stringData": {"plain": "text"},
            "type": "Opaque", "immutable": false,
        });
        assert_eq!(decode(&body).unwrap(), expected);
    }

    #[test]
    fn a_configmap_keeps_data_binary_data_and_immutable() {
        let body = envelope(
            "v1",
            "ConfigMap",
            &[go_meta("cfg", &[]), entry(2, "a", s(2, "1")), entry(3, "b", len(2, b"hi")), int(4, 1)],
        );
        let got = decode(&body).unwrap();
        assert_eq!(got["data"], json!({"a": "1"}));
        assert_eq!(got["binaryData"], json!({"b": "aGk="}));
        assert_eq!(got["immutable"], json!(true));
    }

    /// `kubectl create deployment web --image=nginx --replicas=2 --port=80`, encoded as Go's marshaller does.
    fn kubectl_deployment() -> Vec<u8> {
        let port = msg(6, &[s(1, ""), int(2, 0), int(3, 80), s(4, ""), s(5, "")]);
        let container = msg(
            2,
            &[
                s(1, "nginx"),
                s(2, "nginx"),
                s(5, ""),
                port,
                msg(8, &[]),
                s(13, ""),
                s(14, ""),
                int(16, 0),
                int(17, 0),
                int(18, 0),
                s(20, ""),
            ],
        );
        let pod_spec = msg(
            2,
            &[
                container,
                s(3, ""),
                s(6, ""),
                s(8, ""),
                s(9, ""),
                s(10, ""),
                int(11, 0),
                int(12, 0),
                int(13, 0),
                s(16, ""),
                s(17, ""),
                s(19, ""),
                s(24, ""),
            ],
        );
        let spec = msg(
            2,
            &[
                int(1, 2),
                msg(2, &[entry(1, "app", s(2, "web"))]),
                msg(3, &[go_meta("", &[("app", "web")]), pod_spec]),
                msg(4, &[s(1, "")]),
                int(5, 0),
                int(7, 0),
            ],
        );
        let status = msg(3, &[int(1, 0), int(2, 0), int(3, 0), int(4, 0), int(5, 0), int(7, 0)]);
        envelope("apps/v1", "Deployment", &[go_meta("web", &[("app", "web")]), spec, status])
    }

    #[test]
    fn a_deployment_as_kubectl_create_sends_it_decodes_to_kubectls_json() {
        let expected = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                    "spec": {"containers": [
                        {"name": "nginx", "image": "nginx", "ports": [{"containerPort": 80}], "resources": {}},
                    ]},
                },
                "strategy": {},
            },
            "status": {},
        });
        assert_eq!(decode(&kubectl_deployment()).unwrap(), expected);
    }

    #[test]
    fn a_truncated_body_is_an_error_at_every_cut() {
        let body = kubectl_deployment();
        // Cutting exactly before `raw` or after it leaves a well-formed (if empty) message; any other cut
        // up to the end of `raw` leaves a field without its bytes.
        let raw_end = body.len() - s(3, "").len() - s(4, "").len();
        let raw_start = MAGIC.len() + msg(1, &[s(1, "apps/v1"), s(2, "Deployment")]).len();
        for cut in (MAGIC.len()..raw_end).filter(|&cut| cut != raw_start) {
            let err = decode(&body[..cut]).expect_err(&format!("cut at {cut}"));
            assert!(!err.is_empty());
        }
        assert!(decode(&body[..raw_end - 1]).unwrap_err().contains("truncated"));
        for cut in 0..body.len() {
            let _ = decode(&body[..cut]);
        }
    }

    #[test]
    fn an_unknown_kind_is_an_error_naming_it() {
        let err = decode(&envelope("example.com/v1", "Widget", &[go_meta("w", &[])])).unwrap_err();
        assert!(err.contains("example.com/v1 Widget"), "{err}");
        let err = decode(&envelope("v1", "", &[])).unwrap_err();
        assert!(err.contains("no kind"), "{err}");
    }

    #[test]
    fn a_body_without_the_magic_or_with_compression_is_an_error() {
        assert!(decode(b"{\"kind\":\"Namespace\"}").unwrap_err().contains("magic"));
        let gzipped = [MAGIC.to_vec(), msg(1, &[s(1, "v1"), s(2, "Namespace")]), msg(2, &[]), s(3, "gzip")].concat();
        assert!(decode(&gzipped).unwrap_err().contains("gzip"));
    }

    #[test]
    fn a_field_with_the_wrong_wire_type_is_an_error_naming_its_path() {
        let body = envelope("v1", "Namespace", &[msg(1, &[int(1, 5)])]);
        let err = decode(&body).unwrap_err();
        assert!(err.contains("metadata: name: wire type 0"), "{err}");
    }

    #[test]
    fn unknown_fields_of_every_wire_type_are_skipped() {
        let fixed64 = [key(90, 1), vec![1; 8]].concat();
        let fixed32 = [key(91, 5), vec![2; 4]].concat();
        let group = [key(92, 3), int(1, 7), key(3, 3), s(2, "x"), key(3, 4), key(92, 4)].concat();
        let meta = msg(1, &[int(99, 12345), fixed64.clone(), s(1, "cm"), fixed32.clone(), group.clone(), s(98, "?")]);
        let body = envelope("v1", "ConfigMap", &[meta, fixed64, fixed32, group, entry(2, "k", s(2, "v"))]);
        let got = decode(&body).unwrap();
        assert_eq!(
            got,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn times_render_as_rfc3339_and_zero_times_as_null() {
        let meta = msg(1, &[s(1, "l"), msg(8, &[int(1, 1_704_164_645)]), msg(9, &[int(1, GO_ZERO_TIME), int(2, 0)])]);
        let spec = msg(
            2,
            &[
                s(1, "node-1"),
                int(2, 0),
                msg(3, &[int(1, 1_704_164_645), int(2, 123_456_789)]),
                msg(4, &[int(1, 1_704_164_645)]),
            ],
        );
        let got = decode(&envelope("coordination.k8s.io/v1", "Lease", &[meta, spec])).unwrap();
        assert_eq!(
            got["metadata"],
            json!({"name": "l", "creationTimestamp": "2024-01-02T03:04:05Z", "deletionTimestamp": null})
        );
        assert_eq!(
            got["spec"],
            json!({
                "holderIdentity": "node-1", "leaseDurationSeconds": 0,
                "acquireTime": "2024-01-02T03:04:05.123456Z", "renewTime": "2024-01-02T03:04:05.000000Z",
            })
        );
    }

    #[test]
    fn int_or_strings_quantities_and_negative_ints_decode() {
        let container = msg(
            2,
            &[
                s(1, "app"),
                msg(8, &[entry(1, "cpu", msg(2, &[s(1, "500m")])), entry(2, "memory", msg(2, &[s(1, "64Mi")]))]),
            ],
        );
        let template = msg(3, &[msg(2, &[container, int(25, -5), int(4, 30)])]);
        let rolling = msg(2, &[msg(1, &[int(1, 0), int(2, 1)]), msg(2, &[int(1, 1), s(3, "25%")])]);
        let spec = msg(2, &[int(1, 0), template, msg(4, &[s(1, "RollingUpdate"), rolling]), int(6, 10)]);
        let got = decode(&envelope("apps/v1", "Deployment", &[spec])).unwrap();
        assert_eq!(got["spec"]["replicas"], json!(0));
        assert_eq!(got["spec"]["revisionHistoryLimit"], json!(10));
        assert_eq!(
            got["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"}})
        );
        let pod = &got["spec"]["template"]["spec"];
        assert_eq!(pod["priority"], json!(-5));
        assert_eq!(pod["terminationGracePeriodSeconds"], json!(30));
        assert_eq!(
            pod["containers"][0]["resources"],
            json!({"limits": {"cpu": "500m"}, "requests": {"memory": "64Mi"}})
        );
    }

    #[test]
    fn embedded_go_structs_are_inlined_into_their_parent() {
        let env = msg(7, &[s(1, "MODE"), msg(3, &[msg(3, &[msg(1, &[s(1, "cfg")]), s(2, "mode"), int(3, 1)])])]);
        let probe = msg(11, &[msg(1, &[msg(2, &[s(1, "/healthz"), msg(2, &[int(1, 1), s(3, "http")])])]), int(4, 5)]);
        let container = msg(2, &[s(1, "app"), env, probe]);
        let volume = msg(1, &[s(1, "config"), msg(2, &[msg(19, &[msg(1, &[s(1, "cfg")]), int(3, 0o644)])])]);
        let body = envelope("v1", "Pod", &[msg(2, &[volume, container])]);
        let spec = &decode(&body).unwrap()["spec"];
        assert_eq!(spec["volumes"], json!([{"name": "config", "configMap": {"name": "cfg", "defaultMode": 420}}]));
        assert_eq!(
            spec["containers"][0]["env"],
            json!([{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}}])
        );
        assert_eq!(
            spec["containers"][0]["readinessProbe"],
            json!({"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5})
        );
    }

    #[test]
    fn service_accounts_and_role_bindings_decode() {
        let sa = envelope(
            "v1",
            "ServiceAccount",
            &[go_meta("bot", &[]), msg(2, &[s(3, "bot-token")]), msg(3, &[s(1, "regcred")]), int(4, 0)],
        );
        let got = decode(&sa).unwrap();
        assert_eq!(got["secrets"], json!([{"name": "bot-token"}]));
        assert_eq!(got["imagePullSecrets"], json!([{"name": "regcred"}]));
        assert_eq!(got["automountServiceAccountToken"], json!(false));

        let subject = msg(2, &[s(1, "ServiceAccount"), s(2, ""), s(3, "bot"), s(4, "default")]);
        let role_ref = msg(3, &[s(1, "rbac.authorization.k8s.io"), s(2, "ClusterRole"), s(3, "view")]);
        let got = decode(&envelope(RBAC, "ClusterRoleBinding", &[go_meta("b", &[]), subject, role_ref])).unwrap();
        assert_eq!(got["subjects"], json!([{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]));
        assert_eq!(
            got["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"})
        );
    }

    fn unhex(parts: &[&str]) -> Vec<u8> {
        let hex = parts.concat();
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    /// Bodies captured from kubectl v1.32.4, compared with what `--dry-run=client -o json` prints for the
    /// same command.
    #[test]
    fn real_kubectl_bodies_decode_to_kubectls_own_json() {
        // kubectl create deployment web --image=nginx --replicas=2 --port=80 -n team-a
        let deployment = unhex(&[
            "6b3873000a150a07617070732f7631120a4465706c6f796d656e7412be010a250a0377656212001a067465616d2d6122002a0032",
            "00380042005a0a0a0361707012037765621286010802120c0a0a0a0361707012037765621a6c0a1c0a0012001a0022002a003200",
            "380042005a0a0a036170701203776562124c122e0a056e67696e7812056e67696e782a00320a0a001000185022002a0042006a00",
            "7200800100880100900100a201001a00320042004a0052005800600068008201008a01009a0100c2010022020a00280038001a0c",
            "0800100018002000280038001a002200",
        ]);
        let mut expected = decode(&kubectl_deployment()).unwrap();
        expected["metadata"]["namespace"] = json!("team-a");
        assert_eq!(decode(&deployment).unwrap(), expected);

        // kubectl create service clusterip svc --tcp=80:8080 -n team-a
        let service = unhex(&[
            "6b3873000a0d0a027631120753657276696365126f0a250a0373766312001a067465616d2d6122002a003200380042005a0a0a03",
            "617070120373766312420a1b0a0738302d38303830120354435018502207080010903f1a002800120a0a0361707012037376631a",
            "002209436c757374657249503a00420052005a00600068001a020a001a002200",
        ]);
        let expected = json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": "svc", "namespace": "team-a", "creationTimestamp": null, "labels": {"app": "svc"}},
            "spec": {
                "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                "selector": {"app": "svc"}, "type": "ClusterIP",
            },
            "status": {"loadBalancer": {}},
        });
        assert_eq!(decode(&service).unwrap(), expected);
    }

    #[test]
    fn zero_go_pointers_survive_a_round_trip_and_zero_go_values_do_not() {
        let options = json!({
            "apiVersion": "v1", "kind": "DeleteOptions",
            "gracePeriodSeconds": 0, "orphanDependents": false, "preconditions": {"uid": ""},
        });
        assert_eq!(decode(&encode(&options).unwrap()).unwrap(), options);
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "spec": {"replicas": 0, "paused": false, "minReadySeconds": 0, "template": {"spec": {}}},
        });
        let back = decode(&encode(&deployment).unwrap()).unwrap();
        assert_eq!(back["spec"], json!({"replicas": 0, "template": {"spec": {}}}));
    }

    #[test]
    fn delete_options_decode_under_any_groups_api_version() {
        for api_version in ["v1", "apps/v1", "meta.k8s.io/v1", "apiextensions.k8s.io/v1"] {
            let body = envelope(api_version, "DeleteOptions", &[int(1, 0), s(4, "Foreground")]);
            let got = decode(&body).unwrap_or_else(|e| panic!("{api_version}: {e}"));
            assert_eq!(got["gracePeriodSeconds"], json!(0), "{api_version}");
            assert_eq!(got["propagationPolicy"], json!("Foreground"), "{api_version}");
        }
    }

    #[test]
    fn a_status_error_encodes_as_go_writes_it() {
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"x\" not found", "reason": "NotFound",
            "details": {"name": "x", "kind": "pods"}, "code": 404,
        });
        let pb = encode(&status).unwrap();
        let raw = [msg(1, &[]), s(2, "Failure"), s(3, "pods \"x\" not found"), s(4, "NotFound")];
        let details = msg(5, &[s(1, "x"), s(3, "pods")]);
        let expected = [
            MAGIC.to_vec(),
            msg(1, &[s(1, "v1"), s(2, "Status")]),
            msg(2, &[raw.concat(), details, int(6, 404)]),
            s(3, ""),
            s(4, ""),
        ]
        .concat();
        assert_eq!(pb, expected);
        let mut back = decode(&pb).unwrap();
        back.as_object_mut().unwrap().sort_keys();
        let mut status = status;
        status.as_object_mut().unwrap().sort_keys();
        assert_eq!(back, status);
    }

    #[test]
    fn watch_frames_are_a_length_then_a_raw_watch_event_around_an_enveloped_object() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}});
        let frame = watch_frame("ADDED", &ns).unwrap();
        let event = [s(1, "ADDED"), msg(2, &[len(1, &encode(&ns).unwrap())])].concat();
        assert_eq!(frame[..4], (event.len() as u32).to_be_bytes());
        assert_eq!(frame[4..], event[..]);
        assert!(!frame[4..].starts_with(MAGIC));
    }

    #[test]
    fn durations_print_and_parse_as_go_does() {
        for (nanos, text) in [
            (0, "0s"),
            (1_500, "1.5µs"),
            (150_000_000, "150ms"),
            (90_000_000_000, "1m30s"),
            (3_723_500_000_000, "1h2m3.5s"),
            (-2_000_000_000, "-2s"),
        ] {
            assert_eq!(go_duration(nanos), text);
            assert_eq!(parse_go_duration(text).unwrap(), nanos, "{text}");
        }
        assert!(parse_go_duration("5 parsecs").is_err());
    }

    #[test]
    fn custom_resources_and_tables_have_no_protobuf_encoding() {
        let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
        assert!(matches!(encode(&widget), Err(EncodeError::Unsupported { .. })));
        let table = json!({"apiVersion": "meta.k8s.io/v1", "kind": "Table", "rows": []});
        assert!(matches!(encode(&table), Err(EncodeError::Unsupported { .. })));
        let apps_lookalike = json!({"apiVersion": "apps.example.com/v1", "kind": "Deployment"});
        assert!(matches!(encode(&apps_lookalike), Err(EncodeError::Unsupported { .. })));
    }
    /// Writes example JSON for messages of the schema: every field set, scalars non-zero (so none is dropped
    /// as a Go zero value), two items in each list and map, each special message in its JSON form. A message
    /// already being written further up is left out, so recursive types end.
    struct Examples<'a> {
        schema: &'a Schema,
        n: i64,
        stack: Vec<String>,
        families: std::collections::BTreeSet<&'static str>,
    }

    impl Examples<'_> {
        fn fields(&mut self, msg: &Message, obj: &mut Map<String, Value>) {
            for f in &msg.fields {
                if f.inline {
                    let Ty::Msg(inner) = &f.ty else { panic!("inline {} is not a message", f.json) };
                    self.families.insert("inline struct");
                    self.fields(self.schema.message(inner).unwrap(), obj);
                    continue;
                }
                let v = match f.card {
                    Card::One => self.value(&f.ty),
                    Card::List => {
                        self.families.insert("list");
                        let items: Vec<Value> = (0..2).filter_map(|_| self.value(&f.ty)).collect();
                        (!items.is_empty()).then_some(Value::Array(items))
                    }
                    Card::Map => {
                        self.families.insert("map");
                        let entries: Map<String, Value> = ["a", "b.example.com/key"]
                            .iter()
                            .filter_map(|k| Some((k.to_string(), self.value(&f.ty)?)))
                            .collect();
                        (!entries.is_empty()).then_some(Value::Object(entries))
                    }
                };
                if let Some(v) = v {
                    obj.insert(f.json.clone(), v);
                }
            }
        }

        fn value(&mut self, ty: &Ty) -> Option<Value> {
            self.n += 1;
            let n = self.n;
            let family = match ty {
                Ty::Msg(_) => "message",
                Ty::Str => "string",
                Ty::Bytes => "bytes",
                Ty::Bool => "bool",
                _ => "number",
            };
            self.families.insert(family);
            Some(match ty {
                Ty::Str => json!(format!("text-{n}")),
                Ty::Bytes => json!(base64::engine::general_purpose::STANDARD.encode(format!("bytes\0{n}\u{ff}"))),
                Ty::Bool => json!(true),
                // Negative, one-byte and multi-byte varints.
                Ty::I32 if n % 3 == 0 => json!(-n),
                Ty::I32 => json!(n),
                Ty::I64 => json!(n * 1_000_000_007),
                Ty::U32 | Ty::U64 => json!(n),
                Ty::F32 => json!(1.5),
                Ty::F64 => json!(2.25),
                Ty::Msg(name) => return self.message(name),
            })
        }

        fn message(&mut self, name: &str) -> Option<Value> {
            if self.stack.iter().any(|s| s == name) {
                return None;
            }
            let msg = self.schema.message(name).unwrap();
            let special = match msg.special {
                Special::Time => Some(("time", json!("2024-01-02T03:04:05Z"))),
                Special::MicroTime => Some(("micro time", json!("2024-01-02T03:04:05.123456Z"))),
                Special::Duration => Some(("duration", json!("1h2m3.5s"))),
                Special::IntOrString if self.n % 2 == 0 => Some(("int-or-string", json!(8080))),
                Special::IntOrString => Some(("int-or-string", json!("http"))),
                Special::Quantity => Some(("quantity", json!("250m"))),
                Special::FieldsV1 => Some(("fields", json!({"f:metadata": {"f:labels": {"f:app": {}}}}))),
                Special::RawExtension => {
                    Some(("raw", json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}})))
                }
                Special::Items | Special::None => None,
            };
            if let Some((family, v)) = special {
                self.families.insert(family);
                return Some(v);
            }
            self.stack.push(name.to_string());
            let mut obj = Map::new();
            self.fields(msg, &mut obj);
            self.stack.pop();
            Some(match msg.special {
                Special::Items => {
                    self.families.insert("go slice");
                    obj.remove("items").unwrap_or_else(|| json!([]))
                }
                _ => Value::Object(obj),
            })
        }
    }

    /// The first path where `got` and `want` differ, for a readable failure.
    fn difference(path: &str, got: &Value, want: &Value) -> Option<String> {
        match (got, want) {
            (Value::Object(g), Value::Object(w)) => {
                // Each key once: walking both maps' keys would compare every subtree twice per level.
                let missing = w.keys().filter(|k| !g.contains_key(*k));
                g.keys().chain(missing).find_map(|k| match (g.get(k), w.get(k)) {
                    (Some(a), Some(b)) => difference(&format!("{path}.{k}"), a, b),
                    (a, b) => Some(format!("{path}.{k}: got {a:?}, want {b:?}")),
                })
            }
            (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
                g.iter().zip(w).enumerate().find_map(|(i, (a, b))| difference(&format!("{path}[{i}]"), a, b))
            }
            (a, b) if a == b => None,
            (a, b) => Some(format!("{path}: got {a}, want {b}")),
        }
    }

    /// `v` read into k8s-openapi's type for the kind and written back: a field name or value shape that
    /// k8s-openapi (generated from Kubernetes' OpenAPI, not from the .proto) does not know is lost.
    fn through_k8s_openapi(api_version: &str, kind: &str, v: &Value) -> Value {
        use k8s_openapi::api::networking::v1 as networking;
        use k8s_openapi::api::{apps::v1 as apps, coordination::v1 as coordination, core::v1 as core};
        use k8s_openapi::api::{discovery::v1 as discovery, events::v1 as events, node::v1 as node};
        fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Value {
            let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", v["kind"]));
            serde_json::to_value(t).unwrap()
        }
        macro_rules! kinds {
            ($($api_version:literal $kind:literal $ty:ty,)*) => {
                match (api_version, kind) {
                    $(
                        ($api_version, $kind) => typed::<$ty>(v),
                        ($api_version, concat!($kind, "List")) => {
                            // k8s-openapi writes each item's apiVersion and kind, which a list's items lack.
                            let mut list = typed::<k8s_openapi::List<$ty>>(v);
                            for item in list["items"].as_array_mut().into_iter().flatten() {
                                item.as_object_mut().map(|o| (o.remove("apiVersion"), o.remove("kind")));
                            }
                            list
                        }
                    )*
                    _ => panic!("{api_version} {kind}: add it here"),
                }
            };
        }
        kinds! {
            "v1" "Namespace" core::Namespace,
            "v1" "Pod" core::Pod,
            "v1" "Node" core::Node,
            "v1" "ConfigMap" core::ConfigMap,
            "v1" "Secret" core::Secret,
            "v1" "ServiceAccount" core::ServiceAccount,
            "v1" "Service" core::Service,
            "v1" "Endpoints" core::Endpoints,
            "v1" "Event" core::Event,
            "v1" "ReplicationController" core::ReplicationController,
            "v1" "PodTemplate" core::PodTemplate,
            "events.k8s.io/v1" "Event" events::Event,
            "coordination.k8s.io/v1" "Lease" coordination::Lease,
            "node.k8s.io/v1" "RuntimeClass" node::RuntimeClass,
            "apps/v1" "Deployment" apps::Deployment,
            "apps/v1" "ReplicaSet" apps::ReplicaSet,
            "discovery.k8s.io/v1" "EndpointSlice" discovery::EndpointSlice,
            "networking.k8s.io/v1" "Ingress" networking::Ingress,
            "networking.k8s.io/v1" "IngressClass" networking::IngressClass,
            "networking.k8s.io/v1" "NetworkPolicy" networking::NetworkPolicy,
        }
    }

    #[test]
    fn the_review_kinds_with_every_field_set_round_trip_json_to_protobuf_and_back() {
        use k8s_openapi::api::{authentication::v1 as authn, authorization::v1 as authz};
        fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Value {
            let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", v["kind"]));
            serde_json::to_value(t).unwrap()
        }
        let schema = schema().unwrap();
        type Through = fn(&Value) -> Value;
        let kinds: [(&str, &str, Through); 6] = [
            ("authorization.k8s.io/v1", "SelfSubjectAccessReview", typed::<authz::SelfSubjectAccessReview>),
            ("authorization.k8s.io/v1", "SubjectAccessReview", typed::<authz::SubjectAccessReview>),
            ("authorization.k8s.io/v1", "SelfSubjectRulesReview", typed::<authz::SelfSubjectRulesReview>),
            ("authentication.k8s.io/v1", "SelfSubjectReview", typed::<authn::SelfSubjectReview>),
            ("authentication.k8s.io/v1", "TokenReview", typed::<authn::TokenReview>),
            ("authentication.k8s.io/v1", "TokenRequest", typed::<authn::TokenRequest>),
        ];
        for (api_version, kind, through_k8s_openapi) in kinds {
            let msg = schema.find(api_version, kind).unwrap_or_else(|| panic!("{api_version} {kind}"));
            let mut examples = Examples { schema, n: 0, stack: Vec::new(), families: Default::default() };
            let mut obj = Map::new();
            obj.insert("apiVersion".into(), json!(api_version));
            obj.insert("kind".into(), json!(kind));
            examples.fields(msg, &mut obj);
            let example = Value::Object(obj);
            let back = decode(&encode(&example).unwrap_or_else(|e| panic!("{kind}: {e}"))).unwrap();
            assert_eq!(difference(kind, &back, &example), None);
            assert_eq!(difference(kind, &through_k8s_openapi(&example), &example), None);
        }
    }

    #[test]
    fn every_served_kind_and_its_list_with_every_field_set_round_trips_json_to_protobuf_and_back() {
        let schema = schema().unwrap();
        let mut all_families = std::collections::BTreeSet::new();
        for rt in berth_api::resources::ALL {
            let api_version = rt.api_version();
            for kind in [rt.kind.to_string(), rt.list_kind()] {
                let msg = schema.find(&api_version, &kind).unwrap_or_else(|| panic!("{api_version} {kind}"));
                let mut examples = Examples { schema, n: 0, stack: Vec::new(), families: Default::default() };
                let mut obj = Map::new();
                obj.insert("apiVersion".into(), json!(api_version));
                obj.insert("kind".into(), json!(kind));
                examples.fields(msg, &mut obj);
                let example = Value::Object(obj);
                let pb = encode(&example).unwrap_or_else(|e| panic!("{kind}: {e}"));
                let back = decode(&pb).unwrap_or_else(|e| panic!("{kind}: {e}"));
                assert_eq!(difference(&kind, &back, &example), None);
                // The example is the kind's JSON as Kubernetes defines it, not just as the schema says.
                assert_eq!(difference(&kind, &through_k8s_openapi(&api_version, &kind, &example), &example), None);
                // Every field of the kind is in the example: ObjectMeta alone brings these.
                for family in ["message", "list", "map", "string"] {
                    assert!(examples.families.contains(family), "{kind} has no {family}");
                }
                all_families.extend(examples.families);
            }
        }
        // What the served kinds have between them (no Duration, RawExtension or Go slice wrapper).
        let expected = [
            "bool",
            "bytes",
            "fields",
            "inline struct",
            "int-or-string",
            "list",
            "map",
            "message",
            "micro time",
            "number",
            "quantity",
            "string",
            "time",
        ];
        assert_eq!(all_families.into_iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn a_list_encoded_item_by_item_is_the_list_encoded_whole() {
        let items = vec![
            json!({"metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "v"}}),
            json!({"metadata": {"name": "b", "namespace": "ns"}}),
        ];
        let whole = encode(&json!({
            "apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "7"}, "items": items,
        }))
        .unwrap();
        let list = ListEncoder::new("v1", "ConfigMapList", "ConfigMap").unwrap();
        let mut encoded = Vec::new();
        for item in &items {
            list.item(item, &mut encoded).unwrap();
        }
        let mut body = list.head(&json!({"resourceVersion": "7"}), encoded.len()).unwrap();
        body.extend(encoded);
        body.extend(list.tail());
        assert_eq!(body, whole);
    }
}
