//! A two-tier Clos fabric as data: racks of hosts behind leaf switches
//! (RTSW), a spine tier (CTSW), `links` parallel links per leaf-spine pair.
//! One description serves the lab that builds it (`rocev2 lab up --racks`),
//! the collective traffic it carries (`lab traffic`) and the simulator that
//! predicts every link's load (`rocev2 entropy --racks`): names, addresses,
//! MACs, the order of every group's members and every switch's hash seed
//! are computed here and nowhere else.
//!
//! ```text
//!  r1h1 eth0 --- h1 [l1] s1p1 --- l1p1 [s1] l2p1 --- s1p1 [l2] h1 --- eth0 r2h1
//!  r1h2 eth0 --- h2      s2p1 --- l1p1 [s2] l2p1 --- s2p1      h2 --- eth0 r2h2
//! ```
//! Host i of rack r: 10.r.i.1/24 and fd00:r:i::1/64 (leaf .254 / ::fe); the
//! rack's prefixes are 10.r.0.0/16 and fd00:r::/32. Link k between leaf r
//! and spine j: 172.(16+k).(16r+j).0/24 and fdfa:r:j:k::/64 (leaf .1/::1,
//! spine .2/::2).
//!
//! The prediction walks each packet the generator would send through the
//! switches with the dataplane's own hash ([`member_hash`]) and bucket
//! table ([`even_table`], [`member_for`]), so it equals the counters of a
//! lab whose groups were filled in one go (static routes, or BGP converged
//! before the dataplanes started).

use std::{
    collections::BTreeMap,
    fmt::{self, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{bail, Result};
use rocev2_common::{
    buckets::{even_table, member_for, BucketTable},
    flowlet::rehash_position,
    hash::{auto_seed, member_hash, HashMode, HashVersion},
};
use serde::Serialize;

pub mod picture;

use crate::{
    control::decision::PacketFields,
    render::{share_bar, Align, Table},
    tools::gen::{build_frames, GenArgs, SportModel},
    tools::packet::parse_roce,
};

pub const MAX_RACKS: u32 = 15;
pub const MAX_HOSTS_PER_RACK: u32 = 32;
pub const MAX_SPINES: u32 = 15;
pub const MAX_LINKS: u32 = 4;
pub const MAX_AGGS: u32 = 8;
/// The dataplane's port slots (1..64).
const MAX_PORTS: u32 = 63;
/// The seed every switch gets with `--seed same`.
pub const SAME_SEED: u32 = 0x5eed;
/// The TTL the generator sends with; a packet crossing n switches arrives with this minus n.
pub const SENT_TTL: u8 = 64;
/// Packets per generated WRITE message.
pub const MESSAGE_PACKETS: u32 = 4;
/// RDMA payload bytes per packet.
pub const PAYLOAD: usize = 1024;

/// A value as its command-line spelling (`same`, `all-to-all`, `nic`).
pub fn flag<T: clap::ValueEnum>(v: T) -> String {
    v.to_possible_value().map_or_else(String::new, |p| p.get_name().to_owned())
}

/// Address families to configure (and, in the fabric, to send).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Family {
    V4,
    V6,
    Both,
}

impl Family {
    pub fn v4(self) -> bool {
        self != Family::V6
    }
    pub fn v6(self) -> bool {
        self != Family::V4
    }

    /// The items of the families configured: `v4`'s, then `v6`'s.
    pub fn pick<T>(self, v4: Vec<T>, v6: Vec<T>) -> Vec<T> {
        let mut out = Vec::new();
        if self.v4() {
            out.extend(v4);
        }
        if self.v6() {
            out.extend(v6);
        }
        out
    }
}

/// Hash seeds of the switches: all equal (polarization) or each switch's own.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeedPlan {
    /// One seed on every switch: the spine re-hashes what the leaf already split on the same hash.
    Same,
    /// `hash_seed = "auto"`: each switch derives its seed from its port MACs.
    Auto,
}

/// The collective's traffic pattern.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// One ring all-reduce step: host i of rack r sends to host i of rack r+1.
    Ring,
    /// Every host sends to every other host.
    AllToAll,
}

/// A switch of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
pub enum Switch {
    Leaf(u32),
    Spine(u32),
    /// An aggregation switch (ATSW) joining the zones.
    Agg(u32),
}

impl Switch {
    /// "leaf", "spine" or "agg".
    pub fn role(self) -> &'static str {
        match self {
            Switch::Leaf(_) => "leaf",
            Switch::Spine(_) => "spine",
            Switch::Agg(_) => "agg",
        }
    }
}

impl fmt::Display for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Switch::Leaf(r) => write!(f, "l{r}"),
            Switch::Spine(j) => write!(f, "s{j}"),
            Switch::Agg(a) => write!(f, "a{a}"),
        }
    }
}

/// The tiers a packet crosses, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Leaf to spine.
    LeafUp,
    /// Spine to aggregation (between zones).
    SpineUp,
    /// Aggregation to spine.
    AggDown,
    /// Spine to leaf.
    SpineDown,
    /// Leaf to host.
    LeafDown,
}

impl Tier {
    pub const ALL: [Tier; 5] = [Tier::LeafUp, Tier::SpineUp, Tier::AggDown, Tier::SpineDown, Tier::LeafDown];

    pub fn name(self) -> &'static str {
        match self {
            Tier::LeafUp => "leaf->spine",
            Tier::SpineUp => "spine->agg",
            Tier::AggDown => "agg->spine",
            Tier::SpineDown => "spine->leaf",
            Tier::LeafDown => "leaf->host",
        }
    }
}

/// One direction of one link, named by the switch that sends on it and its port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
pub struct LinkId {
    pub tier: Tier,
    pub switch: Switch,
    pub port: String,
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.switch, self.port)
    }
}

/// Packets and bytes sent on one link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Load {
    pub packets: u64,
    pub bytes: u64,
}

/// The fabric's shape and the dataplane settings every switch gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Fabric {
    /// Racks in all (split evenly among the zones).
    pub racks: u32,
    pub hosts: u32,
    /// Spines in all (each zone has its own).
    pub spines: u32,
    pub links: u32,
    /// Zones (the paper's AI zones): each a two-tier fabric of its own
    /// racks and spines; with more than one, `aggs` aggregation switches
    /// (ATSW) join every spine to every other zone.
    #[serde(default = "one")]
    pub zones: u32,
    #[serde(default)]
    pub aggs: u32,
    pub v4: bool,
    pub v6: bool,
    pub hash: HashMode,
    /// `hash_version` of every switch's config (a record written before
    /// the field existed: version 1, what its configs ran).
    #[serde(default)]
    pub hash_version: HashVersion,
    pub seeds: SeedPlan,
}

/// The aggregation switches for `--zones` and `--aggs`: 2 by default when
/// there are zones to join, none (and `--aggs` refused) with one zone.
pub fn aggs_for(zones: u32, aggs: Option<u32>) -> Result<u32> {
    match (zones, aggs) {
        (0 | 1, Some(_)) => bail!("--aggs joins zones: use it with --zones 2 or more"),
        (0 | 1, None) => Ok(0),
        (_, a) => Ok(a.unwrap_or(2)),
    }
}

fn one() -> u32 {
    1
}

/// One generator's traffic: a QP set from one host to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Connection {
    pub src: (u32, u32),
    pub dst: (u32, u32),
    pub v6: bool,
    pub first_qp: u32,
}

/// What `lab traffic` sends on every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TrafficSpec {
    pub pattern: Pattern,
    pub qps: u32,
    pub messages: u32,
    pub sport: SportModel,
}

impl Fabric {
    pub fn validate(&self) -> Result<()> {
        let check = |flag: &str, v: u32, max: u32| -> Result<()> {
            if !(1..=max).contains(&v) {
                bail!("{flag} must be 1..={max}, not {v}");
            }
            Ok(())
        };
        check("--racks", self.racks, MAX_RACKS)?;
        check("--hosts", self.hosts, MAX_HOSTS_PER_RACK)?;
        check("--spines", self.spines, MAX_SPINES)?;
        check("--links-per-spine", self.links, MAX_LINKS)?;
        check("--zones", self.zones, MAX_RACKS)?;
        if !self.racks.is_multiple_of(self.zones) || !self.spines.is_multiple_of(self.zones) {
            bail!("--racks {} and --spines {} must split evenly into {} zones", self.racks, self.spines, self.zones);
        }
        match (self.zones, self.aggs) {
            (1, 0) => {}
            (1, _) => bail!("--aggs joins zones: use it with --zones 2 or more"),
            (_, a) => check("--aggs", a, MAX_AGGS)?,
        }
        let leaf_ports = self.hosts + self.zone_spines() * self.links;
        if leaf_ports > MAX_PORTS {
            bail!(
                "{} hosts + {} uplinks = {leaf_ports} leaf ports, more than the dataplane's {MAX_PORTS}",
                self.hosts,
                self.zone_spines() * self.links
            );
        }
        if self.zone_racks() * self.links + self.aggs > MAX_PORTS {
            bail!("{} racks x {} links = more spine ports than the dataplane's {MAX_PORTS}", self.racks, self.links);
        }
        if !self.v4 && !self.v6 {
            bail!("a fabric needs IPv4, IPv6 or both");
        }
        Ok(())
    }

    pub fn switches(&self) -> Vec<Switch> {
        let leaves = (1..=self.racks).map(Switch::Leaf);
        let spines = (1..=self.spines).map(Switch::Spine);
        leaves.chain(spines).chain((1..=self.aggs).map(Switch::Agg)).collect()
    }

    pub fn zone_racks(&self) -> u32 {
        self.racks / self.zones
    }
    pub fn zone_spines(&self) -> u32 {
        self.spines / self.zones
    }
    pub fn zone_of_rack(&self, r: u32) -> u32 {
        (r - 1) / self.zone_racks() + 1
    }
    pub fn zone_of_spine(&self, j: u32) -> u32 {
        (j - 1) / self.zone_spines() + 1
    }
    pub fn racks_of_zone(&self, z: u32) -> std::ops::RangeInclusive<u32> {
        (z - 1) * self.zone_racks() + 1..=z * self.zone_racks()
    }
    pub fn spines_of_zone(&self, z: u32) -> std::ops::RangeInclusive<u32> {
        (z - 1) * self.zone_spines() + 1..=z * self.zone_spines()
    }

    /// 10.r.i.1; racks past 255 (the simulator's paper-scale fabrics)
    /// carry into the first octet: 11.0.i.1 is rack 256.
    pub fn host_v4(r: u32, i: u32) -> Ipv4Addr {
        Ipv4Addr::new(10 + (r >> 8) as u8, r as u8, i as u8, 1)
    }
    pub fn host_v6(r: u32, i: u32) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, r as u16, i as u16, 0, 0, 0, 0, 1)
    }
    pub fn host_addr(r: u32, i: u32, v6: bool) -> IpAddr {
        if v6 {
            Self::host_v6(r, i).into()
        } else {
            Self::host_v4(r, i).into()
        }
    }
    pub fn rack_prefix_v4(r: u32) -> String {
        format!("10.{r}.0.0/16")
    }
    pub fn rack_prefix_v6(r: u32) -> String {
        format!("fd00:{r}::/32")
    }
    /// (leaf end, spine end) IPv4 addresses of link k between leaf r and spine j.
    pub fn fabric_v4(r: u32, j: u32, k: u32) -> (String, String) {
        let (a, b) = (16 + k, 16 * r + j);
        (format!("172.{a}.{b}.1"), format!("172.{a}.{b}.2"))
    }
    pub fn fabric_v6(r: u32, j: u32, k: u32) -> (String, String) {
        (format!("fdfa:{r}:{j}:{k}::1"), format!("fdfa:{r}:{j}:{k}::2"))
    }

    /// (spine end, aggregation end) IPv4 addresses of the link between spine j and aggregation switch a.
    pub fn agg_v4(j: u32, a: u32) -> (String, String) {
        (format!("172.{}.{j}.1", 32 + a), format!("172.{}.{j}.2", 32 + a))
    }
    pub fn agg_v6(j: u32, a: u32) -> (String, String) {
        (format!("fdfb:{j}:{a}::1"), format!("fdfb:{j}:{a}::2"))
    }
    /// Spine j's port to aggregation switch a, and a's port to spine j.
    pub fn agg_port(a: u32) -> String {
        format!("a{a}")
    }
    pub fn spine_port(j: u32) -> String {
        format!("s{j}")
    }
    pub fn spine_agg_mac(j: u32, a: u32) -> [u8; 6] {
        [0x02, 0x52, 0x49, j as u8, a as u8, 0]
    }
    pub fn agg_spine_mac(j: u32, a: u32) -> [u8; 6] {
        [0x02, 0x52, 0x4a, j as u8, a as u8, 0]
    }

    pub fn host_port(i: u32) -> String {
        format!("h{i}")
    }
    pub fn uplink_port(j: u32, k: u32) -> String {
        format!("s{j}p{k}")
    }
    pub fn downlink_port(r: u32, k: u32) -> String {
        format!("l{r}p{k}")
    }
    // Racks past 255 (only the simulator builds them) keep their MACs,
    // and so every switch's `auto` seed, distinct: the rack's high bits go
    // where a lab's MACs have zeros.
    pub fn leaf_host_mac(r: u32, i: u32) -> [u8; 6] {
        [0x02, 0x52, 0x46, r as u8, ((r >> 8) << 1) as u8, i as u8]
    }
    pub fn host_mac(r: u32, i: u32) -> [u8; 6] {
        [0x02, 0x52, 0x46, r as u8, ((r >> 8) << 1) as u8 | 0x01, i as u8]
    }
    /// The NIC of host i's virtual machine (`lab up --rdma-hosts`).
    pub fn guest_mac(r: u32, i: u32) -> [u8; 6] {
        [0x02, 0x52, 0x46, r as u8, 0x02, i as u8]
    }
    pub fn leaf_uplink_mac(r: u32, j: u32, k: u32) -> [u8; 6] {
        [0x02, 0x52, 0x47, r as u8, j as u8, ((r >> 8) << 3) as u8 | k as u8]
    }
    pub fn spine_downlink_mac(r: u32, j: u32, k: u32) -> [u8; 6] {
        [0x02, 0x52, 0x48, r as u8, j as u8, ((r >> 8) << 3) as u8 | k as u8]
    }

    /// The leaf's uplinks as (spine, link) in group member order: link 1 of
    /// every spine, then link 2, ... (the order the lab creates them in, so
    /// the kernel's next hops, sorted by interface, come out the same).
    pub fn uplinks(&self, r: u32) -> Vec<(u32, u32)> {
        let spines = self.spines_of_zone(self.zone_of_rack(r));
        (1..=self.links).flat_map(|k| spines.clone().map(move |j| (j, k))).collect()
    }

    /// A switch's ports in config order, with their MACs.
    pub fn ports(&self, switch: Switch) -> Vec<(String, [u8; 6])> {
        match switch {
            Switch::Leaf(r) => {
                let hosts = (1..=self.hosts).map(|i| (Self::host_port(i), Self::leaf_host_mac(r, i)));
                let ups =
                    self.uplinks(r).into_iter().map(|(j, k)| (Self::uplink_port(j, k), Self::leaf_uplink_mac(r, j, k)));
                hosts.chain(ups).collect()
            }
            Switch::Spine(j) => {
                let downs = self.racks_of_zone(self.zone_of_spine(j)).flat_map(|r| {
                    (1..=self.links).map(move |k| (Self::downlink_port(r, k), Self::spine_downlink_mac(r, j, k)))
                });
                let ups = (1..=self.aggs).map(|a| (Self::agg_port(a), Self::spine_agg_mac(j, a)));
                downs.chain(ups).collect()
            }
            Switch::Agg(a) => (1..=self.spines).map(|j| (Self::spine_port(j), Self::agg_spine_mac(j, a))).collect(),
        }
    }

    /// The seed `rocev2 run` will use on `switch`.
    pub fn seed(&self, switch: Switch) -> u32 {
        match self.seeds {
            SeedPlan::Same => SAME_SEED,
            SeedPlan::Auto => auto_seed(self.ports(switch).into_iter().map(|(_, mac)| mac)),
        }
    }

    /// The `hash_seed` value of the generated configs.
    pub fn seed_setting(&self) -> String {
        match self.seeds {
            SeedPlan::Same => SAME_SEED.to_string(),
            SeedPlan::Auto => "\"auto\"".into(),
        }
    }

    /// Every generator of one collective step.
    pub fn connections(&self, pattern: Pattern) -> Vec<Connection> {
        let mut pairs = Vec::new();
        for r in 1..=self.racks {
            for i in 1..=self.hosts {
                match pattern {
                    Pattern::Ring if self.racks > 1 => pairs.push(((r, i), (r % self.racks + 1, i))),
                    Pattern::Ring => pairs.push(((r, i), (r, i % self.hosts + 1))),
                    Pattern::AllToAll => {
                        for r2 in 1..=self.racks {
                            for i2 in 1..=self.hosts {
                                if (r2, i2) != (r, i) {
                                    pairs.push(((r, i), (r2, i2)));
                                }
                            }
                        }
                    }
                }
            }
        }
        pairs.retain(|(s, d)| s != d);
        let families: Vec<bool> = [(self.v4, false), (self.v6, true)].iter().filter(|f| f.0).map(|f| f.1).collect();
        let index = |(r, i): (u32, u32)| (r - 1) * self.hosts + i;
        let mut out = Vec::new();
        for &v6 in &families {
            for &(src, dst) in &pairs {
                // Distinct QP numbers per connection and family (24 bits):
                // source host above bit 12, destination above bit 6, QP below.
                let first_qp = (u32::from(v6) << 23) | (index(src) << 12) | (index(dst) << 6);
                out.push(Connection { src, dst, v6, first_qp });
            }
        }
        out
    }

    /// The generator arguments of one connection (on the source host's eth0).
    pub fn gen_args(&self, c: &Connection, spec: &TrafficSpec) -> GenArgs {
        let mac = crate::sys::format_mac(&Self::leaf_host_mac(c.src.0, c.src.1));
        let mut args = GenArgs::new(
            "eth0",
            &mac,
            Self::host_addr(c.src.0, c.src.1, c.v6),
            Self::host_addr(c.dst.0, c.dst.1, c.v6),
        );
        args.qps = spec.qps;
        args.first_qp = c.first_qp;
        args.sport = spec.sport;
        args.message_packets = MESSAGE_PACKETS;
        args.payload = PAYLOAD;
        args.count = Some(u64::from(spec.qps) * u64::from(spec.messages) * u64::from(MESSAGE_PACKETS));
        args
    }

    /// Switches a packet from `src` to `dst` crosses (its TTL drops by this).
    pub fn hops(&self, src: (u32, u32), dst: (u32, u32)) -> u8 {
        if src.0 == dst.0 {
            1
        } else if self.zone_of_rack(src.0) == self.zone_of_rack(dst.0) {
            3
        } else {
            5
        }
    }

    /// Every link's load for `spec`, from the frames the generators send.
    pub fn predict(&self, spec: &TrafficSpec) -> Result<BTreeMap<LinkId, Load>> {
        self.predict_policy(spec, false)
    }

    /// Like [`Fabric::predict`]; with `flowlet` every switch re-hashes each
    /// message as a new flowlet (the dataplane's `rehash_position`), as if
    /// every message followed an idle gap.
    pub fn predict_policy(&self, spec: &TrafficSpec, flowlet: bool) -> Result<BTreeMap<LinkId, Load>> {
        let mut loads = BTreeMap::new();
        let router = Router::new(self);
        for c in self.connections(spec.pattern) {
            let args = self.gen_args(&c, spec);
            let frames = build_frames(&args, Self::host_mac(c.src.0, c.src.1), args.count.unwrap_or(0))?;
            // The generator sends one message of every QP per pass.
            let per_pass = (spec.qps * MESSAGE_PACKETS) as usize;
            for (n, frame) in frames.into_iter().enumerate() {
                let message = (n / per_pass) as u32;
                let p = parse_roce(&frame)?;
                let fields = PacketFields {
                    src: p.src_ip,
                    dst: p.dst_ip,
                    protocol: 17,
                    src_port: p.src_port,
                    dst_port: p.dst_port,
                    dest_qp: Some(p.bth.dest_qp),
                };
                let Some(key) = fields.flow_key() else { bail!("no flow key for {fields:?}") };
                let pick = |c: Choice| match flowlet {
                    true => rehash_position(&key, c.seed, message, c.table),
                    false => member_for(c.table, member_hash(&key, self.hash, c.seed, self.hash_version)),
                };
                for hop in router.walk(c.src, c.dst, pick) {
                    let Some(link) = hop.link_id() else { continue };
                    let l: &mut Load = loads.entry(link).or_default();
                    l.packets += 1;
                    l.bytes += frame.len() as u64;
                }
            }
        }
        Ok(loads)
    }

    /// Every directed switch-to-switch and switch-to-host link, so idle links show as 0.
    pub fn all_links(&self) -> Vec<LinkId> {
        let mut out = Vec::new();
        for r in 1..=self.racks {
            for (j, k) in self.uplinks(r) {
                out.push(LinkId { tier: Tier::LeafUp, switch: Switch::Leaf(r), port: Self::uplink_port(j, k) });
            }
            for i in 1..=self.hosts {
                out.push(LinkId { tier: Tier::LeafDown, switch: Switch::Leaf(r), port: Self::host_port(i) });
            }
        }
        for j in 1..=self.spines {
            for a in 1..=self.aggs {
                out.push(LinkId { tier: Tier::SpineUp, switch: Switch::Spine(j), port: Self::agg_port(a) });
                out.push(LinkId { tier: Tier::AggDown, switch: Switch::Agg(a), port: Self::spine_port(j) });
            }
            for r in self.racks_of_zone(self.zone_of_spine(j)) {
                for k in 1..=self.links {
                    out.push(LinkId {
                        tier: Tier::SpineDown,
                        switch: Switch::Spine(j),
                        port: Self::downlink_port(r, k),
                    });
                }
            }
        }
        out.sort();
        out
    }

    /// The tier of the link `switch` sends on through `port`.
    pub fn tier_of(switch: Switch, port: &str) -> Tier {
        match switch {
            Switch::Agg(_) => Tier::AggDown,
            Switch::Spine(_) if port.starts_with('a') => Tier::SpineUp,
            Switch::Spine(_) => Tier::SpineDown,
            Switch::Leaf(_) if port.starts_with('h') => Tier::LeafDown,
            Switch::Leaf(_) => Tier::LeafUp,
        }
    }
}

/// One directed link a packet crosses, by the numbers that name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Hop {
    /// Host `host` of rack `rack` to its leaf (the NIC's link, `r1h1/eth0`).
    HostUp {
        rack: u32,
        host: u32,
    },
    /// Leaf `rack` to spine `spine` over parallel link `link`.
    LeafUp {
        rack: u32,
        spine: u32,
        link: u32,
    },
    SpineUp {
        spine: u32,
        agg: u32,
    },
    AggDown {
        agg: u32,
        spine: u32,
    },
    SpineDown {
        spine: u32,
        rack: u32,
        link: u32,
    },
    LeafDown {
        rack: u32,
        host: u32,
    },
}

impl Hop {
    /// The switch link's name as the lab counts it (`None` for a host's uplink).
    pub fn link_id(self) -> Option<LinkId> {
        let id = |tier, switch, port| Some(LinkId { tier, switch, port });
        match self {
            Hop::HostUp { .. } => None,
            Hop::LeafUp { rack, spine, link } => id(Tier::LeafUp, Switch::Leaf(rack), Fabric::uplink_port(spine, link)),
            Hop::SpineUp { spine, agg } => id(Tier::SpineUp, Switch::Spine(spine), Fabric::agg_port(agg)),
            Hop::AggDown { agg, spine } => id(Tier::AggDown, Switch::Agg(agg), Fabric::spine_port(spine)),
            Hop::SpineDown { spine, rack, link } => {
                id(Tier::SpineDown, Switch::Spine(spine), Fabric::downlink_port(rack, link))
            }
            Hop::LeafDown { rack, host } => id(Tier::LeafDown, Switch::Leaf(rack), Fabric::host_port(host)),
        }
    }
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.link_id()) {
            (Hop::HostUp { rack, host }, _) => write!(f, "r{rack}h{host}/eth0"),
            (_, Some(l)) => l.fmt(f),
            (_, None) => unreachable!("only a host's uplink has no switch link"),
        }
    }
}

/// What a switch chooses among: the group a packet's next hop comes from.
#[derive(Clone, Copy, Debug)]
pub struct Choice<'a> {
    pub switch: Switch,
    /// The switch's hash seed (`rocev2 run`'s, see [`Fabric::seed`]).
    pub seed: u32,
    /// The group's bucket table (every member up: [`even_table`]).
    pub table: &'a BucketTable,
    pub members: u32,
    /// The group: a leaf's spines, a spine's aggregation switches, an
    /// aggregation switch's spines of the destination zone, or a spine's
    /// parallel links to the destination leaf.
    pub tier: Tier,
}

/// The fabric's switches ready to route: every switch's seed and group,
/// computed once. [`Router::walk`] is the one place a packet's path through
/// the fabric is decided, for the predicted loads of `lab traffic` and for
/// the collective model; the member choice itself is the caller's (the
/// dataplane's hash, a flowlet's re-hash, a pin).
pub struct Router<'f> {
    pub fabric: &'f Fabric,
    leaf_seeds: Vec<u32>,
    spine_seeds: Vec<u32>,
    agg_seeds: Vec<u32>,
    /// Per zone, the leaf uplinks in member order ([`Fabric::uplinks`]).
    zone_uplinks: Vec<Vec<(u32, u32)>>,
    up_table: BucketTable,
    down_table: BucketTable,
    agg_table: BucketTable,
    zone_table: BucketTable,
}

impl<'f> Router<'f> {
    pub fn new(f: &'f Fabric) -> Self {
        let seeds = |switches: Vec<Switch>| switches.into_iter().map(|s| f.seed(s)).collect();
        Router {
            fabric: f,
            leaf_seeds: seeds((1..=f.racks).map(Switch::Leaf).collect()),
            spine_seeds: seeds((1..=f.spines).map(Switch::Spine).collect()),
            agg_seeds: seeds((1..=f.aggs).map(Switch::Agg).collect()),
            zone_uplinks: (1..=f.zones).map(|z| f.uplinks(*f.racks_of_zone(z).start())).collect(),
            up_table: even_table(f.zone_spines() * f.links),
            down_table: even_table(f.links),
            agg_table: even_table(f.aggs.max(1)),
            zone_table: even_table(f.zone_spines()),
        }
    }

    pub fn seed(&self, s: Switch) -> u32 {
        match s {
            Switch::Leaf(r) => self.leaf_seeds[r as usize - 1],
            Switch::Spine(j) => self.spine_seeds[j as usize - 1],
            Switch::Agg(a) => self.agg_seeds[a as usize - 1],
        }
    }

    /// The links from host `src` to host `dst`, each switch's member chosen
    /// by `choose` (a position below [`Choice::members`]).
    pub fn walk(&self, src: (u32, u32), dst: (u32, u32), mut choose: impl FnMut(Choice) -> u32) -> Vec<Hop> {
        let f = self.fabric;
        let ((src_rack, src_host), (dst_rack, dst_host)) = (src, dst);
        let mut hops = vec![Hop::HostUp { rack: src_rack, host: src_host }];
        let mut pick = |switch: Switch, tier: Tier, table: &BucketTable, members: u32| {
            choose(Choice { switch, seed: self.seed(switch), table, members, tier })
        };
        if src_rack != dst_rack {
            let uplinks = &self.zone_uplinks[f.zone_of_rack(src_rack) as usize - 1];
            let leaf = Switch::Leaf(src_rack);
            let (mut spine, link) = uplinks[pick(leaf, Tier::LeafUp, &self.up_table, uplinks.len() as u32) as usize];
            hops.push(Hop::LeafUp { rack: src_rack, spine, link });
            let dst_zone = f.zone_of_rack(dst_rack);
            if f.zone_of_spine(spine) != dst_zone {
                // Up to an aggregation switch, down to one of the destination zone's spines.
                let agg = pick(Switch::Spine(spine), Tier::SpineUp, &self.agg_table, f.aggs) + 1;
                hops.push(Hop::SpineUp { spine, agg });
                spine = *f.spines_of_zone(dst_zone).start()
                    + pick(Switch::Agg(agg), Tier::AggDown, &self.zone_table, f.zone_spines());
                hops.push(Hop::AggDown { agg, spine });
            }
            let link = pick(Switch::Spine(spine), Tier::SpineDown, &self.down_table, f.links) + 1;
            hops.push(Hop::SpineDown { spine, rack: dst_rack, link });
        }
        hops.push(Hop::LeafDown { rack: dst_rack, host: dst_host });
        hops
    }
}

/// Per-tier summary of link loads: the busiest link over the mean bounds a
/// collective's completion time (it finishes when the busiest link does).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierSummary {
    pub tier: Tier,
    pub links: usize,
    pub idle: usize,
    pub total_bytes: u64,
    pub max_bytes: u64,
    pub mean_bytes: f64,
    /// max / mean; 1.0 is perfect balance.
    pub max_over_mean: f64,
    pub busiest: Option<String>,
}

/// Summaries per tier over `loads` (links missing from it count as idle).
pub fn summarize(all: &[LinkId], loads: &BTreeMap<LinkId, Load>) -> Vec<TierSummary> {
    Tier::ALL
        .iter()
        .filter(|&&tier| all.iter().any(|l| l.tier == tier))
        .map(|&tier| {
            let links: Vec<(&LinkId, u64)> =
                all.iter().filter(|l| l.tier == tier).map(|l| (l, loads.get(l).map_or(0, |x| x.bytes))).collect();
            let total: u64 = links.iter().map(|(_, b)| b).sum();
            let busiest = links.iter().max_by_key(|(_, b)| *b).filter(|(_, b)| *b > 0);
            let mean = if links.is_empty() { 0.0 } else { total as f64 / links.len() as f64 };
            let max = busiest.map_or(0, |(_, b)| *b);
            TierSummary {
                tier,
                links: links.len(),
                idle: links.iter().filter(|(_, b)| *b == 0).count(),
                total_bytes: total,
                max_bytes: max,
                mean_bytes: mean,
                max_over_mean: if mean > 0.0 { max as f64 / mean } else { 0.0 },
                busiest: busiest.map(|(l, _)| l.to_string()),
            }
        })
        .collect()
}

/// One table per tier (every link, idle ones too) and the per-tier summary.
pub fn render_loads(fabric: &Fabric, loads: &BTreeMap<LinkId, Load>) -> String {
    let all = fabric.all_links();
    let tiers = summarize(&all, loads);
    let mut out = String::new();
    for sum in &tiers {
        let tier = &sum.tier;
        let mut table = Table::new(&[
            (tier.name(), Align::Left),
            ("PACKETS", Align::Right),
            ("BYTES", Align::Right),
            ("LOAD", Align::Left),
        ]);
        for l in all.iter().filter(|l| l.tier == *tier) {
            let x = loads.get(l).copied().unwrap_or_default();
            let share = if sum.max_bytes > 0 { x.bytes as f64 / sum.max_bytes as f64 } else { 0.0 };
            table.row([l.to_string(), x.packets.to_string(), x.bytes.to_string(), share_bar(share)]);
        }
        out.push_str(&table.render());
        let _ = writeln!(
            out,
            "  {}: {} links, {} idle, busiest {} at {:.2}x the mean\n",
            tier.name(),
            sum.links,
            sum.idle,
            sum.busiest.as_deref().unwrap_or("-"),
            sum.max_over_mean
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric(seeds: SeedPlan) -> Fabric {
        Fabric {
            racks: 2,
            hosts: 2,
            spines: 2,
            links: 2,
            zones: 1,
            aggs: 0,
            v4: true,
            v6: false,
            hash: HashMode::Qp,
            hash_version: HashVersion::V1,
            seeds,
        }
    }

    fn spec() -> TrafficSpec {
        TrafficSpec { pattern: Pattern::Ring, qps: 8, messages: 2, sport: SportModel::Nic }
    }

    #[test]
    fn fabric_ring_connects_host_i_of_each_rack_to_the_next_rack() {
        let f = fabric(SeedPlan::Same);
        let c = f.connections(Pattern::Ring);
        let pairs: Vec<_> = c.iter().map(|c| (c.src, c.dst)).collect();
        assert_eq!(pairs, [((1, 1), (2, 1)), ((1, 2), (2, 2)), ((2, 1), (1, 1)), ((2, 2), (1, 2))]);
        assert_eq!(f.connections(Pattern::AllToAll).len(), 4 * 3);
        let qps: std::collections::BTreeSet<u32> =
            f.connections(Pattern::AllToAll).iter().map(|c| c.first_qp).collect();
        assert_eq!(qps.len(), 12, "every connection has its own QP numbers");
    }

    #[test]
    fn fabric_prediction_conserves_packets_per_tier() {
        let f = fabric(SeedPlan::Auto);
        let loads = f.predict(&spec()).unwrap();
        let sent = 4 * 8 * 2 * u64::from(MESSAGE_PACKETS);
        for tier in [Tier::LeafUp, Tier::SpineDown, Tier::LeafDown] {
            let n: u64 = loads.iter().filter(|(l, _)| l.tier == tier).map(|(_, x)| x.packets).sum();
            assert_eq!(n, sent, "{tier:?}");
        }
    }

    #[test]
    fn fabric_same_seed_polarizes_the_spine_tier_and_auto_does_not() {
        let all = fabric(SeedPlan::Same).all_links();
        let same = summarize(&all, &fabric(SeedPlan::Same).predict(&spec()).unwrap());
        let auto = summarize(&all, &fabric(SeedPlan::Auto).predict(&spec()).unwrap());
        // With one seed a spine only ever picks the link the leaf's choice implies.
        assert_eq!(same[1].idle, 4, "{same:?}");
        let text = render_loads(&fabric(SeedPlan::Same), &fabric(SeedPlan::Same).predict(&spec()).unwrap());
        let tiers: Vec<&str> =
            text.lines().filter_map(|l| l.trim().split(':').next().filter(|_| l.contains("busiest"))).collect();
        assert_eq!(tiers, ["leaf->spine", "spine->leaf", "leaf->host"], "{text}");
        assert!(auto[1].idle < same[1].idle && auto[1].max_over_mean < same[1].max_over_mean, "{auto:?} {same:?}");
    }

    #[test]
    fn fabric_picture_draws_every_link_and_marks_the_idle_ones() {
        let f = fabric(SeedPlan::Same);
        let loads = f.predict(&spec()).unwrap();
        let svg = picture::svg(&f, &loads, "lab \"x\" & <y>");
        crate::render::assert_well_formed(&svg);
        let lines = svg.matches("<line ").count() - 3; // the legend's three
        assert_eq!(lines, f.all_links().len(), "one line per directed link");
        let idle: usize = summarize(&f.all_links(), &loads).iter().map(|t| t.idle).sum();
        assert!(idle > 0, "the same seed leaves links idle");
        assert_eq!(svg.matches("(idle)</title>").count(), idle, "each idle link is drawn as idle");
        assert!(svg.contains("lab \"x\" &amp; &lt;y&gt;") && svg.contains("hash qp, seeds same"), "{svg}");
    }

    #[test]
    fn fabric_zones_cross_the_aggregation_tier_between_zones_only() {
        let f = Fabric { racks: 4, spines: 4, links: 1, zones: 2, aggs: 2, ..fabric(SeedPlan::Auto) };
        f.validate().unwrap();
        assert_eq!(f.uplinks(3), [(3, 1), (4, 1)], "rack 3 is in zone 2 with spines 3 and 4");
        assert_eq!((f.hops((1, 1), (2, 1)), f.hops((1, 1), (3, 1))), (3, 5));
        let loads = f.predict(&spec()).unwrap();
        let sent = 8 * 8 * 2 * u64::from(MESSAGE_PACKETS);
        // The ring goes 1->2->3->4->1: racks 2->3 and 4->1 cross zones.
        let tier = |t: Tier| loads.iter().filter(|(l, _)| l.tier == t).map(|(_, x)| x.packets).sum::<u64>();
        assert_eq!((tier(Tier::LeafUp), tier(Tier::SpineDown), tier(Tier::LeafDown)), (sent, sent, sent));
        assert_eq!((tier(Tier::SpineUp), tier(Tier::AggDown)), (sent / 2, sent / 2));
        assert_eq!(summarize(&f.all_links(), &loads).len(), 5);
        let mut bad = f.clone();
        bad.racks = 3;
        assert!(bad.validate().unwrap_err().to_string().contains("split evenly"));
    }

    #[test]
    fn fabric_sizes_are_checked() {
        let mut f = fabric(SeedPlan::Same);
        f.racks = 0;
        assert!(f.validate().unwrap_err().to_string().contains("--racks"));
        let mut f = fabric(SeedPlan::Same);
        f.hosts = 32;
        f.spines = 15;
        f.links = 4;
        assert!(f.validate().unwrap_err().to_string().contains("leaf ports"));
    }
}
