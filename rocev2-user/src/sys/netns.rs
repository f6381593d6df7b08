//! Network namespaces for tests and the lab.
//!
//! Every privileged test builds its own little network (hosts as namespaces,
//! veth links between them) so tests run in parallel without touching the
//! machine's real interfaces or each other. Namespaces are made with the
//! `ip` command, the same tool a person would use to inspect them, and are
//! removed by a guard even when a test panics.

use std::{
    fs::File,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    thread::JoinHandle,
};

use anyhow::{bail, Context};

/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;

/// Runs `ip args...` and returns its stdout; the error names the command
/// line and carries ip's stderr.
pub fn ip(args: &[&str]) -> anyhow::Result<String> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let cmdline = format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().with_context(|| format!("cannot run `{cmdline}`"))?;
    if !out.status.success() {
        bail!("`{cmdline}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{cmdline}` printed non-UTF-8"))
}

/// One direction of a device's kernel counters, as `ip -s link` shows them.
#[derive(Clone, Copy, Debug, Default, serde::Deserialize)]
pub struct DirectionCounts {
    pub packets: u64,
    pub dropped: u64,
    pub errors: u64,
}

/// A device's kernel counters: every frame it sent or received, whoever
/// handled it (XDP's redirects and the kernel's own stack alike), so a lab
/// counts arrivals and drops where the frames land.
#[derive(Clone, Copy, Debug, Default, serde::Deserialize)]
pub struct DeviceCounts {
    pub rx: DirectionCounts,
    pub tx: DirectionCounts,
}

/// Device `dev`'s counters in network namespace `ns` (`ip -s -j link`).
pub fn device_counts(ns: &str, dev: &str) -> anyhow::Result<DeviceCounts> {
    #[derive(serde::Deserialize)]
    struct Link {
        stats64: DeviceCounts,
    }
    let text = ip(&["-n", ns, "-s", "-j", "link", "show", "dev", dev])?;
    let links: Vec<Link> = serde_json::from_str(&text)
        .with_context(|| format!("reading the counters of {dev} in {ns} from `ip -s -j link`"))?;
    links.into_iter().next().map(|l| l.stats64).with_context(|| format!("`ip -s -j link` in {ns} shows no {dev}"))
}

fn open_netns(name: &str) -> anyhow::Result<File> {
    let path = format!("{NETNS_DIR}/{name}");
    File::open(&path).map_err(|e| {
        if !std::path::Path::new(&path).exists() {
            // The suggestion ends the message: no "No such file" after it.
            return anyhow::anyhow!("network namespace {name:?} not found ({path}){}", suggest_netns(name));
        }
        anyhow::Error::new(e).context(format!("cannot open network namespace {name:?} ({path})"))
    })
}

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// The names `ip netns list` shows.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .map(|dir| dir.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// "; did you mean \"lab-rtsw\"?" for a mistyped name, or the list of
/// namespaces there are.
fn suggest_netns(name: &str) -> String {
    let names = names();
    if let Some(close) = crate::sys::suggest::closest_match(name, names.iter().map(String::as_str)) {
        return format!("; did you mean {close:?}?");
    }
    match names.len() {
        0 => "; there are no named network namespaces (`ip netns list`)".to_string(),
        1..=8 => format!("; `ip netns list` shows {}", names.join(", ")),
        n => format!("; `ip netns list` shows {n} namespaces"),
    }
}

/// The end of a "no interface named X" message: where rocev2 looked, and
/// how to list what is there.
pub fn interface_hint() -> String {
    let place = describe_current();
    match place.strip_prefix("network namespace ") {
        Some(quoted) => {
            let name = quoted.trim_matches('"');
            format!("; looked in {place} (`ip -n {name} link` lists its interfaces)")
        }
        None => format!(
            "; looked in {place} (`ip link` lists its interfaces; `rocev2 --netns NAME` looks in namespace NAME)"
        ),
    }
}

/// Where this thread's network namespace is, for messages: `network
/// namespace "lab-rtsw"` when it is a named one, `the host's network
/// namespace` when it is that of PID 1.
pub fn describe_current() -> String {
    use std::os::unix::fs::MetadataExt as _;
    let id = |path: &str| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let Some(current) = id("/proc/thread-self/ns/net") else {
        return "the current network namespace".to_string();
    };
    if let Some(name) = names().into_iter().find(|n| id(&format!("{NETNS_DIR}/{n}")) == Some(current)) {
        return format!("network namespace {name:?}");
    }
    if id("/proc/1/ns/net") == Some(current) {
        return "the host's network namespace".to_string();
    }
    "the network namespace rocev2 was started in".to_string()
}

/// The kernel's cookie of the calling thread's network namespace
/// (SO_NETNS_COOKIE, Linux 5.14+): what eBPF programs compare to tell
/// namespaces apart, as ifindexes repeat across them.
pub fn current_cookie() -> std::io::Result<u64> {
    use std::os::fd::AsRawFd as _;
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` outlive the call and describe the buffer.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("SO_NETNS_COOKIE: {e}")));
    }
    Ok(cookie)
}

/// Moves the calling thread into network namespace `name` for good; call it
/// before any other thread starts (threads created later inherit it). The
/// mount namespace is left alone, unlike `ip netns exec`, so /sys/fs/bpf
/// and its pins stay shared with the host.
pub fn enter_process(name: &str) -> anyhow::Result<()> {
    let ns = open_netns(name)?;
    enter(&ns).map_err(|e| anyhow::anyhow!("cannot enter network namespace {name:?}: {e}"))
}

/// Moves the calling thread into the network namespace open as `ns` (a
/// file under /run/netns or /proc/PID/ns/net): the one setns of the crate.
pub fn enter(ns: &std::fs::File) -> std::io::Result<()> {
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}

/// Like [`in_netns`] for closures that borrow from the caller (a scoped
/// thread): e.g. attaching a program the caller owns to an interface that
/// only exists inside the namespace.
pub fn in_netns_scoped<T: Send>(name: &str, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    let ns = open_netns(name)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // setns affects this thread only.
            enter(&ns).map_err(|e| anyhow::anyhow!("setns into network namespace {name:?}: {e}"))?;
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Like [`in_netns`] but returns at once with the thread's handle, for work
/// that runs concurrently (e.g. a receiver). A failure to enter the
/// namespace is the thread's result.
pub fn spawn_in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<JoinHandle<anyhow::Result<T>>> {
    let ns = open_netns(name)?;
    let name = name.to_owned();
    std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || {
            // setns changes only the calling thread's network namespace,
            // which is why each call gets a fresh thread.
            enter(&ns).map_err(|e| anyhow::anyhow!("setns into network namespace {name:?}: {e}"))?;
            drop(ns);
            f()
        })
        .context("spawning a thread for the namespace")
}

/// Runs `f` on a new OS thread that has entered network namespace `name`
/// (/run/netns/NAME) and returns its result; the calling thread stays where
/// it is. A panic in `f` (a failed assert) is passed on to the caller.
pub fn in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    match spawn_in_netns(name, f)?.join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A network namespace made with `ip netns add`; dropping it kills what
/// still runs inside and deletes it, which also destroys its interfaces.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with its loopback up.
    pub fn create(name: &str) -> anyhow::Result<Self> {
        ip(&["netns", "add", name]).with_context(|| format!("creating network namespace {name:?}"))?;
        // Guard first, so a failure below still removes the namespace.
        let ns = Self { name: name.to_owned() };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Takes ownership of namespace `name`, made by someone else (a
    /// topology build): deleted when the guard drops.
    pub fn adopt(name: &str) -> Self {
        Self { name: name.to_owned() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip netns exec NAME args...` and returns its stdout.
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes left inside (a lab's daemons) would keep the namespace
        // and its interfaces alive after the delete.
        if let Ok(pids) = ip(&["netns", "pids", &self.name]) {
            for pid in pids.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
                let _ = super::signal_process(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("warning: cannot delete network namespace {}: {e:#}", self.name);
        }
    }
}

/// A name unique across parallel tests and test processes: `prefix`
/// (shortened if needed), then the pid and a counter, at most 15 bytes so it
/// is also a valid interface name.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // The dash keeps pid and counter apart: "1-23" and "12-3" differ.
    let suffix = format!("{:x}-{n:x}", std::process::id());
    let keep = IFNAME_MAX.saturating_sub(suffix.len());
    let prefix: String = prefix.chars().take(keep).collect();
    format!("{prefix}{suffix}")
}

/// A veth pair to make: `a_if` in namespace `a_ns` <-> `b_if` in `b_ns`,
/// with MACs and CIDR addresses.
#[derive(Clone, Debug)]
pub struct VethPlan {
    pub a_ns: String,
    pub a_if: String,
    pub a_mac: [u8; 6],
    pub a_addrs: Vec<String>,
    pub b_ns: String,
    pub b_if: String,
    pub b_mac: [u8; 6],
    pub b_addrs: Vec<String>,
    /// Turn GRO on for the `b` end (it receives XDP-redirected frames from the RTSW).
    pub gro_b: bool,
}

impl VethPlan {
    /// Makes the pair, adds the addresses and sets both ends up; returns
    /// once both ends have carrier.
    pub fn create(&self) -> anyhow::Result<()> {
        let (a_mac, b_mac) = (crate::sys::format_mac(&self.a_mac), crate::sys::format_mac(&self.b_mac));
        #[rustfmt::skip]
        ip(&[
            "-n", &self.a_ns, "link", "add", &self.a_if, "address", &a_mac, "type", "veth",
            "peer", "name", &self.b_if, "address", &b_mac, "netns", &self.b_ns,
        ])
        .with_context(|| format!("creating veth {}/{} <-> {}/{}", self.a_ns, self.a_if, self.b_ns, self.b_if))?;
        let ends = [(&self.a_ns, &self.a_if, &self.a_addrs), (&self.b_ns, &self.b_if, &self.b_addrs)];
        for (ns, ifname, addrs) in ends {
            for addr in addrs {
                let mut args = vec!["-n", ns.as_str(), "addr", "add", addr.as_str(), "dev", ifname.as_str()];
                // Without nodad an IPv6 address stays tentative (unusable)
                // for a second or two after the link comes up.
                if addr.contains(':') {
                    args.push("nodad");
                }
                ip(&args)?;
            }
            ip(&["-n", ns, "link", "set", ifname, "up"])?;
        }
        if self.gro_b {
            // XDP_REDIRECT into this veth pair needs NAPI on this end, or
            // the kernel drops the frames silently.
            ip(&["netns", "exec", &self.b_ns, "ethtool", "-K", &self.b_if, "gro", "on"])
                .with_context(|| format!("turning GRO on for {}/{}", self.b_ns, self.b_if))?;
        }
        // A veth has carrier only once both ends are up, and under load that
        // can lag the commands: frames sent before it are lost. Return only
        // when both ends report LOWER_UP.
        for (ns, ifname, _) in ends {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !ip(&["-n", ns, "-o", "link", "show", "dev", ifname])?.contains("LOWER_UP") {
                if std::time::Instant::now() > deadline {
                    bail!("{ifname} in {ns} has no carrier 5 s after `ip link set up`");
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Ok(())
    }
}

/// Creates a veth pair `a_if` (in `a`) <-> `b_if` (in `b`) with the given
/// MACs and CIDR addresses, and sets both ends up (see [`VethPlan`]).
#[allow(
    clippy::too_many_arguments,
    reason = "both ends' namespace, name, MAC and address, as `ip link add` takes them"
)]
pub fn veth_between(
    a: &Netns,
    a_if: &str,
    a_mac: [u8; 6],
    a_addrs: &[&str],
    b: &Netns,
    b_if: &str,
    b_mac: [u8; 6],
    b_addrs: &[&str],
) -> anyhow::Result<()> {
    let owned = |addrs: &[&str]| addrs.iter().map(|a| a.to_string()).collect();
    VethPlan {
        a_ns: a.name().to_owned(),
        a_if: a_if.to_owned(),
        a_mac,
        a_addrs: owned(a_addrs),
        b_ns: b.name().to_owned(),
        b_if: b_if.to_owned(),
        b_mac,
        b_addrs: owned(b_addrs),
        gro_b: false,
    }
    .create()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_short_and_distinct() {
        let names: Vec<String> = (0..1000).map(|_| unique_name("a-rather-long-prefix")).collect();
        assert!(names.iter().all(|n| n.len() <= IFNAME_MAX), "{names:?}");
        let set: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(set.len(), names.len());
        assert!(unique_name("ns").starts_with("ns"));
    }

    #[test]
    fn a_missing_namespace_ends_with_the_suggestion_not_an_errno() {
        let name = unique_name("nosuch");
        let message = format!("{:#}", open_netns(&name).unwrap_err());
        assert!(message.starts_with(&format!("network namespace {name:?} not found (/run/netns/{name})")), "{message}");
        assert!(!message.contains("os error"), "{message}");
    }
}
