//! The proxy's nftables table: its fixed part (base chains, verdict maps, masquerading,
//! rejecting) and the commands that add, change and remove Service rules in it, as `nft -j`
//! JSON commands.
//!
//! Packets meet the table at:
//! - nat prerouting and output → `services`: `ip daddr . meta l4proto . th dport` in
//!   `service-ips`, then, for the node's own addresses, `meta l4proto . th dport` in
//!   `service-nodeports`; a hit DNATs through the Service's chains.
//! - filter input, forward and output, for new connections → `endpoints-check`: the same keys in
//!   the `no-endpoint-*` maps reject a connection to a port without endpoints.
//! - nat postrouting → `masquerading`: packets marked by `mark-for-masquerade` leave with the
//!   node's address.

use std::net::Ipv4Addr;

use nftables::expr::{BinaryOperation, CT, Expression, FibFlag, MetaKey, NamedExpression, Prefix};
use nftables::schema::{
    Chain, Element, NfCmd, NfListObject, Rule as NfRule, Set, SetFlag, SetType, SetTypeValue, Table as NfTable,
};
use nftables::stmt::{Match, Operator, Statement, VerdictMap};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use serde_json::{Value, json};

use crate::rules::{
    self, MARK_FOR_MASQUERADE, MapKey, MapName, NodeNetwork, REJECT, Rule, daddr_in, fib_type_local, goto, jump, meta,
    payload, saddr_in,
};

/// The packet mark bit that asks for masquerading (kube-proxy's).
pub const MASQUERADE_MARK: u32 = 0x4000;

const SERVICES: &str = "services";
const ENDPOINTS_CHECK: &str = "endpoints-check";
const MASQUERADING: &str = "masquerading";
/// Masquerades pod traffic that leaves the cluster; rewritten when the node's ranges change.
const POD_EGRESS: &str = "pod-egress";

/// An `ip` family table of the proxy's, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub name: String,
}

impl Table {
    pub fn new(name: impl Into<String>) -> Table {
        Table { name: name.into() }
    }

    /// Commands that remove the table if it exists (`add` first, so deleting never fails).
    pub fn remove(&self) -> Vec<Value> {
        vec![self.table_cmd("add"), self.table_cmd("delete")]
    }

    /// Commands that replace whatever the table holds with its fixed part, empty maps included.
    pub fn recreate(&self) -> Vec<Value> {
        let mut cmds = self.remove();
        cmds.push(self.table_cmd("add"));
        let base = [
            ("nat-prerouting", NfChainType::NAT, NfHook::Prerouting, -100, SERVICES),
            ("nat-output", NfChainType::NAT, NfHook::Output, -100, SERVICES),
            ("nat-postrouting", NfChainType::NAT, NfHook::Postrouting, 100, MASQUERADING),
            ("filter-input", NfChainType::Filter, NfHook::Input, -10, ENDPOINTS_CHECK),
            ("filter-forward", NfChainType::Filter, NfHook::Forward, -10, ENDPOINTS_CHECK),
            ("filter-output", NfChainType::Filter, NfHook::Output, -10, ENDPOINTS_CHECK),
        ];
        for name in [SERVICES, ENDPOINTS_CHECK, MASQUERADING, MARK_FOR_MASQUERADE, REJECT, POD_EGRESS] {
            cmds.push(self.add_chain(name));
        }
        for map in MapName::ALL {
            let key = if map.keyed_by_address() {
                json!(["ipv4_addr", "inet_proto", "inet_service"])
            } else {
                json!(["inet_proto", "inet_service"])
            };
            // The JSON schema crate has no `verdict` data type, so the maps are written directly.
            cmds.push(json!({"add": {"map": {
                "family": "ip", "table": self.name, "name": map.as_str(), "type": key, "map": "verdict",
            }}}));
        }
        for (name, type_, hook, prio, target) in base {
            cmds.push(cmd(
                "add",
                NfListObject::Chain(Chain {
                    family: NfFamily::IP,
                    table: self.name.clone().into(),
                    name: name.into(),
                    _type: Some(type_),
                    hook: Some(hook),
                    prio: Some(prio),
                    policy: Some(NfChainPolicy::Accept),
                    ..Chain::default()
                }),
            ));
            let new_only = Statement::Match(Match {
                left: Expression::Named(NamedExpression::CT(CT { key: "state".into(), family: None, dir: None })),
                right: Expression::String("new".into()),
                op: Operator::IN,
            });
            let rule = if type_ == NfChainType::Filter { vec![new_only, jump(target)] } else { vec![jump(target)] };
            cmds.push(self.add_rule(name, &rule));
            if hook == NfHook::Postrouting {
                cmds.push(self.add_rule(name, &vec![jump(POD_EGRESS)]));
            }
        }
        let not_loopback = Statement::Match(Match {
            left: payload("ip", "daddr"),
            right: Expression::Named(NamedExpression::Prefix(Prefix {
                addr: Box::new(Expression::String(Ipv4Addr::new(127, 0, 0, 0).to_string().into())),
                len: 8,
            })),
            op: Operator::NEQ,
        });
        let by_address = || {
            Expression::Named(NamedExpression::Concat(vec![
                payload("ip", "daddr"),
                meta(MetaKey::L4proto),
                payload("th", "dport"),
            ]))
        };
        let by_port =
            || Expression::Named(NamedExpression::Concat(vec![meta(MetaKey::L4proto), payload("th", "dport")]));
        let vmap = |key: Expression<'static>, map: MapName| {
            Statement::VerdictMap(VerdictMap { key, data: Expression::String(format!("@{}", map.as_str()).into()) })
        };
        for (chain, ips, ports) in [
            (SERVICES, MapName::ServiceIps, MapName::ServiceNodePorts),
            (ENDPOINTS_CHECK, MapName::NoEndpointServices, MapName::NoEndpointNodePorts),
        ] {
            cmds.push(self.add_rule(chain, &vec![vmap(by_address(), ips)]));
            cmds.push(
                self.add_rule(
                    chain,
                    &vec![fib_type_local(FibFlag::Daddr), not_loopback.clone(), vmap(by_port(), ports)],
                ),
            );
        }
        let mark_bit = |op| {
            Statement::Match(Match {
                left: Expression::BinaryOperation(Box::new(BinaryOperation::AND(
                    meta(MetaKey::Mark),
                    Expression::Number(MASQUERADE_MARK),
                ))),
                right: Expression::Number(0),
                op,
            })
        };
        cmds.push(self.add_rule(
            MARK_FOR_MASQUERADE,
            &vec![rules::set_mark(|a, b| BinaryOperation::OR(vec![a, b]), MASQUERADE_MARK)],
        ));
        cmds.push(self.add_rule(MASQUERADING, &vec![mark_bit(Operator::EQ), Statement::Return(None)]));
        cmds.push(self.add_rule(MASQUERADING, &vec![rules::set_mark(BinaryOperation::XOR, MASQUERADE_MARK)]));
        cmds.push(self.add_rule(
            MASQUERADING,
            &vec![Statement::Masquerade(Some(nftables::stmt::NAT {
                addr: None,
                family: None,
                port: None,
                flags: Some([nftables::stmt::NATFlag::FullyRandom].into()),
            }))],
        ));
        cmds.push(self.add_rule(REJECT, &vec![Statement::Reject(None)]));
        cmds
    }

    /// Commands that make the pod-egress chain masquerade what this node's pods send outside the
    /// cluster (outside their own range when the cluster's is unknown); nothing while the node's
    /// range is unknown (the pod network's own masquerading, if any, applies then).
    pub fn pod_egress(&self, net: NodeNetwork) -> Vec<Value> {
        let mut cmds = vec![self.flush_chain(POD_EGRESS)];
        if let Some(pods) = net.pod_cidr {
            let cluster = net.cluster_cidr.unwrap_or(pods);
            let masquerade = Statement::Masquerade(None);
            cmds.push(self.add_rule(
                POD_EGRESS,
                &vec![saddr_in(pods, Operator::EQ), daddr_in(cluster, Operator::NEQ), masquerade],
            ));
        }
        cmds
    }

    fn table_cmd(&self, verb: &str) -> Value {
        cmd(verb, NfListObject::Table(NfTable { family: NfFamily::IP, name: self.name.clone().into(), handle: None }))
    }

    fn chain(&self, name: &str) -> NfListObject<'static> {
        NfListObject::Chain(Chain {
            family: NfFamily::IP,
            table: self.name.clone().into(),
            name: name.to_string().into(),
            ..Chain::default()
        })
    }

    pub fn add_chain(&self, name: &str) -> Value {
        cmd("add", self.chain(name))
    }

    pub fn flush_chain(&self, name: &str) -> Value {
        json!({"flush": serde_json::to_value(self.chain(name)).expect("chains serialize")})
    }

    pub fn delete_chain(&self, name: &str) -> Value {
        cmd("delete", self.chain(name))
    }

    pub fn add_rule(&self, chain: &str, rule: &Rule) -> Value {
        cmd(
            "add",
            NfListObject::Rule(NfRule {
                family: NfFamily::IP,
                table: self.name.clone().into(),
                chain: chain.to_string().into(),
                expr: rule.clone().into(),
                ..NfRule::default()
            }),
        )
    }

    fn set(&self, name: &str, timeout: Option<u32>) -> NfListObject<'static> {
        NfListObject::Set(Box::new(Set {
            family: NfFamily::IP,
            table: self.name.clone().into(),
            name: name.to_string().into(),
            set_type: SetTypeValue::Single(SetType::Ipv4Addr),
            flags: timeout.map(|_| [SetFlag::Timeout].into()),
            timeout,
            ..Set::default()
        }))
    }

    /// An affinity set: client addresses that expire `timeout` seconds after their last packet.
    pub fn add_affinity_set(&self, name: &str, timeout: u32) -> Value {
        cmd("add", self.set(name, Some(timeout)))
    }

    pub fn delete_set(&self, name: &str) -> Value {
        cmd("delete", self.set(name, None))
    }

    fn element(&self, map: MapName, key: &MapKey, target: Option<&str>) -> NfListObject<'static> {
        let item = match target {
            Some(chain) => Expression::List(vec![key.expression(), verdict_goto(chain)]),
            None => key.expression(),
        };
        NfListObject::Element(Element {
            family: NfFamily::IP,
            table: self.name.clone().into(),
            name: map.as_str().into(),
            elem: vec![item].into(),
        })
    }

    pub fn add_element(&self, map: MapName, key: &MapKey, target: &str) -> Value {
        cmd("add", self.element(map, key, Some(target)))
    }

    pub fn delete_element(&self, map: MapName, key: &MapKey) -> Value {
        cmd("delete", self.element(map, key, None))
    }
}

fn verdict_goto(chain: &str) -> Expression<'static> {
    match goto(chain) {
        Statement::Goto(target) => Expression::Verdict(nftables::expr::Verdict::Goto(target)),
        _ => unreachable!("goto builds a goto"),
    }
}

fn cmd(verb: &str, object: NfListObject<'static>) -> Value {
    let command = match verb {
        "add" => NfCmd::Add(object),
        "delete" => NfCmd::Delete(object),
        other => unreachable!("unknown nft verb {other}"),
    };
    serde_json::to_value(command).expect("nft commands serialize")
}

/// An `nft -j` document of `commands`.
pub fn document(commands: Vec<Value>) -> Value {
    json!({ "nftables": commands })
}
