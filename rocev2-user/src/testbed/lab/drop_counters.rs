//! Every drop counter of a fabric lab, by place and cause: what the kernel
//! of each switch counted (no route, discards, TTL and header errors), what
//! its devices dropped, what `rocev2 run` dropped by reason (its `drop_*`
//! counters, refused redirects included) and what the wire namespace's
//! devices dropped (frames on a cut cable).
//!
//! The counters count every frame, not only a test's: a sum of them is an
//! upper bound on a test's frames they dropped, and one frame can be
//! counted twice (a refused redirect by `rocev2` and by the veth).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};

use crate::{
    sys::{netns::in_netns_scoped, snmp},
    testbed::lab::{
        fabric::{links::wire_ns, port_sums},
        LabRecord,
    },
};

/// A place where frames are dropped (`l1`, `s2`, `wire`) and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct DropCause {
    pub place: String,
    pub cause: String,
}

/// Counter values by place and cause.
pub type DropCounts = BTreeMap<DropCause, u64>;

/// Whether a cause is the kernel's (it dropped frames `rocev2` handed it,
/// or a device did): the kernel alone would have lost those too.
pub fn is_kernels(cause: &str) -> bool {
    !cause.starts_with("rocev2")
}

/// Reads every counter now. A switch whose dataplane is between two runs
/// gives no `rocev2` counters in this reading.
pub fn read(record: &LabRecord) -> DropCounts {
    let mut out = DropCounts::new();
    let mut add = |place: &str, cause: String, n: u64| {
        out.insert(DropCause { place: place.to_string(), cause }, n);
    };
    for s in &record.switches {
        let place = s.switch.to_string();
        if let Ok(kernel) = in_netns_scoped(&s.netns, kernel_counters) {
            for (cause, n) in kernel {
                add(&place, cause.to_string(), n);
            }
        }
        if let Ok(sums) = port_sums(&s.pin_dir) {
            for (name, n) in sums.into_iter().filter(|(name, _)| name.starts_with("drop_")) {
                add(&place, format!("rocev2 {name}"), n);
            }
        }
    }
    if let Ok(devices) = in_netns_scoped(&wire_ns(&record.name), device_drops) {
        add("wire", "devices dropped (a cut cable)".into(), devices);
    }
    out
}

/// What each counter grew by from `before` to `after`. A counter that went
/// back (its process restarted) grew by its new value.
pub fn growth(before: &DropCounts, after: &DropCounts) -> DropCounts {
    after
        .iter()
        .map(|(k, &n)| {
            let old = before.get(k).copied().unwrap_or(0);
            (k.clone(), if n >= old { n - old } else { n })
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// This thread's network namespace's IP drop counters and device drops.
fn kernel_counters() -> Result<Vec<(&'static str, u64)>> {
    let (snmp, snmp6) = snmp::read()?;
    let ip = |k: &str| snmp::value(&snmp, "Ip", k);
    let ip6 = |k: &str| snmp::value6(&snmp6, k);
    Ok(vec![
        ("kernel: no route", ip("InNoRoutes") + ip("OutNoRoutes") + ip6("Ip6InNoRoutes") + ip6("Ip6OutNoRoutes")),
        ("kernel: TTL or header error", ip("InHdrErrors") + ip6("Ip6InHdrErrors")),
        ("kernel: discarded", ip("InDiscards") + ip("OutDiscards") + ip6("Ip6InDiscards") + ip6("Ip6OutDiscards")),
        ("devices dropped", device_drops()?),
    ])
}

/// Received and transmitted frames this thread's namespace's devices
/// dropped (/proc/net/dev's two `drop` columns).
fn device_drops() -> Result<u64> {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").context("reading /proc/net/dev")?;
    Ok(dev.lines().skip(2).map(device_line_drops).sum())
}

/// `iface: rx bytes packets errs drop fifo frame compressed multicast tx
/// bytes packets errs drop ...`: the rx drop and tx drop fields.
fn device_line_drops(line: &str) -> u64 {
    let Some((_, fields)) = line.split_once(':') else { return 0 };
    let f: Vec<u64> = fields.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    f.get(3).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_devices_rx_and_tx_drops_are_summed() {
        let dev = "  s1p1: 9583654   29772    0    5    0     0          0         0  1425424    4331    0    9    0     0       0          0";
        assert_eq!(device_line_drops(dev), 14);
    }

    #[test]
    fn growth_survives_a_counter_that_restarted() {
        let key = |p: &str, c: &str| DropCause { place: p.into(), cause: c.into() };
        let before = DropCounts::from([(key("l1", "a"), 10), (key("l1", "b"), 50), (key("s1", "c"), 3)]);
        let after =
            DropCounts::from([(key("l1", "a"), 12), (key("l1", "b"), 4), (key("s1", "c"), 3), (key("w", "d"), 1)]);
        let g = growth(&before, &after);
        assert_eq!(g, DropCounts::from([(key("l1", "a"), 2), (key("l1", "b"), 4), (key("w", "d"), 1)]));
    }
}
