//! System interfaces: rtnetlink (links, addresses, neighbours), network
//! namespaces, the BPF filesystem, privileges, raw packet sockets, signals
//! and the machine's CPU time.

pub mod bpffs;
pub mod btf;
pub mod cpu;
pub mod netlink;
pub mod netns;
pub mod paths;
pub mod privileges;
pub mod rawsock;
pub mod signals;
pub mod snmp;
pub mod suggest;
pub mod verifier;

/// Sends `signal` to process `pid` (kill(2)).
/// Whether process `pid` runs (a zombie, left to a parent that does not
/// reap it, has exited).
pub fn process_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name in parentheses.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
}

pub fn signal_process(pid: u32, signal: nix::sys::signal::Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::errno::Errno::ESRCH)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
}

/// The ifindex of interface `name` in the calling thread's network
/// namespace.
pub fn ifindex(name: &str) -> std::io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("interface {name:?}: {e} ({})", netns::describe_current()),
        )
    })
}

/// The MAC of interface `dev` in the calling thread's network namespace.
///
/// Asked with the SIOCGIFHWADDR ioctl rather than read from
/// /sys/class/net: sysfs shows the namespace it was mounted in, which is
/// not the thread's after a `setns` (how `--netns` and the tests work).
pub fn device_mac(dev: &str) -> anyhow::Result<[u8; 6]> {
    use anyhow::bail;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let name = dev.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        bail!("{dev:?} is not a valid interface name");
    }
    // SAFETY: plain syscall; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        bail!("socket() for SIOCGIFHWADDR: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("cannot read the MAC of {dev:?}: {e} (does the interface exist in this network namespace?)");
    }
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data) {
        *m = d as u8;
    }
    Ok(mac)
}

/// A MAC address as `02:52:32:00:00:01`: the one formatter for configs,
/// state files, `stats`, labs and messages.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Parses a MAC address written `aa:bb:cc:dd:ee:ff` (one or two hex digits
/// per byte); the error is the message to show.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let malformed =
        || format!("{s:?} is not a MAC address; write six hex bytes separated by ':', e.g. \"02:00:00:00:00:04\"");
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(malformed)?;
        if part.is_empty() || part.len() > 2 || !part.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| malformed())?;
    }
    if parts.next().is_some() {
        return Err(malformed());
    }
    Ok(mac)
}
