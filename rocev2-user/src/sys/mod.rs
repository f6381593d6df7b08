//! System interfaces: rtnetlink (links, addresses, neighbours), network
//! namespaces, the BPF filesystem, privileges, raw packet sockets and signals.

pub mod bpffs;
pub mod netlink;
pub mod netns;
pub mod paths;
pub mod privileges;
pub mod rawsock;
pub mod signals;
pub mod suggest;
pub mod verifier;

/// Sends `signal` to process `pid` (kill(2)).
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
