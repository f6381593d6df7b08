//! The round engine, for collectives too large to follow message by
//! message (a ring over 32,768 ranks has 2 billion messages). Round r of a
//! step is message r x qps + q on QP q of every connection: the messages a
//! connection has in flight together. A round lasts until its last message
//! is delivered (the slowest sets the ring's pace), and a QP that finished
//! early waits the rest of the round: that wait is its idle time. When the
//! paths do not change (hashing, slices, TE) every step is alike and is
//! computed once; flowlet modes walk their rounds one after another, up to
//! a budget, and the rounds past it take the mean of those computed.
//!
//! With fixed paths this agrees with the event engine: a ring's steps are
//! alike and its slowest QP never waits, so both give the busiest link's
//! bytes over its rate per round, and a step's first message arrives a
//! store-and-forward latency after it was sent (`paced_steps`). What it
//! cannot see is a pipeline too shallow to keep the slowest hop busy (few
//! messages per step around many ranks), which the event engine shows as
//! waiting.

use super::{
    maxmin::{self, Flows},
    placement::{Start, State},
    Model, Outcome,
};
use crate::tools::collective::Op;

/// QPs times rounds the engine walks before it samples a flowlet mode's
/// rounds instead of walking them all.
const WALK_BUDGET: u64 = 3_000_000;

/// Runs the collective with paths that never change.
pub(super) fn run_fixed(m: &Model, paths: &[Vec<u32>], out: &mut Outcome) {
    let mut flows = Flows::new();
    for p in paths {
        flows.push(p.iter().copied());
    }
    let message_gap = m.s.message_gap_ns as f64 / 1e9;
    let times: Vec<f64> = if m.s.op == Op::Allreduce {
        // Every round's messages wait out the message gap first.
        (0..m.rounds).map(|r| message_gap + round_time(&m.capacity, &flows, &m.round_bytes(r), out)).collect()
    } else {
        // No dependencies: every QP sends its messages one after another,
        // each after the message gap.
        let bytes: Vec<f64> = m.qps.iter().map(|q| q.messages.iter().map(|&(_, b)| b).sum()).collect();
        let most = m.qps.iter().map(|q| q.messages.len()).max().unwrap_or(0);
        vec![most as f64 * message_gap + round_time(&m.capacity, &flows, &bytes, out)]
    };
    let latency = paths.iter().map(|p| m.forwarding(p)).fold(0.0, f64::max);
    out.steps = paced_steps(&vec![times; m.steps], latency);
    out.scale_links(m.steps as f64);
    out.rounds = ((m.rounds * m.steps) as u64, (m.rounds * m.steps) as u64);
}

/// Each step's time from its rounds' times and the latency of a message's
/// last packet (`Model::forwarding`, the longest): the next step's first
/// message goes once this step's first one arrived and its sender is
/// through this step, so a step lasts its rounds or its first round plus
/// the latency, whichever is longer; the last step ends when its last
/// message arrives.
fn paced_steps(rounds: &[Vec<f64>], latency: f64) -> Vec<f64> {
    let last = rounds.len().saturating_sub(1);
    rounds
        .iter()
        .enumerate()
        .map(|(st, times)| {
            let all: f64 = times.iter().sum();
            match st == last {
                true => all + latency,
                false => all.max(times.first().copied().unwrap_or(0.0) + latency),
            }
        })
        .collect()
}

/// Runs a flowlet mode round by round.
pub(super) fn run_flowlets(m: &Model, out: &mut Outcome) {
    let total = (m.steps * m.rounds) as u64;
    let computed = total.min((WALK_BUDGET / m.qps.len().max(1) as u64).max(4));
    let mut state = State { flowlet: vec![0; m.qps.len()], ..Default::default() };
    let mut last_end = vec![f64::NEG_INFINITY; m.qps.len()];
    let mut paths: Vec<Vec<u32>> = vec![Vec::new(); m.qps.len()];
    let mut held = vec![Vec::new(); m.qps.len()];
    let mut times = Vec::new();
    let mut latency = 0.0f64;
    let mut now = 0.0;
    let message_gap = m.s.message_gap_ns as f64 / 1e9;
    for g in 0..computed as usize {
        let bytes = m.round_bytes(g % m.rounds.max(1));
        // The round's messages go after the message gap.
        let start = now + message_gap;
        for k in (0..m.qps.len()).filter(|&k| bytes[k] > 0.0) {
            let idle = if last_end[k] == f64::NEG_INFINITY { f64::INFINITY } else { start - last_end[k] };
            let placed = m.place_flowlet(k, &Start { now: start, idle }, &mut state);
            if placed.new_flowlet {
                out.new_flowlets += 1;
                out.moved_flowlets += u64::from(!paths[k].is_empty() && paths[k] != placed.path);
            }
            latency = latency.max(m.forwarding(&placed.path));
            paths[k] = placed.path;
            held[k] = placed.held;
        }
        let mut flows = Flows::new();
        for p in &paths {
            flows.push(p.iter().copied());
        }
        if m.s.mode == super::Mode::TransportAware {
            let sending: Vec<&[u32]> =
                (0..m.qps.len()).filter(|&k| bytes[k] > 0.0).map(|k| paths[k].as_slice()).collect();
            m.demote_congested(&sending, start, &mut state);
        }
        let t = round_time(&m.capacity, &flows, &bytes, out);
        // Idle longer than this starts a new flowlet (or, transport-aware, ACKed).
        let mut enough = m.s.flowlet_gap_ns as f64 / 1e9;
        if m.s.mode == super::Mode::TransportAware {
            enough = enough.min(super::placement::ACKED_AFTER);
        }
        let wait = if m.s.op == Op::Allreduce {
            waits(&m.capacity, &flows, &bytes, t, enough)
        } else {
            vec![0.0; bytes.len()]
        };
        for k in (0..m.qps.len()).filter(|&k| bytes[k] > 0.0) {
            last_end[k] = start + t - wait[k];
            state.slots.release(&held[k], last_end[k]);
        }
        now = start + t;
        times.push(message_gap + t);
    }
    out.slot_collisions = state.slots.collisions;
    out.demoted = state.demotions.count;
    // Rounds not computed take the mean of those that were.
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let scale = total as f64 / computed.max(1) as f64;
    out.scale_links(scale);
    for c in [&mut out.new_flowlets, &mut out.moved_flowlets, &mut out.slot_collisions] {
        *c = (*c as f64 * scale).round() as u64;
    }
    out.rounds = (computed, total);
    let rounds = m.rounds.max(1);
    let steps: Vec<Vec<f64>> = (0..m.steps)
        .map(|st| (0..rounds).map(|r| times.get(st * rounds + r).copied().unwrap_or(mean)).collect())
        .collect();
    out.steps = paced_steps(&steps, latency);
}

/// How long flows that start together take to move `bytes` (0: not in
/// this round) over their paths; adds their bytes to the links.
pub(super) fn round_time(capacity: &[f64], flows: &Flows, bytes: &[f64], out: &mut Outcome) -> f64 {
    let mut active = Flows::new();
    let mut moved = Vec::new();
    for (k, &b) in bytes.iter().enumerate() {
        if b > 0.0 {
            active.push(flows.path(k).iter().copied());
            moved.push(b);
            for &l in flows.path(k) {
                out.link_bytes[l as usize] += b;
            }
        }
    }
    let Some(&first) = moved.first() else { return 0.0 };
    if moved.iter().all(|&b| b == first) {
        maxmin::equal_completion(capacity, &active, first).0
    } else {
        maxmin::completion(capacity, &active, &moved).makespan
    }
}

/// How long each flow waits after its own `bytes` for the round's last
/// (`round` seconds): the round less its time at its max-min rate; flows
/// with 0 bytes wait for ever. Only whether a wait exceeds `enough`
/// matters, so the max-min rates are computed only when a bound cannot
/// tell: with equal bytes a flow's rate is at least its busiest link's
/// equal share (a link fills at a level no lower than that), so its wait
/// is at least the round less `bytes` at that share, and a flow on the
/// round's busiest link waits exactly 0.
pub(super) fn waits(capacity: &[f64], flows: &Flows, bytes: &[f64], round: f64, enough: f64) -> Vec<f64> {
    let active: Vec<usize> = (0..bytes.len()).filter(|&k| bytes[k] > 0.0).collect();
    let equal = active.windows(2).all(|w| bytes[w[0]] == bytes[w[1]]);
    let mut wait = vec![f64::INFINITY; bytes.len()];
    let mut undecided = !equal;
    if equal {
        let mut counts = vec![0u32; capacity.len()];
        for &k in &active {
            for &l in flows.path(k) {
                counts[l as usize] += 1;
            }
        }
        for &k in &active {
            let share = flows.path(k).iter().map(|&l| capacity[l as usize] / f64::from(counts[l as usize]));
            let own = bytes[k] / share.fold(f64::INFINITY, f64::min);
            wait[k] = (round - own).max(0.0);
            // Neither on the busiest link nor surely idle long enough.
            undecided |= wait[k] > round * 1e-12 && wait[k] <= enough;
        }
    }
    if undecided {
        let rate = maxmin::max_min_rates(capacity, flows, &active);
        for &k in &active {
            wait[k] = (round - bytes[k] / rate[k]).max(0.0);
        }
    }
    wait
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_wait_bound_never_exceeds_the_max_min_wait() {
        // Equal bytes on a random network: the bound (enough = 0 decides
        // everything from it) is at most the max-min wait, and both say 0
        // for exactly the flows on the busiest link.
        let mut f = Flows::new();
        let caps = vec![1.0; 9];
        for k in 0..40u32 {
            f.push([k % 9, (k * 4 + 3) % 9].into_iter().collect::<std::collections::BTreeSet<u32>>());
        }
        let bytes = vec![2.0; f.len()];
        let (round, _) = maxmin::equal_completion(&caps, &f, 2.0);
        let bound = waits(&caps, &f, &bytes, round, 0.0);
        let exact = waits(&caps, &f, &bytes, round, f64::INFINITY);
        for k in 0..f.len() {
            assert!(bound[k] <= exact[k] + 1e-12, "flow {k}: {} > {}", bound[k], exact[k]);
            assert_eq!(bound[k] == 0.0, exact[k] == 0.0, "flow {k}");
        }
        assert!(bound.contains(&0.0) && exact.iter().any(|w| *w > 0.0));
    }
}
