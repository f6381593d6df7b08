//! What the parsers need from a program context: the packet's bounds.
//! XDP and tc programs both offer direct packet access, so one parser serves
//! both.

use aya_ebpf::programs::{TcContext, XdpContext};

pub trait PacketBuf {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
}

impl PacketBuf for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }
}

impl PacketBuf for TcContext {
    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }
}
