//! Following the kernel's routing state over netlink: one socket that
//! subscribes to route, nexthop, link, address and neighbour changes, and
//! a dump of each at start (and again after the socket overflowed).
//!
//! Routes, links, addresses and neighbours are decoded with
//! netlink-packet-route; nexthop objects (RTM_NEWNEXTHOP, which zebra uses
//! for every route it installs) are not in that crate, so their few
//! attributes are read here.

use std::{
    collections::BTreeSet,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsFd,
};

use anyhow::{bail, Context as _, Result};
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload, Nla as _},
    packet_route::{
        address::AddressAttribute,
        link::LinkMessage,
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteType, RouteVia},
        RouteNetlinkMessage,
    },
    sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr},
};
use tokio::io::unix::AsyncFd;

use super::fib::{Fib, Hops, KernelRoute, Link, NexthopObject, Path, RouteKind};
use crate::control::config::Prefix;

// Multicast groups (linux/rtnetlink.h, enum rtnetlink_groups).
pub const RTNLGRP_LINK: u32 = 1;
pub const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
const RTNLGRP_NEXTHOP: u32 = 32;

// Message types (linux/rtnetlink.h).
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub const RTM_GETLINK: u16 = 18;
const RTM_GETADDR: u16 = 22;
const RTM_GETROUTE: u16 = 26;
pub const RTM_GETNEIGH: u16 = 30;
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;

// Nexthop attributes (linux/nexthop.h).
const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
const NHA_ENCAP_TYPE: u16 = 7;
/// RTA_NH_ID: a route that names a nexthop object.
const RTA_NH_ID: u16 = 30;

/// Receive buffer asked for: a 100,000-route burst from zebra must not
/// overflow it (when it does anyway, the table is dumped again).
const RECEIVE_BUFFER: usize = 64 << 20;

/// What one netlink message changed.
#[derive(Debug)]
pub enum Change {
    Route {
        route: KernelRoute,
        deleted: bool,
    },
    Nexthop(u32),
    /// A link appeared, changed or went; `flushed`: the prefixes whose
    /// routes lost nexthop objects with it ([`Fib::flush_nexthops_of`]).
    Link {
        ifindex: u32,
        flushed: BTreeSet<Prefix>,
    },
    Neighbour,
    Address,
    /// A route of another table, or a message of no interest.
    None,
}

/// The subscribed socket.
pub struct EventSocket {
    fd: AsyncFd<Socket>,
    buffer: Vec<u8>,
}

impl EventSocket {
    /// Subscribes in the current network namespace to what the route
    /// mirror follows.
    pub fn open() -> Result<Self> {
        Self::open_groups(&[
            RTNLGRP_LINK,
            RTNLGRP_NEIGH,
            RTNLGRP_IPV4_IFADDR,
            RTNLGRP_IPV4_ROUTE,
            RTNLGRP_IPV6_IFADDR,
            RTNLGRP_IPV6_ROUTE,
            RTNLGRP_NEXTHOP,
        ])
    }

    /// Subscribes in the current network namespace to `groups`.
    pub fn open_groups(groups: &[u32]) -> Result<Self> {
        let socket = subscribe(groups)?;
        socket.set_non_blocking(true)?;
        // SAFETY: the socket is owned by the AsyncFd from here on and its
        // fd stays open (and registered) exactly as long as the AsyncFd.
        let fd = unsafe { AsyncFd::register(socket) }
            .map_err(|e| anyhow::anyhow!("cannot register the netlink socket: {}", e.into_parts().1))?;
        Ok(Self { fd, buffer: vec![0; 1 << 20] })
    }

    /// Waits for messages and returns every datagram that is ready (the
    /// caller applies them as one batch). `Err` with ENOBUFS means events
    /// were lost: the caller must dump the tables again.
    pub async fn receive(&mut self) -> io::Result<Vec<Vec<u8>>> {
        loop {
            let mut guard = self.fd.readable().await?;
            let (out, emptied) = drain(guard.get_inner(), &mut self.buffer, BATCH, 0)?;
            if emptied {
                guard.clear_ready();
            }
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }

    /// Every datagram that is waiting now (none: an empty list).
    pub fn ready_now(&mut self) -> io::Result<Vec<Vec<u8>>> {
        drain(self.fd.get_ref(), &mut self.buffer, usize::MAX, 0).map(|(out, _)| out)
    }
}

/// A subscription to link, route and nexthop object changes read by a
/// thread that waits on it itself (no async runtime): the churn soak
/// follows each switch's kernel paths with it, change by change.
pub struct WaitingEventSocket {
    socket: Socket,
    buffer: Vec<u8>,
}

impl WaitingEventSocket {
    /// Subscribes in the current network namespace; [`Self::receive`]
    /// waits at most `timeout` for a message.
    pub fn open(timeout: std::time::Duration) -> Result<Self> {
        use nix::sys::{socket::sockopt, time::TimeVal};
        let socket = subscribe(&[RTNLGRP_LINK, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_NEXTHOP])?;
        let wait = TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
        nix::sys::socket::setsockopt(&socket, sockopt::ReceiveTimeout, &wait)
            .context("cannot set the netlink socket's receive timeout")?;
        Ok(Self { socket, buffer: vec![0; 1 << 20] })
    }

    /// Waits for the next datagram (at most the timeout) and returns it
    /// with every other one already waiting; none when the wait timed out
    /// or a signal interrupted it.
    /// `Err` with ENOBUFS: messages were lost, dump the tables again.
    pub fn receive(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let first = match self.socket.recv(&mut &mut self.buffer[..], 0) {
            Ok(n) => self.buffer[..n].to_vec(),
            // A signal interrupted the wait (a socket with a receive
            // timeout is never restarted): the caller waits again.
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        let (mut out, _) = drain(&self.socket, &mut self.buffer, usize::MAX, libc::MSG_DONTWAIT)?;
        out.insert(0, first);
        Ok(out)
    }
}

/// Datagrams one batch holds at most, so a long burst is applied in steps.
const BATCH: usize = 4096;

/// Reads the datagrams waiting on the socket (non-blocking, or read with
/// `flags` MSG_DONTWAIT), up to `limit`; says whether it read until none
/// was left.
fn drain(socket: &Socket, buffer: &mut [u8], limit: usize, flags: libc::c_int) -> io::Result<(Vec<Vec<u8>>, bool)> {
    let mut out = Vec::new();
    while out.len() < limit {
        match socket.recv(&mut &mut buffer[..], flags) {
            Ok(n) => out.push(buffer[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((out, true)),
            Err(e) => return Err(e),
        }
    }
    Ok((out, false))
}

/// A netlink route socket bound and subscribed to `groups`, with the
/// large receive buffer a burst of changes needs.
fn subscribe(groups: &[u32]) -> Result<Socket> {
    let mut socket = Socket::new(NETLINK_ROUTE).context("cannot open a netlink socket")?;
    socket.bind_auto().context("cannot bind the netlink socket")?;
    force_receive_buffer(&socket, RECEIVE_BUFFER);
    for &group in groups {
        socket.add_membership(group).with_context(|| format!("cannot join netlink group {group}"))?;
    }
    Ok(socket)
}

/// SO_RCVBUFFORCE (we run privileged), else SO_RCVBUF up to the sysctl cap.
fn force_receive_buffer(socket: &impl AsFd, bytes: usize) {
    use nix::sys::socket::{setsockopt, sockopt};
    if setsockopt(socket, sockopt::RcvBufForce, &bytes).is_err() {
        let _ = setsockopt(socket, sockopt::RcvBuf, &bytes);
    }
}

/// Dumps links, addresses, neighbours, nexthop objects and routes into
/// `fib` (in that order, so routes find what they refer to). Returns the
/// number of routes of `table` read.
pub fn dump_all(fib: &mut Fib, table: u32) -> Result<usize> {
    let mut dumper = Dumper::open()?;
    fib.links.clear();
    fib.local.clear();
    fib.neighbours.clear();
    fib.nexthops.clear();
    fib.routes.clear();
    let mut routes = 0;
    // (type, header size): ifinfomsg 16, ifaddrmsg 8, ndmsg 12, nhmsg 8, rtmsg 12.
    for (kind, header_len) in
        [(RTM_GETLINK, 16), (RTM_GETADDR, 8), (RTM_GETNEIGH, 12), (RTM_GETNEXTHOP, 8), (RTM_GETROUTE, 12)]
    {
        let dumped = dumper.dump(kind, AF_UNSPEC, header_len, |message_type, message| {
            if let Change::Route { .. } = apply(fib, table, message_type, message) {
                routes += 1;
            }
        });
        match dumped {
            // A kernel without nexthop objects answers their dump with
            // EINVAL/EOPNOTSUPP: nothing to read.
            Err(DumpError::Refused(_)) if kind == RTM_GETNEXTHOP => {}
            Err(e) => bail!("netlink dump {kind} failed: {e}"),
            Ok(()) => {}
        }
    }
    Ok(routes)
}

/// `AF_UNSPEC`: a dump of every family.
pub const AF_UNSPEC: u8 = 0;

/// Why a dump stopped.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The kernel answered the request with an error.
    #[error("{0}")]
    Refused(io::Error),
    #[error("{0:#}")]
    Socket(anyhow::Error),
}

/// A netlink socket for dumps (requests answered with one message per
/// object, then NLMSG_DONE).
pub struct Dumper {
    socket: Socket,
    buffer: Vec<u8>,
}

impl Dumper {
    pub fn open() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE).context("cannot open a netlink socket")?;
        socket.bind_auto()?;
        force_receive_buffer(&socket, RECEIVE_BUFFER);
        Ok(Self { socket, buffer: vec![0u8; 1 << 20] })
    }

    /// Dumps message type `kind` of `family` (the first byte of its
    /// `header_len`-byte header), handing each (type, message) to `each`.
    pub fn dump(
        &mut self,
        kind: u16,
        family: u8,
        header_len: usize,
        mut each: impl FnMut(u16, &[u8]),
    ) -> Result<(), DumpError> {
        let mut request = vec![0u8; 16 + header_len];
        let len = request.len() as u32;
        request[0..4].copy_from_slice(&len.to_ne_bytes());
        request[4..6].copy_from_slice(&kind.to_ne_bytes());
        request[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        request[8..12].copy_from_slice(&u32::from(kind).to_ne_bytes()); // sequence
        request[16] = family;
        self.socket
            .send_to(&request, &SocketAddr::new(0, 0), 0)
            .context("cannot send a netlink dump request")
            .map_err(DumpError::Socket)?;
        loop {
            let n = self
                .socket
                .recv(&mut &mut self.buffer[..], 0)
                .context("cannot read a netlink dump")
                .map_err(DumpError::Socket)?;
            for (message_type, message) in messages(&self.buffer[..n]) {
                match message_type {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = message.get(16..20).map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap()));
                        if errno != 0 {
                            return Err(DumpError::Refused(io::Error::from_raw_os_error(-errno)));
                        }
                    }
                    _ => each(message_type, message),
                }
            }
        }
    }
}

/// The (type, whole message) pairs of a datagram.
pub fn messages(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let len = u32::from_ne_bytes(data[0..4].try_into().unwrap()) as usize;
        if len < 16 || len > data.len() {
            break;
        }
        let kind = u16::from_ne_bytes(data[4..6].try_into().unwrap());
        out.push((kind, &data[..len]));
        data = &data[(len + 3) & !3..];
    }
    out
}

/// Applies one message to `fib` and says what it changed.
pub fn apply(fib: &mut Fib, table: u32, message_type: u16, message: &[u8]) -> Change {
    if message_type == RTM_NEWNEXTHOP || message_type == RTM_DELNEXTHOP {
        return match parse_nexthop(&message[16..]) {
            Some((id, object)) => {
                if message_type == RTM_DELNEXTHOP {
                    fib.nexthops.remove(&id);
                } else {
                    fib.nexthops.insert(id, object);
                }
                Change::Nexthop(id)
            }
            None => Change::None,
        };
    }
    let Ok(parsed) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(message) else { return Change::None };
    let NetlinkPayload::InnerMessage(inner) = parsed.payload else { return Change::None };
    match inner {
        RouteNetlinkMessage::NewRoute(m) | RouteNetlinkMessage::DelRoute(m) => {
            let deleted = message_type == 25; // RTM_DELROUTE
            match route_of(&m, table) {
                Some(route) => {
                    if deleted {
                        fib.remove_route(&route);
                    } else {
                        fib.add_route(route.clone());
                    }
                    Change::Route { route, deleted }
                }
                None => Change::None,
            }
        }
        RouteNetlinkMessage::NewLink(m) => {
            let ifindex = m.header.index;
            let link = link_of(m);
            // Down or without carrier: the kernel has flushed its nexthop objects.
            let flushed = if link.up { BTreeSet::new() } else { fib.flush_nexthops_of(ifindex) };
            fib.links.insert(ifindex, link);
            Change::Link { ifindex, flushed }
        }
        RouteNetlinkMessage::DelLink(m) => {
            let ifindex = m.header.index;
            fib.links.remove(&ifindex);
            Change::Link { ifindex, flushed: fib.flush_nexthops_of(ifindex) }
        }
        RouteNetlinkMessage::NewNeighbour(m) => {
            if let Some((key, mac)) = neighbour_of(&m) {
                match mac {
                    Some(mac) => fib.neighbours.insert(key, mac),
                    None => fib.neighbours.remove(&key),
                };
                return Change::Neighbour;
            }
            Change::None
        }
        RouteNetlinkMessage::DelNeighbour(m) => {
            if let Some((key, _)) = neighbour_of(&m) {
                fib.neighbours.remove(&key);
                return Change::Neighbour;
            }
            Change::None
        }
        RouteNetlinkMessage::NewAddress(m) | RouteNetlinkMessage::DelAddress(m) => {
            let deleted = matches!(message_type, 21); // RTM_DELADDR
            for a in m.attributes {
                // IFA_LOCAL is the box's own address on point-to-point
                // links, IFA_ADDRESS elsewhere; both are ours.
                if let AddressAttribute::Address(ip) | AddressAttribute::Local(ip) = a {
                    if deleted {
                        fib.local.remove(&ip);
                    } else {
                        fib.local.insert(ip);
                    }
                }
            }
            Change::Address
        }
        _ => Change::None,
    }
}

fn link_of(m: LinkMessage) -> Link {
    let info = crate::sys::netlink::link_info(m);
    // A link without an Ethernet address (loopback, tun, wireguard) cannot
    // take an XDP redirect of an Ethernet frame.
    let mac = (info.mac != [0; 6]).then_some(info.mac);
    Link { name: info.name, mac, up: info.up && info.carrier }
}

/// A neighbour entry: (ifindex, address) and its MAC if it is usable.
type NeighbourEntry = ((u32, IpAddr), Option<[u8; 6]>);

fn neighbour_of(m: &NeighbourMessage) -> Option<NeighbourEntry> {
    let mut addr = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => addr = Some(IpAddr::V4(*ip)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => addr = Some(IpAddr::V6(*ip)),
            NeighbourAttribute::LinkLocalAddress(bytes) => mac = <[u8; 6]>::try_from(bytes.as_slice()).ok(),
            _ => {}
        }
    }
    use NeighbourState as S;
    let usable = matches!(m.header.state, S::Reachable | S::Stale | S::Delay | S::Probe | S::Permanent | S::Noarp);
    Some(((m.header.ifindex, addr?), mac.filter(|_| usable)))
}

fn route_of(m: &RouteMessage, table: u32) -> Option<KernelRoute> {
    let mut route_table = u32::from(m.header.table);
    let mut dst: Option<IpAddr> = None;
    let mut gateway: Option<IpAddr> = None;
    let mut oif = 0u32;
    let mut metric = 0u32;
    let mut encap = false;
    let mut multipath = None;
    let mut object = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => route_table = *t,
            RouteAttribute::Destination(d) => dst = route_address(d),
            RouteAttribute::Gateway(g) => gateway = route_address(g),
            RouteAttribute::Via(RouteVia::Inet(v)) => gateway = Some(IpAddr::V4(*v)),
            RouteAttribute::Via(RouteVia::Inet6(v)) => gateway = Some(IpAddr::V6(*v)),
            RouteAttribute::Oif(i) => oif = *i,
            RouteAttribute::Priority(p) => metric = *p,
            RouteAttribute::EncapType(_) | RouteAttribute::Encap(_) => encap = true,
            RouteAttribute::MultiPath(hops) => multipath = Some(hops),
            RouteAttribute::Other(nla) if nla.kind() == RTA_NH_ID => {
                let mut v = [0u8; 4];
                nla.emit_value(&mut v);
                object = Some(u32::from_ne_bytes(v));
            }
            _ => {}
        }
    }
    if route_table != table {
        return None;
    }
    let family_v4 = m.header.address_family == rtnetlink::packet_route::AddressFamily::Inet;
    let unspecified = if family_v4 { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
    let prefix = Prefix::of(dst.unwrap_or(unspecified), m.header.destination_prefix_length)?;
    let kind = match m.header.kind {
        RouteType::Unicast => RouteKind::Unicast,
        RouteType::BlackHole | RouteType::Unreachable | RouteType::Prohibit | RouteType::Throw => RouteKind::Reject,
        _ => RouteKind::Other,
    };
    let hops = if let Some(id) = object {
        Hops::Object(id)
    } else if let Some(list) = multipath {
        Hops::Paths(
            list.iter()
                .map(|h| {
                    let mut gw = None;
                    let mut encap = false;
                    for a in &h.attributes {
                        match a {
                            RouteAttribute::Gateway(g) => gw = route_address(g),
                            RouteAttribute::Via(RouteVia::Inet(v)) => gw = Some(IpAddr::V4(*v)),
                            RouteAttribute::Via(RouteVia::Inet6(v)) => gw = Some(IpAddr::V6(*v)),
                            RouteAttribute::EncapType(_) | RouteAttribute::Encap(_) => encap = true,
                            _ => {}
                        }
                    }
                    Path { oif: h.interface_index, gateway: gw, weight: u32::from(h.hops) + 1, encap }
                })
                .collect(),
        )
    } else if oif != 0 {
        Hops::Paths(vec![Path { oif, gateway, weight: 1, encap }])
    } else {
        Hops::Paths(Vec::new())
    };
    Some(KernelRoute { prefix, metric, kind, hops })
}

fn route_address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

/// Reads a nexthop object message body (struct nhmsg + attributes).
fn parse_nexthop(body: &[u8]) -> Option<(u32, NexthopObject)> {
    let family = *body.first()?;
    let mut id = None;
    let mut oif = 0u32;
    let mut gateway = None;
    let mut blackhole = false;
    let mut encap = false;
    let mut group = None;
    let mut attrs = body.get(8..)?;
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        let value = &attrs[4..len];
        match kind {
            NHA_ID => id = value.get(..4).map(|v| u32::from_ne_bytes(v.try_into().unwrap())),
            NHA_OIF => oif = value.get(..4).map_or(0, |v| u32::from_ne_bytes(v.try_into().unwrap())),
            NHA_BLACKHOLE => blackhole = true,
            NHA_ENCAP_TYPE => encap = true,
            NHA_GATEWAY => {
                gateway = match (family, value.len()) {
                    (_, 4) => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(value).ok()?))),
                    (_, 16) => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(value).ok()?))),
                    _ => None,
                }
            }
            NHA_GROUP => {
                // struct nexthop_grp { u32 id; u8 weight; u8 weight_high; u16 resvd2 }:
                // the weight is (weight_high << 8 | weight) + 1.
                group = Some(
                    value
                        .chunks_exact(8)
                        .map(|c| {
                            let member = u32::from_ne_bytes(c[0..4].try_into().unwrap());
                            let weight = (u32::from(c[5]) << 8 | u32::from(c[4])) + 1;
                            (member, weight)
                        })
                        .collect(),
                );
            }
            _ => {}
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    let object = match group {
        Some(members) => NexthopObject::Group { members },
        None if blackhole => NexthopObject::Single { path: None, blackhole: true },
        None if oif != 0 => NexthopObject::Single { path: Some(Path { oif, gateway, weight: 1, encap }), blackhole },
        None => NexthopObject::Single { path: None, blackhole: false },
    };
    Some((id?, object))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len();
        let mut out = (len as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    #[test]
    fn parses_a_nexthop_group_with_weights() {
        let mut body = vec![0u8; 8];
        body.extend(attr(NHA_ID, &14u32.to_ne_bytes()));
        let mut grp = Vec::new();
        for (id, w) in [(12u32, 0u8), (13, 2)] {
            grp.extend(id.to_ne_bytes());
            grp.extend([w, 0, 0, 0]);
        }
        body.extend(attr(NHA_GROUP, &grp));
        let (id, object) = parse_nexthop(&body).unwrap();
        assert_eq!(id, 14);
        assert_eq!(object, NexthopObject::Group { members: vec![(12, 1), (13, 3)] });
    }

    #[test]
    fn parses_a_single_nexthop_with_a_link_local_gateway() {
        let mut body = vec![10u8, 0, 0, 0, 0, 0, 0, 0]; // AF_INET6
        body.extend(attr(NHA_ID, &12u32.to_ne_bytes()));
        body.extend(attr(NHA_OIF, &3u32.to_ne_bytes()));
        body.extend(attr(NHA_GATEWAY, &"fe80::1".parse::<Ipv6Addr>().unwrap().octets()));
        let (_, object) = parse_nexthop(&body).unwrap();
        let NexthopObject::Single { path: Some(p), blackhole: false } = object else { panic!("{object:?}") };
        assert_eq!((p.oif, p.gateway), (3, Some("fe80::1".parse().unwrap())));
    }
}
