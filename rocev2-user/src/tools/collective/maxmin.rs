//! Max-min fair sharing of link rates among flows (progressive filling),
//! and the fluid completion time of flows that share links.
//!
//! **Max-min fairness** (Bertsekas and Gallager, *Data Networks*, 6.5.2):
//! raise every flow's rate together; when a link is full, the flows that
//! cross it keep the rate they reached; continue with the others. Each
//! link's "level" is what its unfrozen flows would get if it were the next
//! to fill, `(capacity - rate of its frozen flows) / unfrozen flows`; the
//! lowest level fills next, so a heap of levels gives every rate in
//! O(flows x hops x log links) at worst, with no iteration over the rate.
//!
//! **Completion** ([`completion`]): the flows run at their max-min rates
//! until the first ones finish, the rates are recomputed for the rest, and
//! so on (a fluid model: no packets, queues or transport). When every flow
//! has the same bytes the answer has a closed form, which
//! [`equal_completion`] gives without the events: the first link to fill
//! holds the slowest flows, no flow ever runs slower than that first level
//! (a link's level only rises as its flows leave), and the flows on that
//! link finish together, so the last finish is `bytes / level`, the
//! busiest link's `bytes x flows / capacity`.

use std::{cmp::Reverse, collections::BinaryHeap};

/// Flows as the links they cross (link indexes into a capacity vector).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Flows {
    /// Flow f crosses `links[starts[f]..starts[f + 1]]`.
    starts: Vec<usize>,
    links: Vec<u32>,
}

impl Flows {
    pub fn new() -> Self {
        Self { starts: vec![0], links: Vec::new() }
    }

    /// Adds a flow over `path`; returns its index.
    pub fn push(&mut self, path: impl IntoIterator<Item = u32>) -> usize {
        self.links.extend(path);
        self.starts.push(self.links.len());
        self.starts.len() - 2
    }

    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn path(&self, f: usize) -> &[u32] {
        &self.links[self.starts[f]..self.starts[f + 1]]
    }

    /// Flows per link, for `links` links.
    pub fn counts(&self, links: usize) -> Vec<u32> {
        let mut n = vec![0u32; links];
        for &l in &self.links {
            n[l as usize] += 1;
        }
        n
    }
}

/// An f64 the heap can order (levels are finite and not NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Level(f64);
impl Eq for Level {}
impl PartialOrd for Level {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Level {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The max-min fair rate of every flow in `active` (indexes into `flows`;
/// the others get 0) over links of `capacity`. A flow that crosses no link
/// is unconstrained: `f64::INFINITY`.
pub fn max_min_rates(capacity: &[f64], flows: &Flows, active: &[usize]) -> Vec<f64> {
    let mut rate = vec![0.0; flows.len()];
    let mut unfrozen = vec![0u32; capacity.len()];
    let mut frozen_rate = vec![0.0f64; capacity.len()];
    // The active flows of each link (CSR).
    let mut start = vec![0usize; capacity.len() + 1];
    for &f in active {
        for &l in flows.path(f) {
            unfrozen[l as usize] += 1;
        }
    }
    for l in 0..capacity.len() {
        start[l + 1] = start[l] + unfrozen[l] as usize;
    }
    let mut fill = start.clone();
    let mut on_link = vec![0usize; start[capacity.len()]];
    for &f in active {
        if flows.path(f).is_empty() {
            rate[f] = f64::INFINITY;
        }
        for &l in flows.path(f) {
            on_link[fill[l as usize]] = f;
            fill[l as usize] += 1;
        }
    }
    let level = |l: usize, unfrozen: &[u32], frozen_rate: &[f64]| {
        ((capacity[l] - frozen_rate[l]) / f64::from(unfrozen[l])).max(0.0)
    };
    let mut done = vec![false; flows.len()];
    let mut heap: BinaryHeap<Reverse<(Level, usize)>> = (0..capacity.len())
        .filter(|&l| unfrozen[l] > 0)
        .map(|l| Reverse((Level(level(l, &unfrozen, &frozen_rate)), l)))
        .collect();
    // Each link with unfrozen flows has one entry, keyed by a level at or
    // below its current one (freezing flows only raises a link's level):
    // an entry found stale goes back with the current level, so the heap
    // stays as small as the links and a link is not pushed per update.
    while let Some(Reverse((Level(key), l))) = heap.pop() {
        if unfrozen[l] == 0 {
            continue;
        }
        let now = level(l, &unfrozen, &frozen_rate);
        // Still the lowest (ties are common: many links at one level)?
        // Then fill it now instead of a push and a pop.
        if key != now && heap.peek().is_some_and(|Reverse((Level(next), _))| *next < now) {
            heap.push(Reverse((Level(now), l)));
            continue;
        }
        let key = now;
        for &f in &on_link[start[l]..start[l + 1]] {
            if done[f] {
                continue;
            }
            done[f] = true;
            rate[f] = key;
            for &m in flows.path(f) {
                frozen_rate[m as usize] += key;
                unfrozen[m as usize] -= 1;
            }
        }
    }
    rate
}

/// When every flow has the same `bytes`: the time the last one finishes
/// (see the module), and the link that sets it.
pub fn equal_completion(capacity: &[f64], flows: &Flows, bytes: f64) -> (f64, Option<usize>) {
    let counts = flows.counts(capacity.len());
    let busiest = (0..capacity.len())
        .filter(|&l| counts[l] > 0)
        .max_by(|&a, &b| (f64::from(counts[a]) / capacity[a]).total_cmp(&(f64::from(counts[b]) / capacity[b])));
    (busiest.map_or(0.0, |l| bytes * f64::from(counts[l]) / capacity[l]), busiest)
}

/// What [`completion`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// When each flow finished.
    pub finish: Vec<f64>,
    /// When the last one did.
    pub makespan: f64,
    /// Rate recomputations (events).
    pub events: usize,
}

/// The fluid completion of `flows` that start together, flow f with
/// `bytes[f]` to move: max-min rates, recomputed whenever flows finish.
pub fn completion(capacity: &[f64], flows: &Flows, bytes: &[f64]) -> Completion {
    let mut left = bytes.to_vec();
    let mut finish = vec![0.0; flows.len()];
    let mut active: Vec<usize> = (0..flows.len()).filter(|&f| left[f] > 0.0).collect();
    let (mut now, mut events) = (0.0, 0);
    while !active.is_empty() {
        events += 1;
        let rate = max_min_rates(capacity, flows, &active);
        let dt = active.iter().map(|&f| left[f] / rate[f]).fold(f64::INFINITY, f64::min);
        if !dt.is_finite() {
            // Flows on a link of no capacity never finish.
            for &f in &active {
                finish[f] = f64::INFINITY;
            }
            now = f64::INFINITY;
            break;
        }
        now += dt;
        active.retain(|&f| {
            left[f] -= rate[f] * dt;
            // Done, up to rounding (relative to what the flow had to move).
            if left[f] <= bytes[f] * 1e-9 {
                finish[f] = now;
                false
            } else {
                true
            }
        });
    }
    Completion { finish, makespan: now, events }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flows(paths: &[&[u32]]) -> Flows {
        let mut f = Flows::new();
        for p in paths {
            f.push(p.iter().copied());
        }
        f
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn maxmin_textbook_network() {
        // Bertsekas & Gallager's example shape: links 0 (cap 1), 1 (cap 2),
        // 2 (cap 1). Flow 0 crosses 0 and 1, flow 1 crosses 0, flow 2
        // crosses 1 and 2, flow 3 crosses 2. By hand: link 0 fills at 1/2
        // (flows 0, 1), link 2 at 1/2 (flows 2, 3), link 1 has 2 - 1/2 - 1/2
        // = 1 left unused.
        let f = flows(&[&[0, 1], &[0], &[1, 2], &[2]]);
        let r = max_min_rates(&[1.0, 2.0, 1.0], &f, &[0, 1, 2, 3]);
        assert_eq!(r, [0.5, 0.5, 0.5, 0.5]);
        // With link 2 at capacity 3: link 0 fills first (1/2 each), then
        // link 1 has 2 - 1/2 = 3/2 for flow 2 alone, link 2 gives flow 3
        // the rest: 3 - 3/2 = 3/2.
        let r = max_min_rates(&[1.0, 2.0, 3.0], &f, &[0, 1, 2, 3]);
        assert!(r.iter().zip([0.5, 0.5, 1.5, 1.5]).all(|(a, b)| close(*a, b)), "{r:?}");
    }

    #[test]
    fn maxmin_three_levels_and_inactive_flows() {
        // Link 0 (cap 3): flows 0, 1, 2. Link 1 (cap 1): flows 1, 3.
        // Link 1 fills first at 1/2 (flows 1, 3); link 0 then gives flows 0
        // and 2 (3 - 1/2) / 2 = 5/4 each.
        let f = flows(&[&[0], &[0, 1], &[0], &[1], &[1]]);
        let r = max_min_rates(&[3.0, 1.0], &f, &[0, 1, 2, 3]);
        assert!(r.iter().zip([1.25, 0.5, 1.25, 0.5, 0.0]).all(|(a, b)| close(*a, b)), "{r:?}");
        // Every link's rate sums to at most its capacity; a saturated link
        // has no flow that could grow.
        let mut f = Flows::new();
        let caps: Vec<f64> = (0..6).map(|l| 1.0 + l as f64).collect();
        for k in 0..40u32 {
            f.push([k % 6, (k * 5 + 1) % 6].into_iter().collect::<std::collections::BTreeSet<u32>>());
        }
        let all: Vec<usize> = (0..f.len()).collect();
        let r = max_min_rates(&caps, &f, &all);
        let mut used = [0.0; 6];
        for (k, rate) in r.iter().enumerate() {
            for &l in f.path(k) {
                used[l as usize] += rate;
            }
        }
        for (k, rate) in r.iter().enumerate() {
            // Each flow has a bottleneck: a full link where no flow is faster.
            let bottleneck = f.path(k).iter().any(|&l| {
                let l = l as usize;
                close(used[l], caps[l])
                    && (0..f.len()).filter(|&g| f.path(g).contains(&(l as u32))).all(|g| r[g] <= rate + 1e-9)
            });
            assert!(bottleneck, "flow {k} at {rate} has no bottleneck");
        }
        assert!(used.iter().zip(&caps).all(|(u, c)| *u <= c + 1e-9));
    }

    #[test]
    fn completion_recomputes_rates_as_flows_finish() {
        // One link of 2: flow 0 moves 1, flow 1 moves 3. Both at 1 until
        // t = 1; then flow 1 alone at 2 for its last 2: done at t = 2.
        let f = flows(&[&[0], &[0]]);
        let c = completion(&[2.0], &f, &[1.0, 3.0]);
        assert!(close(c.finish[0], 1.0) && close(c.finish[1], 2.0) && close(c.makespan, 2.0), "{c:?}");
        assert_eq!(c.events, 2);
    }

    #[test]
    fn completion_of_equal_flows_has_the_closed_form() {
        // Equal bytes: the event-driven fluid model and the busiest link
        // agree, whatever the paths.
        let mut f = Flows::new();
        let caps: Vec<f64> = (0..8).map(|l| 1.0 + (l % 3) as f64).collect();
        for k in 0..30u32 {
            f.push([k % 8, (k * 3 + 2) % 8, (k * 7 + 5) % 8].into_iter().collect::<std::collections::BTreeSet<u32>>());
        }
        let events = completion(&caps, &f, &vec![5.0; f.len()]);
        let (closed, busiest) = equal_completion(&caps, &f, 5.0);
        assert!(close(events.makespan, closed), "{} vs {closed}", events.makespan);
        assert!(events.events > 1, "the rates were recomputed");
        let counts = f.counts(8);
        let b = busiest.unwrap();
        assert!(close(closed, 5.0 * f64::from(counts[b]) / caps[b]));
    }
}
