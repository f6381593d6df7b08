use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;
use crate::tools::packet::{icrc, parse_roce};

const SRC_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn args(traffic: TrafficKind) -> GenArgs {
    let mut a =
        GenArgs::new("eth0", "02:00:00:00:00:02", Ipv4Addr::new(10, 0, 0, 1).into(), Ipv4Addr::new(10, 0, 0, 2).into());
    a.traffic = traffic;
    a.qps = 3;
    a.payload = 101;
    a
}

fn v6(mut a: GenArgs) -> GenArgs {
    a.src = "fd00::1".parse::<Ipv6Addr>().unwrap().into();
    a.dst = "fd00::2".parse::<Ipv6Addr>().unwrap().into();
    a.vlan = Some(7);
    a
}

/// Every frame parses, has a valid ICRC that agrees with packet.rs's,
/// and (IPv6) a valid UDP checksum.
fn check_valid(frames: &[Vec<u8>]) {
    for f in frames {
        let p = parse_roce(f).unwrap();
        assert!(p.icrc_ok, "{p:?}");
        assert_eq!(icrc(f).unwrap().to_le_bytes(), f[f.len() - 4..]);
        if p.src_ip.is_ipv6() {
            let ip = 18;
            let mut pseudo = f[ip + 8..ip + 40].to_vec();
            pseudo.extend_from_slice(&((f.len() - ip - 40) as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
            pseudo.extend_from_slice(&f[ip + 40..]);
            assert_eq!(rocev2_common::checksum::internet_checksum(&pseudo), 0, "IPv6 UDP checksum");
        }
    }
}

#[test]
fn write_messages_have_opcodes_psns_and_ackreq() {
    for a in [args(TrafficKind::Write), v6(args(TrafficKind::Write))] {
        let frames = build_frames(&a, SRC_MAC, 3 * 4 * 3).unwrap();
        check_valid(&frames);
        let parsed: Vec<_> = frames.iter().map(|f| parse_roce(f).unwrap()).collect();
        for (i, p) in parsed.iter().enumerate() {
            // Round-robin over QPs.
            assert_eq!(p.bth.dest_qp, 0x100 + (i % 3) as u32);
            let n = (i / 3) as u32; // packet number within the QP
            assert_eq!(p.bth.psn, n);
            let want =
                [opcode::WRITE_FIRST, opcode::WRITE_MIDDLE, opcode::WRITE_MIDDLE, opcode::WRITE_LAST][(n % 4) as usize];
            assert_eq!(p.bth.opcode, want);
            assert_eq!(p.bth.ack_req, n % 4 == 3);
            assert_eq!(p.payload_len, 101 + if n.is_multiple_of(4) { RETH_LEN } else { 0 });
            assert_eq!(p.ecn, 2);
            assert_eq!(p.dscp, 26);
            assert_eq!(p.src_port, 0xC000);
        }
    }
}

#[test]
fn single_packet_messages_are_write_only() {
    let mut a = args(TrafficKind::Write);
    a.message_packets = 1;
    for f in build_frames(&a, SRC_MAC, 6).unwrap() {
        let p = parse_roce(&f).unwrap();
        assert_eq!(p.bth.opcode, opcode::WRITE_ONLY);
        assert!(p.bth.ack_req);
    }
}

#[test]
fn psns_wrap_at_24_bits_across_passes() {
    for a in [args(TrafficKind::Write), v6(args(TrafficKind::Write))] {
        let mut a = a;
        a.first_psn = PSN_MASK - 5;
        let frames = build_frames(&a, SRC_MAC, 3 * 4 * 4).unwrap();
        check_valid(&frames);
        for (i, f) in frames.iter().enumerate() {
            let want = (PSN_MASK - 5 + (i / 3) as u32) & PSN_MASK;
            assert_eq!(parse_roce(f).unwrap().bth.psn, want, "frame {i}");
        }
    }
}

#[test]
fn later_passes_equal_a_fresh_build() {
    // Pass 2 derived in place must be byte-identical to building with
    // the PSN and MSN it should have.
    for kind in [TrafficKind::Write, TrafficKind::Ack, TrafficKind::Cts, TrafficKind::Mix] {
        for a in [args(kind), v6(args(kind))] {
            let pass = FrameSource::new(&a, SRC_MAC).unwrap().pass_len() as u64;
            let frames = build_frames(&a, SRC_MAC, pass * 3).unwrap();
            check_valid(&frames);
            let psn_per_pass = (frames[..pass as usize].iter().filter(|f| parse_roce(f).unwrap().bth.dest_qp == 0x100))
                .filter(|f| parse_roce(f).unwrap().bth.opcode != opcode::ACK || kind == TrafficKind::Ack)
                .count() as u32;
            let mut b = a.clone();
            b.first_psn = 2 * psn_per_pass;
            let fresh = build_frames(&b, SRC_MAC, pass).unwrap();
            for (i, f) in fresh.iter().enumerate() {
                let derived = &frames[2 * pass as usize + i];
                if kind == TrafficKind::Ack || kind == TrafficKind::Mix {
                    // MSNs differ (a fresh build starts at 0): compare all but the AETH and ICRC.
                    assert_eq!(parse_roce(derived).unwrap().bth, parse_roce(f).unwrap().bth, "{kind:?} {i}");
                } else {
                    assert_eq!(derived, f, "{kind:?} frame {i}");
                }
            }
        }
    }
}

fn aeth_msn(f: &[u8]) -> u32 {
    let at = f.len() - ICRC_LEN - AETH_LEN;
    assert_eq!(f[at], AETH_ACK_SYNDROME);
    u32::from_be_bytes([0, f[at + 1], f[at + 2], f[at + 3]])
}

#[test]
fn acks_carry_an_aeth_with_increasing_msn() {
    let a = args(TrafficKind::Ack);
    let frames = build_frames(&a, SRC_MAC, 9).unwrap();
    check_valid(&frames);
    for (i, f) in frames.iter().enumerate() {
        let p = parse_roce(f).unwrap();
        assert_eq!(p.bth.opcode, opcode::ACK);
        assert_eq!(p.payload_len, AETH_LEN);
        assert_eq!(p.bth.psn, (i / 3) as u32);
        assert_eq!(aeth_msn(f), (i / 3) as u32 + 1);
        assert!(!p.bth.ack_req);
    }
}

#[test]
fn cnps_are_becn_with_16_reserved_bytes_and_psn_0() {
    let mut a = args(TrafficKind::Cnp);
    a.dscp = 48;
    let frames = build_frames(&a, SRC_MAC, 7).unwrap();
    check_valid(&frames);
    for f in &frames {
        let p = parse_roce(f).unwrap();
        assert_eq!(p.bth.opcode, opcode::CNP);
        assert!(p.bth.becn && !p.bth.fecn);
        assert_eq!(p.bth.psn, 0);
        assert_eq!(p.payload_len, CNP_RESERVED_LEN);
        assert_eq!(f[f.len() - 20..f.len() - 4], [0; 16]);
        assert_eq!(p.dscp, 48);
    }
    // CNPs do not change between passes.
    assert_eq!(frames[0], frames[3]);
}

#[test]
fn cts_is_a_zero_length_write_with_immediate() {
    let frames = build_frames(&args(TrafficKind::Cts), SRC_MAC, 6).unwrap();
    check_valid(&frames);
    for (i, f) in frames.iter().enumerate() {
        let p = parse_roce(f).unwrap();
        assert_eq!(p.bth.opcode, opcode::WRITE_ONLY_IMM);
        assert!(p.bth.ack_req);
        assert_eq!(p.payload_len, RETH_LEN + IMM_LEN);
        assert_eq!(p.bth.psn, (i / 3) as u32);
        let reth = f.len() - 4 - RETH_LEN - IMM_LEN;
        assert_eq!(f[reth + 12..reth + 16], [0; 4], "DMA length 0");
    }
}

#[test]
fn mix_is_writes_then_cts_then_ack_of_the_cts() {
    let mut a = args(TrafficKind::Mix);
    a.qps = 1;
    a.message_packets = 2;
    let frames = build_frames(&a, SRC_MAC, 8).unwrap();
    check_valid(&frames);
    let got: Vec<(u8, u32)> =
        frames.iter().map(|f| parse_roce(f).unwrap()).map(|p| (p.bth.opcode, p.bth.psn)).collect();
    use opcode::*;
    assert_eq!(
        got,
        [
            (WRITE_FIRST, 0),
            (WRITE_LAST, 1),
            (WRITE_ONLY_IMM, 2),
            (ACK, 2),
            (WRITE_FIRST, 3),
            (WRITE_LAST, 4),
            (WRITE_ONLY_IMM, 5),
            (ACK, 5)
        ]
    );
    assert_eq!(aeth_msn(&frames[3]), 2);
    assert_eq!(aeth_msn(&frames[7]), 4);
}

#[test]
fn source_port_models() {
    // The reference formula from Linux's ib_verbs.h, by hand for 0x100 * 0x100.
    let v: u64 = 0x100 * 0x100;
    let fl = ((v ^ (v >> 20) ^ (v >> 40)) & 0xF_FFFF) as u32;
    assert_eq!(nic_sport(0x100, 0x100), (((fl & 0x3FFF) ^ (fl >> 14)) | 0xC000) as u16);
    for q in 0..1000 {
        assert!(nic_sport(q, q) >= 0xC000);
    }
    let mut a = args(TrafficKind::Write);
    a.qps = 16;
    a.sport = SportModel::Nic;
    let ports: Vec<u16> =
        build_frames(&a, SRC_MAC, 16).unwrap().iter().map(|f| parse_roce(f).unwrap().src_port).collect();
    for (q, p) in ports.iter().enumerate() {
        assert_eq!(*p, nic_sport(0x100 + q as u32, 0x100 + q as u32));
    }
    a.sport = SportModel::Random;
    let r1: Vec<u16> = build_frames(&a, SRC_MAC, 16).unwrap().iter().map(|f| parse_roce(f).unwrap().src_port).collect();
    let r2: Vec<u16> = build_frames(&a, SRC_MAC, 16).unwrap().iter().map(|f| parse_roce(f).unwrap().src_port).collect();
    assert_eq!(r1, r2, "same seed, same ports");
    assert!(r1.iter().all(|p| *p >= 0xC000));
    assert!(r1.iter().collect::<std::collections::HashSet<_>>().len() > 8);
    a.seed = 2;
    let r3: Vec<u16> = build_frames(&a, SRC_MAC, 16).unwrap().iter().map(|f| parse_roce(f).unwrap().src_port).collect();
    assert_ne!(r1, r3);
}

#[test]
fn ecn_codepoints() {
    for (e, cp) in [(EcnArg::NotEct, 0), (EcnArg::Ect0, 2), (EcnArg::Ect1, 1), (EcnArg::Ce, 3)] {
        let mut a = args(TrafficKind::Write);
        a.ecn = e;
        let f = &build_frames(&a, SRC_MAC, 1).unwrap()[0];
        assert_eq!(parse_roce(f).unwrap().ecn, cp);
    }
}

#[test]
fn bad_arguments_are_explained() {
    let mut a = args(TrafficKind::Write);
    a.dst = "fd00::2".parse().unwrap();
    let e = FrameSource::new(&a, SRC_MAC).err().unwrap().to_string();
    assert!(e.contains("same IP family"), "{e}");
    let mut a = args(TrafficKind::Write);
    a.dst_mac = "02:00:00:00:00".into();
    let e = format!("{:#}", FrameSource::new(&a, SRC_MAC).err().unwrap());
    assert!(e.contains("--dst-mac") && e.contains("not a MAC"), "{e}");
    let mut a = args(TrafficKind::Write);
    a.first_qp = PSN_MASK;
    assert!(FrameSource::new(&a, SRC_MAC).is_err());
    let mut a = args(TrafficKind::Write);
    a.dscp = 64;
    assert!(FrameSource::new(&a, SRC_MAC).is_err());
}

#[test]
fn token_bucket_paces_to_the_rate() {
    // Time is stepped, not measured: the bucket gives 20 kpps whatever the
    // machine's load, and never more than `BURST` at once.
    let mut b = TokenBucket::new(20_000, BURST);
    let start = Instant::now();
    let mut now = start;
    let mut got = 0;
    while got < 2_000 {
        match b.take_at(now, BURST) {
            Ok(n) => {
                assert!(n <= BURST);
                got += n;
            }
            // Oversleep a little, as a real sleep does.
            Err(wait) => now += wait + Duration::from_micros(10),
        }
    }
    let secs = (now - start).as_secs_f64();
    // 2000 packets at 20 kpps: 0.1 s (minus the first burst).
    assert!((0.09..0.11).contains(&secs), "{secs}");
    // A sender that was away for a second gets one burst, not a second's worth.
    now += Duration::from_secs(1);
    assert_eq!(b.take_at(now, u64::MAX), Ok(BURST));
    assert!(b.take_at(now, 1).is_err());
}

#[test]
fn pacer_sends_calls_when_due_and_bounds_the_catch_up() {
    // 100 calls of 1,000 frames at 1 Mpps: 0.1 s.
    let mut p = Pacer::new(1_000_000);
    let start = Instant::now();
    for call in 0..100u64 {
        p.wait(call * 1_000);
    }
    let secs = start.elapsed().as_secs_f64();
    assert!((0.098..0.3).contains(&secs), "{secs}");
    // A sender 50 ms later than MAX_LAG catches up MAX_LAG of it and
    // drops the other 50 ms from the schedule.
    let mut p = Pacer::new(1_000_000);
    std::thread::sleep(Pacer::MAX_LAG + Duration::from_millis(50));
    let t = Instant::now();
    p.wait(0);
    // Due 10 ms after the moment it woke, plus the 50 ms dropped.
    let frame = (Pacer::MAX_LAG + Duration::from_millis(60)).as_micros() as u64;
    p.wait(frame);
    let waited = t.elapsed().as_secs_f64();
    assert!((0.055..0.15).contains(&waited), "{waited}");
}

#[test]
fn cpu_pins_narrow_the_mask_and_restore_it() {
    // On a thread of its own: the pins change the calling thread only.
    std::thread::spawn(|| {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        {
            let _pin = CpuPin::new(allowed[0]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), [allowed[0]]);
        }
        assert_eq!(allowed_cpus().unwrap(), allowed);
        {
            let _pin = CpuPin::except(allowed[0]).unwrap();
            let want = if allowed.len() > 1 { &allowed[1..] } else { &allowed[..] };
            assert_eq!(allowed_cpus().unwrap(), want);
        }
        assert_eq!(allowed_cpus().unwrap(), allowed);
    })
    .join()
    .unwrap();
}

#[test]
fn hold_names_carry_their_owner() {
    assert_eq!(hold_owner("r2h3fffff.fff"), Some(0x3fffff));
    assert_eq!(hold_owner("r2h1a.0"), Some(0x1a));
    assert_eq!(hold_owner("r2h1a.0p"), None, "the peer goes with its pair");
    assert_eq!(hold_owner("r2h.0"), None);
    assert_eq!(hold_owner("r2h12"), None);
    assert_eq!(hold_owner("eth0"), None);
    assert!(format!("{HOLD_PREFIX}{:x}.{:x}p", 0x400000, 0xFFF).len() <= 15);
}

#[test]
fn xdp_md_layout() {
    let md = xdp_md(100, 7);
    assert_eq!(md[4..8], 100u32.to_ne_bytes());
    assert_eq!(md[12..16], 7u32.to_ne_bytes());
    assert_eq!(md[..4], [0; 4]);
    assert_eq!(md[16..], [0; 8]);
}
