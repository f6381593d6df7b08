//! The userspace model of the XDP program's forwarding decision, for one
//! packet: longest prefix match over the configured routes, the group's
//! hash mode, the dataplane seed, the flow key built exactly as
//! `rocev2-ebpf`'s `forward.rs` builds it, and
//! `rocev2_common::hash::member_hash` / `rocev2_common::buckets::member_for`
//! (the code the kernel runs). When a `rocev2 run` for the config is live,
//! the member list, group hash mode and seed come from its pinned maps and
//! state file ([`read_live`]), because members that are down have left the
//! group and every position after them has shifted.
//!
//! `rocev2 explain` (tools::explain) prints it; `trace`, `top` and the
//! collision detector use it to name a packet's bucket and member.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use rocev2_common::{
    bth::ROCEV2_UDP_PORT,
    buckets::{fill, member_for, pick_bucket, BucketTable, BUCKETS_PER_GROUP, NO_MEMBER},
    hash::{member_hash, FlowKey, HashMode, HashVersion},
    maps::{names, DataplaneConfig},
};

use crate::{
    control::config::{Config, HashSeed, NextHop, Prefix, Route},
    control::dataplane::Maps,
};

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// The header fields the dataplane looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketFields {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
    /// BTH DestQP, if the packet carries one.
    pub dest_qp: Option<u32>,
}

impl PacketFields {
    /// True for what the XDP program treats as RoCEv2: UDP to port 4791.
    pub fn is_roce(&self) -> bool {
        self.protocol == IPPROTO_UDP && self.dst_port == ROCEV2_UDP_PORT
    }

    /// The flow key exactly as `forward.rs` builds it: ports only for TCP and
    /// UDP, the DestQP only for RoCEv2 (and 0 when the packet has none).
    pub fn flow_key(&self) -> Option<FlowKey> {
        let (sport, dport) = match self.protocol {
            IPPROTO_TCP | IPPROTO_UDP => (self.src_port, self.dst_port),
            _ => (0, 0),
        };
        let key = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => FlowKey::v4(s.octets(), d.octets(), self.protocol, sport, dport),
            (IpAddr::V6(s), IpAddr::V6(d)) => FlowKey::v6(s.octets(), d.octets(), self.protocol, sport, dport),
            _ => return None,
        };
        Some(match (self.is_roce(), self.dest_qp) {
            (true, Some(qp)) => key.with_dest_qp(qp),
            _ => key,
        })
    }
}

/// What a running `rocev2 run` has live for one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveGroup {
    pub name: String,
    /// Index in the GROUPS map.
    pub index: u32,
    /// The hash mode the kernel uses for the group.
    pub hash: HashMode,
    /// How many members the kernel picks from.
    pub member_count: u32,
    /// Descriptions of the live members, in position order.
    pub members: Vec<String>,
    /// The live bucket table (bucket -> position).
    pub buckets: BucketTable,
    /// The group's generation (flowlet state of an older one is stale).
    pub generation: u32,
    /// The flowlet table's entry for the explained packet's flow, if any.
    pub flowlet: Option<rocev2_common::flowlet::FlowletEntry>,
    /// A keyless group: the slot the explained packet's flow hashes to,
    /// as the dataplane has it now.
    pub keyless_slot: Option<rocev2_common::flowlet::FlowletSlot>,
    /// Members demoted for their transport health (`transport_aware`),
    /// as `dev (score N)`: they hold no buckets.
    pub demoted: Vec<String>,
}

/// The live state of a running dataplane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub pin_dir: PathBuf,
    pub pid: u32,
    /// The seed in the dataplane's CONFIG map.
    pub seed: u32,
    /// The hash version in the dataplane's CONFIG map.
    pub hash_version: HashVersion,
    pub groups: Vec<LiveGroup>,
    /// For the packet's destination: the route target in the live route
    /// tables, when it is a learned route (`[routing] source = "kernel"`).
    pub learned_target: Option<u32>,
}

/// Where the member list came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberSource {
    /// A running `rocev2 run`'s maps.
    Live,
    /// The config file, assuming every member is up.
    Configured,
}

/// A forwarding decision, step by step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarding {
    pub route: Prefix,
    /// Shorter prefixes that also match (longest prefix wins over them).
    pub also_matched: Vec<Prefix>,
    pub group: String,
    pub group_index: u32,
    pub mode: HashMode,
    pub seed: u32,
    pub hash_version: HashVersion,
    pub key: FlowKey,
    /// The DestQP that went into the hash (qp mode, RoCEv2 only).
    pub dest_qp_hashed: Option<u32>,
    pub hash: u32,
    /// The bucket the hash falls in (its top byte).
    pub bucket: u32,
    /// How the group's policy chose the member when it is not plain
    /// hashing (flowlet state, a pin), in words.
    pub policy_step: Option<String>,
    /// 0-based position in the group.
    pub position: u32,
    pub member_count: u32,
    /// e.g. "dev u3 via fd00:3::2".
    pub member: String,
    pub source: MemberSource,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Source and destination are of different families.
    Invalid(String),
    /// No route for the destination: XDP_PASS, the kernel stack handles it.
    NoRoute,
    /// Routed to a group with no usable member: the kernel handles it.
    NoMember {
        route: Prefix,
        group: String,
    },
    Forward(Box<Forwarding>),
    /// Bridge mode: to the one port the FDB names, unchanged.
    Bridged {
        /// What the FDB says of the MAC.
        fdb: String,
        port: String,
    },
    /// Bridge mode: a MAC of an uplink group, to the member the group's
    /// choice gives (the route fields of `forwarding` are not used).
    Uplink {
        fdb: String,
        forwarding: Box<Forwarding>,
    },
    /// Bridge mode: XDP_PASS to the kernel bridge, and why (with the counter).
    ToKernelBridge {
        why: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub packet: PacketFields,
    pub verdict: Verdict,
    /// Caveats, e.g. where the member list came from or an ignored --qp.
    pub notes: Vec<String>,
}

/// Routes matching `dst`, longest prefix first.
fn matching_routes(routes: &[Route], dst: IpAddr) -> Vec<&Route> {
    let mut hits: Vec<&Route> = routes.iter().filter(|r| r.prefix.contains(dst)).collect();
    hits.sort_by_key(|r| std::cmp::Reverse(r.prefix.prefix_len()));
    hits
}

fn member_text(m: &crate::control::config::Member) -> String {
    match m.next_hop {
        NextHop::Via(ip) => format!("dev {} via {ip}", m.dev),
        NextHop::Mac(mac) => {
            format!("dev {} mac {}", m.dev, mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"))
        }
        // As a live member reads (`dev u1 bridge port`); the frame-unchanged
        // line follows the member line.
        NextHop::BridgePort => format!("dev {} bridge port", m.dev),
    }
}

/// Repeats the dataplane's decision for `packet`. Pure: `live` carries
/// whatever a running dataplane has (see [`read_live`]).
pub fn explain(config: &Config, live: Option<&Live>, packet: &PacketFields) -> Explanation {
    let mut notes = Vec::new();
    let done = |verdict, notes| Explanation { packet: *packet, verdict, notes };
    let Some(key) = packet.flow_key() else {
        return done(
            Verdict::Invalid(format!(
                "source {} and destination {} are of different IP families",
                packet.src, packet.dst
            )),
            notes,
        );
    };
    if packet.dest_qp.is_some() && !packet.is_roce() {
        notes.push("--qp ignored: only UDP to port 4791 (RoCEv2) carries a BTH".to_string());
    }
    let hits = matching_routes(&config.routes, packet.dst);
    let Some(route) = hits.first() else {
        return explain_learned(config, live, packet, &key, notes);
    };
    let also_matched = hits[1..].iter().map(|r| r.prefix).collect();
    let Some(group) = config.groups.get(route.group_index as usize) else {
        // Config validation ties every route to a group; be explicit anyway.
        return done(Verdict::NoMember { route: route.prefix, group: route.group.clone() }, notes);
    };
    let verdict = match choose_member(config, live, group, route.group_index, packet, &key, &mut notes) {
        Some(mut fw) => {
            (fw.route, fw.also_matched) = (route.prefix, also_matched);
            Verdict::Forward(fw)
        }
        None => Verdict::NoMember { route: route.prefix, group: group.name.clone() },
    };
    done(verdict, notes)
}

/// The member `group` (config index `group_index`) gives `packet`, as the
/// XDP program chooses it once it has the group (from a route, or from an
/// uplink group's FDB entry in bridge mode); `None` when the group has no
/// usable member. The route fields are left for the caller.
fn choose_member(
    config: &Config,
    live: Option<&Live>,
    group: &crate::control::config::Group,
    group_index: u32,
    packet: &PacketFields,
    key: &FlowKey,
    notes: &mut Vec<String>,
) -> Option<Box<Forwarding>> {
    let key = *key;
    // The kernel's view when one is running, else the file's, all members up.
    let live_group = live.and_then(|l| l.groups.iter().find(|g| g.name == group.name));
    let hash_version = live.map_or(config.dataplane.hash_version, |l| l.hash_version);
    let (mode, seed, source, member_count, members, buckets): (
        HashMode,
        u32,
        MemberSource,
        u32,
        Vec<String>,
        BucketTable,
    ) = match (live, live_group) {
        (Some(l), Some(g)) => {
            notes.push(format!(
                "members: live list of the running `rocev2 run` (pid {}, pin_dir {}): {} of {} configured member(s) up",
                l.pid,
                l.pin_dir.display(),
                g.member_count,
                group.members.len()
            ));
            for member in &g.demoted {
                notes.push(format!(
                    "members: {member} is demoted for its transport health (transport_aware): it holds no buckets, so new flowlets avoid it; flowlets already on it keep it until they end"
                ));
            }
            if let HashSeed::Fixed(file_seed) = config.dataplane.hash_seed {
                if l.seed != file_seed {
                    notes.push(format!(
                            "the running dataplane uses seed {}, not the file's {file_seed} (reload `rocev2 run` to apply the file)",
                            l.seed
                        ));
                }
            }
            if l.hash_version != config.dataplane.hash_version {
                notes.push(format!(
                    "the running dataplane uses hash_version {}, not the file's {} (reload `rocev2 run` to apply the file)",
                    l.hash_version.number(),
                    config.dataplane.hash_version.number()
                ));
            }
            if g.hash != group.hash {
                notes.push(format!(
                    "the running dataplane hashes group {} with {}, not the file's {}",
                    group.name,
                    g.hash.name(),
                    group.hash.name()
                ));
            }
            (g.hash, l.seed, MemberSource::Live, g.member_count, g.members.clone(), g.buckets)
        }
        (Some(l), None) => {
            notes.push(format!(
                "members: the running `rocev2 run` (pid {}) has no group {}; assuming all configured members are up",
                l.pid, group.name
            ));
            configured(config, group, notes)
        }
        (None, _) => {
            notes.push(
                "members: no live `rocev2 run` for this config; assuming all configured members are up".to_string(),
            );
            configured(config, group, notes)
        }
    };
    if member_count == 0 {
        return None;
    }
    if packet.is_roce() && packet.dest_qp.is_none() && mode == HashMode::Qp {
        notes.push(
            "no --qp given: hashed with DestQP 0x000000; real RoCEv2 packets carry their QP's number".to_string(),
        );
    }
    let hash = member_hash(&key, mode, seed, hash_version);
    let (position, policy_step) =
        policy_position(config, group, live_group, &members, &buckets, &key, packet.dst, seed, hash_version, hash);
    let member = members
        .get(position as usize)
        .cloned()
        .unwrap_or_else(|| format!("position {position} (not named in the run state file)"));
    let dest_qp_hashed = (mode == HashMode::Qp && packet.is_roce()).then_some(key.dest_qp);
    Some(Box::new(Forwarding {
        route: Prefix::host(packet.dst),
        also_matched: Vec::new(),
        group: group.name.clone(),
        group_index,
        mode,
        seed,
        hash_version,
        key,
        dest_qp_hashed,
        hash,
        bucket: pick_bucket(hash),
        policy_step,
        position,
        member_count,
        member,
        source,
    }))
}

/// The member position the group's policy gives, as the XDP program
/// decides it (rocev2-ebpf `select.rs`), and how, when it is not the hash:
/// - `flowlet`: a live flowlet entry of the current group generation keeps
///   its member until an idle gap; a new flow (or a stale entry) starts a
///   flowlet placed by re-hashing with the flowlet number (`rehash`), or
///   the less loaded of two such candidates (`least-loaded`);
/// - `pinned`: a `[[pin]]` for (destination, DestQP) whose member is up,
///   else `qp` hashing.
#[allow(clippy::too_many_arguments, reason = "the decision's inputs, as the XDP program has them at this point")]
fn policy_position(
    config: &Config,
    group: &crate::control::config::Group,
    live_group: Option<&LiveGroup>,
    members: &[String],
    buckets: &BucketTable,
    key: &FlowKey,
    dst: IpAddr,
    seed: u32,
    hash_version: HashVersion,
    hash: u32,
) -> (u32, Option<String>) {
    match group.policy {
        crate::control::config::Policy::Hash => (member_for(buckets, hash), None),
        crate::control::config::Policy::Flowlet(f) if f.table == rocev2_common::flowlet::FlowletTable::Keyless => {
            // The slot is the dataplane's own (one home: flowlet::slot_of),
            // shared by every flow that hashes there.
            let index = live_group.map_or_else(
                || config.groups.iter().position(|g| g.name == group.name).unwrap_or(0) as u32,
                |g| g.index,
            );
            let slot_of = rocev2_common::flowlet::slot_of(key, index, f.table_size.next_power_of_two() - 1);
            let at = format!("keyless flowlet table: this flow uses slot {} of {}", slot_of.index, f.table_size);
            let live_slot = live_group.and_then(|g| g.keyless_slot.map(|s| (s, g)));
            match live_slot {
                Some((slot, g)) if slot.used != 0 => {
                    let owner = if slot.tag == slot_of.tag {
                        "last used by this flow"
                    } else {
                        "last used by another flow that hashes there (this flow follows or ends its flowlet)"
                    };
                    let (p, how) = flowlet_state(&f, members.len() as u32, &slot.entry, g, buckets, key, seed);
                    (p, Some(format!("{at}, {owner}: {how}")))
                }
                Some(_) => {
                    let (p, how) = new_flowlet(f.choice, buckets, key, seed, 0);
                    (p, Some(format!("{at}, empty: the next packet starts flowlet 0, {how}")))
                }
                None => {
                    let (p, how) = new_flowlet(f.choice, buckets, key, seed, 0);
                    (p, Some(format!("{at} (its state not read: no running dataplane's slots); an empty slot starts flowlet 0, {how}")))
                }
            }
        }
        crate::control::config::Policy::Flowlet(f) => {
            if let Some((e, g)) = live_group.and_then(|g| g.flowlet.map(|e| (e, g))) {
                let (p, how) = flowlet_state(&f, members.len() as u32, &e, g, buckets, key, seed);
                return (p, Some(how));
            }
            let (p, how) = new_flowlet(f.choice, buckets, key, seed, 0);
            (p, Some(format!("no flowlet state for this flow: its next packet starts flowlet 0, {how}")))
        }
        crate::control::config::Policy::Pinned => {
            let qp_hash = member_hash(key, HashMode::Qp, seed, hash_version);
            let index = config.groups.iter().position(|g| g.name == group.name).unwrap_or(0) as u32;
            let pin = config
                .pins
                .iter()
                .filter(|p| p.group_index == index && p.qp == key.dest_qp && p.prefix.contains(dst))
                .max_by_key(|p| p.prefix.prefix_len());
            let Some(pin) = pin else {
                return (
                    member_for(buckets, qp_hash),
                    Some(format!(
                        "pinned group, no [[pin]] for this destination and QP: qp hashing -> hash {qp_hash:#010x}"
                    )),
                );
            };
            let pinned = member_text(&group.members[pin.member_index]);
            match members.iter().position(|m| m.starts_with(&pinned)) {
                Some(p) => (
                    p as u32,
                    Some(format!(
                        "[[pin]] {} (line {}): QP {:#x} to {} is pinned to {pinned}",
                        pin.loc.key, pin.loc.line, pin.qp, pin.prefix
                    )),
                ),
                None => (
                    member_for(buckets, qp_hash),
                    Some(format!(
                        "[[pin]] {} names {pinned}, which is down: qp hashing -> hash {qp_hash:#010x}",
                        pin.loc.key
                    )),
                ),
            }
        }
    }
}

/// What live flowlet state `e` (a keyed entry or a keyless slot's) means
/// for the next packet: it stays on its member within the gap (and, with
/// `flowlet_boundary`, inside a message), else a new flowlet starts; state
/// from an older group generation is stale. As the dataplane decides it
/// (rocev2_common::flowlet::decide).
fn flowlet_state(
    f: &crate::control::config::FlowletConfig,
    count: u32,
    e: &rocev2_common::flowlet::FlowletEntry,
    g: &LiveGroup,
    buckets: &BucketTable,
    key: &FlowKey,
    seed: u32,
) -> (u32, String) {
    let next = e.flowlet_id.wrapping_add(1);
    if e.generation != g.generation || e.position >= count {
        let (p, how) = new_flowlet(f.choice, buckets, key, seed, next);
        return (
            p,
            format!(
                "flowlet {} is from before the group last changed: the next packet starts flowlet {next}, {how}",
                e.flowlet_id
            ),
        );
    }
    let idle_ns = monotonic_ns().saturating_sub(e.last_seen_ns);
    let kept = format!("flowlet {} (live state), last packet {:.1} ms ago", e.flowlet_id, idle_ns as f64 / 1e6);
    if idle_ns <= f.gap.as_nanos() as u64 || (f.at_message_boundary && e.at_boundary == 0) {
        return (e.position, format!("{kept}: it stays on position {}", e.position));
    }
    let (p, how) = new_flowlet(f.choice, buckets, key, seed, next);
    (p, format!("{kept}, idle past the {} us gap: the next packet starts flowlet {next}, {how}", f.gap.as_micros()))
}

/// A new flowlet's position and how it was chosen.
fn new_flowlet(
    choice: rocev2_common::flowlet::FlowletChoice,
    buckets: &BucketTable,
    key: &FlowKey,
    seed: u32,
    flowlet_id: u32,
) -> (u32, String) {
    use rocev2_common::flowlet::{rehash_hash, FlowletChoice};
    let a = member_for(buckets, rehash_hash(key, seed, flowlet_id));
    match choice {
        FlowletChoice::Rehash => {
            (a, format!("re-hashed (flow hash with DestQP, seed mixed with flowlet {flowlet_id}) to position {a}"))
        }
        FlowletChoice::LeastLoaded => {
            let b = member_for(buckets, rehash_hash(key, seed ^ 0x5bd1_e995, flowlet_id));
            (a, format!("the less loaded of positions {a} and {b} by egress virtual queue ({a} when equal or unknown)"))
        }
    }
}

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns.
fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux.
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// A destination no `[[route]]` covers: a running dataplane that follows
/// the kernel's routes may have learned one.
fn explain_learned(
    config: &Config,
    live: Option<&Live>,
    packet: &PacketFields,
    key: &FlowKey,
    mut notes: Vec<String>,
) -> Explanation {
    let done = |verdict, notes| Explanation { packet: *packet, verdict, notes };
    let (Some(l), Some(target)) = (live, live.and_then(|l| l.learned_target)) else {
        if config.routing.kernel_table.is_some() && live.is_none() {
            notes.push("routes are learned from the kernel; with no live `rocev2 run` they are unknown".into());
        }
        return done(Verdict::NoRoute, notes);
    };
    let route = Prefix::host(packet.dst);
    let Some(g) = l.groups.iter().find(|g| g.index == target) else {
        notes.push(format!(
            "the live route tables send {} to the kernel (a learned route rocev2 does not forward: counter pass_kernel_route, or the box's own address)",
            packet.dst
        ));
        return done(Verdict::NoRoute, notes);
    };
    notes.push("route: learned from the kernel routing table; `ip route get` names the prefix".into());
    if g.member_count == 0 {
        return done(Verdict::NoMember { route, group: g.name.clone() }, notes);
    }
    let hash = member_hash(key, g.hash, l.seed, l.hash_version);
    let position = member_for(&g.buckets, hash);
    done(
        Verdict::Forward(Box::new(Forwarding {
            route,
            also_matched: Vec::new(),
            group: g.name.clone(),
            group_index: g.index,
            mode: g.hash,
            seed: l.seed,
            hash_version: l.hash_version,
            key: *key,
            dest_qp_hashed: (g.hash == HashMode::Qp && packet.is_roce()).then_some(key.dest_qp),
            hash,
            bucket: pick_bucket(hash),
            policy_step: None,
            position,
            member_count: g.member_count,
            member: g.members.get(position as usize).cloned().unwrap_or_else(|| format!("position {position}")),
            source: MemberSource::Live,
        })),
        notes,
    )
}

fn configured(
    config: &Config,
    group: &crate::control::config::Group,
    notes: &mut Vec<String>,
) -> (HashMode, u32, MemberSource, u32, Vec<String>, BucketTable) {
    let members: Vec<String> = group.members.iter().map(member_text).collect();
    let weights: Vec<u32> = group.members.iter().map(|m| m.weight).collect();
    let mut buckets = [NO_MEMBER; BUCKETS_PER_GROUP as usize];
    fill(&weights, &mut buckets);
    (group.hash, file_seed(config, notes), MemberSource::Configured, members.len() as u32, members, buckets)
}

/// The seed a file asks for; `"auto"` is worked out from this box's port
/// MACs the way `run` does.
pub fn file_seed(config: &Config, notes: &mut Vec<String>) -> u32 {
    match config.dataplane.hash_seed {
        HashSeed::Fixed(seed) => seed,
        HashSeed::Auto => {
            let macs: Vec<[u8; 6]> = config.ports.iter().filter_map(|p| crate::sys::device_mac(&p.name).ok()).collect();
            let seed = rocev2_common::hash::auto_seed(macs.iter().copied());
            notes.push(format!(
                "seed: hash_seed = \"auto\" from the MACs of {} of {} port(s) here: {seed}",
                macs.len(),
                config.ports.len()
            ));
            seed
        }
    }
}

/// Parses `--qp`: decimal or 0x-hex, at most 24 bits.
pub fn parse_qp(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let value = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse::<u32>(),
    }
    .map_err(|_| format!("{text:?} is not a QP number (decimal or 0x-hex)"))?;
    if value > 0xFF_FFFF {
        return Err(format!("{text} is wider than the BTH's 24-bit DestQP (max 0xffffff)"));
    }
    Ok(value)
}

/// Reads a running dataplane's state for `config`, or says why there is none.
pub fn read_live(config: &Config) -> Result<Live> {
    use crate::control::state::RunState;
    let pin_dir = &config.dataplane.pin_dir;
    let state = RunState::read(pin_dir)?;
    if !Path::new(&format!("/proc/{}", state.pid)).exists() {
        bail!("the state file names pid {}, which is not running", state.pid);
    }
    let maps = Maps::open_pinned(pin_dir)?;
    let (seed, hash_version) = read_live_hash(pin_dir)?;
    let groups = state
        .groups
        .iter()
        .map(|g| {
            let entry = maps.group(g.index)?;
            Ok(LiveGroup {
                name: g.name.clone(),
                index: g.index,
                hash: HashMode::from_u32(entry.hash_mode).unwrap_or(HashMode::FiveTuple),
                member_count: entry.member_count,
                buckets: maps.bucket_table(g.index)?,
                generation: entry.generation,
                flowlet: None,
                keyless_slot: None,
                members: g
                    .members
                    .iter()
                    .map(|m| {
                        let mac = if m.mac.is_empty() { String::new() } else { format!(" (neighbour {})", m.mac) };
                        format!("dev {} {}{mac}", m.dev, m.next_hop)
                    })
                    .collect(),
                demoted: g
                    .members
                    .iter()
                    .filter_map(|m| m.health.filter(|h| h.demoted).map(|h| format!("{} (score {:.1})", m.dev, h.score)))
                    .collect(),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Live { pin_dir: pin_dir.clone(), pid: state.pid, seed, hash_version, groups, learned_target: None })
}

/// The seed and hash version in the pinned CONFIG map (they may differ
/// from an edited file).
fn read_live_hash(pin_dir: &Path) -> Result<(u32, HashVersion)> {
    use aya::maps::{Array, Map, MapData};
    let path = pin_dir.join(names::CONFIG);
    let data = MapData::from_pin(&path).with_context(|| format!("cannot open pinned map {}", path.display()))?;
    let map = Map::from_map_data(data).with_context(|| format!("pinned map {} has an unknown type", path.display()))?;
    let array: Array<MapData, DataplaneConfig> =
        Array::try_from(map).with_context(|| format!("pinned map {} has an unexpected type", path.display()))?;
    let config = array.get(&0, 0).context("cannot read CONFIG")?;
    Ok((config.hash_seed, HashVersion::from_config(config.hash_version)))
}

pub mod bridge;
#[cfg(test)]
mod tests;
