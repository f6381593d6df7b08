//! RDMA hosts as small virtual machines: Debian's kernel with Soft-RoCE
//! (rxe) under qemu (TCG emulation: no KVM needed), so a real RDMA stack,
//! which nobody here wrote, talks through the switch.
//!
//! A guest boots the [`RDMA_GUEST`] tree (built once, see
//! [`crate::testbed::debian_tree`]) as its read-only 9p root. Its one NIC is a
//! tap device that must already exist in the guest's network namespace
//! (the lab bridges it to the host's link). Per guest, a directory on the
//! host holds the serial console's log, qemu's log and the exchange
//! directory (`xchg/`, the guest's /mnt over 9p): the host writes the boot
//! script and `guest.conf` there, the guest writes `ready` once rxe0 is
//! up and then runs the commands the host drops in `cmd/` (output and exit
//! status in `job/`). No network, ssh or agent package is needed for that.
//!
//! Waiting is measured in the guest's own CPU time (the qemu process's) as
//! well as wall time: on a loaded machine an emulated guest gets less CPU,
//! and a deadline in wall time alone would fail a guest that is merely
//! slow, not stuck.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

pub use crate::testbed::debian_tree::RDMA_GUEST;
use crate::{sys::signal_process, testbed::debian_tree::tail};

pub const QEMU: &str = "qemu-system-x86_64";
/// Enough for rxe and perftest with a few QPs (measured: see the README).
pub const DEFAULT_MEMORY_MIB: u32 = 256;
/// TCG's translated-code cache: qemu's default (1 GiB) would let a guest's
/// host memory grow far beyond its RAM; this keeps it near.
const TB_CACHE_MIB: u32 = 64;
/// The boot script and the exit status of every command in the guest.
const GUEST_INIT: &str = include_str!("guest/guest-init.sh");

/// Everything needed to boot one guest.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    /// Its hostname, and qemu's `-name`.
    pub name: String,
    /// The network namespace qemu runs in, where `tap` is.
    pub netns: String,
    pub tap: String,
    pub mac: [u8; 6],
    /// CIDR addresses of the guest's NIC.
    pub addrs: Vec<String>,
    pub gateway_v4: Option<String>,
    pub gateway_v6: Option<String>,
    pub memory_mib: u32,
    /// Where its console log, qemu log and exchange directory go (made here).
    pub dir: PathBuf,
}

/// A running guest: enough to find it again from another process (a lab record).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Guest {
    pub name: String,
    pub netns: String,
    pub pid: u32,
    pub dir: PathBuf,
    /// When qemu started (milliseconds since the Unix epoch).
    #[serde(default)]
    pub started_ms: u64,
    /// How its boot went, once it is ready.
    #[serde(default)]
    pub boot: Option<BootReport>,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How long a wait may take: `guest_cpu` of the guest's CPU time (qemu's),
/// and never more than `wall` (for a guest that idles, waiting for
/// packets that do not come).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub guest_cpu: Duration,
    pub wall: Duration,
}

impl Budget {
    pub const fn secs(guest_cpu: u64, wall: u64) -> Self {
        Self { guest_cpu: Duration::from_secs(guest_cpu), wall: Duration::from_secs(wall) }
    }
}

/// How a boot went, measured on both sides.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BootReport {
    /// From qemu's start to the host seeing the guest's `ready`.
    pub wall_s: f64,
    /// qemu's CPU time (user + system) until then.
    pub cpu_s: f64,
    /// The guest kernel's uptime when it was ready.
    pub guest_uptime_s: f64,
    /// The guest's memory as it sees it.
    pub mem_total_kib: u64,
    pub mem_available_kib: u64,
    /// qemu's resident memory on the host.
    pub qemu_rss_kib: u64,
    /// The state of rxe0's port (`4: ACTIVE`).
    pub rxe_state: String,
}

fn format_mac(mac: &[u8; 6]) -> String {
    crate::sys::format_mac(mac)
}

impl Guest {
    /// Writes the guest's boot files and starts qemu in `spec.netns`
    /// (returns at once; see [`Guest::wait_ready`]). The tree must hold the
    /// rdma-guest recipe's kernel and initramfs.
    pub fn start(spec: &GuestSpec, tree: &Path) -> Result<Self> {
        let kernel = tree.join("boot/rocev2-vmlinuz");
        let initrd = tree.join("boot/rocev2-initrd.img");
        for f in [&kernel, &initrd] {
            if !f.exists() {
                bail!("{} is missing: {} is not an rdma-guest tree", f.display(), tree.display());
            }
        }
        let xchg = spec.dir.join("xchg");
        // A directory left by an earlier boot of this guest holds stale
        // jobs and a stale `ready`.
        match fs::remove_dir_all(&xchg) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", xchg.display()))
            }
            _ => {}
        }
        fs::create_dir_all(&xchg).with_context(|| format!("cannot create {}", xchg.display()))?;
        fs::write(xchg.join("init"), GUEST_INIT)?;
        fs::write(xchg.join("guest.conf"), guest_conf(spec))?;
        let console = spec.dir.join("console.log");
        let qemu_log = fs::File::create(spec.dir.join("qemu.log"))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &spec.netns, QEMU]);
        cmd.args(qemu_args(spec, tree, &kernel, &initrd, &xchg, &console));
        cmd.stdin(Stdio::null()).stdout(qemu_log.try_clone()?).stderr(qemu_log);
        // Its own process group: a Ctrl-C meant for the command that
        // started it does not reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().with_context(|| format!("cannot start {QEMU} (`cargo xtask setup` installs it)"))?;
        Ok(Self {
            name: spec.name.clone(),
            netns: spec.netns.clone(),
            pid: child.id(),
            dir: spec.dir.clone(),
            started_ms: unix_ms(),
            boot: None,
        })
    }

    pub fn xchg(&self) -> PathBuf {
        self.dir.join("xchg")
    }

    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// Whether qemu still runs.
    pub fn alive(&self) -> bool {
        crate::sys::process_alive(self.pid)
    }

    /// qemu's CPU time so far (user + system).
    pub fn cpu_time(&self) -> Duration {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        // Fields after the command name: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// qemu's resident memory (VmRSS), in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Why the guest is gone, for an error: qemu's log and the console's last lines.
    pub fn post_mortem(&self) -> String {
        format!(
            "guest {} (qemu pid {}) is not running.\nqemu: {}\nconsole ({}):\n{}",
            self.name,
            self.pid,
            tail(&self.dir.join("qemu.log"), 5),
            self.console().display(),
            tail(&self.console(), 20)
        )
    }

    /// Waits until the guest wrote `ready` (rxe0 set up, agent running).
    pub fn wait_ready(&self, budget: Budget) -> Result<BootReport> {
        let ready = self.xchg().join("ready");
        let mut wait = Wait::new(self, budget);
        loop {
            if let Ok(text) = fs::read_to_string(&ready) {
                let kv: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once(' ')).collect();
                let num = |k: &str| kv.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                return Ok(BootReport {
                    wall_s: unix_ms().saturating_sub(self.started_ms) as f64 / 1000.0,
                    cpu_s: self.cpu_time().as_secs_f64(),
                    guest_uptime_s: num("uptime_s"),
                    mem_total_kib: num("mem_total_kib") as u64,
                    mem_available_kib: num("mem_available_kib") as u64,
                    qemu_rss_kib: self.rss_kib(),
                    rxe_state: kv.get("rxe_state").unwrap_or(&"").to_string(),
                });
            }
            wait.tick(|| format!("guest {} to boot (console: {})", self.name, tail(&self.console(), 10)))?;
        }
    }

    /// Starts `script` (sh) in the guest; returns at once.
    pub fn spawn(&self, script: &str) -> Result<GuestJob> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let id = format!("{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let cmd = self.xchg().join("cmd");
        fs::create_dir_all(&cmd)?;
        let tmp = cmd.join(format!("{id}.tmp"));
        fs::write(&tmp, script)?;
        // The agent takes only *.sh: it never sees a half-written script.
        fs::rename(&tmp, cmd.join(format!("{id}.sh")))?;
        Ok(GuestJob { guest: self.clone(), id })
    }

    /// Runs `script` in the guest and returns its stdout; fails (with its
    /// stderr) if it exits non-zero.
    pub fn run(&self, script: &str, budget: Budget) -> Result<String> {
        let out = self.spawn(script)?.wait(budget)?;
        out.success()?;
        Ok(out.stdout)
    }

    /// Stops qemu (SIGTERM, then SIGKILL after 5 s).
    pub fn stop(&self) {
        if !self.alive() {
            return;
        }
        let _ = signal_process(self.pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.alive() {
            let _ = signal_process(self.pid, Signal::SIGKILL);
        }
    }

    /// rxe0's port counters (`hw_counters`), the RoCE packets delivered to
    /// it and the guest's qdisc drops (see [`RxeCounters::rxe_discarded`]).
    pub fn rxe_counters(&self) -> Result<RxeCounters> {
        let out = self.run(RXE_COUNTERS_SCRIPT, Budget::secs(30, 120))?;
        RxeCounters::parse(&out)
    }

    /// The RoCE v2 GID table entries of rxe0 port 1: (index, GID).
    pub fn roce_v2_gids(&self) -> Result<Vec<(u32, std::net::Ipv6Addr)>> {
        let out = self.run(GIDS_SCRIPT, Budget::secs(30, 120))?;
        Ok(parse_gids(&out))
    }
}

/// The guest's side of a wait: fails when its budget is spent or qemu is gone.
struct Wait<'a> {
    guest: &'a Guest,
    budget: Budget,
    started: Instant,
    cpu_at_start: Duration,
}

impl<'a> Wait<'a> {
    fn new(guest: &'a Guest, budget: Budget) -> Self {
        Self { guest, budget, started: Instant::now(), cpu_at_start: guest.cpu_time() }
    }

    /// Sleeps a little; an error once the guest died or the budget is spent.
    fn tick(&mut self, what: impl Fn() -> String) -> Result<()> {
        if !self.guest.alive() {
            bail!("while waiting for {}: {}", what(), self.guest.post_mortem());
        }
        let cpu = self.guest.cpu_time().saturating_sub(self.cpu_at_start);
        if cpu > self.budget.guest_cpu || self.started.elapsed() > self.budget.wall {
            bail!(
                "gave up waiting for {} after {:.1} s ({:.1} s of the guest's CPU time; budget {:?} CPU, {:?} wall)",
                what(),
                self.started.elapsed().as_secs_f64(),
                cpu.as_secs_f64(),
                self.budget.guest_cpu,
                self.budget.wall
            );
        }
        std::thread::sleep(Duration::from_millis(50));
        Ok(())
    }
}

/// A command running in a guest.
#[derive(Clone, Debug)]
pub struct GuestJob {
    pub guest: Guest,
    pub id: String,
}

/// What a finished command printed and returned.
#[derive(Clone, Debug)]
pub struct JobOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl JobOutput {
    /// An error (with both outputs) unless the command exited 0.
    pub fn success(&self) -> Result<()> {
        if self.status != 0 {
            bail!("exit status {}\nstdout:\n{}\nstderr:\n{}", self.status, self.stdout, self.stderr);
        }
        Ok(())
    }
}

impl GuestJob {
    fn file(&self, ext: &str) -> PathBuf {
        self.guest.xchg().join("job").join(format!("{}.{ext}", self.id))
    }

    /// The exit status, once the command ended.
    pub fn status(&self) -> Option<i32> {
        fs::read_to_string(self.file("rc")).ok()?.trim().parse().ok()
    }

    /// What it printed so far on stdout.
    pub fn stdout(&self) -> String {
        fs::read_to_string(self.file("out")).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(self.file("err")).unwrap_or_default()
    }

    /// Waits for the command to end.
    pub fn wait(&self, budget: Budget) -> Result<JobOutput> {
        self.wait_streaming(budget, |_, _| {})
    }

    /// Waits for the command to end, handing `output` what it prints as it
    /// comes (`true` for stderr).
    pub fn wait_streaming(&self, budget: Budget, mut output: impl FnMut(&[u8], bool)) -> Result<JobOutput> {
        let mut wait = Wait::new(&self.guest, budget);
        let mut shown = [0, 0];
        loop {
            // The status first: output read after it is complete.
            let status = self.status();
            let (out, err) = self.new_output(&mut shown);
            for (bytes, is_err) in [(out, false), (err, true)] {
                if !bytes.is_empty() {
                    output(&bytes, is_err);
                }
            }
            if let Some(status) = status {
                return Ok(JobOutput { status, stdout: self.stdout(), stderr: self.stderr() });
            }
            wait.tick(|| {
                format!(
                    "`{}` in guest {}; its output so far:\n{}{}",
                    self.script(),
                    self.guest.name,
                    self.stdout(),
                    self.stderr()
                )
            })?;
        }
    }

    /// What it printed on (stdout, stderr) beyond the byte counts in
    /// `shown`, which move on.
    pub fn new_output(&self, shown: &mut [usize; 2]) -> (Vec<u8>, Vec<u8>) {
        let mut new = [Vec::new(), Vec::new()];
        for (i, ext) in ["out", "err"].iter().enumerate() {
            if let Ok(bytes) = fs::read(self.file(ext)) {
                if bytes.len() > shown[i] {
                    new[i] = bytes[shown[i]..].to_vec();
                    shown[i] = bytes.len();
                }
            }
        }
        let [out, err] = new;
        (out, err)
    }

    fn script(&self) -> String {
        let script = fs::read_to_string(self.file("sh"))
            .or_else(|_| fs::read_to_string(self.guest.xchg().join("cmd").join(format!("{}.sh", self.id))))
            .unwrap_or_default();
        script.trim().lines().next().unwrap_or("").chars().take(120).collect()
    }

    /// Sends `signal` (e.g. "TERM", "INT") to the command's session.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let sig = self.guest.xchg().join("sig");
        fs::create_dir_all(&sig)?;
        fs::write(sig.join(&self.id), signal)?;
        Ok(())
    }
}

/// The variables the boot script reads.
fn guest_conf(spec: &GuestSpec) -> String {
    let mut t = String::from("# Written by rocev2 for this boot; read by /mnt/init.\n");
    let _ = writeln!(t, "GUEST_NAME='{}'", spec.name);
    let _ = writeln!(t, "GUEST_MAC='{}'", format_mac(&spec.mac));
    let _ = writeln!(t, "GUEST_ADDRS='{}'", spec.addrs.join(" "));
    let _ = writeln!(t, "GUEST_GW4='{}'", spec.gateway_v4.as_deref().unwrap_or(""));
    let _ = writeln!(t, "GUEST_GW6='{}'", spec.gateway_v6.as_deref().unwrap_or(""));
    t
}

fn qemu_args(spec: &GuestSpec, tree: &Path, kernel: &Path, initrd: &Path, xchg: &Path, console: &Path) -> Vec<String> {
    let p = |p: &Path| p.display().to_string();
    #[rustfmt::skip]
    let args = vec![
        "-name".into(), spec.name.clone(),
        "-machine".into(), "q35".into(),
        "-accel".into(), format!("tcg,tb-size={TB_CACHE_MIB}"),
        "-cpu".into(), "max".into(),
        "-smp".into(), "1".into(),
        "-m".into(), spec.memory_mib.to_string(),
        "-nodefaults".into(), "-no-user-config".into(), "-display".into(), "none".into(),
        // A guest that powers off or panics (panic=-1 reboots) ends qemu.
        "-no-reboot".into(),
        "-chardev".into(), format!("file,id=console,path={}", p(console)),
        "-serial".into(), "chardev:console".into(),
        "-kernel".into(), p(kernel),
        "-initrd".into(), p(initrd),
        // no_timer_check: an emulated CPU on a busy host can miss the
        // kernel's early timer-interrupt test, which then panics ("IO-APIC
        // + timer doesn't work!").
        "-append".into(), "console=ttyS0 quiet panic=-1 no_timer_check".into(),
        "-fsdev".into(), format!("local,id=root,path={},security_model=none,readonly=on", p(tree)),
        "-device".into(), "virtio-9p-pci,fsdev=root,mount_tag=rootfs".into(),
        "-fsdev".into(), format!("local,id=xchg,path={},security_model=none", p(xchg)),
        "-device".into(), "virtio-9p-pci,fsdev=xchg,mount_tag=xchg".into(),
        "-netdev".into(), format!("tap,id=net0,ifname={},script=no,downscript=no", spec.tap),
        // No checksum offload either way: a frame leaves the guest
        // complete, as from a NIC, for a switch that forwards it in XDP
        // (where nobody would finish a partial checksum).
        "-device".into(), format!("virtio-net-pci,netdev=net0,mac={},csum=off,guest_csum=off", format_mac(&spec.mac)),
    ];
    args
}

/// rxe's counters; its ICRC checks by outcome (the boot script's return
/// probe on rxe_icrc_check: rxe itself, in Linux 6.1, drops a bad packet
/// without a counter or a log line); the RoCE packets the guest's UDP
/// delivered to rxe (the kernel counts a datagram an encapsulation socket
/// takes in InDatagrams); and what the guest's own qdisc dropped (sent by
/// rxe, never on the wire).
const RXE_COUNTERS_SCRIPT: &str = r#"
for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do echo "${f##*/} $(cat "$f")"; done
h=/sys/kernel/tracing/events/rocev2/icrc/hist
[ -r $h ] && sed -n 's/^{ ret: *\([0-9]*\) } hitcount: *\([0-9]*\)$/\1 \2/p' $h |
	awk '{ if ($1 == 0) ok += $2; else bad += $2 } END { print "icrc_ok", ok + 0; print "icrc_errors", bad + 0 }'
v4=$(awk '/^Udp: [0-9]/ { print $2 }' /proc/net/snmp)
v6=$(awk '$1 == "Udp6InDatagrams" { print $2 }' /proc/net/snmp6)
echo "udp_delivered $((v4 + v6))"
echo "qdisc_dropped $(tc -s qdisc show dev "$(cat /run/rocev2-dev)" | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | awk '{ n += $1 } END { print n + 0 }')"
"#;

/// The GID table's filled entries (of 2048) as `INDEX GID TYPE`.
const GIDS_SCRIPT: &str = r#"
cd /sys/class/infiniband/rxe0/ports/1 || exit 1
grep -v '^0000:0000:0000:0000:0000:0000:0000:0000$' gids/* | while IFS=: read -r f gid; do
	i=${f#gids/}
	echo "$i $gid $(cat "gid_attrs/types/$i")"
done
"#;

/// rxe0's counters, by the names the kernel gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RxeCounters(pub BTreeMap<String, u64>);

impl RxeCounters {
    pub fn parse(text: &str) -> Result<Self> {
        let mut map = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (k, v) = line.split_once(' ').with_context(|| format!("not `name value`: {line:?}"))?;
            let v = v.trim().parse().with_context(|| format!("counter {k}: {v:?} is not a number"))?;
            map.insert(k.to_owned(), v);
        }
        if !map.contains_key("sent_pkts") {
            bail!("rxe0 has no sent_pkts counter (is rxe0 set up?):\n{text}");
        }
        if !map.contains_key("icrc_errors") {
            bail!("no ICRC counts: the guest could not probe rxe's ICRC check (see its console):\n{text}");
        }
        Ok(Self(map))
    }

    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// RoCE packets that reached rxe but that it did not accept: a bad
    /// ICRC (`icrc_errors`), or a header check failing (e.g. a late reply
    /// to a QP already destroyed). Only meaningful as a difference over a
    /// time when the guest received no other UDP (the guests run nothing
    /// else that does).
    pub fn rxe_discarded(&self) -> u64 {
        self.get("udp_delivered").saturating_sub(self.get("rcvd_pkts"))
    }

    /// What changed since `before`.
    pub fn since(&self, before: &RxeCounters) -> RxeCounters {
        Self(self.0.iter().map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k)))).collect())
    }
}

/// `INDEX GID TYPE` lines to the RoCE v2 entries.
fn parse_gids(text: &str) -> Vec<(u32, std::net::Ipv6Addr)> {
    text.lines()
        .filter(|l| l.ends_with("RoCE v2"))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let index = f.next()?.parse().ok()?;
            let gid = f.next()?.parse().ok()?;
            Some((index, gid))
        })
        .filter(|(_, gid): &(u32, std::net::Ipv6Addr)| !gid.is_unspecified())
        .collect()
}

/// The GID of an address as rxe lists it: an IPv6 address as is, an IPv4
/// address mapped (::ffff:a.b.c.d).
pub fn gid_of(addr: std::net::IpAddr) -> std::net::Ipv6Addr {
    match addr {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    }
}

/// A guest owned by a test: stopped, and its directory removed, when dropped.
pub struct GuestGuard(pub Guest);

impl std::ops::Deref for GuestGuard {
    type Target = Guest;
    fn deref(&self) -> &Guest {
        &self.0
    }
}

impl Drop for GuestGuard {
    fn drop(&mut self) {
        self.0.stop();
        if let Err(e) = fs::remove_dir_all(&self.0.dir) {
            if e.kind() != ErrorKind::NotFound {
                eprintln!("warning: cannot remove {}: {e}", self.0.dir.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_counters_and_gids_parse() {
        let c = RxeCounters::parse("sent_pkts 10\nrcvd_pkts 7\nudp_delivered 7\nicrc_errors 0\n").unwrap();
        assert_eq!(c.get("sent_pkts"), 10);
        assert_eq!(c.get("missing"), 0);
        let later = RxeCounters::parse("sent_pkts 15\nrcvd_pkts 9\nudp_delivered 10\nicrc_errors 1\n").unwrap();
        assert_eq!(later.since(&c).get("sent_pkts"), 5);
        assert_eq!(later.since(&c).rxe_discarded(), 1);
        assert!(RxeCounters::parse("rcvd_pkts x\n").is_err());
        assert!(RxeCounters::parse("rcvd_pkts 1\n").unwrap_err().to_string().contains("sent_pkts"));
        assert!(RxeCounters::parse("sent_pkts 1\n").unwrap_err().to_string().contains("ICRC"));

        let gids = parse_gids(
            "0 fe80:0000:0000:0000:0052:46ff:fe01:0201 IB/RoCE v1\n\
             1 fe80:0000:0000:0000:0052:46ff:fe01:0201 RoCE v2\n\
             2 0000:0000:0000:0000:0000:ffff:0a01:0101 IB/RoCE v1\n\
             3 0000:0000:0000:0000:0000:ffff:0a01:0101 RoCE v2\n\
             4  \n",
        );
        assert_eq!(gids.len(), 2);
        assert_eq!(gids[1], (3, gid_of("10.1.1.1".parse().unwrap())));
    }

    #[test]
    fn guest_conf_names_everything_the_boot_script_reads() {
        let spec = GuestSpec {
            name: "r1h1".into(),
            netns: "lab-r1h1".into(),
            tap: "vm0".into(),
            mac: [2, 0x52, 0x46, 1, 2, 1],
            addrs: vec!["10.1.1.1/24".into(), "fd00:1:1::1/64".into()],
            gateway_v4: Some("10.1.1.254".into()),
            gateway_v6: None,
            memory_mib: 256,
            dir: "/run/x".into(),
        };
        let conf = guest_conf(&spec);
        for var in ["GUEST_NAME", "GUEST_MAC", "GUEST_ADDRS", "GUEST_GW4", "GUEST_GW6"] {
            assert!(GUEST_INIT.contains(&format!("${var}")), "the boot script does not read {var}");
            assert!(conf.contains(&format!("{var}=")), "{conf}");
        }
        assert!(conf.contains("GUEST_MAC='02:52:46:01:02:01'"), "{conf}");
        assert!(conf.contains("GUEST_ADDRS='10.1.1.1/24 fd00:1:1::1/64'"), "{conf}");
        let args =
            qemu_args(&spec, Path::new("/t"), Path::new("/t/k"), Path::new("/t/i"), Path::new("/x"), Path::new("/c"));
        let line = args.join(" ");
        assert!(line.contains("-netdev tap,id=net0,ifname=vm0,script=no"), "{line}");
        assert!(line.contains("path=/t,security_model=none,readonly=on"), "{line}");
        assert!(line.contains("-m 256"), "{line}");
    }
}
