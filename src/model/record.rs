//! The closed vocabularies of a record: its status, its failure class, and the kinds of audit
//! event. Each is stored and sent as its snake_case name.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What the producer told us about a failure, beside its documents: where it happened
/// (workflow, execution, node), what the error said, and the producer's own identity and
/// routing keys. One struct from parsing through storage to every read, so a field added here
/// is added everywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FailureFacts {
    pub workflow_id: Option<String>,
    pub workflow_name: Option<String>,
    pub execution_id: Option<String>,
    pub execution_url: Option<String>,
    pub execution_mode: Option<String>,
    /// n8n's `execution.retryOf`: the execution this one retried.
    pub retry_of: Option<String>,
    pub node_name: Option<String>,
    pub node_type: Option<String>,
    pub http_status: Option<u16>,
    /// A non-HTTP code: ECONNREFUSED, ETIMEDOUT, ERR_BAD_RESPONSE …
    pub error_code: Option<String>,
    pub error_name: Option<String>,
    /// Redacted and cut to 1 KiB; the whole error object is kept apart.
    pub error_message: Option<String>,
    pub idempotency_key: Option<String>,
    pub external_event_id: Option<String>,
    pub correlation_id: Option<String>,
    pub tenant_id: Option<String>,
    pub contract_version: Option<String>,
    pub business_object_type: Option<String>,
    pub business_object_id: Option<String>,
    /// Where a replay of this record goes, when the producer named it.
    pub replay_url: Option<String>,
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!(
                        "`{}` is not a {}; expected one of: {}",
                        s,
                        stringify!($name),
                        [$($text),+].join(", ")
                    )),
                }
            }
        }
    };
}

named_enum! {
    /// Where a record stands. The legal moves between these (and their audit) come with triage;
    /// ingest only ever creates `new` records.
    Status {
        New => "new",
        RetryScheduled => "retry_scheduled",
        Retrying => "retrying",
        Review => "review",
        ReadyForReplay => "ready_for_replay",
        Replaying => "replaying",
        Replayed => "replayed",
        ReplayFailed => "replay_failed",
        Resolved => "resolved",
        Skipped => "skipped",
    }
}

impl Status {
    /// Closed records are done with: a new failure with the same key starts a new record
    /// instead of counting as another occurrence of the closed one.
    pub const CLOSED: &'static [Status] = &[Status::Replayed, Status::Resolved, Status::Skipped];

    pub fn is_closed(self) -> bool {
        Self::CLOSED.contains(&self)
    }

    pub fn is_open(self) -> bool {
        !Self::CLOSED.contains(&self)
    }
}

named_enum! {
    /// Why an item failed, which decides what may be done about it (see DESIGN.md's table).
    FailureClass {
        Transient => "transient",
        RateLimited => "rate_limited",
        Auth => "auth",
        Validation => "validation",
        Conflict => "conflict",
        Business => "business",
        Unknown => "unknown",
    }
}

named_enum! {
    /// What an API token may do. `ingest`: post failures (what n8n gets); `operator`: read,
    /// triage and request replays; `admin`: everything, including approving replay jobs.
    Role {
        Ingest => "ingest",
        Operator => "operator",
        Admin => "admin",
    }
}

named_enum! {
    /// What an audit event records.
    EventKind {
        Created => "created",
        StatusChanged => "status_changed",
        Assigned => "assigned",
        Tagged => "tagged",
        PayloadEdited => "payload_edited",
        Noted => "noted",
        Enriched => "enriched",
        EnrichmentRequested => "enrichment_requested",
        EnrichmentUnavailable => "enrichment_unavailable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), *s);
        }
        for c in FailureClass::ALL {
            assert_eq!(c.as_str().parse::<FailureClass>().unwrap(), *c);
        }
        let err = "nope".parse::<FailureClass>().unwrap_err();
        assert!(err.contains("rate_limited"), "{err}");
    }

    #[test]
    fn only_replayed_resolved_and_skipped_are_closed() {
        let closed: Vec<_> = Status::ALL.iter().filter(|s| !s.is_open()).collect();
        assert_eq!(
            closed,
            vec![&Status::Replayed, &Status::Resolved, &Status::Skipped]
        );
    }
}
