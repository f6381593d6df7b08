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
use rocev2_common::{flowlet::FlowletTable, hash::HashMode};

use crate::{
    control::config::{Config, Policy},
    control::dataplane::Maps,
    control::decision::{explain, parse_qp, read_live, Explanation, PacketFields, Verdict, IPPROTO_TCP, IPPROTO_UDP},
};

#[derive(clap::Args, Debug, Clone)]
pub struct ExplainArgs {
    /// The configuration file `rocev2 run` uses.
    #[arg(long, short)]
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
            Verdict::Forward(fw) => {
                let also = if fw.also_matched.is_empty() {
                    String::new()
                } else {
                    let list: Vec<String> = fw.also_matched.iter().map(|p| p.to_string()).collect();
                    format!(" (longest prefix; also matches {})", list.join(", "))
                };
                writeln!(f, "route:  {} matches route {}{also} -> group {}", p.dst, fw.route, fw.group)?;
                let inputs = match fw.dest_qp_hashed {
                    Some(qp) => format!("five-tuple + DestQP {qp:#08x}"),
                    None if fw.mode == HashMode::Qp => "five-tuple (not RoCEv2, so no DestQP)".to_string(),
                    None if p.is_roce() => "five-tuple only (DestQP ignored in five-tuple mode)".to_string(),
                    None => "five-tuple".to_string(),
                };
                writeln!(f, "hash:   {} hashing: {inputs}, seed {} -> hash {:#010x}", fw.mode.name(), fw.seed, fw.hash)?;
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
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let mut explanation = explain(&config, live.as_ref(), &packet);
    if let Some(why) = why_not {
        explanation.notes.push(format!("why not live: {why}"));
    }
    print!("{explanation}");
    Ok(())
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
