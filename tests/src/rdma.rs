//! Real RDMA in the lab: a fabric whose hosts are virtual machines with
//! Soft-RoCE (`rocev2 lab up --rdma-hosts`), the RDMA tools run in them,
//! and what their output and the guests' counters say.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
};

use rocev2_user::testbed::{
    guest::{Budget, Guest, GuestJob, JobOutput, RxeCounters},
    lab::LabRecord,
};

use crate::{rocev2_bin, LabGuard};

/// Where the tests find the guests' Debian tree: `ROCEV2_TREE_CACHE`, else
/// the lab's own default (/var/cache/rocev2/trees), outside the clone, so
/// every checkout and every fresh CI clone on a machine shares one tree.
/// `cargo xtask setup` builds it there (minutes, from deb.debian.org).
pub fn tree_cache() -> PathBuf {
    std::env::var_os("ROCEV2_TREE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(rocev2_user::testbed::lab::rdma_hosts::DEFAULT_TREE_CACHE))
}

/// Under CI=true the tree must be there already: building it takes
/// minutes of the suite's budget and a Debian mirror, which is
/// `cargo xtask setup`'s job. Elsewhere the first test builds it.
fn require_tree(cache: &Path) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let recipe = &rocev2_user::testbed::debian_tree::RDMA_GUEST;
    if ci && rocev2_user::testbed::debian_tree::built(recipe, cache).is_none() {
        panic!(
            "CI=true and the RDMA guests' Debian tree (recipe digest {}) is not in {}: \
             `cargo xtask setup` builds it (or `rocev2 lab tree --tree-cache {}`); the tests do not \
             build it under CI, it takes minutes and a Debian mirror",
            recipe.digest(),
            cache.display(),
            cache.display()
        );
    }
}

/// One guest lab at a time in this process: two emulated CPUs are all the
/// machine has.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A 2-rack fabric (one RDMA host per rack, 2 spines, one link per
/// leaf-spine pair, both families), removed when dropped.
pub struct RdmaLab {
    pub name: String,
    pub record: LabRecord,
    /// What `lab up` printed (stdout).
    pub up_output: String,
    _guard: LabGuard,
}

impl RdmaLab {
    /// `lab up --racks 2 --hosts 1 --spines 2 --rdma-hosts` plus `extra`
    /// arguments; prints what `lab up` printed.
    pub fn up(tag: char, extra: &[&str]) -> Self {
        let name = format!("v{tag}{:x}", std::process::id() % 0xFFFFF);
        let cache = tree_cache();
        require_tree(&cache);
        #[rustfmt::skip]
        let out = Command::new(rocev2_bin())
            .args(["lab", "up", "--name", &name, "--racks", "2", "--hosts", "1", "--spines", "2",
                   "--rdma-hosts", "--tree-cache"])
            .arg(&cache)
            .args(extra)
            .output()
            .unwrap();
        let guard = LabGuard(name.clone());
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "lab up --rdma-hosts failed:\n{text}");
        eprintln!("{text}");
        let record = LabRecord::read(&name).unwrap();
        assert_eq!(record.guests.len(), 2, "{record:?}");
        let up_output = String::from_utf8_lossy(&out.stdout).into_owned();
        Self { name, record, up_output, _guard: guard }
    }

    pub fn guest(&self, name: &str) -> &Guest {
        self.record.guests.iter().find(|g| g.name == name).unwrap_or_else(|| panic!("no guest {name}"))
    }

    /// The config of switch `switch` (`l1`, `s2`, ...).
    pub fn config(&self, switch: &str) -> PathBuf {
        PathBuf::from(format!("/run/rocev2/lab-{}/{switch}.toml", self.name))
    }

    pub fn netns(&self, node: &str) -> String {
        format!("{}-{node}", self.name)
    }

    /// `rocev2 top --once --json` of switch `switch`.
    pub fn top(&self, switch: &str) -> serde_json::Value {
        let out = rocev2(&["top", "--once", "--json", "--config", self.config(switch).to_str().unwrap()]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("top --json: {e}\n{out}"))
    }

    /// The member `rocev2 explain` names for a RoCEv2 packet.
    pub fn explain_member(&self, config: &Path, src: &str, dst: &str, sport: u64, qp: u32) -> String {
        let out = rocev2(&[
            "explain",
            "--config",
            config.to_str().unwrap(),
            "--src",
            src,
            "--dst",
            dst,
            "--sport",
            &sport.to_string(),
            "--qp",
            &format!("{qp:#x}"),
        ]);
        let line = out.lines().find(|l| l.starts_with("member:")).unwrap_or_else(|| panic!("explain:\n{out}"));
        line.split(" dev ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_else(|| panic!("{line}")).into()
    }
}

/// Runs the rocev2 binary; its stdout, or a panic with both outputs.
pub fn rocev2(args: &[&str]) -> String {
    let out = Command::new(rocev2_bin()).args(args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "rocev2 {}: {}\n{stdout}{stderr}", args.join(" "), out.status);
    stdout.into_owned()
}

/// Generous for a command of a few seconds on an idle machine: the guest
/// CPU it may use, and the wall time for one that idles.
pub const TOOL_BUDGET: Budget = Budget::secs(120, 600);

/// Starts `server` in one guest, waits until it listens on `port` (RDMA CM
/// or TCP), runs `client` in the other; both outputs, each checked to have
/// exited 0.
pub fn run_pair(server: &Guest, server_cmd: &str, client: &Guest, client_cmd: &str, port: u16) -> (String, String) {
    let (server_out, client_out) = start_pair(server, server_cmd, client, client_cmd, port);
    check(&server_out, server_cmd);
    check(&client_out, client_cmd);
    (server_out.stdout, client_out.stdout)
}

fn start_pair(server: &Guest, server_cmd: &str, client: &Guest, client_cmd: &str, port: u16) -> (JobOutput, JobOutput) {
    let server_job = server.spawn(server_cmd).unwrap();
    wait_listening(server, &server_job, port);
    let client_out = client.spawn(client_cmd).unwrap().wait(TOOL_BUDGET).unwrap();
    (server_job.wait(TOOL_BUDGET).unwrap(), client_out)
}

/// A perftest pair (server, client on port 18515) until both timed their
/// run: perftest converts CPU cycles to time with a regression it checks
/// first, which an emulated CPU descheduled by a loaded host can fail
/// ("Can't produce a report", after the transfer). Such a run is repeated,
/// at most twice. Both outputs and the client's result.
pub fn run_perftest(
    server: &Guest,
    server_cmd: &str,
    client: &Guest,
    client_cmd: &str,
) -> (String, String, PerftestResult) {
    for attempt in 1..=3 {
        let (server_out, client_out) = start_pair(server, server_cmd, client, client_cmd, 18515);
        let (s, c) = (perftest_end(&server_out, server_cmd), perftest_end(&client_out, client_cmd));
        if let (Some(_), Some(result)) = (s, c) {
            return (server_out.stdout, client_out.stdout, result);
        }
        eprintln!("perftest could not time run {attempt} (its cycle regression failed): running it again");
    }
    panic!("perftest could not time 3 runs in a row: `{client_cmd}`");
}

/// Waits for a perftest pair started by hand (a test that acts while it
/// runs): the client's output and its result, None if the transfer ended
/// untimed (see [`run_perftest`]).
pub fn wait_perftest(server_job: &GuestJob, client_job: &GuestJob) -> (JobOutput, Option<PerftestResult>) {
    let client_out = client_job.wait(TOOL_BUDGET).unwrap();
    let server_out = server_job.wait(TOOL_BUDGET).unwrap();
    perftest_end(&server_out, "the perftest server");
    let result = perftest_end(&client_out, "the perftest client");
    (client_out, result)
}

/// A result for a message: "12.3 MB/s", or why there is none.
pub fn describe(result: Option<PerftestResult>) -> String {
    result.map_or("untimed: perftest's cycle regression failed".into(), |(_, _, avg)| format!("{avg} MB/s"))
}

/// perftest's result: bytes per message, iterations, and the average (MB/s
/// for the bandwidth tests, usec for the latency ones).
pub type PerftestResult = (u64, u64, f64);

/// How a perftest side ended: its result, or None if the transfer ended
/// but perftest could not time it (see [`run_perftest`]). Panics on any
/// other failure.
pub fn perftest_end(out: &JobOutput, cmd: &str) -> Option<PerftestResult> {
    if out.status != 0 && out.stderr.contains("Can't produce a report") && out.stdout.contains("#bytes") {
        return None;
    }
    check(out, cmd);
    Some(perftest_result(&out.stdout))
}

fn check(out: &JobOutput, cmd: &str) {
    if let Err(e) = out.success() {
        panic!("`{cmd}` failed: {e:#}");
    }
}

/// Waits until something listens on `port` in the guest: an RDMA CM ID
/// (`rdma resource show cm_id`) or a TCP socket (`ss`); fails if `job`
/// ends first.
pub fn wait_listening(guest: &Guest, job: &GuestJob, port: u16) {
    let script = format!(
        "for i in $(seq 600); do\n\
         \trdma resource show cm_id | grep -q \"LISTEN.*:{port} \" && exit 0\n\
         \tss -Hltn \"sport = :{port}\" | grep -q . && exit 0\n\
         \t[ -e /mnt/job/{id}.rc ] && exit 2\n\
         \tsleep 0.1\n\
         done\nexit 1\n",
        id = job.id
    );
    let out = guest.spawn(&script).unwrap().wait(TOOL_BUDGET).unwrap();
    assert_eq!(
        out.status,
        0,
        "nothing listens on port {port} in {}; the server printed:\n{}{}",
        guest.name,
        job.stdout(),
        job.stderr()
    );
}

/// perftest's ` local address: ... QPN 0x0013 PSN 0x2b1cbe` lines: (QPN, PSN).
pub fn perftest_qps(out: &str, side: &str) -> Vec<(u32, u32)> {
    let hex = |l: &str, key: &str| -> Option<u32> {
        let v = l.split(key).nth(1)?.split_whitespace().next()?;
        u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    };
    out.lines()
        .filter(|l| l.trim_start().starts_with(&format!("{side} address:")))
        .filter_map(|l| Some((hex(l, "QPN ")?, hex(l, "PSN ")?)))
        .collect()
}

/// perftest's result row after the `#bytes` header: (bytes, iterations,
/// the average: MB/s for the bandwidth tests, usec for the latency ones).
pub fn perftest_result(out: &str) -> PerftestResult {
    let mut lines = out.lines().skip_while(|l| !l.trim_start().starts_with("#bytes"));
    let header = lines.next().unwrap_or_else(|| panic!("no result table in:\n{out}"));
    let row = lines.next().unwrap_or_else(|| panic!("no result row in:\n{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // "BW peak[MB/sec]" and "BW average[MB/sec]" are two words each.
    let avg = if header.contains("BW average") {
        3
    } else {
        header.split_whitespace().position(|w| w.starts_with("t_avg")).unwrap_or_else(|| panic!("{header}"))
    };
    let parse = |i: usize| cols.get(i).unwrap_or_else(|| panic!("{row}"));
    (parse(0).parse().unwrap(), parse(1).parse().unwrap(), parse(avg).parse().unwrap())
}

/// Both guests' rxe counters.
pub fn counters(guests: [&Guest; 2]) -> [RxeCounters; 2] {
    guests.map(|g| g.rxe_counters().unwrap())
}

/// What the counters say happened between `before` and `after` of a
/// sender and a receiver pair (both directions): what rxe discarded on
/// arrival (the ICRC check, or its header checks), and whether every
/// packet one sent reached the other.
pub fn accounting(names: [&str; 2], before: &[RxeCounters; 2], after: &[RxeCounters; 2]) -> Accounting {
    let d = [after[0].since(&before[0]), after[1].since(&before[1])];
    let mut a = Accounting::default();
    for i in 0..2 {
        let (me, peer) = (&d[i], &d[1 - i]);
        a.icrc_errors.insert(names[i].into(), me.get("icrc_errors"));
        a.discarded.insert(names[i].into(), me.rxe_discarded());
        a.lost_on_the_way.insert(
            names[i].into(),
            peer.get("sent_pkts") as i64 - peer.get("qdisc_dropped") as i64 - me.get("udp_delivered") as i64,
        );
        a.sent.insert(names[i].into(), me.get("sent_pkts"));
        a.received.insert(names[i].into(), me.get("rcvd_pkts"));
    }
    a.deltas = d.to_vec();
    a
}

/// Per guest: ICRC errors its rxe found, RoCE packets rxe discarded on
/// arrival (the ICRC errors and header check failures), packets its peer
/// sent that never arrived, sent and accepted.
#[derive(Debug, Default)]
pub struct Accounting {
    pub icrc_errors: BTreeMap<String, u64>,
    pub discarded: BTreeMap<String, u64>,
    pub lost_on_the_way: BTreeMap<String, i64>,
    pub sent: BTreeMap<String, u64>,
    pub received: BTreeMap<String, u64>,
    pub deltas: Vec<RxeCounters>,
}

impl Accounting {
    /// No ICRC error, nothing lost between them; and the ICRC probe saw
    /// every packet rxe accepted (so its zero means something).
    pub fn assert_clean(&self) {
        for (d, name) in self.deltas.iter().zip(self.received.keys()) {
            assert!(d.get("icrc_ok") >= d.get("rcvd_pkts"), "{name}: the ICRC probe missed packets: {self:#?}");
        }
        assert!(self.icrc_errors.values().all(|&e| e == 0), "ICRC errors at a receiver: {self:#?}");
        assert!(self.lost_on_the_way.values().all(|&l| l == 0), "packets lost between the guests: {self:#?}");
    }

    /// [`Accounting::assert_clean`], and rxe accepted every packet that
    /// arrived (no late packet for a destroyed QP either).
    pub fn assert_all_accepted(&self) {
        self.assert_clean();
        assert!(self.discarded.values().all(|&d| d == 0), "rxe discarded packets: {self:#?}");
    }
}

/// One frame of each kind a host's guest sent and received, captured on
/// its namespace's links: what the guest sends arrives on its tap (`vm0`),
/// what the switch delivers arrives on the link to the leaf (`eth0`).
pub struct Capture {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<Vec<CapturedFrame>>>>,
}

/// A real frame and what it is (`IPv6 RC RDMA_WRITE_FIRST, sent by r1h1`).
#[derive(Clone, Debug)]
pub struct CapturedFrame {
    pub kind: String,
    pub frame: Vec<u8>,
}

impl Capture {
    /// Starts capturing in `lab`'s namespace of `host` (e.g. "r1h1").
    pub fn start(lab: &RdmaLab, host: &str) -> Self {
        use std::sync::{atomic::AtomicBool, Arc};
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [("vm0", "sent by"), ("eth0", "delivered to")]
            .into_iter()
            .map(|(dev, direction)| {
                let (stop, label) = (stop.clone(), format!("{direction} {host}"));
                rocev2_user::sys::netns::spawn_in_netns(&lab.netns(host), move || capture(dev, &label, &stop)).unwrap()
            })
            .collect();
        Self { stop, threads }
    }

    /// Stops; the frames captured, one per kind, in the order first seen.
    pub fn stop(self) -> Vec<CapturedFrame> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.into_iter().flat_map(|t| t.join().unwrap().unwrap()).collect()
    }
}

fn capture(dev: &str, label: &str, stop: &std::sync::atomic::AtomicBool) -> anyhow::Result<Vec<CapturedFrame>> {
    let socket = rocev2_user::sys::rawsock::PacketSocket::open(dev)?;
    let mut kinds = BTreeMap::new();
    let mut buf = vec![0u8; 65536];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(len) = socket.recv(&mut buf, std::time::Duration::from_millis(50))? else { continue };
        let frame = &buf[..len];
        let Ok(parsed) = rocev2_user::tools::packet::parse_roce(frame) else { continue };
        let kind = format!(
            "{} {}, {label}",
            if parsed.src_ip.is_ipv4() { "IPv4" } else { "IPv6" },
            frame_kind(frame, &parsed)
        );
        let order = kinds.len();
        kinds.entry(kind.clone()).or_insert((order, CapturedFrame { kind, frame: frame.to_vec() }));
    }
    let mut frames: Vec<(usize, CapturedFrame)> = kinds.into_values().collect();
    frames.sort_by_key(|(order, _)| *order);
    Ok(frames.into_iter().map(|(_, f)| f).collect())
}

/// The BTH opcode's name (and an ACK's kind: ACK, NAK, RNR NAK).
pub fn frame_kind(frame: &[u8], parsed: &rocev2_user::tools::packet::ParsedRoce) -> String {
    use rocev2_common::bth::aeth;
    let op = parsed.bth.opcode;
    let name = match op & 0x1F {
        0x00 => "SEND_FIRST",
        0x01 => "SEND_MIDDLE",
        0x02 => "SEND_LAST",
        0x03 => "SEND_LAST_WITH_IMMEDIATE",
        0x04 => "SEND_ONLY",
        0x05 => "SEND_ONLY_WITH_IMMEDIATE",
        0x06 => "RDMA_WRITE_FIRST",
        0x07 => "RDMA_WRITE_MIDDLE",
        0x08 => "RDMA_WRITE_LAST",
        0x09 => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        0x0A => "RDMA_WRITE_ONLY",
        0x0B => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        0x0C => "RDMA_READ_REQUEST",
        0x0D => "RDMA_READ_RESPONSE_FIRST",
        0x0E => "RDMA_READ_RESPONSE_MIDDLE",
        0x0F => "RDMA_READ_RESPONSE_LAST",
        0x10 => "RDMA_READ_RESPONSE_ONLY",
        0x11 => match aeth::kind(frame[parsed.bth_offset + rocev2_common::bth::BTH_LEN]) {
            aeth::Kind::Ack => "ACKNOWLEDGE",
            aeth::Kind::SequenceError => "ACKNOWLEDGE (NAK: PSN sequence error)",
            aeth::Kind::RnrNak => "ACKNOWLEDGE (RNR NAK)",
            _ => "ACKNOWLEDGE (NAK)",
        },
        0x12 => "ATOMIC_ACKNOWLEDGE",
        _ => "opcode",
    };
    let transport = match op >> 5 {
        0 => "RC",
        1 => "UC",
        3 => "UD",
        4 => "CNP",
        _ => "?",
    };
    if op == rocev2_common::bth::opcode::CNP {
        return "CNP".into();
    }
    let qp1 = if parsed.bth.dest_qp == 1 { " to QP1 (a CM MAD)" } else { "" };
    format!("{transport} {name}{qp1}")
}

/// The fixture file of real frames (read by the fixtures binary's
/// rxe_frames tests).
pub fn rxe_fixture_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/rxe-frames.txt")
}

/// Writes `frames` as the fixture file: a `frame KIND` line, then the
/// frame in hex, 32 bytes a line.
pub fn write_rxe_fixture(frames: &[CapturedFrame]) -> std::io::Result<()> {
    let mut text = String::from(
        "# Frames Linux 6.1's Soft-RoCE (rxe) sent through rocev2, captured on a\n\
         # host of the RDMA lab (tests/tests/labs/rdma_guests.rs writes this file\n\
         # when ROCEV2_WRITE_RXE_FIXTURES=1); the fixtures binary runs each one\n\
         # through the dataplane (tests/tests/fixtures/rxe_frames.rs).\n",
    );
    for f in frames {
        text.push_str(&format!("\nframe {}\n", f.kind));
        for chunk in f.frame.chunks(32) {
            text.push_str(&chunk.iter().map(|b| format!("{b:02x}")).collect::<String>());
            text.push('\n');
        }
    }
    std::fs::write(rxe_fixture_path(), text)
}

/// The fixture file's frames.
pub fn read_rxe_fixture() -> Vec<CapturedFrame> {
    let text = std::fs::read_to_string(rxe_fixture_path()).unwrap();
    let mut frames: Vec<CapturedFrame> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(kind) = line.strip_prefix("frame ") {
            frames.push(CapturedFrame { kind: kind.into(), frame: Vec::new() });
            continue;
        }
        let f = frames.last_mut().expect("hex before the first `frame` line");
        f.frame.extend((0..line.len()).step_by(2).map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap()));
    }
    frames
}
