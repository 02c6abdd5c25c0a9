//! Label and field selectors: parsing Kubernetes' query syntax and matching objects.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::validation::{is_qualified_name, is_valid_label_value};

/// How a label requirement relates its key and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One clause of a label selector, e.g. `tier in (web,api)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    /// Sorted and de-duplicated, as Kubernetes keeps them.
    pub values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement with Kubernetes' `NewRequirement` checks; the error reads as its
    /// aggregated field errors.
    pub fn new(key: &str, operator: Operator, values: Vec<String>) -> Result<Self, String> {
        let mut errs: Vec<String> = Vec::new();
        let key_msgs = is_qualified_name(key);
        if !key_msgs.is_empty() {
            errs.push(format!("key: Invalid value: {key:?}: {}", key_msgs.join("; ")));
        }
        let shown = serde_json::to_string(&values).unwrap_or_default();
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => errs.push(format!(
                "values: Invalid value: {shown}: for 'in', 'notin' operators, values set can't be empty"
            )),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals if values.len() != 1 => errs
                .push(format!("values: Invalid value: {shown}: exact-match compatibility requires one single value")),
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => errs.push(format!(
                "values: Invalid value: {shown}: values set must be empty for exists and does not exist"
            )),
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(format!(
                        "values: Invalid value: {shown}: for 'Gt', 'Lt' operators, exactly one value is required"
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(format!(
                            "values[{i}]: Invalid value: {v:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                        ));
                    }
                }
            }
            _ => {}
        }
        for (i, v) in values.iter().enumerate() {
            let msgs = is_valid_label_value(v);
            if !msgs.is_empty() {
                errs.push(format!("values[{i}][{key}]: Invalid value: {v:?}: {}", msgs.join("; ")));
            }
        }
        if !errs.is_empty() {
            return Err(aggregate(errs));
        }
        let values: BTreeSet<String> = values.into_iter().collect();
        Ok(Requirement { key: key.to_string(), operator, values: values.into_iter().collect() })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let got = labels.get(&self.key);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => got.is_some_and(|v| self.values.contains(v)),
            // Kubernetes: a missing label satisfies `!=` and `notin`.
            Operator::NotIn | Operator::NotEquals => got.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => got.is_some(),
            Operator::DoesNotExist => got.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), [want]) = (got.and_then(|v| v.parse::<i64>().ok()), self.values.as_slice()) else {
                    return false;
                };
                let Ok(want) = want.parse::<i64>() else { return false };
                if self.operator == Operator::GreaterThan { have > want } else { have < want }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.operator {
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::Equals => write!(f, "{}={first}", self.key),
            Operator::DoubleEquals => write!(f, "{}=={first}", self.key),
            Operator::NotEquals => write!(f, "{}!={first}", self.key),
            Operator::GreaterThan => write!(f, "{}>{first}", self.key),
            Operator::LessThan => write!(f, "{}<{first}", self.key),
            Operator::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
        }
    }
}

/// `utilerrors.NewAggregate(...).Error()`: one message alone, several bracketed.
fn aggregate(mut msgs: Vec<String>) -> String {
    let mut seen = BTreeSet::new();
    msgs.retain(|m| seen.insert(m.clone()));
    if msgs.len() == 1 { msgs.remove(0) } else { format!("[{}]", msgs.join(", ")) }
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),!h`), or one built from a `metav1.LabelSelector`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut p = Parser { items: lex(s), pos: 0 };
        let mut requirements = p.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// `metav1.LabelSelectorAsSelector`: matchLabels are `=` requirements; no clauses at all
    /// selects everything.
    pub fn from_k8s(sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            requirements.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        for e in sel.match_expressions.iter().flatten() {
            let op = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            requirements.push(Requirement::new(&e.key, op, e.values.clone().unwrap_or_default())?);
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        write!(f, "{}", parts.join(","))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    End,
    ClosedPar,
    Comma,
    Bang,
    DoubleEquals,
    Equals,
    Greater,
    Identifier,
    In,
    Less,
    NotEquals,
    NotIn,
    OpenPar,
}

fn symbol_token(s: &str) -> Option<Tok> {
    Some(match s {
        ")" => Tok::ClosedPar,
        "," => Tok::Comma,
        "!" => Tok::Bang,
        "==" => Tok::DoubleEquals,
        "=" => Tok::Equals,
        ">" => Tok::Greater,
        "<" => Tok::Less,
        "!=" => Tok::NotEquals,
        "(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits a selector into tokens the way Kubernetes' lexer does: identifiers run until a
/// symbol or whitespace; symbols take the longest known operator.
fn lex(s: &str) -> Vec<(Tok, String)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        if i >= b.len() {
            out.push((Tok::End, String::new()));
            return out;
        }
        if is_special(b[i]) {
            let mut best: Option<(Tok, usize)> = None;
            let mut j = i;
            while j < b.len() && is_special(b[j]) {
                j += 1;
                match symbol_token(&s[i..j]) {
                    Some(t) => best = Some((t, j)),
                    None if best.is_some() => break,
                    None => {}
                }
            }
            // Every single symbol is a token, so `best` is always set.
            let (t, end) = best.unwrap_or((Tok::Identifier, j));
            out.push((t, s[i..end].to_string()));
            i = end;
        } else {
            let start = i;
            while i < b.len() && !is_special(b[i]) && !is_space(b[i]) {
                i += 1;
            }
            let word = &s[start..i];
            let t = match word {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Identifier,
            };
            out.push((t, word.to_string()));
        }
    }
}

struct Parser {
    items: Vec<(Tok, String)>,
    pos: usize,
}

impl Parser {
    /// The next token; in a value position `in` and `notin` are plain identifiers.
    fn peek(&self, values: bool) -> (Tok, String) {
        let (t, l) = self.items[self.pos.min(self.items.len() - 1)].clone();
        (if values && matches!(t, Tok::In | Tok::NotIn) { Tok::Identifier } else { t }, l)
    }

    fn next(&mut self, values: bool) -> (Tok, String) {
        let item = self.peek(values);
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut out = Vec::new();
        loop {
            let (t, lit) = self.peek(true);
            match t {
                Tok::Identifier | Tok::Bang => {
                    let r = self.requirement().map_err(|e| format!("unable to parse requirement: {e}"))?;
                    out.push(r);
                    let (t, lit) = self.next(true);
                    match t {
                        Tok::End => return Ok(out),
                        Tok::Comma => {
                            let (t2, lit2) = self.peek(true);
                            if t2 != Tok::Identifier && t2 != Tok::Bang {
                                return Err(format!("found '{lit2}', expected: identifier after ','"));
                            }
                        }
                        _ => return Err(format!("found '{lit}', expected: ',' or 'end of string'")),
                    }
                }
                Tok::End => return Ok(out),
                _ => return Err(format!("found '{lit}', expected: !, identifier, or 'end of string'")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, unary) = self.key_and_unary()?;
        if let Some(op) = unary {
            return Requirement::new(&key, op, Vec::new());
        }
        let (t, lit) = self.next(false);
        let op = match t {
            Tok::In => Operator::In,
            Tok::NotIn => Operator::NotIn,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::NotEquals => Operator::NotEquals,
            Tok::Greater => Operator::GreaterThan,
            Tok::Less => Operator::LessThan,
            _ => return Err(format!("found '{lit}', expected: in, notin, =, ==, !=, gt, lt")),
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.value_set()?,
            _ => self.exact_value()?,
        };
        Requirement::new(&key, op, values.into_iter().collect())
    }

    /// The key, with `Exists`/`DoesNotExist` when no binary operator follows.
    fn key_and_unary(&mut self) -> Result<(String, Option<Operator>), String> {
        let (mut t, mut lit) = self.next(true);
        let mut op = None;
        if t == Tok::Bang {
            op = Some(Operator::DoesNotExist);
            (t, lit) = self.next(true);
        }
        if t != Tok::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let msgs = is_qualified_name(&lit);
        if !msgs.is_empty() {
            // Kubernetes reports this one with no field path, which prints as `<nil>`.
            return Err(format!("<nil>: Invalid value: {lit:?}: {}", msgs.join("; ")));
        }
        let (next, _) = self.peek(true);
        if matches!(next, Tok::End | Tok::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        Ok((lit, op))
    }

    fn value_set(&mut self) -> Result<BTreeSet<String>, String> {
        let (t, lit) = self.next(true);
        if t != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (t, lit) = self.peek(true);
        match t {
            Tok::Identifier | Tok::Comma => {
                let set = self.identifier_list()?;
                let (t, _) = self.next(true);
                if t != Tok::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Tok::ClosedPar => {
                self.next(true);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// Comma-separated, possibly empty identifiers up to (not including) `)`.
    fn identifier_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut set = BTreeSet::new();
        loop {
            let (t, lit) = self.next(true);
            match t {
                Tok::Identifier => {
                    set.insert(lit);
                    let (t2, lit2) = self.peek(true);
                    match t2 {
                        Tok::Comma => continue,
                        Tok::ClosedPar => return Ok(set),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    let (t2, _) = self.peek(true);
                    if t2 == Tok::ClosedPar {
                        set.insert(String::new());
                        return Ok(set);
                    }
                    if t2 == Tok::Comma {
                        set.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (t, _) = self.peek(true);
        if matches!(t, Tok::End | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (t, lit) = self.next(true);
        if t == Tok::Identifier {
            Ok(BTreeSet::from([lit]))
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

/// One field selector term: `field=value` or `field!=value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    /// True for `!=`.
    pub not: bool,
    pub value: String,
}

/// A parsed field selector (`spec.nodeName=n1,status.phase!=Running`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = split_terms(s);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            let Some((field, op, rhs)) = split_term(part) else {
                return Err(format!("invalid selector: '{s}'; can't understand '{part}'"));
            };
            let value = unescape_value(rhs)?;
            // A bare `=` selects everything, as Kubernetes drops it.
            if field.is_empty() && value.is_empty() {
                continue;
            }
            terms.push(FieldTerm { field: field.to_string(), not: op == "!=", value });
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }

    /// The field names the selector mentions, to check them against what a resource supports.
    pub fn fields(&self) -> Vec<&str> {
        self.terms.iter().map(|t| t.field.as_str()).collect()
    }

    /// A missing field has the value "", so `k!=v` and `k=` match it.
    pub fn matches(&self, fields: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|t| {
            let have = fields.get(&t.field).map(String::as_str).unwrap_or("");
            (have == t.value) != t.not
        })
    }

    /// The value a term requires `field` to equal exactly, if any (for indexed lookups).
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms.iter().find(|t| !t.not && t.field == field).map(|t| t.value.as_str())
    }
}

/// Splits on commas not preceded by a backslash escape.
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out
}

/// The first operator in the term splits it; the left side has no escaping.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if rest.starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

fn unescape_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            if matches!(c, '\\' | ',' | '=') {
                out.push(c);
            } else {
                return Err(format!("invalid field selector: invalid escape sequence: \\{c}"));
            }
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            // Go prints the rune as its number here.
            ',' | '=' => return Err(format!("invalid field selector: unescaped character in value: {}", c as u32)),
            _ => out.push(c),
        }
    }
    if escaped {
        return Err("invalid field selector: invalid escape sequence: \\".to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn equality_and_set_clauses_parse_and_match() {
        let s = LabelSelector::parse("app=web, tier in (a,b),env!=prod,!legacy").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "b")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("legacy", "")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("env", "prod")])));
    }

    #[test]
    fn double_equals_is_equality() {
        let s = LabelSelector::parse("a==b").unwrap();
        assert!(s.matches(&labels(&[("a", "b")])));
        assert!(!s.matches(&labels(&[("a", "c")])));
    }

    #[test]
    fn not_equals_matches_objects_without_the_label() {
        let s = LabelSelector::parse("a!=b").unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(!s.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn notin_matches_objects_without_the_label() {
        let s = LabelSelector::parse("a notin (x)").unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "y")])));
        assert!(!s.matches(&labels(&[("a", "x")])));
    }

    #[test]
    fn bare_key_requires_existence_and_bang_requires_absence() {
        let s = LabelSelector::parse("a").unwrap();
        assert!(s.matches(&labels(&[("a", "")])));
        assert!(!s.matches(&labels(&[])));
        let n = LabelSelector::parse("!a").unwrap();
        assert!(n.matches(&labels(&[])));
        assert!(!n.matches(&labels(&[("a", "1")])));
    }

    #[test]
    fn greater_and_less_compare_integers() {
        let s = LabelSelector::parse("a>5,b<3").unwrap();
        assert!(s.matches(&labels(&[("a", "6"), ("b", "2")])));
        assert!(!s.matches(&labels(&[("a", "5"), ("b", "2")])));
        assert!(!s.matches(&labels(&[("a", "x"), ("b", "2")])));
        assert!(!s.matches(&labels(&[("b", "2")])));
    }

    #[test]
    fn gt_with_non_integer_is_rejected() {
        let e = LabelSelector::parse("a>x").unwrap_err();
        assert_eq!(
            e,
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
    }

    #[test]
    fn whitespace_and_empty_strings_are_tolerated() {
        assert!(LabelSelector::parse("").unwrap().is_empty());
        assert!(LabelSelector::parse("  ").unwrap().is_empty());
        let s = LabelSelector::parse("  a  in  ( x , y ) ,  b = c ").unwrap();
        assert_eq!(s.to_string(), "a in (x,y),b=c");
    }

    #[test]
    fn in_may_be_a_value_and_empty_values_are_allowed() {
        let s = LabelSelector::parse("x in (in,notin)").unwrap();
        assert!(s.matches(&labels(&[("x", "notin")])));
        let e = LabelSelector::parse("x=").unwrap();
        assert!(e.matches(&labels(&[("x", "")])));
        let sets = LabelSelector::parse("x in (,a)").unwrap();
        assert!(sets.matches(&labels(&[("x", "")])));
    }

    #[test]
    fn invalid_value_is_reported_with_its_key() {
        let e = LabelSelector::parse("a=b c").unwrap_err();
        assert_eq!(e, "found 'c', expected: ',' or 'end of string'");
        let e = LabelSelector::parse("a=-b").unwrap_err();
        assert!(
            e.starts_with("unable to parse requirement: values[0][a]: Invalid value: \"-b\": a valid label must be"),
            "{e}"
        );
    }

    #[test]
    fn invalid_key_is_reported_with_a_nil_path() {
        let e = LabelSelector::parse("-a=b").unwrap_err();
        assert!(
            e.starts_with("unable to parse requirement: <nil>: Invalid value: \"-a\": name part must consist of"),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_name_what_was_found() {
        assert_eq!(LabelSelector::parse(",a").unwrap_err(), "found ',', expected: !, identifier, or 'end of string'");
        assert_eq!(LabelSelector::parse("a,").unwrap_err(), "found '', expected: identifier after ','");
        assert_eq!(LabelSelector::parse("a in x").unwrap_err(), "unable to parse requirement: found 'x' expected: '('");
        assert_eq!(
            LabelSelector::parse("a in (x").unwrap_err(),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
        assert_eq!(
            LabelSelector::parse("a b").unwrap_err(),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(
            LabelSelector::parse("a=(").unwrap_err(),
            "unable to parse requirement: found '(', expected: identifier"
        );
    }

    #[test]
    fn from_k8s_combines_match_labels_and_expressions() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1 as m;
        let sel = m::LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                m::LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["db".into()]),
                },
                m::LabelSelectorRequirement { key: "gone".into(), operator: "DoesNotExist".into(), values: None },
            ]),
        };
        let s = LabelSelector::from_k8s(&sel).unwrap();
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("gone", "1")])));
        assert!(LabelSelector::from_k8s(&m::LabelSelector::default()).unwrap().is_empty());
        let bad = m::LabelSelector {
            match_expressions: Some(vec![m::LabelSelectorRequirement {
                key: "a".into(),
                operator: "Maybe".into(),
                values: None,
            }]),
            ..Default::default()
        };
        assert_eq!(LabelSelector::from_k8s(&bad).unwrap_err(), "\"Maybe\" is not a valid label selector operator");
        let empty_in = m::LabelSelector {
            match_expressions: Some(vec![m::LabelSelectorRequirement {
                key: "a".into(),
                operator: "In".into(),
                values: None,
            }]),
            ..Default::default()
        };
        assert_eq!(
            LabelSelector::from_k8s(&empty_in).unwrap_err(),
            "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
        );
    }

    #[test]
    fn field_selector_parses_equality_and_inequality() {
        let s = FieldSelector::parse("spec.nodeName=n1,status.phase!=Running").unwrap();
        assert_eq!(s.fields(), vec!["spec.nodeName", "status.phase"]);
        let mut f = BTreeMap::new();
        f.insert("spec.nodeName".to_string(), "n1".to_string());
        f.insert("status.phase".to_string(), "Pending".to_string());
        assert!(s.matches(&f));
        f.insert("status.phase".to_string(), "Running".to_string());
        assert!(!s.matches(&f));
        assert_eq!(FieldSelector::parse("a==b").unwrap().requires_exact_match("a"), Some("b"));
    }

    #[test]
    fn field_selector_treats_missing_fields_as_empty() {
        let empty = BTreeMap::new();
        assert!(FieldSelector::parse("spec.nodeName!=n1").unwrap().matches(&empty));
        assert!(FieldSelector::parse("spec.nodeName=").unwrap().matches(&empty));
        assert!(!FieldSelector::parse("spec.nodeName=n1").unwrap().matches(&empty));
    }

    #[test]
    fn field_selector_unescapes_values() {
        let s = FieldSelector::parse(r"a=x\,y\=z\\,b=c").unwrap();
        let mut f = BTreeMap::new();
        f.insert("a".to_string(), r"x,y=z\".to_string());
        f.insert("b".to_string(), "c".to_string());
        assert!(s.matches(&f));
    }

    #[test]
    fn field_selector_errors_read_like_kubernetes() {
        assert_eq!(FieldSelector::parse("abc").unwrap_err(), "invalid selector: 'abc'; can't understand 'abc'");
        assert_eq!(FieldSelector::parse(r"a=\x").unwrap_err(), "invalid field selector: invalid escape sequence: \\x");
        assert_eq!(FieldSelector::parse(r"a=b\").unwrap_err(), "invalid field selector: invalid escape sequence: \\");
        assert_eq!(
            FieldSelector::parse("a=b=c").unwrap_err(),
            "invalid field selector: unescaped character in value: 61"
        );
        assert!(FieldSelector::parse("").unwrap().is_empty());
    }
}
