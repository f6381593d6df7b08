//! `rocev2 explain`: which uplink would this packet take, and why?
//!
//! The decision itself is `control::decision`, the userspace model of the
//! XDP program's choice (shared with `trace`, `top` and the collision
//! detector); this module is the command: its arguments, the live state it
//! reads for the packet, and the printed explanation.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use rocev2_common::buckets::BUCKETS_PER_GROUP;
use rocev2_common::{
    flowlet::FlowletTable,
    hash::{HashMode, HashVersion},
};

use crate::{
    control::config::{Config, Policy},
    control::dataplane::Maps,
    control::decision::{
        bridge::{explain_bridged, read_live_bridge, Frame},
        explain, parse_qp, read_live, Explanation, Forwarding, PacketFields, Verdict, IPPROTO_TCP, IPPROTO_UDP,
    },
};

#[derive(clap::Args, Debug, Clone)]
pub struct ExplainArgs {
    /// The configuration file `rocev2 run` uses (its routes, groups and
    /// pin_dir, through which a live run's members are read).
    #[arg(long, short, value_name = "FILE", default_value = crate::sys::paths::DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Source address of the packet.
    #[arg(long)]
    pub src: IpAddr,
    /// Destination address of the packet.
    #[arg(long)]
    pub dst: IpAddr,
    /// IP protocol: udp, tcp or a number (other protocols hash with ports 0).
    #[arg(long, default_value = "udp")]
    pub proto: String,
    /// UDP/TCP source port.
    #[arg(long, default_value_t = 0xC000)]
    pub sport: u16,
    /// UDP/TCP destination port (4791 is RoCEv2).
    #[arg(long, default_value_t = 4791)]
    pub dport: u16,
    /// BTH destination QP (RoCEv2 only: UDP to port 4791), 24 bits,
    /// decimal or 0x-hex.
    #[arg(long, value_parser = parse_qp)]
    pub qp: Option<u32>,
    /// Bridge mode (`[bridge]`): the frame's destination MAC. The bridge
    /// program decides by it, in the FDB, instead of by a route.
    #[arg(long, value_parser = parse_mac_arg)]
    pub dst_mac: Option<[u8; 6]>,
    /// Bridge mode, with `--in-port`: the frame's source MAC, checked as
    /// the program does (a source not learned on that port goes to the
    /// kernel bridge).
    #[arg(long, value_parser = parse_mac_arg, requires = "dst_mac")]
    pub src_mac: Option<[u8; 6]>,
    /// Bridge mode: the bridge port the frame arrives on.
    #[arg(long, requires = "dst_mac")]
    pub in_port: Option<String>,
}

fn parse_mac_arg(text: &str) -> Result<[u8; 6], String> {
    let bytes: Vec<u8> =
        text.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>().map_err(|_| {
            format!("{text:?} is not a MAC address (six hex bytes with colons, e.g. 02:00:00:00:00:01)")
        })?;
    <[u8; 6]>::try_from(bytes).map_err(|_| format!("{text:?} is not a MAC address (six bytes)"))
}

fn proto_name(p: u8) -> String {
    match p {
        IPPROTO_UDP => "udp".into(),
        IPPROTO_TCP => "tcp".into(),
        n => format!("protocol {n}"),
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.packet;
        let roce = match (p.is_roce(), p.dest_qp) {
            (true, Some(qp)) => format!(", RoCEv2 DestQP {:#08x}", qp & 0xFF_FFFF),
            (true, None) => ", RoCEv2".to_string(),
            _ => String::new(),
        };
        let ports = matches!(p.protocol, IPPROTO_TCP | IPPROTO_UDP);
        if ports {
            writeln!(
                f,
                "packet: {} {}:{} -> {}:{}{roce}",
                proto_name(p.protocol),
                p.src,
                p.src_port,
                p.dst,
                p.dst_port
            )?;
        } else {
            writeln!(f, "packet: {} {} -> {} (no ports: hashed with ports 0)", proto_name(p.protocol), p.src, p.dst)?;
        }
        match &self.verdict {
            Verdict::Invalid(why) => writeln!(f, "invalid: {why}")?,
            Verdict::NoRoute => writeln!(
                f,
                "route:  {} matches no [[route]] -> not forwarded: XDP_PASS to the kernel stack (counter pass_no_route)",
                p.dst
            )?,
            Verdict::NoMember { route, group } => writeln!(
                f,
                "route:  {} matches route {route} -> group {group}, which has no usable member -> the kernel stack (counter pass_no_member)",
                p.dst
            )?,
            Verdict::Bridged { fdb, port } => {
                writeln!(f, "fdb:    {fdb}")?;
                writeln!(f, "port:   {port}, the frame unchanged (no MAC rewrite, no TTL change)")?;
            }
            Verdict::ToKernelBridge { why } => writeln!(f, "kernel: {why}")?,
            Verdict::Uplink { fdb, forwarding } => {
                writeln!(f, "fdb:    {fdb}")?;
                write_member(f, p, forwarding)?;
                writeln!(f, "        (the frame leaves unchanged: no MAC rewrite, no TTL change)")?;
            }
            Verdict::Forward(fw) => {
                let also = if fw.also_matched.is_empty() {
                    String::new()
                } else {
                    let list: Vec<String> = fw.also_matched.iter().map(|p| p.to_string()).collect();
                    format!(" (longest prefix; also matches {})", list.join(", "))
                };
                writeln!(f, "route:  {} matches route {}{also} -> group {}", p.dst, fw.route, fw.group)?;
                write_member(f, p, fw)?;
                writeln!(
                    f,
                    "        (MACs rewritten, TTL/hop limit -1; assumes TTL > 1, no IPv4 fragment, IPv4 options or IPv6 extension header, a right IPv4 header checksum, and a destination that is not this box's own)"
                )?;
            }
        }
        for note in &self.notes {
            writeln!(f, "note:   {note}")?;
        }
        Ok(())
    }
}

/// The hash, policy and member lines of a choice within a group.
fn write_member(f: &mut fmt::Formatter<'_>, p: &PacketFields, fw: &Forwarding) -> fmt::Result {
    let inputs = match fw.dest_qp_hashed {
        Some(qp) => format!("five-tuple + DestQP {qp:#08x}"),
        None if fw.mode == HashMode::Qp => "five-tuple (not RoCEv2, so no DestQP)".to_string(),
        None if p.is_roce() => "five-tuple only (DestQP ignored in five-tuple mode)".to_string(),
        None => "five-tuple".to_string(),
    };
    // Version 1 (a config without `hash_version`) is not named: its lines
    // read as they always have.
    let version = match fw.hash_version {
        HashVersion::V1 => String::new(),
        v => format!(", hash_version {}", v.number()),
    };
    writeln!(f, "hash:   {} hashing: {inputs}, seed {}{version} -> hash {:#010x}", fw.mode.name(), fw.seed, fw.hash)?;
    match &fw.policy_step {
        None => writeln!(
            f,
            "member: bucket {} of {BUCKETS_PER_GROUP} (hash >> 24) -> member {} of {} (0-based): {}",
            fw.bucket, fw.position, fw.member_count, fw.member
        )?,
        Some(step) => {
            writeln!(f, "policy: {step}")?;
            writeln!(f, "member: member {} of {} (0-based): {}", fw.position, fw.member_count, fw.member)?;
        }
    }
    Ok(())
}

/// Parses `--proto`: udp, tcp or 0..=255.
pub fn parse_proto(text: &str) -> Result<u8> {
    match text.trim().to_ascii_lowercase().as_str() {
        "udp" => Ok(IPPROTO_UDP),
        "tcp" => Ok(IPPROTO_TCP),
        t => t.parse::<u8>().with_context(|| format!("--proto {text:?}: use udp, tcp or a protocol number 0..=255")),
    }
}

pub fn run(args: &ExplainArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    let protocol = parse_proto(&args.proto)?;
    if args.src.is_ipv4() != args.dst.is_ipv4() {
        bail!("--src {} and --dst {} must both be IPv4 or both IPv6", args.src, args.dst);
    }
    if let Some(qp) = args.qp {
        if qp > 0xFF_FFFF {
            bail!("--qp {qp:#x} is wider than the BTH's 24-bit DestQP (max 0xffffff)");
        }
    }
    let packet = PacketFields {
        src: args.src,
        dst: args.dst,
        protocol,
        src_port: args.sport,
        dst_port: args.dport,
        dest_qp: args.qp,
    };
    let (live, why_not) = match read_live(&config) {
        Ok(mut l) => {
            // The flow's flowlet state in each group, for flowlet groups.
            if let Some(key) = packet.flow_key() {
                let maps = Maps::open_pinned(&config.dataplane.pin_dir)?;
                for g in &mut l.groups {
                    g.flowlet = maps.flowlet_entry(&rocev2_common::maps::FlowletKey::new(&key, g.index));
                    let keyless = config.groups.iter().find(|c| c.name == g.name).and_then(|c| match c.policy {
                        Policy::Flowlet(f) if f.table == FlowletTable::Keyless => Some(f.table_size),
                        _ => None,
                    });
                    if let Some(size) = keyless {
                        let slot = rocev2_common::flowlet::slot_of(&key, g.index, size.next_power_of_two() - 1);
                        g.keyless_slot = maps.flowlet_slot(slot.index);
                    }
                }
            }
            if config.routing.kernel_table.is_some() {
                l.learned_target = Maps::open_pinned(&config.dataplane.pin_dir)?.route_target(args.dst)?;
            }
            (Some(l), None)
        }
        // No run on this config's pin_dir: say that, not the list of other
        // instances with `--pin-dir` advice `explain` has no option for.
        Err(_) if !crate::control::state::state_path(&config.dataplane.pin_dir).exists() => (
            None,
            Some(format!(
                "no `rocev2 run` uses this config's pin_dir {} (explain follows the run started with this config)",
                config.dataplane.pin_dir.display()
            )),
        ),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let mut explanation = match args.dst_mac {
        Some(dst_mac) => {
            let Some(bridge) = &config.bridge else {
                bail!("--dst-mac explains a bridged frame, and {} has no [bridge]", args.config.display());
            };
            let frame = Frame { dst_mac, src_mac: args.src_mac, in_port: args.in_port.clone() };
            let fdb = live.as_ref().and_then(|_| read_live_bridge(&config).ok());
            let mut e = explain_bridged(&config, live.as_ref(), fdb.as_ref(), &packet, &frame);
            if fdb.is_none() && live.is_some() {
                e.notes.push(format!("the running `rocev2 run` has no FDB map for bridge {}", bridge.name));
            }
            e
        }
        None => {
            let mut e = explain(&config, live.as_ref(), &packet);
            // A frame on a bridge port is decided by its MAC, not a route.
            if let Some(bridge) = &config.bridge {
                e.notes.push(bridge_hint(&bridge.name, config.ports.is_empty()));
            }
            e
        }
    };
    if let Some(why) = why_not {
        explanation.notes.push(format!("why not live: {why}"));
    }
    print!("{explanation}");
    Ok(())
}

/// What `explain` without `--dst-mac` says for a config with a `[bridge]`:
/// the answer above is the routed one, which frames on the bridge's
/// ports do not take.
fn bridge_hint(bridge: &str, no_routed_ports: bool) -> String {
    let routed = if no_routed_ports {
        "this config routes on no [[port]], so the route lines above apply to no frame"
    } else {
        "the lines above are what its routed [[port]]s do"
    };
    format!("bridge: frames on the ports of bridge {bridge} are decided by their destination MAC: give --dst-mac MAC (and --in-port PORT --src-mac MAC) for the bridge program's decision; {routed}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_parsing() {
        assert_eq!(parse_proto("UDP").unwrap(), 17);
        assert_eq!(parse_proto("tcp").unwrap(), 6);
        assert_eq!(parse_proto("47").unwrap(), 47);
        assert!(parse_proto("sctpx").is_err());
        assert!(parse_proto("300").is_err());
        assert_eq!(parse_qp("0x123"), Ok(0x123));
        assert_eq!(parse_qp("291"), Ok(0x123));
        assert_eq!(parse_qp("0xffffff"), Ok(0xFF_FFFF));
        assert!(parse_qp("0x1000000").is_err());
        assert!(parse_qp("q1").is_err());
    }
}
