//! Routes from a real routing daemon: FRR (zebra + bgpd) on a leaf and on
//! four spines, eBGP with `maximum-paths`, and `rocev2 run` on the leaf
//! with `[routing] source = "kernel"`. Zebra installs the multipath route
//! as a nexthop object; rocev2 follows it.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::dataplane::Maps,
    testbed::ecmp_lab::{lab_frame_to, lab_frames, EcmpLab, Family, LabReport},
    testbed::frr::{bgp_config, Frr},
};

const SPINES: usize = 4;
const QPS: u32 = 64;
const LEAF_ASN: u32 = 65000;

fn spine_asn(i: usize) -> u32 {
    65100 + i as u32
}

/// The lab's switch config with routes learned from the kernel instead of
/// `[[route]]`s.
fn kernel_config(lab: &EcmpLab, hash: &str, extra: &str) -> String {
    format!(
        "[dataplane]\nhash = \"{hash}\"\nhash_seed = 1234\npin_dir = \"{}\"\n\n[routing]\nsource = \"kernel\"\n\n[[port]]\nname = \"p0\"\n{extra}",
        lab.pin_dir().display()
    )
}

/// FRR on every spine (advertising the lab's destination prefix over
/// IPv4 or IPv6 sessions) and on the leaf, converged.
fn start_bgp(lab: &EcmpLab, family: Family) -> (Vec<Frr>, Frr) {
    // Uplink i's subnet is 10.0.i.0/24 and fd00:i::/64: the leaf is .1, the spine .2.
    let prefix = if family == Family::V4 { "10.1.0.0/16" } else { "fd01::/64" };
    let subnet = |i: usize, end: u8| match family {
        Family::V4 => format!("10.0.{i}.{end}"),
        Family::V6 => format!("fd00:{i}::{end}"),
    };
    let leaf_of = |i| subnet(i, 1);
    let spine_of = |i| subnet(i, 2);
    let mut spines = Vec::new();
    for (i, ns) in lab.uplinks.iter().enumerate() {
        let i = i + 1;
        let config = bgp_config(spine_asn(i), &format!("10.0.{i}.2"), &[(leaf_of(i), LEAF_ASN.to_string())], &[prefix]);
        spines.push(Frr::start(ns.name(), &config).expect("start FRR on a spine"));
    }
    let peers: Vec<(String, String)> =
        (1..=lab.uplinks.len()).map(|i| (spine_of(i), spine_asn(i).to_string())).collect();
    let leaf = Frr::start(lab.switch.name(), &bgp_config(LEAF_ASN, "10.0.0.254", &peers, &[])).expect("start FRR");
    let n = lab.uplinks.len();
    leaf.wait_route(prefix, &format!("{n} paths"), |t| t.matches(" via ").count() == n, Duration::from_secs(30))
        .expect("BGP converges");
    (spines, leaf)
}

fn assert_intact(report: &LabReport) {
    rocev2_tests::assert_no_switch_loss(report, "every packet arrives once");
    for u in &report.uplinks {
        assert_eq!((u.bad_ttl, u.bad_ipv4_checksum, u.bad_icrc, u.reordered), (0, 0, 0, 0), "up{}", u.uplink);
    }
}

/// `ip route replace` of the lab destination over both uplinks (RTA_MULTIPATH).
#[rustfmt::skip]
const MULTIPATH_OVER_BOTH_UPLINKS: [&str; 13] = [
    "route", "replace", "10.1.0.0/16", "nexthop", "via", "10.0.1.2", "dev", "u1", "nexthop", "via", "10.0.2.2", "dev", "u2",
];

/// 64 QPs of `family` arrive intact, over every uplink of the lab.
fn assert_spreads_over_every_uplink(lab: &EcmpLab, family: Family) {
    let report = lab.send_bursts_and_capture(vec![lab_frames(QPS, 2, &[family])], Duration::ZERO).unwrap();
    assert_intact(&report);
    assert_eq!(report.active_uplinks(), lab.uplinks.len(), "{}", report.render());
}

/// Which uplink each QP took.
fn uplink_of_each_qp(report: &LabReport) -> BTreeMap<u32, usize> {
    let mut out = BTreeMap::new();
    for u in &report.uplinks {
        for qp in &u.qps {
            assert!(out.insert(*qp, u.uplink).is_none(), "QP {qp:#x} split over two uplinks");
        }
    }
    out
}

/// The member count the live dataplane gives the destination's group.
fn live_members(pin_dir: &Path, dst: &str) -> Option<u32> {
    let maps = Maps::open_pinned(pin_dir).ok()?;
    let slot = maps.route_target(dst.parse().unwrap()).ok()??;
    maps.group(slot).ok().map(|g| g.member_count)
}

fn wait_live_members(pin_dir: &Path, dst: &str, want: u32) -> Duration {
    let start = Instant::now();
    while live_members(pin_dir, dst) != Some(want) {
        assert!(start.elapsed() < Duration::from_secs(20), "the dataplane never reached {want} members for {dst}");
        std::thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

fn stats_json(pin_dir: &Path) -> serde_json::Value {
    let out = std::process::Command::new(rocev2_bin())
        .arg("stats")
        .arg("--json")
        .arg("--pin-dir")
        .arg(pin_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The main case: 64 QPs on one source port spread over all four
/// BGP paths; a spine withdraws the prefix and only its QPs move; it
/// advertises again and they come back.
#[test]
fn bgp_multipath_spreads_qps_and_a_withdrawal_moves_only_that_spines_qps() {
    require_root();
    let lab = EcmpLab::create(SPINES).unwrap();
    let (spines, _leaf) = start_bgp(&lab, Family::V4);
    let config = lab.write_config_text("kernel", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("rocev2 run with kernel routes");
    let pin_dir = lab.pin_dir();
    assert_eq!(live_members(&pin_dir, "10.1.0.1"), Some(4), "learned group with 4 members:\n{}", dataplane.output());

    let frames = lab_frames(QPS, 4, &[Family::V4]);
    let before = lab.send_bursts_and_capture(vec![frames.clone()], Duration::ZERO).unwrap();
    assert_intact(&before);
    assert_eq!(before.active_uplinks(), SPINES, "64 QPs use all four BGP paths:\n{}", before.render());
    let placed = uplink_of_each_qp(&before);

    // Spine 3 withdraws the prefix: zebra points the route at a new
    // nexthop group of three; rocev2 follows.
    spines[2]
        .vtysh(&["configure terminal", "router bgp 65103", "address-family ipv4 unicast", "no network 10.1.0.0/16"])
        .unwrap();
    let took = wait_live_members(&pin_dir, "10.1.0.1", 3);
    let after = lab.send_bursts_and_capture(vec![frames.clone()], Duration::ZERO).unwrap();
    assert_intact(&after);
    assert_eq!(after.uplinks[2].packets, 0, "nothing goes to the withdrawn spine:\n{}", after.render());
    let moved: Vec<(u32, usize, usize)> = uplink_of_each_qp(&after)
        .into_iter()
        .filter(|(qp, up)| placed[qp] != *up)
        .map(|(qp, up)| (qp, placed[&qp], up))
        .collect();
    assert!(!moved.is_empty());
    assert!(moved.iter().all(|(_, from, _)| *from == 3), "only spine 3's QPs move (buckets): {moved:?}");
    println!("withdrawal followed in {took:?} (polled from the test); {} QPs moved, all from spine 3", moved.len());

    // It advertises again: four members, and the QPs go back where they were.
    spines[2]
        .vtysh(&["configure terminal", "router bgp 65103", "address-family ipv4 unicast", "network 10.1.0.0/16"])
        .unwrap();
    wait_live_members(&pin_dir, "10.1.0.1", 4);
    let back = lab.send_bursts_and_capture(vec![frames], Duration::ZERO).unwrap();
    assert_intact(&back);
    assert_eq!(uplink_of_each_qp(&back), placed, "a returning path gets its own buckets back");

    let stats = stats_json(&pin_dir);
    let learned = &stats["learned"];
    assert!(learned["apply_samples"].as_u64().unwrap() >= 2, "{learned}");
    println!(
        "kernel event -> dataplane: p50 {} us, p99 {} us over {} batches",
        learned["apply_us_p50"], learned["apply_us_p99"], learned["apply_samples"]
    );
    let output = dataplane.stop().unwrap();
    assert!(output.contains("following kernel table 254"), "{output}");
}

/// IPv6 sessions and an IPv6 prefix: the same, for the other family.
#[test]
fn bgp_ipv6_routes_are_followed() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let (_spines, _leaf) = start_bgp(&lab, Family::V6);
    let config = lab.write_config_text("kernel6", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    assert_eq!(live_members(&lab.pin_dir(), "fd01::1"), Some(2), "{}", dataplane.output());
    assert_spreads_over_every_uplink(&lab, Family::V6);
    dataplane.stop().unwrap();
}

/// Weights from `ip nexthop ... weight` split 256 QPs in proportion.
#[test]
fn nexthop_object_weights_split_traffic_in_proportion() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = |args: &[&str]| lab.in_switch(&[&["ip"], args].concat()).unwrap();
    sw(&["nexthop", "add", "id", "101", "via", "10.0.1.2", "dev", "u1"]);
    sw(&["nexthop", "add", "id", "102", "via", "10.0.2.2", "dev", "u2"]);
    sw(&["nexthop", "add", "id", "110", "group", "101,1/102,3"]);
    sw(&["route", "add", "10.1.0.0/16", "nhid", "110"]);
    let config = lab.write_config_text("weights", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let report = lab.send_bursts_and_capture(vec![lab_frames(256, 1, &[Family::V4])], Duration::ZERO).unwrap();
    assert_intact(&report);
    let share = report.uplinks[1].packets as f64 / report.sent as f64;
    assert!((share - 0.75).abs() <= 0.075, "weight 3 of 4 should carry 75% +-10%: {:.3}\n{}", share, report.render());
    // The group is named after its members and weights.
    let stats = stats_json(&lab.pin_dir());
    let names: Vec<&str> = stats["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
    assert!(names.contains(&"nh:u1+u2*3"), "{names:?}");
    dataplane.stop().unwrap();
}

/// A blackhole route inside a forwarded prefix goes to the kernel, counted,
/// and a route added, changed and removed under `run` is followed.
#[test]
fn route_changes_are_followed_and_unservable_routes_go_to_the_kernel() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = |args: &[&str]| lab.in_switch(&[&["ip"], args].concat()).unwrap();
    let config = lab.write_config_text("changes", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir();
    assert_eq!(live_members(&pin_dir, "10.1.0.1"), None, "no route yet");
    sw(&["route", "add", "10.1.0.0/16", "via", "10.0.1.2", "dev", "u1"]);
    wait_live_members(&pin_dir, "10.1.0.1", 1);
    let one = lab.send_bursts_and_capture(vec![lab_frames(16, 2, &[Family::V4])], Duration::ZERO).unwrap();
    assert_intact(&one);
    assert_eq!(one.uplinks[0].packets, one.sent, "{}", one.render());
    sw(&MULTIPATH_OVER_BOTH_UPLINKS);
    wait_live_members(&pin_dir, "10.1.0.1", 2);
    sw(&["route", "add", "blackhole", "10.1.0.0/24"]);
    let start = Instant::now();
    loop {
        let maps = Maps::open_pinned(&pin_dir).unwrap();
        if maps.route_target("10.1.0.1".parse().unwrap()).unwrap() == Some(rocev2_common::maps::ROUTE_KERNEL) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "blackhole route not followed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let to_kernel = lab.send_bursts_and_capture(vec![lab_frames(4, 1, &[Family::V4])], Duration::ZERO).unwrap();
    assert_eq!(to_kernel.received(), 0, "the blackhole is the kernel's: nothing forwarded");
    let stats = stats_json(&pin_dir);
    assert_eq!(stats["learned"]["to_kernel"]["reject"], 1, "{}", stats["learned"]);
    let port = &stats["ports"][0]["counters"];
    assert_eq!(port["pass_kernel_route"], 4, "{port}");
    sw(&["route", "del", "blackhole", "10.1.0.0/24"]);
    sw(&["route", "del", "10.1.0.0/16"]);
    let start = Instant::now();
    while live_members(&pin_dir, "10.1.0.1").is_some() {
        assert!(start.elapsed() < Duration::from_secs(10), "route removal not followed");
        std::thread::sleep(Duration::from_millis(5));
    }
    dataplane.stop().unwrap();
}

/// A BGP unnumbered session on `interface`.
fn unnumbered(interface: &str) -> (String, String) {
    (interface.to_string(), "external".to_string())
}

/// BGP unnumbered: IPv4 routes whose next hops are the spines' IPv6
/// link-local addresses (`via inet6 fe80::...`).
#[test]
fn bgp_unnumbered_ipv4_over_ipv6_link_local_next_hops() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let mut spines = Vec::new();
    for (i, ns) in lab.uplinks.iter().enumerate() {
        let config = bgp_config(spine_asn(i + 1), &format!("10.0.{}.2", i + 1), &[unnumbered("up0")], &["10.1.0.0/16"]);
        spines.push(Frr::start(ns.name(), &config).unwrap());
    }
    let leaf =
        Frr::start(lab.switch.name(), &bgp_config(LEAF_ASN, "10.0.0.254", &[unnumbered("u1"), unnumbered("u2")], &[]))
            .unwrap();
    let route = leaf
        .wait_route(
            "10.1.0.0/16",
            "2 IPv6 link-local paths",
            |t| t.matches("via inet6 fe80").count() == 2,
            Duration::from_secs(40),
        )
        .unwrap();
    let config = lab.write_config_text("unnumbered", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    assert_eq!(live_members(&lab.pin_dir(), "10.1.0.1"), Some(2), "{route}\n{}", dataplane.output());
    assert_spreads_over_every_uplink(&lab, Family::V4);
    dataplane.stop().unwrap();
}

/// A host on a connected subnet (here the far end of u1, 10.0.1.2) gets a
/// host entry from the neighbour table, so its RoCE traffic is forwarded
/// in XDP: the port counters say `forwarded`, not `pass_*`.
#[test]
fn connected_hosts_are_forwarded_in_xdp() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config_text("hosts", &kernel_config(&lab, "qp", "")).unwrap();
    // The switch learns its neighbour the ordinary way.
    lab.in_switch(&[
        "ip",
        "neigh",
        "replace",
        "10.0.1.2",
        "lladdr",
        "02:52:32:02:00:01",
        "dev",
        "u1",
        "nud",
        "reachable",
    ])
    .unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir();
    assert_eq!(live_members(&pin_dir, "10.0.1.2"), Some(1), "{}", dataplane.output());
    let dst = "10.0.1.2".parse().unwrap();
    let frames: Vec<Vec<u8>> = (0..20)
        .map(|psn| {
            lab_frame_to(
                dst,
                rocev2_common::bth::Bth::new(rocev2_common::bth::opcode::WRITE_MIDDLE, 0x42, psn),
                2,
                128,
                0xC000,
            )
        })
        .collect();
    // (The lab's capture counts only the lab destination; the dataplane's
    // own counters say where these went.)
    lab.send_bursts_and_capture(vec![frames], Duration::ZERO).unwrap();
    let stats = stats_json(&pin_dir);
    let counters = &stats["ports"][0]["counters"];
    assert_eq!(counters["forwarded"], 20, "{counters}");
    let host = stats["groups"].as_array().unwrap().iter().find(|g| g["name"] == "nh:u1/10.0.1.2").expect("host group");
    assert_eq!(host["members"][0]["packets"], 20, "{host}");
    assert_eq!(stats["learned"]["hosts"], 1, "{}", stats["learned"]);
    // The neighbour goes away: so does the host entry (the subnet's route
    // sends the host to the kernel again).
    lab.in_switch(&["ip", "neigh", "del", "10.0.1.2", "dev", "u1"]).unwrap();
    let start = Instant::now();
    loop {
        let maps = Maps::open_pinned(&pin_dir).unwrap();
        if maps.route_target(dst).unwrap() == Some(rocev2_common::maps::ROUTE_KERNEL) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "host entry not removed");
        std::thread::sleep(Duration::from_millis(5));
    }
    dataplane.stop().unwrap();
}

/// `kill -9` of `rocev2 run` while FRR keeps running: the next `run` takes
/// over the attached programs and reads the kernel table afresh; then FRR
/// itself restarts (routes withdrawn and learned again) and is followed.
#[test]
fn a_killed_run_is_taken_over_and_an_frr_restart_is_followed() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let (_spines, leaf) = start_bgp(&lab, Family::V4);
    let config = lab.write_config_text("takeover", &kernel_config(&lab, "qp", "")).unwrap();
    let first = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    first.kill();
    let second = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    assert!(second.output().contains("took over p0"), "{}", second.output());
    let pin_dir = lab.pin_dir();
    assert_eq!(live_members(&pin_dir, "10.1.0.1"), Some(2));
    let report = lab.send_bursts_and_capture(vec![lab_frames(16, 2, &[Family::V4])], Duration::ZERO).unwrap();
    assert_intact(&report);

    // FRR restarts: the leaf's daemons die (zebra leaves its routes), a new
    // zebra removes them at start, bgpd learns them again.
    let messages_before = stats_json(&pin_dir)["learned"]["messages"].as_u64().unwrap();
    let leaf_conf = leaf.config();
    drop(leaf);
    let leaf = Frr::start(lab.switch.name(), &leaf_conf).unwrap();
    leaf.wait_route("10.1.0.0/16", "2 paths", |t| t.matches(" via ").count() == 2, Duration::from_secs(30)).unwrap();
    wait_live_members(&pin_dir, "10.1.0.1", 2);
    // The new zebra swept the old routes and installed new ones: rocev2
    // saw those messages.
    let start = Instant::now();
    while stats_json(&pin_dir)["learned"]["messages"].as_u64().unwrap() < messages_before + 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "the FRR restart's route messages never arrived");
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = lab.send_bursts_and_capture(vec![lab_frames(16, 2, &[Family::V4])], Duration::ZERO).unwrap();
    assert_intact(&report);
    second.stop().unwrap();
}

/// Route changes under a steady stream lose nothing: adding a path,
/// moving the route to a nexthop object, changing weights, dropping back
/// to one path. (The kernel itself loses nothing for these changes either:
/// the destination is reachable throughout.)
#[test]
fn route_changes_under_a_steady_stream_lose_no_packet() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = |args: &[&str]| lab.in_switch(&[&["ip"], args].concat()).unwrap();
    for (i, mac) in [(1, "02:52:32:02:00:01"), (2, "02:52:32:02:00:02")] {
        sw(&["neigh", "replace", &format!("10.0.{i}.2"), "lladdr", mac, "dev", &format!("u{i}"), "nud", "reachable"]);
    }
    sw(&["route", "add", "10.1.0.0/16", "via", "10.0.1.2", "dev", "u1"]);
    let config = lab.write_config_text("stream", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let capture = lab.start_capture().unwrap();
    let stream = lab.start_stream(lab_frames(32, 4, &[Family::V4]), 20_000).unwrap();
    let pause = || std::thread::sleep(Duration::from_millis(300));
    pause();
    sw(&MULTIPATH_OVER_BOTH_UPLINKS);
    pause();
    sw(&["nexthop", "add", "id", "201", "via", "10.0.1.2", "dev", "u1"]);
    sw(&["nexthop", "add", "id", "202", "via", "10.0.2.2", "dev", "u2"]);
    sw(&["nexthop", "add", "id", "210", "group", "201/202"]);
    sw(&["route", "replace", "10.1.0.0/16", "nhid", "210"]);
    pause();
    sw(&["nexthop", "replace", "id", "210", "group", "201,3/202"]);
    pause();
    sw(&["route", "replace", "10.1.0.0/16", "nhid", "202"]);
    pause();
    let sent = stream.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    let output = dataplane.stop().unwrap();
    rocev2_tests::assert_no_switch_loss(
        &report,
        &format!("route changes under a stream (rocev2 run said:\n{output}\n)"),
    );
    assert!(report.uplinks.iter().all(|u| u.packets > 0), "{}", report.render());
    assert!(report.uplinks.iter().all(|u| u.bad_ttl + u.bad_icrc + u.bad_ipv4_checksum == 0));
}

/// `[[pin]]` for learned routes: a route policy makes the learned group
/// `pinned`, and pins name its next hops by device or by address.
#[test]
fn pins_name_learned_next_hops_by_device_or_address() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = |args: &[&str]| lab.in_switch(&[&["ip"], args].concat()).unwrap();
    sw(&MULTIPATH_OVER_BOTH_UPLINKS.map(|a| if a == "replace" { "add" } else { a }));
    let pins = "\n[[route_policy]]\nprefix = \"10.1.0.0/16\"\npolicy = \"pinned\"\n\n\
                [[pin]]\nprefix = \"10.1.0.1/32\"\nqp = 0x100\nmember = \"u2\"\n\n\
                [[pin]]\nprefix = \"10.1.0.0/16\"\nqp = 0x101\nmember = \"10.0.1.2\"\n";
    let config = lab.write_config_text("pins", &kernel_config(&lab, "qp", pins)).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let report = lab.send_bursts_and_capture(vec![lab_frames(16, 2, &[Family::V4])], Duration::ZERO).unwrap();
    assert_intact(&report);
    let placed = uplink_of_each_qp(&report);
    assert_eq!((placed[&0x100], placed[&0x101]), (2, 1), "pinned QPs on their uplinks:\n{}", report.render());
    let stats = stats_json(&lab.pin_dir());
    assert_eq!(
        stats["ports"][0]["counters"]["pin_hit"], 4,
        "two packets each of two pinned QPs: {}",
        stats["ports"][0]
    );
    // The pinned member goes down: its QP falls back to hashing, the other pin holds.
    lab.in_switch(&["ip", "link", "set", "u2", "down"]).unwrap();
    wait_live_members(&lab.pin_dir(), "10.1.0.1", 1);
    let report = lab.send_bursts_and_capture(vec![lab_frames(16, 2, &[Family::V4])], Duration::ZERO).unwrap();
    assert_eq!(report.uplinks[0].packets, report.sent, "all on u1 now:\n{}", report.render());
    dataplane.stop().unwrap();
}

/// `explain` follows a learned route through the live tables: it names the
/// learned group and the member the packet really takes.
#[test]
fn explain_names_the_learned_group_and_the_member_packets_take() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = |args: &[&str]| lab.in_switch(&[&["ip"], args].concat()).unwrap();
    sw(&MULTIPATH_OVER_BOTH_UPLINKS.map(|a| if a == "replace" { "add" } else { a }));
    let config = lab.write_config_text("explain", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let report = lab.send_bursts_and_capture(vec![lab_frames(16, 2, &[Family::V4])], Duration::ZERO).unwrap();
    assert_intact(&report);
    let placed = uplink_of_each_qp(&report);
    for qp in 0x100..0x110u32 {
        let out = std::process::Command::new(rocev2_bin())
            .args(["explain", "--config"])
            .arg(&config)
            .args(["--src", "10.0.0.1", "--dst", "10.1.0.1", "--sport", "49152", "--qp", &qp.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("-> group nh:u1+u2"), "{text}");
        assert!(text.contains(&format!("dev u{} via", placed[&qp])), "QP {qp:#x} took u{}: {text}", placed[&qp]);
    }
    dataplane.stop().unwrap();
}

/// Writes `lines` to a file and runs it with `ip -batch` in `netns`.
fn ip_batch(netns: &str, name: &str, lines: impl Iterator<Item = String>) {
    let path = std::env::temp_dir().join(format!("{name}-{}.batch", std::process::id()));
    std::fs::write(&path, lines.collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let result = rocev2_user::sys::netns::ip(&["-n", netns, "-batch", &path.display().to_string()]);
    std::fs::remove_file(&path).ok();
    result.expect("ip -batch");
}

/// More learned IPv4 prefixes than the dataplane's route table holds: the
/// run keeps going, what does not fit goes to the kernel (counted as
/// `route_table_full`), and so does the /10 covering it, whose group would
/// otherwise carry its traffic. Once routes are withdrawn, all fit again
/// and the /10 is forwarded in XDP once more.
#[test]
fn prefixes_beyond_the_route_table_go_to_the_kernel_with_what_covers_them() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config_text("full", &kernel_config(&lab, "qp", "")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir();
    let host = |i: u32| std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 64, 0, 0)) + i);
    let count = rocev2_common::maps::MAX_ROUTES_V4 + 500;
    lab.in_switch(&["ip", "route", "add", "10.64.0.0/10", "via", "10.0.1.2", "dev", "u1"]).unwrap();
    ip_batch(
        lab.switch.name(),
        "full-add",
        (0..count).map(|i| format!("route add {}/32 via 10.0.2.2 dev u2", host(i))),
    );

    let target = |addr: &str| Maps::open_pinned(&pin_dir).unwrap().route_target(addr.parse().unwrap()).unwrap();
    let kernel = Some(rocev2_common::maps::ROUTE_KERNEL);
    let start = Instant::now();
    // The last /32 did not fit: its address matches the /10, left to the kernel.
    while target(&host(count - 1).to_string()) != kernel {
        assert!(start.elapsed() < Duration::from_secs(60), "the overflow was never left to the kernel");
        std::thread::sleep(Duration::from_millis(50));
    }
    // At least the 500 /32s beyond the table and the /10 are counted, once
    // every route has been read (the /10 goes to the kernel with the first).
    let start = Instant::now();
    loop {
        let learned = stats_json(&pin_dir)["learned"].clone();
        if learned["to_kernel"]["route_table_full"].as_u64().unwrap_or(0) >= 501 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the overflow was never counted: {learned}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(target("10.127.0.1"), kernel, "the /10 covering unfit prefixes goes to the kernel");
    let first = target(&host(0).to_string());
    assert!(first.is_some() && first != kernel, "the first /32s are forwarded in XDP: {first:?}");

    // Withdraw 2,000 /32s: everything fits again.
    ip_batch(lab.switch.name(), "full-del", (count - 2000..count).map(|i| format!("route del {}/32", host(i))));
    let start = Instant::now();
    loop {
        let learned = stats_json(&pin_dir)["learned"].clone();
        if learned["to_kernel"].get("route_table_full").is_none() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the unfit prefixes never came back: {learned}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let covering = target("10.127.0.1");
    assert!(covering.is_some() && covering != kernel, "the /10 is forwarded in XDP again: {covering:?}");
    assert_eq!(target(&host(count - 2001).to_string()), first, "the last /32 left is installed, on the /32s' group");
    dataplane.stop().expect("rocev2 run kept running through the overflow");
}

/// The route mirror against the kernel itself, for IPv6 multipath routes
/// changed the ways zebra (with and without `--v6-rr-semantics`) and `ip`
/// change them: after each change, the mirror that followed the kernel's
/// messages must give every prefix the same next hops as a fresh dump.
/// A replace in place (RTM_NEWROUTE with NLM_F_REPLACE) drops the old
/// set of paths without a delete message; a delete of one path leaves the
/// others.
#[test]
fn the_mirror_follows_ipv6_multipath_routes_replaced_in_place_as_the_kernel_does() {
    use rocev2_user::{
        control::routing::{
            fib::{Fib, Target},
            kernel,
        },
        sys::netlink::RT_TABLE_MAIN,
        sys::netns::{ip, unique_name, veth_between, Netns},
    };
    require_root();
    let mirror = Netns::create(&unique_name("v6rm")).unwrap();
    let peer = Netns::create(&unique_name("v6rp")).unwrap();
    for (i, addr) in [(1u8, "fd00:71::1/64"), (2, "fd00:72::1/64")] {
        veth_between(
            &mirror,
            &format!("u{i}"),
            [2, 0, 0, 0, 7, i],
            &[addr],
            &peer,
            &format!("d{i}"),
            [2, 0, 0, 0, 8, i],
            &[],
        )
        .unwrap();
    }
    let r = "route add fd00:9::/32 proto bgp metric 20";
    let two = "nexthop via fe80::1 dev u1 nexthop via fe80::2 dev u2";
    let steps = [
        // zebra without --v6-rr-semantics: delete, then add anew.
        (format!("{r} {two}"), 2),
        ("route del fd00:9::/32 proto bgp metric 20".into(), 0),
        (format!("{r} via fe80::2 dev u2"), 1),
        // zebra with it: replace in place, to one path and back to two.
        (format!("{r} {two}").replace(" add ", " replace "), 2),
        (format!("{r} via fe80::2 dev u2").replace(" add ", " replace "), 1),
        (format!("{r} {two}").replace(" add ", " replace "), 2),
        (format!("{r} via fe80::1 dev u1").replace(" add ", " replace "), 1),
        // `ip`: a path appended, then one path of two deleted.
        (format!("{r} via fe80::2 dev u2").replace(" add ", " append "), 2),
        (format!("{r} via fe80::1 dev u1").replace(" add ", " del "), 1),
    ];
    let name = mirror.name().to_owned();
    rocev2_user::sys::netns::in_netns(mirror.name(), move || {
        let mut socket = kernel::WaitingEventSocket::open(Duration::from_millis(100))?;
        let mut followed = Fib::default();
        kernel::dump_all(&mut followed, RT_TABLE_MAIN)?;
        let prefix = "fd00:9::/32".parse().unwrap();
        for (step, paths) in &steps {
            let mut args = vec!["-n", name.as_str(), "-6"];
            args.extend(step.split_whitespace());
            ip(&args)?;
            loop {
                let datagrams = socket.receive()?;
                if datagrams.is_empty() {
                    break;
                }
                for datagram in &datagrams {
                    for (kind, message) in kernel::messages(datagram) {
                        kernel::apply(&mut followed, RT_TABLE_MAIN, kind, message);
                    }
                }
            }
            let mut dumped = Fib::default();
            kernel::dump_all(&mut dumped, RT_TABLE_MAIN)?;
            let kernel_has = ip(&["-n", name.as_str(), "-6", "route", "show", "fd00:9::/32"])?;
            let now = followed.target(&prefix);
            let count = match &now {
                Some(Target::Hops(hops)) => hops.len(),
                _ => 0,
            };
            assert_eq!(count, *paths, "after `ip -6 {step}`: {now:?}; the kernel has: {kernel_has}");
            assert_eq!(now, dumped.target(&prefix), "after `ip -6 {step}`; the kernel has: {kernel_has}");
        }
        Ok(())
    })
    .unwrap();
    drop((mirror, peer));
}
