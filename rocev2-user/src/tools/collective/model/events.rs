//! The event-driven engine: every message of the collective, as the lab's
//! endpoints post them. A QP sends its messages one after another, each
//! once its dependency arrived (ring AllReduce: the same message of the
//! previous step, from the sender's ring predecessor); the QPs sending at
//! any moment share the links max-min fairly, and the rates are recomputed
//! whenever a message ends. So the ring runs as pipelined as it really is:
//! a hop waits when its predecessor has not delivered yet, and that wait is
//! the idle time a flowlet switch sees. A message is delivered when its
//! last packet has crossed every switch after the sender's link
//! ([`Model::forwarding`]).

use super::{
    maxmin::{self, Flows},
    placement::{Start, State},
    Model, Outcome,
};
use crate::tools::collective::Op;

/// One QP's progress.
struct QpRun {
    /// Its messages in order: (step, message index, frame bytes).
    messages: Vec<(usize, usize, f64)>,
    next: usize,
    /// The message it is sending and the bytes left of it.
    sending: Option<f64>,
    /// When it last finished a message (−∞ before its first).
    last_end: f64,
    path: Vec<u32>,
    held: Vec<(super::placement::Group, u32)>,
}

/// Runs every message, on `fixed` paths (one per QP) or, in flowlet
/// modes, on the paths each message's flowlet takes; fills `out` (step
/// times, link bytes, flowlets).
pub(super) fn run(m: &Model, fixed: &[Vec<u32>], out: &mut Outcome) {
    let s = m.s;
    let steps = m.steps;
    let mut state = State { flowlet: vec![0; m.qps.len()], ..Default::default() };
    let mut qps: Vec<QpRun> = m
        .qps
        .iter()
        .enumerate()
        .map(|(k, q)| QpRun {
            messages: (0..steps).flat_map(|st| q.messages.iter().map(move |&(i, b)| (st, i, b))).collect(),
            next: 0,
            sending: None,
            last_end: f64::NEG_INFINITY,
            path: fixed.get(k).cloned().unwrap_or_default(),
            held: Vec::new(),
        })
        .collect();
    // Per connection (transfer) and message index: the last step delivered.
    let mut delivered = vec![vec![-1i64; m.messages_per_transfer]; m.transfers];
    // Messages sent whose last packet is still on its way: (arrival, QP, step, index).
    let mut arriving: Vec<(f64, usize, usize, usize)> = Vec::new();
    let mut step_end = vec![0.0f64; steps];
    let mut now = 0.0;
    let message_gap = s.message_gap_ns as f64 / 1e9;
    loop {
        // Start every QP whose next message may go; the earliest a QP
        // waiting out its message gap may.
        let mut next_ready = f64::INFINITY;
        for (k, run) in qps.iter_mut().enumerate() {
            let Some(&(step, index, bytes)) = run.messages.get(run.next) else { continue };
            if run.sending.is_some() {
                continue;
            }
            let conn = m.qps[k].transfer;
            if s.op == Op::Allreduce && step > 0 && delivered[(conn + m.n - 1) % m.n][index] < step as i64 - 1 {
                continue;
            }
            let ready = message_gap + if run.last_end == f64::NEG_INFINITY { 0.0 } else { run.last_end };
            if ready > now * (1.0 + 1e-12) {
                next_ready = next_ready.min(ready);
                continue;
            }
            if s.mode.flowlet() {
                let idle = if run.last_end == f64::NEG_INFINITY { f64::INFINITY } else { now - run.last_end };
                let placed = m.place_flowlet(k, &Start { now, idle }, &mut state);
                if placed.new_flowlet {
                    out.new_flowlets += 1;
                    out.moved_flowlets += u64::from(!run.path.is_empty() && run.path != placed.path);
                }
                run.path = placed.path;
                run.held = placed.held;
            }
            for &l in &run.path {
                out.link_bytes[l as usize] += bytes;
            }
            run.sending = Some(bytes);
        }
        let active: Vec<usize> = (0..qps.len()).filter(|&k| qps[k].sending.is_some()).collect();
        let next_arrival = arriving.iter().map(|a| a.0).fold(f64::INFINITY, f64::min).min(next_ready);
        if active.is_empty() {
            if next_arrival == f64::INFINITY {
                break;
            }
            now = next_arrival;
            deliver(m, &mut arriving, now, &mut delivered, &mut step_end);
            continue;
        }
        let mut flows = Flows::new();
        for &k in &active {
            flows.push(qps[k].path.iter().copied());
        }
        if s.mode == super::Mode::TransportAware {
            let paths: Vec<&[u32]> = active.iter().map(|&k| qps[k].path.as_slice()).collect();
            m.demote_congested(&paths, now, &mut state);
        }
        let all: Vec<usize> = (0..active.len()).collect();
        let rate = maxmin::max_min_rates(&m.capacity, &flows, &all);
        let dt = all.iter().map(|&i| qps[active[i]].sending.unwrap_or(0.0) / rate[i]).fold(f64::INFINITY, f64::min);
        // Up to the next message sent, or the next delivered or ready if sooner.
        let dt = dt.min(next_arrival - now);
        now += dt;
        for (i, &k) in active.iter().enumerate() {
            let run = &mut qps[k];
            let left = run.sending.unwrap_or(0.0) - rate[i] * dt;
            let (step, index, bytes) = run.messages[run.next];
            if left > bytes * 1e-9 {
                run.sending = Some(left);
                continue;
            }
            run.sending = None;
            run.next += 1;
            run.last_end = now;
            state.slots.release(&run.held, now);
            arriving.push((now + m.forwarding(&run.path), k, step, index));
        }
        deliver(m, &mut arriving, now, &mut delivered, &mut step_end);
    }
    out.slot_collisions = state.slots.collisions;
    out.demoted = state.demotions.count;
    // A step lasts from the previous step's end to its own.
    let mut before = 0.0;
    out.steps = step_end
        .iter()
        .map(|&end| {
            let end = end.max(before);
            let t = end - before;
            before = end;
            t
        })
        .collect();
}

/// Delivers every message whose last packet arrived by `now`.
fn deliver(
    m: &Model,
    arriving: &mut Vec<(f64, usize, usize, usize)>,
    now: f64,
    delivered: &mut [Vec<i64>],
    step_end: &mut [f64],
) {
    arriving.retain(|&(at, k, step, index)| {
        if at > now * (1.0 + 1e-12) {
            return true;
        }
        let conn = m.qps[k].transfer;
        delivered[conn][index] = delivered[conn][index].max(step as i64);
        step_end[step] = step_end[step].max(at);
        false
    });
}
