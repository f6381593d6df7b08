//! Rated links and collectives on the fabric lab (`lab up --racks N
//! --link-rate R`): every link is a real queue at a rate, which fills,
//! marks ECN and drops at its tail; every packet sent is either received
//! or counted as dropped by a queue.

use std::process::Command;

use rocev2_tests::{require_root, rocev2_bin, LabGuard};
use rocev2_user::{
    testbed::lab::{
        self,
        fabric::{links, LabTrafficArgs},
        LabRecord,
    },
    tools::fabric::Pattern,
    tools::gen::SportModel,
};

/// A lab name unique to this process and test: 1-8 of [a-z0-9].
fn lab_name(tag: char) -> String {
    format!("c{tag}{:x}", std::process::id() % 0xFFFFF)
}

fn lab_up(name: &str, extra: &[&str]) -> LabGuard {
    #[rustfmt::skip]
    let out = Command::new(rocev2_bin())
        .args(["lab", "up", "--name", name, "--racks", "2", "--hosts", "2", "--spines", "2", "--family", "v4"])
        .args(extra)
        .output()
        .unwrap();
    let guard = LabGuard(name.to_owned());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lab up failed:\n{text}");
    eprintln!("{text}");
    guard
}

fn queue_totals(record: &LabRecord) -> (u64, u64) {
    let rated = record.rated.as_ref().expect("a rated lab");
    let stats = links::queue_stats(rated, &record.switches).unwrap();
    stats.iter().fold((0, 0), |(d, m), s| (d + s.drops, m + s.ecn_marked))
}

#[test]
fn rated_links_queue_mark_and_drop_and_every_packet_is_accounted_for() {
    require_root();
    let name = lab_name('q');
    let _lab = lab_up(&name, &["--link-rate", "20mbit", "--leaf-buffer", "16k", "--spine-buffer", "128k"]);
    let record = LabRecord::read(&name).unwrap();
    let rated = record.rated.clone().expect("lab up recorded the rated links");
    assert_eq!(rated.settings.rate_bps, 20_000_000);
    // 4 host NICs, 4 leaf->host, 4 leaf->spine, 4 spine->leaf.
    assert_eq!(rated.queues.len(), 16);
    assert!(rated.measured_path_fps.unwrap() > 0.0);
    let (drops_before, _) = queue_totals(&record);
    assert_eq!(drops_before, 0, "nothing dropped before any traffic");

    // Every host sends one connection of 8 QPs to the next rack at its
    // link rate: two hosts' traffic meets on the leaves' uplinks (and one
    // port per QP is not enough to spread it evenly), so queues fill.
    let args = LabTrafficArgs {
        name: name.clone(),
        pattern: Pattern::Ring,
        qps: 8,
        messages: 24,
        sport: SportModel::Fixed,
        rate: 20_000,
        json: false,
    };
    let o = lab::fabric::traffic(&args).unwrap();
    let (drops, marks) = queue_totals(&LabRecord::read(&name).unwrap());
    eprintln!("sent {}, arrived {}, captured {}, dropped {drops}, marked {marks}", o.sent, o.arrived, o.received);
    assert_eq!(
        o.sent,
        o.arrived + drops,
        "every packet sent arrived (counted where it landed) or was dropped by a queue"
    );
    assert!(drops > 0, "two hosts at the link rate into one uplink overflow a 16k buffer");
    assert!(marks > 0, "the virtual queues marked ECN before the buffers overflowed");
    assert_eq!((o.bad_icrc, o.duplicates, o.reordered), (0, 0, 0), "{o:#?}");

    let out = Command::new(rocev2_bin()).args(["lab", "stats", "--name", &name]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Queues: every link 20mbit"), "{text}");
    assert!(text.contains("r1h1/eth0") && text.contains("l1/s1p1") && text.contains("s2/l2p1"), "{text}");
}
