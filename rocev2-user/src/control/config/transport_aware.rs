//! A group's `transport_aware` option (on a `[[group]]`, or a
//! `[[route_policy]]` for the groups learned under its prefix): demote a
//! member whose QPs see NAKs, retransmissions or CNPs (see crate::control::health
//! for what is done with it).
//!
//! ```toml
//! [[group]]
//! name = "spines"
//! policy = "flowlet"
//! transport_aware = { demote_above = 20, restore_below = 2, half_life_ms = 1000, repick = "idle-or-acked" }
//! ```
//!
//! Every key is optional (`transport_aware = {}` takes the defaults).

use std::time::Duration;

use toml::Spanned;

use super::raw::RawTransportAware;
use super::validate::Source;
use super::{ConfigError, Policy};

/// Default and allowed values of the keys.
const DEFAULT_DEMOTE_ABOVE: f64 = 20.0;
const DEFAULT_RESTORE_BELOW: f64 = 2.0;
const DEFAULT_HALF_LIFE_MS: i64 = 2000;
const HALF_LIFE_MS: std::ops::RangeInclusive<i64> = 100..=3_600_000;
const SCORE_MAX: f64 = 1e9;
const WEIGHT_MAX: f64 = 1000.0;

/// A group's validated `transport_aware` option.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransportAware {
    /// A member whose health score rises above this is demoted: its buckets
    /// go to the other members, so new flowlets (new flows, for a hash
    /// group) avoid it.
    pub demote_above: f64,
    /// A demoted member whose score decays below this gets its buckets back.
    pub restore_below: f64,
    /// The score halves in this time without new trouble.
    pub half_life: Duration,
    /// What one event of each kind adds to the score.
    pub nak_weight: f64,
    pub retransmit_weight: f64,
    pub cnp_weight: f64,
    /// `repick = "idle-or-acked"`: besides an idle gap, an ACK of
    /// everything a QP sent ends its flowlet (flowlet groups).
    pub repick_when_acked: bool,
}

impl Default for TransportAware {
    fn default() -> Self {
        Self {
            demote_above: DEFAULT_DEMOTE_ABOVE,
            restore_below: DEFAULT_RESTORE_BELOW,
            half_life: Duration::from_millis(DEFAULT_HALF_LIFE_MS as u64),
            nak_weight: 1.0,
            retransmit_weight: 1.0,
            cnp_weight: 0.1,
            repick_when_acked: false,
        }
    }
}

impl Source<'_> {
    /// `group[i].transport_aware`; `telemetry_qps` is the `[dataplane]`
    /// value, which the option needs.
    pub(super) fn transport_aware(
        &self,
        group_key: &str,
        raw: &Spanned<RawTransportAware>,
        policy: &Policy,
        telemetry_qps: u32,
    ) -> Result<TransportAware, ConfigError> {
        let key = format!("{group_key}.transport_aware");
        if telemetry_qps == 0 {
            return Err(self.err(
                key,
                raw.span(),
                "needs the per-QP telemetry the scores come from: set `telemetry_qps = 4096` (or the QPs you expect) in [dataplane], or remove `transport_aware`",
            ));
        }
        let r = raw.get_ref();
        let mut out = TransportAware::default();
        let number = |name: &str, v: &Spanned<f64>, max: f64| {
            self.check(format!("{key}.{name}"), v, |&n| {
                if n.is_finite() && (0.0..=max).contains(&n) {
                    Ok(n)
                } else {
                    Err(format!("{n} is out of range; use a number from 0 to {max}"))
                }
            })
        };
        if let Some(v) = &r.demote_above {
            out.demote_above = number("demote_above", v, SCORE_MAX)?;
        }
        if let Some(v) = &r.restore_below {
            out.restore_below = number("restore_below", v, SCORE_MAX)?;
        }
        if let Some(v) = &r.half_life_ms {
            out.half_life = self.check(format!("{key}.half_life_ms"), v, |&n| {
                if HALF_LIFE_MS.contains(&n) {
                    Ok(Duration::from_millis(n as u64))
                } else {
                    Err(format!(
                        "{n} is out of range; use {} to {} milliseconds (how fast a member's score halves)",
                        HALF_LIFE_MS.start(),
                        HALF_LIFE_MS.end()
                    ))
                }
            })?;
        }
        if let Some(v) = &r.nak_weight {
            out.nak_weight = number("nak_weight", v, WEIGHT_MAX)?;
        }
        if let Some(v) = &r.retransmit_weight {
            out.retransmit_weight = number("retransmit_weight", v, WEIGHT_MAX)?;
        }
        if let Some(v) = &r.cnp_weight {
            out.cnp_weight = number("cnp_weight", v, WEIGHT_MAX)?;
        }
        if let Some(v) = &r.repick {
            out.repick_when_acked = self.check(format!("{key}.repick"), v, |s| match s.as_str() {
                "idle" => Ok(false),
                "idle-or-acked" if matches!(policy, Policy::Flowlet(_)) => Ok(true),
                "idle-or-acked" => Err("\"idle-or-acked\" ends flowlets early, so it needs policy = \"flowlet\"; add that to the group or use \"idle\"".into()),
                other => Err(format!("{other:?} is not a re-pick rule; use \"idle\" (a flowlet ends after an idle gap only) or \"idle-or-acked\" (also when an ACK covers everything the QP sent)")),
            })?;
        }
        if out.restore_below >= out.demote_above || out.demote_above == 0.0 {
            let span = r.restore_below.as_ref().map_or(raw.span(), |v| v.span());
            return Err(self.err(
                format!("{key}.restore_below"),
                span,
                format!(
                    "restore_below ({}) must be below demote_above ({}), and demote_above above 0, so a member does not flap between the two; e.g. demote_above = 20, restore_below = 2",
                    out.restore_below, out.demote_above
                ),
            ));
        }
        if out.nak_weight + out.retransmit_weight + out.cnp_weight == 0.0 {
            return Err(self.err(
                key,
                raw.span(),
                "every weight is 0, so no member could ever be demoted; give nak_weight, retransmit_weight or cnp_weight a value above 0",
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::control::config::{Config, Policy};

    fn config(dataplane: &str, option: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[dataplane]\n{dataplane}\n[[port]]\nname = \"eth1\"\n\n[[group]]\nname = \"spines\"\npolicy = \"flowlet\"\n{option}\nmembers = [{{ dev = \"eth2\", via = \"10.0.2.2\" }}]\n"
        );
        Config::parse(&text, Path::new("lab.toml"))
    }

    fn error(dataplane: &str, option: &str) -> String {
        match config(dataplane, option) {
            Ok(_) => panic!("expected an error for {option}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_and_every_key() {
        let c = config("telemetry_qps = 1024", "transport_aware = {}").unwrap();
        assert_eq!(c.groups[0].transport_aware, Some(TransportAware::default()));
        assert!(matches!(c.groups[0].policy, Policy::Flowlet(_)));
        let c = config(
            "telemetry_qps = 1024",
            "transport_aware = { demote_above = 8, restore_below = 0.5, half_life_ms = 500, nak_weight = 2, retransmit_weight = 0, cnp_weight = 0.25 }",
        )
        .unwrap();
        let t = c.groups[0].transport_aware.unwrap();
        assert_eq!((t.demote_above, t.restore_below, t.half_life), (8.0, 0.5, Duration::from_millis(500)));
        assert_eq!((t.nak_weight, t.retransmit_weight, t.cnp_weight), (2.0, 0.0, 0.25));
        assert!(!t.repick_when_acked && !c.features().contains(rocev2_common::features::Features::ACKED_REPICK));
        let c = config("telemetry_qps = 1024", "transport_aware = { repick = \"idle-or-acked\" }").unwrap();
        assert!(c.groups[0].transport_aware.unwrap().repick_when_acked);
        assert!(c.features().contains(rocev2_common::features::Features::ACKED_REPICK));
        assert_eq!(config("", "").unwrap().groups[0].transport_aware, None);
    }

    #[test]
    fn route_policies_take_it_too() {
        let text = |dataplane: &str| {
            format!("[dataplane]\n{dataplane}\n[[port]]\nname = \"eth1\"\n\n[routing]\nsource = \"kernel\"\n\n[[route_policy]]\nprefix = \"10.0.0.0/8\"\npolicy = \"flowlet\"\ntransport_aware = {{ repick = \"idle-or-acked\" }}\n")
        };
        let c = Config::parse(&text("telemetry_qps = 64"), Path::new("lab.toml")).unwrap();
        assert!(c.route_policies[0].transport_aware.is_some_and(|t| t.repick_when_acked));
        assert!(c.features().contains(rocev2_common::features::Features::ACKED_REPICK));
        // The learned flowlet groups get their share of the flowlet table
        // (it had one entry when only [[group]]s counted).
        assert_eq!(c.flowlet_table_size(), rocev2_common::maps::DEFAULT_FLOWLET_TABLE_SIZE);
        let e = Config::parse(&text(""), Path::new("lab.toml")).unwrap_err().to_string();
        assert!(e.contains("route_policy[0].transport_aware") && e.contains("telemetry_qps"), "{e}");
    }

    #[test]
    fn errors_name_the_line_the_key_and_the_fix() {
        let e = error("", "transport_aware = {}");
        assert!(e.starts_with("lab.toml:9:"), "{e}");
        assert!(e.contains("group[0].transport_aware") && e.contains("telemetry_qps = 4096"), "{e}");
        let e = error("telemetry_qps = 64", "transport_aware = { demote_above = 5, restore_below = 5 }");
        assert!(e.contains("group[0].transport_aware.restore_below") && e.contains("must be below"), "{e}");
        let e = error("telemetry_qps = 64", "transport_aware = { half_life_ms = 5 }");
        assert!(e.contains("half_life_ms") && e.contains("100 to 3600000"), "{e}");
        let e = error("telemetry_qps = 64", "transport_aware = { demote_above = -1 }");
        assert!(e.contains("demote_above") && e.contains("out of range"), "{e}");
        let e =
            error("telemetry_qps = 64", "transport_aware = { nak_weight = 0, retransmit_weight = 0, cnp_weight = 0 }");
        assert!(e.contains("every weight is 0"), "{e}");
        let e = error("telemetry_qps = 64", "transport_aware = { repick = \"acked\" }");
        assert!(e.contains("group[0].transport_aware.repick") && e.contains("idle-or-acked"), "{e}");
        let e = error("telemetry_qps = 64", "transport_aware = { demote = 5 }");
        assert!(e.starts_with("lab.toml:9:") && e.contains("demote"), "{e}");
    }
}
