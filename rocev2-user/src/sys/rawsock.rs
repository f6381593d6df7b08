//! Sending and receiving whole Ethernet frames on one interface (AF_PACKET).
//!
//! Tests and the traffic generator need to put exact bytes on a veth and see
//! exactly what arrives on the other side, including frames the kernel stack
//! would drop (no listener on UDP 4791, foreign MACs). A packet socket bound
//! to one interface does both.

use std::{
    io,
    mem::{size_of, zeroed},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

/// Receive buffer asked for: big enough that a burst of test traffic is not
/// dropped while the receiver thread is still starting.
const RCVBUF_BYTES: libc::c_int = 8 << 20;
const ETH_ADDRS_LEN: usize = 12;
const VLAN_TAG_LEN: usize = 4;

/// An AF_PACKET / SOCK_RAW socket bound to one interface, for all protocols.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    /// Frames the kernel dropped for want of room in this socket's
    /// receive buffer, read so far (the kernel resets its count on read).
    drops: std::sync::atomic::AtomicU64,
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setsockopt_int(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` outlives the call and its size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl PacketSocket {
    /// Opens a packet socket on `ifname` (needs CAP_NET_RAW in the current
    /// network namespace). Only frames of that interface are ever queued.
    pub fn open(ifname: &str) -> io::Result<Self> {
        let ifindex = super::ifindex(ifname)?;

        // Protocol 0: the socket receives nothing until bind() names the
        // protocol and the interface, so no frame of another interface slips
        // in between socket() and bind().
        // SAFETY: plain syscall; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_err("socket(AF_PACKET, SOCK_RAW)"));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // Our own transmissions would otherwise be looped back to us as
        // PACKET_OUTGOING; recv() also filters them, for older kernels.
        let _ = setsockopt_int(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1);
        // The kernel strips VLAN tags into metadata before packet sockets see
        // the frame; auxdata gives the tag back so recv() can reinsert it.
        setsockopt_int(&fd, libc::SOL_PACKET, libc::PACKET_AUXDATA, 1)
            .map_err(|e| io::Error::new(e.kind(), format!("PACKET_AUXDATA: {e}")))?;
        // SO_RCVBUFFORCE ignores rmem_max but needs CAP_NET_ADMIN.
        if setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF_BYTES).is_err() {
            setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF_BYTES)
                .map_err(|e| io::Error::new(e.kind(), format!("SO_RCVBUF: {e}")))?;
        }

        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        addr.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `addr` is a valid sockaddr_ll and its size is passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(os_err(&format!("bind packet socket to {ifname}")));
        }
        Ok(Self { fd, ifindex, drops: Default::default() })
    }

    /// Sets the receive buffer to `bytes` (the kernel doubles it and has a
    /// floor): a small one makes a capture drop under load on purpose.
    pub fn set_receive_buffer(&self, bytes: usize) -> io::Result<()> {
        let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        setsockopt_int(&self.fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
            .or_else(|_| setsockopt_int(&self.fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes))
            .map_err(|e| io::Error::new(e.kind(), format!("SO_RCVBUF: {e}")))
    }

    /// Frames that reached this socket but were dropped because its receive
    /// buffer was full (the kernel's PACKET_STATISTICS, what tcpdump
    /// reports as "dropped by kernel"), since it was opened.
    pub fn drops(&self) -> io::Result<u64> {
        use std::sync::atomic::Ordering;
        // SAFETY: all-zero is a valid tpacket_stats.
        let mut stats: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `stats` and `len` outlive the call and describe the buffer.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(os_err("PACKET_STATISTICS"));
        }
        Ok(self.drops.fetch_add(u64::from(stats.tp_drops), Ordering::Relaxed) + u64::from(stats.tp_drops))
    }

    /// A packet socket on `ifname` that only sends: it is bound to no
    /// protocol, so the kernel never queues a received frame on it. A host
    /// sends its control frames (ACK, CNP, CTS) on one of these, with a
    /// socket buffer of its own, so they never wait behind data the data
    /// socket's full buffer holds back.
    pub fn open_sender(ifname: &str) -> io::Result<Self> {
        let ifindex = super::ifindex(ifname)?;
        // SAFETY: plain syscall; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_err("socket(AF_PACKET, SOCK_RAW)"));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = 0;
        addr.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `addr` is a valid sockaddr_ll and its size is passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(os_err(&format!("bind packet socket to {ifname}")));
        }
        Ok(Self { fd, ifindex, drops: Default::default() })
    }

    /// Limits the bytes of this socket's frames the kernel holds (in the
    /// device's qdisc, not yet sent): the depth of a NIC's send queue. A
    /// [`PacketSocket::try_send`] beyond it says `WouldBlock`.
    pub fn set_send_buffer(&self, bytes: usize) -> io::Result<()> {
        let v = bytes.min(libc::c_int::MAX as usize) as libc::c_int;
        if setsockopt_int(&self.fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
            setsockopt_int(&self.fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)
                .map_err(|e| io::Error::new(e.kind(), format!("SO_SNDBUF: {e}")))?;
        }
        Ok(())
    }

    /// Like [`PacketSocket::send`] without waiting: `WouldBlock` when the
    /// socket's send buffer is full (the NIC's queue is; try again once
    /// [`PacketSocket::wait`] says it can send).
    pub fn try_send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: `frame` is valid for reads of its length.
            let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                if n as usize != frame.len() {
                    return Err(io::Error::other(format!("sent {n} of {} bytes", frame.len())));
                }
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Waits up to `timeout` (to the microsecond) until a frame can be
    /// received or, with `writable`, until the socket can send again.
    pub fn wait(&self, timeout: Duration, writable: bool) -> io::Result<()> {
        let events = libc::POLLIN | if writable { libc::POLLOUT } else { 0 };
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events, revents: 0 };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd and a valid timespec; no signal mask.
        if unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::new(e.kind(), format!("ppoll: {e}")));
            }
        }
        Ok(())
    }

    /// One frame if one is queued now (see [`PacketSocket::recv`]).
    pub fn recv_now(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        self.try_recv(buf)
    }

    /// The kernel index of the bound interface.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Transmits one whole Ethernet frame (no FCS) on the bound interface.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: `frame` is valid for reads of its length.
            let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
            if n >= 0 {
                if n as usize != frame.len() {
                    return Err(io::Error::other(format!("sent {n} of {} bytes", frame.len())));
                }
                return Ok(());
            }
            // Returned as is: callers look at the errno (ENOBUFS is a drop
            // by the local egress, not a broken socket).
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one frame into `buf`, waiting at most `timeout`; `Ok(None)`
    /// on timeout. Frames this host transmitted are skipped, and a VLAN tag
    /// the kernel had stripped is put back, so the bytes are the ones on the
    /// wire. A frame longer than `buf` is an error (never silently cut).
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(n) = self.try_recv(buf)? {
                return Ok(Some(n));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // Round up so a sub-millisecond remainder does not busy-loop.
            let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, ms) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(io::Error::new(e.kind(), format!("poll: {e}")));
                }
            }
        }
    }

    /// One non-blocking receive: `Ok(None)` when nothing (or only our own
    /// outgoing frames) was queued.
    fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // Leave room in front of the frame for a VLAN tag to reinsert.
            if buf.len() < VLAN_TAG_LEN + ETH_ADDRS_LEN {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "receive buffer too small"));
            }
            let room = buf.len() - VLAN_TAG_LEN;
            // SAFETY: all-zero is valid for these C structs.
            let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
            let mut cmsg_buf = [0u64; 8]; // 64 bytes, 8-aligned: one auxdata cmsg
            let mut iov = libc::iovec { iov_base: buf[VLAN_TAG_LEN..].as_mut_ptr().cast(), iov_len: room };
            let mut msg: libc::msghdr = unsafe { zeroed() };
            msg.msg_name = (&mut addr as *mut libc::sockaddr_ll).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cmsg_buf.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<[u64; 8]>() as _;

            // MSG_TRUNC: return the real frame length, to detect truncation.
            // SAFETY: msg points at live buffers of the sizes given.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(io::Error::new(e.kind(), format!("recvmsg: {e}"))),
                };
            }
            if addr.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let n = n as usize;
            let vlan = vlan_from_cmsgs(&msg);
            let total = n + if vlan.is_some() { VLAN_TAG_LEN } else { 0 };
            if n > room || total > buf.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("frame of {total} bytes does not fit a {}-byte buffer", buf.len()),
                ));
            }
            if n < ETH_ADDRS_LEN {
                continue; // runt: nothing a test could mean
            }
            // The frame sits at buf[4..4+n]. Move the MAC addresses to the
            // front; with a tag, it goes between them and the ethertype, and
            // without one the rest of the frame moves up by 4 bytes.
            buf.copy_within(VLAN_TAG_LEN..VLAN_TAG_LEN + ETH_ADDRS_LEN, 0);
            match vlan {
                Some((tpid, tci)) => {
                    buf[ETH_ADDRS_LEN..ETH_ADDRS_LEN + 2].copy_from_slice(&tpid.to_be_bytes());
                    buf[ETH_ADDRS_LEN + 2..ETH_ADDRS_LEN + 4].copy_from_slice(&tci.to_be_bytes());
                }
                None => buf.copy_within(VLAN_TAG_LEN + ETH_ADDRS_LEN..VLAN_TAG_LEN + n, ETH_ADDRS_LEN),
            }
            return Ok(Some(total));
        }
    }
}

/// The (TPID, TCI) of a VLAN tag the kernel stripped, from PACKET_AUXDATA.
fn vlan_from_cmsgs(msg: &libc::msghdr) -> Option<(u16, u16)> {
    // SAFETY: msg was filled by recvmsg; the CMSG macros stay within
    // msg_control/msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_PACKET && (*cmsg).cmsg_type == libc::PACKET_AUXDATA {
                let aux: libc::tpacket_auxdata = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                if aux.tp_status & libc::TP_STATUS_VLAN_VALID == 0 {
                    return None;
                }
                let tpid = if aux.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 { aux.tp_vlan_tpid } else { 0x8100 };
                return Some((tpid, aux.tp_vlan_tci));
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_unknown_interface_fails_clearly() {
        let err = PacketSocket::open("nosuchif0").unwrap_err();
        assert!(err.to_string().contains("nosuchif0"), "{err}");
    }
}
