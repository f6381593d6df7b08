//! Part 1 addition: what per-QP telemetry (`telemetry_qps`) costs per
//! packet, measured against the same pipeline with telemetry off.

#[allow(unused_imports, reason = "the parent's items and imports, of which this part uses some")]
use super::*;
use rocev2_common::telemetry::DEFAULT_QP_TABLE_SIZE;

pub(super) const HOW: &str = "- Telemetry rows: the qp pipeline (10 routes) loaded with `telemetry_qps = 0` and with the default 4096-entry QP table, measured interleaved like the rest of part 1, on one QP's stream of 64 WRITE frames with consecutive PSNs taken in turn (the QP's entry exists after the first call and is updated in place: the steady state of a busy QP; the ICRC of these frames is not recomputed, which the dataplane does not check). Off, the load-time feature switch removes the telemetry call from the verified program. The acked-repick row loads telemetry with `repick = \"idle-or-acked\"`'s feature as well, on the same data stream: what every data packet pays for it (the precise clock instead of the coarse one); an ACK that covers a QP's highest PSN pays a group and a flowlet-table lookup more, not measured here.\n";

/// Frames in the telemetry rows' stream.
const PSNS: u32 = 64;

/// A QP's stream: consecutive PSNs, so telemetry sees packets in order
/// (one jump back per 64 packets, when the frames start over).
fn stream(v6: bool) -> Vec<Vec<u8>> {
    (0..PSNS)
        .map(|psn| {
            let mut f = bench_frame(v6, 255, [2, 0, 0, 0, 0, 0xFE]);
            let at = f.len() - 4 - 1024 - 3; // PSN: the BTH's last 3 bytes, before payload and ICRC
            f[at..at + 3].copy_from_slice(&psn.to_be_bytes()[1..]);
            f
        })
        .collect()
}

/// What the qp pipeline loads with telemetry `on` or off.
pub(super) fn features(on: bool) -> Features {
    let qp = Pipeline::Qp.features();
    if on {
        qp.with(Features::TELEMETRY)
    } else {
        qp
    }
}

/// The line profile of the qp pipeline with telemetry `on` or off, on
/// the IPv4 stream the telemetry rows measure (the telemetry budget's).
pub(super) fn profile(on: bool, seconds: f64) -> Result<profile::Profile> {
    let mut dp = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, features(on))?;
    let frames = stream(false);
    let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let label = format!("rocev2 qp, telemetry {}, IPv4", if on { "on" } else { "off" });
    profile::profile_program(&mut dp, XDP_PROGRAM, &frames, &label, seconds)
}

/// Rows: the qp pipeline with telemetry off and on, per family; the IPv4
/// cost of telemetry (on against off, median of per-round differences);
/// and the IPv4 ns with telemetry off.
pub(super) fn telemetry_rows(args: &BenchArgs) -> Result<(Vec<Row>, f64, f64)> {
    eprintln!("bench: per-packet cost of per-QP telemetry");
    let qp = Pipeline::Qp.features();
    let mut off = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, qp)?;
    let mut on = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, qp.with(Features::TELEMETRY))?;
    let mut acked =
        test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, qp.with(Features::TELEMETRY).with(Features::ACKED_REPICK))?;
    let streams = [stream(false), stream(true)];
    let b = &TELEMETRY_BUDGET;
    budget::check_path(b.name, &checked_path(b), &static_counts(&mut on, XDP_PROGRAM)?)?;
    let mut samples: BTreeMap<(bool, bool), Vec<f64>> = BTreeMap::new();
    let mut acked_samples: BTreeMap<bool, Vec<f64>> = BTreeMap::new();
    for _round in 0..args.rounds {
        for (v6, frames) in [false, true].into_iter().zip(&streams) {
            let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let off_ns = cost_ns_frames(&mut off, XDP_PROGRAM, &frames, args.packets, TEST_REPEAT)?;
            samples.entry((v6, false)).or_default().push(off_ns);
            let on_ns = cost_ns_frames(&mut on, XDP_PROGRAM, &frames, args.packets, TEST_REPEAT)?;
            samples.entry((v6, true)).or_default().push(on_ns);
            let acked_ns = cost_ns_frames(&mut acked, XDP_PROGRAM, &frames, args.packets, TEST_REPEAT)?;
            acked_samples.entry(v6).or_default().push(acked_ns);
        }
    }
    let mut rows = Vec::new();
    let (mut cost_v4, mut off_v4) = (f64::NAN, f64::NAN);
    for v6 in [false, true] {
        let fam = if v6 { "IPv6" } else { "IPv4" };
        let ns_off = median(samples[&(v6, false)].clone());
        let ns_on = median(samples[&(v6, true)].clone());
        // The load drifts between rounds: the difference within a round is
        // what the table costs.
        let per_round_delta =
            median(samples[&(v6, true)].iter().zip(&samples[&(v6, false)]).map(|(on, off)| on - off).collect());
        if !v6 {
            (cost_v4, off_v4) = (per_round_delta, ns_off);
        }
        rows.push(row(
            "1 per-packet",
            "rocev2 qp, telemetry off",
            format!("{fam}, 10 routes"),
            format!("{ns_off:.1} ns"),
            "telemetry baseline",
            "",
        ));
        rows.push(row(
            "1 per-packet",
            format!("rocev2 qp, telemetry on ({DEFAULT_QP_TABLE_SIZE} QPs)"),
            format!("{fam}, 10 routes"),
            format!("{ns_on:.1} ns"),
            format!("{:+.1} ns vs off, median of per-round differences", per_round_delta),
            at_most_ns(per_round_delta, TELEMETRY_GOAL_NS),
        ));
        let ns_acked = median(acked_samples[&v6].clone());
        rows.push(row(
            "1 per-packet",
            "rocev2 qp, telemetry on + acked-repick",
            format!("{fam}, 10 routes, data packets"),
            format!("{ns_acked:.1} ns"),
            format!("{:+.1} ns vs telemetry on", ns_acked - ns_on),
            "",
        ));
    }
    Ok((rows, cost_v4, off_v4))
}
