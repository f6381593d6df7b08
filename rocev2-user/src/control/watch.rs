//! `rocev2 stats --watch`: live rates from the pinned counters of a running
//! `rocev2 run`, redrawn every interval, so the hash distribution can be
//! watched as it moves.

use std::{
    fmt::Write as _,
    io::Write as _,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use rocev2_common::counters::PortCounter;

use crate::{
    control::dataplane::Maps,
    control::state::RunState,
    control::stats::Snapshot,
    render::{share_bar, Align, Table},
};

/// Clears the terminal and moves the cursor home.
const CLEAR: &str = "\x1b[2J\x1b[H";

fn collect(pin_dir: &Path) -> Result<Snapshot> {
    // Both are re-read every time: the state names the live members and a
    // restarted `rocev2 run` has new maps.
    let state = RunState::read(pin_dir)?;
    let maps = Maps::open_pinned(pin_dir)?;
    Snapshot::collect(&maps, &state)
}

/// Redraws per-port and per-member rates every `interval` until interrupted,
/// or `iterations` times.
pub fn watch(pin_dir: &Path, interval: Duration, iterations: Option<u64>) -> Result<()> {
    if interval.is_zero() {
        bail!("the watch interval must be longer than zero");
    }
    // A `rocev2 run` not started yet, or restarting (e.g. to change the
    // hash mode), is waited for, whichever terminal was opened first.
    let mut prev = loop {
        match collect(pin_dir) {
            Ok(first) => break first,
            Err(_) => show_waiting(pin_dir)?,
        }
        thread::sleep(interval);
    };
    let mut at = Instant::now();
    let mut done = 0u64;
    while iterations.is_none_or(|n| done < n) {
        thread::sleep(interval);
        let now = match collect(pin_dir) {
            Ok(now) => now,
            Err(_) => {
                show_waiting(pin_dir)?;
                continue;
            }
        };
        if now.ports.iter().zip(&prev.ports).any(|(n, p)| n.counters.get("rx_packets") < p.counters.get("rx_packets")) {
            // Counters restarted with a new `rocev2 run`: start over.
            prev = now;
            at = Instant::now();
            continue;
        }
        let now_at = Instant::now();
        let mut stdout = std::io::stdout().lock();
        let warning = now.unmanaged.as_ref().map(|w| format!("WARNING: {w}\n\n")).unwrap_or_default();
        write!(
            stdout,
            "{CLEAR}rocev2 stats --watch  {}  every {:.1} s  Ctrl-C stops\n\n{warning}{}",
            pin_dir.display(),
            interval.as_secs_f64(),
            render_rates(&prev, &now, now_at - at)
        )?;
        stdout.flush()?;
        prev = now;
        at = now_at;
        done += 1;
    }
    Ok(())
}

/// The screen while no `rocev2 run` uses `pin_dir`, with the instances
/// that do run (a mistyped pin_dir waits for nothing).
fn show_waiting(pin_dir: &Path) -> Result<()> {
    let others = match crate::control::state::running_list() {
        list if list.is_empty() => String::new(),
        list => format!("\nrunning now (watch one with --pin-dir DIR or --config FILE):{list}\n"),
    };
    let mut stdout = std::io::stdout().lock();
    write!(
        stdout,
        "{CLEAR}rocev2 stats --watch  {}  Ctrl-C stops\n\nwaiting for a `rocev2 run` with this pin_dir to start\n{others}",
        pin_dir.display()
    )?;
    stdout.flush()?;
    Ok(())
}

fn counter(counters: &std::collections::BTreeMap<&'static str, u64>, name: &str) -> u64 {
    counters.get(name).copied().unwrap_or(0)
}

/// Sum of every counter whose name starts with `prefix`.
fn sum_prefix(counters: &std::collections::BTreeMap<&'static str, u64>, prefix: &str) -> u64 {
    PortCounter::ALL.iter().filter(|c| c.name().starts_with(prefix)).map(|c| counter(counters, c.name())).sum()
}

/// Per-second rates between two snapshots: per port rx/forwarded/passed/
/// dropped packets, per group member packets with its share and a bar.
/// Ports and members are matched by name; one missing from `prev` (or a
/// counter that went down, e.g. after a restart) counts from zero.
pub fn render_rates(prev: &Snapshot, now: &Snapshot, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let rate = |new: u64, old: u64| new.saturating_sub(old) as f64 / secs;
    let mut ports = Table::new(&[
        ("PORT", Align::Left),
        ("RX pps", Align::Right),
        ("FORWARD pps", Align::Right),
        ("PASS pps", Align::Right),
        ("DROP pps", Align::Right),
    ]);
    for port in &now.ports {
        let old = prev.ports.iter().find(|p| p.name == port.name);
        let get = |f: &dyn Fn(&std::collections::BTreeMap<&'static str, u64>) -> u64| {
            format!("{:.0}", rate(f(&port.counters), old.map(|o| f(&o.counters)).unwrap_or(0)))
        };
        ports.row([
            port.name.clone(),
            get(&|c| counter(c, PortCounter::RxPackets.name())),
            get(&|c| counter(c, PortCounter::Forwarded.name())),
            get(&|c| sum_prefix(c, "pass_")),
            get(&|c| sum_prefix(c, "drop_")),
        ]);
    }
    let mut out = ports.render();
    for group in &now.groups {
        let old = prev.groups.iter().find(|g| g.name == group.name);
        let rates: Vec<f64> = group
            .members
            .iter()
            .map(|m| {
                let before = old
                    .and_then(|g| g.members.iter().find(|o| o.dev == m.dev && o.next_hop == m.next_hop))
                    .map_or(0, |o| o.packets);
                rate(m.packets, before)
            })
            .collect();
        let total: f64 = rates.iter().sum();
        let _ = writeln!(out, "\nGROUP {} ({})  {total:.0} pps", group.name, group.describe());
        let mut members = Table::new(&[
            ("MEMBER", Align::Left),
            ("NEXT HOP", Align::Left),
            ("pps", Align::Right),
            ("SHARE", Align::Right),
            ("", Align::Left),
        ]);
        for (m, r) in group.members.iter().zip(&rates) {
            let share = if total > 0.0 { r / total } else { 0.0 };
            members.row([
                m.dev.clone(),
                m.next_hop.clone(),
                format!("{r:.0}"),
                format!("{:.1}%", 100.0 * share),
                match m.health {
                    // Why its share falls to nothing (transport_aware).
                    Some(h) if h.demoted => format!("{} demoted (health {:.1})", share_bar(share), h.score),
                    _ => share_bar(share),
                },
            ]);
        }
        out.push_str(&members.indent(2).render());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::control::stats::{GroupSnapshot, MemberSnapshot, PortSnapshot};

    fn port(name: &str, values: &[(PortCounter, u64)]) -> PortSnapshot {
        let mut counters = BTreeMap::new();
        for c in PortCounter::ALL {
            counters.insert(c.name(), 0);
        }
        for (c, v) in values {
            counters.insert(c.name(), *v);
        }
        PortSnapshot { name: name.into(), ifindex: 2, counters }
    }

    fn member(dev: &str, packets: u64) -> MemberSnapshot {
        MemberSnapshot {
            dev: dev.into(),
            next_hop: format!("via 10.0.0.{}", dev.len()),
            packets,
            bytes: packets * 100,
            transport: None,
            health: None,
        }
    }

    fn snapshot(p0: &[(PortCounter, u64)], members: &[(&str, u64)]) -> Snapshot {
        Snapshot {
            ports: vec![port("p0", p0)],
            groups: vec![GroupSnapshot {
                name: "spines".into(),
                hash: "qp".into(),
                policy: "flowlet".into(),
                flowlet: Some(crate::control::state::FlowletKnobs {
                    gap_us: 500,
                    choice: rocev2_common::flowlet::FlowletChoice::Rehash,
                    boundary: false,
                    table_size: 65536,
                    table: Default::default(),
                }),
                transport_aware: None,
                members: members.iter().map(|(d, p)| member(d, *p)).collect(),
            }],
            ..Snapshot::default()
        }
    }

    #[test]
    fn rates_are_per_second_with_shares_and_bars() {
        use PortCounter::*;
        let prev = snapshot(
            &[(RxPackets, 1000), (Forwarded, 900), (PassNotIp, 50), (DropRunt, 5)],
            &[("u1", 100), ("u2", 100)],
        );
        let now = snapshot(
            &[
                (RxPackets, 3000),
                (Forwarded, 2700),
                (PassNotIp, 150),
                (PassLocal, 100),
                (DropRunt, 5),
                (DropBadIpHeader, 10),
            ],
            &[("u1", 1600), ("u2", 400), ("u33", 0)],
        );
        let text = render_rates(&prev, &now, Duration::from_secs(2));
        let p0 = text.lines().find(|l| l.starts_with("p0")).unwrap();
        let cols: Vec<&str> = p0.split_whitespace().collect();
        // rx +2000, forwarded +1800, pass +200, drop +10 over 2 s.
        assert_eq!(cols, ["p0", "1000", "900", "100", "5"], "{text}");
        assert!(text.contains("GROUP spines (hash qp, flowlet gap 500us)  900 pps"), "{text}");
        let u1 = text.lines().find(|l| l.trim_start().starts_with("u1 ")).unwrap();
        assert!(u1.contains(" 750 ") && u1.contains("83.3%"), "{u1}");
        assert!(u1.ends_with(&format!(" {}", "#".repeat(25))), "{u1}");
        let u2 = text.lines().find(|l| l.trim_start().starts_with("u2 ")).unwrap();
        assert!(u2.contains(" 150 ") && u2.contains("16.7%") && u2.ends_with(" #####"), "{u2}");
        let u33 = text.lines().find(|l| l.trim_start().starts_with("u33 ")).unwrap();
        assert!(u33.contains("0.0%"), "{u33}");
        // A member demoted for its transport health says so.
        let mut demoted = now.clone();
        demoted.groups[0].members[2].health =
            Some(crate::control::health::MemberHealth { score: 31.25, demoted: true, demotions: 1, restores: 0 });
        let text = render_rates(&prev, &demoted, Duration::from_secs(2));
        let u33 = text.lines().find(|l| l.trim_start().starts_with("u33 ")).unwrap();
        assert!(u33.ends_with("demoted (health 31.2)") || u33.ends_with("demoted (health 31.3)"), "{u33}");
    }

    #[test]
    fn counters_that_go_down_or_appear_do_not_underflow() {
        let prev = snapshot(&[(PortCounter::RxPackets, 5000)], &[("u1", 5000)]);
        let now = snapshot(&[(PortCounter::RxPackets, 10)], &[("u1", 10), ("u2", 20)]);
        let text = render_rates(&prev, &now, Duration::from_millis(500));
        let p0: Vec<&str> = text.lines().find(|l| l.starts_with("p0")).unwrap().split_whitespace().collect();
        assert_eq!(p0[1], "0", "{text}");
        // u2 is new: counted from zero, 20 packets in 0.5 s.
        assert!(
            text.lines().any(|l| l.trim_start().starts_with("u2 ") && l.contains(" 40 ") && l.contains("100.0%")),
            "{text}"
        );
        // Zero elapsed time must not divide by zero into inf/NaN text.
        let text = render_rates(&now, &now, Duration::ZERO);
        assert!(!text.contains("inf") && !text.contains("NaN"), "{text}");
    }
}
