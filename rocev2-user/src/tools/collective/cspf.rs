//! Centralized traffic engineering's path computation: CSPF (constrained
//! shortest path first) over a fabric's directed links, for a traffic
//! matrix of flows (one per QP) with the rate each needs.
//!
//! Flows are placed one at a time, the largest first (ties in the order
//! given). A flow takes one of the shortest (fewest-hop) paths between its
//! hosts: the least loaded one, i.e. the lowest busiest-link utilization
//! after adding it, then the lowest total utilization, then the first in
//! edge order. When even that path lacks the capacity the flow needs, the
//! flow still takes it and is reported as not fitting. This is what a
//! controller like Meta's for its smaller clusters computes; the lab
//! installs the result as `[[pin]]`s (`rocev2 lab te`), and recomputes on
//! the graph without a failed link.
//!
//! The search is a dynamic program over the shortest-path DAG (the
//! busiest link first, then the sum among the paths that achieve it), so
//! a flow costs the DAG's edges, not the number of its paths: a 3-tier
//! Clos of 32,768 hosts has thousands of paths between two zones.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::tools::fabric::{Fabric, Hop, LinkId, Switch};

/// A vertex: a host NIC or a switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Node {
    Host(u32, u32),
    Switch(Switch),
}

/// One direction of one link.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Edge {
    pub from: Node,
    pub to: Node,
    /// The switch link (its sender and port); `None` for a host's uplink.
    pub link: Option<LinkId>,
    /// The link by its numbers (the simulator's key for it).
    pub hop: Hop,
    /// Bytes (or any unit the demands use) per second.
    pub capacity: f64,
}

impl Edge {
    /// `l1/s1p1`, or `r1h1/eth0` for a host's uplink.
    pub fn name(&self) -> String {
        self.hop.to_string()
    }
}

/// The directed links of a fabric.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Graph {
    pub edges: Vec<Edge>,
}

impl Graph {
    /// Every link of `f` (host uplinks and downlinks, leaf-spine,
    /// spine-aggregation) in both directions, each of `capacity`.
    pub fn fabric(f: &Fabric, capacity: f64) -> Self {
        let mut edges = Vec::new();
        let mut both = |a: Node, b: Node, ab: Hop, ba: Hop| {
            edges.push(Edge { from: a, to: b, link: ab.link_id(), hop: ab, capacity });
            edges.push(Edge { from: b, to: a, link: ba.link_id(), hop: ba, capacity });
        };
        for r in 1..=f.racks {
            let leaf = Switch::Leaf(r);
            for i in 1..=f.hosts {
                both(
                    Node::Host(r, i),
                    Node::Switch(leaf),
                    Hop::HostUp { rack: r, host: i },
                    Hop::LeafDown { rack: r, host: i },
                );
            }
            for (j, k) in f.uplinks(r) {
                both(
                    Node::Switch(leaf),
                    Node::Switch(Switch::Spine(j)),
                    Hop::LeafUp { rack: r, spine: j, link: k },
                    Hop::SpineDown { spine: j, rack: r, link: k },
                );
            }
        }
        for j in 1..=f.spines {
            for a in 1..=f.aggs {
                both(
                    Node::Switch(Switch::Spine(j)),
                    Node::Switch(Switch::Agg(a)),
                    Hop::SpineUp { spine: j, agg: a },
                    Hop::AggDown { agg: a, spine: j },
                );
            }
        }
        Self { edges }
    }

    /// The index of the edge `switch` sends on through `port`.
    pub fn edge_of(&self, switch: Switch, port: &str) -> Option<usize> {
        self.edges.iter().position(|e| e.link.as_ref().is_some_and(|l| l.switch == switch && l.port == port))
    }

    /// Every fewest-hop path from `src` to `dst` over the edges not in
    /// `down`, as edge indexes, in edge order (small fabrics: their number
    /// grows with every tier's width).
    pub fn shortest_paths(&self, src: Node, dst: Node, down: &[usize]) -> Vec<Vec<usize>> {
        let a = Adjacency::new(self, down);
        let (Some(&s), Some(&d)) = (a.index.get(&src), a.index.get(&dst)) else { return Vec::new() };
        let full = a.distances_to(d);
        let dist = Distances { dst: d, kind: Kind::Full(&full) };
        let mut out = Vec::new();
        let mut stack: Vec<(usize, Vec<usize>)> = vec![(s, Vec::new())];
        while let Some((n, path)) = stack.pop() {
            if n == d {
                out.push(path);
                continue;
            }
            let next: Vec<usize> = a.dag_out(n, &dist).collect();
            for &e in next.iter().rev() {
                let mut p = path.clone();
                p.push(e);
                stack.push((a.to[e], p));
            }
        }
        out
    }
}

/// Where [`Graph::fabric`] puts each link: a [`Hop`]'s edge index by
/// arithmetic on the fabric's shape (the simulator looks up millions).
#[derive(Clone, Debug)]
pub struct HopIndex {
    hosts: u32,
    racks: u32,
    zone_spines: u32,
    zone_racks: u32,
    aggs: u32,
    links: u32,
}

impl HopIndex {
    pub fn new(f: &Fabric) -> Self {
        Self {
            hosts: f.hosts,
            racks: f.racks,
            zone_spines: f.zone_spines(),
            zone_racks: f.zone_racks(),
            aggs: f.aggs,
            links: f.links,
        }
    }

    /// The edge index of `hop` in `Graph::fabric(f, ..)` for the `f` this was made from.
    pub fn of(&self, hop: Hop) -> usize {
        // Edges of one rack: its hosts' two directions, then its uplinks'.
        let block = 2 * self.hosts + 2 * self.zone_spines * self.links;
        let uplink = |rack: u32, spine: u32, link: u32| {
            // Fabric::uplinks: link 1 of every spine of the zone, then link 2, ...
            let first = (rack - 1) / self.zone_racks * self.zone_spines + 1;
            (rack - 1) * block + 2 * self.hosts + 2 * ((link - 1) * self.zone_spines + spine - first)
        };
        let i = match hop {
            Hop::HostUp { rack, host } => (rack - 1) * block + 2 * (host - 1),
            Hop::LeafDown { rack, host } => (rack - 1) * block + 2 * (host - 1) + 1,
            Hop::LeafUp { rack, spine, link } => uplink(rack, spine, link),
            Hop::SpineDown { spine, rack, link } => uplink(rack, spine, link) + 1,
            Hop::SpineUp { spine, agg } => self.racks * block + 2 * ((spine - 1) * self.aggs + agg - 1),
            Hop::AggDown { agg, spine } => self.racks * block + 2 * ((spine - 1) * self.aggs + agg - 1) + 1,
        };
        i as usize
    }
}

/// The usable edges of a graph as adjacency lists over numbered nodes.
struct Adjacency {
    index: HashMap<Node, usize>,
    is_host: Vec<bool>,
    /// Per node, its number among the switches (`NOT_A_SWITCH` for a host).
    slot: Vec<u32>,
    switches: usize,
    /// Per node, its usable out-edges in edge order.
    out: Vec<Vec<usize>>,
    /// Per node, the nodes with a usable edge into it.
    preds: Vec<Vec<usize>>,
    /// Per node, its usable out-edges as (target, edge), sorted: the edges
    /// to one node are found by binary search.
    out_by_target: Vec<Vec<(usize, usize)>>,
    /// Per switch (by number), the switches with a usable edge into it.
    switch_preds: Vec<Vec<u32>>,
    to: Vec<usize>,
}

const UNREACHED: u32 = u32::MAX;
const NOT_A_SWITCH: u32 = u32::MAX;

/// Hops from every node to one destination.
struct Distances<'a> {
    dst: usize,
    kind: Kind<'a>,
}

enum Kind<'a> {
    /// Per node ([`Adjacency::distances_to`]).
    Full(&'a [u32]),
    /// Through the destination's one switch (the first): per switch, hops
    /// to it ([`Adjacency::switch_distances_to`]).
    Attached(usize, &'a [u8]),
}

impl Distances<'_> {
    fn get(&self, a: &Adjacency, n: usize) -> u32 {
        if n == self.dst {
            return 0;
        }
        match self.kind {
            Kind::Full(d) => d[n],
            Kind::Attached(_, d) => match a.slot[n] {
                // A host (a source): one hop more than its best switch.
                NOT_A_SWITCH => a.out[n]
                    .iter()
                    .map(|&e| a.to[e])
                    .filter(|&t| a.slot[t] != NOT_A_SWITCH)
                    .map(|t| self.get(a, t))
                    .min()
                    .filter(|&d| d != UNREACHED)
                    .map_or(UNREACHED, |d| d + 1),
                s => match d[s as usize] {
                    u8::MAX => UNREACHED,
                    h => u32::from(h) + 1,
                },
            },
        }
    }
}

impl Adjacency {
    fn new(g: &Graph, down: &[usize]) -> Self {
        let mut index = HashMap::new();
        let mut is_host = Vec::new();
        let mut id = |n: Node| {
            *index.entry(n).or_insert_with(|| {
                is_host.push(matches!(n, Node::Host(..)));
                is_host.len() - 1
            })
        };
        let ends: Vec<(usize, usize)> = g.edges.iter().map(|e| (id(e.from), id(e.to))).collect();
        let mut out = vec![Vec::new(); is_host.len()];
        let mut preds = vec![Vec::new(); is_host.len()];
        let mut down_set = vec![false; ends.len()];
        for &e in down {
            if let Some(d) = down_set.get_mut(e) {
                *d = true;
            }
        }
        for (e, &(from, to)) in ends.iter().enumerate() {
            if !down_set[e] {
                out[from].push(e);
                preds[to].push(from);
            }
        }
        let out_by_target = out
            .iter()
            .map(|edges| {
                let mut v: Vec<(usize, usize)> = edges.iter().map(|&e| (ends[e].1, e)).collect();
                v.sort_unstable();
                v
            })
            .collect();
        let mut switches = 0;
        let slot = is_host
            .iter()
            .map(|&h| {
                if h {
                    NOT_A_SWITCH
                } else {
                    switches += 1;
                    switches as u32 - 1
                }
            })
            .collect();
        let slot: Vec<u32> = slot;
        let mut switch_preds = vec![Vec::new(); switches];
        for (n, p) in preds.iter().enumerate() {
            if slot[n] != NOT_A_SWITCH {
                switch_preds[slot[n] as usize] = p.iter().map(|&q| slot[q]).filter(|&q| q != NOT_A_SWITCH).collect();
            }
        }
        let to = ends.iter().map(|&(_, t)| t).collect();
        Self { index, is_host, slot, switches, out, preds, out_by_target, switch_preds, to }
    }

    /// Hops from every switch to the switch `x`, by switch number; a
    /// fabric's hosts hang off one switch each, so this serves every host
    /// behind `x` (a ring has a destination per host, a fabric a few
    /// hosts per switch).
    fn switch_distances_to(&self, x: usize) -> Vec<u8> {
        let mut dist = vec![u8::MAX; self.switches];
        let start = self.slot[x];
        dist[start as usize] = 0;
        let mut queue = VecDeque::from([start]);
        while let Some(n) = queue.pop_front() {
            let d = dist[n as usize];
            for &p in &self.switch_preds[n as usize] {
                if dist[p as usize] == u8::MAX {
                    dist[p as usize] = d + 1;
                    queue.push_back(p);
                }
            }
        }
        dist
    }

    /// The switch a host hangs off, when it has exactly one usable link in.
    fn attachment(&self, host: usize) -> Option<usize> {
        // preds holds one entry per usable edge in.
        match self.preds[host].as_slice() {
            [only] if self.slot[*only] != NOT_A_SWITCH => Some(*only),
            _ => None,
        }
    }

    /// Hops from every node to `target`, walking edges backwards; a host
    /// is an end, never a node a path passes through.
    fn distances_to(&self, target: usize) -> Vec<u32> {
        let mut dist = vec![UNREACHED; self.out.len()];
        dist[target] = 0;
        let mut queue = VecDeque::from([target]);
        while let Some(n) = queue.pop_front() {
            if n != target && self.is_host[n] {
                continue;
            }
            for &p in &self.preds[n] {
                if dist[p] == UNREACHED {
                    dist[p] = dist[n] + 1;
                    queue.push_back(p);
                }
            }
        }
        dist
    }

    /// The out-edges of `n` on a fewest-hop path to `dist`'s destination.
    fn dag_out<'a>(&'a self, n: usize, dist: &'a Distances<'a>) -> DagOut<'a> {
        let here = dist.get(self, n);
        // Two hops from a host behind switch x: the edges to x, looked up
        // rather than found among a spine's hundreds of others.
        if let (2, Kind::Attached(x, _)) = (here, &dist.kind) {
            let all = &self.out_by_target[n];
            let first = all.partition_point(|&(t, _)| t < *x);
            let count = all[first..].iter().take_while(|&&(t, _)| t == *x).count();
            return DagOut { a: self, dist, here, edges: Edges::Direct(all[first..first + count].iter()) };
        }
        DagOut { a: self, dist, here, edges: Edges::Scan(self.out[n].iter()) }
    }
}

/// The out-edges of a node on a fewest-hop path ([`Adjacency::dag_out`]).
struct DagOut<'a> {
    a: &'a Adjacency,
    dist: &'a Distances<'a>,
    here: u32,
    edges: Edges<'a>,
}

enum Edges<'a> {
    /// The answer already, as (target, edge).
    Direct(std::slice::Iter<'a, (usize, usize)>),
    /// Every out-edge, to filter.
    Scan(std::slice::Iter<'a, usize>),
}

impl Iterator for DagOut<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.here == UNREACHED {
            return None;
        }
        let edges = match &mut self.edges {
            Edges::Direct(edges) => return edges.next().map(|&(_, e)| e),
            Edges::Scan(edges) => edges,
        };
        edges.by_ref().copied().find(|&e| {
            let t = self.a.to[e];
            (t == self.dist.dst || !self.a.is_host[t]) && self.dist.get(self.a, t).checked_add(1) == Some(self.here)
        })
    }
}

/// A flow to place: `load` per second from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Demand {
    pub src: Node,
    pub dst: Node,
    pub load: f64,
}

/// What [`cspf`] placed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Routing {
    /// Per demand (in the order given): its path's edges, or `None` when
    /// no path is left (a failure cut the hosts apart).
    pub paths: Vec<Option<Vec<usize>>>,
    /// Per demand: whether its path had the capacity it needed.
    pub fits: Vec<bool>,
    /// Per edge: the load placed on it.
    pub load: Vec<f64>,
}

impl Routing {
    /// The busiest edge's load over its capacity.
    pub fn max_utilization(&self, g: &Graph) -> f64 {
        self.load.iter().zip(&g.edges).map(|(l, e)| l / e.capacity).fold(0.0, f64::max)
    }
}

/// Utilizations within this (relative) count as equal.
const EPS: f64 = 1e-9;

/// Places every demand on `g` without the edges in `down` (see the module).
pub fn cspf(g: &Graph, demands: &[Demand], down: &[usize]) -> Routing {
    let a = Adjacency::new(g, down);
    let mut load = vec![0.0; g.edges.len()];
    let mut paths = vec![None; demands.len()];
    let mut fits = vec![false; demands.len()];
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&x, &y| demands[y].load.total_cmp(&demands[x].load).then(x.cmp(&y)));
    // Distances to a destination's switch, by switch; to other destinations, by destination.
    let mut by_switch: HashMap<usize, Vec<u8>> = HashMap::new();
    let mut by_node: HashMap<usize, Vec<u32>> = HashMap::new();
    let mut search = Search::new(a.out.len());
    for i in order {
        let d = demands[i];
        let (Some(&src), Some(&dst)) = (a.index.get(&d.src), a.index.get(&d.dst)) else { continue };
        let dist = match a.attachment(dst) {
            Some(x) => Distances {
                dst,
                kind: Kind::Attached(x, by_switch.entry(x).or_insert_with(|| a.switch_distances_to(x))),
            },
            None => Distances { dst, kind: Kind::Full(by_node.entry(dst).or_insert_with(|| a.distances_to(dst))) },
        };
        if dist.get(&a, src) == UNREACHED || src == dst {
            continue;
        }
        let after = |e: usize| (load[e] + d.load) / g.edges[e].capacity;
        let p = search.least_loaded(&a, src, &dist, after);
        fits[i] = p.iter().all(|&e| load[e] + d.load <= g.edges[e].capacity * (1.0 + EPS));
        for &e in &p {
            load[e] += d.load;
        }
        paths[i] = Some(p);
    }
    Routing { paths, fits, load }
}

/// The memo of one flow's dynamic program, reused from flow to flow.
struct Search {
    /// Per node: the stamp of the flow that computed `worst` and `total`.
    stamp: Vec<u32>,
    /// Lowest busiest-link utilization from the node to the destination.
    worst: Vec<f64>,
    /// Lowest sum of utilizations among the paths that achieve the flow's `worst`.
    total: Vec<f64>,
    total_stamp: Vec<u32>,
    now: u32,
}

impl Search {
    fn new(nodes: usize) -> Self {
        Self {
            stamp: vec![0; nodes],
            worst: vec![0.0; nodes],
            total: vec![0.0; nodes],
            total_stamp: vec![0; nodes],
            now: 0,
        }
    }

    /// The fewest-hop path of least (busiest, total) utilization after
    /// adding the flow, the first in edge order among equals.
    fn least_loaded(
        &mut self,
        a: &Adjacency,
        src: usize,
        dist: &Distances,
        after: impl Fn(usize) -> f64 + Copy,
    ) -> Vec<usize> {
        let dst = dist.dst;
        self.now += 1;
        (self.worst[dst], self.total[dst]) = (0.0, 0.0);
        let best = self.worst(a, src, dist, after);
        let limit = best + EPS * best.max(1.0);
        self.total(a, src, dist, after, limit);
        let mut path = Vec::new();
        let mut n = src;
        while n != dst {
            let e = a
                .dag_out(n, dist)
                .find(|&e| {
                    let t = a.to[e];
                    let u = after(e);
                    u <= limit
                        && self.worst[t] <= limit
                        && (u + self.total[t] - self.total[n]).abs() <= EPS * self.total[n].max(1.0)
                })
                .expect("the search found a path through this node");
            path.push(e);
            n = a.to[e];
        }
        path
    }

    fn worst(&mut self, a: &Adjacency, n: usize, dist: &Distances, after: impl Fn(usize) -> f64 + Copy) -> f64 {
        if n == dist.dst {
            return 0.0;
        }
        if self.stamp[n] == self.now {
            return self.worst[n];
        }
        let mut best = f64::INFINITY;
        for e in a.dag_out(n, dist) {
            best = best.min(after(e).max(self.worst(a, a.to[e], dist, after)));
        }
        self.stamp[n] = self.now;
        self.worst[n] = best;
        best
    }

    fn total(
        &mut self,
        a: &Adjacency,
        n: usize,
        dist: &Distances,
        after: impl Fn(usize) -> f64 + Copy,
        limit: f64,
    ) -> f64 {
        if n == dist.dst {
            return 0.0;
        }
        if self.total_stamp[n] == self.now {
            return self.total[n];
        }
        let mut best = f64::INFINITY;
        for e in a.dag_out(n, dist) {
            let t = a.to[e];
            if after(e) <= limit && self.worst[t] <= limit {
                best = best.min(after(e) + self.total(a, t, dist, after, limit));
            }
        }
        self.total_stamp[n] = self.now;
        self.total[n] = best;
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::fabric::SeedPlan;
    use rocev2_common::hash::HashMode;

    fn fabric(racks: u32, hosts: u32, spines: u32) -> Fabric {
        Fabric {
            racks,
            hosts,
            spines,
            links: 1,
            zones: 1,
            aggs: 0,
            v4: true,
            v6: false,
            hash: HashMode::Qp,
            hash_version: rocev2_common::hash::HashVersion::V1,
            seeds: SeedPlan::Auto,
        }
    }

    #[test]
    fn cspf_spreads_flows_over_the_spines_and_reports_what_does_not_fit() {
        let f = fabric(2, 2, 2);
        let g = Graph::fabric(&f, 10.0);
        let paths = g.shortest_paths(Node::Host(1, 1), Node::Host(2, 1), &[]);
        assert_eq!(paths.len(), 2, "one path per spine");
        assert!(paths.iter().all(|p| p.len() == 4));
        let same_rack = g.shortest_paths(Node::Host(1, 1), Node::Host(1, 2), &[]);
        assert_eq!(same_rack.len(), 1);
        assert_eq!(same_rack[0].len(), 2);
        let d =
            |a: (u32, u32), b: (u32, u32), load| Demand { src: Node::Host(a.0, a.1), dst: Node::Host(b.0, b.1), load };
        // Two flows out of rack 1 at the full link rate: one per spine.
        let r = cspf(&g, &[d((1, 1), (2, 1), 10.0), d((1, 2), (2, 2), 10.0)], &[]);
        assert_eq!(r.fits, [true, true]);
        let up = |p: &Vec<usize>| g.edges[p[1]].name();
        let ups: Vec<String> = r.paths.iter().map(|p| up(p.as_ref().unwrap())).collect();
        assert_eq!(ups, ["l1/s1p1", "l1/s2p1"]);
        assert!((r.max_utilization(&g) - 1.0).abs() < 1e-9);
        // With spine 1's uplink from l1 down, both share s2: the second does not fit.
        let down = g.edge_of(Switch::Leaf(1), "s1p1").unwrap();
        let r = cspf(&g, &[d((1, 1), (2, 1), 10.0), d((1, 2), (2, 2), 10.0)], &[down]);
        assert_eq!(r.fits, [true, false]);
        assert!(r.paths.iter().all(|p| p.as_ref().unwrap().iter().all(|&e| e != down)));
        assert!((r.max_utilization(&g) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn cspf_places_larger_flows_first_and_crosses_zones_through_aggregation() {
        let f = Fabric { racks: 4, spines: 4, zones: 2, aggs: 2, ..fabric(4, 1, 4) };
        let g = Graph::fabric(&f, 20.0);
        let p = g.shortest_paths(Node::Host(1, 1), Node::Host(3, 1), &[]);
        // leaf -> 2 spines of zone 1 -> 2 aggs -> 2 spines of zone 2 -> leaf
        assert_eq!(p.len(), 8);
        assert!(p.iter().all(|p| p.len() == 6));
        let d = |load| Demand { src: Node::Host(1, 1), dst: Node::Host(3, 1), load };
        let r = cspf(&g, &[d(1.0), d(6.0), d(6.0)], &[]);
        // The two big flows take disjoint spines; the small one joins the less loaded.
        let first_hop = |i: usize| r.paths[i].as_ref().unwrap()[1];
        assert_ne!(first_hop(1), first_hop(2));
        assert!(r.fits.iter().all(|f| *f));
    }

    #[test]
    fn cspf_hop_index_is_the_graphs_edge_order() {
        for f in
            [fabric(2, 3, 2), Fabric { racks: 4, hosts: 2, spines: 4, zones: 2, aggs: 3, links: 2, ..fabric(4, 2, 4) }]
        {
            let g = Graph::fabric(&f, 1.0);
            let index = HopIndex::new(&f);
            for (i, e) in g.edges.iter().enumerate() {
                assert_eq!(index.of(e.hop), i, "{}", e.name());
            }
        }
    }

    #[test]
    fn cspf_search_equals_trying_every_path() {
        // Uneven loads on a two-zone fabric: the dynamic program picks what
        // scoring every fewest-hop path would (busiest, then total, then order).
        let f = Fabric { racks: 4, hosts: 2, spines: 4, zones: 2, aggs: 2, links: 2, ..fabric(4, 2, 4) };
        let mut g = Graph::fabric(&f, 10.0);
        for (i, e) in g.edges.iter_mut().enumerate() {
            e.capacity = 5.0 + (i * 7 % 11) as f64;
        }
        let hosts: Vec<Node> = (1..=4).flat_map(|r| (1..=2).map(move |i| Node::Host(r, i))).collect();
        let demands: Vec<Demand> = (0..40)
            .map(|k| Demand { src: hosts[k % 8], dst: hosts[(k * 3 + 1) % 8], load: 1.0 + (k % 5) as f64 })
            .filter(|d| d.src != d.dst)
            .collect();
        let r = cspf(&g, &demands, &[]);
        // Replay the placement, scoring every path at each flow's turn.
        let mut load = vec![0.0; g.edges.len()];
        let mut order: Vec<usize> = (0..demands.len()).collect();
        order.sort_by(|&x, &y| demands[y].load.total_cmp(&demands[x].load).then(x.cmp(&y)));
        for i in order {
            let d = demands[i];
            let score = |p: &Vec<usize>| {
                let u: Vec<f64> = p.iter().map(|&e| (load[e] + d.load) / g.edges[e].capacity).collect();
                (u.iter().copied().fold(0.0, f64::max), u.iter().sum::<f64>())
            };
            let paths = g.shortest_paths(d.src, d.dst, &[]);
            let best = paths
                .iter()
                .min_by(|a, b| {
                    let ((ma, sa), (mb, sb)) = (score(a), score(b));
                    ma.total_cmp(&mb).then(sa.total_cmp(&sb))
                })
                .unwrap();
            let got = r.paths[i].as_ref().unwrap();
            assert_eq!(score(got), score(best), "demand {i}");
            for &e in got {
                load[e] += d.load;
            }
        }
        assert_eq!(load, r.load);
    }
}
