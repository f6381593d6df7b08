//! What the parsers need from a program context: the packet's bounds.
//! XDP and tc programs both offer direct packet access, so one parser serves
//! both.

use aya_ebpf::programs::{TcContext, XdpContext};

pub trait PacketBuf {
    /// Start and end of the directly readable (linear) part.
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Length of the whole frame, including fragments beyond the linear
    /// part (multi-buffer XDP for jumbo frames).
    fn total_len(&self) -> usize;
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
    #[inline(always)]
    fn total_len(&self) -> usize {
        // SAFETY: the helper only reads the context.
        unsafe { aya_ebpf::helpers::bpf_xdp_get_buff_len(self.ctx) as usize }
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
    #[inline(always)]
    fn total_len(&self) -> usize {
        self.len() as usize
    }
}
