//! The TOML configuration file of `rocev2 run --config FILE` and
//! `rocev2 check --config FILE`.
//!
//! ```toml
//! [dataplane]
//! hash = "qp"                      # or "five-tuple"; default "qp"
//! hash_seed = 1234                 # u32, default 0
//! xdp_mode = "native"              # or "skb"; default "native"
//! pin_dir = "/sys/fs/bpf/rocev2"   # default rocev2_common::maps::PIN_DIR
//! neighbour_refresh_ms = 1000      # default 1000, 100..=60000
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
//! whose fields are wrapped in [`toml::Spanned`], then [`Source::validate`]
//! checks every value and builds the public types. Keeping the spans until
//! validation is what lets every error name the file, line, column and key,
//! because the people reading these errors are editing the file by hand.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rocev2_common::buckets::Rebalance;
use rocev2_common::hash::HashMode;
use rocev2_common::maps::{MAX_GROUPS, MAX_MEMBERS_PER_GROUP, MAX_PORTS, PIN_DIR};
use serde::Deserialize;

use crate::sys::suggest::closest_match;
use toml::Spanned;

/// Default and allowed range of `dataplane.neighbour_refresh_ms`.
const DEFAULT_NEIGHBOUR_REFRESH_MS: u64 = 1000;
const NEIGHBOUR_REFRESH_MS: std::ops::RangeInclusive<i64> = 100..=60_000;

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
    /// Flows this group may keep state for (its share of the LRU table).
    pub table_size: u32,
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
    pub xdp_mode: XdpMode,
    pub pin_dir: PathBuf,
    pub neighbour_refresh: Duration,
    pub attach: Attach,
}

impl Default for Dataplane {
    fn default() -> Self {
        Self {
            hash: HashMode::Qp,
            hash_seed: HashSeed::Fixed(0),
            xdp_mode: XdpMode::Native,
            pin_dir: PathBuf::from(PIN_DIR),
            neighbour_refresh: Duration::from_millis(DEFAULT_NEIGHBOUR_REFRESH_MS),
            attach: Attach::Xdp,
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

/// How the XDP program is attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// One `[[group]]`: an ECMP group of next hops.
#[derive(Clone, Debug)]
pub struct Group {
    pub name: String,
    /// The group's `hash` override, or else `dataplane.hash`.
    pub hash: HashMode,
    pub policy: Policy,
    /// How a member that comes back gets its buckets back.
    pub rebalance: Rebalance,
    pub members: Vec<Member>,
    /// Points at the `[[group]]` header.
    pub loc: Location,
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
    #[error("{}: cannot read: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    /// A problem at a place in the file. `key` may be empty when the
    /// place has no key (e.g. some TOML syntax errors).
    #[error("{}:{line}:{column}: {}", path.display(), with_key(key, message))]
    At { path: PathBuf, line: usize, column: usize, key: String, message: String },
    /// A problem with the file as a whole, e.g. no `[[port]]` at all.
    #[error("{}: {}", path.display(), with_key(key, message))]
    File { path: PathBuf, key: String, message: String },
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

// ---------------------------------------------------------------------------
// Raw file layout, as serde sees it
// ---------------------------------------------------------------------------

// Values that need checking are read as strings / i64 and parsed in
// `validate`, so the messages can say which values are allowed (serde's
// "unknown variant" or "expected u32" would not help a network engineer).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    dataplane: RawDataplane,
    #[serde(default)]
    port: Vec<Spanned<RawPort>>,
    #[serde(default)]
    group: Vec<Spanned<RawGroup>>,
    #[serde(default)]
    route: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pin: Vec<Spanned<RawPin>>,
    #[serde(default)]
    ecn_profile: Vec<Spanned<RawEcnProfile>>,
    #[serde(default)]
    egress: Vec<Spanned<RawEgress>>,
    #[serde(default)]
    class: Option<Vec<Spanned<RawClass>>>,
    #[serde(default)]
    routing: Option<Spanned<RawRouting>>,
    #[serde(default)]
    route_policy: Vec<Spanned<RawRoutePolicy>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    source: Option<Spanned<String>>,
    table: Option<Spanned<toml::Value>>,
}

/// The policy keys are those of [`RawGroup`], listed again: serde's
/// `flatten` cannot be combined with `deny_unknown_fields`, which the
/// "did you mean" messages rely on. Both are checked by `Source::policy`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoutePolicy {
    prefix: Spanned<String>,
    hash: Option<Spanned<String>>,
    policy: Option<Spanned<String>>,
    flowlet_gap_us: Option<Spanned<i64>>,
    flowlet_choice: Option<Spanned<String>>,
    flowlet_boundary: Option<Spanned<bool>>,
    flowlet_table_size: Option<Spanned<i64>>,
    rebalance: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    prefix: Spanned<String>,
    qp: Spanned<i64>,
    /// Absent: a pin for a route learned from the kernel.
    group: Option<Spanned<String>>,
    member: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEcnProfile {
    name: Spanned<String>,
    kmin: Spanned<toml::Value>,
    kmax: Spanned<toml::Value>,
    pmax: Spanned<toml::Value>,
    drop_not_ect: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgress {
    dev: Spanned<String>,
    rate: Spanned<toml::Value>,
    ecn_profile: Option<Spanned<String>>,
    local: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    name: Spanned<String>,
    opcodes: Option<Spanned<Vec<i64>>>,
    max_payload: Option<Spanned<i64>>,
    qps: Option<Spanned<toml::Value>>,
    dscp: Option<Spanned<Vec<i64>>>,
    set_dscp: Option<Spanned<i64>>,
    priority: Option<Spanned<toml::Value>>,
    ecn_exempt: Option<Spanned<bool>>,
    ecn_profile: Option<Spanned<String>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataplane {
    hash: Option<Spanned<String>>,
    hash_seed: Option<Spanned<toml::Value>>,
    xdp_mode: Option<Spanned<String>>,
    pin_dir: Option<Spanned<String>>,
    neighbour_refresh_ms: Option<Spanned<i64>>,
    attach: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    name: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: Spanned<String>,
    hash: Option<Spanned<String>>,
    policy: Option<Spanned<String>>,
    flowlet_gap_us: Option<Spanned<i64>>,
    flowlet_choice: Option<Spanned<String>>,
    flowlet_boundary: Option<Spanned<bool>>,
    flowlet_table_size: Option<Spanned<i64>>,
    rebalance: Option<Spanned<String>>,
    members: Spanned<Vec<Spanned<RawMember>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMember {
    dev: Spanned<String>,
    via: Option<Spanned<String>>,
    mac: Option<Spanned<String>>,
    weight: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    prefix: Spanned<String>,
    group: Spanned<String>,
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// The text being parsed and its file name: everything needed to turn a
/// byte span into a message.
struct Source<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Source<'_> {
    fn loc(&self, key: impl Into<String>, span: Range<usize>) -> Location {
        let (line, column) = line_col(self.text, span.start);
        Location { key: key.into(), line, column }
    }

    fn err(&self, key: impl Into<String>, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        let loc = self.loc(key, span);
        ConfigError::At {
            path: self.path.to_path_buf(),
            line: loc.line,
            column: loc.column,
            key: loc.key,
            message: message.into(),
        }
    }

    /// Runs `check` on a spanned value, turning its message into an error
    /// pointing at the value.
    fn check<T, V>(
        &self,
        key: impl Into<String>,
        value: &Spanned<V>,
        check: impl FnOnce(&V) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        check(value.get_ref()).map_err(|m| self.err(key, value.span(), m))
    }

    fn validate(&self, raw: RawFile) -> Result<Config, ConfigError> {
        let dataplane = self.dataplane(&raw.dataplane)?;
        let ports = self.ports(&raw.port)?;
        let groups = self.groups(&raw.group, dataplane.hash)?;
        let routes = self.routes(&raw.route, &groups)?;
        let routing = match &raw.routing {
            Some(r) => self.routing(r)?,
            None => Routing::default(),
        };
        let (pins, learned_pins) = self.pins(&raw.pin, &groups, &routing)?;
        let ecn_profiles = self.ecn_profiles(&raw.ecn_profile)?;
        let egress = self.egress(&raw.egress, &ecn_profiles)?;
        let classes = match &raw.class {
            Some(raw) => self.classes(raw, &ecn_profiles)?,
            None => vec![default_control_class()],
        };
        let route_policies = self.route_policies(raw.route_policy, dataplane.hash)?;
        Ok(Config {
            path: self.path.to_path_buf(),
            dataplane,
            ports,
            groups,
            routes,
            pins,
            learned_pins,
            ecn_profiles,
            egress,
            classes,
            routing,
            route_policies,
        })
    }

    fn routing(&self, raw: &Spanned<RawRouting>) -> Result<Routing, ConfigError> {
        let r = raw.get_ref();
        let kernel = match &r.source {
            Some(v) => self.check("routing.source", v, |s| match s.as_str() {
                "kernel" => Ok(true),
                "config" => Ok(false),
                other => Err(format!(
                    "{other:?} is not a route source; use \"kernel\" (follow a kernel routing table, as FRR or BIRD fill it) or \"config\" ([[route]] only)"
                )),
            })?,
            None => false,
        };
        let table = match &r.table {
            None => KernelTable::Id(crate::routing::fib::RT_TABLE_MAIN),
            Some(v) => self.check("routing.table", v, |t| match t {
                toml::Value::String(s) if s == "main" => Ok(KernelTable::Id(crate::routing::fib::RT_TABLE_MAIN)),
                toml::Value::String(s) if !s.is_empty() => {
                    check_ifname(s)?;
                    Ok(KernelTable::Vrf(s.clone()))
                }
                toml::Value::Integer(n) if (1..=i64::from(u32::MAX)).contains(n) && *n != 255 => {
                    Ok(KernelTable::Id(*n as u32))
                }
                other => Err(format!(
                    "{other} is not a routing table; use \"main\", a table number (1 to {}, not 255: the local table), or a VRF device name",
                    u32::MAX
                )),
            })?,
        };
        if r.table.is_some() && !kernel {
            return Err(self.err(
                "routing.table",
                r.table.as_ref().map_or(raw.span(), |t| t.span()),
                "only applies to source = \"kernel\"; add that or remove `table`",
            ));
        }
        Ok(Routing { kernel_table: kernel.then_some(table) })
    }

    fn route_policies(
        &self,
        raw: Vec<Spanned<RawRoutePolicy>>,
        default_hash: HashMode,
    ) -> Result<Vec<RoutePolicy>, ConfigError> {
        let mut out: Vec<RoutePolicy> = Vec::with_capacity(raw.len());
        for (i, r) in raw.into_iter().enumerate() {
            let key = format!("route_policy[{i}]");
            let span = r.span();
            let r = r.into_inner();
            let prefix = self.check(format!("{key}.prefix"), &r.prefix, |s| parse_prefix(s))?;
            if let Some(first) = out.iter().find(|p| p.prefix == prefix) {
                return Err(self.err(
                    format!("{key}.prefix"),
                    r.prefix.span(),
                    format!("{prefix} already has a policy ({}, line {}); remove one", first.loc.key, first.loc.line),
                ));
            }
            let hash = match &r.hash {
                Some(v) => self.check(format!("{key}.hash"), v, |s| parse_hash(s))?,
                None => default_hash,
            };
            let rebalance = self.rebalance(&key, r.rebalance.as_ref())?;
            // The same policy keys as a [[group]]'s, checked by the same code.
            let as_group = RawGroup {
                name: Spanned::new(span.clone(), String::new()),
                hash: None,
                policy: r.policy,
                flowlet_gap_us: r.flowlet_gap_us,
                flowlet_choice: r.flowlet_choice,
                flowlet_boundary: r.flowlet_boundary,
                flowlet_table_size: r.flowlet_table_size,
                rebalance: None,
                members: Spanned::new(span.clone(), Vec::new()),
            };
            let policy = self.policy(&key, &as_group)?;
            out.push(RoutePolicy { prefix, hash, policy, rebalance, loc: self.loc(key, span) });
        }
        Ok(out)
    }

    fn rebalance(&self, key: &str, raw: Option<&Spanned<String>>) -> Result<Rebalance, ConfigError> {
        match raw {
            None => Ok(Rebalance::Immediate),
            Some(v) => self.check(format!("{key}.rebalance"), v, |s| match s.as_str() {
                "immediate" => Ok(Rebalance::Immediate),
                "gradual" => Ok(Rebalance::Gradual(GRADUAL_BUCKETS_PER_STEP)),
                other => Err(format!(
                    "{other:?} is not a rebalance mode; use \"immediate\" (a returning member gets its buckets back at once) or \"gradual\" (one bucket every 100 ms)"
                )),
            }),
        }
    }

    fn dataplane(&self, raw: &RawDataplane) -> Result<Dataplane, ConfigError> {
        let mut dp = Dataplane::default();
        if let Some(v) = &raw.hash {
            dp.hash = self.check("dataplane.hash", v, |s| parse_hash(s))?;
        }
        if let Some(v) = &raw.hash_seed {
            dp.hash_seed = self.check("dataplane.hash_seed", v, |v| match v {
                toml::Value::Integer(n) => u32::try_from(*n).map(HashSeed::Fixed).map_err(|_| {
                    let what = if *n < 0 { "is negative" } else { "is too big" };
                    format!("{n} {what}; the seed is a whole number from 0 to {}, or \"auto\"", u32::MAX)
                }),
                toml::Value::String(s) if s == "auto" => Ok(HashSeed::Auto),
                other => Err(format!(
                    "{other} is not a seed; use a whole number from 0 to {} or \"auto\" (derived from this box's port MACs, different on every switch)",
                    u32::MAX
                )),
            })?;
        }
        if let Some(v) = &raw.xdp_mode {
            dp.xdp_mode = self.check("dataplane.xdp_mode", v, |s| parse_xdp_mode(s))?;
        }
        if let Some(v) = &raw.pin_dir {
            dp.pin_dir = self.check("dataplane.pin_dir", v, |s| {
                // Relative paths would depend on where rocev2 was started,
                // and `rocev2 stats` must find the same directory.
                if Path::new(s).is_absolute() {
                    Ok(PathBuf::from(s))
                } else {
                    Err(format!(
                        "{s:?} is not an absolute path; use a directory on the BPF filesystem, e.g. {PIN_DIR:?}"
                    ))
                }
            })?;
        }
        if let Some(v) = &raw.attach {
            dp.attach = self.check("dataplane.attach", v, |s| match s.as_str() {
                "xdp" => Ok(Attach::Xdp),
                "tc" => Ok(Attach::Tc),
                other => Err(format!(
                    "{other:?} is not an attach point; use \"xdp\" (fastest) or \"tc\" (tc ingress, sets skb priority)"
                )),
            })?;
        }
        if let Some(v) = &raw.neighbour_refresh_ms {
            dp.neighbour_refresh = self.check("dataplane.neighbour_refresh_ms", v, |&ms| {
                if NEIGHBOUR_REFRESH_MS.contains(&ms) {
                    // In range, so positive and small: the cast is lossless.
                    Ok(Duration::from_millis(ms as u64))
                } else {
                    Err(format!(
                        "{ms} is out of range; use {} to {} milliseconds",
                        NEIGHBOUR_REFRESH_MS.start(),
                        NEIGHBOUR_REFRESH_MS.end()
                    ))
                }
            })?;
        }
        Ok(dp)
    }

    fn ports(&self, raw: &[Spanned<RawPort>]) -> Result<Vec<Port>, ConfigError> {
        if raw.is_empty() {
            return Err(ConfigError::File {
                path: self.path.to_path_buf(),
                key: "port".into(),
                message: "no [[port]] section; add one per interface that receives traffic to \
                          forward, e.g. [[port]] with name = \"eth1\""
                    .into(),
            });
        }
        // Slot 0 of the port counters is reserved for unregistered interfaces.
        let max_ports = (MAX_PORTS - 1) as usize;
        let mut ports: Vec<Port> = Vec::with_capacity(raw.len());
        for (i, p) in raw.iter().enumerate() {
            let key = format!("port[{i}]");
            if i >= max_ports {
                return Err(self.err(
                    &key,
                    p.span(),
                    format!("too many ports; the dataplane supports at most {max_ports}"),
                ));
            }
            let name = &p.get_ref().name;
            let name_key = format!("{key}.name");
            self.check(&name_key, name, |s| check_ifname(s))?;
            if let Some(first) = ports.iter().find(|q| q.name == *name.get_ref()) {
                return Err(self.err(
                    name_key,
                    name.span(),
                    format!(
                        "{:?} is already listed as {} (line {}); list each interface once",
                        name.get_ref(),
                        first.loc.key,
                        first.loc.line
                    ),
                ));
            }
            ports.push(Port { name: name.get_ref().clone(), loc: self.loc(key, name.span()) });
        }
        Ok(ports)
    }

    fn groups(&self, raw: &[Spanned<RawGroup>], default_hash: HashMode) -> Result<Vec<Group>, ConfigError> {
        let mut groups: Vec<Group> = Vec::with_capacity(raw.len());
        for (i, g) in raw.iter().enumerate() {
            let key = format!("group[{i}]");
            if i >= MAX_GROUPS as usize {
                return Err(self.err(
                    key,
                    g.span(),
                    format!("too many groups; the dataplane supports at most {MAX_GROUPS}"),
                ));
            }
            let g_ref = g.get_ref();
            let name_key = format!("{key}.name");
            let name = self.check(&name_key, &g_ref.name, |s| {
                if s.trim().is_empty() {
                    Err("a group needs a name, e.g. name = \"spines\"; routes refer to it".into())
                } else {
                    Ok(s.clone())
                }
            })?;
            if let Some(first) = groups.iter().find(|h| h.name == name) {
                return Err(self.err(
                    name_key,
                    g_ref.name.span(),
                    format!(
                        "a group named {name:?} already exists ({}, line {}); group names must be unique",
                        first.loc.key, first.loc.line
                    ),
                ));
            }
            let hash = match &g_ref.hash {
                Some(v) => self.check(format!("{key}.hash"), v, |s| parse_hash(s))?,
                None => default_hash,
            };
            let policy = self.policy(&key, g_ref)?;
            let rebalance = self.rebalance(&key, g_ref.rebalance.as_ref())?;
            let members = self.members(&key, &g_ref.members)?;
            groups.push(Group { name, hash, policy, rebalance, members, loc: self.loc(key, g.span()) });
        }
        Ok(groups)
    }

    fn members(&self, group_key: &str, raw: &Spanned<Vec<Spanned<RawMember>>>) -> Result<Vec<Member>, ConfigError> {
        let key = format!("{group_key}.members");
        if raw.get_ref().is_empty() {
            return Err(self.err(
                key,
                raw.span(),
                "a group needs at least one member, e.g. members = [{ dev = \"eth2\", via = \"10.0.2.2\" }]",
            ));
        }
        let mut members = Vec::with_capacity(raw.get_ref().len());
        for (j, m) in raw.get_ref().iter().enumerate() {
            let m_key = format!("{key}[{j}]");
            if j >= MAX_MEMBERS_PER_GROUP as usize {
                return Err(self.err(
                    m_key,
                    m.span(),
                    format!(
                        "too many members; a group has at most {MAX_MEMBERS_PER_GROUP}, \
                         split the next hops over several groups"
                    ),
                ));
            }
            let m_ref = m.get_ref();
            self.check(format!("{m_key}.dev"), &m_ref.dev, |s| check_ifname(s))?;
            let next_hop = match (&m_ref.via, &m_ref.mac) {
                (Some(via), None) => NextHop::Via(self.check(format!("{m_key}.via"), via, |s| parse_via(s))?),
                (None, Some(mac)) => NextHop::Mac(self.check(format!("{m_key}.mac"), mac, |s| parse_mac(s))?),
                (Some(_), Some(_)) => {
                    return Err(self.err(
                        m_key,
                        m.span(),
                        "has both `via` and `mac`; give exactly one: `via` (next-hop IP, MAC from \
                         the kernel's neighbour table) or `mac` (static neighbour MAC)",
                    ))
                }
                (None, None) => {
                    return Err(self.err(
                        m_key,
                        m.span(),
                        "needs `via` (next-hop IP, MAC from the kernel's neighbour table) or `mac` \
                         (static neighbour MAC), e.g. { dev = \"eth2\", via = \"10.0.2.2\" }",
                    ))
                }
            };
            let weight = match &m_ref.weight {
                Some(w) => self.check(format!("{m_key}.weight"), w, |&n| {
                    if (1..=65_535).contains(&n) {
                        Ok(n as u32)
                    } else {
                        Err(format!("{n} is out of range; a weight is 1 to 65535 (a member's share of the group's buckets relative to the others)"))
                    }
                })?,
                None => 1,
            };
            members.push(Member { dev: m_ref.dev.get_ref().clone(), next_hop, weight, loc: self.loc(m_key, m.span()) });
        }
        Ok(members)
    }

    fn routes(&self, raw: &[Spanned<RawRoute>], groups: &[Group]) -> Result<Vec<Route>, ConfigError> {
        let mut routes: Vec<Route> = Vec::with_capacity(raw.len());
        // First route of each prefix, to name it in the duplicate error.
        let mut seen: HashMap<Prefix, usize> = HashMap::new();
        for (i, r) in raw.iter().enumerate() {
            let key = format!("route[{i}]");
            let r_ref = r.get_ref();
            let prefix_key = format!("{key}.prefix");
            let prefix = self.check(&prefix_key, &r_ref.prefix, |s| parse_prefix(s))?;
            if let Some(&first) = seen.get(&prefix) {
                let first = &routes[first];
                return Err(self.err(
                    prefix_key,
                    r_ref.prefix.span(),
                    format!(
                        "{prefix} is already routed by {} (line {}); remove one of them",
                        first.loc.key, first.loc.line
                    ),
                ));
            }
            let group_index = self.check(format!("{key}.group"), &r_ref.group, |name| {
                groups.iter().position(|g| g.name == *name).ok_or_else(|| no_such_group(name, groups))
            })?;
            seen.insert(prefix, routes.len());
            routes.push(Route {
                prefix,
                group: r_ref.group.get_ref().clone(),
                // Below MAX_GROUPS, checked in `groups`.
                group_index: group_index as u32,
                loc: self.loc(key, r.span()),
            });
        }
        Ok(routes)
    }
}

/// Buckets a `rebalance = "gradual"` group hands back per control-loop
/// step (the link check, every 100 ms): 10 buckets a second, so a member
/// of an 8-way group (32 of 256 buckets) is back in 3.2 s.
pub const GRADUAL_BUCKETS_PER_STEP: u32 = 1;

/// Default and allowed range of a flowlet group's gap and table size.
const DEFAULT_FLOWLET_GAP_US: i64 = 50;
const FLOWLET_GAP_US: std::ops::RangeInclusive<i64> = 1..=10_000_000;
const FLOWLET_TABLE_SIZE: std::ops::RangeInclusive<i64> = 1..=16_777_216;

/// The class used when a file defines none: RoCEv2 ACK and CNP, exempt
/// from ECN marking (they are the congestion signal's return path).
fn default_control_class() -> Class {
    Class {
        name: "control".into(),
        opcodes: vec![rocev2_common::bth::opcode::ACK, rocev2_common::bth::opcode::CNP],
        max_payload: None,
        qps: None,
        dscp: Vec::new(),
        set_dscp: None,
        priority: None,
        ecn_exempt: true,
        ecn_profile: None,
        loc: Location { key: "class (built-in default)".into(), line: 0, column: 0 },
    }
}

impl Config {
    /// Size of the flowlet LRU table: the sum of the flowlet groups' shares
    /// (at least one entry, so the map can be created).
    pub fn flowlet_table_size(&self) -> u32 {
        let total: u64 = self
            .groups
            .iter()
            .map(|g| match g.policy {
                Policy::Flowlet(f) => u64::from(f.table_size),
                _ => 0,
            })
            .sum();
        total.clamp(1, u64::from(u32::MAX)) as u32
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

impl Source<'_> {
    fn policy(&self, key: &str, g: &RawGroup) -> Result<Policy, ConfigError> {
        let kind = match &g.policy {
            Some(v) => self.check(format!("{key}.policy"), v, |s| match s.as_str() {
                "hash" | "flowlet" | "pinned" => Ok(s.clone()),
                other => Err(format!(
                    "{other:?} is not a policy; use \"hash\" (member by hash only), \"flowlet\" (move a flow only after an idle gap) or \"pinned\" (per-destination/QP pins from [[pin]])"
                )),
            })?,
            None => "hash".to_string(),
        };
        let flowlet_keys = [
            ("flowlet_gap_us", g.flowlet_gap_us.as_ref().map(|v| v.span())),
            ("flowlet_choice", g.flowlet_choice.as_ref().map(|v| v.span())),
            ("flowlet_boundary", g.flowlet_boundary.as_ref().map(|v| v.span())),
            ("flowlet_table_size", g.flowlet_table_size.as_ref().map(|v| v.span())),
        ];
        if kind != "flowlet" {
            if let Some((name, Some(span))) = flowlet_keys.iter().find(|(_, s)| s.is_some()) {
                return Err(self.err(
                    format!("{key}.{name}"),
                    span.clone(),
                    format!("only applies to policy = \"flowlet\"; add that to the group or remove `{name}`"),
                ));
            }
        }
        Ok(match kind.as_str() {
            "flowlet" => {
                let gap_us = match &g.flowlet_gap_us {
                    Some(v) => self.check(format!("{key}.flowlet_gap_us"), v, |&n| {
                        if FLOWLET_GAP_US.contains(&n) {
                            Ok(n)
                        } else {
                            Err(format!("{n} is out of range; use {} to {} microseconds (FBOSS tests use 16, lossless fabrics tens to hundreds)", FLOWLET_GAP_US.start(), FLOWLET_GAP_US.end()))
                        }
                    })?,
                    None => DEFAULT_FLOWLET_GAP_US,
                };
                let choice = match &g.flowlet_choice {
                    Some(v) => self.check(format!("{key}.flowlet_choice"), v, |s| match s.as_str() {
                        "rehash" => Ok(rocev2_common::flowlet::FlowletChoice::Rehash),
                        "least-loaded" => Ok(rocev2_common::flowlet::FlowletChoice::LeastLoaded),
                        other => Err(format!("{other:?} is not a flowlet choice; use \"rehash\" (LetFlow: re-hash with the flowlet number) or \"least-loaded\" (the less loaded of two members by egress virtual queue)")),
                    })?,
                    None => rocev2_common::flowlet::FlowletChoice::Rehash,
                };
                let table_size = match &g.flowlet_table_size {
                    Some(v) => self.check(format!("{key}.flowlet_table_size"), v, |&n| {
                        if FLOWLET_TABLE_SIZE.contains(&n) {
                            Ok(n as u32)
                        } else {
                            Err(format!(
                                "{n} is out of range; use {} to {} flows",
                                FLOWLET_TABLE_SIZE.start(),
                                FLOWLET_TABLE_SIZE.end()
                            ))
                        }
                    })?,
                    None => rocev2_common::maps::DEFAULT_FLOWLET_TABLE_SIZE,
                };
                Policy::Flowlet(FlowletConfig {
                    gap: Duration::from_micros(gap_us as u64),
                    choice,
                    at_message_boundary: g.flowlet_boundary.as_ref().is_some_and(|b| *b.get_ref()),
                    table_size,
                })
            }
            "pinned" => Policy::Pinned,
            _ => Policy::Hash,
        })
    }

    fn pins(
        &self,
        raw: &[Spanned<RawPin>],
        groups: &[Group],
        routing: &Routing,
    ) -> Result<(Vec<Pin>, Vec<LearnedPin>), ConfigError> {
        let mut pins: Vec<Pin> = Vec::with_capacity(raw.len());
        let mut learned: Vec<LearnedPin> = Vec::new();
        for (i, p) in raw.iter().enumerate() {
            let key = format!("pin[{i}]");
            let r = p.get_ref();
            let prefix = self.check(format!("{key}.prefix"), &r.prefix, |s| parse_prefix(s))?;
            let qp = self.check(format!("{key}.qp"), &r.qp, |&n| {
                u32::try_from(n).ok().filter(|q| *q <= 0xFF_FFFF).ok_or_else(|| {
                    format!("{n} is not a destination QP; QPs are 24-bit numbers, 0 to 16777215 (0xFFFFFF)")
                })
            })?;
            if pins.len() + learned.len() >= rocev2_common::maps::MAX_PINS as usize {
                return Err(self.err(
                    key,
                    p.span(),
                    format!("too many pins; at most {}", rocev2_common::maps::MAX_PINS),
                ));
            }
            let taken =
                pins.iter().map(|q| (q.prefix, q.qp, &q.loc)).chain(learned.iter().map(|q| (q.prefix, q.qp, &q.loc)));
            if let Some((_, _, first)) = taken.clone().find(|(pp, qq, _)| *pp == prefix && *qq == qp) {
                return Err(self.err(
                    format!("{key}.prefix"),
                    r.prefix.span(),
                    format!("{prefix} qp {qp:#x} is already pinned by {} (line {}); remove one", first.key, first.line),
                ));
            }
            let Some(group_name) = &r.group else {
                // A pin for learned routes: the member is a device or a next-hop address.
                if routing.kernel_table.is_none() {
                    return Err(self.err(
                        format!("{key}.group"),
                        p.span(),
                        "a pin names the [[group]] it belongs to; only with [routing] source = \"kernel\" can it leave `group` out to pin a learned route's next hop",
                    ));
                }
                let member = self.check(format!("{key}.member"), &r.member, |m| match m.parse::<IpAddr>() {
                    Ok(ip) => Ok(PinMember::Via(ip)),
                    Err(_) => check_ifname(m).map(|()| PinMember::Dev(m.clone())).map_err(|e| {
                        format!("{e}; a learned route's pin names its next hop's device (e.g. \"swp51\") or address")
                    }),
                })?;
                learned.push(LearnedPin { prefix, qp, member, loc: self.loc(key, p.span()) });
                continue;
            };
            let group_index = self.check(format!("{key}.group"), group_name, |name| {
                let i = groups.iter().position(|g| g.name == *name).ok_or_else(|| no_such_group(name, groups))?;
                if groups[i].policy != Policy::Pinned {
                    return Err(format!("group {name:?} does not use pins; set policy = \"pinned\" in that [[group]]"));
                }
                Ok(i)
            })?;
            let group = &groups[group_index];
            let member_index = self.check(format!("{key}.member"), &r.member, |dev| {
                group.members.iter().position(|m| m.dev == *dev).ok_or_else(|| {
                    let devs: Vec<String> = group.members.iter().map(|m| format!("{:?}", m.dev)).collect();
                    format!("group {:?} has no member on {dev:?}; its members' devs: {}", group.name, devs.join(", "))
                })
            })?;
            pins.push(Pin { prefix, qp, group_index: group_index as u32, member_index, loc: self.loc(key, p.span()) });
        }
        Ok((pins, learned))
    }

    fn ecn_profiles(&self, raw: &[Spanned<RawEcnProfile>]) -> Result<Vec<EcnProfileConfig>, ConfigError> {
        let mut profiles: Vec<EcnProfileConfig> = Vec::with_capacity(raw.len());
        for (i, p) in raw.iter().enumerate() {
            let key = format!("ecn_profile[{i}]");
            if i >= rocev2_common::maps::MAX_ECN_PROFILES as usize {
                return Err(self.err(
                    key,
                    p.span(),
                    format!("too many ECN profiles; at most {}", rocev2_common::maps::MAX_ECN_PROFILES),
                ));
            }
            let r = p.get_ref();
            let name = r.name.get_ref().clone();
            if let Some(first) = profiles.iter().find(|q| q.name == name) {
                return Err(self.err(
                    format!("{key}.name"),
                    r.name.span(),
                    format!("a profile named {name:?} already exists ({}, line {})", first.loc.key, first.loc.line),
                ));
            }
            let kmin = self.check(format!("{key}.kmin"), &r.kmin, parse_bytes)?;
            let kmax = self.check(format!("{key}.kmax"), &r.kmax, parse_bytes)?;
            if kmax <= kmin {
                return Err(self.err(
                    format!("{key}.kmax"),
                    r.kmax.span(),
                    format!("kmax ({kmax} bytes) must be above kmin ({kmin} bytes): marking rises from kmin to kmax"),
                ));
            }
            let pmax = self.check(format!("{key}.pmax"), &r.pmax, parse_probability)?;
            profiles.push(EcnProfileConfig {
                name,
                kmin_bytes: kmin,
                kmax_bytes: kmax,
                pmax,
                drop_not_ect: r.drop_not_ect.as_ref().is_some_and(|b| *b.get_ref()),
                loc: self.loc(key, p.span()),
            });
        }
        Ok(profiles)
    }

    fn egress(&self, raw: &[Spanned<RawEgress>], profiles: &[EcnProfileConfig]) -> Result<Vec<Egress>, ConfigError> {
        let mut egress: Vec<Egress> = Vec::with_capacity(raw.len());
        for (i, e) in raw.iter().enumerate() {
            let key = format!("egress[{i}]");
            if i >= rocev2_common::maps::MAX_EGRESS_PORTS as usize {
                return Err(self.err(
                    key,
                    e.span(),
                    format!("too many [[egress]] ports; at most {}", rocev2_common::maps::MAX_EGRESS_PORTS),
                ));
            }
            let r = e.get_ref();
            self.check(format!("{key}.dev"), &r.dev, |s| check_ifname(s))?;
            if let Some(first) = egress.iter().find(|x| x.dev == *r.dev.get_ref()) {
                return Err(self.err(
                    format!("{key}.dev"),
                    r.dev.span(),
                    format!("{:?} is already configured by {} (line {})", first.dev, first.loc.key, first.loc.line),
                ));
            }
            let rate = self.check(format!("{key}.rate"), &r.rate, parse_rate)?;
            let ecn_profile = match &r.ecn_profile {
                Some(v) => Some(self.check(format!("{key}.ecn_profile"), v, |n| profile_index(n, profiles))?),
                None => None,
            };
            egress.push(Egress {
                dev: r.dev.get_ref().clone(),
                rate_bytes_per_sec: rate,
                ecn_profile,
                local: r.local.as_ref().is_some_and(|b| *b.get_ref()),
                loc: self.loc(key, e.span()),
            });
        }
        Ok(egress)
    }

    fn classes(&self, raw: &[Spanned<RawClass>], profiles: &[EcnProfileConfig]) -> Result<Vec<Class>, ConfigError> {
        let max = rocev2_common::class::MAX_CLASSES as usize;
        let mut classes: Vec<Class> = Vec::with_capacity(raw.len());
        for (i, c) in raw.iter().enumerate() {
            let key = format!("class[{i}]");
            if i >= max {
                return Err(self.err(key, c.span(), format!("too many classes; at most {max}")));
            }
            let r = c.get_ref();
            let name = r.name.get_ref().clone();
            if let Some(first) = classes.iter().find(|x| x.name == name) {
                return Err(self.err(
                    format!("{key}.name"),
                    r.name.span(),
                    format!("a class named {name:?} already exists ({}, line {})", first.loc.key, first.loc.line),
                ));
            }
            let opcodes = match &r.opcodes {
                Some(v) => self.check(format!("{key}.opcodes"), v, |list| {
                    list.iter().map(|&n| u8::try_from(n).map_err(|_| format!("{n} is not a BTH opcode; opcodes are 0 to 255, e.g. 0x11 (ACK), 0x81 (CNP), 0x0B (WRITE only with immediate)"))).collect::<Result<Vec<u8>, String>>()
                })?,
                None => Vec::new(),
            };
            let dscp = match &r.dscp {
                Some(v) => self.check(format!("{key}.dscp"), v, |list| {
                    list.iter()
                        .map(|&n| {
                            u8::try_from(n)
                                .ok()
                                .filter(|d| *d < 64)
                                .ok_or_else(|| format!("{n} is not a DSCP; DSCP values are 0 to 63"))
                        })
                        .collect::<Result<Vec<u8>, String>>()
                })?,
                None => Vec::new(),
            };
            let max_payload = match &r.max_payload {
                Some(v) => Some(self.check(format!("{key}.max_payload"), v, |&n| {
                    u32::try_from(n).map_err(|_| format!("{n} is not a byte count; use 0 to {}", u32::MAX))
                })?),
                None => None,
            };
            let qps = match &r.qps {
                Some(v) => Some(self.check(format!("{key}.qps"), v, parse_qp_range)?),
                None => None,
            };
            let set_dscp = match &r.set_dscp {
                Some(v) => Some(self.check(format!("{key}.set_dscp"), v, |&n| {
                    u8::try_from(n).ok().filter(|d| *d < 64).ok_or_else(|| {
                        format!("{n} is not a DSCP; DSCP values are 0 to 63 (CNP is usually 48, RoCE data 26)")
                    })
                })?),
                None => None,
            };
            let priority = match &r.priority {
                Some(v) => Some(self.check(format!("{key}.priority"), v, parse_priority)?),
                None => None,
            };
            let ecn_profile = match &r.ecn_profile {
                Some(v) => Some(self.check(format!("{key}.ecn_profile"), v, |n| profile_index(n, profiles))?),
                None => None,
            };
            let ecn_exempt = r.ecn_exempt.as_ref().is_some_and(|b| *b.get_ref());
            if ecn_exempt && ecn_profile.is_some() {
                return Err(self.err(key, c.span(), "has both ecn_exempt = true and an ecn_profile; an exempt class is never marked, so drop one of them"));
            }
            classes.push(Class {
                name,
                opcodes,
                max_payload,
                qps,
                dscp,
                set_dscp,
                priority,
                ecn_exempt,
                ecn_profile,
                loc: self.loc(key, c.span()),
            });
        }
        Ok(classes)
    }
}

fn profile_index(name: &str, profiles: &[EcnProfileConfig]) -> Result<usize, String> {
    profiles.iter().position(|p| p.name == name).ok_or_else(|| {
        if profiles.is_empty() {
            format!("no ECN profile named {name:?}: no [[ecn_profile]] is defined")
        } else {
            let names: Vec<String> = profiles.iter().map(|p| format!("{:?}", p.name)).collect();
            format!("no ECN profile named {name:?}; defined profiles: {}", names.join(", "))
        }
    })
}

/// A byte count: an integer, or a string with a unit (B, KB, MB, GB in
/// powers of 1000; KiB, MiB, GiB in powers of 1024), e.g. "150KB", "1MiB".
fn parse_bytes(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Ok(*n as u64),
        toml::Value::String(s) => {
            let t = s.trim();
            let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
            let (num, unit) = t.split_at(split);
            let num: f64 = num
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a size; write e.g. \"150KB\", \"1MiB\" or a number of bytes"))?;
            let scale: f64 = match unit.trim() {
                "" | "B" => 1.0,
                "KB" | "kB" => 1e3,
                "MB" => 1e6,
                "GB" => 1e9,
                "KiB" => 1024.0,
                "MiB" => 1024.0 * 1024.0,
                "GiB" => 1024.0 * 1024.0 * 1024.0,
                other => return Err(format!("{other:?} is not a size unit; use B, KB, MB, GB, KiB, MiB or GiB")),
            };
            if num < 0.0 || !num.is_finite() {
                return Err(format!("{s:?} is not a size"));
            }
            Ok((num * scale).round() as u64)
        }
        other => Err(format!("{other} is not a size; write a number of bytes or a string such as \"1MiB\"")),
    }
}

/// A port rate in bits per second with a unit ("10Gbit", "25G", "400Gbps",
/// "100Mbit"), or an integer in bytes per second. Returns bytes per second.
fn parse_rate(v: &toml::Value) -> Result<u64, String> {
    let max = rocev2_common::ecn::MAX_RATE_BYTES_PER_SEC;
    let bytes = match v {
        toml::Value::Integer(n) if *n > 0 => *n as u64,
        toml::Value::String(s) => {
            let t = s.trim();
            let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
            let (num, unit) = t.split_at(split);
            let num: f64 = num
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a rate; write e.g. \"10Gbit\", \"25G\" or \"100Mbit\""))?;
            let unit = unit.trim().trim_end_matches("ps").trim_end_matches("bit").trim_end_matches("/s");
            let bits_per: f64 = match unit {
                "" => 1.0,
                "K" | "k" => 1e3,
                "M" => 1e6,
                "G" => 1e9,
                "T" => 1e12,
                other => {
                    return Err(format!("{other:?} is not a rate unit; use Kbit, Mbit, Gbit or Tbit (bits per second)"))
                }
            };
            if num <= 0.0 || !num.is_finite() {
                return Err(format!("{s:?} must be a positive rate"));
            }
            (num * bits_per / 8.0).round() as u64
        }
        other => Err(format!("{other} is not a rate; write e.g. \"10Gbit\""))?,
    };
    if bytes == 0 || bytes > max {
        return Err(format!("rate must be between 1 byte/s and {} Gbit/s", max * 8 / 1_000_000_000));
    }
    Ok(bytes)
}

/// A probability: 0.0 to 1.0, or a percentage string such as "5%".
fn parse_probability(v: &toml::Value) -> Result<f64, String> {
    let p = match v {
        toml::Value::Float(f) => *f,
        toml::Value::Integer(n) => *n as f64,
        toml::Value::String(s) => match s.trim().strip_suffix('%') {
            Some(pct) => pct.trim().parse::<f64>().map_err(|_| format!("{s:?} is not a percentage"))? / 100.0,
            None => return Err(format!("{s:?} is not a probability; write 0.05 or \"5%\"")),
        },
        other => return Err(format!("{other} is not a probability; write 0.05 or \"5%\"")),
    };
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is out of range; a marking probability is 0 to 1 (or \"0%\" to \"100%\")"))
    }
}

/// An skb priority: a number, or a tc class id "MAJOR:MINOR" in hex as tc
/// writes it ("1:10" = 0x10010), which HTB uses to pick the class.
fn parse_priority(v: &toml::Value) -> Result<u32, String> {
    match v {
        toml::Value::Integer(n) => {
            u32::try_from(*n).map_err(|_| format!("{n} is not a priority; use 0 to {}", u32::MAX))
        }
        toml::Value::String(s) => {
            let (major, minor) = s
                .split_once(':')
                .ok_or_else(|| format!("{s:?} is not a tc class id; write \"1:10\" (hex, as tc does) or a number"))?;
            let major = u16::from_str_radix(major.trim(), 16)
                .map_err(|_| format!("{s:?}: {major:?} is not a hex major number"))?;
            let minor = u16::from_str_radix(minor.trim(), 16)
                .map_err(|_| format!("{s:?}: {minor:?} is not a hex minor number"))?;
            Ok((u32::from(major) << 16) | u32::from(minor))
        }
        other => Err(format!("{other} is not a priority; write a number or a tc class id such as \"1:10\"")),
    }
}

/// A DestQP range: "0x100-0x1ff", "256-511", a single QP, or [min, max].
fn parse_qp_range(v: &toml::Value) -> Result<(u32, u32), String> {
    fn qp(text: &str) -> Result<u32, String> {
        let t = text.trim();
        let n = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => t.parse(),
        }
        .map_err(|_| format!("{t:?} is not a QP number"))?;
        if n > 0xFF_FFFF {
            return Err(format!("{t} is above 0xFFFFFF; QPs are 24-bit"));
        }
        Ok(n)
    }
    let (lo, hi) = match v {
        toml::Value::String(s) => match s.split_once('-') {
            Some((a, b)) => (qp(a)?, qp(b)?),
            None => (qp(s)?, qp(s)?),
        },
        toml::Value::Integer(n) => {
            let q = qp(&n.to_string())?;
            (q, q)
        }
        toml::Value::Array(a) if a.len() == 2 => match (&a[0], &a[1]) {
            (toml::Value::Integer(x), toml::Value::Integer(y)) => (qp(&x.to_string())?, qp(&y.to_string())?),
            _ => return Err("write the range as [min, max] with two numbers".into()),
        },
        _ => return Err("write a QP range as \"0x100-0x1ff\" or [256, 511]".into()),
    };
    if lo > hi {
        return Err(format!("range starts at {lo:#x} after it ends at {hi:#x}"));
    }
    Ok((lo, hi))
}

fn no_such_group(name: &str, groups: &[Group]) -> String {
    if groups.is_empty() {
        return format!("no group named {name:?}: no [[group]] is defined; add one with that name");
    }
    let names: Vec<String> = groups.iter().map(|g| format!("{:?}", g.name)).collect();
    format!("no group named {name:?}; defined groups: {}", names.join(", "))
}

// ---------------------------------------------------------------------------
// Value parsers: each returns the message to show on failure
// ---------------------------------------------------------------------------

fn parse_hash(s: &str) -> Result<HashMode, String> {
    match s {
        "qp" => Ok(HashMode::Qp),
        "five-tuple" => Ok(HashMode::FiveTuple),
        _ => Err(format!(
            "{s:?} is not a hash mode; use \"qp\" (five-tuple plus RoCEv2 destination QP) or \"five-tuple\""
        )),
    }
}

fn parse_xdp_mode(s: &str) -> Result<XdpMode, String> {
    match s {
        "native" => Ok(XdpMode::Native),
        "skb" => Ok(XdpMode::Skb),
        _ => Err(format!("{s:?} is not an XDP mode; use \"native\" (in the driver) or \"skb\" (generic, slower)")),
    }
}

/// The kernel's own rules for interface names (`dev_valid_name`), so a typo
/// is caught by `rocev2 check` rather than at run time.
fn check_ifname(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("an interface name is needed, e.g. \"eth1\"".into());
    }
    if s.len() > MAX_IFNAME_LEN {
        return Err(format!("{s:?} is too long for an interface name (at most {MAX_IFNAME_LEN} bytes)"));
    }
    if s == "." || s == ".." || s.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!("{s:?} is not a valid interface name (no '/', ':' or spaces)"));
    }
    Ok(())
}

fn parse_via(s: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = s.parse().map_err(|_| {
        format!("{s:?} is not an IP address; write the next hop's IPv4 or IPv6 address, e.g. \"10.0.2.2\"")
    })?;
    let bad = match ip {
        IpAddr::V4(a) => a.is_unspecified() || a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
    };
    if bad {
        return Err(format!("{s:?} cannot be a next hop; use the unicast address of the neighbour router"));
    }
    Ok(ip)
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let malformed =
        || format!("{s:?} is not a MAC address; write six hex bytes separated by ':', e.g. \"02:00:00:00:00:04\"");
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(malformed)?;
        if part.is_empty() || part.len() > 2 || !part.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| malformed())?;
    }
    if parts.next().is_some() {
        return Err(malformed());
    }
    if mac == [0xff; 6] {
        return Err(format!("{s:?} is the broadcast address; use the neighbour's unicast MAC"));
    }
    if mac[0] & 1 != 0 {
        return Err(format!(
            "{s:?} is a multicast MAC (lowest bit of the first byte is set); use the neighbour's unicast MAC"
        ));
    }
    if mac == [0; 6] {
        return Err(format!("{s:?} is all zeros; use the neighbour's real MAC"));
    }
    Ok(mac)
}

/// "a.b.c.d/len", "x::/len", or a bare address meaning a host route.
fn parse_prefix(s: &str) -> Result<Prefix, String> {
    let (addr_text, len_text) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = addr_text.parse().map_err(|_| {
        format!("{s:?} is not an IP prefix; write an address and length, e.g. \"10.1.0.0/16\" or \"fd00:1::/48\"")
    })?;
    let (max, family) = match addr {
        IpAddr::V4(_) => (32u8, "IPv4"),
        IpAddr::V6(_) => (128u8, "IPv6"),
    };
    let len = match len_text {
        None => max,
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| format!("{s:?}: prefix length {l:?} is not valid for {family}; use 0 to {max}"))?,
    };
    let prefix = Prefix::masked(addr, len);
    if prefix.addr() != addr {
        return Err(format!("{s:?} has host bits set; did you mean \"{prefix}\"?"));
    }
    Ok(prefix)
}

// ---------------------------------------------------------------------------
// Turning toml / serde errors into our messages
// ---------------------------------------------------------------------------

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    // Spans are byte offsets; never slice in the middle of a character.
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

impl Source<'_> {
    /// A toml error (syntax, or serde's unknown key / missing key / wrong
    /// type) as our one-line message with the key path.
    fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
        let raw_message = e.message();
        let Some(span) = e.span() else {
            return ConfigError::File {
                path: self.path.to_path_buf(),
                key: String::new(),
                message: one_line(raw_message),
            };
        };
        // toml's errors carry a span but no key path. If the document is
        // valid TOML (the error came from our structs), find the key by
        // walking a spanned tree of it; otherwise (a syntax error, or one
        // of the few documents toml cannot give spans for, such as
        // `[a.b]` headers) guess the key from the text of the line.
        let key = match toml::from_str::<Spanned<Node>>(self.text) {
            Ok(tree) => key_at(&tree, &span, raw_message),
            Err(_) => guess_key(self.text, span.start).unwrap_or_default(),
        };
        let message = explain(raw_message, &key);
        self.err(key, span, message)
    }
}

/// A TOML document reduced to its shape and spans, for finding the key
/// path of a byte span.
enum Node {
    Table(Vec<(String, Spanned<Node>)>),
    Array(Vec<Spanned<Node>>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> serde::de::Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any TOML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Node::Table(entries))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

/// The key path of the innermost value containing `span`.
///
/// For an unknown key, `span` is the key itself and the path is that of
/// the innermost table on the way that holds the key. (Only looking for
/// the innermost value is not enough: the span of a `[[ports]]` key lies
/// inside the span of its own table.)
fn key_at(root: &Spanned<Node>, span: &Range<usize>, message: &str) -> String {
    let contains = |outer: Range<usize>| outer.start < outer.end && outer.start <= span.start && span.end <= outer.end;
    let unknown = unknown_key(message);
    let mut path = String::new();
    let mut holder_of_unknown = None;
    // The root's span is empty; it contains everything.
    let mut node = root.get_ref();
    loop {
        match node {
            Node::Table(entries) => {
                if unknown.is_some_and(|u| entries.iter().any(|(k, _)| k == u)) {
                    holder_of_unknown = Some(path.clone());
                }
                match entries.iter().find(|(_, v)| contains(v.span())) {
                    Some((k, v)) => {
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(k);
                        node = v.get_ref();
                    }
                    None => break,
                }
            }
            Node::Array(items) => match items.iter().position(|v| contains(v.span())) {
                Some(i) => {
                    path.push_str(&format!("[{i}]"));
                    node = items[i].get_ref();
                }
                None => break,
            },
            Node::Leaf => break,
        }
    }
    match unknown {
        Some(u) => {
            // A key in a sub-table header (`[dataplane.x]`) lies outside
            // every value span; fall back to any table holding the key.
            let table = holder_of_unknown.or_else(|| table_holding(root.get_ref(), u, String::new())).unwrap_or(path);
            if table.is_empty() {
                u.to_string()
            } else {
                format!("{table}.{u}")
            }
        }
        None => path,
    }
}

/// Path of the first table (depth first) that has an entry named `key`.
fn table_holding(node: &Node, key: &str, path: String) -> Option<String> {
    match node {
        Node::Table(entries) => {
            if entries.iter().any(|(k, _)| k == key) {
                return Some(path);
            }
            entries.iter().find_map(|(k, v)| {
                let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                table_holding(v.get_ref(), key, sub)
            })
        }
        Node::Array(items) => {
            items.iter().enumerate().find_map(|(i, v)| table_holding(v.get_ref(), key, format!("{path}[{i}]")))
        }
        Node::Leaf => None,
    }
}

/// Best effort for syntax errors: `section[n].key` from the `key = ...`
/// at the start of the error's line and the `[section]` / `[[section]]`
/// header above it. Only when the error is in a plain value: inside an
/// inline table or array the key of the line would be misleading.
fn guess_key(text: &str, offset: usize) -> Option<String> {
    let (line, column) = line_col(text, offset);
    let line_text = text.lines().nth(line - 1)?;
    // An error in a table header (e.g. `[dataplane.extra]`) is about that table.
    if let Some(header) = line_text.trim().strip_prefix('[') {
        let name = header.trim_start_matches('[').split(']').next()?.trim();
        return (!name.is_empty()).then(|| name.to_string());
    }
    let (key, value) = line_text.split_once('=')?;
    let before_error: String = value.chars().take(column.saturating_sub(key.chars().count() + 2)).collect();
    if before_error.contains(['{', '[']) {
        return None;
    }
    let mut section = String::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for l in text.lines().take(line - 1) {
        let l = l.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split_once("]]")).map(|(n, _)| n.trim()) {
            let n = counts.entry(name).or_insert(0);
            section = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(n, _)| n.trim()) {
            section = name.to_string();
        }
    }
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return None;
    }
    Some(if section.is_empty() { key.to_string() } else { format!("{section}.{key}") })
}

/// The name in serde's "unknown field `NAME`, expected ...".
fn unknown_key(message: &str) -> Option<&str> {
    message.strip_prefix("unknown field `")?.split_once('`').map(|(k, _)| k)
}

/// Rewords serde's messages for people editing TOML (keys, tables and
/// arrays rather than fields, maps and sequences) and adds a hint.
fn explain(message: &str, key: &str) -> String {
    if let Some(unknown) = unknown_key(message) {
        let valid: Vec<&str> = message.split('`').skip(3).step_by(2).collect();
        let mut out = format!("unknown key `{unknown}`");
        if let Some(close) = closest_match(unknown, valid.iter().copied()) {
            out.push_str(&format!(" (did you mean `{close}`?)"));
        }
        if valid.is_empty() {
            out.push_str("; no keys are allowed here");
        } else {
            let list: Vec<String> = valid.iter().map(|v| format!("`{v}`")).collect();
            out.push_str(&format!("; valid keys here: {}", list.join(", ")));
        }
        return out;
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let missing = rest.split_once('`').map_or(rest, |(k, _)| k);
        return format!("missing required key `{missing}`");
    }
    let mut out = one_line(message)
        .replace("invalid type: map", "invalid type: table")
        .replace("invalid type: sequence", "invalid type: array")
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected a table")
        .replace("expected i64", "expected an integer");
    // Hints fit wrong types and malformed values, not e.g. duplicate keys
    // or an unterminated string.
    let about_value = out.starts_with("invalid") || out.starts_with("number");
    let wrong_type = out.starts_with("invalid type");
    if let Some(hint) = value_hint(key, wrong_type).filter(|_| about_value) {
        out.push_str("; ");
        out.push_str(&hint);
    }
    out
}

/// What a key's value should look like, appended to type and syntax
/// errors. Keys whose value is any string only get a hint for a wrong type.
fn value_hint(key: &str, wrong_type: bool) -> Option<String> {
    // Top-level sections are most often written `[port]` instead of `[[port]]`.
    if matches!(key, "port" | "group" | "route") {
        return Some(format!("write each {key} as its own [[{key}]] section (double brackets)"));
    }
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    let hint = match leaf {
        "hash" => "use \"qp\" or \"five-tuple\"",
        "xdp_mode" => "use \"native\" or \"skb\"",
        "hash_seed" => "use a whole number from 0 to 4294967295",
        "neighbour_refresh_ms" => "use a whole number of milliseconds from 100 to 60000",
        "members" => "write an array of tables, e.g. members = [{ dev = \"eth2\", via = \"10.0.2.2\" }]",
        "name" | "dev" | "via" | "mac" | "prefix" | "group" | "pin_dir" if wrong_type => {
            "write the value in double quotes"
        }
        _ => return None,
    };
    Some(hint.to_string())
}

fn one_line(message: &str) -> String {
    message.trim().lines().map(str::trim).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example from the documentation, comments included.
    const EXAMPLE: &str = r#"[dataplane]
hash = "qp"            # or "five-tuple"; default "qp"
hash_seed = 1234       # u32, default 0
xdp_mode = "native"    # or "skb"; default "native"
pin_dir = "/sys/fs/bpf/rocev2"   # optional
neighbour_refresh_ms = 1000      # optional

[[port]]
name = "eth1"          # every interface that receives traffic to forward

[[group]]
name = "spines"
hash = "five-tuple"    # optional per-group override of dataplane.hash
members = [
  { dev = "eth2", via = "10.0.2.2" },          # neighbour MAC from the kernel's table
  { dev = "eth3", via = "fd00:3::2" },
  { dev = "eth4", mac = "02:00:00:00:00:04" }, # static neighbour MAC
]

[[route]]
prefix = "10.1.0.0/16"     # IPv4 or IPv6 CIDR; a bare address means /32 or /128
group = "spines"
"#;

    /// A minimal valid file of 6 lines; tests append to it, so whatever
    /// they add starts on line 7.
    const BASE: &str = r#"[[port]]
name = "eth1"

[[group]]
name = "spines"
members = [{ dev = "eth2", via = "10.0.2.2" }]
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("lab.toml"))
    }

    fn parse_ok(text: &str) -> Config {
        match parse(text) {
            Ok(c) => c,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    /// Asserts the message starts with `lab.toml:LINE:`, names `key` and
    /// contains every needle; returns it for further checks.
    fn assert_error(text: &str, line: usize, key: &str, needles: &[&str]) -> String {
        let err = match parse(text) {
            Ok(_) => panic!("expected an error about {key} on line {line}"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("lab.toml:{line}:")), "expected file and line {line} in: {msg}");
        assert!(msg.contains(&format!(": {key}: ")), "expected key {key} in: {msg}");
        for needle in needles {
            assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
        }
        assert!(!msg.contains('\n'), "message must be one line: {msg}");
        assert_eq!(err.line(), Some(line));
        assert_eq!(err.key(), Some(key));
        msg
    }

    // --- valid files ---------------------------------------------------

    #[test]
    fn example_parses_with_all_values() {
        let c = parse_ok(EXAMPLE);
        assert_eq!(c.path, Path::new("lab.toml"));
        assert_eq!(c.dataplane.hash, HashMode::Qp);
        assert_eq!(c.dataplane.hash_seed, HashSeed::Fixed(1234));
        assert_eq!(c.dataplane.xdp_mode, XdpMode::Native);
        assert_eq!(c.dataplane.pin_dir, Path::new("/sys/fs/bpf/rocev2"));
        assert_eq!(c.dataplane.neighbour_refresh, Duration::from_millis(1000));

        assert_eq!(c.ports.len(), 1);
        assert_eq!(c.ports[0].name, "eth1");
        assert_eq!(c.ports[0].loc, Location { key: "port[0]".into(), line: 9, column: 8 });

        assert_eq!(c.groups.len(), 1);
        let g = &c.groups[0];
        assert_eq!(g.name, "spines");
        assert_eq!(g.hash, HashMode::FiveTuple, "per-group override wins");
        assert_eq!((g.loc.key.as_str(), g.loc.line, g.loc.column), ("group[0]", 11, 1));
        let hops: Vec<(&str, NextHop)> = g.members.iter().map(|m| (m.dev.as_str(), m.next_hop)).collect();
        assert_eq!(
            hops,
            vec![
                ("eth2", NextHop::Via("10.0.2.2".parse().unwrap())),
                ("eth3", NextHop::Via("fd00:3::2".parse().unwrap())),
                ("eth4", NextHop::Mac([2, 0, 0, 0, 0, 4])),
            ]
        );
        assert_eq!(g.members[1].loc, Location { key: "group[0].members[1]".into(), line: 16, column: 3 });

        assert_eq!(c.routes.len(), 1);
        let r = &c.routes[0];
        assert_eq!(r.prefix, Prefix::V4 { addr: Ipv4Addr::new(10, 1, 0, 0), len: 16 });
        assert_eq!(r.group, "spines");
        assert_eq!(r.group_index, 0);
        assert_eq!((r.loc.key.as_str(), r.loc.line), ("route[0]", 20));
    }

    #[test]
    fn missing_keys_take_defaults() {
        let c = parse_ok(BASE);
        assert_eq!(c.dataplane, Dataplane::default());
        assert_eq!(c.dataplane.hash, HashMode::Qp);
        assert_eq!(c.dataplane.hash_seed, HashSeed::Fixed(0));
        assert_eq!(c.dataplane.xdp_mode, XdpMode::Native);
        assert_eq!(c.dataplane.pin_dir, Path::new(PIN_DIR));
        assert_eq!(c.dataplane.neighbour_refresh, Duration::from_millis(1000));
        assert_eq!(c.groups[0].hash, HashMode::Qp);
        assert!(c.routes.is_empty());
    }

    #[test]
    fn group_inherits_dataplane_hash_and_other_values_parse() {
        let text = format!(
            "[dataplane]\nhash = \"five-tuple\"\nxdp_mode = \"skb\"\nhash_seed = 4294967295\n\
             neighbour_refresh_ms = 100\npin_dir = \"/sys/fs/bpf/other\"\n{BASE}"
        );
        let c = parse_ok(&text);
        assert_eq!(c.dataplane.hash, HashMode::FiveTuple);
        assert_eq!(c.dataplane.xdp_mode, XdpMode::Skb);
        assert_eq!(c.dataplane.hash_seed, HashSeed::Fixed(u32::MAX));
        assert_eq!(c.dataplane.neighbour_refresh, Duration::from_millis(100));
        assert_eq!(c.dataplane.pin_dir, Path::new("/sys/fs/bpf/other"));
        assert_eq!(c.groups[0].hash, HashMode::FiveTuple);
    }

    #[test]
    fn routes_parse_v4_v6_and_bare_addresses() {
        let text = format!(
            "{BASE}[[group]]\nname = \"leaves\"\nmembers = [{{ dev = \"eth3\", mac = \"02:00:00:00:00:03\" }}]\n\
             [[route]]\nprefix = \"10.9.9.9\"\ngroup = \"leaves\"\n\
             [[route]]\nprefix = \"fd00:1::/48\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"fd00::1\"\ngroup = \"leaves\"\n\
             [[route]]\nprefix = \"0.0.0.0/0\"\ngroup = \"spines\"\n"
        );
        let c = parse_ok(&text);
        let got: Vec<(String, u32)> = c.routes.iter().map(|r| (r.prefix.to_string(), r.group_index)).collect();
        assert_eq!(
            got,
            vec![
                ("10.9.9.9/32".to_string(), 1),
                ("fd00:1::/48".to_string(), 0),
                ("fd00::1/128".to_string(), 1),
                ("0.0.0.0/0".to_string(), 0),
            ]
        );
        assert_eq!(c.routes[2].prefix, Prefix::host("fd00::1".parse().unwrap()));
        assert_eq!(c.routes[1].prefix.prefix_len(), 48);
    }

    #[test]
    fn prefix_display() {
        let v4 = Prefix::V4 { addr: Ipv4Addr::new(192, 168, 0, 0), len: 24 };
        assert_eq!(v4.to_string(), "192.168.0.0/24");
        let v6 = Prefix::V6 { addr: "2001:db8::".parse().unwrap(), len: 32 };
        assert_eq!(v6.to_string(), "2001:db8::/32");
    }

    // --- file and syntax errors ----------------------------------------

    #[test]
    fn unreadable_file_names_the_file() {
        let path = Path::new("/nonexistent/rocev2-test/lab.toml");
        let msg = match Config::load(path) {
            Ok(_) => panic!("loading a missing file succeeded"),
            Err(e) => e.to_string(),
        };
        assert!(msg.starts_with("/nonexistent/rocev2-test/lab.toml: cannot read: "), "{msg}");
        assert!(msg.contains("No such file"), "{msg}");
    }

    #[test]
    fn load_reads_the_file() {
        let path = std::env::temp_dir().join(format!("rocev2-config-test-{}.toml", std::process::id()));
        std::fs::write(&path, EXAMPLE).unwrap();
        let result = Config::load(&path);
        std::fs::remove_file(&path).unwrap();
        let c = result.unwrap();
        assert_eq!(c.path, path);
        assert_eq!(c.groups[0].members.len(), 3);
    }

    #[test]
    fn syntax_error_keeps_line_and_column() {
        // Unterminated string on line 8; toml points after its end.
        let text = format!("{BASE}[[port]]\nname = \"eth9\n");
        let msg = assert_error(&text, 8, "port[1].name", &["string"]);
        assert!(msg.starts_with("lab.toml:8:13: "), "{msg}");
        assert!(!msg.contains("double quotes"), "misleading hint: {msg}");
    }

    #[test]
    fn syntax_error_without_key_still_has_line() {
        let text = format!("{BASE}[[route]\n");
        let err = parse(&text).unwrap_err();
        assert_eq!(err.line(), Some(7));
        assert!(err.to_string().starts_with("lab.toml:7:"), "{err}");
    }

    #[test]
    fn unquoted_string_hints_at_quotes() {
        let text = format!("[dataplane]\nhash = qp\n{BASE}");
        assert_error(&text, 2, "dataplane.hash", &["\"qp\" or \"five-tuple\""]);
    }

    #[test]
    fn duplicate_key_is_reported() {
        let text = format!("{BASE}[[port]]\nname = \"eth7\"\nname = \"eth8\"\n");
        assert_error(&text, 9, "port[1].name", &["duplicate key"]);
    }

    // --- unknown and missing keys --------------------------------------

    #[test]
    fn unknown_dataplane_key_lists_valid_keys() {
        let text = format!("[dataplane]\nhash = \"qp\"\nhashseed = 7\n{BASE}");
        let msg = assert_error(
            &text,
            3,
            "dataplane.hashseed",
            &[
                "unknown key `hashseed` (did you mean `hash_seed`?); valid keys here:",
                "`xdp_mode`",
                "`neighbour_refresh_ms`",
            ],
        );
        assert!(msg.starts_with("lab.toml:3:1: "), "{msg}");
    }

    #[test]
    fn unknown_member_key_inside_inline_table() {
        let text = "[[port]]\nname = \"eth1\"\n[[group]]\nname = \"g\"\nmembers = [\n  { dev = \"eth2\", via = \"10.0.2.2\" },\n  { dev = \"eth3\", vias = \"10.0.3.2\" },\n]\n";
        assert_error(text, 7, "group[0].members[1].vias", &["unknown key `vias`", "did you mean `via`?", "`mac`"]);
    }

    #[test]
    fn unknown_section_suggests_the_right_one() {
        let text = format!("{BASE}\n[[ports]]\nname = \"eth2\"\n");
        assert_error(&text, 8, "ports", &["did you mean `port`?", "`route`"]);
    }

    #[test]
    fn single_bracket_section_explains_double_brackets() {
        let text = "[port]\nname = \"eth1\"\n";
        assert_error(text, 1, "port", &["expected an array", "[[port]]"]);
    }

    #[test]
    fn unknown_key_named_like_a_section() {
        // `group` is a top-level key too; the error is about group[1]'s own.
        let text = format!("{BASE}[[group]]\nname = \"g2\"\ngroup = \"spines\"\n");
        assert_error(&text, 9, "group[1].group", &["unknown key `group`", "`members`"]);
        let text = format!("[dataplane]\nport = 1\n{BASE}");
        assert_error(&text, 2, "dataplane.port", &["unknown key `port`"]);
    }

    #[test]
    fn unknown_key_in_sub_table_header() {
        let text = format!("{BASE}[dataplane.extra]\na = 1\n");
        assert_error(&text, 7, "dataplane.extra", &["unknown key `extra`", "`hash_seed`"]);
    }

    #[test]
    fn syntax_error_inside_inline_table_does_not_blame_the_line_key() {
        let text = format!("{BASE}[[group]]\nname = \"g\"\nmembers = [{{ dev = \"eth3\", via = 10.0.3.2 }}]\n");
        let err = parse(&text).unwrap_err();
        assert_eq!(err.line(), Some(9));
        assert_eq!(err.key(), Some(""));
        assert!(!err.to_string().contains("members"), "{err}");
    }

    #[test]
    fn missing_required_key() {
        let text = format!("{BASE}\n[[group]]\nname = \"leaves\"\n");
        assert_error(&text, 8, "group[1]", &["missing required key `members`"]);
    }

    #[test]
    fn wrong_type_names_key_and_expected_type() {
        let text = format!("{BASE}[[route]]\nprefix = 10\ngroup = \"spines\"\n");
        assert_error(&text, 8, "route[0].prefix", &["expected a string", "double quotes"]);
    }

    // --- [dataplane] values --------------------------------------------

    #[test]
    fn bad_hash_lists_allowed_values() {
        let text = format!("[dataplane]\nhash = \"crc\"\n{BASE}");
        let msg = assert_error(&text, 2, "dataplane.hash", &["\"crc\"", "\"qp\"", "\"five-tuple\""]);
        assert!(msg.starts_with("lab.toml:2:8: "), "{msg}");
    }

    #[test]
    fn hash_of_wrong_type() {
        let text = format!("[dataplane]\nhash = 5\n{BASE}");
        assert_error(&text, 2, "dataplane.hash", &["expected a string", "\"qp\" or \"five-tuple\""]);
    }

    #[test]
    fn bad_group_hash() {
        let text = format!("{BASE}[[group]]\nname = \"leaves\"\nhash = \"5tuple\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n");
        assert_error(&text, 9, "group[1].hash", &["\"5tuple\"", "\"five-tuple\""]);
    }

    #[test]
    fn bad_xdp_mode() {
        let text = format!("[dataplane]\n\nxdp_mode = \"driver\"\n{BASE}");
        assert_error(&text, 3, "dataplane.xdp_mode", &["\"driver\"", "\"native\"", "\"skb\""]);
    }

    #[test]
    fn negative_hash_seed() {
        let text = format!("[dataplane]\nhash_seed = -1\n{BASE}");
        assert_error(&text, 2, "dataplane.hash_seed", &["-1 is negative", "0 to 4294967295"]);
    }

    #[test]
    fn hash_seed_too_big_for_u32() {
        let text = format!("[dataplane]\nhash_seed = 4294967296\n{BASE}");
        assert_error(&text, 2, "dataplane.hash_seed", &["4294967296 is too big", "0 to 4294967295"]);
    }

    #[test]
    fn hash_seed_too_big_for_toml() {
        // Beyond i64: toml itself rejects it, we still name the key.
        let text = format!("[dataplane]\nhash_seed = 99999999999999999999\n{BASE}");
        assert_error(&text, 2, "dataplane.hash_seed", &["too large", "0 to 4294967295"]);
    }

    #[test]
    fn hash_seed_of_wrong_type() {
        let text = format!("[dataplane]\nhash_seed = \"1234\"\n{BASE}");
        assert_error(&text, 2, "dataplane.hash_seed", &["is not a seed", "0 to 4294967295", "\"auto\""]);
    }

    #[test]
    fn neighbour_refresh_out_of_range() {
        let low = format!("[dataplane]\nneighbour_refresh_ms = 99\n{BASE}");
        assert_error(&low, 2, "dataplane.neighbour_refresh_ms", &["99 is out of range", "100 to 60000"]);
        let high = format!("[dataplane]\n\nneighbour_refresh_ms = 60001\n{BASE}");
        assert_error(&high, 3, "dataplane.neighbour_refresh_ms", &["60001", "100 to 60000"]);
    }

    #[test]
    fn relative_pin_dir() {
        let text = format!("[dataplane]\npin_dir = \"bpf/rocev2\"\n{BASE}");
        assert_error(&text, 2, "dataplane.pin_dir", &["not an absolute path", "/sys/fs/bpf/rocev2"]);
    }

    // --- ports ---------------------------------------------------------

    #[test]
    fn no_port_section() {
        let text = "[[group]]\nname = \"g\"\nmembers = [{ dev = \"eth2\", via = \"10.0.2.2\" }]\n";
        let err = parse(text).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("lab.toml: port: "), "{msg}");
        assert!(msg.contains("[[port]]"), "{msg}");
        assert_eq!(err.line(), None);
    }

    #[test]
    fn duplicate_port_names_the_first() {
        let text = format!("{BASE}[[port]]\nname = \"eth1\"\n");
        assert_error(&text, 8, "port[1].name", &["\"eth1\"", "port[0] (line 2)"]);
    }

    #[test]
    fn bad_interface_names() {
        let long = format!("{BASE}[[port]]\nname = \"a-very-long-ifname0\"\n");
        assert_error(&long, 8, "port[1].name", &["too long", "15"]);
        let empty = format!("{BASE}[[port]]\nname = \"\"\n");
        assert_error(&empty, 8, "port[1].name", &["interface name is needed"]);
        let slash =
            "[[port]]\nname = \"eth1\"\n[[group]]\nname = \"g\"\nmembers = [{ dev = \"eth/2\", via = \"10.0.2.2\" }]\n";
        assert_error(slash, 5, "group[0].members[0].dev", &["\"eth/2\"", "not a valid interface name"]);
    }

    #[test]
    fn too_many_ports() {
        let mut text = String::from(BASE);
        for i in 2..=MAX_PORTS {
            text.push_str(&format!("[[port]]\nname = \"eth{i}\"\n"));
        }
        // port[0] is in BASE; port[63] starts 2 * 62 lines after line 7.
        assert_error(&text, 7 + 2 * 62, "port[63]", &["too many ports", "63"]);
    }

    // --- groups and members --------------------------------------------

    #[test]
    fn member_with_both_via_and_mac() {
        let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [\n  {{ dev = \"eth3\", via = \"10.0.3.2\", mac = \"02:00:00:00:00:03\" }},\n]\n");
        assert_error(&text, 10, "group[1].members[0]", &["both `via` and `mac`", "exactly one"]);
    }

    #[test]
    fn member_with_neither_via_nor_mac() {
        let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [\n  {{ dev = \"eth3\" }},\n]\n");
        assert_error(&text, 10, "group[1].members[0]", &["needs `via`", "`mac`"]);
    }

    #[test]
    fn via_is_not_an_ip() {
        let text =
            format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [\n  {{ dev = \"eth3\", via = \"10.0.3\" }},\n]\n");
        let msg = assert_error(&text, 10, "group[1].members[0].via", &["\"10.0.3\" is not an IP address"]);
        // Column of the value, after `  { dev = "eth3", via = `.
        assert!(msg.starts_with("lab.toml:10:25: "), "{msg}");
        let mcast = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", via = \"ff02::1\" }}]\n");
        assert_error(&mcast, 9, "group[1].members[0].via", &["cannot be a next hop"]);
    }

    #[test]
    fn malformed_mac() {
        for bad in
            ["02:00:00:00:04", "02:00:00:00:00:04:05", "02-00-00-00-00-04", "02:00:00:00:00:0g", "002:00:00:00:00:04"]
        {
            let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"{bad}\" }}]\n");
            assert_error(
                &text,
                9,
                "group[1].members[0].mac",
                &[&format!("{bad:?} is not a MAC address"), "six hex bytes"],
            );
        }
    }

    #[test]
    fn multicast_and_broadcast_mac() {
        let mcast =
            format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"01:00:5e:00:00:01\" }}]\n");
        assert_error(&mcast, 9, "group[1].members[0].mac", &["multicast", "unicast"]);
        let bcast =
            format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"FF:FF:FF:FF:FF:FF\" }}]\n");
        assert_error(&bcast, 9, "group[1].members[0].mac", &["broadcast"]);
        let zero =
            format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"00:00:00:00:00:00\" }}]\n");
        assert_error(&zero, 9, "group[1].members[0].mac", &["all zeros"]);
    }

    #[test]
    fn duplicate_group_name_names_the_first() {
        let text =
            format!("{BASE}[[group]]\nname = \"spines\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n");
        assert_error(&text, 8, "group[1].name", &["\"spines\" already exists", "group[0], line 4", "unique"]);
    }

    #[test]
    fn empty_group_name() {
        let text = format!("{BASE}[[group]]\nname = \" \"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n");
        assert_error(&text, 8, "group[1].name", &["needs a name"]);
    }

    #[test]
    fn group_without_members() {
        let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = []\n");
        let msg = assert_error(&text, 9, "group[1].members", &["at least one member"]);
        assert!(msg.starts_with("lab.toml:9:11: "), "{msg}");
    }

    #[test]
    fn group_with_too_many_members() {
        let mut text = format!("{BASE}[[group]]\nname = \"big\"\nmembers = [\n");
        for i in 0..=MAX_MEMBERS_PER_GROUP {
            text.push_str(&format!("  {{ dev = \"eth2\", via = \"10.0.{}.{}\" }},\n", i / 200, i % 200 + 1));
        }
        text.push_str("]\n");
        // members[0] is on line 10, members[128] 128 lines later.
        assert_error(&text, 10 + 128, "group[1].members[128]", &["too many members", "128"]);
    }

    #[test]
    fn too_many_groups() {
        let mut text = String::from("[[port]]\nname = \"eth1\"\n");
        for i in 0..=MAX_GROUPS {
            text.push_str(&format!(
                "[[group]]\nname = \"g{i}\"\nmembers = [{{ dev = \"eth2\", via = \"10.0.2.2\" }}]\n"
            ));
        }
        // group[i] starts on line 3 + 3 * i.
        assert_error(&text, 3 + 3 * 256, "group[256]", &["too many groups", "256"]);
    }

    // --- routes --------------------------------------------------------

    #[test]
    fn host_bits_set_suggests_masked_prefix() {
        let text = format!(
            "{BASE}[[route]]\nprefix = \"10.2.0.0/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"10.3.0.0/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"10.1.0.1/16\"\ngroup = \"spines\"\n"
        );
        let err = parse(&text).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"lab.toml:14:10: route[2].prefix: "10.1.0.1/16" has host bits set; did you mean "10.1.0.0/16"?"#
        );
        let v6 = format!("{BASE}[[route]]\nprefix = \"fd00:1::1/64\"\ngroup = \"spines\"\n");
        assert_error(&v6, 8, "route[0].prefix", &["host bits", "did you mean \"fd00:1::/64\"?"]);
    }

    #[test]
    fn invalid_prefixes() {
        let cases = [
            ("10.1.0.0/33", "prefix length \"33\" is not valid for IPv4; use 0 to 32"),
            ("fd00::/129", "prefix length \"129\" is not valid for IPv6; use 0 to 128"),
            ("10.1.0.0/", "prefix length \"\""),
            ("10.1.0.0/-1", "prefix length \"-1\""),
            ("10.1.0/16", "is not an IP prefix"),
            ("spines", "is not an IP prefix"),
        ];
        for (prefix, needle) in cases {
            let text = format!("{BASE}\n[[route]]\nprefix = \"{prefix}\"\ngroup = \"spines\"\n");
            assert_error(&text, 9, "route[0].prefix", &[needle]);
        }
    }

    #[test]
    fn route_to_unknown_group_lists_groups() {
        let text = format!(
            "{BASE}[[group]]\nname = \"leaves\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n\
             [[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spine\"\n"
        );
        assert_error(&text, 12, "route[0].group", &["no group named \"spine\"", "\"spines\", \"leaves\""]);
    }

    #[test]
    fn route_without_any_group() {
        let text = "[[port]]\nname = \"eth1\"\n[[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spines\"\n";
        assert_error(text, 5, "route[0].group", &["no [[group]] is defined"]);
    }

    #[test]
    fn duplicate_route_names_the_first() {
        let text = format!(
            "{BASE}[[route]]\nprefix = \"fd00::/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"fd00:0::/16\"\ngroup = \"spines\"\n"
        );
        assert_error(&text, 14, "route[2].prefix", &["fd00::/16 is already routed by route[0] (line 7)"]);
    }

    // --- helpers -------------------------------------------------------

    #[test]
    fn error_at_formats_runtime_errors() {
        let c = parse_ok(EXAMPLE);
        let e = c.error_at(&c.ports[0].loc, "name", "no interface named eth1");
        assert_eq!(e.to_string(), "lab.toml:9:8: port[0].name: no interface named eth1");
        let e = c.error_at(&c.groups[0].members[2].loc, "", "neighbour unreachable");
        assert_eq!(e.to_string(), "lab.toml:17:3: group[0].members[2]: neighbour unreachable");
    }

    #[test]
    fn line_col_counts_characters() {
        let text = "a\n\u{e9}\u{e9}x\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 2), (2, 1));
        // 'x' is at byte 6 (two 2-byte characters before it) but column 3.
        assert_eq!(line_col(text, 6), (2, 3));
        // Past the end and inside a character stay in bounds.
        assert_eq!(line_col(text, 100), (3, 1));
        assert_eq!(line_col(text, 3), (2, 1));
    }

    #[test]
    fn a_key_without_its_unit_gets_did_you_mean() {
        let text = "[[port]]\nname = \"eth1\"\n\n[[group]]\nname = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap = 500\nmembers = [{ dev = \"eth2\", mac = \"02:00:00:00:00:02\" }]\n";
        assert_error(text, 7, "group[0].flowlet_gap", &["unknown key `flowlet_gap` (did you mean `flowlet_gap_us`?)"]);
    }

    // --- issue 3: policies, pins, ECN, egress, classes -----------------

    const QOS: &str = r#"[[port]]
name = "eth1"

[[group]]
name = "spines"
policy = "flowlet"
flowlet_gap_us = 16
flowlet_choice = "least-loaded"
flowlet_boundary = true
flowlet_table_size = 2048
members = [{ dev = "eth2", via = "10.0.2.2" }, { dev = "eth3", mac = "02:00:00:00:00:03" }]

[[group]]
name = "te"
policy = "pinned"
members = [{ dev = "eth2", via = "10.0.2.2" }, { dev = "eth3", mac = "02:00:00:00:00:03" }]

[[pin]]
prefix = "10.1.0.7"
qp = 0x123
group = "te"
member = "eth3"

[[ecn_profile]]
name = "lossless"
kmin = "1MiB"
kmax = "2MiB"
pmax = "5%"

[[egress]]
dev = "eth2"
rate = "25Gbit"
ecn_profile = "lossless"
local = true

[[class]]
name = "control"
opcodes = [0x11, 0x81]
set_dscp = 48
priority = "1:10"
ecn_exempt = true

[[class]]
name = "cts"
opcodes = [0x0B]
max_payload = 64
qps = "0x100-0x1ff"
dscp = [26]
ecn_profile = "lossless"
"#;

    #[test]
    fn qos_keys_parse_with_units() {
        let c = parse_ok(QOS);
        let Policy::Flowlet(f) = c.groups[0].policy else { panic!("flowlet policy") };
        assert_eq!(f.gap, Duration::from_micros(16));
        assert_eq!(f.choice, rocev2_common::flowlet::FlowletChoice::LeastLoaded);
        assert!(f.at_message_boundary);
        assert_eq!(c.flowlet_table_size(), 2048);
        assert_eq!(c.groups[1].policy, Policy::Pinned);
        assert_eq!((c.pins[0].qp, c.pins[0].group_index, c.pins[0].member_index), (0x123, 1, 1));
        assert_eq!(c.pins[0].prefix.to_string(), "10.1.0.7/32");
        let p = &c.ecn_profiles[0];
        assert_eq!((p.kmin_bytes, p.kmax_bytes), (1 << 20, 2 << 20));
        assert!((p.pmax - 0.05).abs() < 1e-9);
        assert_eq!(c.egress[0].rate_bytes_per_sec, 25_000_000_000 / 8);
        assert!(c.egress[0].local);
        let entries = c.class_entries();
        assert_eq!(entries[0].priority, 0x10010);
        assert_eq!(entries[0].set_dscp, 48);
        assert_eq!((entries[1].qp_min, entries[1].qp_max, entries[1].max_payload), (0x100, 0x1FF, 64));
    }

    #[test]
    fn no_classes_means_the_default_control_class() {
        let c = parse_ok(BASE);
        assert_eq!(c.classes.len(), 1);
        assert_eq!(c.classes[0].name, "control");
        assert_eq!(c.classes[0].opcodes, vec![0x11, 0x81]);
        assert!(c.classes[0].ecn_exempt);
        assert_eq!(c.flowlet_table_size(), 1);
        // An explicit empty list turns classes off.
        assert!(parse_ok(&format!("class = []\n{BASE}")).classes.is_empty());
    }

    #[test]
    fn bad_policy_names_the_choices() {
        let text = BASE.replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"random\"\n");
        assert_error(&text, 6, "group[0].policy", &["\"hash\"", "\"flowlet\"", "\"pinned\""]);
    }

    #[test]
    fn flowlet_keys_need_the_flowlet_policy() {
        let text = BASE.replace("name = \"spines\"\n", "name = \"spines\"\nflowlet_gap_us = 10\n");
        assert_error(&text, 6, "group[0].flowlet_gap_us", &["policy = \"flowlet\""]);
    }

    #[test]
    fn pin_into_a_hash_group_is_refused() {
        let text =
            format!("{BASE}\n[[pin]]\nprefix = \"10.1.0.0/16\"\nqp = 5\ngroup = \"spines\"\nmember = \"eth2\"\n");
        assert_error(&text, 11, "pin[0].group", &["policy = \"pinned\""]);
    }

    #[test]
    fn pin_qp_must_be_24_bits() {
        let text = QOS.replace("qp = 0x123", "qp = 0x1000000");
        assert_error(&text, 20, "pin[0].qp", &["24-bit"]);
    }

    #[test]
    fn ecn_profile_kmax_above_kmin_and_units() {
        let text = QOS.replace("kmax = \"2MiB\"", "kmax = \"1MiB\"");
        assert_error(&text, 27, "ecn_profile[0].kmax", &["must be above kmin"]);
        let text = QOS.replace("kmin = \"1MiB\"", "kmin = \"1 parsec\"");
        assert_error(&text, 26, "ecn_profile[0].kmin", &["not a size unit"]);
        let text = QOS.replace("pmax = \"5%\"", "pmax = 1.5");
        assert_error(&text, 28, "ecn_profile[0].pmax", &["0 to 1"]);
    }

    #[test]
    fn egress_rate_and_profile_are_checked() {
        let text = QOS.replace("rate = \"25Gbit\"", "rate = \"fast\"");
        assert_error(&text, 32, "egress[0].rate", &["not a rate"]);
        let text = QOS.replace("ecn_profile = \"lossless\"\nlocal", "ecn_profile = \"lossy\"\nlocal");
        assert_error(&text, 33, "egress[0].ecn_profile", &["no ECN profile named \"lossy\"", "\"lossless\""]);
    }

    #[test]
    fn class_values_are_checked() {
        let text = QOS.replace("set_dscp = 48", "set_dscp = 64");
        assert_error(&text, 39, "class[0].set_dscp", &["0 to 63"]);
        let text = QOS.replace("priority = \"1:10\"", "priority = \"high\"");
        assert_error(&text, 40, "class[0].priority", &["tc class id"]);
        let text = QOS.replace("qps = \"0x100-0x1ff\"", "qps = \"0x200-0x100\"");
        assert_error(&text, 47, "class[1].qps", &["after it ends"]);
    }

    // --- kernel routes, buckets and seeds -------------------------------

    #[test]
    fn kernel_routing_policies_and_learned_pins() {
        let text = "[dataplane]\nhash_seed = \"auto\"\n\n[routing]\nsource = \"kernel\"\ntable = 100\n\n[[port]]\nname = \"eth1\"\n\n\
                    [[route_policy]]\nprefix = \"10.0.0.0/8\"\npolicy = \"flowlet\"\nflowlet_gap_us = 100\nrebalance = \"gradual\"\n\n\
                    [[route_policy]]\nprefix = \"10.9.0.0/16\"\npolicy = \"pinned\"\nhash = \"five-tuple\"\n\n\
                    [[pin]]\nprefix = \"10.9.0.7/32\"\nqp = 42\nmember = \"swp52\"\n\n\
                    [[pin]]\nprefix = \"10.9.0.0/16\"\nqp = 43\nmember = \"10.100.33.2\"\n";
        let c = parse_ok(text);
        assert_eq!(c.dataplane.hash_seed, HashSeed::Auto);
        assert_eq!(c.routing.kernel_table, Some(KernelTable::Id(100)));
        assert_eq!(c.route_policies.len(), 2);
        assert!(matches!(c.route_policies[0].policy, Policy::Flowlet(f) if f.gap == Duration::from_micros(100)));
        assert_eq!(c.route_policies[0].rebalance, Rebalance::Gradual(GRADUAL_BUCKETS_PER_STEP));
        assert_eq!((c.route_policies[1].policy, c.route_policies[1].hash), (Policy::Pinned, HashMode::FiveTuple));
        assert_eq!(c.learned_pins[0].member, PinMember::Dev("swp52".into()));
        assert_eq!(c.learned_pins[1].member, PinMember::Via("10.100.33.2".parse().unwrap()));
        assert!(c.groups.is_empty() && c.routes.is_empty());
    }

    #[test]
    fn kernel_routing_mistakes_are_named() {
        assert_error(&format!("[routing]\ntable = \"main\"\n{BASE}"), 2, "routing.table", &["source = \"kernel\""]);
        assert_error(
            &format!("[routing]\nsource = \"bgp\"\n{BASE}"),
            2,
            "routing.source",
            &["\"kernel\"", "\"config\""],
        );
        assert_error(
            &format!("[routing]\nsource = \"kernel\"\ntable = 255\n{BASE}"),
            3,
            "routing.table",
            &["not 255: the local table"],
        );
        let no_group = format!("{BASE}\n[[pin]]\nprefix = \"10.9.0.7/32\"\nqp = 42\nmember = \"eth2\"\n");
        assert_error(&no_group, 8, "pin[0].group", &["source = \"kernel\""]);
        let dup = "[routing]\nsource = \"kernel\"\n[[port]]\nname = \"eth1\"\n[[route_policy]]\nprefix = \"10.0.0.0/8\"\n[[route_policy]]\nprefix = \"10.0.0.0/8\"\n";
        assert_error(dup, 8, "route_policy[1].prefix", &["already has a policy", "line 5"]);
    }

    #[test]
    fn member_weights_and_rebalance() {
        let text = "[[port]]\nname = \"eth1\"\n\n[[group]]\nname = \"spines\"\nrebalance = \"gradual\"\nmembers = [{ dev = \"eth2\", via = \"10.0.2.2\", weight = 3 }, { dev = \"eth3\", via = \"10.0.3.2\" }]\n";
        let c = parse_ok(text);
        assert_eq!(c.groups[0].members.iter().map(|m| m.weight).collect::<Vec<_>>(), vec![3, 1]);
        assert_eq!(c.groups[0].rebalance, Rebalance::Gradual(GRADUAL_BUCKETS_PER_STEP));
        let zero = text.replace("weight = 3", "weight = 0");
        assert_error(&zero, 7, "group[0].members[0].weight", &["1 to 65535"]);
        let bad = text.replace("\"gradual\"", "\"slow\"");
        assert_error(&bad, 6, "group[0].rebalance", &["\"immediate\"", "\"gradual\""]);
    }
}
