//! The kernel's protocol counters (/proc/net/snmp and /proc/net/snmp6) of
//! the calling thread's network namespace, read by name.

use anyhow::{Context as _, Result};

/// The text of /proc/net/snmp and /proc/net/snmp6 (empty without IPv6)
/// of this thread's network namespace.
pub fn read() -> Result<(String, String)> {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").context("reading /proc/net/snmp")?;
    let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").unwrap_or_default();
    Ok((snmp, snmp6))
}

/// One value of /proc/net/snmp: a header line and a value line per
/// protocol. A counter this kernel lacks reads 0.
pub fn value(text: &str, proto: &str, key: &str) -> u64 {
    let prefix = format!("{proto}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    let (Some(header), Some(values)) = (lines.next(), lines.next()) else { return 0 };
    header
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// One value of /proc/net/snmp6: a name and a value per line.
pub fn value6(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(key)).then(|| words.next()?.parse().ok()).flatten()
        })
        .unwrap_or(0)
}

/// ICMP and ICMPv6 destination unreachables this thread's network
/// namespace's kernel sent or rate-limited: packets it was handed and
/// could not forward anywhere.
pub fn icmp_unreachables() -> Result<u64> {
    let (snmp, snmp6) = read()?;
    let icmp = |k: &str| value(&snmp, "Icmp", k);
    Ok(icmp("OutDestUnreachs")
        + icmp("OutRateLimitGlobal")
        + icmp("OutRateLimitHost")
        + value6(&snmp6, "Icmp6OutDestUnreachs")
        + value6(&snmp6, "Icmp6OutRateLimitHost"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_counters_are_read_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes\n\
                    Ip: 1 64 100 3 0 90 0 2 8 10 1 4\n\
                    Icmp: InMsgs\nIcmp: 5\n";
        assert_eq!(value(snmp, "Ip", "InHdrErrors"), 3);
        assert_eq!(value(snmp, "Ip", "OutNoRoutes"), 4);
        assert_eq!(value(snmp, "Ip", "InNoRoutes"), 0, "a counter this kernel lacks reads 0");
        assert_eq!(value(snmp, "Icmp", "InMsgs"), 5);
        let snmp6 = "Ip6InReceives                   \t12\nIp6InNoRoutes                   \t7\n";
        assert_eq!(value6(snmp6, "Ip6InNoRoutes"), 7);
    }
}
