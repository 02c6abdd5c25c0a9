//! Node selector terms (required and preferred node affinity): parsed once per pod, matched
//! against node labels and `metadata.name` as Kubernetes' `nodeaffinity` helpers do.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

#[derive(Clone, Debug, PartialEq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
    /// An operator or value Kubernetes would not accept: matches nothing.
    Invalid,
}

#[derive(Clone, Debug, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

impl Requirement {
    fn parse(r: &core::NodeSelectorRequirement) -> Requirement {
        let values = r.values.clone().unwrap_or_default();
        let number = || values.first().filter(|_| values.len() == 1).and_then(|v| v.parse::<i64>().ok());
        let op = match r.operator.as_str() {
            "In" => Op::In(values.clone()),
            "NotIn" => Op::NotIn(values.clone()),
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            "Gt" => number().map_or(Op::Invalid, Op::Gt),
            "Lt" => number().map_or(Op::Invalid, Op::Lt),
            _ => Op::Invalid,
        };
        Requirement { key: r.key.clone(), op }
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match (&self.op, value) {
            (Op::In(vs), Some(v)) => vs.iter().any(|x| x == v),
            (Op::In(_), None) => false,
            (Op::NotIn(vs), Some(v)) => !vs.iter().any(|x| x == v),
            (Op::NotIn(_), None) => true,
            (Op::Exists, v) => v.is_some(),
            (Op::DoesNotExist, v) => v.is_none(),
            (Op::Gt(n), Some(v)) => v.parse::<i64>().is_ok_and(|v| v > *n),
            (Op::Lt(n), Some(v)) => v.parse::<i64>().is_ok_and(|v| v < *n),
            _ => false,
        }
    }
}

/// One `NodeSelectorTerm`: all its label expressions and field expressions must hold.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSelectorTerm {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

impl NodeSelectorTerm {
    pub fn parse(t: &core::NodeSelectorTerm) -> NodeSelectorTerm {
        let labels = t.match_expressions.iter().flatten().map(Requirement::parse).collect();
        let fields = t
            .match_fields
            .iter()
            .flatten()
            .map(|r| {
                let mut req = Requirement::parse(r);
                // Only metadata.name is a node field, and only In/NotIn apply to it.
                if req.key != "metadata.name" || !matches!(req.op, Op::In(_) | Op::NotIn(_)) {
                    req.op = Op::Invalid;
                }
                req
            })
            .collect();
        NodeSelectorTerm { labels, fields }
    }

    /// An empty term matches no node (Kubernetes: "a null or empty term matches no objects").
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        if self.labels.is_empty() && self.fields.is_empty() {
            return false;
        }
        self.labels.iter().all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
            && self.fields.iter().all(|r| r.matches(Some(node_name)))
    }

    /// The node names a term allows when it pins `metadata.name` with `In`: lets the
    /// scheduler look at those nodes only.
    pub fn required_names(&self) -> Option<&[String]> {
        self.fields.iter().find_map(|r| match &r.op {
            Op::In(v) => Some(v.as_slice()),
            _ => None,
        })
    }
}

/// A required `NodeSelector`: its terms are ORed; no terms match no node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSelector {
    pub terms: Vec<NodeSelectorTerm>,
}

impl NodeSelector {
    pub fn parse(s: &core::NodeSelector) -> NodeSelector {
        NodeSelector { terms: s.node_selector_terms.iter().map(NodeSelectorTerm::parse).collect() }
    }

    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().any(|t| t.matches(node_name, labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(json: serde_json::Value) -> NodeSelectorTerm {
        NodeSelectorTerm::parse(&serde_json::from_value(json).unwrap())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator_matches_as_kubernetes_defines_it() {
        let l = labels(&[("zone", "a"), ("cores", "8")]);
        let t = |op: &str, vals: &[&str]| {
            term(serde_json::json!({"matchExpressions": [{"key": if op.starts_with('G') || op.starts_with('L') {"cores"} else {"zone"}, "operator": op, "values": vals}]}))
                .matches("n", &l)
        };
        assert!(t("In", &["a", "b"]));
        assert!(!t("In", &["b"]));
        assert!(t("NotIn", &["b"]));
        assert!(!t("NotIn", &["a"]));
        assert!(t("Exists", &[]));
        assert!(!t("DoesNotExist", &[]));
        assert!(t("Gt", &["4"]));
        assert!(!t("Gt", &["8"]));
        assert!(t("Lt", &["9"]));
        assert!(!t("Lt", &["x"]));
        assert!(!t("Bogus", &[]));
    }

    #[test]
    fn missing_labels_satisfy_only_not_in_and_does_not_exist() {
        let l = labels(&[]);
        let t = |op: &str| {
            term(serde_json::json!({"matchExpressions": [{"key": "k", "operator": op, "values": ["1"]}]}))
                .matches("n", &l)
        };
        assert!(t("NotIn"));
        assert!(t("DoesNotExist"));
        assert!(!t("In") && !t("Exists") && !t("Gt") && !t("Lt"));
    }

    #[test]
    fn match_fields_pin_the_node_name() {
        let t =
            term(serde_json::json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}));
        assert!(t.matches("n1", &labels(&[])));
        assert!(!t.matches("n2", &labels(&[])));
        assert_eq!(t.required_names(), Some(&["n1".to_string()][..]));
        let other = term(serde_json::json!({"matchFields": [{"key": "spec.x", "operator": "In", "values": ["n1"]}]}));
        assert!(!other.matches("n1", &labels(&[])));
    }

    #[test]
    fn empty_terms_match_nothing_and_terms_are_ored() {
        assert!(!term(serde_json::json!({})).matches("n", &labels(&[("a", "b")])));
        let sel = NodeSelector {
            terms: vec![
                term(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]})),
                term(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]})),
            ],
        };
        assert!(sel.matches("n", &labels(&[("a", "b")])));
        assert!(!NodeSelector::default().matches("n", &labels(&[("a", "b")])));
    }
}
