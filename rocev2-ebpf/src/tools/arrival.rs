//! The lab's arrival probe: counts the RoCEv2 frames that land on a
//! receiving device, in its own XDP program (before any socket could drop
//! them), follows each flow's data PSNs and reports gaps, late packets and
//! duplicates with their time; then passes every frame on, so a capture on
//! the same device still sees it. See rocev2_common::arrival.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::XdpContext,
};
use rocev2_common::{
    arrival::{
        Arrival, ArrivalEvent, ArrivalKey, ArrivalTotals, FlowArrival, ARRIVAL_EVENT_RING_BYTES, EVENT_DUPLICATE,
        EVENT_GAP, EVENT_LATE, MAX_ARRIVAL_FLOWS,
    },
    telemetry::{seen, Seen},
};

use crate::transport;

/// Per flow: what arrived (one device's NAPI serves a flow at a time).
#[map]
pub static ARRIVAL_FLOWS: HashMap<ArrivalKey, FlowArrival> = HashMap::with_max_entries(MAX_ARRIVAL_FLOWS, 0);

#[map]
pub static ARRIVAL_TOTALS: PerCpuArray<ArrivalTotals> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static ARRIVAL_EVENTS: RingBuf = RingBuf::with_byte_size(ARRIVAL_EVENT_RING_BYTES, 0);

/// Counts one frame; returns whether it is a RoCEv2 frame.
#[inline(always)]
pub fn count(ctx: &XdpContext) -> bool {
    let Some(totals) = ARRIVAL_TOTALS.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's entry; one program run at a time per CPU.
    let totals = unsafe { &mut *totals };
    let Some(at) = transport::locate(ctx) else {
        totals.other += 1;
        return false;
    };
    totals.roce += 1;
    let now = unsafe { bpf_ktime_get_ns() };
    let key = ArrivalKey { src: at.src, dst: at.dst, dest_qp: at.bth.dest_qp, family: at.family };
    let psn = match seen(at.bth.opcode) {
        Seen::Data => Some(at.bth.psn),
        Seen::Ack(_) | Seen::Cnp => None,
    };
    let arrival = match ARRIVAL_FLOWS.get_ptr_mut(key) {
        // SAFETY: a flow arrives through one device, whose NAPI runs on one CPU at a time.
        Some(flow) => unsafe { (*flow).observe(psn, now) },
        None => {
            let mut flow = FlowArrival::default();
            let arrival = flow.observe(psn, now);
            if ARRIVAL_FLOWS.insert(key, flow, 0).is_err() {
                totals.untracked += 1;
            }
            arrival
        }
    };
    let (kind, count) = match arrival {
        Arrival::InOrder => return true,
        Arrival::Gap(n) => (EVENT_GAP, n),
        Arrival::Late => (EVENT_LATE, 1),
        Arrival::Duplicate => (EVENT_DUPLICATE, 1),
    };
    match ARRIVAL_EVENTS.reserve::<ArrivalEvent>(0) {
        Some(mut entry) => {
            entry.write(ArrivalEvent { key, kind, psn: psn.unwrap_or(0), count, _reserved: 0, time_ns: now });
            entry.submit(0);
        }
        None => totals.events_lost += 1,
    }
    true
}
