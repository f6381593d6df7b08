//! A mirror of one kernel routing table, and what each of its prefixes
//! becomes in the dataplane.
//!
//! The kernel side ([`super::kernel`]) turns netlink messages into the
//! changes below; this module holds the state and answers, for a prefix,
//! "which next hops serve it, or why does it go to the kernel". It knows
//! nothing of sockets, so it is tested with plain values.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use crate::control::config::Prefix;

/// An interface as far as forwarding cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    /// The interface's own MAC; `None` for links without an Ethernet
    /// address (loopback, tun, wireguard), which XDP cannot redirect to.
    pub mac: Option<[u8; 6]>,
    /// Administratively up with a carrier.
    pub up: bool,
}

/// One next hop of a route (from RTA_GATEWAY/RTA_VIA + RTA_OIF, an
/// RTA_MULTIPATH entry, or a nexthop object).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Path {
    pub oif: u32,
    /// `None`: the destination is on the link itself (a connected route).
    pub gateway: Option<IpAddr>,
    /// 1 = a plain next hop; kernel weights are `hops + 1`.
    pub weight: u32,
    /// Carries a lightweight-tunnel encapsulation (MPLS, seg6, ...).
    pub encap: bool,
}

/// A nexthop object (`ip nexthop`), as zebra installs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NexthopObject {
    /// One next hop, or a blackhole.
    Single { path: Option<Path>, blackhole: bool },
    /// A group of other objects with weights (`group 12,2/13`).
    Group { members: Vec<(u32, u32)> },
}

/// How a route names its next hops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hops {
    Paths(Vec<Path>),
    /// RTA_NH_ID: a nexthop object, resolved when the route is looked at.
    Object(u32),
}

/// The route types that matter here (rtm_type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    Unicast,
    /// Blackhole, unreachable, prohibit, throw: the kernel answers them.
    Reject,
    /// Local, broadcast, anycast, multicast, nat...: never forwarded here.
    Other,
}

/// One kernel route of the mirrored table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRoute {
    pub prefix: Prefix,
    pub metric: u32,
    pub kind: RouteKind,
    pub hops: Hops,
}

/// Why a prefix is left to the kernel rather than forwarded in XDP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelReason {
    /// Blackhole, unreachable, prohibit or throw.
    Reject,
    /// A next hop with an encapsulation.
    Encap,
    /// A next hop on a device XDP cannot redirect to (no Ethernet address,
    /// or unknown).
    Device,
    /// A connected subnet: its hosts are served by their own host entries
    /// (from the neighbour table); the rest goes to the kernel to resolve.
    Connected,
    /// A nexthop object the route names is not known (yet).
    MissingNexthop,
    /// Every group slot of the dataplane is taken.
    GroupTableFull,
    /// The dataplane's route table has no room for the prefix, or the
    /// prefix covers one that had none (its group would otherwise carry
    /// the missing prefix's traffic).
    RouteTableFull,
}

impl KernelReason {
    pub const ALL: [KernelReason; 7] = [
        KernelReason::Reject,
        KernelReason::Encap,
        KernelReason::Device,
        KernelReason::Connected,
        KernelReason::MissingNexthop,
        KernelReason::GroupTableFull,
        KernelReason::RouteTableFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelReason::Reject => "reject",
            KernelReason::Encap => "encap",
            KernelReason::Device => "device",
            KernelReason::Connected => "connected",
            KernelReason::MissingNexthop => "missing_nexthop",
            KernelReason::GroupTableFull => "group_table_full",
            KernelReason::RouteTableFull => "route_table_full",
        }
    }
}

/// A dataplane next hop: the egress interface and the neighbour to send to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hop {
    pub oif: u32,
    pub neighbour: IpAddr,
    pub weight: u32,
}

/// What a prefix becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Forwarded over these next hops (sorted, so equal sets compare equal).
    Hops(Vec<Hop>),
    Kernel(KernelReason),
}

/// The mirrored table and everything its routes refer to.
#[derive(Default, Debug)]
pub struct Fib {
    pub links: HashMap<u32, Link>,
    /// Usable neighbour MACs by (ifindex, address); entries that are
    /// incomplete or failed are absent.
    pub neighbours: HashMap<(u32, IpAddr), [u8; 6]>,
    pub nexthops: HashMap<u32, NexthopObject>,
    /// Routes by prefix, then by (metric, first oif) so that IPv6's
    /// per-device routes for one prefix are kept apart.
    pub routes: BTreeMap<Prefix, BTreeMap<(u32, u32), KernelRoute>>,
    /// The box's own addresses.
    pub local: BTreeSet<IpAddr>,
}

/// The key ([`Fib::key`]) of an IPv6 prefix's set of equal-cost paths
/// (no interface has this index).
const V6_ECMP: u32 = u32::MAX;

impl Fib {
    /// Adds or replaces a route (as RTM_NEWROUTE describes it).
    pub fn add_route(&mut self, route: KernelRoute) {
        let key = Self::key(&route);
        self.routes.entry(route.prefix).or_default().insert(key, route);
    }

    /// Removes a route (as RTM_DELROUTE describes it).
    pub fn remove_route(&mut self, route: &KernelRoute) {
        let key = Self::key(route);
        if key.1 == V6_ECMP {
            // One path of the set (`ip -6 route del ... via`), or all of
            // them (zebra's delete): the rest stays in the kernel.
            let Some(by_metric) = self.routes.get_mut(&route.prefix) else { return };
            if let Some(set) = by_metric.get_mut(&key) {
                if let (Hops::Paths(kept), Hops::Paths(gone)) = (&mut set.hops, &route.hops) {
                    kept.retain(|p| !gone.iter().any(|g| g.oif == p.oif && g.gateway == p.gateway));
                    if kept.is_empty() {
                        by_metric.remove(&key);
                    }
                }
            }
            if by_metric.is_empty() {
                self.routes.remove(&route.prefix);
            }
            return;
        }
        if let Some(by_metric) = self.routes.get_mut(&route.prefix) {
            if by_metric.remove(&key).is_none() {
                // A delete may name the route less precisely than its add
                // (e.g. without the device): remove the best of that metric.
                let first = by_metric.keys().find(|k| k.0 == route.metric).copied();
                if let Some(k) = first {
                    by_metric.remove(&k);
                }
            }
            if by_metric.is_empty() {
                self.routes.remove(&route.prefix);
            }
        }
    }

    /// Where a route is kept: IPv4 holds one route per prefix and metric
    /// (zebra's replace of a multipath route by one with a path fewer
    /// names another first device, and must not leave the old one beside
    /// it). IPv6 holds, per prefix and metric, one set of equal-cost paths
    /// (every route with gateways: the kernel makes them siblings of one
    /// multipath route, and reports the whole set in every RTM_NEWROUTE of
    /// one of them, a replace included, which takes the old set's place
    /// without a delete) and apart from it a route per device for the rest
    /// (connected subnets, rejects, nexthop objects; see [`Fib::target`]).
    fn key(route: &KernelRoute) -> (u32, u32) {
        let Prefix::V6 { .. } = route.prefix else { return (route.metric, 0) };
        match &route.hops {
            Hops::Paths(paths) if !paths.is_empty() && paths.iter().all(|p| p.gateway.is_some()) => {
                (route.metric, V6_ECMP)
            }
            Hops::Paths(paths) => (route.metric, paths.first().map_or(0, |p| p.oif)),
            Hops::Object(_) => (route.metric, 0),
        }
    }

    /// What `prefix` becomes: the lowest-metric routes decide; IPv6 routes
    /// of equal metric on several devices are one multipath route.
    /// `None`: no route for it (or not one rocev2 serves at all, such as
    /// link-local or multicast prefixes).
    pub fn target(&self, prefix: &Prefix) -> Option<Target> {
        if !forwardable_prefix(prefix) {
            return None;
        }
        let by_metric = self.routes.get(prefix)?;
        let best_metric = by_metric.keys().next()?.0;
        let mut paths = Vec::new();
        for route in by_metric.values().filter(|r| r.metric == best_metric) {
            match route.kind {
                RouteKind::Unicast => {}
                RouteKind::Reject => return Some(Target::Kernel(KernelReason::Reject)),
                RouteKind::Other => return None,
            }
            match &route.hops {
                Hops::Paths(p) => paths.extend(p.iter().cloned()),
                Hops::Object(id) => match self.expand_object(*id, 0) {
                    Ok(p) => paths.extend(p),
                    Err(reason) => return Some(Target::Kernel(reason)),
                },
            }
        }
        Some(self.hops_of(paths))
    }

    /// The paths of a nexthop object, weights multiplied through groups.
    fn expand_object(&self, id: u32, depth: u32) -> Result<Vec<Path>, KernelReason> {
        match self.nexthops.get(&id) {
            None => Err(KernelReason::MissingNexthop),
            Some(NexthopObject::Single { blackhole: true, .. }) => Err(KernelReason::Reject),
            Some(NexthopObject::Single { path: None, .. }) => Err(KernelReason::MissingNexthop),
            Some(NexthopObject::Single { path: Some(p), .. }) => Ok(vec![p.clone()]),
            Some(NexthopObject::Group { members }) => {
                // The kernel nests groups one level at most.
                if depth > 1 {
                    return Err(KernelReason::MissingNexthop);
                }
                let mut out = Vec::new();
                for (member, weight) in members {
                    for mut p in self.expand_object(*member, depth + 1)? {
                        p.weight = p.weight.saturating_mul(*weight).max(1);
                        out.push(p);
                    }
                }
                Ok(out)
            }
        }
    }

    fn hops_of(&self, paths: Vec<Path>) -> Target {
        if paths.is_empty() {
            return Target::Kernel(KernelReason::MissingNexthop);
        }
        let mut hops = Vec::with_capacity(paths.len());
        for p in paths {
            if p.encap {
                return Target::Kernel(KernelReason::Encap);
            }
            if !self.can_send_on(p.oif) {
                return Target::Kernel(KernelReason::Device);
            }
            let Some(gateway) = p.gateway else { return Target::Kernel(KernelReason::Connected) };
            hops.push(Hop { oif: p.oif, neighbour: gateway, weight: p.weight.max(1) });
        }
        hops.sort();
        // Two identical paths (e.g. a route listed twice) are one heavier path.
        let mut merged: Vec<Hop> = Vec::with_capacity(hops.len());
        for h in hops {
            match merged.last_mut() {
                Some(last) if last.oif == h.oif && last.neighbour == h.neighbour => last.weight += h.weight,
                _ => merged.push(h),
            }
        }
        Target::Hops(merged)
    }

    /// Whether XDP can redirect an Ethernet frame to this link: it is
    /// known and has an Ethernet address.
    fn can_send_on(&self, ifindex: u32) -> bool {
        self.links.get(&ifindex).is_some_and(|l| l.mac.is_some())
    }

    /// Connected subnets: (prefix, oif) of every route whose best path has
    /// no gateway, on an interface XDP can send to.
    pub fn connected(&self) -> Vec<(Prefix, u32)> {
        let mut out = Vec::new();
        for (prefix, by_metric) in &self.routes {
            if !forwardable_prefix(prefix) {
                continue;
            }
            for route in by_metric.values() {
                if let (RouteKind::Unicast, Hops::Paths(paths)) = (route.kind, &route.hops) {
                    for p in paths.iter().filter(|p| p.gateway.is_none() && !p.encap) {
                        out.push((*prefix, p.oif));
                    }
                }
            }
        }
        out
    }

    /// The host entries for connected subnets: every usable neighbour
    /// whose address lies in a connected subnet of its own interface
    /// (what SONiC's neighbour-to-route sync does), except the box's own
    /// addresses.
    pub fn host_entries(&self) -> BTreeMap<Prefix, Hop> {
        let connected = self.connected();
        let mut out = BTreeMap::new();
        for &(oif, addr) in self.neighbours.keys() {
            if self.local.contains(&addr) || !self.can_send_on(oif) {
                continue;
            }
            let host = Prefix::host(addr);
            if !forwardable_prefix(&host) {
                continue;
            }
            if connected.iter().any(|(p, o)| *o == oif && p.contains(addr)) {
                out.insert(host, Hop { oif, neighbour: addr, weight: 1 });
            }
        }
        out
    }

    /// What the kernel does, without a netlink message, when link `ifindex`
    /// goes down or loses carrier (`nexthop_flush_dev` on NETDEV_DOWN,
    /// NETDEV_CHANGE without carrier, NETDEV_UNREGISTER): every nexthop
    /// object on it is removed, a group holding one loses that member, a
    /// group left empty is removed, and routes naming a removed object go
    /// with it. zebra's next RTM_NEWNEXTHOP/NEWROUTE builds on that state,
    /// so the mirror must do the same or keep members the kernel no longer
    /// has. Returns the prefixes whose routes changed.
    pub fn flush_nexthops_of(&mut self, ifindex: u32) -> BTreeSet<Prefix> {
        let mut removed: HashSet<u32> = self
            .nexthops
            .iter()
            .filter_map(|(id, object)| match object {
                NexthopObject::Single { path: Some(p), blackhole: false } if p.oif == ifindex => Some(*id),
                _ => None,
            })
            .collect();
        if removed.is_empty() {
            return BTreeSet::new();
        }
        let mut shrunk: HashSet<u32> = HashSet::new();
        // A group emptied by this may itself be a member of another.
        loop {
            let mut emptied = Vec::new();
            for (gid, object) in self.nexthops.iter_mut() {
                if let NexthopObject::Group { members } = object {
                    let before = members.len();
                    members.retain(|(m, _)| !removed.contains(m));
                    if members.len() != before {
                        shrunk.insert(*gid);
                        if members.is_empty() {
                            emptied.push(*gid);
                        }
                    }
                }
            }
            self.nexthops.retain(|id, _| !removed.contains(id));
            if emptied.is_empty() {
                break;
            }
            removed.extend(emptied);
        }
        let mut changed = BTreeSet::new();
        self.routes.retain(|prefix, by_metric| {
            by_metric.retain(|_, route| match route.hops {
                Hops::Object(id) if removed.contains(&id) => {
                    changed.insert(*prefix);
                    false
                }
                Hops::Object(id) if shrunk.contains(&id) => {
                    changed.insert(*prefix);
                    true
                }
                _ => true,
            });
            !by_metric.is_empty()
        });
        changed
    }

    /// Prefixes whose target may change when nexthop object `id` changes:
    /// routes that name it, or name a group that contains it.
    pub fn prefixes_using_object(&self, id: u32) -> Vec<Prefix> {
        let mut ids: HashSet<u32> = HashSet::from([id]);
        for (gid, obj) in &self.nexthops {
            if let NexthopObject::Group { members } = obj {
                if members.iter().any(|(m, _)| *m == id) {
                    ids.insert(*gid);
                }
            }
        }
        self.routes
            .iter()
            .filter(|(_, by)| by.values().any(|r| matches!(r.hops, Hops::Object(o) if ids.contains(&o))))
            .map(|(p, _)| *p)
            .collect()
    }
}

/// Prefixes rocev2 never forwards itself: IPv6 link-local and multicast,
/// IPv4 multicast and limited broadcast. (Unicast RoCE never uses them.)
pub fn forwardable_prefix(prefix: &Prefix) -> bool {
    match prefix.addr() {
        IpAddr::V4(a) => !(a.is_multicast() || a.is_broadcast() || (a.octets()[0] == 127)),
        IpAddr::V6(a) => {
            let s = a.segments()[0];
            !((s & 0xffc0) == 0xfe80 || (s & 0xff00) == 0xff00 || a.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn fib_with_links() -> Fib {
        let mut fib = Fib::default();
        for i in 1..=4 {
            fib.links.insert(i, Link { name: format!("eth{i}"), mac: Some([2, 0, 0, 0, 0, i as u8]), up: true });
        }
        fib.links.insert(9, Link { name: "wg0".into(), mac: None, up: true });
        fib
    }

    fn via(oif: u32, gw: &str) -> Path {
        Path { oif, gateway: Some(ip(gw)), weight: 1, encap: false }
    }

    fn unicast(prefix: &str, hops: Hops) -> KernelRoute {
        KernelRoute { prefix: p(prefix), metric: 20, kind: RouteKind::Unicast, hops }
    }

    #[test]
    fn multipath_route_becomes_sorted_hops() {
        let mut fib = fib_with_links();
        fib.add_route(unicast("10.9.0.0/16", Hops::Paths(vec![via(2, "10.0.2.2"), via(1, "10.0.1.2")])));
        let Some(Target::Hops(hops)) = fib.target(&p("10.9.0.0/16")) else { panic!() };
        assert_eq!(hops.iter().map(|h| h.oif).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn nexthop_group_object_with_weights() {
        let mut fib = fib_with_links();
        fib.nexthops.insert(12, NexthopObject::Single { path: Some(via(1, "fe80::1")), blackhole: false });
        fib.nexthops.insert(13, NexthopObject::Single { path: Some(via(2, "fe80::2")), blackhole: false });
        fib.nexthops.insert(14, NexthopObject::Group { members: vec![(12, 1), (13, 3)] });
        fib.add_route(unicast("10.99.0.1/32", Hops::Object(14)));
        let Some(Target::Hops(hops)) = fib.target(&p("10.99.0.1/32")) else { panic!() };
        assert_eq!(hops.iter().map(|h| h.weight).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(hops[0].neighbour, ip("fe80::1"), "IPv4 over an IPv6 link-local next hop");
        assert_eq!(fib.prefixes_using_object(12), vec![p("10.99.0.1/32")]);
    }

    /// zebra with inline next hops replaces `10.2.0.0/16 nexthop via
    /// s1p1 nexthop via s2p1` by `via s2p1` when s1 withdraws: the mirror
    /// keeps one IPv4 route per prefix and metric, not both side by side.
    #[test]
    fn an_ipv4_multipath_route_replaced_by_one_path_fewer_keeps_no_stale_path() {
        let mut fib = fib_with_links();
        fib.add_route(unicast("10.2.0.0/16", Hops::Paths(vec![via(1, "10.0.1.2"), via(2, "10.0.2.2")])));
        fib.add_route(unicast("10.2.0.0/16", Hops::Paths(vec![via(2, "10.0.2.2")])));
        let Some(Target::Hops(hops)) = fib.target(&p("10.2.0.0/16")) else { panic!() };
        assert_eq!(hops.iter().map(|h| h.oif).collect::<Vec<_>>(), vec![2]);
        fib.remove_route(&unicast("10.2.0.0/16", Hops::Paths(vec![via(2, "10.0.2.2")])));
        assert_eq!(fib.target(&p("10.2.0.0/16")), None);
    }

    /// zebra with `--v6-rr-semantics` replaces an IPv6 route in place
    /// (RTM_NEWROUTE with NLM_F_REPLACE, no delete): the kernel drops the
    /// old set of equal-cost paths and reports the new one whole, one path
    /// or several. The mirror keeps no path of the old set beside it,
    /// whichever device comes first; a delete of one path (`ip -6 route del
    /// ... via`) leaves the others, and connected routes on two devices
    /// stay apart.
    #[test]
    fn an_ipv6_route_replaced_in_place_keeps_no_path_of_the_old_set() {
        let mut fib = fib_with_links();
        let oifs = |fib: &Fib, prefix: &str| match fib.target(&p(prefix)) {
            Some(Target::Hops(hops)) => hops.iter().map(|h| (h.oif, h.weight)).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        fib.add_route(unicast("fd00:2::/32", Hops::Paths(vec![via(1, "fe80::1"), via(2, "fe80::2")])));
        fib.add_route(unicast("fd00:2::/32", Hops::Paths(vec![via(2, "fe80::2")])));
        assert_eq!(oifs(&fib, "fd00:2::/32"), vec![(2, 1)], "s1 withdrew");
        fib.add_route(unicast("fd00:2::/32", Hops::Paths(vec![via(1, "fe80::1"), via(2, "fe80::2")])));
        assert_eq!(oifs(&fib, "fd00:2::/32"), vec![(1, 1), (2, 1)], "s1 back: one path each, not s2 twice");
        fib.remove_route(&unicast("fd00:2::/32", Hops::Paths(vec![via(1, "fe80::1")])));
        assert_eq!(oifs(&fib, "fd00:2::/32"), vec![(2, 1)], "one path deleted, the other kept");
        fib.remove_route(&unicast("fd00:2::/32", Hops::Paths(vec![via(2, "fe80::2")])));
        assert_eq!(fib.target(&p("fd00:2::/32")), None);
        let on = |oif| Path { gateway: None, ..via(oif, "::") };
        fib.add_route(unicast("fd00:9::/64", Hops::Paths(vec![on(3)])));
        fib.add_route(unicast("fd00:9::/64", Hops::Paths(vec![on(4)])));
        fib.remove_route(&unicast("fd00:9::/64", Hops::Paths(vec![on(3)])));
        assert_eq!(fib.connected(), vec![(p("fd00:9::/64"), 4)], "the other device's connected route stays");
    }

    /// A port loses carrier: the kernel drops its nexthop objects from
    /// their groups and takes routes on an emptied group with them, with
    /// no netlink message; the mirror does the same (the churn soak's
    /// leaves otherwise kept sending half their flows into the cut link).
    #[test]
    fn a_link_without_carrier_takes_its_nexthop_objects_as_the_kernel_does() {
        let mut fib = fib_with_links();
        fib.nexthops.insert(12, NexthopObject::Single { path: Some(via(1, "10.0.1.2")), blackhole: false });
        fib.nexthops.insert(13, NexthopObject::Single { path: Some(via(2, "10.0.2.2")), blackhole: false });
        fib.nexthops.insert(14, NexthopObject::Group { members: vec![(12, 1), (13, 1)] });
        fib.nexthops.insert(15, NexthopObject::Group { members: vec![(12, 1)] });
        fib.add_route(unicast("10.98.0.0/16", Hops::Object(14)));
        fib.add_route(unicast("10.99.0.0/16", Hops::Object(15)));
        fib.add_route(unicast("10.97.0.0/16", Hops::Object(13)));
        let changed = fib.flush_nexthops_of(1);
        assert_eq!(changed, BTreeSet::from([p("10.98.0.0/16"), p("10.99.0.0/16")]));
        assert!(!fib.nexthops.contains_key(&12) && !fib.nexthops.contains_key(&15), "gone: 12 and its emptied group");
        let Some(Target::Hops(hops)) = fib.target(&p("10.98.0.0/16")) else { panic!() };
        assert_eq!(hops.iter().map(|h| h.oif).collect::<Vec<_>>(), vec![2], "the group keeps its other member");
        assert_eq!(fib.target(&p("10.99.0.0/16")), None, "the route on the emptied group is gone");
        assert!(fib.target(&p("10.97.0.0/16")).is_some(), "a route on the other port stays");
        assert!(fib.flush_nexthops_of(1).is_empty(), "a second flush changes nothing");
    }

    #[test]
    fn what_goes_to_the_kernel() {
        let mut fib = fib_with_links();
        fib.add_route(KernelRoute {
            prefix: p("10.66.0.0/16"),
            metric: 0,
            kind: RouteKind::Reject,
            hops: Hops::Paths(vec![]),
        });
        fib.add_route(unicast("10.67.0.0/16", Hops::Paths(vec![via(9, "10.9.9.9")])));
        fib.add_route(unicast("10.68.0.0/16", Hops::Paths(vec![Path { encap: true, ..via(1, "10.0.1.2") }])));
        fib.add_route(unicast("10.69.0.0/16", Hops::Object(77)));
        assert_eq!(fib.target(&p("10.66.0.0/16")), Some(Target::Kernel(KernelReason::Reject)));
        assert_eq!(fib.target(&p("10.67.0.0/16")), Some(Target::Kernel(KernelReason::Device)));
        assert_eq!(fib.target(&p("10.68.0.0/16")), Some(Target::Kernel(KernelReason::Encap)));
        assert_eq!(fib.target(&p("10.69.0.0/16")), Some(Target::Kernel(KernelReason::MissingNexthop)));
        assert_eq!(fib.target(&p("fe80::/64")), None);
    }

    #[test]
    fn lowest_metric_wins_and_delete_restores_the_next() {
        let mut fib = fib_with_links();
        let primary = unicast("10.9.0.0/16", Hops::Paths(vec![via(1, "10.0.1.2")]));
        let backup = KernelRoute { metric: 100, ..unicast("10.9.0.0/16", Hops::Paths(vec![via(2, "10.0.2.2")])) };
        fib.add_route(backup);
        fib.add_route(primary.clone());
        let Some(Target::Hops(hops)) = fib.target(&p("10.9.0.0/16")) else { panic!() };
        assert_eq!(hops[0].oif, 1);
        fib.remove_route(&primary);
        let Some(Target::Hops(hops)) = fib.target(&p("10.9.0.0/16")) else { panic!() };
        assert_eq!(hops[0].oif, 2);
    }

    #[test]
    fn neighbours_on_connected_subnets_become_host_entries() {
        let mut fib = fib_with_links();
        fib.add_route(unicast("10.0.1.0/24", Hops::Paths(vec![Path { gateway: None, ..via(3, "0.0.0.0") }])));
        fib.neighbours.insert((3, ip("10.0.1.7")), [2, 1, 1, 1, 1, 7]);
        fib.neighbours.insert((3, ip("10.0.1.254")), [2, 1, 1, 1, 1, 8]);
        fib.neighbours.insert((4, ip("10.0.1.9")), [2, 1, 1, 1, 1, 9]); // other interface
        fib.neighbours.insert((3, ip("10.5.0.1")), [2, 1, 1, 1, 1, 10]); // not in the subnet
        fib.local.insert(ip("10.0.1.254"));
        let hosts = fib.host_entries();
        assert_eq!(hosts.keys().copied().collect::<Vec<_>>(), vec![p("10.0.1.7/32")]);
        assert_eq!(fib.target(&p("10.0.1.0/24")), Some(Target::Kernel(KernelReason::Connected)));
    }
}
