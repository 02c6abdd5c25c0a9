//! What is in the kernel's table, per Service, and the one transaction that brings it to what the
//! Services now ask for: only the chains, sets and map entries that differ are touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use crate::command::Command;
use crate::model::ServiceKey;
use crate::rules::{MapKey, MapName, NodeNetwork, ServiceRules};
use crate::table::Table;

/// The rules applied to the table, by Service. A map entry claimed by two Services (two
/// Services given the same external IP and port) belongs to the first one that claimed it.
#[derive(Debug, Default)]
pub struct Applied {
    services: HashMap<ServiceKey, ServiceRules>,
    owners: HashMap<(MapName, MapKey), ServiceKey>,
    /// The node's ranges the pod-egress rule was written for.
    net: NodeNetwork,
}

impl Applied {
    pub fn net(&self) -> NodeNetwork {
        self.net
    }

    pub fn set_net(&mut self, net: NodeNetwork) {
        self.net = net;
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// The commands that rebuild the table from scratch with `all`, and the state they leave.
    pub fn rebuild(table: &Table, all: BTreeMap<ServiceKey, ServiceRules>) -> (Vec<Value>, Applied) {
        let mut cmds = table.recreate();
        let empty = Applied::default();
        let changes: Vec<_> = all.into_iter().map(|(k, r)| (k, Some(r))).collect();
        cmds.extend(empty.changes(&changes).iter().map(|c| c.json(table)));
        let mut applied = empty;
        applied.commit(changes);
        (cmds, applied)
    }

    /// The commands that take each changed Service from what was applied to its new rules
    /// (`None`: the Service is gone), in an order the kernel accepts in one transaction: new
    /// sets and chains exist before anything refers to them, and chains and sets are deleted
    /// only once nothing refers to them.
    pub fn changes(&self, changes: &[(ServiceKey, Option<ServiceRules>)]) -> Vec<Command> {
        let empty = ServiceRules::default();
        let mut add_sets = Vec::new();
        let mut delete_sets = Vec::new();
        let mut add_chains = Vec::new();
        let mut flush_chains = Vec::new();
        let mut rules = Vec::new();
        let mut delete_elements = Vec::new();
        let mut add_elements = Vec::new();
        let mut delete_chains = Vec::new();
        // Map entries this batch frees or takes, so two Services trading an entry work.
        let mut freed: BTreeSet<(MapName, MapKey)> = BTreeSet::new();
        let mut taken: BTreeSet<(MapName, MapKey)> = BTreeSet::new();

        for (key, new) in changes {
            let old = self.services.get(key).unwrap_or(&empty);
            let new = new.as_ref().unwrap_or(&empty);
            for (name, timeout) in &new.sets {
                match old.sets.get(name) {
                    None => add_sets.push(Command::AddSet(name.clone(), *timeout)),
                    Some(t) if t != timeout => {
                        delete_sets.push(Command::DeleteSet(name.clone()));
                        delete_sets.push(Command::AddSet(name.clone(), *timeout));
                    }
                    Some(_) => {}
                }
            }
            for name in old.sets.keys().filter(|n| !new.sets.contains_key(*n)) {
                delete_sets.push(Command::DeleteSet(name.clone()));
            }
            for (name, chain_rules) in &new.chains {
                match old.chains.get(name) {
                    None => add_chains.push(Command::AddChain(name.clone())),
                    Some(old_rules) if old_rules == chain_rules => continue,
                    Some(_) => flush_chains.push(Command::FlushChain(name.clone())),
                }
                rules.extend(chain_rules.iter().map(|r| Command::AddRule(name.clone(), r.clone())));
            }
            for name in old.chains.keys().filter(|n| !new.chains.contains_key(*n)) {
                flush_chains.push(Command::FlushChain(name.clone()));
                delete_chains.push(Command::DeleteChain(name.clone()));
            }
            for (entry, target) in &old.elements {
                if new.elements.get(entry) != Some(target) && self.owners.get(entry) == Some(key) {
                    delete_elements.push(Command::DeleteElement(entry.0, entry.1.clone()));
                    freed.insert(entry.clone());
                }
            }
            for (entry, target) in &new.elements {
                let owner = self.owners.get(entry);
                let unchanged = owner == Some(key) && old.elements.get(entry) == Some(target);
                let free = owner.is_none() || owner == Some(key) || freed.contains(entry);
                if !unchanged && free && taken.insert(entry.clone()) {
                    add_elements.push(Command::AddElement(entry.0, entry.1.clone(), target.clone()));
                }
            }
        }
        let mut cmds = add_sets;
        cmds.extend(add_chains);
        cmds.extend(flush_chains);
        cmds.extend(delete_sets);
        cmds.extend(rules);
        cmds.extend(delete_elements);
        cmds.extend(add_elements);
        cmds.extend(delete_chains);
        cmds
    }

    /// Records that `changes` were applied.
    pub fn commit(&mut self, changes: Vec<(ServiceKey, Option<ServiceRules>)>) {
        for (key, new) in changes {
            if let Some(old) = self.services.remove(&key) {
                for entry in old.elements.keys() {
                    if self.owners.get(entry) == Some(&key) {
                        self.owners.remove(entry);
                    }
                }
            }
            if let Some(new) = new {
                for entry in new.elements.keys() {
                    self.owners.entry(entry.clone()).or_insert_with(|| key.clone());
                }
                self.services.insert(key, new);
            }
        }
    }

    /// The rules applied for `key`.
    pub fn get(&self, key: &ServiceKey) -> Option<&ServiceRules> {
        self.services.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Endpoint;
    use crate::rules::{NodeNetwork, service_rules};

    fn rules(endpoints: &[&str]) -> ServiceRules {
        let endpoints =
            endpoints.iter().map(|ip| Endpoint { ip: ip.parse().unwrap(), port: 80, local: true }).collect();
        let port = crate::model::example_port("", endpoints);
        service_rules(&[port], NodeNetwork::default())
    }

    /// The steps as their JSON commands' verb, kind and name.
    fn verbs(cmds: &[Command]) -> Vec<String> {
        let table = Table::new("t");
        cmds.iter()
            .map(|c| c.json(&table))
            .map(|c| {
                let (verb, body) = c.as_object().unwrap().iter().next().unwrap();
                let (kind, obj) = body.as_object().unwrap().iter().next().unwrap();
                let name = obj.get("name").or(obj.get("chain")).and_then(Value::as_str).unwrap_or_default();
                format!("{verb} {kind} {name}")
            })
            .collect()
    }

    #[test]
    fn an_unchanged_service_needs_no_command() {
        let key = ServiceKey::new("ns", "web");
        let mut applied = Applied::default();
        applied.commit(vec![(key.clone(), Some(rules(&["10.244.0.2"])))]);
        assert!(applied.changes(&[(key, Some(rules(&["10.244.0.2"])))]).is_empty());
    }

    #[test]
    fn a_new_endpoint_adds_its_chain_and_rewrites_only_the_service_chain() {
        let key = ServiceKey::new("ns", "web");
        let mut applied = Applied::default();
        applied.commit(vec![(key.clone(), Some(rules(&["10.244.0.2"])))]);
        let cmds = applied.changes(&[(key, Some(rules(&["10.244.0.2", "10.244.0.3"])))]);
        assert_eq!(
            verbs(&cmds),
            [
                "add chain endpoint-ns/web/tcp/__10.244.0.3/80",
                "flush chain service-ns/web/tcp/",
                "add rule endpoint-ns/web/tcp/__10.244.0.3/80",
                "add rule endpoint-ns/web/tcp/__10.244.0.3/80",
                "add rule service-ns/web/tcp/",
                "add rule service-ns/web/tcp/",
            ]
        );
    }

    #[test]
    fn losing_every_endpoint_moves_the_entry_to_the_reject_map_before_deleting_chains() {
        let key = ServiceKey::new("ns", "web");
        let mut applied = Applied::default();
        applied.commit(vec![(key.clone(), Some(rules(&["10.244.0.2"])))]);
        let cmds = applied.changes(&[(key, Some(rules(&[])))]);
        assert_eq!(
            verbs(&cmds),
            [
                "flush chain endpoint-ns/web/tcp/__10.244.0.2/80",
                "flush chain service-ns/web/tcp/",
                "delete element service-ips",
                "add element no-endpoint-services",
                "delete chain endpoint-ns/web/tcp/__10.244.0.2/80",
                "delete chain service-ns/web/tcp/",
            ]
        );
    }

    #[test]
    fn a_map_entry_claimed_by_two_services_stays_with_the_first_until_it_lets_go() {
        let (a, b) = (ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b"));
        let mut applied = Applied::default();
        applied.commit(vec![(a.clone(), Some(rules(&["10.244.0.2"])))]);
        let clash = applied.changes(&[(b.clone(), Some(rules(&["10.244.0.2"])))]);
        assert!(!verbs(&clash).iter().any(|v| v.contains("element")), "{clash:?}");
        applied.commit(vec![(b.clone(), Some(rules(&["10.244.0.2"])))]);
        let handover = applied.changes(&[(a.clone(), None), (b, Some(rules(&["10.244.0.2"])))]);
        let v = verbs(&handover);
        assert!(
            v.contains(&"delete element service-ips".to_string()) && v.contains(&"add element service-ips".to_string()),
            "{v:?}"
        );
    }
}
