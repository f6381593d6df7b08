//! What every eBPF object of this crate carries: the license section the
//! kernel reads (GPL-compatible, for GPL-only helpers) and a panic handler.

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program; the verifier rejects code paths
    // that could get here, so there is nothing to report.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
