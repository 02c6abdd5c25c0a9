//! The bytes of an nfnetlink batch: netlink headers, the nfgenmsg header, and nftables
//! attributes (type-length-value, 4-byte aligned, nested ones flagged), as the uapi headers
//! `linux/netlink.h`, `linux/netfilter/nfnetlink.h` and `linux/netfilter/nf_tables.h` lay them
//! out. Pure: [`super`] sends what this builds.

use super::expr::{self, Encoded, Expr, Jump};
use crate::command::Command;
use crate::rules::MapKey;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
/// `NLMSG_MIN_TYPE` and the one after: `NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`.
const BATCH_BEGIN: u16 = 0x10;
const BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFPROTO_IPV4: u8 = 2;

// enum nf_tables_msg_types
const NEWCHAIN: u16 = 3;
const DELCHAIN: u16 = 5;
const NEWRULE: u16 = 6;
const DELRULE: u16 = 8;
const NEWSET: u16 = 9;
const DELSET: u16 = 11;
const NEWSETELEM: u16 = 12;
const DELSETELEM: u16 = 14;

// Attribute numbers shared by several objects: the table is 1 in chains, rules, sets and
// element lists; a chain's and a set's name are 3 and 2; a rule's chain is 2.
const TABLE: u16 = 1;
const CHAIN_NAME: u16 = 3;
const RULE_CHAIN: u16 = 2;
const RULE_EXPRESSIONS: u16 = 4;
const LIST_ELEM: u16 = 1;
const EXPR_NAME: u16 = 1;
const EXPR_DATA: u16 = 2;
const DATA_VALUE: u16 = 1;
const DATA_VERDICT: u16 = 2;
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;
const SET_NAME: u16 = 2;
const SET_FLAGS: u16 = 3;
const SET_KEY_TYPE: u16 = 4;
const SET_KEY_LEN: u16 = 5;
const SET_DATA_TYPE: u16 = 6;
const SET_DATA_LEN: u16 = 7;
const SET_DESC: u16 = 9;
const SET_DESC_SIZE: u16 = 1;
const SET_ID: u16 = 10;
const SET_TIMEOUT: u16 = 11;
const SET_USERDATA: u16 = 13;
const ELEM_LIST_SET: u16 = 2;
const ELEM_LIST_ELEMENTS: u16 = 3;
const ELEM_LIST_SET_ID: u16 = 4;
const ELEM_KEY: u16 = 1;
const ELEM_DATA: u16 = 2;

const SET_ANONYMOUS: u32 = 0x1;
const SET_CONSTANT: u32 = 0x2;
const SET_MAP: u32 = 0x8;
const SET_TIMEOUT_FLAG: u32 = 0x10;
/// `NFT_SET_EVAL` ("dynamic"): the packet path adds to the set, as nft marks a set that an
/// `update` statement writes to.
const SET_EVAL: u32 = 0x20;
/// nft's type numbers for a set's key (stored by the kernel, read back by `nft list`).
const TYPE_INTEGER: u32 = 4;
const TYPE_IPADDR: u32 = 7;
/// `NFT_DATA_VERDICT`: a map whose values are verdicts.
const DATA_TYPE_VERDICT: u32 = 0xffff_ff00;
/// nft's set user data: key byte order (tag 0, 4 bytes) big-endian (2) or host (1); it tells
/// `nft list` how to print the keys.
const KEY_BIG_ENDIAN: [u8; 6] = [0, 4, 2, 0, 0, 0];
const KEY_HOST_ORDER: [u8; 6] = [0, 4, 1, 0, 0, 0];
/// Elements of an anonymous map per message: each takes at most ~300 bytes (a chain name is at
/// most 255), so a message stays within a nested attribute's 64 KiB.
const ELEMENTS_PER_MESSAGE: usize = 128;
/// Anonymous sets are named by the kernel from this pattern.
const ANONYMOUS_MAP: &str = "__map%d";

/// A batch being written: the messages, and for each one the index of the command it belongs to.
pub struct Batch {
    buf: Vec<u8>,
    first_seq: u32,
    seq: u32,
    owners: Vec<usize>,
    next_set_id: u32,
}

impl Batch {
    /// A batch whose messages are numbered from `first_seq` (the batch's begin message takes it).
    pub fn new(first_seq: u32) -> Batch {
        let mut batch =
            Batch { buf: Vec::with_capacity(4096), first_seq, seq: first_seq, owners: Vec::new(), next_set_id: 1 };
        let start = batch.header(BATCH_BEGIN, NLM_F_REQUEST, 0);
        batch.end_message(start);
        batch
    }

    /// Appends the messages of `commands` on `table` (family ip); nothing is appended when one
    /// of them has no encoding.
    pub fn extend(&mut self, table: &str, commands: &[Command]) -> Result<(), expr::Unsupported> {
        let rules: Vec<Option<Encoded>> = commands
            .iter()
            .map(|c| match c {
                Command::AddRule(_, rule) => expr::encode(rule).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        for (index, (command, encoded)) in commands.iter().zip(rules).enumerate() {
            self.command(table, index, command, encoded.as_ref());
        }
        Ok(())
    }

    /// The batch with its end message, and the command index of each acknowledged message in
    /// sequence order from `first_seq + 1`.
    pub fn finish(mut self) -> (Vec<u8>, Vec<usize>) {
        let start = self.header(BATCH_END, NLM_F_REQUEST, 0);
        self.end_message(start);
        (self.buf, self.owners)
    }

    pub fn first_seq(&self) -> u32 {
        self.first_seq
    }

    fn command(&mut self, table: &str, index: usize, command: &Command, rule: Option<&Encoded>) {
        match (command, rule) {
            (Command::AddChain(name), _) => self.object(index, NEWCHAIN, NLM_F_CREATE, table, CHAIN_NAME, name),
            (Command::DeleteChain(name), _) => self.object(index, DELCHAIN, 0, table, CHAIN_NAME, name),
            (Command::FlushChain(name), _) => self.object(index, DELRULE, 0, table, RULE_CHAIN, name),
            (Command::DeleteSet(name), _) => self.object(index, DELSET, 0, table, SET_NAME, name),
            (Command::AddSet(name, timeout), _) => {
                let start = self.message(index, NEWSET, NLM_F_CREATE);
                self.str(TABLE, table);
                self.str(SET_NAME, name);
                self.u32(SET_FLAGS, SET_TIMEOUT_FLAG | SET_EVAL);
                self.u32(SET_KEY_TYPE, TYPE_IPADDR);
                self.u32(SET_KEY_LEN, 4);
                let id = self.set_id();
                self.u32(SET_ID, id);
                self.attr(SET_TIMEOUT, &(u64::from(*timeout) * 1000).to_be_bytes());
                self.attr(SET_USERDATA, &KEY_BIG_ENDIAN);
                self.end_message(start);
            }
            (Command::AddElement(map, key, chain), _) => {
                let start = self.message(index, NEWSETELEM, NLM_F_CREATE);
                self.str(TABLE, table);
                self.str(ELEM_LIST_SET, map.as_str());
                let elements = self.nest(ELEM_LIST_ELEMENTS);
                self.element(&map_key(key), Some(&Jump::Goto(chain.clone())));
                self.end(elements);
                self.end_message(start);
            }
            (Command::DeleteElement(map, key), _) => {
                let start = self.message(index, DELSETELEM, 0);
                self.str(TABLE, table);
                self.str(ELEM_LIST_SET, map.as_str());
                let elements = self.nest(ELEM_LIST_ELEMENTS);
                self.element(&map_key(key), None);
                self.end(elements);
                self.end_message(start);
            }
            (Command::AddRule(chain, _), Some(rule)) => self.rule(index, table, chain, rule),
            (Command::AddRule(..), None) => unreachable!("rules are encoded before any message is written"),
        }
    }

    /// A message naming one object of `table`: a chain, a set, or (for a flush) a chain's rules.
    fn object(&mut self, index: usize, msg: u16, flags: u16, table: &str, name_attr: u16, name: &str) {
        let start = self.message(index, msg, flags);
        self.str(TABLE, table);
        self.str(name_attr, name);
        self.end_message(start);
    }

    fn rule(&mut self, index: usize, table: &str, chain: &str, rule: &Encoded) {
        // Each anonymous map first: created, filled, then looked up by its id in this batch.
        let mut ids = Vec::with_capacity(rule.maps.len());
        for targets in &rule.maps {
            let id = self.set_id();
            ids.push(id);
            let start = self.message(index, NEWSET, NLM_F_CREATE);
            self.str(TABLE, table);
            self.str(SET_NAME, ANONYMOUS_MAP);
            self.u32(SET_FLAGS, SET_ANONYMOUS | SET_CONSTANT | SET_MAP);
            self.u32(SET_KEY_TYPE, TYPE_INTEGER);
            self.u32(SET_KEY_LEN, 4);
            self.u32(SET_DATA_TYPE, DATA_TYPE_VERDICT);
            self.u32(SET_DATA_LEN, 0);
            self.u32(SET_ID, id);
            let desc = self.nest(SET_DESC);
            self.u32(SET_DESC_SIZE, targets.len() as u32);
            self.end(desc);
            self.attr(SET_USERDATA, &KEY_HOST_ORDER);
            self.end_message(start);

            // A nested attribute's length is 16 bits: many endpoints take several messages.
            for (chunk, part) in targets.chunks(ELEMENTS_PER_MESSAGE).enumerate() {
                let start = self.message(index, NEWSETELEM, NLM_F_CREATE);
                self.str(TABLE, table);
                self.str(ELEM_LIST_SET, ANONYMOUS_MAP);
                self.u32(ELEM_LIST_SET_ID, id);
                let elements = self.nest(ELEM_LIST_ELEMENTS);
                for (k, target) in part.iter().enumerate() {
                    let key = (chunk * ELEMENTS_PER_MESSAGE + k) as u32;
                    self.element(&key.to_ne_bytes(), Some(target));
                }
                self.end(elements);
                self.end_message(start);
            }
        }
        let start = self.message(index, NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
        self.str(TABLE, table);
        self.str(RULE_CHAIN, chain);
        let list = self.nest(RULE_EXPRESSIONS);
        for e in &rule.exprs {
            let elem = self.nest(LIST_ELEM);
            self.expression(e, &ids);
            self.end(elem);
        }
        self.end(list);
        self.end_message(start);
    }

    fn expression(&mut self, e: &Expr, map_ids: &[u32]) {
        let name = match e {
            Expr::Payload { .. } => "payload",
            Expr::MetaL4proto => "meta",
            Expr::FibType { .. } => "fib",
            Expr::Cmp { .. } => "cmp",
            Expr::Mask(_) => "bitwise",
            Expr::Verdict(_) | Expr::Immediate { .. } => "immediate",
            Expr::NumgenRandom { .. } => "numgen",
            Expr::Vmap { .. } | Expr::Lookup { .. } => "lookup",
            Expr::Update { .. } => "dynset",
            Expr::Dnat => "nat",
        };
        self.str(EXPR_NAME, name);
        let data = self.nest(EXPR_DATA);
        let reg = expr::REG_1;
        match e {
            // NFTA_PAYLOAD_{DREG,BASE,OFFSET,LEN}
            Expr::Payload { offset, len } => {
                self.u32s(&[(1, reg), (2, expr::BASE_NETWORK), (3, *offset), (4, *len)]);
            }
            // NFTA_META_{DREG,KEY}
            Expr::MetaL4proto => self.u32s(&[(1, reg), (2, expr::META_L4PROTO)]),
            // NFTA_FIB_{DREG,RESULT,FLAGS}; result 3 is NFT_FIB_RESULT_ADDRTYPE
            Expr::FibType { flags } => self.u32s(&[(1, reg), (2, 3), (3, *flags)]),
            // NFTA_CMP_{SREG,OP,DATA}; op 0 is NFT_CMP_EQ, 1 NFT_CMP_NEQ
            Expr::Cmp { negate, data } => {
                self.u32s(&[(1, reg), (2, u32::from(*negate))]);
                self.value(3, data);
            }
            // NFTA_BITWISE_{SREG,DREG,LEN,MASK,XOR}
            Expr::Mask(mask) => {
                self.u32s(&[(1, reg), (2, reg), (3, mask.len() as u32)]);
                self.value(4, mask);
                self.value(5, &vec![0; mask.len()]);
            }
            // NFTA_IMMEDIATE_{DREG,DATA}; register 0 is the verdict register
            Expr::Verdict(jump) => {
                self.u32(1, 0);
                let d = self.nest(2);
                self.verdict(jump);
                self.end(d);
            }
            Expr::Immediate { reg, data } => {
                self.u32(1, *reg);
                self.value(2, data);
            }
            // NFTA_NG_{DREG,MODULUS,TYPE,OFFSET}; type 1 is NFT_NG_RANDOM
            Expr::NumgenRandom { modulus } => self.u32s(&[(1, reg), (2, *modulus), (3, 1), (4, 0)]),
            // NFTA_LOOKUP_{SET,SREG,DREG,SET_ID}
            Expr::Vmap { index } => {
                self.str(1, ANONYMOUS_MAP);
                self.u32s(&[(2, reg), (3, 0), (4, map_ids[*index])]);
            }
            Expr::Lookup { set } => {
                self.str(1, set);
                self.u32(2, reg);
            }
            // NFTA_DYNSET_{SET_NAME,OP,SREG_KEY}; op 1 is NFT_DYNSET_OP_UPDATE
            Expr::Update { set } => {
                self.str(1, set);
                self.u32s(&[(3, 1), (4, reg)]);
            }
            // NFTA_NAT_{TYPE,FAMILY,REG_ADDR_MIN,REG_PROTO_MIN,FLAGS}: DNAT (1), ip, the
            // port given (NF_NAT_RANGE_PROTO_SPECIFIED)
            Expr::Dnat => self.u32s(&[(1, 1), (2, u32::from(NFPROTO_IPV4)), (3, reg), (5, expr::REG_2), (7, 2)]),
        }
        self.end(data);
    }

    /// One set element: its key, and its verdict when the set is a map.
    fn element(&mut self, key: &[u8], target: Option<&Jump>) {
        let elem = self.nest(LIST_ELEM);
        self.value(ELEM_KEY, key);
        if let Some(target) = target {
            let data = self.nest(ELEM_DATA);
            self.verdict(target);
            self.end(data);
        }
        self.end(elem);
    }

    /// `NFTA_DATA_VERDICT`: the code (`NF_DROP` 0, `NFT_JUMP` -3, `NFT_GOTO` -4, `NFT_RETURN`
    /// -5) and the chain.
    fn verdict(&mut self, jump: &Jump) {
        let v = self.nest(DATA_VERDICT);
        let (code, chain): (i32, Option<&str>) = match jump {
            Jump::Drop => (0, None),
            Jump::Return => (-5, None),
            Jump::Jump(c) => (-3, Some(c)),
            Jump::Goto(c) => (-4, Some(c)),
        };
        self.attr(VERDICT_CODE, &code.to_be_bytes());
        if let Some(chain) = chain {
            self.str(VERDICT_CHAIN, chain);
        }
        self.end(v);
    }

    fn set_id(&mut self) -> u32 {
        self.next_set_id += 1;
        self.next_set_id - 1
    }

    /// Starts a message of nf_tables for `command` (acknowledged, so each error names its command).
    fn message(&mut self, command: usize, msg: u16, flags: u16) -> usize {
        self.seq = self.seq.wrapping_add(1);
        self.owners.push(command);
        self.header((NFNL_SUBSYS_NFTABLES << 8) | msg, NLM_F_REQUEST | NLM_F_ACK | flags, NFPROTO_IPV4)
    }

    /// `nlmsghdr` (length patched by [`Batch::end`]) and `nfgenmsg`.
    fn header(&mut self, msg_type: u16, flags: u16, family: u8) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&msg_type.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        // The batch messages name their subsystem in res_id; the others leave it 0.
        let res_id = if family == 0 { NFNL_SUBSYS_NFTABLES } else { 0 };
        self.buf.extend_from_slice(&[family, 0]);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    /// Patches the length of the message that began at `start`.
    fn end_message(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Patches the length of the nested attribute that began at `start`.
    fn end(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn nest(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        start
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        self.buf.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }

    /// A NUL-terminated string.
    fn str(&mut self, ty: u16, s: &str) {
        let mut bytes = Vec::with_capacity(s.len() + 1);
        bytes.extend_from_slice(s.as_bytes());
        bytes.push(0);
        self.attr(ty, &bytes);
    }

    /// A big-endian u32, as nftables' attributes are.
    fn u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    fn u32s(&mut self, attrs: &[(u16, u32)]) {
        for (ty, v) in attrs {
            self.u32(*ty, *v);
        }
    }

    /// `nft_data` holding a value.
    fn value(&mut self, ty: u16, data: &[u8]) {
        let n = self.nest(ty);
        self.attr(DATA_VALUE, data);
        self.end(n);
    }
}

/// A verdict map's key: each field of a concatenation padded to 4 bytes, the port in network
/// order.
pub fn map_key(key: &MapKey) -> Vec<u8> {
    let proto = |p: crate::model::Protocol| [p.number(), 0, 0, 0];
    let port = |p: u16| -> [u8; 4] {
        let [hi, lo] = p.to_be_bytes();
        [hi, lo, 0, 0]
    };
    match key {
        MapKey::Address(ip, p, n) => [ip.octets(), proto(*p), port(*n)].concat(),
        MapKey::Port(p, n) => [proto(*p), port(*n)].concat(),
    }
}

#[cfg(test)]
mod tests;
