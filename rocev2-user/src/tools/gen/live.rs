//! XDP live frames (BPF_PROG_RUN): the fast sender, and the dispatcher
//! hold that keeps each call cheap.

#[allow(unused_imports, reason = "the parent's items and imports, of which this part uses some")]
use super::*;

/// Keeps an XDP program registered in the kernel's XDP dispatcher while it
/// lives: the program is attached to a private veth pair (`r2h<pid>.<n>`,
/// made with `ip`) that stays down, so no frame ever reaches it. Dropping
/// it deletes the pair. A killed `gen` cannot, so the next one deletes
/// every pair whose owner is gone ([`remove_orphaned_holds`]).
pub(super) struct DispatcherHold {
    name: String,
}

pub(super) const HOLD_PREFIX: &str = "r2h";

impl DispatcherHold {
    pub(super) fn new(program: &mut aya::programs::Xdp) -> Result<Self> {
        remove_orphaned_holds();
        // Unique per process and call. IFNAMSIZ allows 15 bytes: a pid is
        // at most 0x400000 (6 hex digits), so "r2h" + 6 + "." + 3 + "p" fits.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed) & 0xFFF;
        let name = format!("{HOLD_PREFIX}{:x}.{n:x}", std::process::id());
        let peer = format!("{name}p");
        crate::sys::netns::ip(&["link", "add", &name, "type", "veth", "peer", "name", &peer])
            .context("creating the veth that keeps the live-frames program in the XDP dispatcher")?;
        let hold = Self { name };
        let ifindex = crate::sys::ifindex(&hold.name).context("the dispatcher veth vanished")?;
        // The program keeps the link; deleting the veth detaches it.
        program
            .attach_to_if_index(ifindex, aya::programs::XdpMode::Driver)
            .with_context(|| format!("attaching the live-frames program to {}", hold.name))?;
        Ok(hold)
    }
}

/// The pid in a hold's name (`r2h<pid hex>.<n hex>`; not its peer, which
/// ends in `p` and goes with it).
pub(super) fn hold_owner(ifname: &str) -> Option<u32> {
    let (pid, n) = ifname.strip_prefix(HOLD_PREFIX)?.split_once('.')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(pid) && hex(n)).then(|| u32::from_str_radix(pid, 16).ok()).flatten()
}

/// Deletes the hold veths, in this namespace, of `gen` processes that no
/// longer exist (killed before they could clean up). Best effort: a
/// failure here only leaves them for the next run. "Exists" means a
/// /proc entry in this PID namespace: a hold whose pid was reused stays
/// (harmless), and a `gen` in another PID namespace sharing this network
/// namespace could lose its hold (its calls then cost ~25 ms, nothing
/// breaks).
pub(super) fn remove_orphaned_holds() {
    let Ok(json) = crate::sys::netns::ip(&["-j", "link", "show", "type", "veth"]) else { return };
    let Ok(links) = serde_json::from_str::<Vec<serde_json::Value>>(&json) else { return };
    for name in links.iter().filter_map(|l| l["ifname"].as_str()) {
        let Some(pid) = hold_owner(name) else { continue };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = crate::sys::netns::ip(&["link", "del", name]);
        }
    }
}

impl Drop for DispatcherHold {
    fn drop(&mut self) {
        let _ = crate::sys::netns::ip(&["link", "del", &self.name]);
    }
}

/// `struct xdp_md` for BPF_PROG_RUN: data 0, data_end = frame length (the
/// kernel insists), data_meta 0, the ingress interface (which XDP_TX sends
/// out of), rx queue 0, egress 0.
pub(super) fn xdp_md(frame_len: usize, ifindex: u32) -> [u8; 24] {
    let fields = [0u32, frame_len as u32, 0, ifindex, 0, 0];
    let mut out = [0u8; 24];
    for (chunk, v) in out.chunks_exact_mut(4).zip(fields) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    out
}

pub(super) fn send_live(
    args: &GenArgs,
    src_mac: [u8; 6],
    source: &mut FrameSource,
    limit: u64,
    deadline: Option<Duration>,
) -> Result<Sent> {
    let ifindex = crate::sys::ifindex(&args.dev).context("--dev")?;
    let mut tools = ToolPrograms::load().context("live-frames mode loads the generator's XDP_TX program")?;
    // Recycled live frames keep whatever a forwarder wrote into them on an
    // earlier trip (MACs, TTL): have the program restore them every time.
    let dst_mac = parse_mac(&args.dst_mac).context("--dst-mac")?;
    tools.set_gen_rewrite(dst_mac, src_mac, GEN_TTL)?;
    let program = tools.xdp(XDP_TX_PROGRAM)?;
    // Without the hold every call costs two RCU grace periods: slower and
    // with gaps, but still correct.
    let _hold = DispatcherHold::new(program)
        .map_err(|e| eprintln!("rocev2 gen: warning: {e:#}; each BPF_PROG_RUN call will take ~25 ms longer"))
        .ok();
    let start = Instant::now();
    let repeat = u64::from(args.live_repeat);
    let mut pacer = args.rate.map(Pacer::new);
    let (mut sent, mut bytes, mut runs, mut slot) = (0u64, 0u64, 0u64, 0u64);
    while !should_stop(args, sent, limit, deadline, start) {
        let n = repeat.min(limit - sent);
        if let Some(p) = pacer.as_mut() {
            p.wait(sent);
        }
        let frame = source.frame(slot);
        let ctx = xdp_md(frame.len(), ifindex);
        let result = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                ctx_in: Some(&ctx),
                repeat: n as u32,
                attrs: TestRunAttrs::new().xdp_live_frames(LIVE_BATCH),
                ..Default::default()
            })
            .with_context(|| {
                format!(
                    "BPF_PROG_RUN with live frames on {} (ifindex {ifindex}) failed; it needs kernel 5.18+ and CAP_BPF + CAP_NET_ADMIN + CAP_PERFMON",
                    args.dev
                )
            })?;
        // In live-frames mode the kernel reports no return value (always
        // 0) and no count of frames transmitted: success is all we learn.
        let _ = result;
        sent += n;
        bytes += n * frame.len() as u64;
        runs += 1;
        slot += 1;
    }
    Ok(Sent { packets: sent, bytes, prog_runs: runs, elapsed: start.elapsed() })
}
