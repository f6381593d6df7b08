//! System interfaces: rtnetlink (links, addresses, neighbours), network
//! namespaces, the BPF filesystem, privileges and raw packet sockets.

pub mod bpffs;
pub mod netlink;
pub mod netns;
pub mod privileges;
pub mod rawsock;
pub mod suggest;

/// A MAC address as `02:52:32:00:00:01`: the one formatter for configs,
/// state files, `stats`, labs and messages.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
