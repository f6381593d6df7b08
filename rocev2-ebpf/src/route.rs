//! Longest-prefix route lookup behind a per-CPU destination cache.

use aya_ebpf::maps::lpm_trie::Key;
use rocev2_common::{
    counters::PortCounter,
    hash::{ipv4_words, ipv6_words},
    maps::{route_cache_slot, route_target, RouteTarget, CACHED_NO_ROUTE},
};

use crate::{
    maps::{CONFIG, ROUTES_V4, ROUTES_V6, ROUTE_CACHE},
    parse::{pass, Outcome},
};

/// The group routing `dst`, or why the packet goes to the kernel.
#[inline(always)]
pub fn group_v4(dst: [u8; 4]) -> Result<u32, Outcome> {
    group_of(cached_route(4, &ipv4_words(dst), || ROUTES_V4.get(Key::new(32, dst)).map(|r| r.group)))
}

/// [`group_v4`] for IPv6; the address is borrowed from the packet.
#[inline(always)]
pub fn group_v6(dst: &[u8; 16]) -> Result<u32, Outcome> {
    group_of(cached_route(6, &ipv6_words(dst), || ROUTES_V6.get(Key::new(128, *dst)).map(|r| r.group)))
}

#[inline(always)]
fn group_of(target: u32) -> Result<u32, Outcome> {
    match route_target(target) {
        RouteTarget::NoRoute => Err(pass(PortCounter::PassNoRoute)),
        RouteTarget::Local => Err(pass(PortCounter::PassLocal)),
        RouteTarget::Kernel => Err(pass(PortCounter::PassKernelRoute)),
        RouteTarget::Group(group) => Ok(group),
    }
}

/// The route target of `dst` (family 4 or 6): from this CPU's ROUTE_CACHE
/// when the slot holds `dst` from the current route generation, else from
/// `lookup` (the LPM trie), which then fills the slot
/// ([`rocev2_common::maps::RouteCacheEntry::cached_target`]).
#[inline(always)]
fn cached_route(family: u32, dst: &[u32; 4], lookup: impl FnOnce() -> Option<u32>) -> u32 {
    // The generation is read before the trie: a result stored under it is
    // discarded by the bump that follows any route change.
    let generation = CONFIG.get(0).map_or(0, |c| c.route_generation);
    let Some(slot) = ROUTE_CACHE.get_ptr_mut(route_cache_slot(dst)) else {
        return lookup().unwrap_or(CACHED_NO_ROUTE);
    };
    // SAFETY: this CPU's own slot; nothing else runs on it meanwhile.
    unsafe { &mut *slot }.cached_target(family, generation, dst, lookup)
}
