//! `[dataplane] cpu_spread = "qp"`: the spreading stage hands each flow to
//! a CPU by its qp hash through a CPU map, whose program runs the pipeline.
//! 64 QPs share one five-tuple (what RSS would put on one CPU); with the
//! stage, every CPU forwards some of them and each QP stays in PSN order.

use rocev2_common::{counters::PortCounter, maps::MAX_PORTS};
use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::dataplane::Maps,
    testbed::ecmp_lab::{EcmpLab, Family},
};

#[test]
fn qp_spreading_forwards_on_every_cpu_in_psn_order() {
    require_root();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpus >= 2, "this test needs at least 2 CPUs to see spreading; the machine has {cpus}");
    let lab = EcmpLab::create(2).expect("build the lab");
    let text = lab.config("qp").replacen("[dataplane]\n", "[dataplane]\ncpu_spread = \"qp\"\n", 1);
    let config = lab.write_config_text("spread", &text).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("start rocev2 run");
    let report = lab.send_and_capture(64, 20, &[Family::V4]).expect("send and capture");
    let maps = Maps::open_pinned(&lab.pin_dir()).expect("open the pinned maps");
    let slot = (0..MAX_PORTS)
        .find(|s| maps.port_counter(*s, PortCounter::RxPackets).unwrap() > 0)
        .expect("the port's counters saw the packets");
    let per_cpu = maps.port_counter_per_cpu(slot, PortCounter::Forwarded).unwrap();
    drop(maps);
    let output = dataplane.stop().expect("rocev2 run stops cleanly");
    assert!(output.contains("cpu_spread = qp"), "run says the stage is on:\n{output}");
    rocev2_tests::assert_no_switch_loss(&report, "every packet arrives");
    for u in &report.uplinks {
        assert_eq!(u.reordered, 0, "PSN order kept on up{}:\n{}", u.uplink, report.render());
        assert_eq!(u.bad_icrc, 0, "ICRC intact on up{}", u.uplink);
    }
    assert_eq!(per_cpu.iter().sum::<u64>(), report.sent, "every packet was forwarded by the pipeline: {per_cpu:?}");
    let busy = per_cpu.iter().filter(|n| **n > 0).count();
    assert!(busy >= 2, "packets of 64 QPs were forwarded on {busy} CPU(s) only: {per_cpu:?}");
}
