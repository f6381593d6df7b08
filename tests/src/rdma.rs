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

/// Where the tests keep the guests' Debian tree: the workspace's target/
/// (a fresh clone builds it once, about a minute and a half).
pub fn tree_cache() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debian-trees")
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
    _guard: LabGuard,
}

impl RdmaLab {
    /// `lab up --racks 2 --hosts 1 --spines 2 --rdma-hosts` plus `extra`
    /// arguments; prints what `lab up` printed.
    pub fn up(tag: char, extra: &[&str]) -> Self {
        let name = format!("v{tag}{:x}", std::process::id() % 0xFFFFF);
        let cache = tree_cache();
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
        Self { name, record, _guard: guard }
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
    let server_job = server.spawn(server_cmd).unwrap();
    wait_listening(server, &server_job, port);
    let client_out = client.spawn(client_cmd).unwrap().wait(TOOL_BUDGET).unwrap();
    let server_out = server_job.wait(TOOL_BUDGET).unwrap();
    check(&server_out, server_cmd);
    check(&client_out, client_cmd);
    (server_out.stdout, client_out.stdout)
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
pub fn perftest_result(out: &str) -> (u64, u64, f64) {
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
