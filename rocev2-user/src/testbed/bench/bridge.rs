//! Host bridge mode's rows: the bridge program's per-packet cost in
//! BPF_PROG_TEST_RUN against the floor and the routed `qp` pipeline
//! (part 1), and bridging through veths against the kernel bridge (part 2).
//!
//! The bridge program's maps are written here as the bridge mirror of
//! `rocev2 run` would write them (the FDB, the ingress port's STP state,
//! the uplink group), so the rows measure the dataplane alone.

use super::forwarding::{ifindex_in, in_ns, measure, Lab, GEN_CPU, SENDER_MAC};
#[allow(unused_imports, reason = "the parent's items and imports, of which this part uses some")]
use super::*;
use crate::{
    control::dataplane::XDP_BRIDGE_PROGRAM,
    testbed::topology::{base_sysctls, build_topology, strs, NsPlan, VethPlan},
};
use rocev2_common::maps::{BridgePort, FdbEntry, FdbKey, BRIDGE_PORT_FORWARDING, FDB_PORT, FDB_UPLINK};

/// The anycast gateway MAC every uplink peer of the bridge lab answers to.
pub(super) const GATEWAY_MAC: [u8; 6] = [2, 0x42, 0x0A, 0, 0, 1];
/// The ingress bridge port's counter slot (the sender's side).
const INGRESS_SLOT: u32 = 1;
/// Another port's slot: where a host known to the FDB sits in part 1.
const OTHER_SLOT: u32 = 2;
/// Part 1's destination MACs: a host on another bridge port, the gateway.
const PORT_HOST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x22];

/// What the bridge program does with the frame of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum BridgeTarget {
    /// Known unicast: the FDB names one port.
    Port,
    /// The gateway's MAC, behind an uplink group hashing by QP.
    UplinkGroup,
}

impl BridgeTarget {
    pub(super) fn name(self) -> &'static str {
        match self {
            BridgeTarget::Port => "rocev2 bridge, FDB to one port",
            BridgeTarget::UplinkGroup => "rocev2 bridge, qp over an uplink group",
        }
    }
}

/// Installs one FDB entry.
fn set_fdb(dp: &mut Dataplane, mac: [u8; 6], kind: u32, target: u32, port_slot: u32) -> Result<()> {
    Ok(dp.maps.set_fdb(FdbKey { mac, vlan: 0 }, FdbEntry { kind, target, port_slot, active: 0 })?)
}

/// A dataplane with the features of a plain `qp` config (the bridge
/// program verified now), `ingress` a forwarding bridge port on which the
/// FDB has the sender, `egress` the ports it may redirect to.
fn bridge_dataplane(ingress: u32, sender: [u8; 6], egress: &[u32]) -> Result<Dataplane> {
    let mut dp = load_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, Pipeline::Qp.features())?;
    dp.preload(&[XDP_BRIDGE_PROGRAM])?;
    dp.maps.set_port(ingress, INGRESS_SLOT)?;
    dp.maps.set_bridge_port(INGRESS_SLOT, BridgePort { flags: BRIDGE_PORT_FORWARDING, uplink: 0 })?;
    for idx in egress {
        dp.maps.add_egress_dev(*idx)?;
    }
    set_fdb(&mut dp, sender, FDB_PORT, ingress, INGRESS_SLOT)?;
    Ok(dp)
}

/// Points `mac` at `target`: one port, or the uplink group GROUP of
/// `members` with `qp` hashing (frames leave unchanged, so the members
/// need no MACs).
fn point_at(dp: &mut Dataplane, mac: [u8; 6], target: BridgeTarget, members: &[u32], port_slot: u32) -> Result<()> {
    match target {
        BridgeTarget::Port => set_fdb(dp, mac, FDB_PORT, members[0], port_slot),
        BridgeTarget::UplinkGroup => {
            let members: Vec<MemberSpec> =
                members.iter().map(|&ifindex| MemberSpec { ifindex, src_mac: [0; 6], dst_mac: [0; 6] }).collect();
            dp.maps.publish_group_with(GROUP, &GroupPolicy::hash(HashMode::Qp), &members)?;
            set_fdb(dp, mac, FDB_UPLINK, GROUP, 0)
        }
    }
}

/// Part 1's bridge rows: the floor, the routed `qp` pipeline and the
/// bridge program's two forwarding cases measured interleaved (IPv4 and
/// IPv6, 10 routes), each reported above the floor and against routed qp.
pub(super) fn per_packet_rows(args: &BenchArgs) -> Result<Vec<Row>> {
    eprintln!("bench: bridge program, per-packet cost");
    let mut floor = test_run_floor()?;
    let mut routed = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, Pipeline::Qp.features())?;
    Pipeline::Qp.configure(&mut routed, &lo_members(0xBB), &[LOOPBACK])?;
    // The frames come from bench_frame's source MAC, on lo.
    let sender = [2, 0, 0, 0, 0, 1];
    let mut bridged = bridge_dataplane(LOOPBACK, sender, &[LOOPBACK])?;
    point_at(&mut bridged, PORT_HOST_MAC, BridgeTarget::Port, &[LOOPBACK], OTHER_SLOT)?;
    point_at(&mut bridged, GATEWAY_MAC, BridgeTarget::UplinkGroup, &[LOOPBACK; 4], 0)?;
    let targets = [(BridgeTarget::Port, PORT_HOST_MAC), (BridgeTarget::UplinkGroup, GATEWAY_MAC)];

    // Sample keys: 0 floor, 1 routed qp, 2.. the bridge targets.
    let mut samples: BTreeMap<(usize, bool), Vec<f64>> = BTreeMap::new();
    for _round in 0..args.rounds {
        for v6 in [false, true] {
            let routed_frame = bench_frame(v6, 255, [2, 0, 0, 0, 0, 0xFE]);
            samples.entry((0, v6)).or_default().push(cost_ns(
                &mut floor,
                XDP_REDIRECT_PROGRAM,
                &routed_frame,
                args.packets,
            )?);
            samples.entry((1, v6)).or_default().push(cost_ns(&mut routed, XDP_PROGRAM, &routed_frame, args.packets)?);
            for (k, (_, mac)) in targets.iter().enumerate() {
                let frame = bench_frame(v6, 255, *mac);
                let ns = cost_ns(&mut bridged, XDP_BRIDGE_PROGRAM, &frame, args.packets)?;
                samples.entry((k + 2, v6)).or_default().push(ns);
            }
        }
    }
    let mut rows = Vec::new();
    for v6 in [false, true] {
        let fam = if v6 { "IPv6" } else { "IPv4" };
        let at = |k: usize| median(samples[&(k, v6)].clone());
        let (floor, qp) = (at(0), at(1));
        for (k, (target, _)) in targets.iter().enumerate() {
            let ns = at(k + 2);
            let above = ns - floor;
            rows.push(row(
                "1 per-packet",
                target.name(),
                format!("{fam}, floor {floor:.1} ns and routed qp {qp:.1} ns measured alongside"),
                format!("{ns:.1} ns"),
                format!("+{above:.1} ns ({:+.1} ns against routed qp)", ns - qp),
                String::new(),
            ));
        }
    }
    Ok(rows)
}

impl Lab {
    /// The host bridge lab of part 2: sender -> a switch namespace whose
    /// Linux bridge joins p0 and the uplinks -> receivers that all answer
    /// to [`GATEWAY_MAC`] (an anycast gateway). The kernel bridge has the
    /// gateway on u1 (a static entry, as it would after learning it there;
    /// the uplinks do not learn, so it stays).
    pub(super) fn create_bridge() -> Result<Self> {
        let tag = unique_name("rbb");
        let (snd, sw) = (format!("{tag}s"), format!("{tag}w"));
        let mut switch_cmds =
            vec![strs(&["link", "add", "br0", "type", "bridge", "stp_state", "0", "mcast_snooping", "0"])];
        let mut links = vec![VethPlan {
            a_ns: snd.clone(),
            a_if: "snd0".into(),
            a_mac: SENDER_MAC,
            a_addrs: vec![],
            b_ns: sw.clone(),
            b_if: "p0".into(),
            b_mac: super::forwarding::SWITCH_MAC,
            b_addrs: vec![],
            // NAPI on p0 for live frames while no XDP program runs there
            // (the kernel bridge's row).
            gro_b: true,
        }];
        switch_cmds.push(strs(&["link", "set", "p0", "master", "br0"]));
        let mut uplinks = Vec::new();
        for i in 1..=UPLINKS {
            let up = format!("{tag}u{i}");
            uplinks.push(NsPlan::new(&up, false));
            let port = format!("u{i}");
            links.push(VethPlan {
                a_ns: sw.clone(),
                a_if: port.clone(),
                a_mac: super::forwarding::up_switch_mac(i),
                a_addrs: vec![],
                b_ns: up,
                b_if: "up0".into(),
                b_mac: GATEWAY_MAC,
                b_addrs: vec![],
                gro_b: false,
            });
            switch_cmds.push(strs(&["link", "set", &port, "master", "br0"]));
            switch_cmds.push(strs(&["link", "set", &port, "type", "bridge_slave", "learning", "off"]));
        }
        switch_cmds.push(strs(&["link", "set", "br0", "up"]));
        let switch = NsPlan { name: sw.clone(), sysctls: base_sysctls(false), lo_addrs: vec![], routes: switch_cmds };
        let mut namespaces = vec![NsPlan::new(&snd, false), switch];
        namespaces.extend(uplinks);
        let mut made: Vec<Netns> = Vec::new();
        build_topology(&namespaces, &links, &mut made)?;
        let lab = Lab::from_made(made, GATEWAY_MAC)?;
        let gateway = crate::sys::format_mac(&GATEWAY_MAC);
        netns::ip(&["netns", "exec", &sw, "bridge", "fdb", "replace", &gateway, "dev", "u1", "master", "static"])?;
        Ok(lab)
    }
}

/// Part 2's bridge rows: the kernel bridge alone, then the bridge program
/// to one port and over the uplink group, through the same veths, fed by
/// the same generator as the routed rows (`mode`), row order rotated each
/// round. `routed_qp_vs_kernel` is the routed qp row's ratio against
/// kernel forwarding in this run: the goal for the uplink group's ratio
/// against the kernel bridge.
pub(super) fn forwarding_rows(args: &BenchArgs, mode: GenMode, routed_qp_vs_kernel: Option<f64>) -> Result<Vec<Row>> {
    eprintln!("bench: bridging through veths");
    let lab = Lab::create_bridge()?;
    let sw = lab.switch().to_owned();
    let p0 = ifindex_in(&sw, "p0")?;
    let uplinks: Vec<u32> = (1..=UPLINKS).map(|i| ifindex_in(&sw, &format!("u{i}"))).collect::<Result<_>>()?;
    let mut rx = ToolPrograms::load()?;
    lab.attach_receivers(&mut rx)?;

    // One instance per rocev2 row; device-map entries resolve ifindexes in
    // the caller's namespace, so they are written from inside the switch's.
    let targets = [BridgeTarget::Port, BridgeTarget::UplinkGroup];
    let mut instances = Vec::new();
    for target in targets {
        let mut dp = in_ns(&sw, || bridge_dataplane(p0, SENDER_MAC, &uplinks))?;
        point_at(&mut dp, GATEWAY_MAC, target, &uplinks, OTHER_SLOT)?;
        instances.push(dp);
    }
    let names: Vec<&str> = std::iter::once(KERNEL_BRIDGE).chain(targets.iter().map(|t| t.name())).collect();
    let gen_name = match mode {
        GenMode::Packet => "AF_PACKET",
        GenMode::LiveFrames => "XDP live frames",
    };
    let mut samples: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
    let mut uplinks_used: BTreeMap<usize, usize> = BTreeMap::new();
    for round in 0..args.fwd_rounds {
        for k in 0..names.len() {
            let i = (k + round) % names.len();
            let link = match i {
                0 => None,
                _ => {
                    let prog = instances[i - 1].xdp_program(XDP_BRIDGE_PROGRAM)?;
                    Some(in_ns(&sw, || Ok(prog.attach_to_if_index(p0, XdpMode::Driver)?))?)
                }
            };
            let before = lab.received_per_uplink()?;
            let m = measure(&lab, args.seconds, mode);
            let after = lab.received_per_uplink()?;
            if let Some(id) = link {
                let prog = instances[i - 1].xdp_program(XDP_BRIDGE_PROGRAM)?;
                in_ns(&sw, || Ok(prog.detach(id)?))?;
            }
            let m = m?;
            // An uplink counts as used when it got at least 5% of the frames.
            let got: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            let total: u64 = got.iter().sum();
            let used = got.iter().filter(|g| **g * 20 >= total.max(1)).count();
            uplinks_used.insert(i, used);
            eprintln!(
                "bench:   {gen_name:>15} {:<50} sent {:.3} Mpps, received {:.3} Mpps on {used} uplinks",
                names[i],
                m.0 / 1e6,
                m.1 / 1e6
            );
            samples.entry(i).or_default().push(m);
        }
    }
    drop(instances);
    drop(rx);
    drop(lab);
    let rate = |i: usize| median(samples[&i].iter().map(|m| m.1).collect());
    let sent = |i: usize| median(samples[&i].iter().map(|m| m.0).collect());
    let kernel = rate(0);
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let ratio = rate(i) / kernel;
        let target = match (i, routed_qp_vs_kernel) {
            (2, Some(goal)) => {
                format!(">= routed qp's {goal:.2}x kernel: {}", if ratio >= goal { "met" } else { "MISSED" })
            }
            _ => String::new(),
        };
        rows.push(row(
            "2 forwarding",
            *name,
            format!(
                "IPv4, {gen_name}, offered {:.2} Mpps, to the gateway's MAC; {} of {UPLINKS} uplinks used",
                sent(i) / 1e6,
                uplinks_used[&i]
            ),
            format!("{:.3} Mpps", rate(i) / 1e6),
            format!("{ratio:.2}x kernel bridge"),
            target,
        ));
    }
    Ok(rows)
}

/// The kernel row's name.
const KERNEL_BRIDGE: &str = "Linux kernel bridge (the gateway's MAC on one port)";

/// How part 2's bridge rows are made, for the report.
pub(super) fn how() -> String {
    format!(
        "- Bridge rows: part 1 runs `{XDP_BRIDGE_PROGRAM}` on the same frame addressed to a host the FDB has on another port, and to an anycast gateway's MAC behind a `qp` uplink group of 4 members, interleaved with the floor and the routed qp pipeline. Part 2: sender -> a switch namespace whose Linux bridge `br0` (STP off) joins p0 and {UPLINKS} uplinks -> {UPLINKS} receivers that share one MAC (an anycast gateway), fed like the routed rows with frames to that MAC; the kernel bridge has it on u1 (a static entry; the uplinks do not learn), rocev2's FDB and group are written as its bridge mirror would write them. An uplink counts as used when it received at least 5% of a measurement's frames. The goal: the uplink group's ratio against the kernel bridge at least the routed qp row's against kernel forwarding, both from this run; generator CPU {GEN_CPU}.\n"
    )
}
