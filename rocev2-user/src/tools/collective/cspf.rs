//! Centralized traffic engineering's path computation: CSPF (constrained
//! shortest path first) over a fabric's directed links, for a traffic
//! matrix of flows (one per QP) with the rate each needs.
//!
//! Flows are placed one at a time, the largest first (ties in the order
//! given). A flow takes one of the shortest (fewest-hop) paths between its
//! hosts: among those whose every link still has the capacity it needs,
//! the least loaded one (the lowest busiest-link utilization after adding
//! it, then the lowest total); when none has room, the least loaded of all,
//! and the flow is reported as not fitting. This is what a controller like
//! Meta's for its smaller clusters computes; the lab installs the result as
//! `[[pin]]`s (`rocev2 lab te`), and recomputes on the graph without a
//! failed link.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::tools::fabric::{Fabric, LinkId, Switch, Tier};

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
    /// Bytes (or any unit the demands use) per second.
    pub capacity: f64,
}

impl Edge {
    /// `l1/s1p1`, or `r1h1/eth0` for a host's uplink.
    pub fn name(&self) -> String {
        match (&self.link, self.from) {
            (Some(l), _) => l.to_string(),
            (None, Node::Host(r, i)) => format!("r{r}h{i}/eth0"),
            (None, n) => format!("{n:?}"),
        }
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
        let mut both = |a: Node, b: Node, ab: Option<LinkId>, ba: Option<LinkId>| {
            edges.push(Edge { from: a, to: b, link: ab, capacity });
            edges.push(Edge { from: b, to: a, link: ba, capacity });
        };
        let link = |tier, switch, port: String| Some(LinkId { tier, switch, port });
        for r in 1..=f.racks {
            let leaf = Switch::Leaf(r);
            for i in 1..=f.hosts {
                both(Node::Host(r, i), Node::Switch(leaf), None, link(Tier::LeafDown, leaf, Fabric::host_port(i)));
            }
            for (j, k) in f.uplinks(r) {
                let spine = Switch::Spine(j);
                both(
                    Node::Switch(leaf),
                    Node::Switch(spine),
                    link(Tier::LeafUp, leaf, Fabric::uplink_port(j, k)),
                    link(Tier::SpineDown, spine, Fabric::downlink_port(r, k)),
                );
            }
        }
        for j in 1..=f.spines {
            for a in 1..=f.aggs {
                let (spine, agg) = (Switch::Spine(j), Switch::Agg(a));
                both(
                    Node::Switch(spine),
                    Node::Switch(agg),
                    link(Tier::SpineUp, spine, Fabric::agg_port(a)),
                    link(Tier::AggDown, agg, Fabric::spine_port(j)),
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
    /// `down`, as edge indexes, in a stable order.
    pub fn shortest_paths(&self, src: Node, dst: Node, down: &[usize]) -> Vec<Vec<usize>> {
        let usable = |e: usize| !down.contains(&e);
        // Hop distance of every node to dst (edges walked backwards).
        let mut dist: BTreeMap<Node, usize> = BTreeMap::from([(dst, 0)]);
        let mut queue = VecDeque::from([dst]);
        while let Some(n) = queue.pop_front() {
            let d = dist[&n];
            for (i, e) in self.edges.iter().enumerate() {
                if e.to == n && usable(i) && !dist.contains_key(&e.from) {
                    dist.insert(e.from, d + 1);
                    queue.push_back(e.from);
                }
            }
        }
        let mut out = Vec::new();
        let mut stack: Vec<(Node, Vec<usize>)> = vec![(src, Vec::new())];
        if !dist.contains_key(&src) {
            return out;
        }
        while let Some((n, path)) = stack.pop() {
            if n == dst {
                out.push(path);
                continue;
            }
            let d = dist[&n];
            // Hosts only send and receive: a path never passes through one.
            let next: Vec<usize> = (0..self.edges.len())
                .filter(|&i| {
                    let e = &self.edges[i];
                    e.from == n
                        && usable(i)
                        && dist.get(&e.to) == Some(&(d - 1))
                        && (e.to == dst || matches!(e.to, Node::Switch(_)))
                })
                .collect();
            for &i in next.iter().rev() {
                let mut p = path.clone();
                p.push(i);
                stack.push((self.edges[i].to, p));
            }
        }
        out
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

/// Places every demand on `g` without the edges in `down` (see the module).
pub fn cspf(g: &Graph, demands: &[Demand], down: &[usize]) -> Routing {
    let mut load = vec![0.0; g.edges.len()];
    let mut paths = vec![None; demands.len()];
    let mut fits = vec![false; demands.len()];
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| demands[b].load.total_cmp(&demands[a].load).then(a.cmp(&b)));
    let mut candidates: BTreeMap<(Node, Node), Vec<Vec<usize>>> = BTreeMap::new();
    for i in order {
        let d = demands[i];
        let options = candidates.entry((d.src, d.dst)).or_insert_with(|| g.shortest_paths(d.src, d.dst, down));
        // (room for it, busiest utilization after, total utilization after, index)
        let score = |p: &Vec<usize>| {
            let room = p.iter().all(|&e| load[e] + d.load <= g.edges[e].capacity * (1.0 + 1e-9));
            let after: Vec<f64> = p.iter().map(|&e| (load[e] + d.load) / g.edges[e].capacity).collect();
            (room, after.iter().copied().fold(0.0, f64::max), after.iter().sum::<f64>())
        };
        let best = options.iter().enumerate().min_by(|(ia, a), (ib, b)| {
            let (ra, ma, sa) = score(a);
            let (rb, mb, sb) = score(b);
            rb.cmp(&ra).then(ma.total_cmp(&mb)).then(sa.total_cmp(&sb)).then(ia.cmp(ib))
        });
        if let Some((_, p)) = best {
            fits[i] = score(p).0;
            for &e in p {
                load[e] += d.load;
            }
            paths[i] = Some(p.clone());
        }
    }
    Routing { paths, fits, load }
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
}
