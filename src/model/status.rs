//! The status machine: one explicit table of legal moves, who may make each (an operator
//! through the API/CLI, or the system: the retry scheduler and the replay dispatcher), and
//! which moves need a reason. The HTTP API and the CLI refuse anything else with a message
//! naming the allowed moves; README's diagram is generated from this table (a test checks).

use super::record::Status;

/// Who makes a move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mover {
    /// A person, through the API or the CLI.
    Operator,
    /// deadletter itself: retries, replays, leases.
    System,
}

/// One legal move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub from: Status,
    pub to: Status,
    pub by: Mover,
    /// The move must say why (skipping, reopening).
    pub needs_reason: bool,
}

const fn op(from: Status, to: Status) -> Move {
    Move {
        from,
        to,
        by: Mover::Operator,
        needs_reason: false,
    }
}

const fn op_why(from: Status, to: Status) -> Move {
    Move {
        from,
        to,
        by: Mover::Operator,
        needs_reason: true,
    }
}

const fn sys(from: Status, to: Status) -> Move {
    Move {
        from,
        to,
        by: Mover::System,
        needs_reason: false,
    }
}

use Status::*;

/// Every legal move. Anything not here is refused.
pub const MOVES: &[Move] = &[
    // Triage of a fresh record.
    op(New, Review),
    op(New, RetryScheduled),
    op(New, ReadyForReplay),
    op(New, Resolved),
    op_why(New, Skipped),
    // Automatic retries.
    sys(RetryScheduled, Retrying),
    op(RetryScheduled, Review),
    op(RetryScheduled, ReadyForReplay),
    op(RetryScheduled, Resolved),
    op_why(RetryScheduled, Skipped),
    sys(Retrying, Replayed),
    sys(Retrying, RetryScheduled),
    sys(Retrying, Review),
    // A person decides.
    op(Review, RetryScheduled),
    op(Review, ReadyForReplay),
    op(Review, Resolved),
    op_why(Review, Skipped),
    // Replay.
    sys(ReadyForReplay, Replaying),
    op(ReadyForReplay, Review),
    op(ReadyForReplay, Resolved),
    op_why(ReadyForReplay, Skipped),
    sys(Replaying, Replayed),
    sys(Replaying, ReplayFailed),
    // A lease expired or the process died mid-send: back to the queue.
    sys(Replaying, ReadyForReplay),
    op(ReplayFailed, ReadyForReplay),
    op(ReplayFailed, Review),
    op(ReplayFailed, Resolved),
    op_why(ReplayFailed, Skipped),
    // Reopening a closed record is explicit and always says why.
    op_why(Replayed, Review),
    op_why(Resolved, Review),
    op_why(Skipped, Review),
];

/// Why a move was refused; the message names what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("{from} -> {to} is not allowed; from {from} {who} may move to: {allowed}")]
    Illegal {
        from: Status,
        to: Status,
        who: &'static str,
        allowed: String,
    },
    #[error("{from} -> {to} needs a reason")]
    ReasonRequired { from: Status, to: Status },
}

impl Status {
    /// The moves `by` may make from here.
    pub fn moves(self, by: Mover) -> impl Iterator<Item = &'static Move> {
        MOVES.iter().filter(move |m| m.from == self && m.by == by)
    }

    /// Check one move; `Ok` carries the table's entry.
    pub fn check_move(
        self,
        to: Status,
        by: Mover,
        reason: Option<&str>,
    ) -> Result<&'static Move, MoveError> {
        let Some(m) = self.moves(by).find(|m| m.to == to) else {
            let allowed: Vec<&str> = self.moves(by).map(|m| m.to.as_str()).collect();
            return Err(MoveError::Illegal {
                from: self,
                to,
                who: match by {
                    Mover::Operator => "an operator",
                    Mover::System => "deadletter",
                },
                allowed: if allowed.is_empty() {
                    "nothing".into()
                } else {
                    allowed.join(", ")
                },
            });
        };
        if m.needs_reason && reason.is_none_or(|r| r.trim().is_empty()) {
            return Err(MoveError::ReasonRequired { from: self, to });
        }
        Ok(m)
    }

    /// True for replayed, resolved and skipped: the moves out of them are reopenings.
    pub fn is_terminal(self) -> bool {
        !self.is_open()
    }
}

/// The table as a mermaid state diagram (README embeds it; a test keeps them equal).
pub fn mermaid() -> String {
    let mut out = String::from(
        "stateDiagram-v2\n    [*] --> new\n    [*] --> review\n    [*] --> retry_scheduled\n",
    );
    for m in MOVES {
        let label = match (m.by, m.needs_reason) {
            (Mover::System, _) => ": deadletter",
            (Mover::Operator, true) => ": operator, with reason",
            (Mover::Operator, false) => "",
        };
        out.push_str(&format!("    {} --> {}{label}\n", m.from, m.to));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_table_has_no_duplicates_and_no_self_loops() {
        for (i, a) in MOVES.iter().enumerate() {
            assert_ne!(a.from, a.to, "{a:?}");
            for b in &MOVES[i + 1..] {
                assert!(!(a.from == b.from && a.to == b.to), "{a:?} twice");
            }
        }
    }

    #[test]
    fn every_state_can_be_left_and_reached() {
        for s in Status::ALL {
            assert!(MOVES.iter().any(|m| m.from == *s), "{s} is a dead end");
            if *s != New {
                assert!(MOVES.iter().any(|m| m.to == *s), "{s} is unreachable");
            }
        }
    }

    #[test]
    fn terminal_states_only_reopen_to_review_with_a_reason() {
        for s in Status::ALL.iter().filter(|s| s.is_terminal()) {
            let out: Vec<_> = MOVES.iter().filter(|m| m.from == *s).collect();
            assert!(
                out.iter()
                    .all(|m| m.to == Review && m.needs_reason && m.by == Mover::Operator),
                "{s}"
            );
            assert_eq!(
                s.check_move(Review, Mover::Operator, None),
                Err(MoveError::ReasonRequired {
                    from: *s,
                    to: Review
                })
            );
            assert!(s
                .check_move(Review, Mover::Operator, Some("customer asked again"))
                .is_ok());
        }
    }

    #[test]
    fn refusals_name_the_allowed_moves() {
        let e = Review
            .check_move(Replayed, Mover::Operator, None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "review -> replayed is not allowed; from review an operator may move to: retry_scheduled, ready_for_replay, resolved, skipped"
        );
        let e = Replaying
            .check_move(Resolved, Mover::Operator, None)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("may move to: nothing"), "{e}");
    }

    proptest! {
        /// Random sequences of requested moves never reach a state the table does not declare,
        /// and every accepted move is one of the table's.
        #[test]
        fn random_commands_stay_inside_the_table(cmds in proptest::collection::vec((0..Status::ALL.len(), any::<bool>(), any::<bool>()), 0..60)) {
            let mut s = New;
            for (to, system, reason) in cmds {
                let to = Status::ALL[to];
                let by = if system { Mover::System } else { Mover::Operator };
                match s.check_move(to, by, reason.then_some("because")) {
                    Ok(m) => {
                        prop_assert!(MOVES.contains(m));
                        prop_assert_eq!((m.from, m.to), (s, to));
                        s = to;
                    }
                    Err(_) => prop_assert!(!MOVES.iter().any(|m| m.from == s && m.to == to && m.by == by && (reason || !m.needs_reason))),
                }
            }
        }
    }
}

#[cfg(test)]
mod readme {
    /// README's diagram is this table's: regenerate with
    /// `DEADLETTER_WRITE_README=1 cargo test --lib readme_diagram`.
    #[test]
    fn readme_diagram_matches_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let block = format!("\n```mermaid\n{}```\n", super::mermaid());
        let (start, end) = (
            "<!-- status-diagram:start -->",
            "<!-- status-diagram:end -->",
        );
        let (Some(a), Some(b)) = (readme.find(start), readme.find(end)) else {
            panic!("README.md lacks the status-diagram markers");
        };
        let current = &readme[a + start.len()..b];
        if current != block {
            if std::env::var_os("DEADLETTER_WRITE_README").is_some() {
                let updated = format!("{}{block}{}", &readme[..a + start.len()], &readme[b..]);
                std::fs::write(path, updated).unwrap();
            } else {
                panic!("README's status diagram differs from the table; rerun with DEADLETTER_WRITE_README=1");
            }
        }
    }
}
