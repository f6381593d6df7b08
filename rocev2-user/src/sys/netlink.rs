//! What the control program asks the kernel over rtnetlink: interfaces, the
//! box's own addresses and neighbour (ARP/NDP) entries — plus the one ethtool
//! tweak XDP redirects into a veth need.
//!
//! A [`Netlink`] talks to the network namespace of the thread that created
//! it: the socket is bound to a namespace when it is opened, so the tokio
//! task driving it may later run on any thread.

use std::{
    collections::HashSet,
    fmt,
    fs::File,
    net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
// rtnetlink's own copy: the crate's direct netlink-packet-route dependency is
// another version, whose types rtnetlink does not accept.
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use rtnetlink::packet_route::{
    address::AddressAttribute,
    link::{LinkAttribute, LinkFlags, LinkInfo as LinkInfoAttr, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState},
    nsid::{NsidAttribute, NsidMessage},
    AddressFamily, RouteNetlinkMessage,
};

/// How often `resolve_neighbour` looks at the table while waiting.
const NEIGHBOUR_POLL: Duration = Duration::from_millis(20);
/// The discard port: a datagram there provokes resolution and nothing else.
const DISCARD_PORT: u16 = 9;

/// One rtnetlink connection (see the module docs for its namespace).
pub struct Netlink {
    handle: rtnetlink::Handle,
}

/// An interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub name: String,
    pub ifindex: u32,
    /// All zero for links without an Ethernet address (tun, wireguard...).
    pub mac: [u8; 6],
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Has a carrier (IFF_LOWER_UP): false when the cable, or a veth's
    /// peer, is down even though this side is administratively up.
    pub carrier: bool,
    /// rtnetlink link kind ("veth", "bridge", ...); `None` for physical NICs.
    pub kind: Option<String>,
    pub veth_peer: Option<VethPeer>,
}

/// The other end of a veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VethPeer {
    /// Index of the peer inside its own namespace.
    pub ifindex: u32,
    /// The peer's namespace as numbered by *our* namespace; `None` when the
    /// peer lives in the same namespace.
    pub netnsid: Option<i32>,
}

/// What [`ensure_veth_peer_napi`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerNapi {
    NotVeth,
    AlreadyOn,
    EnabledGro { peer_name: String, netns: String },
}

/// A neighbour table entry for one address on one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Neighbour {
    state: NeighbourState,
    mac: Option<[u8; 6]>,
}

impl Neighbour {
    /// The MAC if the kernel itself would transmit to it.
    fn usable_mac(&self) -> Option<[u8; 6]> {
        use NeighbourState as S;
        match self.state {
            S::Reachable | S::Stale | S::Delay | S::Probe | S::Permanent | S::Noarp => self.mac,
            _ => None,
        }
    }
}

impl Netlink {
    /// Opens the connection in the current thread's network namespace and
    /// spawns its driver on the current tokio runtime.
    pub fn new() -> Result<Self> {
        let runtime =
            tokio::runtime::Handle::try_current().context("Netlink::new must be called inside a tokio runtime")?;
        let (connection, handle, _) = rtnetlink::new_connection().context("opening an rtnetlink socket")?;
        runtime.spawn(connection);
        Ok(Self { handle })
    }

    /// The interface called `name`.
    pub async fn link(&self, name: &str) -> Result<LinkInfo> {
        // The kernel rejects over-long names with EINVAL; say what is meant.
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            bail!("no interface named {name} (not a valid interface name)");
        }
        let mut replies = self.handle.link().get().match_name(name.to_string()).execute();
        match replies.try_next().await {
            Ok(Some(message)) => Ok(link_info(message)),
            Ok(None) => bail!("no interface named {name}"),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
                bail!("no interface named {name}")
            }
            Err(e) => Err(e).with_context(|| format!("querying interface {name}")),
        }
    }

    /// Name of the interface with index `ifindex`.
    /// The routing table of VRF device `name` (`[routing] table = "NAME"`).
    pub async fn vrf_table(&self, name: &str) -> Result<u32> {
        use rtnetlink::packet_route::link::{InfoData, InfoVrf};
        let mut links = self.handle.link().get().match_name(name.to_string()).execute();
        let message = links
            .try_next()
            .await
            .map_err(|e| anyhow!("no interface named {name:?} for [routing] table: {e}"))?
            .with_context(|| format!("no interface named {name:?} for [routing] table"))?;
        for attribute in message.attributes {
            if let LinkAttribute::LinkInfo(infos) = attribute {
                for info in infos {
                    if let LinkInfoAttr::Data(InfoData::Vrf(vrf)) = info {
                        if let Some(id) = vrf.iter().find_map(|v| match v {
                            InfoVrf::TableId(id) => Some(*id),
                            _ => None,
                        }) {
                            return Ok(id);
                        }
                    }
                }
            }
        }
        bail!("{name:?} is not a VRF device; [routing] table takes \"main\", a number or a VRF's name")
    }

    async fn link_name(&self, ifindex: u32) -> Result<String> {
        let mut replies = self.handle.link().get().match_index(ifindex).execute();
        let message = replies
            .try_next()
            .await
            .with_context(|| format!("querying interface with index {ifindex}"))?
            .ok_or_else(|| anyhow!("no interface with index {ifindex}"))?;
        Ok(link_info(message).name)
    }

    /// Every address configured on any interface (IPv4 and IPv6, including
    /// link-local and loopback).
    pub async fn local_addresses(&self) -> Result<Vec<IpAddr>> {
        let mut replies = self.handle.address().get().execute();
        let mut addresses = Vec::new();
        while let Some(message) = replies.try_next().await.context("listing local addresses")? {
            // On point-to-point links IFA_ADDRESS is the remote end and
            // IFA_LOCAL ours; elsewhere (and always for IPv6) only
            // IFA_ADDRESS may be present.
            let local = message.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = message.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = local.or(address) {
                if !addresses.contains(&ip) {
                    addresses.push(ip);
                }
            }
        }
        Ok(addresses)
    }

    /// The MAC of `addr` on `ifindex`, resolving it if the kernel has no
    /// usable entry, waiting at most `timeout`.
    pub async fn resolve_neighbour(&self, ifindex: u32, addr: IpAddr, timeout: Duration) -> Result<[u8; 6]> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.neighbour(ifindex, addr).await? {
                Some(entry) if entry.usable_mac().is_some() => {
                    return entry.usable_mac().context("usable entry without a MAC");
                }
                // The kernel is already probing: asking again changes nothing.
                Some(entry) if entry.state == NeighbourState::Incomplete => {}
                // Missing, FAILED or NONE: (re)start resolution.
                _ => self.trigger_resolution(ifindex, addr).await?,
            }
            let now = Instant::now();
            if now >= deadline {
                let device = self.link_name(ifindex).await.unwrap_or_else(|_| format!("ifindex {ifindex}"));
                let protocol = if addr.is_ipv4() { "ARP" } else { "NDP" };
                bail!("neighbour {addr} on {device} did not answer {protocol} within {}", DisplayDuration(timeout));
            }
            tokio::time::sleep(NEIGHBOUR_POLL.min(deadline - now)).await;
        }
    }

    /// Keeps the entry for `addr` on `ifindex` alive and returns its MAC if
    /// it is usable right now.
    ///
    /// XDP-forwarded frames never touch the kernel's neighbour code, so
    /// without this the entry would go STALE and eventually be garbage
    /// collected. "Using" it makes the kernel re-confirm a REACHABLE entry
    /// when it expires, re-probe a STALE one and resolve a missing one.
    pub async fn refresh_neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<Option<[u8; 6]>> {
        self.trigger_resolution(ifindex, addr).await?;
        Ok(self.neighbour(ifindex, addr).await?.and_then(|entry| entry.usable_mac()))
    }

    /// The kernel's entry for `addr` on `ifindex`, if any (RTM_GETNEIGH for
    /// one entry rather than a dump: refreshes run often).
    async fn neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<Option<Neighbour>> {
        let mut message = NeighbourMessage::default();
        message.header.family = address_family(addr);
        message.header.ifindex = ifindex;
        message.attributes.push(NeighbourAttribute::Destination(neighbour_address(addr)));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetNeighbour(message));
        request.header.flags = NLM_F_REQUEST;

        let context = || format!("reading the neighbour entry for {addr} on ifindex {ifindex}");
        let mut replies = self.handle.clone().request(request).with_context(context)?;
        while let Some(reply) = replies.next().await {
            match reply.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(entry)) => {
                    let mac = entry.attributes.iter().find_map(|a| match a {
                        NeighbourAttribute::LinkLocalAddress(mac) => mac.as_slice().try_into().ok(),
                        _ => None,
                    });
                    return Ok(Some(Neighbour { state: entry.header.state, mac }));
                }
                NetlinkPayload::Error(e) if e.raw_code() == -libc::ENOENT => return Ok(None),
                NetlinkPayload::Error(e) => return Err(e.to_io()).with_context(context),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Makes the kernel (re)resolve `addr` on `ifindex`, the way Cilium does:
    /// RTM_NEWNEIGH with NTF_USE (`ip neigh replace ADDR dev DEV use`) only
    /// "uses" the entry — creating it if needed — and never overwrites it.
    /// Kernels that refuse that get a datagram to the discard port instead,
    /// which goes through the same neighbour output path.
    async fn trigger_resolution(&self, ifindex: u32, addr: IpAddr) -> Result<()> {
        let Err(use_error) = self.use_neighbour(ifindex, addr).await else {
            return Ok(());
        };
        let device = self.link_name(ifindex).await?;
        poke_with_datagram(&device, ifindex, addr).with_context(|| {
            format!(
                "triggering resolution of {addr} on {device}: \
                 NTF_USE failed ({use_error}) and so did the datagram fallback"
            )
        })
    }

    /// RTM_NEWNEIGH with NTF_USE. The kernel then ignores the state and only
    /// runs neigh_event_send(); REPLACE (not EXCL) lets that happen for an
    /// existing entry too.
    async fn use_neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<(), rtnetlink::Error> {
        self.handle
            .neighbours()
            .add(ifindex, addr)
            .state(NeighbourState::None)
            .flags(NeighbourFlags::Use)
            .replace()
            .execute()
            .await
    }
}

pub(crate) fn link_info(message: LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        name: String::new(),
        ifindex: message.header.index,
        mac: [0; 6],
        up: message.header.flags.contains(LinkFlags::Up),
        carrier: message.header.flags.contains(LinkFlags::LowerUp),
        kind: None,
        veth_peer: None,
    };
    let mut peer_ifindex = None;
    let mut peer_netnsid = None;
    for attribute in message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => info.name = name,
            LinkAttribute::Address(mac) => info.mac = mac.as_slice().try_into().unwrap_or([0; 6]),
            LinkAttribute::LinkInfo(infos) => {
                info.kind = infos.into_iter().find_map(|i| match i {
                    LinkInfoAttr::Kind(kind) => Some(kind.to_string()),
                    _ => None,
                })
            }
            // For a veth IFLA_LINK is the peer's ifindex, and IFLA_LINK_NETNSID
            // appears only when the peer is in another namespace.
            LinkAttribute::Link(index) => peer_ifindex = Some(index),
            LinkAttribute::LinkNetNsId(id) => peer_netnsid = Some(id),
            _ => {}
        }
    }
    if info.kind.as_deref() == Some("veth") {
        info.veth_peer =
            peer_ifindex.filter(|&index| index != 0).map(|ifindex| VethPeer { ifindex, netnsid: peer_netnsid });
    }
    info
}

fn address_family(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neighbour_address(addr: IpAddr) -> NeighbourAddress {
    match addr {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

/// Sends one empty UDP datagram to `addr`:9 out of `device`, so the kernel
/// has to resolve `addr` (or its gateway) on that device.
fn poke_with_datagram(device: &str, ifindex: u32, addr: IpAddr) -> Result<()> {
    let (local, remote): (SocketAddr, SocketAddr) = match addr {
        IpAddr::V4(_) => (([0, 0, 0, 0], 0).into(), (addr, DISCARD_PORT).into()),
        // Link-local IPv6 addresses are meaningless without the interface.
        IpAddr::V6(v6) => (([0u16; 8], 0).into(), SocketAddrV6::new(v6, DISCARD_PORT, 0, ifindex).into()),
    };
    let socket = UdpSocket::bind(local).context("opening a UDP socket")?;
    // SAFETY: a valid socket, and a pointer/length pair naming `device`.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            device.as_ptr().cast(),
            device.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("binding a UDP socket to {device}"));
    }
    socket.send_to(&[], remote).with_context(|| format!("sending a datagram to {remote}"))?;
    Ok(())
}

/// Durations as people write them in error messages: "3s", "250ms".
struct DisplayDuration(Duration);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis.is_multiple_of(1000) {
            write!(f, "{}s", millis / 1000)
        } else {
            write!(f, "{millis}ms")
        }
    }
}

/// Makes XDP_REDIRECT into `link` deliver.
///
/// A veth only accepts redirected frames if its PEER runs NAPI, which it
/// does with an XDP program attached or with GRO on; otherwise the kernel
/// drops them silently. This turns GRO on for the peer, entering the peer's
/// namespace (found through its netns id) from a short-lived thread.
/// `link` must have been read in the calling thread's namespace.
pub fn ensure_veth_peer_napi(link: &LinkInfo) -> Result<PeerNapi> {
    let Some(peer) = link.veth_peer else {
        return Ok(PeerNapi::NotVeth);
    };
    let context = || format!("enabling GRO on the veth peer of {}", link.name);

    let Some(netnsid) = peer.netnsid else {
        // Same namespace: no need to move anywhere.
        return enable_gro(peer.ifindex, "current network namespace").with_context(context);
    };
    let netns = find_netns_by_id(netnsid)
        .with_context(|| format!("finding the namespace of the veth peer of {}", link.name))?;
    let worker = std::thread::Builder::new()
        .name("veth-peer-gro".into())
        .spawn(move || {
            // setns() affects only this thread, which then ends.
            enter_netns(&netns)?;
            enable_gro(peer.ifindex, &netns.display().to_string())
        })
        .context("spawning the thread that enters the peer namespace")?;
    worker.join().map_err(|_| anyhow!("the thread that enters the peer namespace panicked"))?.with_context(context)
}

/// Turns GRO on for `ifindex` in the calling thread's namespace.
fn enable_gro(ifindex: u32, netns: &str) -> Result<PeerNapi> {
    let name = ifindex_to_name(ifindex).with_context(|| format!("finding the name of ifindex {ifindex} in {netns}"))?;
    if ethtool::gro(&name)? {
        return Ok(PeerNapi::AlreadyOn);
    }
    ethtool::set_gro(&name, true)?;
    // The kernel may silently keep a feature off; check it took.
    if !ethtool::gro(&name)? {
        bail!("the kernel kept GRO off on {name} in {netns}");
    }
    Ok(PeerNapi::EnabledGro { peer_name: name, netns: netns.to_string() })
}

fn ifindex_to_name(ifindex: u32) -> Result<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname may write.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: on success `buf` holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// Moves the calling thread into the network namespace at `path`.
fn enter_netns(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    crate::netns::enter(&file).with_context(|| format!("entering network namespace {}", path.display()))
}

/// The namespace our namespace calls `netnsid`: asks the kernel (RTM_GETNSID
/// with NETNSA_FD) for the id of every namespace it can open — those bound
/// in /run/netns, then those of running processes.
fn find_netns_by_id(netnsid: i32) -> Result<PathBuf> {
    let socket = SyncRtnetlink::open()?;
    let mut seen = HashSet::new();
    // Our own namespace cannot hold the peer.
    if let Ok(own) = std::fs::metadata("/proc/thread-self/ns/net") {
        seen.insert((own.dev(), own.ino()));
    }
    for path in netns_candidates() {
        // Many processes share a namespace: ask once per namespace inode.
        let Ok(metadata) = std::fs::metadata(&path) else {
            continue;
        };
        if !seen.insert((metadata.dev(), metadata.ino())) {
            continue;
        }
        // Processes come and go; an unreadable candidate just is not it.
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if socket.nsid_of(&file)? == Some(netnsid) {
            return Ok(path);
        }
    }
    bail!("no namespace has netns id {netnsid}: none bound in /run/netns and no process is in it")
}

fn netns_candidates() -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = match std::fs::read_dir("/run/netns") {
        Ok(entries) => entries.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    };
    candidates.sort();
    // Our own threads may sit in other namespaces (tests do).
    for dir in ["/proc/self/task", "/proc"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            if name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                candidates.push(entry.path().join("ns/net"));
            }
        }
    }
    candidates
}

/// A blocking rtnetlink socket, for the few requests made outside tokio.
struct SyncRtnetlink(rtnetlink::sys::Socket);

impl SyncRtnetlink {
    fn open() -> Result<Self> {
        use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
        let mut socket = Socket::new(NETLINK_ROUTE).context("opening an rtnetlink socket")?;
        socket.bind_auto().context("binding an rtnetlink socket")?;
        socket.connect(&SocketAddr::new(0, 0)).context("connecting an rtnetlink socket")?;
        Ok(Self(socket))
    }

    /// The id our namespace has for the namespace `ns` refers to, if any.
    fn nsid_of(&self, ns: &File) -> Result<Option<i32>> {
        let mut message = NsidMessage::default();
        message.attributes.push(NsidAttribute::Fd(ns.as_raw_fd() as u32));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetNsId(message));
        request.header.flags = NLM_F_REQUEST;
        request.finalize();
        let mut buf = vec![0; request.buffer_len()];
        request.serialize(&mut buf);
        self.0.send(&buf, 0).context("sending RTM_GETNSID")?;

        let (reply, _) = self.0.recv_from_full().context("receiving the RTM_GETNSID reply")?;
        let reply =
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply).context("parsing the RTM_GETNSID reply")?;
        match reply.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(message)) => {
                Ok(message.attributes.iter().find_map(|a| match a {
                    // -1: the kernel has no id for it.
                    NsidAttribute::Id(id) if *id >= 0 => Some(*id),
                    _ => None,
                }))
            }
            NetlinkPayload::Error(e) => Err(e.to_io()).context("RTM_GETNSID"),
            other => bail!("unexpected reply to RTM_GETNSID: {other:?}"),
        }
    }
}

/// The legacy ethtool ioctls for GRO (include/uapi/linux/ethtool.h).
mod ethtool {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use anyhow::{bail, Context, Result};

    const ETHTOOL_GGRO: u32 = 0x2b;
    const ETHTOOL_SGRO: u32 = 0x2c;

    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }

    pub(super) fn gro(device: &str) -> Result<bool> {
        let value = ioctl(device, ETHTOOL_GGRO, 0).with_context(|| format!("reading the GRO setting of {device}"))?;
        Ok(value != 0)
    }

    pub(super) fn set_gro(device: &str, on: bool) -> Result<()> {
        ioctl(device, ETHTOOL_SGRO, on.into())
            .with_context(|| format!("turning GRO {} on {device}", if on { "on" } else { "off" }))?;
        Ok(())
    }

    /// SIOCETHTOOL on a socket of the calling thread's namespace, which is
    /// the namespace the device is looked up in.
    fn ioctl(device: &str, cmd: u32, data: u32) -> Result<u32> {
        if device.len() >= libc::IFNAMSIZ {
            bail!("interface name {device} is too long");
        }
        // SAFETY: plain syscall; the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("opening an ioctl socket");
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };

        let mut value = EthtoolValue { cmd, data };
        // SAFETY: ifreq is plain data; all-zero is a valid value.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in request.ifr_name.iter_mut().zip(device.bytes()) {
            *dst = src as libc::c_char;
        }
        request.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        // SAFETY: `request` names the device and points at `value`, both
        // alive for the duration of the call.
        if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &mut request) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(value.data)
    }
}

#[cfg(test)]
mod tests {
    use std::{future::Future, net::Ipv4Addr, process::Command};

    use super::*;

    /// Two fresh namespaces joined by a veth (`va` in `a`, `vb` in `b`),
    /// deleted on drop — also when the test panics.
    struct VethPair {
        a: String,
        b: String,
    }

    const MAC_A: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0x00, 0x01];
    const MAC_B: [u8; 6] = [0x02, 0x00, 0x00, 0xbb, 0x00, 0x02];

    impl VethPair {
        /// Namespaces named after the process and `tag`, so parallel tests
        /// and parallel runs never collide. Addresses: 10.`net`.0.1/24 and
        /// fd00:`net`::1/64 on `va`, .2 / ::2 on `vb`.
        fn new(tag: &str, net: u8) -> Self {
            let pid = std::process::id();
            let pair = Self { a: format!("rocev2-nl-{pid}-{tag}-a"), b: format!("rocev2-nl-{pid}-{tag}-b") };
            for ns in [&pair.a, &pair.b] {
                ip(&["netns", "add", ns]);
                // Without this NDP waits ~2s for link-local DAD on fresh links.
                ip(&["netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"]);
            }
            let (a, b) = (pair.a.as_str(), pair.b.as_str());
            ip(&[
                "link",
                "add",
                "va",
                "address",
                "02:00:00:aa:00:01",
                "netns",
                a,
                "type",
                "veth",
                "peer",
                "name",
                "vb",
                "address",
                "02:00:00:bb:00:02",
                "netns",
                b,
            ]);
            for (ns, dev, host) in [(a, "va", 1), (b, "vb", 2)] {
                ip(&["-n", ns, "addr", "add", &format!("10.{net}.0.{host}/24"), "dev", dev]);
                let v6 = format!("fd00:{net}::{host}/64");
                ip(&["-n", ns, "addr", "add", &v6, "dev", dev, "nodad"]);
                ip(&["-n", ns, "link", "set", dev, "up"]);
            }
            pair
        }
    }

    impl Drop for VethPair {
        fn drop(&mut self) {
            for ns in [&self.a, &self.b] {
                let _ = Command::new("ip").args(["netns", "del", ns]).status();
            }
        }
    }

    fn ip(args: &[&str]) {
        let status = Command::new("ip").args(args).status().expect("running ip");
        assert!(status.success(), "ip {} failed", args.join(" "));
    }

    fn is_root() -> bool {
        // SAFETY: no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: needs root for network namespaces");
        }
        root
    }

    /// Runs `f` on a current-thread runtime in a thread inside namespace `ns`.
    fn in_netns<F, Fut, T>(ns: &str, f: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let path = PathBuf::from("/run/netns").join(ns);
        std::thread::spawn(move || {
            enter_netns(&path).expect("entering the test namespace");
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("building a tokio runtime");
            runtime.block_on(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    #[test]
    fn netlink_link_finds_veth_and_its_peer() {
        if !is_root() {
            return;
        }
        let pair = VethPair::new("link", 201);
        let vb = in_netns(&pair.b, || async { Netlink::new()?.link("vb").await }).expect("link vb");
        let (va, missing) = in_netns(&pair.a, || async {
            let netlink = Netlink::new().expect("Netlink::new");
            (netlink.link("va").await, netlink.link("nosuchdev0").await)
        });
        let va = va.expect("link va");
        assert_eq!(va.name, "va");
        assert_eq!(va.mac, MAC_A);
        assert!(va.up);
        assert_eq!(va.kind.as_deref(), Some("veth"));
        let peer = va.veth_peer.expect("veth peer");
        assert_eq!(peer.ifindex, vb.ifindex);
        assert!(peer.netnsid.is_some(), "peer in another namespace must carry an nsid");
        assert_eq!(vb.mac, MAC_B);
        let missing = missing.expect_err("nosuchdev0 must not exist");
        assert_eq!(missing.to_string(), "no interface named nosuchdev0");
    }

    #[test]
    fn netlink_local_addresses_lists_configured_addresses() {
        if !is_root() {
            return;
        }
        let pair = VethPair::new("addr", 202);
        let addresses = in_netns(&pair.a, || async { Netlink::new()?.local_addresses().await }).expect("addresses");
        assert!(addresses.contains(&IpAddr::V4(Ipv4Addr::new(10, 202, 0, 1))), "{addresses:?}");
        assert!(addresses.contains(&"fd00:202::1".parse().unwrap()), "{addresses:?}");
        assert!(!addresses.contains(&IpAddr::V4(Ipv4Addr::new(10, 202, 0, 2))), "{addresses:?}");
    }

    #[test]
    fn netlink_resolve_neighbour_from_empty_table() {
        if !is_root() {
            return;
        }
        let pair = VethPair::new("neigh", 203);
        in_netns(&pair.a, || async {
            let netlink = Netlink::new().expect("Netlink::new");
            let va = netlink.link("va").await.expect("link va");
            let peer_v4: IpAddr = "10.203.0.2".parse().unwrap();
            let peer_v6: IpAddr = "fd00:203::2".parse().unwrap();

            assert_eq!(netlink.neighbour(va.ifindex, peer_v4).await.unwrap(), None);
            let timeout = Duration::from_secs(3);
            let mac = netlink.resolve_neighbour(va.ifindex, peer_v4, timeout).await.expect("ARP");
            assert_eq!(mac, MAC_B);
            let mac = netlink.resolve_neighbour(va.ifindex, peer_v6, timeout).await.expect("NDP");
            assert_eq!(mac, MAC_B);
            let refreshed = netlink.refresh_neighbour(va.ifindex, peer_v4).await.expect("refresh");
            assert_eq!(refreshed, Some(MAC_B));

            // Nobody has .99: a clear error, on time.
            let started = Instant::now();
            let error = netlink
                .resolve_neighbour(va.ifindex, "10.203.0.99".parse().unwrap(), Duration::from_secs(1))
                .await
                .expect_err("10.203.0.99 must not resolve");
            assert!(started.elapsed() < Duration::from_millis(1500), "took {:?}", started.elapsed());
            assert_eq!(error.to_string(), "neighbour 10.203.0.99 on va did not answer ARP within 1s");
            // A missing entry is created and resolution started, not reported.
            let absent = netlink.refresh_neighbour(va.ifindex, "10.203.0.98".parse().unwrap()).await;
            assert_eq!(absent.expect("refresh of an absent entry"), None);
        });
    }

    /// Polls the table (no triggering) until `addr` has a usable entry.
    async fn wait_for_usable_entry(netlink: &Netlink, ifindex: u32, addr: IpAddr) -> [u8; 6] {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let entry = netlink.neighbour(ifindex, addr).await.expect("neighbour get");
            if let Some(mac) = entry.as_ref().and_then(Neighbour::usable_mac) {
                return mac;
            }
            assert!(Instant::now() < deadline, "{addr} never became usable: {entry:?}");
            tokio::time::sleep(NEIGHBOUR_POLL).await;
        }
    }

    /// Both trigger mechanisms work on their own on this kernel.
    #[test]
    fn netlink_ntf_use_and_datagram_each_trigger_resolution() {
        if !is_root() {
            return;
        }
        let pair = VethPair::new("trig", 205);
        in_netns(&pair.a, || async {
            let netlink = Netlink::new().expect("Netlink::new");
            let va = netlink.link("va").await.expect("link va");
            for (addr, via_ntf_use) in
                [("10.205.0.2", true), ("fd00:205::2", true), ("10.205.0.2", false), ("fd00:205::2", false)]
            {
                let addr: IpAddr = addr.parse().unwrap();
                ip(&["neigh", "flush", "dev", "va"]);
                assert_eq!(netlink.neighbour(va.ifindex, addr).await.unwrap(), None);
                if via_ntf_use {
                    netlink.use_neighbour(va.ifindex, addr).await.expect("NTF_USE");
                } else {
                    poke_with_datagram("va", va.ifindex, addr).expect("datagram");
                }
                assert_eq!(wait_for_usable_entry(&netlink, va.ifindex, addr).await, MAC_B);
            }
        });
    }

    #[test]
    fn netlink_enables_gro_on_peer_in_other_namespace() {
        if !is_root() {
            return;
        }
        let pair = VethPair::new("gro", 204);
        let gro_of_vb = || {
            let out = Command::new("ip")
                .args(["netns", "exec", &pair.b, "ethtool", "-k", "vb"])
                .output()
                .expect("running ethtool");
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            out.lines().find(|l| l.starts_with("generic-receive-offload:")).map(str::to_string)
        };
        assert_eq!(gro_of_vb().as_deref(), Some("generic-receive-offload: off"));

        let (first, second, lo) = in_netns(&pair.a, || async {
            let netlink = Netlink::new().expect("Netlink::new");
            let va = netlink.link("va").await.expect("link va");
            let lo = netlink.link("lo").await.expect("link lo");
            (ensure_veth_peer_napi(&va), ensure_veth_peer_napi(&va), ensure_veth_peer_napi(&lo))
        });
        assert_eq!(
            first.expect("first call"),
            PeerNapi::EnabledGro { peer_name: "vb".into(), netns: format!("/run/netns/{}", pair.b) }
        );
        assert_eq!(second.expect("second call"), PeerNapi::AlreadyOn);
        assert_eq!(lo.expect("lo"), PeerNapi::NotVeth);
        assert_eq!(gro_of_vb().as_deref(), Some("generic-receive-offload: on"));
    }

    #[test]
    fn netlink_enables_gro_on_peer_in_same_namespace() {
        if !is_root() {
            return;
        }
        let pair = VethPair::new("gro1", 206);
        ip(&["-n", &pair.a, "link", "add", "vc", "type", "veth", "peer", "name", "vd"]);
        let (vc, result) = in_netns(&pair.a, || async {
            let vc = Netlink::new().expect("Netlink::new").link("vc").await.expect("link vc");
            let result = ensure_veth_peer_napi(&vc);
            (vc, result)
        });
        assert_eq!(vc.veth_peer.and_then(|p| p.netnsid), None);
        assert_eq!(
            result.expect("ensure_veth_peer_napi"),
            PeerNapi::EnabledGro { peer_name: "vd".into(), netns: "current network namespace".into() }
        );
    }
}
