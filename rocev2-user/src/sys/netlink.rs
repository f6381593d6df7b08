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

/// The kernel's main routing table (RT_TABLE_MAIN), what `ip route` shows.
pub const RT_TABLE_MAIN: u32 = 254;

/// How often `resolve_neighbour` looks at the table while waiting.
pub const NEIGHBOUR_POLL: Duration = Duration::from_millis(20);
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
    /// The device this one is enslaved to (IFLA_MASTER): a bridge port's bridge.
    pub master: Option<u32>,
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
pub struct Neighbour {
    state: NeighbourState,
    mac: Option<[u8; 6]>,
}

impl Neighbour {
    /// The MAC if the kernel itself would transmit to it.
    pub fn usable_mac(&self) -> Option<[u8; 6]> {
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

    /// Name of the interface with index `ifindex`.
    async fn link_name(&self, ifindex: u32) -> Result<String> {
        let mut replies = self.handle.link().get().match_index(ifindex).execute();
        let message = replies
            .try_next()
            .await
            .with_context(|| format!("querying interface with index {ifindex}"))?
            .ok_or_else(|| anyhow!("no interface with index {ifindex}"))?;
        Ok(link_info(message).name)
    }

    /// Tells the bridge that `port` has just seen a frame from `mac`
    /// (`bridge fdb replace MAC dev PORT master use`): the learned entry's
    /// ageing starts over, as if the bridge had forwarded the frame itself.
    pub async fn refresh_fdb(&self, port: u32, mac: &[u8; 6]) -> Result<()> {
        self.handle
            .neighbours()
            .add_bridge(port, mac)
            .flags(NeighbourFlags::Use | NeighbourFlags::Controller)
            .state(NeighbourState::Reachable)
            .replace()
            .execute()
            .await
            .with_context(|| format!("refreshing the bridge FDB entry of {}", super::format_mac(mac)))
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
    pub async fn neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<Option<Neighbour>> {
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
    pub async fn use_neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<(), rtnetlink::Error> {
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
        master: None,
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
            LinkAttribute::Controller(index) if index != 0 => info.master = Some(index),
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
pub fn poke_with_datagram(device: &str, ifindex: u32, addr: IpAddr) -> Result<()> {
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
    let name = nix::net::if_::if_indextoname(ifindex).with_context(|| format!("no interface has index {ifindex}"))?;
    Ok(name.to_string_lossy().into_owned())
}

/// Moves the calling thread into the network namespace at `path`.
fn enter_netns(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    crate::sys::netns::enter(&file).with_context(|| format!("entering network namespace {}", path.display()))
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
