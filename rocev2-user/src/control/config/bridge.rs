//! `[bridge]` and `[[uplink_group]]`: host bridge mode.

use rocev2_common::maps::{MAX_GROUPS, MAX_MEMBERS_PER_GROUP};
use toml::Spanned;

use super::raw::{RawBridge, RawGroup, RawUplinkGroup};
use super::validate::Source;
use super::values::{check_ifname, parse_hash, parse_mac};
use super::*;

impl Source<'_> {
    /// The `[bridge]` table and its `[[uplink_group]]`s, which become groups
    /// (appended to `groups`) whose members are bridge ports.
    pub(super) fn bridge(
        &self,
        raw: Option<&Spanned<RawBridge>>,
        uplinks: &[Spanned<RawUplinkGroup>],
        dataplane: &Dataplane,
        groups: &mut Vec<Group>,
    ) -> Result<Option<Bridge>, ConfigError> {
        let Some(raw) = raw else {
            if let Some(first) = uplinks.first() {
                return Err(self.err(
                    "uplink_group[0]",
                    first.span(),
                    "an uplink group is made of bridge ports: add a [bridge] section naming the bridge, e.g. [bridge] with name = \"br0\"",
                ));
            }
            return Ok(None);
        };
        let name = &raw.get_ref().name;
        self.check("bridge.name", name, |s| check_ifname(s))?;
        if dataplane.attach == Attach::Tc {
            return Err(self.err(
                "bridge",
                raw.span(),
                "host bridge mode runs in XDP; remove dataplane.attach = \"tc\" (or the [bridge] section)",
            ));
        }
        if dataplane.cpu_spread == CpuSpread::Qp {
            return Err(self.err(
                "bridge",
                raw.span(),
                "dataplane.cpu_spread = \"qp\" serves routed [[port]]s only; bridge ports forward where they receive: set cpu_spread = \"off\"",
            ));
        }
        let mut out = Vec::with_capacity(uplinks.len());
        for (i, u) in uplinks.iter().enumerate() {
            let key = format!("uplink_group[{i}]");
            if groups.len() >= MAX_GROUPS as usize {
                return Err(self.err(key, u.span(), format!("too many groups; the dataplane supports at most {MAX_GROUPS}, [[group]]s and [[uplink_group]]s together")));
            }
            let r = u.get_ref();
            let name_key = format!("{key}.name");
            let name = self.check(&name_key, &r.name, |s| {
                if s.trim().is_empty() {
                    Err("an uplink group needs a name, e.g. name = \"gateways\"; stats and pins refer to it".into())
                } else {
                    Ok(s.clone())
                }
            })?;
            if let Some(first) = groups.iter().find(|g| g.name == name) {
                return Err(self.err(
                    name_key,
                    r.name.span(),
                    format!(
                        "a group named {name:?} already exists ({}, line {}); group names must be unique",
                        first.loc.key, first.loc.line
                    ),
                ));
            }
            let members = self.uplink_ports(&key, &r.ports, groups)?;
            let macs = self.uplink_macs(&key, &r.macs, &out, groups)?;
            let hash = match &r.hash {
                Some(v) => self.check(format!("{key}.hash"), v, |s| parse_hash(s))?,
                None => dataplane.hash,
            };
            // The same policy keys as a [[group]]'s, checked by the same code.
            let span = u.span();
            let as_group = RawGroup {
                name: Spanned::new(span.clone(), String::new()),
                hash: None,
                policy: r.policy.clone(),
                flowlet_gap_us: r.flowlet_gap_us.clone(),
                flowlet_choice: r.flowlet_choice.clone(),
                flowlet_boundary: r.flowlet_boundary.clone(),
                flowlet_table_size: r.flowlet_table_size.clone(),
                flowlet_table: r.flowlet_table.clone(),
                rebalance: None,
                transport_aware: None,
                members: Spanned::new(span.clone(), Vec::new()),
            };
            let policy = self.policy(&key, &as_group)?;
            let rebalance = self.rebalance(&key, r.rebalance.as_ref())?;
            let transport_aware = match &r.transport_aware {
                Some(raw) => Some(self.transport_aware(&key, raw, &policy, dataplane.telemetry_qps)?),
                None => None,
            };
            out.push(Uplink { group_index: groups.len(), macs, loc: self.loc(&key, span.clone()) });
            groups.push(Group { name, hash, policy, rebalance, transport_aware, members, loc: self.loc(key, span) });
        }
        Ok(Some(Bridge { name: name.get_ref().clone(), loc: self.loc("bridge.name", name.span()), uplinks: out }))
    }

    /// An uplink group's ports as group members: at least two, each in one
    /// uplink group only.
    fn uplink_ports(
        &self,
        key: &str,
        raw: &Spanned<Vec<Spanned<String>>>,
        groups: &[Group],
    ) -> Result<Vec<Member>, ConfigError> {
        let ports_key = format!("{key}.ports");
        let list = raw.get_ref();
        if list.len() < 2 {
            return Err(self.err(
                ports_key,
                raw.span(),
                "an uplink group needs at least two bridge ports: with one, the bridge's FDB already decides (list the ports that all reach the same MACs, e.g. ports = [\"u1\", \"u2\"])",
            ));
        }
        if list.len() > MAX_MEMBERS_PER_GROUP as usize {
            return Err(self.err(
                ports_key,
                raw.span(),
                format!("too many ports; a group has at most {MAX_MEMBERS_PER_GROUP}"),
            ));
        }
        let mut members: Vec<Member> = Vec::with_capacity(list.len());
        for (j, port) in list.iter().enumerate() {
            let port_key = format!("{ports_key}[{j}]");
            self.check(&port_key, port, |s| check_ifname(s))?;
            let dev = port.get_ref().clone();
            if members.iter().any(|m| m.dev == dev) {
                return Err(self.err(port_key, port.span(), format!("{dev:?} is listed twice; list each port once")));
            }
            if let Some(other) =
                groups.iter().filter(|g| g.is_uplink()).find(|g| g.members.iter().any(|m| m.dev == dev))
            {
                return Err(self.err(
                    port_key,
                    port.span(),
                    format!("{dev:?} is already a port of uplink group {:?} ({}, line {}); a port belongs to one uplink group", other.name, other.loc.key, other.loc.line),
                ));
            }
            members.push(Member {
                dev,
                next_hop: NextHop::BridgePort,
                weight: 1,
                loc: self.loc(port_key, port.span()),
            });
        }
        Ok(members)
    }

    /// `macs`: a list of unicast MACs (each in one uplink group), or "learned".
    fn uplink_macs(
        &self,
        key: &str,
        raw: &Spanned<toml::Value>,
        earlier: &[Uplink],
        groups: &[Group],
    ) -> Result<UplinkMacs, ConfigError> {
        let macs_key = format!("{key}.macs");
        let hint = "use a list of the MACs reachable through every port of the group (e.g. the anycast gateway's: macs = [\"02:00:5e:00:01:01\"]) or macs = \"learned\" (every MAC the bridge learns on any of its ports)";
        let list = match raw.get_ref() {
            toml::Value::String(s) if s == "learned" => return Ok(UplinkMacs::Learned),
            toml::Value::Array(a) if !a.is_empty() => a,
            toml::Value::Array(_) => return Err(self.err(macs_key, raw.span(), format!("is empty; {hint}"))),
            other => return Err(self.err(macs_key, raw.span(), format!("{other} is not a MAC list; {hint}"))),
        };
        let mut macs = Vec::with_capacity(list.len());
        for (j, v) in list.iter().enumerate() {
            let at = format!("{macs_key}[{j}]");
            let mac = match v {
                toml::Value::String(s) => parse_mac(s).map_err(|e| self.err(&at, raw.span(), e))?,
                other => return Err(self.err(at, raw.span(), format!("{other} is not a MAC; {hint}"))),
            };
            if mac[0] & 1 != 0 {
                return Err(self.err(
                    at,
                    raw.span(),
                    format!("{} is a multicast or broadcast MAC; the kernel bridge floods those, an uplink group serves unicast MACs", crate::sys::format_mac(&mac)),
                ));
            }
            let taken = earlier.iter().find(|u| matches!(&u.macs, UplinkMacs::Listed(l) if l.contains(&mac)));
            if macs.contains(&mac) || taken.is_some() {
                let place = taken.map_or_else(
                    || "this list".to_string(),
                    |u| format!("uplink group {:?}", groups[u.group_index].name),
                );
                return Err(self.err(
                    at,
                    raw.span(),
                    format!(
                        "{} is already in {place}; a MAC is served by one uplink group",
                        crate::sys::format_mac(&mac)
                    ),
                ));
            }
            macs.push(mac);
        }
        Ok(UplinkMacs::Listed(macs))
    }
}
