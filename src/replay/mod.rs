//! Delivery: getting records back where they belong, gently and never twice by accident.
//!
//! - `target`: which target a record goes to (its replay_url, a configured target, or — when
//!   allowed — the n8n webhook its item came from) and with what settings.
//! - `gate`: per target, a token-bucket rate limiter that starts low and ramps while errors
//!   stay rare, and a circuit breaker. Time is passed in.
//! - `dispatcher`: one HTTP send with the idempotency headers, classified as success,
//!   transient (retry) or permanent (a person must look), with a capped, redacted excerpt of
//!   the answer. Used by automatic retries and (next) operator replays alike.
//! - `scheduler`: the loop that finds due records, claims them with a lease, sends, and moves
//!   them on; at start it returns every leased record to its queue.
//!
//! It never writes SQL: every state change goes through the store's writer.

pub mod dispatcher;
pub mod gate;
pub mod jobs;
pub mod scheduler;
pub mod target;

pub use dispatcher::{Dispatcher, Sent, Verdict};
pub use gate::{Breaker, BreakerState, Gate, RateLimiter};
pub use scheduler::Scheduler;
pub use target::{ResolvedTarget, Targets};
