//! Rated links and collectives on the fabric lab (`lab up --racks N
//! --link-rate R`): every link is a real queue at a rate, which fills,
//! marks ECN and drops at its tail; every packet sent is either received
//! or counted as dropped by a queue.
//!
//! Rates stay at 10-20 Mbit/s, so that two shared cores carry every link
//! at its rate with room to spare: the results are ratios of times the
//! links' rates set, not of how busy the machine is.

use std::process::Command;

use rocev2_common::hash::HashMode;

use rocev2_tests::{
    book::{self, assert_shows, mask},
    require_root, rocev2_bin, LabGuard,
};
use rocev2_user::{
    testbed::lab::{
        self,
        fabric::{balance::Balance, collective, links, scorecard, CollectiveReport, LabCollectiveArgs, LabTrafficArgs},
        LabRecord,
    },
    tools::collective::Op,
    tools::fabric::Pattern,
    tools::gen::SportModel,
    tools::rc::Transport,
};

/// A lab name unique to this process and test: 1-8 of [a-z0-9].
fn lab_name(tag: char) -> String {
    format!("c{tag}{:x}", std::process::id() % 0xFFFFF)
}

/// Rated links with buffers deep enough that an AllReduce drops nothing:
/// what differs between modes is where the traffic goes.
const DEEP_BUFFERS: &[&str] = &["--link-rate", "10mbit", "--leaf-buffer", "512k", "--spine-buffer", "1m"];

/// A ring AllReduce of 2 MiB per rank in 64 KiB chunks on lab `name`.
fn allreduce_2m(name: &str) -> LabCollectiveArgs {
    let mut args = LabCollectiveArgs::new(name, Op::Allreduce, 2 << 20);
    args.chunk = 64 << 10;
    args
}

fn lab_up(name: &str, extra: &[&str]) -> LabGuard {
    #[rustfmt::skip]
    let out = Command::new(rocev2_bin())
        .args(["lab", "up", "--name", name, "--racks", "2", "--hosts", "2", "--spines", "2", "--family", "v4"])
        .args(extra)
        .output()
        .unwrap();
    let guard = LabGuard(name.to_owned());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lab up failed:\n{text}");
    eprintln!("{text}");
    guard
}

fn queue_totals(record: &LabRecord) -> (u64, u64) {
    let rated = record.rated.as_ref().expect("a rated lab");
    let stats = links::queue_stats(rated, &record.switches).unwrap();
    stats.iter().fold((0, 0), |(d, m), s| (d + s.drops, m + s.ecn_marked))
}

/// The book's text block (in collectives.md) whose first line starts with `first`.
fn book_block(first: &str) -> Vec<String> {
    let chapter = book::chapter("collectives.md");
    let block = chapter
        .split("```text\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or(""))
        .find(|b| b.starts_with(first))
        .unwrap_or_else(|| panic!("collectives.md has no text block starting with {first:?}"));
    block.lines().map(str::to_string).collect()
}

/// [`mask`], and the busiest link's name too: two links may tie (both
/// ends of a collision carry the same bytes), and either is named.
fn mask_busiest(line: &str) -> String {
    let m = mask(line);
    let Some(at) = m.find("busiest link ").map(|i| i + "busiest link ".len()) else {
        return m;
    };
    let end = m[at..].find(':').map_or(m.len(), |e| at + e);
    format!("{}LINK{}", &m[..at], &m[end..])
}

/// `rocev2 lab mode --name NAME MODE`: every switch's config rewritten and its dataplane restarted.
fn mode(name: &str, mode: &str) {
    let out = Command::new(rocev2_bin()).args(["lab", "mode", "--name", name, mode]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lab mode {mode}:\n{text}");
    eprintln!("{text}");
}

/// A collective that completed with every frame accounted for and every
/// packet intact.
fn run(args: &LabCollectiveArgs) -> CollectiveReport {
    let r = collective::run(args).unwrap();
    eprintln!("{}", collective::render(&r));
    assert!(r.complete, "{}", collective::render(&r));
    assert!(r.accounted, "every frame sent was received or dropped by a queue:\n{}", collective::render(&r));
    assert_eq!(r.bad_icrc, 0);
    r
}

/// How far the lab's share of the ideal may fall from the flow-level
/// model's (the issue's 15%): the model has no packets, ACKs or queues,
/// and a loaded box adds a little time now and then.
const MODEL_TOLERANCE: f64 = 0.15;

/// [`run`], again (at most twice more) while go-back-N timed out with
/// nothing dropped: no packet was lost, an ACK came late because the
/// shared box stalled an endpoint, and such a run times the machine, not
/// the fabric.
fn run_unstalled(args: &LabCollectiveArgs) -> CollectiveReport {
    let mut r = run(args);
    for _ in 0..2 {
        if r.timeouts == 0 || r.drops > 0 {
            break;
        }
        eprintln!("{} go-back-N timeouts with nothing dropped (a stalled endpoint): running again", r.timeouts);
        r = run(args);
    }
    r
}

#[test]
fn rated_links_queue_mark_and_drop_and_every_packet_is_accounted_for() {
    require_root();
    let name = lab_name('q');
    let _lab = lab_up(&name, &["--link-rate", "10mbit", "--leaf-buffer", "16k", "--spine-buffer", "1m"]);
    let record = LabRecord::read(&name).unwrap();
    let rated = record.rated.clone().expect("lab up recorded the rated links");
    assert_eq!(rated.settings.rate_bps, 10_000_000);
    // 4 host NICs, 4 leaf->host, 4 leaf->spine, 4 spine->leaf.
    assert_eq!(rated.queues.len(), 16);
    assert!(rated.measured_path_fps.unwrap() > 0.0);
    let (drops_before, _) = queue_totals(&record);
    assert_eq!(drops_before, 0, "nothing dropped before any traffic");

    // Every host sends one connection of 8 QPs to the next rack at its
    // link rate: two hosts' traffic meets on the leaves' uplinks (and one
    // port per QP is not enough to spread it evenly), so queues fill.
    let args = LabTrafficArgs {
        name: name.clone(),
        pattern: Pattern::Ring,
        qps: 8,
        messages: 24,
        sport: SportModel::Fixed,
        rate: 10_000,
        json: false,
    };
    let o = lab::fabric::traffic(&args).unwrap();
    let (drops, marks) = queue_totals(&LabRecord::read(&name).unwrap());
    eprintln!("sent {}, received {}, dropped {drops}, marked {marks}", o.sent, o.received);
    assert_eq!(o.sent, o.received + drops, "every packet sent arrived or was dropped by a queue");
    assert!(drops > 0, "two hosts at the link rate into one uplink overflow a 16k buffer");
    assert!(marks > 0, "the virtual queues marked ECN before the buffers overflowed");
    assert_eq!((o.bad_icrc, o.duplicates, o.reordered), (0, 0, 0), "{o:#?}");

    let out = Command::new(rocev2_bin()).args(["lab", "stats", "--name", &name]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Queues: every link 10mbit"), "{text}");
    assert!(text.contains("r1h1/eth0") && text.contains("l1/s1p1") && text.contains("s2/l2p1"), "{text}");
    let queues = text[text.find("Queues:").unwrap()..].replace(&format!("{name}-wire"), "lab-wire");
    assert_shows("lab stats (its queues)", &book_block("Queues:"), &queues, mask);
}

#[test]
fn allreduce_with_qp_hashing_over_4_qps_beats_five_tuple_over_one_where_five_tuple_collides() {
    require_root();
    let name = lab_name('a');
    let _lab = lab_up(&name, DEEP_BUFFERS);
    let mut args = allreduce_2m(&name);

    mode(&name, "five-tuple");
    args.qps = 1;
    let five = run_unstalled(&args);
    assert_shows(
        "lab collective under five-tuple",
        &book_block("allreduce of 2m per rank"),
        &collective::render(&five),
        mask_busiest,
    );
    mode(&name, "qp");
    args.qps = 4;
    let qp = run_unstalled(&args);

    for r in [&five, &qp] {
        assert_eq!(r.drops, 0, "deep buffers: nothing dropped");
        // One path per QP, so the switches never reorder a QP. The lab's
        // veths swapped a pair of frames now and then under load: the last
        // hop into a host (links::join_wires) and the first hop out of one
        // (links::install_queues) handed frames to two CPUs' backlogs
        // until both sent with TSO off. The bound stays until fresh-clone
        // CI runs show 0 with both fixes in. Such a swap costs
        // a go-back-N resend (a swap whose late frame comes after the
        // resend NAKs without counting as reordered), which the comparison
        // with the model below bounds; more than a couple would be a fault.
        assert!(r.reordered <= 2, "at most a swapped pair or two:\n{}", collective::render(r));
        assert_eq!(r.data_frames, r.planned_packets + r.retransmitted, "every data frame planned or resent");
    }
    // What the simulator predicts for this fabric (its seeds, so the
    // same hash choices): five-tuple hashing puts both of a leaf's
    // connections on one uplink, which sets the ring's pace at half the
    // link rate; four QPs per connection spread over both uplinks.
    let record = LabRecord::read(&name).unwrap();
    let predict = |hash, qps| {
        scorecard::predict(&record, &Balance::Hash { hash }, Op::Allreduce, args.size, args.chunk, qps)
            .unwrap()
            .share_of_ideal
    };
    let (five_model, qp_model) = (predict(HashMode::FiveTuple, 1), predict(HashMode::Qp, 4));
    assert!(five_model <= 0.5 + 1e-9, "the model sees the collision: {five_model}");
    let share = |r: &CollectiveReport| r.share_of_ideal.unwrap();
    eprintln!(
        "of ideal: five-tuple x1 lab {:.1}% model {:.1}%, qp x4 lab {:.1}% model {:.1}%",
        share(&five) * 100.0,
        five_model * 100.0,
        share(&qp) * 100.0,
        qp_model * 100.0
    );
    for (what, lab, model) in [("five-tuple x1", share(&five), five_model), ("qp x4", share(&qp), qp_model)] {
        assert!(
            (lab - model).abs() <= MODEL_TOLERANCE * model,
            "{what}: the lab's {:.1}% of ideal is not within {:.0}% of the model's {:.1}%",
            lab * 100.0,
            MODEL_TOLERANCE * 100.0,
            model * 100.0
        );
    }
    assert!(five.worst_link.as_ref().unwrap().utilization > 0.9, "the collided uplink is busy all the time");
    // qp's gain over five-tuple is at least the model's, less the tolerance.
    let (gain, model_gain) = (share(&qp) / share(&five), qp_model / five_model);
    assert!(
        gain >= model_gain * (1.0 - MODEL_TOLERANCE),
        "qp x4 over five-tuple x1: {gain:.2}x in the lab, {model_gain:.2}x predicted"
    );
}

#[test]
fn incast_with_cts_admission_drops_less_than_without() {
    require_root();
    let name = lab_name('i');
    // Shallow leaves: three senders at the link rate into one host overflow 32k.
    let _lab = lab_up(&name, &["--link-rate", "10mbit", "--leaf-buffer", "32k", "--spine-buffer", "256k"]);
    let mut args = LabCollectiveArgs::new(&name, Op::Incast, 2 << 20);
    args.transport = Transport::None;
    let none = run(&args);
    args.transport = Transport::Cts;
    let cts = run(&args);
    assert_shows("an incast under cts", &book_block("incast of 2m into r1h1"), &collective::render(&cts), mask_busiest);
    eprintln!("drops: none {}, cts {}", none.drops, cts.drops);
    assert!(none.drops > 0, "without admission the receiver's link overflows");
    assert!(none.retransmitted > 0, "and go-back-N sends again");
    assert!(cts.drops < none.drops, "admission keeps the receiver's queue within its buffer");
    // One grant per message: 2m from 3 senders, 6 messages of at most 128k each.
    assert_eq!(cts.cts_sent, 18);
}

/// TE under a link failure: the controller places every QP, a leaf-spine
/// link that carries one of them is cut a second into the ring, the
/// controller re-plans without it, and the AllReduce completes with
/// every frame counted: received, dropped by a queue, or lost at the
/// failed link as its own and its switches' counters show.
#[test]
fn te_replans_around_a_failed_link_and_the_allreduce_completes() {
    use rocev2_user::testbed::lab::fabric::balance::{Balance, TePin};
    use rocev2_user::tools::fabric::Switch;
    require_root();
    let name = lab_name('t');
    let _lab = lab_up(&name, DEEP_BUFFERS);
    let mut args = allreduce_2m(&name);
    // The first install restarts the dataplanes: the binary does that.
    let out = Command::new(rocev2_bin())
        .args(["lab", "te", "--name", &name, "--size", "2m", "--chunk", "64k"])
        .output()
        .unwrap();
    let placed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "lab te:\n{placed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(placed.contains(": l1/s1p1 "), "a QP crosses l1/s1p1:\n{placed}");

    args.fail = Some("l1/s1p1".into());
    args.fail_after = 1.0;
    let r = run(&args);
    let f = r.failure.as_ref().expect("the link failed");
    let (compute, install) = (f.te_compute_ms.expect("TE recomputed"), f.te_install_ms.expect("and installed"));
    eprintln!(
        "re-plan: CSPF {compute:.1} ms, pins installed {install:.0} ms after the cut; lost {} frames ({} in the link, {} refused by its ports, {} by a kernel), {} resent after {} timeouts",
        f.lost_frames, f.in_link_frames, f.refused_frames, f.kernel_frames, r.retransmitted, r.timeouts
    );
    assert!(f.at_secs >= 1.0 && f.at_secs < r.seconds, "cut mid-run: at {:.2} s of {:.2} s", f.at_secs, r.seconds);
    assert!(f.lost_frames > 0, "a loaded link was cut: what it held is lost");
    assert!(r.retransmitted > 0, "and go-back-N sent it again");
    // The new pins avoid the cut link in both directions.
    let Some(Balance::Te { pins }) = LabRecord::read(&name).unwrap().balance else {
        panic!("the fabric is in TE mode")
    };
    let on_link = |p: &&TePin| {
        (p.switch == Switch::Leaf(1) && p.port == "s1p1") || (p.switch == Switch::Spine(1) && p.port == "l1p1")
    };
    assert!(!pins.is_empty() && !pins.iter().any(|p| on_link(&p)), "pins still on the cut link: {pins:?}");
}

/// `rocev2 lab scorecard --json` on lab `name`, small: 1m per rank.
fn small_scorecard(name: &str) -> scorecard::Scorecard {
    let out = Command::new(rocev2_bin())
        .args(["lab", "scorecard", "--name", name, "--size", "1m", "--incast-size", "1m", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lab scorecard failed:\n{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("lab scorecard --json: {e}\n{stderr}"))
}

/// Where a QP's path is fixed for the whole run (hashing, slices, TE):
/// the rows the flow-level model predicts (`model_predicts`). Flowlet and
/// transport-aware rows move QPs when a QP happens to idle longer than the
/// gap, and in the lab that follows the run's timing (a go-back-N timeout's
/// pause, a stall of the shared box): one run on this fabric had keyed
/// flowlets at 50 ms at 49.8% of the ideal, the next at 82.8%, where the
/// model says 50%.
fn fixed_paths(row: &scorecard::ModeRow) -> bool {
    row.model_predicts
}

/// Every row of the scorecard on the 2x2x2 fabric completes with nothing
/// dropped, and each with fixed paths is within [`MODEL_TOLERANCE`] of
/// what the flow-level model predicts for the same fabric, seeds and mode
/// (the others are printed beside the model's figure).
#[test]
fn scorecard_modes_with_fixed_paths_are_within_15_percent_of_the_model_on_a_small_fabric() {
    require_root();
    let name = lab_name('s');
    let _lab = lab_up(&name, DEEP_BUFFERS);
    let off = |card: &scorecard::Scorecard| -> Vec<scorecard::ModeRow> {
        card.modes
            .iter()
            .filter(|row| fixed_paths(row))
            .filter(|row| !row.lab_over_model().is_some_and(|r| (r - 1.0).abs() <= MODEL_TOLERANCE))
            .cloned()
            .collect()
    };
    let mut card = small_scorecard(&name);
    eprintln!("{}", scorecard::render(&card));
    // Rows off only where the box, not the fabric, was timed: go-back-N
    // timeouts with nothing dropped (as run_unstalled), a busiest link far
    // from busy (with fixed paths the links set the pace, so the machine
    // did), or other processes using the CPUs meanwhile: once more.
    let wrong = off(&card);
    let stalled = |r: &scorecard::ModeRow| {
        (r.timeouts > 0 && r.drops == 0)
            || r.worst_utilization < 0.9
            || r.busy_elsewhere.is_some_and(|b| b > collective::BUSY_ELSEWHERE)
    };
    if !wrong.is_empty() && wrong.iter().all(stalled) {
        eprintln!("rows off where the machine set the pace: running again");
        card = small_scorecard(&name);
        eprintln!("{}", scorecard::render(&card));
    }
    assert_eq!(card.modes.len(), scorecard::mode_runs(&[2000, 50_000]).len());
    for row in &card.modes {
        assert!(row.complete, "{}", row.mode);
        assert_eq!(row.drops, 0, "{}: deep buffers drop nothing", row.mode);
    }
    let wrong: Vec<String> = off(&card)
        .iter()
        .map(|r| {
            format!(
                "{} x{}: lab {:.1}%, model {:.1}%",
                r.mode,
                r.qps,
                r.share_of_ideal * 100.0,
                r.model_share.unwrap_or(0.0) * 100.0
            )
        })
        .collect();
    assert!(wrong.is_empty(), "not within {:.0}% of the model: {wrong:?}", MODEL_TOLERANCE * 100.0);
    assert_eq!(card.modes.iter().filter(|r| fixed_paths(r)).count(), 7, "five-tuple, qp x1/2/4/8, slice, te");
    let transports: Vec<&str> = card.transports.iter().map(|t| t.transport.name()).collect();
    assert_eq!(transports, ["none", "dcqcn", "cts"]);
    assert!(card.transports.iter().all(|t| t.complete));
}

/// The book's scorecard is the rendering of the run saved beside it
/// (docs/src/scorecard.json), and its chart that run's SVG.
#[test]
fn the_books_scorecard_is_one_run_rendered() {
    use rocev2_user::testbed::lab::fabric::scorecard::{mode_runs, render, svg, Scorecard};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src");
    let card: Scorecard = serde_json::from_str(&std::fs::read_to_string(dir.join("scorecard.json")).unwrap()).unwrap();
    let table: Vec<String> = render(&card).lines().map(str::to_string).collect();
    assert_eq!(book_block("Ring AllReduce of"), table, "collectives.md shows `lab scorecard --from scorecard.json`");
    assert_eq!(
        std::fs::read_to_string(dir.join("scorecard.svg")).unwrap(),
        svg(&card),
        "scorecard.svg is that run's chart"
    );
    // Every mode of the scorecard ran, completed, and its numbers agree.
    let modes: Vec<(String, u32)> = mode_runs(&[2000, 50_000]).into_iter().map(|(b, q)| (b.label(), q)).collect();
    let ran: Vec<(String, u32)> = card.modes.iter().map(|r| (r.mode.clone(), r.qps)).collect();
    assert_eq!(ran, modes);
    for r in &card.modes {
        assert!(r.complete, "{}", r.mode);
        assert!((r.busbw / card.ideal_busbw - r.share_of_ideal).abs() < 1e-9, "{}", r.mode);
        assert!((card.ideal_seconds / r.seconds - r.share_of_ideal).abs() < 0.01, "{}", r.mode);
    }
    let transports: Vec<&str> = card.transports.iter().map(|t| t.transport.name()).collect();
    assert_eq!(transports, ["none", "dcqcn", "cts"]);
}
