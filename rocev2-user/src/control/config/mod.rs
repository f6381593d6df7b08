//! The TOML configuration file of `rocev2 run --config FILE` and
//! `rocev2 check --config FILE`.
//!
//! ```toml
//! [dataplane]
//! hash = "qp"                      # or "five-tuple"; default "qp"
//! hash_seed = 1234                 # u32, default 0
//! hash_version = 2                 # 1 or 2; default 1 (a config without it keeps its placement)
//! xdp_mode = "native"              # or "skb"; default "native"
//! pin_dir = "/sys/fs/bpf/rocev2"   # default rocev2_common::maps::PIN_DIR
//! neighbour_refresh_ms = 1000      # default 1000, 100..=60000
//! telemetry_qps = 4096             # per-QP telemetry table; default 0 (off)
//!
//! [[port]]
//! name = "eth1"
//!
//! [[group]]
//! name = "spines"
//! hash = "five-tuple"              # optional override of dataplane.hash
//! members = [
//!   { dev = "eth2", via = "10.0.2.2" },
//!   { dev = "eth4", mac = "02:00:00:00:00:04" },
//! ]
//!
//! [[route]]
//! prefix = "10.1.0.0/16"
//! group = "spines"
//! ```
//!
//! Parsing happens in two steps: serde reads the file into `Raw*` structs
//! whose fields are wrapped in [`toml::Spanned`], then `Source::validate`
//! checks every value and builds the public types. Keeping the spans until
//! validation is what lets every error name the file, line, column and key,
//! because the people reading these errors are editing the file by hand.
//!
//! - this file: the public, validated types, the errors and loading;
//! - `raw`: the file as serde reads it (`Raw*`, spans kept);
//! - `validate`: `Source`, which checks each section and builds the types;
//! - `values`: parsers of single values (units, addresses, names, QPs);
//! - `diagnostics`: toml/serde errors turned into file:line:column: key: fix.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rocev2_common::buckets::Rebalance;
use rocev2_common::features::Features;
use rocev2_common::hash::{HashMode, HashVersion};
use rocev2_common::maps::PIN_DIR;

/// Default and allowed range of `dataplane.neighbour_refresh_ms`.
const DEFAULT_NEIGHBOUR_REFRESH_MS: u64 = 1000;
const NEIGHBOUR_REFRESH_MS: std::ops::RangeInclusive<i64> = 100..=60_000;
/// Allowed range of `dataplane.telemetry_qps` (0 = off).
const TELEMETRY_QPS: std::ops::RangeInclusive<i64> = 0..=1_048_576;

/// Linux interface names are at most IFNAMSIZ - 1 = 15 bytes.
const MAX_IFNAME_LEN: usize = 15;

// ---------------------------------------------------------------------------
// Public, validated configuration
// ---------------------------------------------------------------------------

/// A validated configuration file.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it came from, for messages.
    pub path: PathBuf,
    pub dataplane: Dataplane,
    pub ports: Vec<Port>,
    pub groups: Vec<Group>,
    pub routes: Vec<Route>,
    /// `[[pin]]`: pinned paths for groups with policy = "pinned".
    pub pins: Vec<Pin>,
    /// `[[pin]]`s without a `group`: for routes learned from the kernel,
    /// by next-hop device or address.
    pub learned_pins: Vec<LearnedPin>,
    /// `[[ecn_profile]]`: named marking profiles.
    pub ecn_profiles: Vec<EcnProfileConfig>,
    /// `[[egress]]`: egress ports with a virtual queue (ECN) and counters.
    pub egress: Vec<Egress>,
    /// `[[class]]`: priority classes in match order (a default `control`
    /// class for ACK and CNP when the file defines none).
    pub classes: Vec<Class>,
    /// `[routing]`: where routes come from besides `[[route]]`.
    pub routing: Routing,
    /// `[[route_policy]]`: how groups learned from kernel routes behave,
    /// by prefix (the most specific match wins).
    pub route_policies: Vec<RoutePolicy>,
    /// `[bridge]` and its `[[uplink_group]]`s: host bridge mode.
    pub bridge: Option<Bridge>,
    /// Valid but probably not meant (a prefix without a length, a group no
    /// route uses): complete lines, `file:line:column: key: message`, that
    /// `check` prints and `run` logs.
    pub warnings: Vec<String>,
}

/// `[bridge]`: rocev2 serves every port of this Linux bridge at layer 2.
#[derive(Clone, Debug, PartialEq)]
pub struct Bridge {
    /// The bridge device.
    pub name: String,
    /// Points at the `name` value.
    pub loc: Location,
    /// The `[[uplink_group]]`s, each also a group in [`Config::groups`]
    /// (members on its ports, frames unchanged).
    pub uplinks: Vec<Uplink>,
}

/// One `[[uplink_group]]`: bridge ports that all reach the same MACs.
#[derive(Clone, Debug, PartialEq)]
pub struct Uplink {
    /// Index of its group in [`Config::groups`].
    pub group_index: usize,
    pub macs: UplinkMacs,
    pub loc: Location,
}

/// Which destination MACs an uplink group serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UplinkMacs {
    /// These, reachable through every port of the group (an anycast
    /// gateway MAC, for one), whatever the bridge's FDB says.
    Listed(Vec<[u8; 6]>),
    /// Every MAC the bridge's FDB has on any port of the group.
    Learned,
}

/// The `[routing]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing {
    /// `source = "kernel"`: mirror a kernel routing table (what FRR, BIRD
    /// or `ip route` fill) next to the `[[route]]`s; `None` = config only.
    pub kernel_table: Option<KernelTable>,
}

/// Which kernel routing table to follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelTable {
    /// A table number (`"main"` = 254).
    Id(u32),
    /// The table of a VRF device, looked up by name at start.
    Vrf(String),
}

/// One `[[route_policy]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutePolicy {
    pub prefix: Prefix,
    pub hash: HashMode,
    pub policy: Policy,
    pub rebalance: Rebalance,
    /// `transport_aware` for the groups learned under this prefix.
    pub transport_aware: Option<TransportAware>,
    pub loc: Location,
}

/// Where the forwarding program runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attach {
    /// XDP on every port (fastest).
    #[default]
    Xdp,
    /// tc (clsact) ingress, for boxes where XDP is not an option; sets skb
    /// priority so an egress HTB can serve control classes first.
    Tc,
}

/// How a group picks a member.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// `hash` (five-tuple or qp) only.
    Hash,
    /// Flowlet switching.
    Flowlet(FlowletConfig),
    /// Pins from `[[pin]]`, `qp` hashing otherwise.
    Pinned,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowletConfig {
    /// Idle time after which a flow may move.
    pub gap: Duration,
    pub choice: rocev2_common::flowlet::FlowletChoice,
    /// Move only right after a packet that ended an RDMA message.
    pub at_message_boundary: bool,
    /// Keyed: flows this group may keep state for (its share of the LRU
    /// table). Keyless: its slot count (a power of two).
    pub table_size: u32,
    /// `flowlet_table`: the keyed LRU table or a keyless slot array.
    pub table: rocev2_common::flowlet::FlowletTable,
}

/// One `[[pin]]`.
#[derive(Clone, Debug)]
pub struct Pin {
    pub prefix: Prefix,
    pub qp: u32,
    pub group_index: u32,
    /// Index into the group's `members`.
    pub member_index: usize,
    pub loc: Location,
}

/// One `[[pin]]` for a learned route: QP `qp` to destinations in `prefix`
/// takes the member of the route's learned group on this device or next hop
/// (the route's group must use `policy = "pinned"` by `[[route_policy]]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnedPin {
    pub prefix: Prefix,
    pub qp: u32,
    pub member: PinMember,
    pub loc: Location,
}

/// Which learned next hop a pin names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinMember {
    Dev(String),
    Via(IpAddr),
}

/// One `[[ecn_profile]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct EcnProfileConfig {
    pub name: String,
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    /// Marking probability at kmax, 0..=1.
    pub pmax: f64,
    pub drop_not_ect: bool,
    pub loc: Location,
}

/// One `[[egress]]`.
#[derive(Clone, Debug)]
pub struct Egress {
    pub dev: String,
    pub rate_bytes_per_sec: u64,
    /// Index into `ecn_profiles`.
    pub ecn_profile: Option<usize>,
    /// Also classify and mark traffic this box sends itself (tc egress).
    pub local: bool,
    pub loc: Location,
}

/// One `[[class]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    pub name: String,
    pub opcodes: Vec<u8>,
    pub max_payload: Option<u32>,
    pub qps: Option<(u32, u32)>,
    pub dscp: Vec<u8>,
    pub set_dscp: Option<u8>,
    /// skb priority (tc), e.g. an HTB class id 1:10 = 0x10010.
    pub priority: Option<u32>,
    pub ecn_exempt: bool,
    /// Index into `ecn_profiles`.
    pub ecn_profile: Option<usize>,
    pub loc: Location,
}

/// The `[dataplane]` table, with defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dataplane {
    pub hash: HashMode,
    pub hash_seed: HashSeed,
    /// `hash_version`: which flow hash every group and the spreading stage
    /// use. 1 when the key is absent, so a fabric configured before the
    /// key existed keeps its placement; new configs write 2.
    pub hash_version: HashVersion,
    pub xdp_mode: XdpMode,
    pub pin_dir: PathBuf,
    pub neighbour_refresh: Duration,
    pub attach: Attach,
    /// Per-QP transport telemetry: the QP table's size, or 0 for off.
    pub telemetry_qps: u32,
    /// `cpu_spread`: a first XDP stage that hands each flow to a CPU by
    /// its hash (DestQP included) through a CPUMAP, whose program runs the
    /// pipeline.
    pub cpu_spread: CpuSpread,
}

/// `dataplane.cpu_spread`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuSpread {
    /// The CPU that receives a packet forwards it (the NIC's RSS decides).
    #[default]
    Off,
    /// Flows are spread over every online CPU by their `qp` hash; one flow
    /// (one QP) always goes to the same CPU, so its packets stay in order.
    Qp,
}

impl Default for Dataplane {
    fn default() -> Self {
        Self {
            hash: HashMode::Qp,
            hash_seed: HashSeed::Fixed(0),
            hash_version: HashVersion::V1,
            xdp_mode: XdpMode::Native,
            pin_dir: PathBuf::from(PIN_DIR),
            neighbour_refresh: Duration::from_millis(DEFAULT_NEIGHBOUR_REFRESH_MS),
            attach: Attach::Xdp,
            telemetry_qps: 0,
            cpu_spread: CpuSpread::Off,
        }
    }
}

/// `dataplane.hash_seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashSeed {
    Fixed(u32),
    /// `"auto"`: derived at start from the MAC addresses of the box's
    /// `[[port]]` interfaces, which are stable and unique per box, so every
    /// switch of a fabric hashes differently (no polarization between
    /// tiers) and keeps its seed across restarts.
    Auto,
}

/// How the XDP program is attached: `xdp_mode` in the config, `run
/// --xdp-mode` on the command line, one text form for both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// In the driver (fast path; needs driver support).
    #[default]
    Native,
    /// Generic XDP in the kernel's network stack (works everywhere, slower).
    Skb,
}

/// One `[[port]]`: an interface whose received traffic is forwarded.
#[derive(Clone, Debug)]
pub struct Port {
    pub name: String,
    /// Points at the `name` value, since the name is what a runtime check
    /// (e.g. "no interface named eth9") complains about.
    pub loc: Location,
}

/// One `[[group]]`: an ECMP group of next hops; or an `[[uplink_group]]`
/// of bridge ports.
#[derive(Clone, Debug)]
pub struct Group {
    pub name: String,
    /// The group's `hash` override, or else `dataplane.hash`.
    pub hash: HashMode,
    pub policy: Policy,
    /// How a member that comes back gets its buckets back.
    pub rebalance: Rebalance,
    /// `transport_aware`: demote members whose QPs see transport trouble.
    pub transport_aware: Option<TransportAware>,
    pub members: Vec<Member>,
    /// Points at the `[[group]]` header.
    pub loc: Location,
}

impl Group {
    /// An `[[uplink_group]]` of bridge ports (not a `[[group]]` of next hops).
    pub fn is_uplink(&self) -> bool {
        self.members.iter().all(|m| m.next_hop == NextHop::BridgePort)
    }
}

/// One entry of a group's `members`.
#[derive(Clone, Debug)]
pub struct Member {
    /// The egress interface.
    pub dev: String,
    pub next_hop: NextHop,
    /// Share of the group's buckets relative to the other members (1..=65535).
    pub weight: u32,
    /// Points at the member's `{ ... }`.
    pub loc: Location,
}

/// How the neighbour MAC of a member is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextHop {
    /// Look the MAC of this IP address up in the kernel's neighbour table.
    Via(IpAddr),
    /// A static neighbour MAC.
    Mac([u8; 6]),
    /// A port of the bridge (an `[[uplink_group]]` member): frames leave
    /// as they came, no MAC is written.
    BridgePort,
}

/// One `[[route]]`.
#[derive(Clone, Debug)]
pub struct Route {
    pub prefix: Prefix,
    /// The group's name as written.
    pub group: String,
    /// Index of that group in [`Config::groups`].
    pub group_index: u32,
    /// Points at the `[[route]]` header.
    pub loc: Location,
}

/// An IPv4 or IPv6 prefix with no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prefix {
    V4 { addr: Ipv4Addr, len: u8 },
    V6 { addr: Ipv6Addr, len: u8 },
}

impl Prefix {
    /// The /32 or /128 prefix of one address.
    pub fn host(addr: IpAddr) -> Prefix {
        match addr {
            IpAddr::V4(addr) => Prefix::V4 { addr, len: 32 },
            IpAddr::V6(addr) => Prefix::V6 { addr, len: 128 },
        }
    }

    /// The prefix containing `addr` with `len` leading bits, host bits
    /// cleared. `len` must be at most 32 (IPv4) or 128 (IPv6).
    fn masked(addr: IpAddr, len: u8) -> Prefix {
        match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                Prefix::V4 { addr: Ipv4Addr::from(u32::from(a) & mask), len }
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                Prefix::V6 { addr: Ipv6Addr::from(u128::from(a) & mask), len }
            }
        }
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        match *self {
            Prefix::V4 { len, .. } | Prefix::V6 { len, .. } => len,
        }
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        match *self {
            Prefix::V4 { addr, .. } => IpAddr::V4(addr),
            Prefix::V6 { addr, .. } => IpAddr::V6(addr),
        }
    }

    /// The prefix of `len` bits containing `addr` (host bits cleared);
    /// `None` when `len` is too long for the family.
    pub fn of(addr: IpAddr, len: u8) -> Option<Prefix> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then(|| Prefix::masked(addr, len))
    }

    /// Whether `addr` lies in this prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr().is_ipv4() && Prefix::masked(addr, self.prefix_len()) == *self
    }

    /// The shorter prefixes containing this one, longest first, down to /0.
    pub fn ancestors(&self) -> impl Iterator<Item = Prefix> + '_ {
        (0..self.prefix_len()).rev().map(|len| Prefix::masked(self.addr(), len))
    }

    /// Whether `other` lies inside this prefix (or is it).
    pub fn covers(&self, other: &Prefix) -> bool {
        other.prefix_len() >= self.prefix_len() && self.contains(other.addr())
    }
}

impl std::str::FromStr for Prefix {
    type Err = String;

    /// `10.1.0.0/16`, `fd00::/48`, or a bare address (a host prefix).
    fn from_str(s: &str) -> Result<Prefix, String> {
        parse_prefix(s)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix_len())
    }
}

/// Where an item was written, for messages about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Key path, e.g. `group[0].members[1]` (indices are 0-based).
    pub key: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a configuration file was rejected. `Display` is the complete
/// one-line message, e.g.
/// `lab.toml:14:10: route[2].prefix: "10.1.0.1/16" has host bits set; did you mean "10.1.0.0/16"?`
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read. (The io error is part of the message
    /// rather than a `source`, so `{:#}` chains do not print it twice.)
    #[error("{}: cannot read: {error}{}", path.display(), start_hint(error))]
    Read { path: PathBuf, error: std::io::Error },
    /// A problem at a place in the file. `key` may be empty when the
    /// place has no key (e.g. some TOML syntax errors).
    #[error("{}:{line}:{column}: {}", path.display(), with_key(key, message))]
    At { path: PathBuf, line: usize, column: usize, key: String, message: String },
    /// A problem with the file as a whole, e.g. no `[[port]]` at all.
    #[error("{}: {}", path.display(), with_key(key, message))]
    File { path: PathBuf, key: String, message: String },
}

/// For a config file that does not exist: where to start one.
fn start_hint(error: &std::io::Error) -> &'static str {
    if error.kind() == std::io::ErrorKind::NotFound {
        "; start from the example config (packaging/rocev2.toml in the source, /etc/rocev2/rocev2.toml once the package is installed), or let `rocev2 lab up` write one for a lab"
    } else {
        ""
    }
}

fn with_key(key: &str, message: &str) -> String {
    if key.is_empty() {
        message.to_string()
    } else {
        format!("{key}: {message}")
    }
}

impl ConfigError {
    /// The 1-based line the error is about, if it is about one.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::At { line, .. } => Some(*line),
            _ => None,
        }
    }

    /// The key path the error is about (may be empty).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::At { key, .. } | ConfigError::File { key, .. } => Some(key),
            ConfigError::Read { .. } => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.to_path_buf(), error })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`; `path` is only used in messages.
    /// Checks nothing on the running system (interfaces, neighbours).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let src = Source { text, path };
        let raw: RawFile = toml::from_str(text).map_err(|e| src.toml_error(&e))?;
        src.validate(raw)
    }

    /// An error about an item, for checks that need the running system,
    /// e.g. `config.error_at(&port.loc, "name", "no interface named eth9")`
    /// gives `lab.toml:5:8: port[0].name: no interface named eth9`.
    /// An empty `field` means the item itself.
    pub fn error_at(&self, loc: &Location, field: &str, message: impl Into<String>) -> ConfigError {
        let key = match (loc.key.is_empty(), field.is_empty()) {
            (_, true) => loc.key.clone(),
            (true, false) => field.to_string(),
            (false, false) => format!("{}.{field}", loc.key),
        };
        ConfigError::At { path: self.path.clone(), line: loc.line, column: loc.column, key, message: message.into() }
    }
}

/// Buckets a `rebalance = "gradual"` group hands back per control-loop
/// step (the link check, every 100 ms): 10 buckets a second, so a member
/// of an 8-way group (32 of 256 buckets) is back in 3.2 s.
pub const GRADUAL_BUCKETS_PER_STEP: u32 = 1;

use rocev2_common::flowlet::FlowletTable;

impl Config {
    /// Size of the flowlet LRU table: the sum of the flowlet groups' and
    /// flowlet `[[route_policy]]`s' shares (at least one entry, so the map
    /// can be created).
    pub fn flowlet_table_size(&self) -> u32 {
        let total: u64 = self
            .groups
            .iter()
            .map(|g| &g.policy)
            .chain(self.route_policies.iter().map(|p| &p.policy))
            .map(|policy| match policy {
                Policy::Flowlet(f) if f.table == FlowletTable::Keyed => u64::from(f.table_size),
                _ => 0,
            })
            .sum();
        total.clamp(1, u64::from(u32::MAX)) as u32
    }

    /// Slots of the keyless flowlet array: the largest keyless table of any
    /// group or route policy (they share the array, each with its own mask
    /// and group-seeded hash); 1 when none is keyless.
    pub fn flowlet_slots(&self) -> u32 {
        self.groups
            .iter()
            .map(|g| &g.policy)
            .chain(self.route_policies.iter().map(|p| &p.policy))
            .filter_map(|policy| match policy {
                Policy::Flowlet(f) if f.table == FlowletTable::Keyless => Some(f.table_size),
                _ => None,
            })
            .max()
            .unwrap_or(1)
    }

    /// Where in this config `feature` comes from, for messages: e.g.
    /// `policy = "flowlet" in [[group]] "spines" (line 12)`.
    pub fn feature_sources(&self, feature: Features) -> Vec<String> {
        let mut found = Vec::new();
        let policies = self
            .groups
            .iter()
            .map(|g| (format!("[[group]] {:?}", g.name), &g.policy, &g.transport_aware, g.loc.line))
            .chain(
                self.route_policies
                    .iter()
                    .map(|p| (format!("[[route_policy]] {}", p.prefix), &p.policy, &p.transport_aware, p.loc.line)),
            );
        for (place, policy, transport, line) in policies {
            let uses = match policy {
                Policy::Flowlet(f) if f.table == FlowletTable::Keyed && feature == Features::FLOWLET_KEYED => {
                    Some("policy = \"flowlet\"")
                }
                Policy::Flowlet(f) if f.table == FlowletTable::Keyless && feature == Features::FLOWLET_KEYLESS => {
                    Some("flowlet_table = \"keyless\"")
                }
                Policy::Pinned if feature == Features::PINNED => Some("policy = \"pinned\""),
                _ if feature == Features::ACKED_REPICK && transport.is_some_and(|t| t.repick_when_acked) => {
                    Some("transport_aware with repick = \"idle-or-acked\"")
                }
                _ => None,
            };
            if let Some(uses) = uses {
                found.push(format!("{uses} in {place} (line {line})"));
            }
        }
        if feature == Features::ECN {
            found.extend(self.egress.iter().map(|e| format!("[[egress]] on {} (line {})", e.dev, e.loc.line)));
        }
        if feature == Features::CLASSES {
            found.extend(self.classes.iter().map(|c| format!("[[class]] {:?} (line {})", c.name, c.loc.line)));
        }
        if feature == Features::TELEMETRY && self.dataplane.telemetry_qps > 0 {
            found.push(format!("telemetry_qps = {} in [dataplane]", self.dataplane.telemetry_qps));
        }
        found
    }

    /// The pipeline features this config uses, for the programs' load-time
    /// constant: code for the others is left out of the loaded programs.
    /// The built-in `control` class counts as a class (`class = []` turns
    /// classes off).
    pub fn features(&self) -> Features {
        let policies = self.groups.iter().map(|g| &g.policy).chain(self.route_policies.iter().map(|p| &p.policy));
        let (mut keyed, mut keyless, mut pinned) = (false, false, false);
        for policy in policies {
            keyed |= matches!(policy, Policy::Flowlet(f) if f.table == FlowletTable::Keyed);
            keyless |= matches!(policy, Policy::Flowlet(f) if f.table == FlowletTable::Keyless);
            pinned |= matches!(policy, Policy::Pinned);
        }
        Features::COUNTERS
            .with(Features::when(keyed, Features::FLOWLET_KEYED))
            .with(Features::when(keyless, Features::FLOWLET_KEYLESS))
            .with(Features::when(pinned, Features::PINNED))
            .with(Features::when(!self.egress.is_empty(), Features::ECN))
            .with(Features::when(!self.classes.is_empty(), Features::CLASSES))
            .with(Features::when(self.dataplane.telemetry_qps > 0, Features::TELEMETRY))
            .with(Features::when(
                self.groups
                    .iter()
                    .map(|g| g.transport_aware)
                    .chain(self.route_policies.iter().map(|p| p.transport_aware))
                    .any(|t| t.is_some_and(|t| t.repick_when_acked)),
                Features::ACKED_REPICK,
            ))
    }

    /// The classes as the dataplane's CLASSES map entries, in match order.
    pub fn class_entries(&self) -> Vec<rocev2_common::class::ClassEntry> {
        use rocev2_common::class::*;
        self.classes
            .iter()
            .map(|c| {
                let mut e = ClassEntry::default();
                if !c.opcodes.is_empty() {
                    e.flags |= CLASS_MATCH_OPCODE;
                    for op in &c.opcodes {
                        add_opcode(&mut e.opcodes, *op);
                    }
                }
                if !c.dscp.is_empty() {
                    e.flags |= CLASS_MATCH_DSCP;
                    for d in &c.dscp {
                        e.dscps |= 1 << d;
                    }
                }
                if let Some((lo, hi)) = c.qps {
                    e.flags |= CLASS_MATCH_QP;
                    e.qp_min = lo;
                    e.qp_max = hi;
                }
                if let Some(max) = c.max_payload {
                    e.flags |= CLASS_MATCH_PAYLOAD;
                    e.max_payload = max;
                }
                if let Some(d) = c.set_dscp {
                    e.flags |= CLASS_SET_DSCP;
                    e.set_dscp = u32::from(d);
                }
                if let Some(p) = c.priority {
                    e.flags |= CLASS_SET_PRIORITY;
                    e.priority = p;
                }
                if c.ecn_exempt {
                    e.flags |= CLASS_ECN_EXEMPT;
                }
                if let Some(p) = c.ecn_profile {
                    e.flags |= CLASS_ECN_PROFILE;
                    e.profile = p as u32;
                }
                e
            })
            .collect()
    }
}

impl EcnProfileConfig {
    pub fn to_map_entry(&self) -> rocev2_common::ecn::EcnProfile {
        rocev2_common::ecn::EcnProfile {
            kmin_bytes: self.kmin_bytes,
            kmax_bytes: self.kmax_bytes,
            pmax_scaled: (self.pmax * f64::from(u32::MAX)).round() as u32,
            flags: if self.drop_not_ect { rocev2_common::ecn::PROFILE_DROP_NOT_ECT } else { 0 },
        }
    }
}

mod bridge;
mod diagnostics;
mod raw;
pub mod reference;
mod transport_aware;
mod validate;
mod values;

pub use transport_aware::TransportAware;
pub use values::{parse_gap, parse_rate_arg, parse_size_arg};

// The submodules' items, for each other and for the tests (`use super::*`).
#[allow(unused_imports, reason = "the tests use what the submodules do not")]
use {diagnostics::*, raw::*, validate::*, values::*};

#[cfg(test)]
mod tests;
