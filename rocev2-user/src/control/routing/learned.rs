//! The next-hop groups learned from the kernel's routes: one per (set of
//! next hops, `[[route_policy]]`), named readably, each with its bucket
//! table by member identity.

use std::{collections::HashMap, net::IpAddr};

use super::fib::Hop;
use crate::control::groups::resilient::ResilientTable;

/// A learned member's identity: the egress interface and the neighbour.
pub type HopId = (u32, IpAddr);

/// A group learned from kernel routes.
#[derive(Debug)]
pub struct LearnedGroup {
    pub name: String,
    pub slot: u32,
    pub hops: Vec<Hop>,
    /// Index of the `[[route_policy]]` that shapes it, if any.
    pub policy: Option<usize>,
    pub table: ResilientTable<HopId>,
    /// Prefixes that point at it; it is freed at zero.
    pub prefixes: usize,
}

/// Groups learned from kernel routes, one per (set of next hops, policy).
#[derive(Default, Debug)]
pub struct LearnedGroups {
    pub by_key: HashMap<(Vec<Hop>, Option<usize>), LearnedGroup>,
}

impl LearnedGroups {
    /// The group for `hops` under `policy`, made if needed. A new group
    /// starts from `inherit`'s bucket table (the group the prefix used
    /// before), so when BGP drops one path and the kernel points the prefix
    /// at a new, smaller group, only that path's buckets move.
    pub fn get_or_make(
        &mut self,
        hops: &[Hop],
        policy: Option<usize>,
        inherit: Option<&(Vec<Hop>, Option<usize>)>,
        names: impl Fn(&Hop) -> String,
        slot: impl FnOnce() -> Option<u32>,
    ) -> Option<&mut LearnedGroup> {
        let key = (hops.to_vec(), policy);
        if !self.by_key.contains_key(&key) {
            let slot = slot()?;
            let table = inherit.and_then(|k| self.by_key.get(k)).map(|g| g.table.clone()).unwrap_or_default();
            // Unique: two sets on the same interfaces (other gateways) get #2, #3...
            let base = group_name(hops, &names);
            let taken = |n: &str| self.by_key.values().any(|g| g.name == n);
            let name = std::iter::once(base.clone())
                .chain((2..).map(|i| format!("{base}#{i}")))
                .find(|n| !taken(n))
                .expect("an unused name");
            self.by_key
                .insert(key.clone(), LearnedGroup { name, slot, hops: hops.to_vec(), policy, table, prefixes: 0 });
        }
        self.by_key.get_mut(&key)
    }
}

/// A readable, deterministic name for a learned group: `nh:` (`nh6:` when
/// the next hops are IPv6 addresses) and its interfaces (with the neighbour
/// when an interface has several, and `*weight` when not 1), e.g.
/// `nh:s1l1+s2l1+s3l1+s4l1`, `nh6:s1l1+s2l1` or `nh:h1/10.0.1.7`.
pub fn group_name(hops: &[Hop], link_name: impl Fn(&Hop) -> String) -> String {
    let parts: Vec<String> = hops
        .iter()
        .map(|h| {
            let dev = link_name(h);
            let shared = hops.iter().filter(|o| o.oif == h.oif).count() > 1;
            let mut part = if shared || hops.len() == 1 { format!("{dev}/{}", h.neighbour) } else { dev };
            if h.weight != 1 {
                part.push_str(&format!("*{}", h.weight));
            }
            part
        })
        .collect();
    let family = if hops.iter().all(|h| h.neighbour.is_ipv6()) { "nh6" } else { "nh" };
    format!("{family}:{}", parts.join("+"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_readable() {
        let hop = |oif, n: &str, weight| Hop { oif, neighbour: n.parse().unwrap(), weight };
        let name = |h: &Hop| format!("s{}l1", h.oif);
        assert_eq!(group_name(&[hop(1, "10.0.0.1", 1), hop(2, "10.0.0.2", 1)], name), "nh:s1l1+s2l1");
        assert_eq!(group_name(&[hop(1, "10.0.0.1", 1), hop(2, "10.0.0.2", 3)], name), "nh:s1l1+s2l1*3");
        assert_eq!(group_name(&[hop(1, "10.0.0.1", 1)], name), "nh:s1l1/10.0.0.1");
        assert_eq!(group_name(&[hop(1, "fe80::1", 1), hop(2, "fe80::2", 1)], name), "nh6:s1l1+s2l1");
    }
}
