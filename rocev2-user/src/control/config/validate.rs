//! Checking every value of the raw file and building the public types.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rocev2_common::maps::{MAX_GROUPS, MAX_MEMBERS_PER_GROUP, MAX_PORTS, PIN_DIR};
use toml::Spanned;

use super::raw::*;
use super::values::*;
use super::*;

/// The text being parsed and its file name: everything needed to turn a
/// byte span into a message.
pub(super) struct Source<'a> {
    pub(super) text: &'a str,
    pub(super) path: &'a Path,
}

impl Source<'_> {
    pub(super) fn loc(&self, key: impl Into<String>, span: Range<usize>) -> Location {
        let (line, column) = line_col(self.text, span.start);
        Location { key: key.into(), line, column }
    }

    pub(super) fn err(&self, key: impl Into<String>, span: Range<usize>, message: impl Into<String>) -> ConfigError {
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
    pub(super) fn check<T, V>(
        &self,
        key: impl Into<String>,
        value: &Spanned<V>,
        check: impl FnOnce(&V) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        check(value.get_ref()).map_err(|m| self.err(key, value.span(), m))
    }

    pub(super) fn validate(&self, raw: RawFile) -> Result<Config, ConfigError> {
        let dataplane = self.dataplane(&raw.dataplane)?;
        let ports = self.ports(&raw.port, raw.bridge.is_some() || !raw.uplink_group.is_empty())?;
        let mut groups = self.groups(&raw.group, &dataplane)?;
        let bridge = self.bridge(raw.bridge.as_ref(), &raw.uplink_group, &dataplane, &mut groups)?;
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
        let route_policies = self.route_policies(raw.route_policy, &dataplane)?;
        let warnings = self.warnings(&raw.route, &groups, &routes);
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
            bridge,
            warnings,
        })
    }

    /// What is valid but probably not meant: a route prefix without a
    /// length, an IPv4-mapped IPv6 prefix, a group no route uses.
    fn warnings(&self, raw: &[Spanned<RawRoute>], groups: &[Group], routes: &[Route]) -> Vec<String> {
        let mut out = Vec::new();
        for (r, route) in raw.iter().zip(routes) {
            let written = r.get_ref().prefix.get_ref();
            let key = format!("{}.prefix", route.loc.key);
            let warn = |message: String| self.err(key.clone(), r.get_ref().prefix.span(), message).to_string();
            if !written.contains('/') {
                let example = if written.contains(':') { 48 } else { 16 };
                out.push(warn(format!(
                    "{written:?} has no length, so it routes that one address; write \"{route}\" if that is meant, or the subnet's length (e.g. \"{written}/{example}\")",
                    route = route.prefix
                )));
            }
            if let Prefix::V6 { addr, .. } = route.prefix {
                if let Some(v4) = addr.to_ipv4_mapped() {
                    out.push(warn(format!(
                        "{written:?} is an IPv4-mapped IPv6 prefix, which no packet carries (IPv4 packets are routed by IPv4 prefixes): write an IPv4 prefix, e.g. \"{v4}/{}\"",
                        match route.prefix {
                            Prefix::V6 { len, .. } => len.saturating_sub(96),
                            _ => 32,
                        }
                    )));
                }
            }
        }
        for (i, g) in groups.iter().enumerate() {
            if !g.is_uplink() && !routes.iter().any(|r| r.group_index as usize == i) {
                out.push(format!(
                    "{}:{}:{}: {}: no [[route]] uses group {:?}, so it carries no traffic; add a route or remove the group",
                    self.path.display(),
                    g.loc.line,
                    g.loc.column,
                    g.loc.key,
                    g.name
                ));
            }
        }
        out
    }

    pub(super) fn routing(&self, raw: &Spanned<RawRouting>) -> Result<Routing, ConfigError> {
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
            None => KernelTable::Id(crate::sys::netlink::RT_TABLE_MAIN),
            Some(v) => self.check("routing.table", v, |t| match t {
                toml::Value::String(s) if s == "main" => Ok(KernelTable::Id(crate::sys::netlink::RT_TABLE_MAIN)),
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

    pub(super) fn route_policies(
        &self,
        raw: Vec<Spanned<RawRoutePolicy>>,
        dataplane: &Dataplane,
    ) -> Result<Vec<RoutePolicy>, ConfigError> {
        let default_hash = dataplane.hash;
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
                flowlet_table: r.flowlet_table,
                rebalance: None,
                transport_aware: None,
                members: Spanned::new(span.clone(), Vec::new()),
            };
            let policy = self.policy(&key, &as_group)?;
            let transport_aware = match &r.transport_aware {
                Some(raw) => Some(self.transport_aware(&key, raw, &policy, dataplane.telemetry_qps)?),
                None => None,
            };
            out.push(RoutePolicy { prefix, hash, policy, rebalance, transport_aware, loc: self.loc(key, span) });
        }
        Ok(out)
    }

    pub(super) fn rebalance(&self, key: &str, raw: Option<&Spanned<String>>) -> Result<Rebalance, ConfigError> {
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

    pub(super) fn dataplane(&self, raw: &RawDataplane) -> Result<Dataplane, ConfigError> {
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
        if let Some(v) = &raw.hash_version {
            dp.hash_version = self.check("dataplane.hash_version", v, |&n| {
                HashVersion::parse_number(n).map_err(|e| format!("{n} is not a hash version; {e}"))
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
        if let Some(v) = &raw.cpu_spread {
            dp.cpu_spread = self.check("dataplane.cpu_spread", v, |s| match s.as_str() {
                "off" => Ok(CpuSpread::Off),
                "qp" => Ok(CpuSpread::Qp),
                other => Err(format!(
                    "{other:?} is not a spreading mode; use \"off\" (each packet stays on the CPU that received it) or \"qp\" (spread RoCE flows over every CPU by DestQP)"
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
        if let Some(v) = &raw.telemetry_qps {
            dp.telemetry_qps = self.check("dataplane.telemetry_qps", v, |&n| {
                if TELEMETRY_QPS.contains(&n) {
                    Ok(n as u32)
                } else {
                    Err(format!("{n} is out of range; use 0 (telemetry off) to {} QPs", TELEMETRY_QPS.end()))
                }
            })?;
        }
        Ok(dp)
    }

    pub(super) fn ports(&self, raw: &[Spanned<RawPort>], bridge: bool) -> Result<Vec<Port>, ConfigError> {
        if raw.is_empty() && !bridge {
            return Err(ConfigError::File {
                path: self.path.to_path_buf(),
                key: "port".into(),
                message: "no [[port]] section; add one per interface that receives traffic to \
                          forward, e.g. [[port]] with name = \"eth1\" (or a [bridge] for host bridge mode)"
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

    pub(super) fn groups(&self, raw: &[Spanned<RawGroup>], dataplane: &Dataplane) -> Result<Vec<Group>, ConfigError> {
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
                None => dataplane.hash,
            };
            let policy = self.policy(&key, g_ref)?;
            let rebalance = self.rebalance(&key, g_ref.rebalance.as_ref())?;
            let transport_aware = match &g_ref.transport_aware {
                Some(raw) => Some(self.transport_aware(&key, raw, &policy, dataplane.telemetry_qps)?),
                None => None,
            };
            let members = self.members(&key, &g_ref.members)?;
            groups.push(Group {
                name,
                hash,
                policy,
                rebalance,
                transport_aware,
                members,
                loc: self.loc(key, g.span()),
            });
        }
        Ok(groups)
    }

    pub(super) fn members(
        &self,
        group_key: &str,
        raw: &Spanned<Vec<Spanned<RawMember>>>,
    ) -> Result<Vec<Member>, ConfigError> {
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

    pub(super) fn routes(&self, raw: &[Spanned<RawRoute>], groups: &[Group]) -> Result<Vec<Route>, ConfigError> {
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
                let i = groups.iter().position(|g| g.name == *name).ok_or_else(|| no_such_group(name, groups))?;
                if groups[i].is_uplink() {
                    return Err(format!(
                        "{name:?} is an [[uplink_group]] of bridge ports, which forwards by MAC; a route needs a [[group]] of next hops"
                    ));
                }
                Ok(i)
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

/// Default and allowed range of a flowlet group's gap and table size.
pub(super) const DEFAULT_FLOWLET_GAP_US: i64 = 50;
pub(super) const FLOWLET_GAP_US: std::ops::RangeInclusive<i64> = 1..=10_000_000;
use rocev2_common::{
    flowlet::FlowletTable,
    maps::{DEFAULT_FLOWLET_SLOTS, MAX_FLOWLET_SLOTS},
};

pub(super) const FLOWLET_TABLE_SIZE: std::ops::RangeInclusive<i64> = 1..=16_777_216;

/// The class used when a file defines none: RoCEv2 ACK and CNP, exempt
/// from ECN marking (they are the congestion signal's return path).
pub(super) fn default_control_class() -> Class {
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

impl Source<'_> {
    pub(super) fn policy(&self, key: &str, g: &RawGroup) -> Result<Policy, ConfigError> {
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
            ("flowlet_table", g.flowlet_table.as_ref().map(|v| v.span())),
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
                    Some(v) => self.check(format!("{key}.flowlet_choice"), v, |s| {
                        s.parse().map_err(|e| format!("{s:?} is not a flowlet choice; {e}"))
                    })?,
                    None => rocev2_common::flowlet::FlowletChoice::Rehash,
                };
                let table = match &g.flowlet_table {
                    Some(v) => self.check(format!("{key}.flowlet_table"), v, |s| {
                        s.parse().map_err(|e| format!("{s:?} is not a flowlet table; {e}"))
                    })?,
                    None => FlowletTable::Keyed,
                };
                let table_size = match &g.flowlet_table_size {
                    Some(v) if table == FlowletTable::Keyless => {
                        self.check(format!("{key}.flowlet_table_size"), v, |&n| {
                            if (1..=i64::from(MAX_FLOWLET_SLOTS)).contains(&n) {
                                // A power of two, so the slot is a hash masked.
                                Ok((n as u32).next_power_of_two())
                            } else {
                                Err(format!("{n} is out of range; a keyless table has 1 to {MAX_FLOWLET_SLOTS} slots (rounded up to a power of two)"))
                            }
                        })?
                    }
                    None if table == FlowletTable::Keyless => DEFAULT_FLOWLET_SLOTS,
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
                    table,
                })
            }
            "pinned" => Policy::Pinned,
            _ => Policy::Hash,
        })
    }

    pub(super) fn pins(
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

    pub(super) fn ecn_profiles(&self, raw: &[Spanned<RawEcnProfile>]) -> Result<Vec<EcnProfileConfig>, ConfigError> {
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

    pub(super) fn egress(
        &self,
        raw: &[Spanned<RawEgress>],
        profiles: &[EcnProfileConfig],
    ) -> Result<Vec<Egress>, ConfigError> {
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

    pub(super) fn classes(
        &self,
        raw: &[Spanned<RawClass>],
        profiles: &[EcnProfileConfig],
    ) -> Result<Vec<Class>, ConfigError> {
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

pub(super) fn profile_index(name: &str, profiles: &[EcnProfileConfig]) -> Result<usize, String> {
    profiles.iter().position(|p| p.name == name).ok_or_else(|| {
        if profiles.is_empty() {
            format!("no ECN profile named {name:?}: no [[ecn_profile]] is defined")
        } else {
            let names: Vec<String> = profiles.iter().map(|p| format!("{:?}", p.name)).collect();
            format!("no ECN profile named {name:?}; defined profiles: {}", names.join(", "))
        }
    })
}

pub(super) fn no_such_group(name: &str, groups: &[Group]) -> String {
    if groups.is_empty() {
        return format!("no group named {name:?}: no [[group]] is defined; add one with that name");
    }
    let names: Vec<String> = groups.iter().map(|g| format!("{:?}", g.name)).collect();
    format!("no group named {name:?}; defined groups: {}", names.join(", "))
}
