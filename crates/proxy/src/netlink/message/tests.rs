//! The bytes of known messages.

use super::*;
use crate::model::Protocol;
use crate::rules::MapName;

/// The messages between the batch's begin and end.
fn body(table: &str, commands: &[Command]) -> Vec<u8> {
    let mut batch = Batch::new(100);
    batch.extend(table, commands).unwrap();
    let (bytes, _) = batch.finish();
    bytes[20..bytes.len() - 20].to_vec()
}

/// `nlmsghdr` + `nfgenmsg` (family ip) of an acknowledged nf_tables message.
fn header(len: u32, msg: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&len.to_ne_bytes());
    h.extend_from_slice(&(0x0a00 | msg).to_ne_bytes());
    h.extend_from_slice(&(0x5 | flags).to_ne_bytes());
    h.extend_from_slice(&seq.to_ne_bytes());
    h.extend_from_slice(&[0, 0, 0, 0, 2, 0, 0, 0]);
    h
}

fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&ty.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize(a.len().next_multiple_of(4), 0);
    a
}

#[test]
fn a_batch_begins_and_ends_with_the_nftables_subsystem_and_numbers_its_messages() {
    let mut batch = Batch::new(41);
    batch.extend("t", &[Command::AddChain("c".into()), Command::DeleteChain("c".into())]).unwrap();
    let (bytes, owners) = batch.finish();
    assert_eq!(owners, [0, 1]);
    let begin = [
        &20u32.to_ne_bytes()[..],
        &0x10u16.to_ne_bytes(),
        &1u16.to_ne_bytes(),
        &41u32.to_ne_bytes(),
        &[0; 4],
        &[0, 0, 0, 10],
    ]
    .concat();
    assert_eq!(bytes[..20], begin[..]);
    assert_eq!(bytes[bytes.len() - 20..][4..6], 0x11u16.to_ne_bytes());
    assert_eq!(bytes[28..32], 42u32.to_ne_bytes(), "the first message is numbered after the begin");
}

#[test]
fn a_new_chain_is_its_table_and_name() {
    let expected = [header(36, NEWCHAIN, NLM_F_CREATE, 101), attr(1, b"t\0"), attr(3, b"c\0")].concat();
    assert_eq!(body("t", &[Command::AddChain("c".into())]), expected);
}

#[test]
fn a_flush_deletes_the_rules_naming_only_the_chain() {
    let expected = [header(36, DELRULE, 0, 101), attr(1, b"t\0"), attr(2, b"c\0")].concat();
    assert_eq!(body("t", &[Command::FlushChain("c".into())]), expected);
}

#[test]
fn a_map_entry_pads_each_key_field_to_four_bytes_and_goes_to_its_chain() {
    let key = MapKey::Address("10.96.0.1".parse().unwrap(), Protocol::Tcp, 80);
    assert_eq!(map_key(&key), [10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
    assert_eq!(map_key(&MapKey::Port(Protocol::Udp, 30080)), [17, 0, 0, 0, 0x75, 0x80, 0, 0]);

    let verdict = [attr(1, &(-4i32).to_be_bytes()), attr(2, b"x\0")].concat();
    let data = attr(2 | NLA_F_NESTED, &attr(2 | NLA_F_NESTED, &verdict));
    let elem = [attr(1 | NLA_F_NESTED, &attr(1, &map_key(&key))), data].concat();
    let list = attr(3 | NLA_F_NESTED, &attr(1 | NLA_F_NESTED, &elem));
    let attrs = [attr(1, b"t\0"), attr(2, b"service-ips\0"), list].concat();
    let expected = [header(20 + attrs.len() as u32, NEWSETELEM, NLM_F_CREATE, 101), attrs].concat();
    assert_eq!(body("t", &[Command::AddElement(MapName::ServiceIps, key, "x".into())]), expected);
}

#[test]
fn an_affinity_set_has_an_address_key_and_its_timeout_in_milliseconds() {
    let attrs = [
        attr(1, b"t\0"),
        attr(2, b"a\0"),
        attr(3, &0x30u32.to_be_bytes()),
        attr(4, &7u32.to_be_bytes()),
        attr(5, &4u32.to_be_bytes()),
        attr(10, &1u32.to_be_bytes()),
        attr(11, &60_000u64.to_be_bytes()),
        attr(13, &[0, 4, 2, 0, 0, 0]),
    ]
    .concat();
    let expected = [header(20 + attrs.len() as u32, NEWSET, NLM_F_CREATE, 101), attrs].concat();
    assert_eq!(body("t", &[Command::AddSet("a".into(), 60)]), expected);
}

#[test]
fn a_random_pick_creates_and_fills_an_anonymous_map_before_the_rule_that_looks_it_up() {
    let rule = crate::rules::service_rules(
        &[crate::model::example_port(
            "http",
            (0..300)
                .map(|i| crate::model::Endpoint {
                    ip: std::net::Ipv4Addr::from(0x0af4_0000 + i),
                    port: 80,
                    local: true,
                })
                .collect(),
        )],
        crate::rules::NodeNetwork::default(),
    )
    .chains["service-ns/web/tcp/http"]
        .last()
        .unwrap()
        .clone();
    let mut batch = Batch::new(0);
    batch.extend("t", &[Command::AddRule("service-ns/web/tcp/http".into(), rule)]).unwrap();
    let (bytes, owners) = batch.finish();
    assert_eq!(owners.len(), 1 + 3 + 1, "the set, 300 elements in three messages, the rule");
    let types: Vec<u16> = messages(&bytes).iter().map(|m| u16::from_ne_bytes([m[4], m[5]])).collect();
    let nft = |m: u16| 0x0a00 | m;
    assert_eq!(types, [0x10, nft(NEWSET), nft(NEWSETELEM), nft(NEWSETELEM), nft(NEWSETELEM), nft(NEWRULE), 0x11]);
}

fn messages(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_ne_bytes(bytes[..4].try_into().unwrap()) as usize;
        out.push(&bytes[..len]);
        bytes = &bytes[len..];
    }
    out
}
