//! CRI messages to and from the protobuf JSON that crictl reads and prints, driven by the serde
//! derives k8s-cri generates (snake_case names, every field required, enums as `i32`).
//!
//! Out: camelCase names, 64-bit integers as strings, enums by name, unset messages as `null`,
//! map keys sorted. In: snake_case, camelCase or any-case keys; missing or `null` fields take
//! the proto default; integers as numbers or strings; enums by name or number.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Serialize};
use serde_json::{Map, Number, Value};

use k8s_cri::v1 as cri;

type Error = serde_json::Error;

/// The proto JSON of a CRI message (any of k8s-cri's types).
pub fn to_value<T: Serialize>(message: &T) -> Value {
    // The serializer fails only on shapes CRI messages do not have (non-string map keys).
    message.serialize(Ser { parent: "", field: "" }).unwrap_or(Value::Null)
}

/// A CRI message from JSON in either spelling of its field names.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, Error> {
    T::deserialize(De { value, field: "" })
}

/// `log_directory` → `logDirectory`, as protoc derives JSON names.
pub fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The key both spellings share: `logDirectory`, `log_directory` and `LogDirectory` all match,
/// as Go's case-insensitive JSON decoding lets crictl accept.
fn fold(name: &str) -> String {
    name.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect()
}

/// The enum an `i32` field holds, by the struct and field it is in.
#[derive(Clone, Copy)]
enum EnumKind {
    Protocol,
    Propagation,
    Namespace,
    ProfileType,
    GroupsPolicy,
    SandboxState,
    ContainerState,
    EventType,
    MetricType,
    CgroupDriver,
}

fn enum_kind(parent: &str, field: &str) -> Option<EnumKind> {
    Some(match field {
        "protocol" => EnumKind::Protocol,
        "propagation" => EnumKind::Propagation,
        "network" | "pid" | "ipc" | "mode" => EnumKind::Namespace,
        "profile_type" => EnumKind::ProfileType,
        "supplemental_groups_policy" => EnumKind::GroupsPolicy,
        "state" if parent.starts_with("PodSandbox") => EnumKind::SandboxState,
        "state" => EnumKind::ContainerState,
        "container_event_type" => EnumKind::EventType,
        "metric_type" => EnumKind::MetricType,
        "cgroup_driver" => EnumKind::CgroupDriver,
        _ => return None,
    })
}

impl EnumKind {
    fn name(self, v: i32) -> Option<&'static str> {
        use security_profile::ProfileType;
        let name = match self {
            EnumKind::Protocol => cri::Protocol::try_from(v).ok()?.as_str_name(),
            EnumKind::Propagation => cri::MountPropagation::try_from(v).ok()?.as_str_name(),
            EnumKind::Namespace => cri::NamespaceMode::try_from(v).ok()?.as_str_name(),
            EnumKind::ProfileType => ProfileType::try_from(v).ok()?.as_str_name(),
            EnumKind::GroupsPolicy => cri::SupplementalGroupsPolicy::try_from(v).ok()?.as_str_name(),
            EnumKind::SandboxState => cri::PodSandboxState::try_from(v).ok()?.as_str_name(),
            EnumKind::ContainerState => cri::ContainerState::try_from(v).ok()?.as_str_name(),
            EnumKind::EventType => cri::ContainerEventType::try_from(v).ok()?.as_str_name(),
            EnumKind::MetricType => cri::MetricType::try_from(v).ok()?.as_str_name(),
            EnumKind::CgroupDriver => cri::CgroupDriver::try_from(v).ok()?.as_str_name(),
        };
        Some(name)
    }

    fn value(self, name: &str) -> Option<i32> {
        use security_profile::ProfileType;
        Some(match self {
            EnumKind::Protocol => cri::Protocol::from_str_name(name)? as i32,
            EnumKind::Propagation => cri::MountPropagation::from_str_name(name)? as i32,
            EnumKind::Namespace => cri::NamespaceMode::from_str_name(name)? as i32,
            EnumKind::ProfileType => ProfileType::from_str_name(name)? as i32,
            EnumKind::GroupsPolicy => cri::SupplementalGroupsPolicy::from_str_name(name)? as i32,
            EnumKind::SandboxState => cri::PodSandboxState::from_str_name(name)? as i32,
            EnumKind::ContainerState => cri::ContainerState::from_str_name(name)? as i32,
            EnumKind::EventType => cri::ContainerEventType::from_str_name(name)? as i32,
            EnumKind::MetricType => cri::MetricType::from_str_name(name)? as i32,
            EnumKind::CgroupDriver => cri::CgroupDriver::from_str_name(name)? as i32,
        })
    }
}

use cri::security_profile;

// ---------------------------------------------------------------------------------------------
// Out

/// Serializes one value; `parent` and `field` name where it sits, for enum names.
#[derive(Clone, Copy)]
struct Ser {
    parent: &'static str,
    field: &'static str,
}

fn unsupported(what: &str) -> Error {
    ser::Error::custom(format!("{what} has no protobuf JSON form"))
}

impl ser::Serializer for Ser {
    type Ok = Value;
    type Error = Error;
    type SerializeSeq = SeqOut;
    type SerializeTuple = SeqOut;
    type SerializeTupleStruct = SeqOut;
    type SerializeTupleVariant = ser::Impossible<Value, Error>;
    type SerializeMap = MapOut;
    type SerializeStruct = StructOut;
    type SerializeStructVariant = ser::Impossible<Value, Error>;

    fn serialize_bool(self, v: bool) -> Result<Value, Error> {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Value, Error> {
        self.serialize_i32(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<Value, Error> {
        self.serialize_i32(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<Value, Error> {
        match enum_kind(self.parent, self.field).and_then(|k| k.name(v)) {
            Some(name) => Ok(Value::String(name.into())),
            None => Ok(Value::Number(v.into())),
        }
    }
    fn serialize_i64(self, v: i64) -> Result<Value, Error> {
        // 64-bit integers are strings in protobuf JSON: JavaScript cannot hold them.
        Ok(Value::String(v.to_string()))
    }
    fn serialize_u8(self, v: u8) -> Result<Value, Error> {
        Ok(Value::Number(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Value, Error> {
        Ok(Value::Number(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Value, Error> {
        Ok(Value::Number(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Value, Error> {
        Ok(Value::String(v.to_string()))
    }
    fn serialize_f32(self, v: f32) -> Result<Value, Error> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<Value, Error> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn serialize_char(self, v: char) -> Result<Value, Error> {
        Ok(Value::String(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Value, Error> {
        Ok(Value::String(v.into()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, Error> {
        Ok(Value::Array(v.iter().map(|b| Value::Number((*b).into())).collect()))
    }
    fn serialize_none(self) -> Result<Value, Error> {
        Ok(Value::Null)
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<Value, Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, Error> {
        Ok(Value::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Value, Error> {
        Ok(Value::Null)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<Value, Error> {
        Ok(Value::String(variant.into()))
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, value: &T) -> Result<Value, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Value, Error> {
        let mut m = Map::new();
        m.insert(camel_case(variant), value.serialize(self)?);
        Ok(Value::Object(m))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqOut, Error> {
        Ok(SeqOut { ser: self, items: Vec::with_capacity(len.unwrap_or(0)) })
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqOut, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<SeqOut, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(unsupported("a tuple variant"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<MapOut, Error> {
        Ok(MapOut { ser: self, entries: Vec::new(), key: None })
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<StructOut, Error> {
        Ok(StructOut { name, fields: Map::new() })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(unsupported("a struct variant"))
    }
}

struct SeqOut {
    ser: Ser,
    items: Vec<Value>,
}

impl ser::SerializeSeq for SeqOut {
    type Ok = Value;
    type Error = Error;
    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.items.push(value.serialize(self.ser)?);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        Ok(Value::Array(self.items))
    }
}

impl ser::SerializeTuple for SeqOut {
    type Ok = Value;
    type Error = Error;
    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<Value, Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for SeqOut {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<Value, Error> {
        ser::SerializeSeq::end(self)
    }
}

/// A proto map: string keys, sorted so output is stable (the fields are `HashMap`s).
struct MapOut {
    ser: Ser,
    entries: Vec<(String, Value)>,
    key: Option<String>,
}

impl ser::SerializeMap for MapOut {
    type Ok = Value;
    type Error = Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Error> {
        let key = match key.serialize(Ser { parent: "", field: "" })? {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return Err(unsupported("a non-scalar map key")),
        };
        self.key = Some(key);
        Ok(())
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        let key = self.key.take().ok_or_else(|| unsupported("a map value without a key"))?;
        self.entries.push((key, value.serialize(self.ser)?));
        Ok(())
    }
    fn end(mut self) -> Result<Value, Error> {
        self.entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Value::Object(self.entries.into_iter().collect()))
    }
}

struct StructOut {
    name: &'static str,
    fields: Map<String, Value>,
}

impl ser::SerializeStruct for StructOut {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        let v = value.serialize(Ser { parent: self.name, field: key })?;
        self.fields.insert(camel_case(key), v);
        Ok(())
    }
    fn end(self) -> Result<Value, Error> {
        Ok(Value::Object(self.fields))
    }
}

// ---------------------------------------------------------------------------------------------
// In

static NULL: Value = Value::Null;

/// Deserializes one JSON value; `field` names the struct field it fills, for enum names.
struct De<'a> {
    value: &'a Value,
    field: &'static str,
}

fn invalid(value: &Value, expected: &str) -> Error {
    de::Error::custom(format!("invalid value {value}, expected {expected}"))
}

impl De<'_> {
    /// Integers as numbers, decimal strings (how proto JSON writes 64-bit ones), or enum names.
    fn integer(&self) -> Result<i128, Error> {
        match self.value {
            Value::Null => Ok(0),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Ok(i.into())
                } else if let Some(u) = n.as_u64() {
                    Ok(u.into())
                } else {
                    match n.as_f64() {
                        Some(f) if f.fract() == 0.0 => Ok(f as i128),
                        _ => Err(invalid(self.value, "an integer")),
                    }
                }
            }
            Value::String(s) => {
                if let Ok(i) = s.trim().parse::<i128>() {
                    return Ok(i);
                }
                let kind = enum_kind("", self.field);
                match kind.and_then(|k| k.value(s)) {
                    Some(v) => Ok(v.into()),
                    None if kind.is_some() => Err(de::Error::custom(format!("unknown value {s:?} for {}", self.field))),
                    None => Err(invalid(self.value, "an integer")),
                }
            }
            _ => Err(invalid(self.value, "an integer")),
        }
    }
}

impl<'de> de::Deserializer<'de> for De<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or_default())
                }
            }
            Value::String(s) => visitor.visit_str(s),
            Value::Array(_) => self.deserialize_seq(visitor),
            Value::Object(_) => self.deserialize_map(visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_bool(false),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::String(s) if s == "true" || s == "false" => visitor.visit_bool(s == "true"),
            v => Err(invalid(v, "a boolean")),
        }
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_i64(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_i64(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_i64(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let i = self.integer()?;
        // The visitor of the field's own type checks the range.
        match i64::try_from(i) {
            Ok(i) => visitor.visit_i64(i),
            Err(_) => Err(invalid(self.value, "a 64-bit integer")),
        }
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let i = self.integer()?;
        match u64::try_from(i) {
            Ok(u) => visitor.visit_u64(u),
            Err(_) => Err(invalid(self.value, "an unsigned integer")),
        }
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_f64(visitor)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_f64(0.0),
            Value::Number(n) => visitor.visit_f64(n.as_f64().unwrap_or_default()),
            Value::String(s) => visitor.visit_f64(s.trim().parse().map_err(|_| invalid(self.value, "a number"))?),
            v => Err(invalid(v, "a number")),
        }
    }
    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_str(""),
            Value::String(s) => visitor.visit_str(s),
            // YAML users write `version: 1` for label values; take scalars as their text.
            Value::Number(n) => visitor.visit_string(n.to_string()),
            Value::Bool(b) => visitor.visit_string(b.to_string()),
            v => Err(invalid(v, "a string")),
        }
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_seq(SeqIn { items: [].iter(), field: self.field }),
            Value::Array(items) => visitor.visit_seq(SeqIn { items: items.iter(), field: self.field }),
            v => Err(invalid(v, "a list")),
        }
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_map(MapIn { entries: Vec::new().into_iter(), value: None, field: self.field }),
            Value::Object(m) => {
                let entries: Vec<_> = m.iter().collect();
                visitor.visit_map(MapIn { entries: entries.into_iter(), value: None, field: self.field })
            }
            v => Err(invalid(v, "a map")),
        }
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let object = match self.value {
            Value::Null => None,
            Value::Object(m) => Some(m),
            v => return Err(invalid(v, &format!("an object ({name})"))),
        };
        let mut found: Vec<&Value> = vec![&NULL; fields.len()];
        if let Some(object) = object {
            let folded: Vec<String> = fields.iter().map(|f| fold(f)).collect();
            for (key, value) in object {
                match folded.iter().position(|f| *f == fold(key)) {
                    Some(i) => found[i] = value,
                    // Go's decoder, which crictl uses, skips unknown fields; say so at least.
                    None => tracing::warn!(field = %key, message = name, "unknown field ignored"),
                }
            }
        }
        visitor.visit_map(StructIn { fields, values: found, index: 0 })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Error> {
        Err(de::Error::custom(format!("{name} is not supported in configuration files")))
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

struct SeqIn<'a> {
    items: std::slice::Iter<'a, Value>,
    field: &'static str,
}

impl<'de> SeqAccess<'de> for SeqIn<'_> {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        match self.items.next() {
            None => Ok(None),
            Some(value) => seed.deserialize(De { value, field: self.field }).map(Some),
        }
    }
}

struct MapIn<'a> {
    entries: std::vec::IntoIter<(&'a String, &'a Value)>,
    value: Option<&'a Value>,
    field: &'static str,
}

impl<'de> MapAccess<'de> for MapIn<'_> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            None => Ok(None),
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(k.as_str().into_deserializer()).map(Some)
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self.value.take().unwrap_or(&NULL);
        seed.deserialize(De { value, field: self.field })
    }
}

/// Every field of the struct in order, the missing ones as `null` (their proto default).
struct StructIn<'a> {
    fields: &'static [&'static str],
    values: Vec<&'a Value>,
    index: usize,
}

impl<'de> MapAccess<'de> for StructIn<'_> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        match self.fields.get(self.index) {
            None => Ok(None),
            Some(f) => seed.deserialize(BorrowedStrDeserializer::<Error>::new(f)).map(Some),
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let field = self.fields[self.index];
        let value = self.values[self.index];
        self.index += 1;
        seed.deserialize(De { value, field }).map_err(|e| de::Error::custom(format!("{field}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_become_camel_case() {
        assert_eq!(camel_case("log_directory"), "logDirectory");
        assert_eq!(camel_case("run_as_user"), "runAsUser");
        assert_eq!(camel_case("id"), "id");
    }

    #[test]
    fn messages_print_with_camel_case_string_int64_and_enum_names() {
        let c = cri::Container {
            id: "abc".into(),
            pod_sandbox_id: "pod".into(),
            state: cri::ContainerState::ContainerRunning as i32,
            created_at: 1_700_000_000_000_000_000,
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 2 }),
            labels: [("b".to_string(), "2".to_string()), ("a".into(), "1".into())].into(),
            ..Default::default()
        };
        let v = to_value(&c);
        assert_eq!(v["podSandboxId"], "pod");
        assert_eq!(v["state"], "CONTAINER_RUNNING");
        assert_eq!(v["createdAt"], "1700000000000000000");
        assert_eq!(v["metadata"], json!({"name": "app", "attempt": 2}));
        assert_eq!(v["image"], Value::Null);
        assert_eq!(v["labels"].as_object().unwrap().keys().collect::<Vec<_>>(), ["a", "b"]);
        let s = cri::PodSandbox { state: cri::PodSandboxState::SandboxNotready as i32, ..Default::default() };
        assert_eq!(to_value(&s)["state"], "SANDBOX_NOTREADY");
    }

    #[test]
    fn snake_and_camel_case_configs_read_the_same() {
        let snake = json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "attempt": 1},
            "log_directory": "/tmp/logs",
            "port_mappings": [{"container_port": 80, "host_port": "8080", "protocol": "UDP"}],
            "linux": {"security_context": {"namespace_options": {"network": "NODE", "pid": 1}}},
        });
        let camel = json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "attempt": "1"},
            "logDirectory": "/tmp/logs",
            "portMappings": [{"containerPort": 80, "hostPort": 8080, "protocol": 1}],
            "linux": {"securityContext": {"namespaceOptions": {"network": 2, "pid": "CONTAINER"}}},
        });
        let a: cri::PodSandboxConfig = from_value(&snake).unwrap();
        let b: cri::PodSandboxConfig = from_value(&camel).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.log_directory, "/tmp/logs");
        assert_eq!(a.metadata.as_ref().unwrap().attempt, 1);
        assert_eq!(a.port_mappings[0].host_port, 8080);
        assert_eq!(a.port_mappings[0].protocol, cri::Protocol::Udp as i32);
        let ns = a.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
    }

    #[test]
    fn missing_and_null_fields_take_proto_defaults() {
        let c: cri::ContainerConfig = from_value(&json!({"metadata": {"name": "x"}, "labels": null})).unwrap();
        assert_eq!(c.metadata.unwrap().name, "x");
        assert!(c.labels.is_empty() && c.command.is_empty() && c.image.is_none());
        assert!(!c.tty);
    }

    #[test]
    fn bad_values_are_rejected_with_the_field_named() {
        let err = from_value::<cri::PodSandboxConfig>(&json!({"port_mappings": [{"protocol": "QUIC"}]})).unwrap_err();
        assert!(err.to_string().contains("protocol"), "{err}");
        let err = from_value::<cri::PodSandboxConfig>(&json!({"hostname": ["a"]})).unwrap_err();
        assert!(err.to_string().contains("hostname"), "{err}");
        assert!(from_value::<cri::ContainerConfig>(&json!({"metadata": {"attempt": -1}})).is_err());
    }

    #[test]
    fn printed_messages_read_back_unchanged() {
        let c = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "x".into(), attempt: 3 }),
            command: vec!["sh".into()],
            mounts: vec![cri::Mount {
                container_path: "/data".into(),
                propagation: cri::MountPropagation::PropagationBidirectional as i32,
                ..Default::default()
            }],
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources { memory_limit_in_bytes: 1 << 40, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = to_value(&c);
        assert_eq!(v["mounts"][0]["propagation"], "PROPAGATION_BIDIRECTIONAL");
        assert_eq!(from_value::<cri::ContainerConfig>(&v).unwrap(), c);
    }
}
