//! Domain types, no I/O: what a dead letter is, the closed vocabularies it uses (status, failure
//! class), the newtypes that are parsed once at the edge (ids, partitions, keys), and the two
//! input shapes that producers post (n8n's Error Trigger item and the generic envelope).
//!
//! This module imports nothing else of ours; everything else may import it.

pub mod delivery;
mod ids;
mod input;
mod record;
pub mod status;

pub use delivery::{Backoff, BodyMode};
pub use ids::{Fingerprint, Partition, RecordId, ShortText};
pub use input::{
    parse_envelope, parse_error_trigger, InputError, ParsedFailure, Source, MAX_KEY_BYTES,
};
pub use record::{EventKind, FailureClass, FailureFacts, Role, Status};
pub use status::{Move, MoveError, Mover};

/// Parse a time given by an operator: RFC 3339 (`2026-11-29T10:00:00Z`), or a date
/// (`2026-11-29`, meaning its midnight UTC). Returns unix milliseconds.
pub fn parse_timestamp(s: &str) -> Result<i64, String> {
    use chrono::{DateTime, NaiveDate};
    if let Ok(t) = DateTime::parse_from_rfc3339(s.trim()) {
        return Ok(t.timestamp_millis());
    }
    if let Ok(d) = NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc().timestamp_millis());
        }
    }
    Err(format!(
        "`{s}` is not a time: use RFC 3339 (2026-11-29T10:00:00Z) or a date (2026-11-29)"
    ))
}
