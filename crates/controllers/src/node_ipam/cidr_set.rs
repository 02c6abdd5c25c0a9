//! The pure half of node IPAM: the cluster CIDR cut into equal blocks, which of them are taken,
//! and the next free one.
//!
//! Blocks are handed out round-robin from after the last one given, so a block freed by a
//! deleted node is the last to be reused: routes and conntrack entries naming it have time to
//! go before another node's pods live there.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// More blocks than this (a mask more than 16 bits longer than the cluster CIDR's prefix) is a
/// configuration mistake, as kube-controller-manager rules it.
pub const MAX_BLOCK_BITS: u8 = 16;

/// An IPv4 network in CIDR form; the address has no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Net {
    network: u32,
    prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not an IPv4 CIDR such as 10.244.0.0/16")]
    Syntax(String),
    #[error("{cidr:?} has host bits set; the network is {network}")]
    HostBits { cidr: String, network: Ipv4Net },
    #[error("node CIDR mask size {mask} is not between 1 and 32")]
    MaskSize { mask: u8 },
    #[error(
        "cluster CIDR {cluster} with node CIDR mask size {mask} makes 2^{bits} blocks; at most 2^{MAX_BLOCK_BITS} are \
         allowed (use a smaller node CIDR mask size or a smaller cluster CIDR)"
    )]
    TooManyBlocks { cluster: Ipv4Net, mask: u8, bits: u8 },
    #[error("{cidr} is not inside the cluster CIDR {cluster}")]
    OutsideCluster { cidr: Ipv4Net, cluster: Ipv4Net },
}

impl Ipv4Net {
    /// `prefix` must be at most 32; host bits of `addr` are cleared.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Ipv4Net {
        assert!(prefix <= 32, "prefix {prefix} is longer than 32");
        Ipv4Net { network: u32::from(addr) & mask(prefix), prefix }
    }

    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.network)
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The last address of the network.
    fn last(&self) -> u32 {
        self.network | !mask(self.prefix)
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & mask(self.prefix) == self.network
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        self.network <= other.last() && other.network <= self.last()
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

impl FromStr for Ipv4Net {
    type Err = CidrError;

    /// Strict: `10.244.1.0/24`, not `10.244.1.7/24`.
    fn from_str(s: &str) -> Result<Ipv4Net, CidrError> {
        let syntax = || CidrError::Syntax(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(syntax)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| syntax())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(syntax)?;
        let net = Ipv4Net::new(addr, prefix);
        if net.network() != addr {
            return Err(CidrError::HostBits { cidr: s.to_string(), network: net });
        }
        Ok(net)
    }
}

/// The blocks of a cluster CIDR and which are taken.
#[derive(Clone, Debug)]
pub struct CidrSet {
    cluster: Ipv4Net,
    /// The blocks' prefix length: the node CIDR mask size, or the cluster's own prefix when that
    /// is already as long (then the cluster CIDR is the one block).
    block_prefix: u8,
    used: Vec<bool>,
    /// Where the search for the next free block starts.
    next: usize,
}

impl CidrSet {
    pub fn new(cluster: Ipv4Net, node_mask: u8) -> Result<CidrSet, CidrError> {
        if !(1..=32).contains(&node_mask) {
            return Err(CidrError::MaskSize { mask: node_mask });
        }
        let block_prefix = node_mask.max(cluster.prefix);
        let bits = block_prefix - cluster.prefix;
        if bits > MAX_BLOCK_BITS {
            return Err(CidrError::TooManyBlocks { cluster, mask: node_mask, bits });
        }
        Ok(CidrSet { cluster, block_prefix, used: vec![false; 1 << bits], next: 0 })
    }

    pub fn cluster(&self) -> Ipv4Net {
        self.cluster
    }

    /// How many blocks there are.
    pub fn capacity(&self) -> usize {
        self.used.len()
    }

    /// How many blocks are taken.
    pub fn taken(&self) -> usize {
        self.used.iter().filter(|u| **u).count()
    }

    fn block(&self, index: usize) -> Ipv4Net {
        let size = 1u64 << (32 - self.block_prefix);
        let network = (u64::from(self.cluster.network) + index as u64 * size) as u32;
        Ipv4Net { network, prefix: self.block_prefix }
    }

    /// The blocks `cidr` covers: all blocks inside it, or the one block it lies in.
    fn indices(&self, cidr: &Ipv4Net) -> Result<std::ops::Range<usize>, CidrError> {
        if !self.cluster.overlaps(cidr) {
            return Err(CidrError::OutsideCluster { cidr: *cidr, cluster: self.cluster });
        }
        let shift = 32 - self.block_prefix;
        let start = cidr.network.max(self.cluster.network) - self.cluster.network;
        let end = cidr.last().min(self.cluster.last()) - self.cluster.network;
        Ok((start >> shift) as usize..(end >> shift) as usize + 1)
    }

    /// Marks every block `cidr` overlaps as taken (a node's existing podCIDR, whatever its size).
    pub fn occupy(&mut self, cidr: &Ipv4Net) -> Result<(), CidrError> {
        let range = self.indices(cidr)?;
        self.used[range].fill(true);
        Ok(())
    }

    /// Frees every block `cidr` overlaps.
    pub fn release(&mut self, cidr: &Ipv4Net) -> Result<(), CidrError> {
        let range = self.indices(cidr)?;
        self.used[range].fill(false);
        Ok(())
    }

    /// Takes the next free block after the last one handed out, or `None` when all are taken.
    pub fn allocate(&mut self) -> Option<Ipv4Net> {
        let n = self.used.len();
        let index = (0..n).map(|i| (self.next + i) % n).find(|i| !self.used[*i])?;
        self.used[index] = true;
        self.next = (index + 1) % n;
        Some(self.block(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn set(cluster: &str, mask: u8) -> CidrSet {
        CidrSet::new(net(cluster), mask).unwrap()
    }

    #[test]
    fn a_cidr_parses_strictly_and_prints_as_written() {
        assert_eq!(net("10.244.0.0/16").to_string(), "10.244.0.0/16");
        assert_eq!(net("0.0.0.0/0").prefix(), 0);
        for bad in ["10.244.0.0", "10.244.0.0/33", "10.244.0/16", "fd00::/64", "10.244.0.0/x", ""] {
            assert_eq!(bad.parse::<Ipv4Net>(), Err(CidrError::Syntax(bad.into())), "{bad}");
        }
        let err = "10.244.1.7/16".parse::<Ipv4Net>().unwrap_err();
        assert_eq!(err.to_string(), "\"10.244.1.7/16\" has host bits set; the network is 10.244.0.0/16");
    }

    #[test]
    fn blocks_are_handed_out_in_order_of_address() {
        let mut s = set("10.244.0.0/16", 24);
        assert_eq!(s.capacity(), 256);
        assert_eq!(s.allocate(), Some(net("10.244.0.0/24")));
        assert_eq!(s.allocate(), Some(net("10.244.1.0/24")));
        assert_eq!(s.allocate(), Some(net("10.244.2.0/24")));
        assert_eq!(s.taken(), 3);
    }

    #[test]
    fn taken_blocks_are_skipped() {
        let mut s = set("10.244.0.0/16", 24);
        s.occupy(&net("10.244.0.0/24")).unwrap();
        s.occupy(&net("10.244.1.0/24")).unwrap();
        assert_eq!(s.allocate(), Some(net("10.244.2.0/24")));
    }

    #[test]
    fn a_taken_cidr_larger_than_a_block_takes_every_block_inside_it() {
        let mut s = set("10.244.0.0/16", 24);
        s.occupy(&net("10.244.0.0/23")).unwrap();
        assert_eq!(s.taken(), 2);
        assert_eq!(s.allocate(), Some(net("10.244.2.0/24")));
    }

    #[test]
    fn a_taken_cidr_smaller_than_a_block_takes_the_block_it_lies_in() {
        let mut s = set("10.244.0.0/16", 24);
        s.occupy(&net("10.244.0.128/25")).unwrap();
        assert_eq!(s.allocate(), Some(net("10.244.1.0/24")));
    }

    #[test]
    fn a_cidr_outside_the_cluster_is_refused() {
        let mut s = set("10.244.0.0/16", 24);
        let err = s.occupy(&net("10.88.0.0/24")).unwrap_err();
        assert_eq!(err.to_string(), "10.88.0.0/24 is not inside the cluster CIDR 10.244.0.0/16");
        assert_eq!(s.taken(), 0);
    }

    #[test]
    fn an_exhausted_range_allocates_nothing_until_a_block_is_freed() {
        let mut s = set("10.244.0.0/30", 31);
        assert_eq!(s.allocate(), Some(net("10.244.0.0/31")));
        assert_eq!(s.allocate(), Some(net("10.244.0.2/31")));
        assert_eq!(s.allocate(), None);
        s.release(&net("10.244.0.0/31")).unwrap();
        assert_eq!(s.allocate(), Some(net("10.244.0.0/31")));
    }

    #[test]
    fn a_freed_block_is_reused_only_after_the_ones_never_given() {
        let mut s = set("10.244.0.0/22", 24);
        let first = s.allocate().unwrap();
        s.allocate().unwrap();
        s.release(&first).unwrap();
        assert_eq!(s.allocate(), Some(net("10.244.2.0/24")));
        assert_eq!(s.allocate(), Some(net("10.244.3.0/24")));
        assert_eq!(s.allocate(), Some(first));
    }

    #[test]
    fn a_cluster_cidr_at_least_as_long_as_the_mask_is_one_block() {
        let mut s = set("10.244.7.0/24", 16);
        assert_eq!(s.capacity(), 1);
        assert_eq!(s.allocate(), Some(net("10.244.7.0/24")));
        assert_eq!(s.allocate(), None);
    }

    #[test]
    fn too_many_blocks_or_a_bad_mask_is_a_clear_error() {
        let err = CidrSet::new(net("10.0.0.0/8"), 28).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cluster CIDR 10.0.0.0/8 with node CIDR mask size 28 makes 2^20 blocks; at most 2^16 are allowed (use a \
             smaller node CIDR mask size or a smaller cluster CIDR)"
        );
        assert_eq!(CidrSet::new(net("10.0.0.0/8"), 33).unwrap_err(), CidrError::MaskSize { mask: 33 });
        assert_eq!(CidrSet::new(net("10.0.0.0/8"), 0).unwrap_err(), CidrError::MaskSize { mask: 0 });
    }

    #[test]
    fn the_last_block_of_a_cluster_at_the_top_of_the_address_space_is_reachable() {
        let mut s = set("255.255.255.0/24", 25);
        s.allocate().unwrap();
        assert_eq!(s.allocate(), Some(net("255.255.255.128/25")));
    }
}
