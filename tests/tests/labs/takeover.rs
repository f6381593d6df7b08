//! Issue 25: what a takeover (`rocev2 upgrade`, a restart after a crash)
//! keeps. The keyless flowlet slots are the previous run's own map and
//! each group keeps its generation when its members are the same, so a
//! flow in the middle of a flowlet keeps its member through the takeover.
//! (The transport health a takeover keeps is tested in transport_aware.rs.)

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
    time::Duration,
};

use rocev2_common::bth::{opcode, Bth};
use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::testbed::ecmp_lab::{lab_frame, DataplaneProcess, EcmpLab, Family, LabReport};

const UPLINKS: usize = 4;
const QPS: u32 = 64;
/// Longer than any stall of the stream on a busy machine, so that only the
/// warm-up's pauses (longer still) end flowlets.
const GAP_US: u64 = 1_000_000;

fn frames(psn: u32) -> Vec<Vec<u8>> {
    (0..QPS).map(|q| lab_frame(Family::V4, Bth::new(opcode::WRITE_MIDDLE, 0x100 + q, psn), 2, 256)).collect()
}

/// Each QP's uplinks (1-based) in a capture.
fn uplinks_of(report: &LabReport, psn: Option<u32>) -> BTreeMap<u32, BTreeSet<usize>> {
    let mut out: BTreeMap<u32, BTreeSet<usize>> = BTreeMap::new();
    for u in &report.uplinks {
        for s in u.seen.iter().filter(|s| psn.is_none_or(|p| s.psn == p)) {
            out.entry(s.dest_qp).or_default().insert(u.uplink);
        }
    }
    out
}

#[test]
fn keyless_flowlets_keep_their_members_through_an_upgrade() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    let text = lab.config("qp").replace(
        "name = \"spines\"\n",
        &format!("name = \"spines\"\npolicy = \"flowlet\"\nflowlet_table = \"keyless\"\nflowlet_gap_us = {GAP_US}\n"),
    );
    let config = lab.write_config_text("keyless", &text).unwrap();
    let old = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    // Two reloads (u4 out, u4 back) publish the group twice more: its
    // generation is no longer the 1 a fresh run's first publish gives, so
    // flowlet state survives only if the new run keeps the generation too.
    let three = text.replace("  { dev = \"u4\", via = \"10.0.4.2\" },\n", "");
    assert_ne!(three, text, "the edit must remove u4");
    for version in [&three, &text] {
        std::fs::write(&config, version).unwrap();
        let out = Command::new(rocev2_bin()).args(["reload", "--config", config.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "reload: {}", String::from_utf8_lossy(&out.stderr));
    }

    // Warm-up: three packets per QP, each after an idle gap, so every flow
    // is in its third flowlet, re-hashed twice: a table that started over
    // would put it back on its first flowlet's member.
    let bursts = (0..3).map(frames).collect();
    let warm = lab.send_bursts_and_capture(bursts, Duration::from_micros(GAP_US + 300_000)).unwrap();
    rocev2_tests::assert_no_switch_loss(&warm, "the warm-up");
    let first = uplinks_of(&warm, Some(0));

    // A steady stream (each QP every 32 ms, well within the gap) through
    // `rocev2 upgrade`.
    let capture = lab.start_capture().unwrap();
    let stream = lab.start_stream(frames(7), 2_000).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut upgrade = Command::new(rocev2_bin());
    upgrade.args(["upgrade", "--pin-dir", lab.pin_dir().to_str().unwrap()]);
    let new = DataplaneProcess::spawn(upgrade).expect("rocev2 upgrade");
    old.stop_after_exit(Duration::from_secs(10)).expect("the old run hands over");
    std::thread::sleep(Duration::from_millis(800));
    let sent = stream.stop().unwrap();
    let steady = capture.finish(sent).unwrap();
    let log = new.stop().unwrap();
    rocev2_tests::assert_no_switch_loss(&steady, "the stream through the upgrade");
    assert!(log.contains("took over the previous run's keyless flowlet slots"), "{log}");
    // The keyed table is a one-entry placeholder this config never uses:
    // taking it over is not news.
    assert!(!log.contains("took over the previous run's flowlet table"), "{log}");

    let during = uplinks_of(&steady, None);
    assert_eq!(during.len(), QPS as usize, "{}", steady.render());
    let moved: Vec<_> = during.iter().filter(|(_, u)| u.len() > 1).collect();
    assert!(moved.is_empty(), "flows moved during the upgrade: {moved:?}\n{log}");
    // The test has teeth: many flows sit on another member than their
    // first flowlet's, where a restarted table would have sent them.
    let away = during.iter().filter(|(qp, u)| first.get(qp) != Some(u)).count();
    println!(
        "MEASURED: {QPS} flows through the upgrade, none moved; {away} are away from their first flowlet's member"
    );
    assert!(away >= QPS as usize / 4, "only {away} flows left their first member: {first:?} {during:?}");
}
