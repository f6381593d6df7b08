//! SIGINT as a flag for the traffic tools (`gen`, `sink`), through
//! signal-hook: the first Ctrl-C asks them to stop and print their report,
//! a second one ends the process at once (the default action). The daemon
//! (`run`) takes its signals through tokio instead.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex, OnceLock,
};

use signal_hook::consts::SIGINT;

/// Set by SIGINT; registered once per process.
static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// Guards alive now: the flag is cleared when the first one starts, so one
/// interrupted run does not stop the next in the same process (tests).
static ACTIVE_GUARDS: Mutex<usize> = Mutex::new(0);

fn interrupted_flag() -> &'static Arc<AtomicBool> {
    INTERRUPTED.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        // This order makes a second SIGINT (flag already set) terminate.
        // Registration fails only for signals that cannot be caught.
        let _ = signal_hook::flag::register_conditional_default(SIGINT, Arc::clone(&flag));
        let _ = signal_hook::flag::register(SIGINT, Arc::clone(&flag));
        flag
    })
}

/// While alive, SIGINT sets [`SigintGuard::interrupted`] instead of ending
/// the process. Concurrent guards (tests) share the flag.
pub struct SigintGuard;

impl SigintGuard {
    pub fn install() -> Self {
        let flag = interrupted_flag();
        let mut active = ACTIVE_GUARDS.lock().unwrap_or_else(|e| e.into_inner());
        if *active == 0 {
            flag.store(false, Ordering::Relaxed);
        }
        *active += 1;
        SigintGuard
    }

    pub fn interrupted() -> bool {
        interrupted_flag().load(Ordering::Relaxed)
    }
}

impl Drop for SigintGuard {
    fn drop(&mut self) {
        let mut active = ACTIVE_GUARDS.lock().unwrap_or_else(|e| e.into_inner());
        *active = active.saturating_sub(1);
    }
}
