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
    /// Length of the whole frame when its IP packet ends at `end`, read as
    /// cheaply as that allows.
    fn len_covering(&self, end: usize) -> usize;
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
    /// A frame has fragments only when its first buffer is full, so a
    /// frame whose IP packet ends within the linear part is the linear
    /// part: no helper call (a few ns per packet) for every frame but the
    /// jumbo ones that spill into fragments.
    #[inline(always)]
    fn len_covering(&self, end: usize) -> usize {
        let linear = self.data_end() - self.data();
        if end <= linear {
            linear
        } else {
            self.total_len()
        }
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
    #[inline(always)]
    fn len_covering(&self, _end: usize) -> usize {
        self.total_len()
    }
}
