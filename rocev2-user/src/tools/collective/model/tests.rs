use rocev2_common::buckets::{even_table, member_for};
use rocev2_common::hash::member_hash;

use super::*;
use crate::tools::{
    collective::DEFAULT_CHUNK,
    fabric::{SeedPlan, Switch},
};

const LINK: u64 = 200_000_000;
/// Bytes per second of a LINK.
const RATE: f64 = LINK as f64 / 8.0;

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

fn setup(fabric: Fabric, op: Op, size: u64, qps: u32, mode: Mode) -> Setup {
    Setup {
        fabric,
        link_bps: LINK,
        v6: false,
        op,
        size,
        qps,
        chunk: DEFAULT_CHUNK,
        placement: Placement::Interleaved,
        mode,
        flowlet_gap_ns: 50_000,
        flowlet_slots: 4096,
        message_gap_ns: 0,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs()
}

/// Frame bytes of one full chunk.
fn chunk_wire() -> f64 {
    transfer_wire_bytes(DEFAULT_CHUNK, DEFAULT_CHUNK, false) as f64
}

/// The store-and-forward latency of `links` links after the sender's:
/// a full frame's time on each.
fn latency(links: u32) -> f64 {
    f64::from(links) * (MTU_PAYLOAD + super::super::FRAME_OVERHEAD_V4) as f64 / RATE
}

/// The prediction of both engines (the round engine forced).
fn both(s: &Setup) -> (Prediction, Prediction) {
    let events = predict(s).unwrap();
    assert_eq!(events.engine, Engine::Events);
    let mut fabric = s.fabric.clone();
    fabric.hash = s.mode.hash();
    let m = Model::new(s, &fabric);
    let mut out = Outcome::new(m.capacity.len());
    let paths: Vec<Vec<u32>> = match s.mode {
        Mode::Te => m.te_paths(&mut out),
        _ => m.qps.iter().map(|q| m.fixed_path(q)).collect(),
    };
    rounds::run_fixed(&m, &paths, &mut out);
    (events, m.prediction(out, Engine::Rounds))
}

#[test]
fn model_ring_on_a_nonblocking_fabric_is_ideal() {
    // Two racks of one host, one spine: each direction of every link
    // carries one connection. 1 MiB per rank: 512 KiB per step, 4
    // chunks, 2 steps, each chunk at the full link rate; the last one
    // arrives after 3 more links (leaf, spine, leaf store and forward it).
    let (p, r) = both(&setup(fabric(2, 1, 1), Op::Allreduce, 1 << 20, 1, Mode::Qp));
    assert_eq!((p.ranks, p.steps, p.flows), (2, 2, 2));
    let busy = 2.0 * 4.0 * chunk_wire() / RATE;
    assert!(close(p.seconds, busy + latency(3)), "{p:?}");
    assert!(close(r.seconds, p.seconds), "{r:?}");
    assert!(close(p.share_of_ideal, busy / p.seconds), "ideal but for the last packet's latency: {p:?}");
    // nccl-tests: algbw = size / time, busbw = algbw x 2(n-1)/n = algbw here.
    assert!(close(p.algbw, (1 << 20) as f64 / p.seconds) && close(p.busbw, p.algbw));
    assert!(close(p.worst_link_utilization, busy / p.seconds), "every link busy until the last packet left: {p:?}");
    assert_eq!(p.worst_link, "l1/s1p1", "a switch link wins the tie with the host links");
    assert!(
        close(p.step_seconds[2] - p.step_seconds[1], latency(3)),
        "the steps are alike but for the last packet's latency: {p:?}"
    );
}

#[test]
fn model_message_gap_idles_before_every_message() {
    // The non-blocking ring of two ranks, 4 chunks per step, each message
    // after a gap of 1 ms: 8 gaps more, in both engines.
    let gap = 1e-3;
    let s = Setup { message_gap_ns: 1_000_000, ..setup(fabric(2, 1, 1), Op::Allreduce, 1 << 20, 1, Mode::Qp) };
    let (p, r) = both(&s);
    let expected = 8.0 * (gap + chunk_wire() / RATE) + latency(3);
    assert!(close(p.seconds, expected) && close(r.seconds, expected), "{p:?} {r:?}");
    // An incast of 2 senders: each sends its 4 chunks one after another,
    // each after its gap, both at half the receiver's link.
    let s = Setup { message_gap_ns: 1_000_000, ..setup(fabric(1, 3, 1), Op::Incast, 1 << 20, 1, Mode::Qp) };
    let (p, r) = both(&s);
    let expected = 4.0 * (gap + 2.0 * chunk_wire() / RATE) + latency(1);
    assert!(close(p.seconds, expected) && close(r.seconds, expected), "{p:?} {r:?}");
}

/// Per rack, the leaf uplink each QP of its ring connections takes.
fn uplinks_by_rack(f: &Fabric, qps: u32, mode: HashMode) -> Vec<Vec<u32>> {
    let router = Router::new(f);
    let ranks = place(f.racks, f.hosts, Placement::Interleaved);
    let n = ranks.len();
    let mut out = vec![Vec::new(); f.racks as usize];
    for k in 0..n {
        let (src, dst) = (ranks[k], ranks[(k + 1) % n]);
        for q in 0..qps {
            let key = qp_flow_key(src, dst, qp_number(k, (k + 1) % n, q), false);
            let seed = router.seed(Switch::Leaf(src.0));
            out[src.0 as usize - 1]
                .push(member_for(&even_table(f.spines), member_hash(&key, mode, seed, f.hash_version)));
        }
    }
    out
}

/// The most QPs one uplink carries.
fn busiest_uplink(ups: &[Vec<u32>], spines: u32) -> usize {
    ups.iter().flat_map(|rack| (0..spines).map(move |s| rack.iter().filter(|m| **m == s).count())).max().unwrap()
}

#[test]
fn model_five_tuple_collides_where_qp_spreads() {
    // 2 racks x 2 hosts, 2 spines, ring across the racks: each rack
    // sends two connections to the other.
    let f = fabric(2, 2, 2);
    let ups = uplinks_by_rack(&f, 1, HashMode::FiveTuple);
    assert_eq!(busiest_uplink(&ups, 2), 2, "five-tuple hashing puts a rack's two connections on one uplink: {ups:?}");
    // The two share the uplink (and the spine's link down): every step
    // takes twice as long as on an ideal fabric.
    let size = 4 << 20;
    let (five, rounds) = both(&setup(f.clone(), Op::Allreduce, size, 1, Mode::FiveTuple));
    let chunks = (size / 4).div_ceil(DEFAULT_CHUNK) as f64;
    let ideal = 6.0 * chunks * chunk_wire() / RATE + latency(3);
    assert!(close(five.seconds, 6.0 * chunks * 2.0 * chunk_wire() / RATE + latency(3)), "{five:?}");
    assert!(close(rounds.seconds, five.seconds), "{rounds:?}");
    // The ideal fabric's bus bandwidth has no latency.
    assert!(close(five.share_of_ideal, (ideal - latency(3)) / five.seconds) && five.share_of_ideal < 0.5, "{five:?}");
    // qp with 4 QPs: 8 QPs per rack on 2 uplinks, each QP a quarter of
    // the chunks; a step takes as long as the busiest uplink's QPs need.
    let ups = uplinks_by_rack(&f, 4, HashMode::Qp);
    let busiest = busiest_uplink(&ups, 2) as f64;
    let (qp, rounds) = both(&setup(f.clone(), Op::Allreduce, size, 4, Mode::Qp));
    // 2 rounds per step, each as long as the busiest uplink's QPs need.
    let expected = 6.0 * (chunks / 4.0) * busiest * chunk_wire() / RATE + latency(3);
    assert!(close(rounds.seconds, expected), "{ups:?} {rounds:?}");
    // The pipelined ring is no slower than its rounds (and here no faster:
    // the busiest uplink's QPs never wait).
    assert!(close(qp.seconds, rounds.seconds), "{qp:?}");
    assert!(qp.share_of_ideal > five.share_of_ideal, "qp x4 beats five-tuple x1: {qp:?}");
    // Pinning by destination slice and TE place the two apart.
    for mode in [Mode::Pinned, Mode::Te] {
        let (p, r) = both(&setup(f.clone(), Op::Allreduce, size, 1, mode));
        assert!(close(p.seconds, ideal) && close(r.seconds, ideal), "{mode:?}: {p:?} {r:?}");
    }
}

#[test]
fn model_all_to_all_and_incast_by_hand() {
    // All-to-all over 2 racks x 2 hosts and one spine: a host sends 3
    // transfers, a leaf's uplink carries 4 (2 hosts x 2 remote peers):
    // the uplink sets the time, 4 transfers against an ideal 3.
    let size = 4 << 20;
    let transfer = transfer_wire_bytes(size / 4, DEFAULT_CHUNK, false) as f64;
    let (p, r) = both(&setup(fabric(2, 2, 1), Op::Alltoall, size, 1, Mode::Qp));
    assert!(close(p.seconds, 4.0 * transfer / RATE + latency(3)) && close(r.seconds, p.seconds), "{p:?} {r:?}");
    assert!(close(p.share_of_ideal, 0.75 * 4.0 * transfer / RATE / p.seconds), "{p:?}");
    assert_eq!(p.worst_link, "l1/s1p1");
    // Incast of 3 hosts to one: the receiver's link carries 2 transfers
    // of half the size, which is what the ideal fabric allows too.
    let (p, r) = both(&setup(fabric(1, 3, 1), Op::Incast, size, 2, Mode::Qp));
    let transfer = transfer_wire_bytes(size / 2, DEFAULT_CHUNK, false) as f64;
    // The leaf alone stores and forwards.
    assert!(close(p.seconds, 2.0 * transfer / RATE + latency(1)) && close(r.seconds, p.seconds), "{p:?} {r:?}");
    assert!(close(p.share_of_ideal, 2.0 * transfer / RATE / p.seconds), "{p:?}");
    assert_eq!(p.worst_link, "l1/h1");
}

#[test]
fn model_a_shallow_pipeline_waits() {
    // 8 ranks in a ring over 2 spines with five-tuple collisions, one
    // chunk per step: a message has to arrive before the next step's can
    // go. The rounds wait for the slowest message and its latency every
    // step; the events let a hop whose predecessor was fast start early,
    // but no schedule beats the busiest link's bytes over its rate (the
    // rounds without their latency).
    let s = setup(fabric(4, 2, 2), Op::Allreduce, 8 * DEFAULT_CHUNK, 1, Mode::FiveTuple);
    let (events, rounds) = both(&s);
    let bound = rounds.seconds - rounds.steps as f64 * latency(3);
    assert!(events.seconds >= bound * (1.0 - 1e-9), "{events:?} {rounds:?}");
    assert!(events.seconds <= rounds.seconds * (1.0 + 1e-9), "{events:?} {rounds:?}");
}

#[test]
fn model_flowlets_move_only_after_an_idle_gap() {
    let f = fabric(2, 2, 2);
    let base = setup(f, Op::Allreduce, 2 << 20, 1, Mode::FlowletKeyed);
    // 4 connections, 6 steps of 4 chunks: 96 messages.
    let messages = 4 * 6 * 4;
    // A gap longer than any wait: one flowlet per QP for the whole run.
    let long = predict(&Setup { flowlet_gap_ns: 10_000_000_000, ..base.clone() }).unwrap();
    assert_eq!((long.new_flowlets, long.moved_flowlets), (4, 0), "{long:?}");
    // A gap of 1 ns: every wait starts a new flowlet, but a QP that never
    // waits keeps its path.
    let short = predict(&Setup { flowlet_gap_ns: 1, ..base.clone() }).unwrap();
    assert!(short.new_flowlets > 4 && short.new_flowlets <= messages, "{short:?}");
    assert!(short.moved_flowlets < short.new_flowlets);
    assert_eq!(predict(&Setup { flowlet_gap_ns: 1, ..base.clone() }).unwrap(), short, "deterministic");
    // A message gap longer than the flowlet gap: every message a new flowlet.
    let every = predict(&Setup { message_gap_ns: 100_000, ..base.clone() }).unwrap();
    assert_eq!(every.new_flowlets, messages, "{every:?}");
    // A keyless table of 1 slot: QPs that send together share its member.
    let one = predict(&Setup { mode: Mode::FlowletKeyless, flowlet_slots: 1, ..base }).unwrap();
    assert!(one.slot_collisions > 0, "{one:?}");
    assert!(one.share_of_ideal <= 0.5 + 1e-9, "every QP on one member of each group: {one:?}");
}

#[test]
fn model_transport_aware_demotes_busy_members() {
    // The five-tuple-colliding layout under qp with 1 QP collides too;
    // transport-aware demotes the busy member, and QPs that start a new
    // flowlet avoid it.
    let s = setup(fabric(2, 2, 2), Op::Allreduce, 4 << 20, 1, Mode::TransportAware);
    let p = predict(&Setup { flowlet_gap_ns: 1_000_000_000, ..s.clone() }).unwrap();
    assert!(p.demoted >= 1, "{p:?}");
    let qp = predict(&Setup { mode: Mode::Qp, ..s }).unwrap();
    assert!(qp.share_of_ideal < 1.0 - 1e-9, "{qp:?}");
}

#[test]
fn model_bad_input_is_named() {
    let err = |s: Setup| predict(&s).unwrap_err();
    assert!(err(setup(fabric(1, 1, 1), Op::Allreduce, 1, 1, Mode::Qp)).contains("at least 2 hosts"));
    assert!(err(setup(fabric(2, 1, 1), Op::Allreduce, 0, 1, Mode::Qp)).contains("--size 0"));
    assert!(err(setup(fabric(2, 1, 1), Op::Allreduce, 1, 33, Mode::Qp)).contains("--qps"));
    let big = setup(fabric(100, 32, 4), Op::Alltoall, 1 << 20, 8, Mode::Qp);
    assert!(err(big).contains("more than the model's"));
    let zones = Setup {
        fabric: Fabric { zones: 2, aggs: 2, ..fabric(3, 1, 2) },
        ..setup(fabric(3, 1, 2), Op::Allreduce, 1, 1, Mode::Qp)
    };
    assert!(err(zones).contains("split evenly"));
}

#[test]
fn model_scorecard_rows_are_the_labs() {
    let rows = scorecard_rows(&[2_000_000, 50_000_000]);
    let labels: Vec<String> = rows.iter().map(|r| format!("{} x{}", r.label(), r.qps)).collect();
    assert_eq!(
        labels,
        [
            "five-tuple x1",
            "qp x1",
            "qp x2",
            "qp x4",
            "qp x8",
            "slice x1",
            "te x1",
            "flowlet keyed 2ms x1",
            "flowlet keyed 50ms x1",
            "flowlet keyless 2ms x1",
            "flowlet keyless 50ms x1",
            "transport-aware 50ms x1"
        ]
    );
    assert!(Mode::ALL.iter().all(|m| rows.iter().any(|r| r.mode == *m)));
}

#[test]
fn model_te_demands_fill_the_busier_host_link() {
    // A ring: each QP of 2 carries half its host's bytes, so half a link.
    let ranks = place(2, 1, Placement::Interleaved);
    let d = te_demands(&ranks, [((0, 1, 0), 10), ((0, 1, 1), 10), ((1, 0, 0), 20)].into_iter(), 8.0);
    assert_eq!(d.iter().map(|d| d.load).collect::<Vec<_>>(), [4.0, 4.0, 8.0]);
    // An incast: 3 senders into one receiver, whose link is the busier.
    let ranks = place(1, 4, Placement::Interleaved);
    let d = te_demands(&ranks, (1..4).map(|s| ((s, 0, 0), 10)), 9.0);
    assert!(d.iter().all(|d| (d.load - 3.0).abs() < 1e-12), "{d:?}");
}

#[test]
fn model_paper_scale_shapes_are_valid() {
    // 32,768 hosts in 8 zones: addresses and MACs stay distinct past 255 racks.
    let f = Fabric { racks: 2048, hosts: 16, spines: 128, zones: 8, aggs: 16, ..fabric(1, 1, 1) };
    setup(f.clone(), Op::Allreduce, 1 << 30, 4, Mode::Qp).validate().unwrap();
    assert_ne!(Fabric::host_v4(1, 1), Fabric::host_v4(257, 1));
    assert_ne!(f.seed(Switch::Leaf(1)), f.seed(Switch::Leaf(257)));
    assert_ne!(model_qp_number(32768, 1, 2, 0), model_qp_number(32768, 2, 3, 0));
    assert_eq!(model_qp_number(16, 1, 2, 3), qp_number(1, 2, 3), "the lab's numbers at lab scale");
}

#[test]
fn model_gaps_are_typed_and_printed_alike() {
    use crate::{control::config::parse_gap, render::gap_text};
    for (text, us) in [("2ms", 2000), ("500us", 500), ("1s", 1_000_000), ("1.5ms", 1500)] {
        assert_eq!(parse_gap(text), Ok(us), "{text}");
    }
    for us in [2000, 500, 50_000, 1500] {
        assert_eq!(parse_gap(&gap_text(us)), Ok(us), "{}", gap_text(us));
    }
    assert!(parse_gap("2").unwrap_err().contains("write e.g. 2ms"));
    assert!(parse_gap("0us").unwrap_err().contains("outside 1us..10s"));
    assert!(parse_gap("11s").unwrap_err().contains("outside 1us..10s"));
}
