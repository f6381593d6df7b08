//! BTH decoding: any 12 bytes decode, re-encode to the same bytes (less the
//! reserved bits the struct does not model) and decode again to the same BTH.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocev2_common::bth::{self, Bth, BTH_LEN};

const MODELLED: [u8; BTH_LEN] = [0xFF, 0xB0, 0xFF, 0xFF, 0xC0, 0xFF, 0xFF, 0xFF, 0x80, 0xFF, 0xFF, 0xFF];

fuzz_target!(|data: &[u8]| {
    let Some(wire) = data.get(..BTH_LEN) else { return };
    let wire: [u8; BTH_LEN] = wire.try_into().unwrap();
    let b = Bth::parse(&wire);
    let back = b.to_bytes();
    for i in 0..BTH_LEN {
        assert_eq!(back[i], wire[i] & MODELLED[i], "byte {i}");
    }
    assert_eq!(Bth::parse(&back), b);
    assert_eq!(b.dest_qp, bth::dest_qp(&wire));
    assert!(b.dest_qp <= 0xFF_FFFF && b.psn <= 0xFF_FFFF && b.pad_count <= 3);
    if b.opcode != bth::opcode::CNP {
        assert_eq!(bth::ends_message(b.opcode), bth::ends_message(b.opcode & 0x1F));
    }
});
