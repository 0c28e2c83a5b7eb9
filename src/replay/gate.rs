//! Per target: a token-bucket rate limiter that starts low and ramps up while errors stay rare,
//! and a circuit breaker. Pure state machines: every call takes `now`.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::TargetSettings;

/// Sends per second, starting at `initial`, doubling every `ramp_every` in which fewer than
/// 0.5 % of sends failed, never above `max`; halving (not below `initial`) on every failure.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    pub rate: f64,
    initial: f64,
    max: f64,
    ramp_every: Duration,
    tokens: f64,
    last: Instant,
    window_start: Instant,
    window_sent: u64,
    window_failed: u64,
}

/// The error ratio under which the rate may ramp up.
pub const RAMP_MAX_ERROR_RATIO: f64 = 0.005;

impl RateLimiter {
    pub fn new(initial: f64, max: f64, ramp_every: Duration, now: Instant) -> RateLimiter {
        RateLimiter {
            rate: initial,
            initial,
            max,
            ramp_every,
            tokens: 1.0,
            last: now,
            window_start: now,
            window_sent: 0,
            window_failed: 0,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        // A burst of at most one second's worth (and at least one send).
        self.tokens = (self.tokens + dt * self.rate).min(self.rate.max(1.0));
        self.last = now;
    }

    /// Take a token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Count a send's result and adjust the rate.
    pub fn record(&mut self, ok: bool, now: Instant) {
        self.window_sent += 1;
        if !ok {
            self.window_failed += 1;
            self.rate = (self.rate / 2.0).max(self.initial);
        }
        if now.saturating_duration_since(self.window_start) >= self.ramp_every {
            let ratio = self.window_failed as f64 / self.window_sent as f64;
            if ratio < RAMP_MAX_ERROR_RATIO {
                self.rate = (self.rate * 2.0).min(self.max);
            }
            self.window_start = now;
            self.window_sent = 0;
            self.window_failed = 0;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

/// Opens after `failures` consecutive failures; while open nothing is sent; after `cooldown`
/// one probe goes through (half-open); its success closes the breaker, its failure reopens it.
#[derive(Debug, Clone)]
pub struct Breaker {
    failures: u32,
    cooldown: Duration,
    consecutive: u32,
    state: BreakerState,
    open_until: Option<Instant>,
    probe_in_flight: bool,
    /// How many times it opened (for metrics).
    pub opened_total: u64,
}

impl Breaker {
    pub fn new(failures: u32, cooldown: Duration) -> Breaker {
        Breaker {
            failures: failures.max(1),
            cooldown,
            consecutive: 0,
            state: BreakerState::Closed,
            open_until: None,
            probe_in_flight: false,
            opened_total: 0,
        }
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Would `allow` say yes now? (Changes nothing.)
    pub fn would_allow(&self, now: Instant) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::Open => self.open_until.is_some_and(|u| now >= u),
            BreakerState::HalfOpen => !self.probe_in_flight,
        }
    }

    /// May a send go now? In half-open state only one (the probe) at a time.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::Open => {
                if self.open_until.is_some_and(|u| now >= u) {
                    self.state = BreakerState::HalfOpen;
                    self.probe_in_flight = true;
                    true
                } else {
                    false
                }
            }
            BreakerState::HalfOpen => {
                if self.probe_in_flight {
                    false
                } else {
                    self.probe_in_flight = true;
                    true
                }
            }
        }
    }

    pub fn record(&mut self, ok: bool, now: Instant) {
        if ok {
            self.state = BreakerState::Closed;
            self.consecutive = 0;
            self.probe_in_flight = false;
            self.open_until = None;
            return;
        }
        self.consecutive += 1;
        let trip = match self.state {
            BreakerState::HalfOpen => true,
            BreakerState::Closed => self.consecutive >= self.failures,
            BreakerState::Open => false,
        };
        if trip {
            self.state = BreakerState::Open;
            self.open_until = Some(now + self.cooldown);
            self.probe_in_flight = false;
            self.opened_total += 1;
        }
    }
}

/// Everything that paces one target.
#[derive(Debug, Clone)]
pub struct Gate {
    pub rate: RateLimiter,
    pub breaker: Breaker,
    pub in_flight: usize,
    /// Times a due record waited because the breaker was open (for metrics).
    pub paused_total: u64,
}

impl Gate {
    pub fn new(s: &TargetSettings, now: Instant) -> Gate {
        Gate {
            rate: RateLimiter::new(s.rate_initial, s.rate_max, s.rate_ramp_every, now),
            breaker: Breaker::new(s.breaker_failures, s.breaker_cooldown),
            in_flight: 0,
            paused_total: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_starts_low_ramps_while_healthy_and_drops_on_errors() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(1.0, 8.0, Duration::from_secs(300), t0);
        assert!(r.try_take(t0));
        assert!(!r.try_take(t0), "one per second at first");
        assert!(r.try_take(t0 + Duration::from_secs(1)));
        let mut now = t0;
        for window in 1..=4 {
            for _ in 0..10 {
                r.record(true, now);
            }
            now += Duration::from_secs(300);
            r.record(true, now);
            assert_eq!(r.rate, (2f64.powi(window)).min(8.0), "window {window}");
        }
        r.record(false, now);
        assert_eq!(r.rate, 4.0, "an error halves the rate");
        // A window with more than 0.5 % errors does not ramp.
        for _ in 0..50 {
            r.record(true, now);
        }
        now += Duration::from_secs(300);
        r.record(true, now);
        assert_eq!(r.rate, 4.0);
    }

    #[test]
    fn the_breaker_opens_probes_once_and_closes_on_success() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(30));
        for _ in 0..2 {
            assert!(b.allow(t0));
            b.record(false, t0);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.record(false, t0);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(
            !b.allow(t0 + Duration::from_secs(29)),
            "nothing is sent while open"
        );
        let t1 = t0 + Duration::from_secs(30);
        assert!(b.allow(t1), "the probe");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.allow(t1), "one probe at a time");
        b.record(false, t1);
        assert_eq!(b.state(), BreakerState::Open, "a failed probe reopens");
        assert_eq!(b.opened_total, 2);
        let t2 = t1 + Duration::from_secs(30);
        assert!(b.allow(t2));
        b.record(true, t2);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow(t2) && b.allow(t2));
    }
}
