//! Pacing the sender to a rate, and pinning it to a CPU.

#[allow(unused_imports, reason = "the parent's items and imports, of which this part uses some")]
use super::*;

/// A token bucket on the monotonic clock: `rate` tokens per second, at most
/// `burst` saved up, so a rate-limited sender goes out in small bursts
/// rather than sleeping between every packet.
pub(super) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(super) fn new(rate: u64, burst: u64) -> Self {
        // Start with one token so the first packet leaves at once.
        Self { rate: rate as f64, burst: burst as f64, tokens: 1.0, last: Instant::now() }
    }

    /// Waits until at least one token is there; takes and returns up to `want`.
    pub(super) fn take(&mut self, want: u64) -> u64 {
        loop {
            match self.take_at(Instant::now(), want) {
                Ok(n) => return n,
                Err(wait) if wait > Duration::from_micros(200) => std::thread::sleep(wait),
                Err(_) => std::hint::spin_loop(),
            }
        }
    }

    /// The bucket at time `now`: takes and returns up to `want` tokens, or
    /// says how long until the next one is there. Apart from the clock so a
    /// test can step time.
    pub(super) fn take_at(&mut self, now: Instant, want: u64) -> Result<u64, Duration> {
        self.tokens =
            (self.tokens + now.saturating_duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            let n = (self.tokens.floor() as u64).min(want).max(1);
            self.tokens -= n as f64;
            return Ok(n);
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
    }
}

/// Paces live frames: the frame numbered `sent` is due at `start + sent /
/// rate`, and a call of `--live-repeat` frames starts when its first frame
/// is due (it then goes out as fast as the kernel sends). A sender that
/// fell behind (descheduled) catches up by sending calls back to back, but
/// never more than [`Pacer::MAX_LAG`] of backlog: beyond that the schedule
/// moves on and the report shows the lower rate.
pub(super) struct Pacer {
    rate: f64,
    start: Instant,
}

impl Pacer {
    /// 100 ms: a descheduled sender (seen: stalls of tens of ms on a busy
    /// 2-CPU VM) keeps its average rate; 10 ms lost up to 6 % of it.
    pub(super) const MAX_LAG: Duration = Duration::from_millis(100);

    pub(super) fn new(rate: u64) -> Self {
        Self { rate: rate as f64, start: Instant::now() }
    }

    /// Waits until frame `sent` is due.
    pub(super) fn wait(&mut self, sent: u64) {
        loop {
            let due = self.start + Duration::from_secs_f64(sent as f64 / self.rate);
            let now = Instant::now();
            if now >= due {
                if now - due > Self::MAX_LAG {
                    self.start += now - due - Self::MAX_LAG;
                }
                return;
            }
            // Sleep rather than spin: the CPU is the forwarding path's
            // (and the control plane's) meanwhile. A late wake-up is made
            // up by the next calls.
            let wait = due - now;
            if wait > Duration::from_micros(20) {
                std::thread::sleep(wait);
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Pins the calling thread to a set of CPUs until dropped (then restores
/// its previous CPU set).
pub struct CpuPin {
    previous: libc::cpu_set_t,
}

impl CpuPin {
    /// Runs the calling thread on `cpu` only.
    pub fn new(cpu: usize) -> Result<Self> {
        Self::to(&[cpu])
    }

    /// Runs the calling thread, and the threads and processes it starts
    /// from now on, on the CPUs it may use now but `cpu`: keeps
    /// control-plane work off a CPU that forwards (what `taskset` or
    /// systemd's `CPUAffinity=` do for an operator). With no other CPU
    /// there is nowhere else to go, so nothing changes.
    pub fn except(cpu: usize) -> Result<Self> {
        let allowed = allowed_cpus()?;
        let others: Vec<usize> = allowed.iter().copied().filter(|&c| c != cpu).collect();
        Self::to(if others.is_empty() { &allowed } else { &others })
    }

    pub(super) fn to(cpus: &[usize]) -> Result<Self> {
        let previous = affinity()?;
        // SAFETY: cpu_set_t is plain data; the call gets a valid pointer and
        // size, and pid 0 means the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                bail!("cannot pin the thread to CPUs {cpus:?}: {}", std::io::Error::last_os_error());
            }
        }
        Ok(Self { previous })
    }
}

/// The calling thread's affinity mask.
pub(super) fn affinity() -> Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; the call gets a valid pointer and
    // size, and pid 0 means the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            bail!("cannot read the CPU affinity: {}", std::io::Error::last_os_error());
        }
        Ok(set)
    }
}

/// The CPUs the calling thread may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    let set = affinity()?;
    // SAFETY: CPU_ISSET reads the plain-data set for indexes below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

impl Drop for CpuPin {
    fn drop(&mut self) {
        // SAFETY: restores the set read in `new` for the calling thread.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.previous) };
    }
}
