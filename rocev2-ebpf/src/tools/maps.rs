//! The tools object's own maps. None is shared with the forwarding
//! programs: a tool never writes into a running dataplane's state.

use aya_ebpf::{
    macros::map,
    maps::{Array, DevMap, DevMapHash},
};
use rocev2_common::maps::{GenRewrite, MAX_DIRECT_IFINDEX, MAX_EGRESS_DEVS};

/// What the generator's XDP_TX program restores in each frame (see GenRewrite).
#[map]
pub static GEN_REWRITE: Array<GenRewrite> = Array::with_max_entries(1, 0);

/// Where the benchmark's floor (index 0 of EGRESS_DEVS_DIRECT; no real
/// ifindex is 0) and FIB peer (the egress ifindex) redirect to, split as
/// the forwarding object's maps are (redirect.rs).
#[map]
pub static EGRESS_DEVS: DevMapHash = DevMapHash::with_max_entries(MAX_EGRESS_DEVS, 0);

#[map]
pub static EGRESS_DEVS_DIRECT: DevMap = DevMap::with_max_entries(MAX_DIRECT_IFINDEX, 0);
