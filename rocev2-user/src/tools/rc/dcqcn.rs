//! DCQCN's reaction point: the requester's per-QP rate limiter that
//! slows down on CNPs and climbs back without them (Zhu et al., SIGCOMM
//! 2015, "Congestion Control for Large-Scale RDMA Deployments", section 3.3).
//!
//! State per QP: the current rate Rc, the target rate Rt and α, the
//! estimate of how congested the path is.
//!
//! - A CNP (at most one reaction per [`DcqcnParams::decrease_interval`]):
//!   Rt = Rc, Rc = Rc (1 - α/2), α = (1 - g) α + g, and the increase
//!   stages start over.
//! - Every [`DcqcnParams::alpha_period`] without a CNP: α = (1 - g) α.
//! - Every [`DcqcnParams::increase_period`] without a CNP, one increase
//!   stage: the first `fast_recovery` stages halve the distance to Rt
//!   (Rc = (Rt + Rc) / 2); then additive increase (Rt += R_AI first) for
//!   as many stages again; after that hyper increase (Rt += R_HAI).
//!
//! NICs count their periods in microseconds for 25-100 Gbit/s links (α
//! timer 55 µs, rate-increase timer 300 µs, CNPs at most every 50 µs);
//! the lab's links are a thousand times slower, so its periods are counted
//! in frame times at the link rate instead ([`DcqcnParams::for_link`]): the
//! algorithm sees about as many packets per period as on a real fabric. The
//! byte counter of the paper's increase events is left out (timer only).

use std::time::{Duration, Instant};

use serde::Serialize;

/// The knobs of the reaction point.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DcqcnParams {
    /// The line rate a QP starts at and never exceeds (bits per second).
    pub line_bps: f64,
    /// α's gain (the paper's g).
    pub g: f64,
    pub alpha_period: Duration,
    pub increase_period: Duration,
    /// At most one rate cut per this long (NICs: the rate reduction period).
    pub decrease_interval: Duration,
    /// Increase stages of fast recovery (the paper's F).
    pub fast_recovery: u32,
    /// Additive and hyper increase steps of the target rate (bits per second).
    pub rate_ai_bps: f64,
    pub rate_hai_bps: f64,
    /// The rate never drops below this (bits per second).
    pub min_bps: f64,
}

/// Frame time periods of [`DcqcnParams::for_link`].
const ALPHA_FRAMES: f64 = 16.0;
const INCREASE_FRAMES: f64 = 16.0;
const DECREASE_FRAMES: f64 = 8.0;

impl DcqcnParams {
    /// The lab's parameters for a link of `line_bps` carrying frames of
    /// `frame_bytes`: g = 1/16, α and increase periods of 16 frame times,
    /// one cut per 4 frame times, F = 5, R_AI = 2% and R_HAI = 10% of the
    /// line rate, at least 1% of it.
    pub fn for_link(line_bps: u64, frame_bytes: u64) -> Self {
        let line = line_bps as f64;
        let frame = Duration::from_secs_f64(frame_bytes as f64 * 8.0 / line);
        Self {
            line_bps: line,
            g: 1.0 / 16.0,
            alpha_period: frame.mul_f64(ALPHA_FRAMES),
            increase_period: frame.mul_f64(INCREASE_FRAMES),
            decrease_interval: frame.mul_f64(DECREASE_FRAMES),
            fast_recovery: 5,
            rate_ai_bps: line * 0.02,
            rate_hai_bps: line * 0.10,
            min_bps: line * 0.01,
        }
    }
}

/// One QP's reaction point.
#[derive(Clone, Debug)]
pub struct Dcqcn {
    pub params: DcqcnParams,
    /// Rc and Rt, bits per second.
    pub rate_bps: f64,
    pub target_bps: f64,
    pub alpha: f64,
    last_cut: Option<Instant>,
    last_alpha: Instant,
    last_increase: Instant,
    stage: u32,
    /// CNPs received and rate cuts made.
    pub cnps: u64,
    pub cuts: u64,
    /// The lowest rate reached.
    pub min_seen_bps: f64,
}

impl Dcqcn {
    pub fn new(params: DcqcnParams, now: Instant) -> Self {
        Self {
            params,
            rate_bps: params.line_bps,
            target_bps: params.line_bps,
            alpha: 1.0,
            last_cut: None,
            last_alpha: now,
            last_increase: now,
            stage: 0,
            cnps: 0,
            cuts: 0,
            min_seen_bps: params.line_bps,
        }
    }

    /// A CNP arrived for this QP.
    pub fn on_cnp(&mut self, now: Instant) {
        self.cnps += 1;
        let p = &self.params;
        if self.last_cut.is_some_and(|t| now.duration_since(t) < p.decrease_interval) {
            return;
        }
        self.last_cut = Some(now);
        self.cuts += 1;
        self.target_bps = self.rate_bps;
        self.rate_bps = (self.rate_bps * (1.0 - self.alpha / 2.0)).max(p.min_bps);
        self.alpha = (1.0 - p.g) * self.alpha + p.g;
        self.min_seen_bps = self.min_seen_bps.min(self.rate_bps);
        self.stage = 0;
        self.last_alpha = now;
        self.last_increase = now;
    }

    /// Runs the timers up to `now`.
    pub fn tick(&mut self, now: Instant) {
        let p = self.params;
        while now.duration_since(self.last_alpha) >= p.alpha_period {
            self.last_alpha += p.alpha_period;
            self.alpha *= 1.0 - p.g;
        }
        while now.duration_since(self.last_increase) >= p.increase_period {
            self.last_increase += p.increase_period;
            if self.rate_bps >= p.line_bps {
                continue;
            }
            self.stage += 1;
            if self.stage > 2 * p.fast_recovery {
                self.target_bps += p.rate_hai_bps;
            } else if self.stage > p.fast_recovery {
                self.target_bps += p.rate_ai_bps;
            }
            self.target_bps = self.target_bps.min(p.line_bps);
            self.rate_bps = ((self.rate_bps + self.target_bps) / 2.0).min(p.line_bps);
            // Halving the distance never quite gets there: within 1% it has.
            if self.target_bps - self.rate_bps < self.target_bps * 0.01 {
                self.rate_bps = self.target_bps;
            }
        }
    }

    /// How long a frame of `bytes` occupies the QP's rate.
    pub fn gap(&self, bytes: usize) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / self.rate_bps)
    }

    /// When the timers next change something.
    pub fn next_timer(&self) -> Instant {
        (self.last_alpha + self.params.alpha_period).min(self.last_increase + self.params.increase_period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dcqcn_cuts_on_cnps_and_recovers_without_them() {
        let p = DcqcnParams::for_link(20_000_000, 1082);
        assert_eq!(p.increase_period, Duration::from_nanos(6_924_800));
        let t0 = Instant::now();
        let mut d = Dcqcn::new(p, t0);
        d.on_cnp(t0);
        // α = 1: the first cut halves the rate.
        assert_eq!((d.rate_bps, d.target_bps), (10e6, 20e6));
        assert!((d.alpha - (1.0 - 1.0 / 16.0 + 1.0 / 16.0)).abs() < 1e-12);
        // A second CNP within the decrease interval changes nothing.
        d.on_cnp(t0 + p.decrease_interval / 2);
        assert_eq!((d.cnps, d.cuts, d.rate_bps), (2, 1, 10e6));
        d.on_cnp(t0 + p.decrease_interval);
        assert_eq!(d.cuts, 2);
        assert!(d.rate_bps < 10e6 * 0.51);
        let low = d.rate_bps;
        // Five fast-recovery stages close most of the gap to the target (10 Mbit/s).
        let t1 = t0 + p.decrease_interval;
        d.tick(t1 + p.increase_period * 5);
        assert!(d.rate_bps > low && d.rate_bps < 10e6, "{}", d.rate_bps);
        assert!(d.alpha < 1.0);
        // Then additive and hyper increase bring it back to the line rate.
        d.tick(t1 + p.increase_period * 60);
        assert_eq!(d.rate_bps, 20e6);
        assert!(d.min_seen_bps <= low);
        assert_eq!(d.gap(1250), Duration::from_micros(500));
    }
}
