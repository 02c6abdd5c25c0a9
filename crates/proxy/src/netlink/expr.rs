//! A rule's statements (the `nftables` crate's model, as [`crate::rules`] and [`crate::table`]
//! write them) as the kernel's expressions: the register loads, comparisons and verdicts that
//! `nft` compiles the same statements to. Pure; only the statements the proxy's Service chains
//! use are known, anything else is [`Unsupported`].

use std::net::Ipv4Addr;

use nftables::expr::{Expression, FibFlag, FibResult, MetaKey, NamedExpression, NgMode, Payload, SetItem, Verdict};
use nftables::stmt::{Operator, SetOp, Statement};

use crate::model::Protocol;

/// The first data register (`NFT_REG_1`); the DNAT port goes to the second.
pub const REG_1: u32 = 1;
pub const REG_2: u32 = 2;

/// `NFT_PAYLOAD_NETWORK_HEADER`.
pub const BASE_NETWORK: u32 = 1;
/// `NFT_META_L4PROTO`.
pub const META_L4PROTO: u32 = 16;
/// `RTN_LOCAL`, as `fib … type` reports it.
const RTN_LOCAL: u32 = 2;

/// What a rule jumps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Jump {
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

/// One kernel expression, registers as `nft` allocates them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// `len` bytes of the network header from `offset` into register 1.
    Payload { offset: u32, len: u32 },
    /// `meta l4proto` into register 1.
    MetaL4proto,
    /// `fib <flags> type` into register 1 (`flags`: `NFTA_FIB_F_*`).
    FibType { flags: u32 },
    /// Register 1 compared with `data` (`eq` or, with `negate`, `neq`).
    Cmp { negate: bool, data: Vec<u8> },
    /// Register 1 masked: `(reg & mask) ^ 0`.
    Mask(Vec<u8>),
    /// A verdict (the immediate into the verdict register).
    Verdict(Jump),
    /// A constant into a data register.
    Immediate { reg: u32, data: Vec<u8> },
    /// `numgen random mod modulus` into register 1.
    NumgenRandom { modulus: u32 },
    /// Register 1 looked up in the rule's `index`th anonymous verdict map; the verdict is its value.
    Vmap { index: usize },
    /// Register 1 looked up in a named set: the rule goes on only when it is there.
    Lookup { set: String },
    /// Register 1 added to (or refreshed in) a named set.
    Update { set: String },
    /// DNAT (family ip) to the address in register 1 and the port in register 2.
    Dnat,
}

/// A rule as expressions, and the anonymous verdict maps it looks up: map `i` sends key `k`
/// (a host-order u32) to `maps[i][k]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    pub exprs: Vec<Expr>,
    pub maps: Vec<Vec<Jump>>,
}

/// A statement the kernel encoder does not know; the rule then goes through `nft`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no netlink encoding for {0}")]
pub struct Unsupported(pub String);

fn unsupported(what: &impl std::fmt::Debug) -> Unsupported {
    Unsupported(format!("{what:?}"))
}

/// The expressions of one rule.
pub fn encode(rule: &[Statement<'_>]) -> Result<Encoded, Unsupported> {
    let mut out = Encoded::default();
    for stmt in rule {
        statement(&mut out, stmt)?;
    }
    Ok(out)
}

fn statement(out: &mut Encoded, stmt: &Statement<'_>) -> Result<(), Unsupported> {
    match stmt {
        Statement::Jump(t) => out.exprs.push(Expr::Verdict(Jump::Jump(t.target.to_string()))),
        Statement::Goto(t) => out.exprs.push(Expr::Verdict(Jump::Goto(t.target.to_string()))),
        Statement::Drop(_) => out.exprs.push(Expr::Verdict(Jump::Drop)),
        Statement::Return(_) => out.exprs.push(Expr::Verdict(Jump::Return)),
        Statement::Match(m) => matches(out, &m.left, &m.right, &m.op)?,
        Statement::VerdictMap(vmap) => {
            let Expression::Named(NamedExpression::Numgen(ng)) = &vmap.key else { return Err(unsupported(vmap)) };
            let Expression::Named(NamedExpression::Set(items)) = &vmap.data else { return Err(unsupported(vmap)) };
            if ng.mode != NgMode::Random || ng.offset.is_some_and(|o| o != 0) {
                return Err(unsupported(ng));
            }
            let mut targets = vec![None; items.len()];
            for item in items {
                let SetItem::Mapping(Expression::Number(k), Expression::Verdict(v)) = item else {
                    return Err(unsupported(item));
                };
                let slot = targets.get_mut(*k as usize).ok_or_else(|| unsupported(item))?;
                *slot = Some(verdict(v).ok_or_else(|| unsupported(v))?);
            }
            let targets: Option<Vec<Jump>> = targets.into_iter().collect();
            let targets = targets.ok_or_else(|| unsupported(vmap))?;
            out.exprs.push(Expr::NumgenRandom { modulus: ng.ng_mod });
            out.exprs.push(Expr::Vmap { index: out.maps.len() });
            out.maps.push(targets);
        }
        Statement::Set(set) if set.op == SetOp::Update => {
            let name = set.set.strip_prefix('@').ok_or_else(|| unsupported(set))?;
            load(out, &set.elem)?;
            out.exprs.push(Expr::Update { set: name.to_string() });
        }
        Statement::DNAT(Some(nat)) if nat.family.is_none() && nat.flags.is_none() => {
            let (Some(Expression::String(addr)), Some(Expression::Number(port))) = (&nat.addr, &nat.port) else {
                return Err(unsupported(nat));
            };
            let addr: Ipv4Addr = addr.parse().map_err(|_| unsupported(addr))?;
            let port = u16::try_from(*port).map_err(|_| unsupported(port))?;
            out.exprs.push(Expr::Immediate { reg: REG_1, data: addr.octets().to_vec() });
            out.exprs.push(Expr::Immediate { reg: REG_2, data: port.to_be_bytes().to_vec() });
            out.exprs.push(Expr::Dnat);
        }
        other => return Err(unsupported(other)),
    }
    Ok(())
}

fn verdict(v: &Verdict<'_>) -> Option<Jump> {
    match v {
        Verdict::Drop => Some(Jump::Drop),
        Verdict::Return => Some(Jump::Return),
        Verdict::Jump(t) => Some(Jump::Jump(t.target.to_string())),
        Verdict::Goto(t) => Some(Jump::Goto(t.target.to_string())),
        _ => None,
    }
}

/// What a left-hand side loads into register 1.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loaded {
    Address,
    L4proto,
    FibType,
}

/// `ip saddr`/`ip daddr` (the header offset of the field), else `None`.
fn address_field(left: &Expression<'_>) -> Option<u32> {
    let Expression::Named(NamedExpression::Payload(Payload::PayloadField(field))) = left else { return None };
    match (field.protocol.as_ref(), field.field.as_ref()) {
        ("ip", "saddr") => Some(12),
        ("ip", "daddr") => Some(16),
        _ => None,
    }
}

fn load(out: &mut Encoded, left: &Expression<'_>) -> Result<Loaded, Unsupported> {
    if let Some(offset) = address_field(left) {
        out.exprs.push(Expr::Payload { offset, len: 4 });
        return Ok(Loaded::Address);
    }
    match left {
        Expression::Named(NamedExpression::Meta(meta)) if meta.key == MetaKey::L4proto => {
            out.exprs.push(Expr::MetaL4proto);
            Ok(Loaded::L4proto)
        }
        Expression::Named(NamedExpression::Fib(fib)) if fib.result == FibResult::Type && fib.flags.len() == 1 => {
            let flags = match fib.flags.iter().next() {
                Some(FibFlag::Saddr) => 1,
                Some(FibFlag::Daddr) => 2,
                _ => return Err(unsupported(fib)),
            };
            out.exprs.push(Expr::FibType { flags });
            Ok(Loaded::FibType)
        }
        other => Err(unsupported(other)),
    }
}

fn matches(out: &mut Encoded, left: &Expression<'_>, right: &Expression<'_>, op: &Operator) -> Result<(), Unsupported> {
    let negate = match op {
        Operator::EQ => false,
        Operator::NEQ => true,
        other => return Err(unsupported(other)),
    };
    // A byte-aligned prefix loads only its bytes, as nft does; others are masked.
    if let (Some(offset), Expression::Named(NamedExpression::Prefix(prefix))) = (address_field(left), right) {
        let Expression::String(addr) = prefix.addr.as_ref() else { return Err(unsupported(prefix)) };
        let addr: Ipv4Addr = addr.parse().map_err(|_| unsupported(addr))?;
        let len = prefix.len;
        if len == 0 || len > 32 {
            return Err(unsupported(prefix));
        }
        let mask = (u32::MAX << (32 - len)).to_be_bytes();
        let masked: Vec<u8> = addr.octets().iter().zip(mask).map(|(a, m)| a & m).collect();
        if len % 8 == 0 {
            let bytes = len / 8;
            out.exprs.push(Expr::Payload { offset, len: bytes });
            out.exprs.push(Expr::Cmp { negate, data: masked[..bytes as usize].to_vec() });
        } else {
            out.exprs.push(Expr::Payload { offset, len: 4 });
            out.exprs.push(Expr::Mask(mask.to_vec()));
            out.exprs.push(Expr::Cmp { negate, data: masked });
        }
        return Ok(());
    }
    let loaded = load(out, left)?;
    let Expression::String(text) = right else { return Err(unsupported(right)) };
    if let Some(set) = text.strip_prefix('@') {
        if loaded != Loaded::Address || negate {
            return Err(unsupported(right));
        }
        out.exprs.push(Expr::Lookup { set: set.to_string() });
        return Ok(());
    }
    let data = match loaded {
        Loaded::Address => text.parse::<Ipv4Addr>().map_err(|_| unsupported(text))?.octets().to_vec(),
        Loaded::L4proto => {
            let known = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp].into_iter().find(|p| p.as_str() == text);
            vec![known.ok_or_else(|| unsupported(text))?.number()]
        }
        Loaded::FibType if text == "local" => RTN_LOCAL.to_ne_bytes().to_vec(),
        Loaded::FibType => return Err(unsupported(text)),
    };
    out.exprs.push(Expr::Cmp { negate, data });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{daddr_in, goto, jump, saddr_in};

    #[test]
    fn a_byte_aligned_prefix_loads_only_its_bytes_and_another_is_masked() {
        let aligned = encode(&[saddr_in(([10, 244, 0, 0].into(), 24), Operator::NEQ), jump("m")]).unwrap();
        assert_eq!(
            aligned.exprs,
            [
                Expr::Payload { offset: 12, len: 3 },
                Expr::Cmp { negate: true, data: vec![10, 244, 0] },
                Expr::Verdict(Jump::Jump("m".into())),
            ]
        );
        let masked = encode(&[daddr_in(([10, 244, 7, 9].into(), 20), Operator::EQ), goto("s")]).unwrap();
        assert_eq!(
            masked.exprs,
            [
                Expr::Payload { offset: 16, len: 4 },
                Expr::Mask(vec![255, 255, 240, 0]),
                Expr::Cmp { negate: false, data: vec![10, 244, 0, 0] },
                Expr::Verdict(Jump::Goto("s".into())),
            ]
        );
    }

    #[test]
    fn every_rule_a_service_can_have_is_encodable() {
        use crate::model::{Endpoint, Protocol, ServiceKey, ServicePort};
        use crate::rules::{NodeNetwork, service_rules};
        let endpoint = |last: u8, local| Endpoint { ip: Ipv4Addr::new(10, 244, 0, last), port: 8080, local };
        let mut kinds = std::collections::BTreeSet::new();
        let mut rules = 0;
        for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            for endpoints in [vec![], vec![endpoint(2, true)], vec![endpoint(2, false), endpoint(3, true)]] {
                for (affinity, external_local, internal_local, exposed) in
                    (0..16).map(|b| (b & 1 != 0, b & 2 != 0, b & 4 != 0, b & 8 != 0))
                {
                    let port = ServicePort {
                        service: ServiceKey::new("ns", "web"),
                        name: "http".into(),
                        protocol,
                        port: 80,
                        cluster_ips: vec![Ipv4Addr::new(10, 96, 0, 5)],
                        external_ips: if exposed { vec![Ipv4Addr::new(192, 0, 2, 1)] } else { vec![] },
                        node_port: exposed.then_some(30080),
                        affinity_timeout: affinity.then_some(60),
                        external_local,
                        internal_local,
                        endpoints: endpoints.clone(),
                    };
                    for pod_cidr in [None, Some((Ipv4Addr::new(10, 244, 0, 0), 20))] {
                        let net = NodeNetwork { pod_cidr, cluster_cidr: None };
                        for rule in service_rules(std::slice::from_ref(&port), net).chains.values().flatten() {
                            let encoded = encode(rule).unwrap_or_else(|e| panic!("{e}"));
                            kinds.extend(
                                encoded
                                    .exprs
                                    .iter()
                                    .map(|e| format!("{e:?}").split([' ', '(']).next().unwrap().to_string()),
                            );
                            rules += 1;
                        }
                    }
                }
            }
        }
        assert!(rules > 1000, "{rules}");
        let expected = [
            "Cmp",
            "Dnat",
            "FibType",
            "Immediate",
            "Lookup",
            "Mask",
            "MetaL4proto",
            "NumgenRandom",
            "Payload",
            "Update",
            "Verdict",
            "Vmap",
        ];
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), expected, "every expression kind was exercised");
    }

    #[test]
    fn statements_outside_the_service_chains_vocabulary_are_refused_by_name() {
        let err = encode(&[Statement::Masquerade(None)]).unwrap_err();
        assert!(err.0.contains("Masquerade"), "{err}");
    }
}
