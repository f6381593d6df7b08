//! Load-time feature switches.
//!
//! `FEATURES` is a constant in the object's read-only data that the control
//! program overrides before loading (rocev2_common::features). The kernel
//! freezes that data, so the verifier knows the value and drops the code of
//! every feature that is off: a plain hashing config runs no flowlet, pin,
//! class or ECN instructions at all.
//!
//! Adding a gated feature: give it a bit in
//! `rocev2_common::features::Features` (set by `Config::features` when the
//! config uses it), put its code in its own module, and call it from the
//! pipeline as `if enabled(Features::X) { x::run(..) }`: one small call,
//! so the pipeline reads the same with the feature on or off.

use aya_ebpf::Global;
use rocev2_common::features::Features;

/// Overridden at load time; an object loaded without an override runs
/// every feature.
#[unsafe(no_mangle)]
static FEATURES: Global<u32> = Global::new(Features::ALL.0);

/// Whether `feature` (any of its bits, for a set such as
/// `Features::FLOWLET`) is in the loaded program. A constant to the verifier.
#[inline(always)]
pub fn enabled(feature: Features) -> bool {
    FEATURES.load() & feature.0 != 0
}
