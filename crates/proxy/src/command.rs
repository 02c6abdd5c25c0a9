//! The steps of an incremental transaction on the proxy's table, typed. [`Command::json`] gives
//! a step's `nft -j` form; [`crate::netlink`] writes the same steps to the kernel directly.

use std::fmt;

use serde_json::Value;

use crate::model::Protocol;
use crate::rules::{MapKey, MapName, Rule};
use crate::table::Table;

/// One step, in the order the transaction takes them.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    AddChain(String),
    /// Removes every rule of the chain.
    FlushChain(String),
    DeleteChain(String),
    /// Appends a rule to a chain.
    AddRule(String, Rule),
    /// An affinity set of client addresses, with its timeout in seconds.
    AddSet(String, u32),
    DeleteSet(String),
    /// An entry of one of the table's verdict maps: its key goes to a chain.
    AddElement(MapName, MapKey, String),
    DeleteElement(MapName, MapKey),
}

impl Command {
    /// The `nft -j` command for this step in `table`.
    pub fn json(&self, table: &Table) -> Value {
        match self {
            Command::AddChain(name) => table.add_chain(name),
            Command::FlushChain(name) => table.flush_chain(name),
            Command::DeleteChain(name) => table.delete_chain(name),
            Command::AddRule(chain, rule) => table.add_rule(chain, rule),
            Command::AddSet(name, timeout) => table.add_affinity_set(name, *timeout),
            Command::DeleteSet(name) => table.delete_set(name),
            Command::AddElement(map, key, chain) => table.add_element(*map, key, chain),
            Command::DeleteElement(map, key) => table.delete_element(*map, key),
        }
    }
}

/// As `nft` would spell the step, to name it in errors.
impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::AddChain(name) => write!(f, "add chain {name}"),
            Command::FlushChain(name) => write!(f, "flush chain {name}"),
            Command::DeleteChain(name) => write!(f, "delete chain {name}"),
            Command::AddRule(chain, rule) => {
                let statements = serde_json::to_string(rule).unwrap_or_default();
                write!(f, "add rule {chain} {statements}")
            }
            Command::AddSet(name, timeout) => write!(f, "add set {name} (timeout {timeout}s)"),
            Command::DeleteSet(name) => write!(f, "delete set {name}"),
            Command::AddElement(map, key, chain) => {
                write!(f, "add element {} {{ {} : goto {chain} }}", map.as_str(), KeyText(key))
            }
            Command::DeleteElement(map, key) => write!(f, "delete element {} {{ {} }}", map.as_str(), KeyText(key)),
        }
    }
}

struct KeyText<'a>(&'a MapKey);

impl fmt::Display for KeyText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = |p: Protocol| p.as_str();
        match self.0 {
            MapKey::Address(ip, p, port) => write!(f, "{ip} . {} . {port}", proto(*p)),
            MapKey::Port(p, port) => write!(f, "{} . {port}", proto(*p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_entry_is_named_as_nft_would_write_it() {
        let key = MapKey::Address("10.96.0.5".parse().unwrap(), Protocol::Tcp, 80);
        let add = Command::AddElement(MapName::ServiceIps, key.clone(), "service-ns/web/tcp/http".into());
        assert_eq!(add.to_string(), "add element service-ips { 10.96.0.5 . tcp . 80 : goto service-ns/web/tcp/http }");
        let delete = Command::DeleteElement(MapName::NoEndpointNodePorts, MapKey::Port(Protocol::Udp, 30053));
        assert_eq!(delete.to_string(), "delete element no-endpoint-nodeports { udp . 30053 }");
    }

    #[test]
    fn each_step_has_the_json_form_the_table_writes() {
        let table = Table::new("t");
        assert_eq!(Command::FlushChain("c".into()).json(&table), table.flush_chain("c"));
        assert_eq!(Command::AddSet("s".into(), 60).json(&table), table.add_affinity_set("s", 60));
    }
}
