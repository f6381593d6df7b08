//! The file as serde reads it: every value still wrapped in its span.

use serde::Deserialize;
use toml::Spanned;

// Values that need checking are read as strings / i64 and parsed in
// `validate`, so the messages can say which values are allowed (serde's
// "unknown variant" or "expected u32" would not help a network engineer).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    #[serde(default)]
    pub(super) dataplane: RawDataplane,
    #[serde(default)]
    pub(super) port: Vec<Spanned<RawPort>>,
    #[serde(default)]
    pub(super) group: Vec<Spanned<RawGroup>>,
    #[serde(default)]
    pub(super) route: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub(super) pin: Vec<Spanned<RawPin>>,
    #[serde(default)]
    pub(super) ecn_profile: Vec<Spanned<RawEcnProfile>>,
    #[serde(default)]
    pub(super) egress: Vec<Spanned<RawEgress>>,
    #[serde(default)]
    pub(super) class: Option<Vec<Spanned<RawClass>>>,
    #[serde(default)]
    pub(super) routing: Option<Spanned<RawRouting>>,
    #[serde(default)]
    pub(super) route_policy: Vec<Spanned<RawRoutePolicy>>,
    #[serde(default)]
    pub(super) bridge: Option<Spanned<RawBridge>>,
    #[serde(default)]
    pub(super) uplink_group: Vec<Spanned<RawUplinkGroup>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBridge {
    pub(super) name: Spanned<String>,
}

/// The policy keys are those of [`RawGroup`] again (see
/// [`RawRoutePolicy`]); `ports` and `macs` take the place of `members`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUplinkGroup {
    pub(super) name: Spanned<String>,
    pub(super) ports: Spanned<Vec<Spanned<String>>>,
    pub(super) macs: Spanned<toml::Value>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) policy: Option<Spanned<String>>,
    pub(super) flowlet_gap_us: Option<Spanned<i64>>,
    pub(super) flowlet_choice: Option<Spanned<String>>,
    pub(super) flowlet_boundary: Option<Spanned<bool>>,
    pub(super) flowlet_table_size: Option<Spanned<i64>>,
    pub(super) flowlet_table: Option<Spanned<String>>,
    pub(super) rebalance: Option<Spanned<String>>,
    pub(super) transport_aware: Option<Spanned<RawTransportAware>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouting {
    pub(super) source: Option<Spanned<String>>,
    pub(super) table: Option<Spanned<toml::Value>>,
}

/// The policy keys are those of [`RawGroup`], listed again: serde's
/// `flatten` cannot be combined with `deny_unknown_fields`, which the
/// "did you mean" messages rely on. Both are checked by `Source::policy`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoutePolicy {
    pub(super) prefix: Spanned<String>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) policy: Option<Spanned<String>>,
    pub(super) flowlet_gap_us: Option<Spanned<i64>>,
    pub(super) flowlet_choice: Option<Spanned<String>>,
    pub(super) flowlet_boundary: Option<Spanned<bool>>,
    pub(super) flowlet_table_size: Option<Spanned<i64>>,
    pub(super) flowlet_table: Option<Spanned<String>>,
    pub(super) rebalance: Option<Spanned<String>>,
    pub(super) transport_aware: Option<Spanned<RawTransportAware>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPin {
    pub(super) prefix: Spanned<String>,
    pub(super) qp: Spanned<i64>,
    /// Absent: a pin for a route learned from the kernel.
    pub(super) group: Option<Spanned<String>>,
    pub(super) member: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEcnProfile {
    pub(super) name: Spanned<String>,
    pub(super) kmin: Spanned<toml::Value>,
    pub(super) kmax: Spanned<toml::Value>,
    pub(super) pmax: Spanned<toml::Value>,
    pub(super) drop_not_ect: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEgress {
    pub(super) dev: Spanned<String>,
    pub(super) rate: Spanned<toml::Value>,
    pub(super) ecn_profile: Option<Spanned<String>>,
    pub(super) local: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClass {
    pub(super) name: Spanned<String>,
    pub(super) opcodes: Option<Spanned<Vec<i64>>>,
    pub(super) max_payload: Option<Spanned<i64>>,
    pub(super) qps: Option<Spanned<toml::Value>>,
    pub(super) dscp: Option<Spanned<Vec<i64>>>,
    pub(super) set_dscp: Option<Spanned<i64>>,
    pub(super) priority: Option<Spanned<toml::Value>>,
    pub(super) ecn_exempt: Option<Spanned<bool>>,
    pub(super) ecn_profile: Option<Spanned<String>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDataplane {
    pub(super) hash: Option<Spanned<String>>,
    pub(super) hash_seed: Option<Spanned<toml::Value>>,
    pub(super) hash_version: Option<Spanned<i64>>,
    pub(super) xdp_mode: Option<Spanned<String>>,
    pub(super) pin_dir: Option<Spanned<String>>,
    pub(super) neighbour_refresh_ms: Option<Spanned<i64>>,
    pub(super) attach: Option<Spanned<String>>,
    pub(super) telemetry_qps: Option<Spanned<i64>>,
    pub(super) cpu_spread: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPort {
    pub(super) name: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub(super) name: Spanned<String>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) policy: Option<Spanned<String>>,
    pub(super) flowlet_gap_us: Option<Spanned<i64>>,
    pub(super) flowlet_choice: Option<Spanned<String>>,
    pub(super) flowlet_boundary: Option<Spanned<bool>>,
    pub(super) flowlet_table_size: Option<Spanned<i64>>,
    pub(super) flowlet_table: Option<Spanned<String>>,
    pub(super) rebalance: Option<Spanned<String>>,
    pub(super) transport_aware: Option<Spanned<RawTransportAware>>,
    pub(super) members: Spanned<Vec<Spanned<RawMember>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMember {
    pub(super) dev: Spanned<String>,
    pub(super) via: Option<Spanned<String>>,
    pub(super) mac: Option<Spanned<String>>,
    pub(super) weight: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) prefix: Spanned<String>,
    pub(super) group: Spanned<String>,
}

/// The file's `transport_aware = { ... }` as serde reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransportAware {
    pub(super) demote_above: Option<Spanned<f64>>,
    pub(super) restore_below: Option<Spanned<f64>>,
    pub(super) half_life_ms: Option<Spanned<i64>>,
    pub(super) nak_weight: Option<Spanned<f64>>,
    pub(super) retransmit_weight: Option<Spanned<f64>>,
    pub(super) cnp_weight: Option<Spanned<f64>>,
    pub(super) repick: Option<Spanned<String>>,
}
