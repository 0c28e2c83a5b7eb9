//! Alerts: the rules in `[alerts]` are evaluated every `evaluate_every` against the store's
//! kept totals and this process's counters, and what fires is posted to one webhook — a
//! generic JSON body or a Slack-compatible `{"text": …}`. Per rule, at most one message per
//! `throttle` while it keeps firing (the next says how many evaluations were held back), and one
//! "resolved" message when it stops. Messages carry counts, names and thresholds, never a
//! payload. Sending happens on its own task through a small queue: a webhook that is down or
//! slow costs ingest nothing (a full queue drops the message, counted and logged).
//!
//! `Engine::evaluate(now, inputs)` is pure (time and figures passed in), so throttling is
//! tested without sleeping.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::config::{AlertFormat, AlertKind, AlertRule, AlertWebhook, AlertsConfig};
use crate::metrics::METRICS;
use crate::store::Store;

/// What the rules look at, at one instant.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Open records per partition.
    pub open_by_partition: Vec<(String, i64)>,
    /// Open records past their due time.
    pub past_sla: i64,
    /// Running totals (this process): records created, credential incidents, sends accepted
    /// and failed.
    pub ingress: u64,
    pub credential_incidents: u64,
    pub replay_ok: u64,
    pub replay_failed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    Firing,
    Resolved,
}

/// One message for the webhook.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notification {
    pub source: &'static str,
    pub rule: String,
    pub kind: &'static str,
    pub state: AlertState,
    pub summary: String,
    pub value: f64,
    pub threshold: f64,
    /// Evaluations that found the rule firing but were held back since the last message.
    pub suppressed: u64,
    pub at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Default)]
struct RuleState {
    /// Did the last message say "firing"?
    firing: bool,
    /// Since when the condition has held (a depth rule's window counts from here).
    holding_since: Option<i64>,
    last_sent_ms: Option<i64>,
    suppressed: u64,
}

/// The rules and what they have said so far.
pub struct Engine {
    rules: Vec<AlertRule>,
    state: HashMap<String, RuleState>,
    /// What each evaluation saw (time, figures), oldest first: the windows of the rate rules
    /// are differences between two of these.
    samples: VecDeque<(i64, Inputs)>,
    /// How much history the longest window needs.
    keep_ms: i64,
}

fn kind_name(k: &AlertKind) -> &'static str {
    match k {
        AlertKind::Depth { .. } => "depth",
        AlertKind::OverSla => "over_sla",
        AlertKind::CredentialIncident => "credential_incident",
        AlertKind::ReplaySuccess { .. } => "replay_success",
        AlertKind::RetryStorm { .. } => "retry_storm",
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Engine {
    pub fn new(rules: Vec<AlertRule>) -> Engine {
        let keep_ms = rules
            .iter()
            .map(|r| match &r.kind {
                AlertKind::ReplaySuccess { window, .. } | AlertKind::RetryStorm { window, .. } => {
                    ms(*window)
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        Engine {
            rules,
            state: HashMap::new(),
            samples: VecDeque::new(),
            keep_ms,
        }
    }

    /// The sample to measure a window from: the newest one at least `window` old, else the
    /// oldest there is (the process has not run that long: the window is what it has seen).
    fn base(&self, now_ms: i64, window: i64) -> Option<&Inputs> {
        self.samples
            .iter()
            .rev()
            .find(|(t, _)| now_ms - t >= window)
            .or(self.samples.front())
            .map(|(_, i)| i)
    }

    /// Is the rule firing, and what to say: (firing, summary, value, threshold).
    fn check(&self, rule: &AlertRule, now_ms: i64, i: &Inputs) -> (bool, String, f64, f64) {
        match &rule.kind {
            AlertKind::Depth {
                partition, over, ..
            } => {
                let worst = i
                    .open_by_partition
                    .iter()
                    .filter(|(p, _)| partition.as_ref().is_none_or(|want| want == p))
                    .max_by_key(|(_, n)| *n);
                let (p, n) = worst.map_or(("", 0), |(p, n)| (p.as_str(), *n));
                (
                    n > *over as i64,
                    format!("{n} open records in partition {p} (over {over})"),
                    n as f64,
                    *over as f64,
                )
            }
            AlertKind::OverSla => (
                i.past_sla > 0,
                format!("{} open records are past their SLA", i.past_sla),
                i.past_sla as f64,
                0.0,
            ),
            AlertKind::CredentialIncident => {
                // New since the previous evaluation.
                let before = self
                    .samples
                    .back()
                    .map_or(0, |(_, s)| s.credential_incidents);
                let new = i.credential_incidents.saturating_sub(before);
                (
                    new > 0,
                    format!("{new} new credential incident(s): a token or key was refused"),
                    new as f64,
                    0.0,
                )
            }
            AlertKind::ReplaySuccess {
                floor,
                window,
                min_sends,
            } => {
                let base = self.base(now_ms, ms(*window));
                let ok = i.replay_ok - base.map_or(0, |b| b.replay_ok);
                let failed = i.replay_failed - base.map_or(0, |b| b.replay_failed);
                let sends = ok + failed;
                let ratio = if sends > 0 {
                    ok as f64 / sends as f64
                } else {
                    1.0
                };
                (
                    sends >= *min_sends && ratio < *floor,
                    format!(
                        "{:.0}% of {sends} sends accepted in the last {} (floor {:.0}%)",
                        ratio * 100.0,
                        humantime::format_duration(*window),
                        floor * 100.0
                    ),
                    ratio,
                    *floor,
                )
            }
            AlertKind::RetryStorm { over, window } => {
                let base = self.base(now_ms, ms(*window));
                let n = i.ingress - base.map_or(0, |b| b.ingress);
                (
                    n > *over,
                    format!(
                        "{n} records ingested in the last {} (over {over}): a retry storm upstream?",
                        humantime::format_duration(*window)
                    ),
                    n as f64,
                    *over as f64,
                )
            }
        }
    }

    /// Evaluate every rule at `now_ms`; the messages to send.
    pub fn evaluate(&mut self, now_ms: i64, inputs: Inputs) -> Vec<Notification> {
        let at = chrono::DateTime::from_timestamp_millis(now_ms).unwrap_or_default();
        let mut out = Vec::new();
        for rule in &self.rules {
            let (holds, summary, value, threshold) = self.check(rule, now_ms, &inputs);
            let st = self.state.entry(rule.name.clone()).or_default();
            // A depth rule with a window fires once its condition has held that long.
            st.holding_since = if holds {
                st.holding_since.or(Some(now_ms))
            } else {
                None
            };
            let hold = match &rule.kind {
                AlertKind::Depth { window, .. } => ms(*window),
                _ => 0,
            };
            let firing = st.holding_since.is_some_and(|t| now_ms - t >= hold);
            let note = |state, suppressed| Notification {
                source: "deadletter",
                rule: rule.name.clone(),
                kind: kind_name(&rule.kind),
                state,
                summary: summary.clone(),
                value,
                threshold,
                suppressed,
                at,
            };
            if firing {
                let due = st
                    .last_sent_ms
                    .is_none_or(|t| now_ms - t >= ms(rule.throttle));
                if due || !st.firing {
                    out.push(note(AlertState::Firing, st.suppressed));
                    st.firing = true;
                    st.last_sent_ms = Some(now_ms);
                    st.suppressed = 0;
                } else {
                    st.suppressed += 1;
                    METRICS
                        .alerts_suppressed
                        .get_or_create(&vec![("rule", rule.name.clone())])
                        .inc();
                    tracing::info!(rule = %rule.name, held_back = st.suppressed, "alert still firing; held back by its throttle");
                }
            } else if st.firing {
                out.push(note(AlertState::Resolved, st.suppressed));
                st.firing = false;
                st.suppressed = 0;
            }
        }
        self.samples.push_back((now_ms, inputs));
        // Keep what the longest window needs, plus the one sample just before it.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now_ms - t >= self.keep_ms)
        {
            self.samples.pop_front();
        }
        out
    }
}

/// The webhook body for a message.
pub fn body(format: AlertFormat, n: &Notification) -> serde_json::Value {
    match format {
        AlertFormat::Generic => serde_json::to_value(n).unwrap_or_default(),
        AlertFormat::Slack => {
            let icon = match n.state {
                AlertState::Firing => ":rotating_light:",
                AlertState::Resolved => ":white_check_mark:",
            };
            let state = match n.state {
                AlertState::Firing => "FIRING",
                AlertState::Resolved => "resolved",
            };
            let held = if n.suppressed > 0 {
                format!(" (still firing: {} more held back)", n.suppressed)
            } else {
                String::new()
            };
            serde_json::json!({
                "text": format!("{icon} deadletter {state}: {} — {}{held}", n.rule, n.summary)
            })
        }
    }
}

/// What the rules need, read from the store's kept totals and this process's counters.
async fn inputs(store: &Store, now_ms: i64) -> Result<Inputs, crate::store::StoreError> {
    let readers = store.readers.clone();
    let (open_by_partition, past_sla) = tokio::task::spawn_blocking(move || {
        readers.with(|c| crate::store::stats::alert_inputs(c, now_ms))
    })
    .await
    .map_err(|e| crate::store::StoreError::Corrupt(format!("alert inputs: {e}")))??;
    Ok(Inputs {
        open_by_partition,
        past_sla,
        ingress: METRICS.ingress_all.get(),
        credential_incidents: METRICS.credential_incidents.get(),
        replay_ok: METRICS.replay_ok_all.get(),
        replay_failed: METRICS.replay_failed_all.get(),
    })
}

/// Post messages as they come, one at a time; failures are logged and counted, never retried
/// (the rule fires again on a later evaluation if it still holds).
async fn sender(webhook: AlertWebhook, mut rx: mpsc::Receiver<Notification>) {
    let client = match reqwest::Client::builder().timeout(webhook.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "alerts: cannot build an HTTP client; alerts are off");
            return;
        }
    };
    while let Some(n) = rx.recv().await {
        let mut req = client.post(&webhook.url).json(&body(webhook.format, &n));
        for (name, src) in &webhook.secret_headers {
            match src.read() {
                Ok(v) => req = req.header(name.as_str(), v),
                Err(e) => {
                    tracing::warn!(header = %name, error = %e, "alerts: secret header unavailable")
                }
            }
        }
        let rule = vec![("rule", n.rule.clone())];
        match req.send().await {
            Ok(r) if r.status().is_success() => {
                METRICS.alerts_sent.get_or_create(&rule).inc();
                tracing::info!(rule = %n.rule, state = ?n.state, held_back = n.suppressed, "alert sent");
            }
            Ok(r) => {
                METRICS.alerts_failed.get_or_create(&rule).inc();
                tracing::warn!(rule = %n.rule, status = r.status().as_u16(), "alert webhook refused the alert");
            }
            Err(e) => {
                METRICS.alerts_failed.get_or_create(&rule).inc();
                tracing::warn!(rule = %n.rule, error = %e, "alert webhook unreachable");
            }
        }
    }
}

/// Evaluate until shutdown; nothing at all when no webhook is configured.
pub async fn run(store: Store, cfg: AlertsConfig, mut shutdown: watch::Receiver<bool>) {
    let Some(webhook) = cfg.webhook.clone() else {
        return;
    };
    let (tx, rx) = mpsc::channel(64);
    let send_task = tokio::spawn(sender(webhook, rx));
    let mut engine = Engine::new(cfg.rules.clone());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.evaluate_every) => {}
            _ = shutdown.changed() => break,
        }
        let now = chrono::Utc::now().timestamp_millis();
        match inputs(&store, now).await {
            Ok(i) => {
                for n in engine.evaluate(now, i) {
                    if tx.try_send(n.clone()).is_err() {
                        METRICS
                            .alerts_failed
                            .get_or_create(&vec![("rule", n.rule.clone())])
                            .inc();
                        tracing::warn!(rule = %n.rule, "alert dropped: the webhook is not keeping up");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "alerts: cannot read the figures; trying again"),
        }
    }
    drop(tx);
    send_task.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, kind: AlertKind, throttle_mins: u64) -> AlertRule {
        AlertRule {
            name: name.into(),
            kind,
            throttle: Duration::from_secs(throttle_mins * 60),
        }
    }

    const MIN: i64 = 60_000;

    #[test]
    fn a_firing_rule_is_throttled_then_summarised_then_resolved() {
        let mut e = Engine::new(vec![rule(
            "backlog",
            AlertKind::Depth {
                partition: Some("orders".into()),
                over: 10,
                window: Duration::ZERO,
            },
            60,
        )]);
        let depth = |n| Inputs {
            open_by_partition: vec![("orders".into(), n), ("ops".into(), 500)],
            ..Inputs::default()
        };
        assert!(e.evaluate(0, depth(5)).is_empty(), "under the threshold");
        let first = e.evaluate(MIN, depth(11));
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].state, first[0].value, first[0].suppressed),
            (AlertState::Firing, 11.0, 0)
        );
        assert!(first[0].summary.contains("partition orders"));
        // Still firing for the next hour: held back, counted.
        for t in 2..=60 {
            assert!(e.evaluate(t * MIN, depth(20)).is_empty(), "minute {t}");
        }
        let again = e.evaluate(61 * MIN, depth(30));
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].suppressed, 59, "still firing (59 more)");
        let slack = body(AlertFormat::Slack, &again[0]);
        assert!(slack["text"]
            .as_str()
            .unwrap()
            .contains("still firing: 59 more held back"));
        // Back under: one resolved message, then silence.
        let resolved = e.evaluate(62 * MIN, depth(3));
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0].state, AlertState::Resolved);
        assert!(e.evaluate(63 * MIN, depth(3)).is_empty());
        // Firing again after a resolve is news at once, throttle or not.
        assert_eq!(e.evaluate(64 * MIN, depth(12)).len(), 1);
    }

    #[test]
    fn a_depth_rule_with_a_window_fires_only_once_the_depth_has_held_that_long() {
        let mut e = Engine::new(vec![rule(
            "sustained",
            AlertKind::Depth {
                partition: None,
                over: 10,
                window: Duration::from_secs(600),
            },
            60,
        )]);
        let depth = |n| Inputs {
            open_by_partition: vec![("ops".into(), n)],
            ..Inputs::default()
        };
        assert!(e.evaluate(0, depth(50)).is_empty(), "over, but only just");
        assert!(e.evaluate(5 * MIN, depth(50)).is_empty());
        assert!(
            e.evaluate(6 * MIN, depth(5)).is_empty(),
            "dipped: the clock restarts"
        );
        assert!(e.evaluate(7 * MIN, depth(50)).is_empty());
        assert!(e.evaluate(16 * MIN, depth(50)).is_empty());
        assert_eq!(
            e.evaluate(17 * MIN, depth(50)).len(),
            1,
            "held for 10 minutes"
        );
    }

    #[test]
    fn rate_rules_measure_their_window() {
        let mut e = Engine::new(vec![
            rule(
                "storm",
                AlertKind::RetryStorm {
                    over: 100,
                    window: Duration::from_secs(300),
                },
                60,
            ),
            rule(
                "replays",
                AlertKind::ReplaySuccess {
                    floor: 0.9,
                    window: Duration::from_secs(3600),
                    min_sends: 10,
                },
                60,
            ),
            rule("creds", AlertKind::CredentialIncident, 60),
        ]);
        let at = |ingress, ok, failed, creds| Inputs {
            ingress,
            replay_ok: ok,
            replay_failed: failed,
            credential_incidents: creds,
            ..Inputs::default()
        };
        assert!(e.evaluate(0, at(0, 0, 0, 0)).is_empty());
        // 90 ingests per minute: 450 in 5 minutes once the window is full.
        let mut fired = Vec::new();
        for m in 1..=6 {
            for n in e.evaluate(m * MIN, at(90 * m as u64, 0, 0, 0)) {
                fired.push((m, n.rule));
            }
        }
        assert_eq!(
            fired,
            vec![(2, "storm".to_string())],
            "181 > 100 after two minutes"
        );
        // 5 of 20 sends failed: 75% < 90%.
        let n = e.evaluate(7 * MIN, at(540, 15, 5, 0));
        assert!(
            n.iter().any(|n| n.rule == "replays" && n.value == 0.75),
            "{n:?}"
        );
        // A credential incident fires once per new one.
        let n = e.evaluate(8 * MIN, at(540, 15, 5, 1));
        assert!(
            n.iter().any(|n| n.rule == "creds" && n.value == 1.0),
            "{n:?}"
        );
        let n = e.evaluate(9 * MIN, at(540, 15, 5, 1));
        assert!(
            n.iter()
                .any(|n| n.rule == "creds" && n.state == AlertState::Resolved),
            "no new incident: resolved"
        );
    }

    #[test]
    fn messages_never_carry_payloads_only_figures() {
        let n = Notification {
            source: "deadletter",
            rule: "over-sla".into(),
            kind: "over_sla",
            state: AlertState::Firing,
            summary: "3 open records are past their SLA".into(),
            value: 3.0,
            threshold: 0.0,
            suppressed: 0,
            at: chrono::DateTime::from_timestamp_millis(0).unwrap(),
        };
        let v = body(AlertFormat::Generic, &n);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "source",
                "rule",
                "kind",
                "state",
                "summary",
                "value",
                "threshold",
                "suppressed",
                "at"
            ]
        );
    }
}
