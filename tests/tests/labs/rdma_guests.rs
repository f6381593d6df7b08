//! Real RDMA through rocev2: the hosts of a 2-rack fabric are virtual
//! machines running Debian's kernel with Soft-RoCE (rxe) and perftest,
//! rping and ibv_rc_pingpong, which nobody here wrote; rocev2 runs on every
//! switch. What a real stack does (QPNs, PSNs, ACKs, go-back-N, the ICRC
//! check at the receiver) is read from the guests' own output and
//! counters. The guests' Debian tree is `cargo xtask setup`'s to build
//! (in /var/cache/rocev2/trees); without it the first test builds it,
//! except under CI=true, where it fails (see `rocev2_tests::rdma::tree_cache`).

use std::collections::{BTreeMap, BTreeSet};

use rocev2_tests::{
    book,
    rdma::{
        accounting, counters, describe, one_at_a_time, perftest_qps, read_rxe_fixture, run_pair, run_perftest,
        wait_perftest, write_rxe_fixture, Capture, RdmaLab,
    },
    require_root,
};
use rocev2_user::testbed::guest::GuestJob;

/// `ib_write_bw -q 8` between the racks with RDMA CM: it completes with
/// perftest's bandwidth; neither rxe discarded a packet (no ICRC error)
/// and every packet one guest sent reached the other; the sender's leaf
/// lists the 8 QPs the guests really used (QPNs from perftest's output),
/// each on the uplink `explain` computes for it, and more than one uplink
/// carries them; rping (RDMA CM, SEND/READ/WRITE) works over IPv4 and IPv6.
/// The run is the book's ("Real RDMA through rocev2"): its commands, and
/// what it shows they print, numbers and names with digits masked.
#[test]
fn rdma_guests_write_bw_8_qps_between_racks() {
    require_root();
    let _one = one_at_a_time();
    let book = BookRun::read();
    let lab = RdmaLab::up('w', &[]);
    let (client, server) = (lab.guest("r1h1"), lab.guest("r2h1"));
    let ours = |text: &str| text.replace(&format!("\"{}\"", lab.name), "\"lab\"").replace(&lab.name, "lab");
    book.shows("lab up", &ours(&lab.up_output));
    let cache = rocev2_tests::rdma::tree_cache();
    let tree = rocev2_tests::rdma::rocev2(&["lab", "tree", "--check", "--tree-cache", cache.to_str().unwrap()]);
    book.shows("lab tree", &tree.replace(cache.to_str().unwrap(), "/var/cache/rocev2/trees"));
    let before = counters([client, server]);

    let (server_out, client_out, (bytes, iterations, mb_per_s)) =
        run_perftest(server, &book.server, client, &book.client);
    book.shows("ib_write_bw", &client_out);
    book.shows("top", &rocev2_tests::rdma::rocev2(&["top", "--once", "--config", lab.config("l1").to_str().unwrap()]));
    book.shows("rdma statistic", &server.run(&book.counters, rocev2_tests::rdma::TOOL_BUDGET).unwrap());
    let after = counters([client, server]);
    eprintln!("ib_write_bw -q 8: {iterations} x {bytes} B at {mb_per_s} MB/s");
    assert_eq!((bytes, iterations), (65536, 8 * 40), "{client_out}");
    assert!(mb_per_s > 0.0, "{client_out}");
    let acc = accounting(["r1h1", "r2h1"], &before, &after);
    eprintln!("{acc:#?}");
    acc.assert_all_accepted();
    // The data: 8 x 40 messages of 64 packets (1024-byte MTU), plus ACKs and CM.
    assert!(acc.received["r2h1"] >= 8 * 40 * 64, "{acc:#?}");

    // The QPs the data went to: the server's, as both sides printed them.
    let server_qps: Vec<u32> = perftest_qps(&server_out, "local").into_iter().map(|(qpn, _)| qpn).collect();
    let remote: Vec<u32> = perftest_qps(&client_out, "remote").into_iter().map(|(qpn, _)| qpn).collect();
    assert_eq!(server_qps.len(), 8, "{server_out}");
    assert_eq!(server_qps, remote, "the client's remote QPNs are the server's local ones");

    let top = lab.top("l1");
    let mut members = BTreeMap::new();
    for &qpn in &server_qps {
        let row = top["qps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["dest_qp"] == qpn && q["src"] == "10.1.1.1" && q["dst"] == "10.2.1.1")
            .unwrap_or_else(|| panic!("QP {qpn:#x} is not in l1's top --json:\n{top:#}"));
        assert!(row["packets"].as_u64().unwrap() >= 40 * 64, "{row:#}");
        let member = row["member"].as_str().unwrap().to_owned();
        let sport = row["src_port"].as_u64().unwrap();
        let explained = lab.explain_member(&lab.config("l1"), "10.1.1.1", "10.2.1.1", sport, qpn);
        assert_eq!(
            member, explained,
            "QP {qpn:#x} (sport {sport}): the switch used {member}, explain says {explained}"
        );
        members.insert(qpn, member);
    }
    let used: BTreeSet<&String> = members.values().collect();
    eprintln!("qp hashing put the 8 real QPs on {used:?}: {members:x?}");
    assert!(used.len() > 1, "qp hashing left one uplink idle: {members:x?}");

    for (family, server_addr) in [("IPv4", "0.0.0.0"), ("IPv6", "::")] {
        let target = if family == "IPv4" { "10.2.1.1" } else { "fd00:2:1::1" };
        let (server_out, client_out) = run_pair(
            server,
            &format!("rping -s -a {server_addr} -C 5 -v"),
            client,
            &format!("rping -c -a {target} -C 5 -v"),
            7174,
        );
        assert_eq!(client_out.matches("ping data: rdma-ping-").count(), 5, "{family}: {client_out}");
        assert_eq!(server_out.matches("server ping data: rdma-ping-").count(), 5, "{family}: {server_out}");
    }
    let end = counters([client, server]);
    accounting(["r1h1", "r2h1"], &after, &end).assert_all_accepted();
}

/// `rocev2 fault` on the receiving host's link drops two chosen PSNs of a
/// real QP and corrupts a third (IPv6 GIDs, no RDMA CM): the guests' RC
/// recovers (NAK, go-back-N) and the transfer completes; the receiver's rxe
/// discarded exactly the corrupted packet (its ICRC check, which so can
/// fail) and missed exactly the dropped ones; the sender's leaf saw the
/// NAKs and the retransmission on that QP. Then rping (RDMA CM, IPv4:
/// SEND, READ, WRITE). One frame of each kind the client sent and received
/// is captured: every one has a valid ICRC, and every kind in the fixture
/// file of real frames (tests/data/rxe-frames.txt) was seen again; with
/// ROCEV2_WRITE_RXE_FIXTURES=1 the file is rewritten from this capture.
#[test]
fn rdma_guests_recover_what_rocev2_fault_drops_and_corrupts() {
    require_root();
    let _one = one_at_a_time();
    let lab = RdmaLab::up('f', &[]);
    let (client, server) = (lab.guest("r1h1"), lab.guest("r2h1"));
    let gid = |g: &rocev2_user::testbed::guest::Guest, addr: &str| -> u32 {
        let want = rocev2_user::testbed::guest::gid_of(addr.parse().unwrap());
        let gids = g.roce_v2_gids().unwrap();
        gids.iter().find(|(_, gid)| *gid == want).unwrap_or_else(|| panic!("{addr} not in {gids:?}")).0
    };
    let (client_gid, server_gid) = (gid(client, "fd00:1:1::1"), gid(server, "fd00:2:1::1"));
    let capture = Capture::start(&lab, "r1h1");
    let before = counters([client, server]);

    // -u 18: a QP times out an unanswered packet after 1 s (not perftest's
    // 67 ms): two emulated CPUs on a loaded machine can stall that long,
    // and a retry count exhausted by stalls is not what this test is about
    // (the drops and the corruption are repaired by NAKs, not timeouts).
    let server_job = server.spawn(&format!("ib_write_bw -x {server_gid} -u 18 -q 2 -n 300")).unwrap();
    rocev2_tests::rdma::wait_listening(server, &server_job, 18515);
    let client_job = client.spawn(&format!("ib_write_bw -x {client_gid} -u 18 -q 2 -n 300 10.2.1.1")).unwrap();
    // The QP's first PSN is known once the client printed it; the data
    // starts then. Faults far enough ahead (a few thousand packets, about a
    // second) to be armed before their PSN passes.
    let (qp, first_psn) = loop {
        let out = client_job.stdout();
        let (local, remote) = (perftest_qps(&out, "local"), perftest_qps(&out, "remote"));
        if local.len() == 2 && remote.len() == 2 {
            break (remote[0].0, local[0].1);
        }
        assert!(client_job.status().is_none(), "the client ended early:\n{out}{}", client_job.stderr());
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let psn = |ahead: u32| (first_psn + ahead) & 0xFF_FFFF;
    let (drop1, drop2, corrupt) = (psn(8000), psn(8001), psn(12000));
    // `fault` ends when every fault was applied (or after --duration): a
    // client that failed first would leave it waiting, so both are watched.
    let fault_log = std::env::temp_dir().join(format!("rocev2-fault-{}.log", lab.name));
    let mut fault = std::process::Command::new(rocev2_tests::rocev2_bin())
        .args(["--netns", &lab.netns("r2h1"), "fault", "--dev", "eth0", "--duration", "300"])
        .args(["--drop", &format!("{qp:#x}:{drop1}"), "--drop", &format!("{qp:#x}:{drop2}")])
        .args(["--corrupt", &format!("{qp:#x}:{corrupt}")])
        .stdout(std::fs::File::create(&fault_log).unwrap())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let fault_status = loop {
        if let Some(status) = fault.try_wait().unwrap() {
            break status;
        }
        if client_job.status().is_some_and(|rc| rc != 0) {
            let _ = fault.kill();
            let _ = fault.wait();
            panic!(
                "the client failed before the faults were applied:\n{}{}\n{}",
                client_job.stdout(),
                client_job.stderr(),
                std::fs::read_to_string(&fault_log).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let fault_out = std::fs::read_to_string(&fault_log).unwrap_or_default();
    let _ = std::fs::remove_file(&fault_log);
    eprintln!("{fault_out}");
    assert!(fault_status.success() && fault_out.contains("lost 2 of 2, corrupted 1 of 1"), "{fault_out}");

    let (client_out, result) = wait_perftest(&server_job, &client_job);
    if let Some((_, iterations, _)) = result {
        assert_eq!(iterations, 600, "{}", client_out.stdout);
    }
    eprintln!("ib_write_bw -q 2 (IPv6 GIDs) through 2 drops and a corruption: {}", describe(result));

    let after = counters([client, server]);
    let acc = accounting(["r1h1", "r2h1"], &before, &after);
    eprintln!("{acc:#?}");
    assert_eq!(acc.icrc_errors["r2h1"], 1, "the receiver's ICRC check must catch the corrupted packet: {acc:#?}");
    assert_eq!(acc.discarded["r2h1"], 1, "rxe discarded the corrupted packet, and only it: {acc:#?}");
    assert_eq!(acc.lost_on_the_way["r2h1"], 2, "exactly the dropped packets missing: {acc:#?}");
    assert_eq!((acc.icrc_errors["r1h1"], acc.lost_on_the_way["r1h1"]), (0, 0), "{acc:#?}");
    let (sender, receiver) = (&acc.deltas[0], &acc.deltas[1]);
    assert!(receiver.get("out_of_seq_request") >= 1 && sender.get("rcvd_seq_err") >= 1, "{acc:#?}");

    let top = lab.top("l1");
    let row = top["qps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["dest_qp"] == qp && q["dst"] == "fd00:2:1::1")
        .unwrap_or_else(|| panic!("QP {qp:#x} not in l1's top:\n{top:#}"))
        .clone();
    eprintln!("l1 top, QP {qp:#x}: {row:#}");
    assert!(row["naks_sequence"].as_u64().unwrap() >= 1, "{row:#}");
    assert!(row["psn_backward_jumps"].as_u64().unwrap() >= 1, "the retransmission: {row:#}");

    // RDMA CM, SEND, READ and WRITE over IPv4 (3000 bytes: READ responses
    // and WRITEs of three packets).
    let (_, client_out) =
        run_pair(server, "rping -s -a 0.0.0.0 -S 3000 -C 2 -v", client, "rping -c -a 10.2.1.1 -S 3000 -C 2 -v", 7174);
    assert_eq!(client_out.matches("ping data: rdma-ping-").count(), 2, "{client_out}");

    let frames = capture.stop();
    let kinds: Vec<&str> = frames.iter().map(|f| f.kind.as_str()).collect();
    eprintln!("captured on r1h1's links: {kinds:#?}");
    for f in &frames {
        let parsed = rocev2_user::tools::packet::parse_roce(&f.frame).unwrap();
        assert!(parsed.icrc_ok, "{}: the ICRC does not match: {parsed:?}", f.kind);
    }
    for wanted in [
        "IPv6 RC RDMA_WRITE_FIRST, sent by r1h1",
        "IPv6 RC RDMA_WRITE_MIDDLE, sent by r1h1",
        "IPv6 RC RDMA_WRITE_LAST, sent by r1h1",
        "IPv6 RC ACKNOWLEDGE, delivered to r1h1",
        "IPv6 RC ACKNOWLEDGE (NAK: PSN sequence error), delivered to r1h1",
        "IPv4 UD SEND_ONLY to QP1 (a CM MAD), sent by r1h1",
        "IPv4 UD SEND_ONLY to QP1 (a CM MAD), delivered to r1h1",
        "IPv4 RC SEND_ONLY, sent by r1h1",
        "IPv4 RC RDMA_READ_REQUEST, delivered to r1h1",
        "IPv4 RC RDMA_READ_RESPONSE_FIRST, sent by r1h1",
        "IPv4 RC RDMA_WRITE_FIRST, delivered to r1h1",
    ] {
        assert!(kinds.contains(&wanted), "no {wanted:?} captured: {kinds:#?}");
    }
    if std::env::var_os("ROCEV2_WRITE_RXE_FIXTURES").is_some() {
        write_rxe_fixture(&frames).unwrap();
        eprintln!("wrote {}", rocev2_tests::rdma::rxe_fixture_path().display());
    }
    for fixture in read_rxe_fixture() {
        assert!(kinds.contains(&fixture.kind.as_str()), "the fixture's {:?} was not seen in this run", fixture.kind);
    }
}

/// Every rewrite rocev2 makes, checked by the receiver's ICRC: the sender's
/// leaf is upgraded (`rocev2 upgrade`, during an `ib_write_bw` run) to a
/// config that also rewrites DSCP by class and marks ECN (CE on ECT data
/// from a virtual queue slower than the guests), besides the MACs and TTL
/// it always rewrites. The run goes on for a while on the new dataplane,
/// then ends: no ICRC error, nothing lost, and the switch counted its
/// marks and classes. Then an uplink fails during a run: RC retransmits
/// what the outage lost and the run completes. (The runs are perftest
/// duration runs ended on demand, so they span the upgrade and the
/// outage however long a loaded machine makes those.)
#[test]
fn rdma_guests_survive_rewrites_upgrade_and_a_member_failure() {
    require_root();
    let _one = one_at_a_time();
    let lab = RdmaLab::up('u', &[]);
    let (client, server) = (lab.guest("r1h1"), lab.guest("r2h1"));
    let config = lab.config("l1");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "\n# Added by the test: every rewrite, on the uplinks.\n\
         [[ecn_profile]]\nname = \"mark\"\nkmin = \"1KiB\"\nkmax = \"2KiB\"\npmax = \"100%\"\n\n\
         [[egress]]\ndev = \"s1p1\"\nrate = \"20Mbit\"\necn_profile = \"mark\"\n\n\
         [[egress]]\ndev = \"s2p1\"\nrate = \"20Mbit\"\necn_profile = \"mark\"\n\n\
         [[class]]\nname = \"control\"\nopcodes = [0x11, 0x81]\nset_dscp = 48\necn_exempt = true\n\n\
         [[class]]\nname = \"data\"\nopcodes = [0x06, 0x07, 0x08, 0x0a]\nset_dscp = 10\n",
    );
    std::fs::write(&config, text).unwrap();

    // ToS 106: DSCP 26 with ECT(0), as RoCE hosts mark their data.
    let before = counters([client, server]);
    let (server_job, client_job) = start_duration_run(server, client, "ib_write_bw -R -u 18 -T 106 -q 4");
    let log = std::env::temp_dir().join(format!("rocev2-upgrade-{}.log", lab.name));
    let log_file = std::fs::File::create(&log).unwrap();
    let upgrade_started = std::time::Instant::now();
    let mut upgraded = std::process::Command::new(rocev2_tests::rocev2_bin())
        .args(["--netns", &lab.netns("l1"), "upgrade", "--config", config.to_str().unwrap()])
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();
    wait_for(
        || std::fs::read_to_string(&log).unwrap_or_default().lines().any(|l| l == "rocev2: ready"),
        "the upgraded dataplane",
    );
    eprintln!("rocev2 upgrade took {:?}, during the transfer", upgrade_started.elapsed());
    assert!(client_job.status().is_none(), "the run ended during the upgrade:\n{}", client_job.stdout());
    // The data goes on through the new dataplane for a while.
    wait_for_progress(&lab, "l1", 2000);
    end_duration_run(&client_job);
    let (_, result) = wait_perftest(&server_job, &client_job);
    let after = counters([client, server]);
    let acc = accounting(["r1h1", "r2h1"], &before, &after);
    eprintln!("upgrade during ib_write_bw ({}): {acc:#?}", describe(result));
    acc.assert_clean();

    let stats: serde_json::Value =
        serde_json::from_str(&rocev2_tests::rdma::rocev2(&["stats", "--json", "--config", config.to_str().unwrap()]))
            .unwrap();
    let egress_sum = |counter: &str| -> u64 {
        stats["egress"].as_array().unwrap().iter().map(|e| e["counters"][counter].as_u64().unwrap_or(0)).sum()
    };
    let class = |name: &str| -> u64 {
        stats["classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map_or(0, |c| c["packets"].as_u64().unwrap())
    };
    eprintln!(
        "l1 after the upgrade: ecn_marked {}, class data {}, class control {}",
        egress_sum("ecn_marked"),
        class("data"),
        class("control")
    );
    assert!(egress_sum("ecn_marked") > 0, "no CE mark: {stats:#}");
    assert!(class("data") > 0 && class("control") > 0, "{stats:#}");

    // An uplink fails mid-run (and comes back): what was on it, and the
    // replies that crossed its far end, are lost until the switches route
    // around it; the QPs' timeout (-u 17: 0.5 s, 7 retries) outlasts that.
    let before = after;
    let (server_job, client_job) = start_duration_run(server, client, "ib_write_bw -R -u 17 -q 4");
    wait_for_progress(&lab, "l1", 1000);
    let l1 = lab.netns("l1");
    rocev2_user::sys::netns::ip(&["-n", &l1, "link", "set", "s1p1", "down"]).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    rocev2_user::sys::netns::ip(&["-n", &l1, "link", "set", "s1p1", "up"]).unwrap();
    wait_for_progress(&lab, "l1", 2000);
    end_duration_run(&client_job);
    let (_, result) = wait_perftest(&server_job, &client_job);
    let after = counters([client, server]);
    let acc = accounting(["r1h1", "r2h1"], &before, &after);
    eprintln!("uplink s1p1 down for 1 s during ib_write_bw ({}): {acc:#?}", describe(result));
    assert_eq!((acc.icrc_errors["r1h1"], acc.icrc_errors["r2h1"]), (0, 0), "{acc:#?}");

    let _ = upgraded.kill();
    let _ = upgraded.wait();
    let _ = std::fs::remove_file(&log);
}

/// The book's run: the guests' perftest pair and counters command, and the
/// console steps with what the book shows under them.
struct BookRun {
    server: String,
    client: String,
    counters: String,
    steps: Vec<book::Step>,
}

const CHAPTER: &str = "real-rdma.md";

impl BookRun {
    fn read() -> Self {
        let steps = book::console_steps(CHAPTER);
        let guest_command = |host: &str, tool: &str| -> String {
            let prefix = format!("rocev2 lab exec {host} -- {tool}");
            let step = steps
                .iter()
                .find(|s| s.command.starts_with(&prefix))
                .unwrap_or_else(|| panic!("{CHAPTER} has no `$ {prefix}`"));
            let command = step.command.split_once(" -- ").unwrap().1;
            // The server runs in the background, its output to a file.
            command.split(" >").next().unwrap().trim().to_string()
        };
        let (server, client) = (guest_command("r2h1", "ib_write_bw"), guest_command("r1h1", "ib_write_bw"));
        let counters = guest_command("r2h1", "rdma statistic");
        assert_eq!(format!("{server} 10.2.1.1"), client, "the book's client connects to its server");
        let known = ["rocev2 lab tree", "rocev2 lab up", "rocev2 lab exec", "rocev2 top", "rocev2 lab down"];
        for step in &steps {
            assert!(known.iter().any(|k| step.command.starts_with(k)), "{CHAPTER}: no replay of `{}`", step.command);
        }
        let up = steps.iter().find(|s| s.command.starts_with("rocev2 lab up")).unwrap();
        assert_eq!(
            up.command, "rocev2 lab up --racks 2 --hosts 1 --spines 2 --rdma-hosts",
            "the book's lab is the tests' (RdmaLab::up)"
        );
        Self { server, client, counters, steps }
    }

    /// Fails unless what the step starting with `rocev2 {command}` (or a
    /// guest's `command`) printed is what the book shows under it.
    fn shows(&self, command: &str, printed: &str) {
        let step = self
            .steps
            .iter()
            .filter(|s| !s.expected.is_empty())
            .find(|s| {
                s.command.starts_with(&format!("rocev2 {command}")) || s.command.contains(&format!("-- {command}"))
            })
            .unwrap_or_else(|| panic!("{CHAPTER} shows no output of `{command}`"));
        book::assert_shows(&format!("{CHAPTER}: `{}`", step.command), &step.expected, printed, book::mask_words);
    }
}

/// Starts `cmd` as a perftest duration run (`-D`, far longer than needed:
/// [`end_duration_run`] ends it) in both guests; returns once the client's
/// QPs are connected.
fn start_duration_run(
    server: &rocev2_user::testbed::guest::Guest,
    client: &rocev2_user::testbed::guest::Guest,
    cmd: &str,
) -> (GuestJob, GuestJob) {
    // exec: the signals go to the job's whole session, and the shell that
    // runs a job would die of the SIGALRM that perftest handles.
    let server_job = server.spawn(&format!("exec {cmd} -D 3600")).unwrap();
    rocev2_tests::rdma::wait_listening(server, &server_job, 18515);
    let client_job = client.spawn(&format!("exec {cmd} -D 3600 10.2.1.1")).unwrap();
    wait_for(|| !perftest_qps(&client_job.stdout(), "remote").is_empty(), "the client's QPs");
    (server_job, client_job)
}

/// Ends a perftest duration run now: perftest's own clock is SIGALRM, and
/// each one moves a run to its next phase (warm-up, measuring, cool-down,
/// end). Sent every 2 s until the run ends.
fn end_duration_run(client_job: &GuestJob) {
    for _ in 0..30 {
        if client_job.status().is_some() {
            return;
        }
        client_job.signal("ALRM").unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    panic!("the run did not end after 30 SIGALRMs:\n{}", client_job.stdout());
}

/// Waits until switch `switch` forwarded `packets` more packets (progress,
/// not time).
fn wait_for_progress(lab: &RdmaLab, switch: &str, packets: u64) {
    let forwarded = || -> u64 {
        let out = rocev2_tests::rdma::rocev2(&["stats", "--json", "--config", lab.config(switch).to_str().unwrap()]);
        let stats: serde_json::Value = serde_json::from_str(&out).unwrap();
        stats["ports"].as_array().unwrap().iter().map(|p| p["counters"]["forwarded"].as_u64().unwrap_or(0)).sum()
    };
    let start = forwarded();
    wait_for(|| forwarded() >= start + packets, &format!("{packets} packets through {switch}"));
}

/// Polls `done` every 20 ms for up to two minutes.
fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
