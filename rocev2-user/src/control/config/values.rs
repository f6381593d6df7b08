//! Value parsers (units, addresses, names): each returns the message to
//! show when the value is wrong.

use std::net::IpAddr;

use rocev2_common::hash::HashMode;

use super::*;

/// "150 KB" -> (150.0, "KB"): the number before the first letter, and the
/// rest, trimmed. `None` when the number does not parse.
fn number_and_unit(s: &str) -> Option<(f64, &str)> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len()));
    Some((num.trim().parse().ok()?, unit.trim()))
}

/// A byte count: an integer, or a string with a unit (B, KB, MB, GB in
/// powers of 1000; KiB, MiB, GiB in powers of 1024), e.g. "150KB", "1MiB".
pub(super) fn parse_bytes(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Ok(*n as u64),
        toml::Value::String(s) => {
            let (num, unit) = number_and_unit(s)
                .ok_or_else(|| format!("{s:?} is not a size; write e.g. \"150KB\", \"1MiB\" or a number of bytes"))?;
            let scale: f64 = match unit {
                "" | "B" => 1.0,
                "KB" | "kB" => 1e3,
                "MB" => 1e6,
                "GB" => 1e9,
                // tc's one-letter spellings ("64k", "1m") are powers of 1024, as in tc.
                "KiB" | "k" | "K" => 1024.0,
                "MiB" | "m" | "M" => 1024.0 * 1024.0,
                "GiB" | "g" | "G" => 1024.0 * 1024.0 * 1024.0,
                other => {
                    return Err(format!("{other:?} is not a size unit; use B, KB, MB, GB, KiB (k), MiB (m) or GiB (g)"))
                }
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
pub(super) fn parse_rate(v: &toml::Value) -> Result<u64, String> {
    let max = rocev2_common::ecn::MAX_RATE_BYTES_PER_SEC;
    let bytes = match v {
        toml::Value::Integer(n) if *n > 0 => *n as u64,
        toml::Value::String(s) => {
            let (num, unit) = number_and_unit(s)
                .ok_or_else(|| format!("{s:?} is not a rate; write e.g. \"10Gbit\", \"25G\" or \"100Mbit\""))?;
            let unit = unit.trim_end_matches("ps").trim_end_matches("bit").trim_end_matches("/s");
            // "Gbit" as in configs, "gbit" as tc writes it.
            let bits_per: f64 = match unit {
                "" => 1.0,
                "K" | "k" => 1e3,
                "M" | "m" => 1e6,
                "G" | "g" => 1e9,
                "T" | "t" => 1e12,
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

/// A size typed on a command line ("64k", "1m", "150KB", "4096"): the
/// config's `parse_bytes` rules, for the options that take one.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) => parse_bytes(&toml::Value::Integer(n)),
        Err(_) => parse_bytes(&toml::Value::String(s.to_owned())),
    }
}

/// A rate typed on a command line ("200mbit", "1Gbit", "25G"), in bits
/// per second: the config's `parse_rate` rules, where a bare number
/// means bits per second (as tc reads it) rather than bytes.
pub fn parse_rate_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.chars().all(|c| c.is_ascii_digit()) {
        return match t.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{s:?} is not a rate; write e.g. \"200mbit\" or \"1gbit\"")),
        };
    }
    parse_rate(&toml::Value::String(t.to_owned())).map(|bytes| bytes * 8)
}

/// A flowlet gap typed on a command line ("2ms", "500us", "1s"), in microseconds.
pub fn parse_gap(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e6)
    } else {
        return Err(format!("{s:?} is not a gap; write e.g. 2ms or 500us"));
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a gap; write e.g. 2ms or 500us"))?;
    let us = (v * scale).round();
    if !(1.0..=10e6).contains(&us) {
        return Err(format!("{s:?} is outside 1us..10s"));
    }
    Ok(us as u32)
}

/// A probability: 0.0 to 1.0, or a percentage string such as "5%".
pub(super) fn parse_probability(v: &toml::Value) -> Result<f64, String> {
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
pub(super) fn parse_priority(v: &toml::Value) -> Result<u32, String> {
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
pub(super) fn parse_qp_range(v: &toml::Value) -> Result<(u32, u32), String> {
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

pub(super) fn parse_hash(s: &str) -> Result<HashMode, String> {
    s.parse().map_err(|e| format!("{s:?} is not a hash mode; {e}"))
}

pub(super) fn parse_xdp_mode(s: &str) -> Result<XdpMode, String> {
    <XdpMode as clap::ValueEnum>::from_str(s, false)
        .map_err(|_| format!("{s:?} is not an XDP mode; use \"native\" (in the driver) or \"skb\" (generic, slower)"))
}

/// The kernel's own rules for interface names (`dev_valid_name`), so a typo
/// is caught by `rocev2 check` rather than at run time.
pub(super) fn check_ifname(s: &str) -> Result<(), String> {
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

pub(super) fn parse_via(s: &str) -> Result<IpAddr, String> {
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

pub(super) fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mac = crate::sys::parse_mac(s)?;
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
pub(super) fn parse_prefix(s: &str) -> Result<Prefix, String> {
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
