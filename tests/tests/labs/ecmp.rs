//! End-to-end: a sender namespace, a switch namespace running the real
//! `rocev2 run` from a config file, and four uplink namespaces. 64 QPs
//! share one UDP source port, the case plain ECMP cannot spread.

use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::testbed::ecmp_lab::{EcmpLab, Family, LabReport};

const QPS: u32 = 64;
const PACKETS_PER_QP: u32 = 10;
const UPLINKS: usize = 4;

fn run_lab(hash: &str, families: &[Family]) -> (LabReport, serde_json::Value, String) {
    require_root();
    let lab = EcmpLab::create(UPLINKS).expect("build the lab");
    let config = lab.write_config(hash).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("start rocev2 run");
    let report = lab.send_and_capture(QPS, PACKETS_PER_QP, families).expect("send and capture");
    // `rocev2 stats` reads the pinned maps of the running instance.
    let stats = std::process::Command::new(rocev2_bin())
        .args(["stats", "--json", "--pin-dir"])
        .arg(lab.pin_dir())
        .output()
        .unwrap();
    assert!(stats.status.success(), "rocev2 stats failed: {}", String::from_utf8_lossy(&stats.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    let output = dataplane.stop().expect("rocev2 run stops cleanly on SIGTERM");
    (report, stats, output)
}

fn assert_packets_intact(report: &LabReport) {
    rocev2_tests::assert_no_switch_loss(report, "every packet arrives exactly once");
    for u in &report.uplinks {
        assert_eq!(u.bad_ttl, 0, "TTL/hop limit one lower on up{}", u.uplink);
        assert_eq!(u.bad_ipv4_checksum, 0, "IPv4 checksum valid on up{}", u.uplink);
        assert_eq!(u.bad_icrc, 0, "ICRC still valid on up{}", u.uplink);
        assert_eq!(u.reordered, 0, "PSN order kept on up{}", u.uplink);
    }
}

fn member_packets(stats: &serde_json::Value) -> Vec<u64> {
    stats["groups"][0]["members"]
        .as_array()
        .expect("members in stats")
        .iter()
        .map(|m| m["packets"].as_u64().unwrap())
        .collect()
}

#[test]
fn qp_hashing_spreads_qps_over_every_uplink() {
    for family in [Family::V4, Family::V6] {
        let (report, stats, output) = run_lab("qp", &[family]);
        assert_packets_intact(&report);
        let fair = report.sent as f64 / UPLINKS as f64;
        for u in &report.uplinks {
            assert!(u.packets > 0, "{family:?}: up{} got nothing:\n{}", u.uplink, report.render());
            assert!(
                (u.packets as f64) <= 2.0 * fair,
                "{family:?}: up{} got more than twice its fair share:\n{}",
                u.uplink,
                report.render()
            );
        }
        // The dataplane's own per-member counters agree with what arrived.
        let mut counted = member_packets(&stats);
        let mut arrived: Vec<u64> = report.uplinks.iter().map(|u| u.packets).collect();
        counted.sort_unstable();
        arrived.sort_unstable();
        assert_eq!(counted, arrived, "member counters vs captured packets");
        assert!(output.contains("final counters"), "run prints final counters on exit:\n{output}");
    }
}

#[test]
fn five_tuple_hashing_piles_one_source_port_onto_one_uplink() {
    for family in [Family::V4, Family::V6] {
        let (report, stats, _) = run_lab("five-tuple", &[family]);
        assert_packets_intact(&report);
        assert_eq!(report.active_uplinks(), 1, "{family:?}: one five-tuple must use one uplink:\n{}", report.render());
        assert_eq!(member_packets(&stats).iter().sum::<u64>(), report.sent);
    }
}

/// `rocev2 entropy` predicts what the dataplane does: the lab's sender and
/// destination are the simulator's host 0 and its peer, so sending the
/// simulator's own QPs and source ports through the real `rocev2 run` must
/// give exactly the per-uplink numbers the simulator prints.
#[test]
fn entropy_simulator_matches_the_dataplane_counters() {
    use rocev2_common::bth::{opcode, Bth};
    use rocev2_user::{
        testbed::ecmp_lab::lab_frame_from_port,
        tools::entropy::{qpns, simulate, source_port, Scenario, SimHash, SportModel},
    };
    require_root();
    const PACKETS: u32 = 5;
    for (hash, sim_hash) in [("qp", SimHash::Qp), ("five-tuple", SimHash::FiveTuple)] {
        let scenario = Scenario {
            hosts: 1,
            qps: 48,
            sport: SportModel::Nic,
            uplinks: UPLINKS as u32,
            hash: sim_hash,
            seed: 1234,
            hash_version: rocev2_common::hash::HashVersion::V1,
            messages: 1,
            flowlet_slots: None,
        };
        let predicted = simulate(&scenario);
        let lab = EcmpLab::create(UPLINKS).unwrap();
        let config = lab.write_config(hash).unwrap();
        let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
        let mut frames = Vec::new();
        for q in 0..scenario.qps {
            let (_, dest_qp) = qpns(0, q);
            let sport = source_port(scenario.sport, scenario.seed, 0, q);
            for psn in 0..PACKETS {
                let bth = Bth::new(opcode::WRITE_MIDDLE, dest_qp, psn);
                frames.push(lab_frame_from_port(Family::V4, bth, 2, 256, sport));
            }
        }
        let report = lab.send_bursts_and_capture(vec![frames], std::time::Duration::ZERO).unwrap();
        dataplane.stop().unwrap();
        let got: Vec<u64> = report.uplinks.iter().map(|u| u.packets).collect();
        let want: Vec<u64> = predicted.flows_per_uplink.iter().map(|f| u64::from(*f) * u64::from(PACKETS)).collect();
        assert_eq!(got, want, "{hash}: dataplane per-uplink packets vs `rocev2 entropy` prediction");
    }
}
