//! System interfaces: rtnetlink (links, addresses, neighbours), network
//! namespaces, the BPF filesystem, privileges and raw packet sockets.

pub mod bpffs;
pub mod netlink;
pub mod netns;
pub mod privileges;
pub mod rawsock;
pub mod suggest;
