//! One log line when a table of the dataplane fills up, and one when it has
//! room again: a full route table leaves further learned prefixes to the
//! kernel, a full flowlet table evicts flows (which may then change path
//! inside what would have been one flowlet).

use std::{collections::BTreeSet, sync::Mutex};

/// Above this share of its capacity a table is reported as filling up...
const WARN_AT: f64 = 0.90;
/// ...and below this it is reported as having room again.
const CLEAR_BELOW: f64 = 0.80;

static FULL: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// How full one table is.
pub struct Fill {
    pub table: &'static str,
    pub used: u64,
    pub capacity: u64,
    /// What happens when it is full, and what to do.
    pub hint: &'static str,
}

/// Logs the tables that crossed a threshold since the last call.
pub fn check(fills: &[Fill]) {
    let mut full = FULL.lock().unwrap_or_else(|e| e.into_inner());
    for f in fills.iter().filter(|f| f.capacity > 0) {
        let share = f.used as f64 / f.capacity as f64;
        if share >= WARN_AT && full.insert(f.table) {
            tracing::warn!(
                table = f.table,
                used = f.used,
                capacity = f.capacity,
                "{} is {:.0}% full ({} of {}): {}",
                f.table,
                share * 100.0,
                f.used,
                f.capacity,
                f.hint
            );
        } else if share < CLEAR_BELOW && full.remove(f.table) {
            tracing::info!(
                table = f.table,
                used = f.used,
                capacity = f.capacity,
                "{} has room again ({} of {})",
                f.table,
                f.used,
                f.capacity
            );
        }
    }
}
