//! systemd's readiness protocol (`sd_notify`) for `rocev2 run` under a
//! `Type=notify` unit: `READY=1` once the ports are attached and the maps
//! filled, `RELOADING=1` / `READY=1` around a reload, `STOPPING=1` at the
//! end, `STATUS=` with a one-line summary, and with `WatchdogSec=` in the
//! unit `WATCHDOG=1` while the control loop is healthy.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call does nothing. A
//! message that cannot be sent is reported once on stderr and otherwise
//! ignored: forwarding never depends on the service manager.

use std::sync::atomic::{AtomicBool, Ordering};

use sd_notify::NotifyState;

use crate::control::stats::Snapshot;

static WARNED: AtomicBool = AtomicBool::new(false);

fn send(states: &[NotifyState]) {
    // false: keep NOTIFY_SOCKET, later messages need it too.
    if let Err(e) = sd_notify::notify(false, states) {
        if !WARNED.swap(true, Ordering::Relaxed) {
            eprintln!("rocev2: warning: cannot notify the service manager (NOTIFY_SOCKET): {e}");
        }
    }
}

/// Every port attached, maps filled: the service is up.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload (SIGHUP) starts; [`ready`] follows whether it worked or not.
pub fn reloading() {
    send(&[NotifyState::Reloading, NotifyState::Status("reloading the config")]);
}

/// The process is shutting down (stop or handover).
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// The watchdog period systemd asks for (`WatchdogSec=`, passed as
/// WATCHDOG_USEC for this process), if any.
/// As libsystemd's `sd_watchdog_enabled`: WATCHDOG_USEC, for this process
/// when WATCHDOG_PID names it or is unset.
pub fn watchdog_period() -> Option<std::time::Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok().filter(|u| *u > 0)?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse() != Ok(std::process::id()) => None,
        _ => Some(std::time::Duration::from_micros(usec)),
    }
}

/// "Still alive": sent only while the control loop is healthy, so a loop
/// that hangs is restarted by systemd (and the restarted run takes the
/// dataplane over without dropping traffic).
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// A new summary for `systemctl status`.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// The `STATUS=` summary: ports, groups (usable members), routes and the
/// packets forwarded so far.
pub fn summary(snapshot: &Snapshot, routes: usize) -> String {
    let forwarded: u64 = snapshot.ports.iter().map(|p| p.counters.get("forwarded").copied().unwrap_or(0)).sum();
    let members: usize = snapshot.groups.iter().map(|g| g.members.len()).sum();
    format!(
        "forwarding on {} ports, {} groups ({} usable members), {} routes; {} packets forwarded",
        snapshot.ports.len(),
        snapshot.groups.len(),
        members,
        routes,
        forwarded
    )
}
