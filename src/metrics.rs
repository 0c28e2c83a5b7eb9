//! Prometheus metrics (`GET /metrics`, OpenMetrics text via prometheus-client).
//!
//! Two kinds, and neither scans the records at scrape time:
//! - counters and histograms kept in this process as things happen (ingests, deduplications,
//!   replay outcomes, the time records stay open, writer batches and commits, HTTP requests);
//!   they start at zero with the process, as Prometheus expects of counters;
//! - gauges read at scrape time from totals the database keeps up to date (records per
//!   partition and status, removals by reason — kept by the store in the same transactions as
//!   the changes), one index probe per partition for its oldest open record, a partial index
//!   for records with more than 3 attempts, and the replay gates' state in memory.
//!
//! Label cardinality is bounded: beyond `metrics.max_partitions` partitions, the rest fold into
//! `partition="other"`.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub type Labels = Vec<(&'static str, String)>;

/// What this process counts as it goes.
pub struct Metrics {
    pub ingress: Family<Labels, Counter>,
    pub deduplicated: Counter,
    pub replay_success: Family<Labels, Counter>,
    pub replay_failure: Family<Labels, Counter>,
    /// First failure to successful replay or an explicit disposition (resolved, skipped).
    pub age: Histogram,
    pub writer_batch: Histogram,
    pub writer_commit: Histogram,
    pub http_requests: Family<Labels, Counter>,
    pub http_latency: Family<Labels, Histogram, fn() -> Histogram>,
    /// New records of a class flagged as a credential incident.
    pub credential_incidents: Counter,
    pub alerts_sent: Family<Labels, Counter>,
    pub alerts_suppressed: Family<Labels, Counter>,
    pub alerts_failed: Family<Labels, Counter>,
    /// Calls to n8n's API that did not bring an execution, by kind.
    pub n8n_api_errors: Family<Labels, Counter>,
    /// Failed executions found in n8n that never reached deadletter, by workflow.
    pub n8n_reconciled: Family<Labels, Counter>,
    /// Totals across labels, for the alert rules' windows.
    pub ingress_all: Counter,
    pub replay_ok_all: Counter,
    pub replay_failed_all: Counter,
    /// Partitions given their own label so far (the rest are "other").
    partitions: Mutex<HashSet<String>>,
    max_partitions: std::sync::atomic::AtomicUsize,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS.iter().copied())
}

const AGE_BUCKETS: &[f64] = &[
    60.0,
    300.0,
    900.0,
    3600.0,
    14_400.0,
    43_200.0,
    86_400.0,
    172_800.0,
    604_800.0,
    1_209_600.0,
];
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    ingress: Family::default(),
    deduplicated: Counter::default(),
    replay_success: Family::default(),
    replay_failure: Family::default(),
    age: Histogram::new(AGE_BUCKETS.iter().copied()),
    writer_batch: Histogram::new(BATCH_BUCKETS.iter().copied()),
    writer_commit: Histogram::new(LATENCY_BUCKETS.iter().copied()),
    http_requests: Family::default(),
    http_latency: Family::new_with_constructor(latency_histogram),
    credential_incidents: Counter::default(),
    alerts_sent: Family::default(),
    alerts_suppressed: Family::default(),
    alerts_failed: Family::default(),
    n8n_api_errors: Family::default(),
    n8n_reconciled: Family::default(),
    ingress_all: Counter::default(),
    replay_ok_all: Counter::default(),
    replay_failed_all: Counter::default(),
    partitions: Mutex::new(HashSet::new()),
    max_partitions: std::sync::atomic::AtomicUsize::new(50),
});

impl Metrics {
    pub fn set_max_partitions(&self, n: usize) {
        self.max_partitions
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The label for a partition: itself while fewer than the maximum have been seen, "other"
    /// for the ones after.
    pub fn partition_label(&self, partition: &str) -> String {
        let max = self
            .max_partitions
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut seen = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(partition) {
            return partition.to_owned();
        }
        if seen.len() < max {
            seen.insert(partition.to_owned());
            return partition.to_owned();
        }
        "other".to_owned()
    }

    pub fn ingested(&self, partition: &str, class: &str, created: bool, credential_incident: bool) {
        if created {
            self.ingress_all.inc();
            if credential_incident {
                self.credential_incidents.inc();
            }
            self.ingress
                .get_or_create(&vec![
                    ("partition", self.partition_label(partition)),
                    ("failure_class", class.to_owned()),
                ])
                .inc();
        } else {
            self.deduplicated.inc();
        }
    }

    /// One send's outcome: `None` on success, else why (transient or permanent).
    pub fn replayed(&self, target: &str, failure: Option<&str>) {
        match failure {
            None => {
                self.replay_ok_all.inc();
                self.replay_success
                    .get_or_create(&vec![("target", target.to_owned())])
                    .inc();
            }
            Some(reason) => {
                self.replay_failed_all.inc();
                self.replay_failure
                    .get_or_create(&vec![
                        ("target", target.to_owned()),
                        ("reason", reason.to_owned()),
                    ])
                    .inc();
            }
        }
    }
}

/// Gauges read from the database and the replay gates at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// (partition, status, records)
    pub depth: Vec<(String, String, i64)>,
    /// (partition, seconds the oldest open record has been open)
    pub oldest_open: Vec<(String, f64)>,
    /// (reason, records removed)
    pub removed: Vec<(String, i64)>,
    pub retry_scheduled: i64,
    pub over_3_attempts: i64,
    /// (target, breaker state 0 closed / 1 half-open / 2 open, paused total)
    pub gates: Vec<(String, i64, u64)>,
}

/// Fold partitions beyond `max` (by records, most first) into "other".
fn fold(mut rows: Vec<(String, String, i64)>, max: usize) -> Vec<(String, String, i64)> {
    let mut per: std::collections::BTreeMap<String, i64> = Default::default();
    for (p, _, n) in &rows {
        *per.entry(p.clone()).or_default() += n;
    }
    if per.len() <= max {
        return rows;
    }
    let mut ranked: Vec<(String, i64)> = per.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let keep: HashSet<String> = ranked.into_iter().take(max).map(|(p, _)| p).collect();
    let mut out: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for (p, s, n) in rows.drain(..) {
        let p = if keep.contains(&p) { p } else { "other".into() };
        *out.entry((p, s)).or_default() += n;
    }
    out.into_iter().map(|((p, s), n)| (p, s, n)).collect()
}

/// The whole exposition: this process's counters plus `snap`'s gauges.
pub fn render(snap: Snapshot) -> String {
    let m = &*METRICS;
    let max = m.max_partitions.load(std::sync::atomic::Ordering::Relaxed);
    let mut r = Registry::default();
    r.register(
        "dlq_ingress",
        "Records created by ingest",
        m.ingress.clone(),
    );
    r.register(
        "dlq_deduplicated",
        "Ingests that were repeats of an open record (its occurrences went up)",
        m.deduplicated.clone(),
    );
    r.register(
        "dlq_replay_success",
        "Sends (retries and replays) the target accepted",
        m.replay_success.clone(),
    );
    r.register(
        "dlq_replay_failure",
        "Sends that failed, by target and reason (transient, permanent)",
        m.replay_failure.clone(),
    );
    r.register(
        "dlq_age_seconds",
        "Time from a record's first failure to its successful replay or explicit disposition",
        m.age.clone(),
    );
    r.register(
        "dlq_writer_batch_size",
        "Requests per writer transaction (group commit)",
        m.writer_batch.clone(),
    );
    r.register(
        "dlq_writer_commit_seconds",
        "Writer transaction time, commit included",
        m.writer_commit.clone(),
    );
    r.register(
        "dlq_http_requests",
        "HTTP requests by method, matched route and status",
        m.http_requests.clone(),
    );
    r.register(
        "dlq_http_request_duration_seconds",
        "HTTP request latency by method and matched route",
        m.http_latency.clone(),
    );

    r.register(
        "dlq_credential_incidents",
        "New records of a class flagged as a credential incident (auth failures)",
        m.credential_incidents.clone(),
    );
    r.register(
        "dlq_alerts_sent",
        "Alert messages posted to the webhook, by rule",
        m.alerts_sent.clone(),
    );
    r.register(
        "dlq_alerts_suppressed",
        "Alert evaluations held back by the rule's throttle, by rule",
        m.alerts_suppressed.clone(),
    );
    r.register(
        "dlq_alerts_failed",
        "Alert messages the webhook did not accept (or that could not be sent), by rule",
        m.alerts_failed.clone(),
    );

    r.register(
        "dlq_n8n_api_errors",
        "Calls to n8n's API that did not bring an execution, by kind (not_found, refused, unreachable)",
        m.n8n_api_errors.clone(),
    );
    r.register(
        "dlq_n8n_reconciled",
        "Failed executions found in n8n that never reached deadletter (a workflow without an Error Workflow?), by workflow",
        m.n8n_reconciled.clone(),
    );

    let depth = Family::<Labels, Gauge>::default();
    for (p, s, n) in fold(snap.depth, max) {
        depth
            .get_or_create(&vec![("partition", p), ("status", s)])
            .set(n);
    }
    r.register("dlq_depth", "Records by partition and status", depth);
    let oldest = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let mut oldest_rows = snap.oldest_open;
    oldest_rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (i, (p, secs)) in oldest_rows.into_iter().enumerate() {
        // The oldest partitions keep their names; "other" gets the oldest of the rest.
        let label = if i < max { p } else { "other".into() };
        let g = oldest.get_or_create(&vec![("partition", label)]);
        if g.get() < secs {
            g.set(secs);
        }
    }
    r.register(
        "dlq_oldest_open_age_seconds",
        "Age of the oldest open record, by partition",
        oldest,
    );
    let removed = Family::<Labels, Counter>::default();
    for (reason, n) in snap.removed {
        removed
            .get_or_create(&vec![("reason", reason)])
            .inc_by(n.max(0) as u64);
    }
    r.register(
        "dlq_expired",
        "Records removed by retention or erasure, by reason (age, closed_age, size, erasure); kept in the database",
        removed,
    );
    let retry = Gauge::<i64>::default();
    retry.set(snap.retry_scheduled);
    r.register(
        "dlq_retry_scheduled",
        "Records waiting for an automatic retry",
        retry,
    );
    let over = Gauge::<i64>::default();
    over.set(snap.over_3_attempts);
    r.register(
        "dlq_records_over_3_attempts",
        "Records with more than 3 delivery attempts",
        over,
    );
    let breaker = Family::<Labels, Gauge>::default();
    let paused = Family::<Labels, Counter>::default();
    for (t, state, p) in snap.gates {
        breaker
            .get_or_create(&vec![("target", t.clone())])
            .set(state);
        paused.get_or_create(&vec![("target", t)]).inc_by(p);
    }
    r.register(
        "dlq_breaker_state",
        "Replay target breaker: 0 closed, 1 half-open, 2 open",
        breaker,
    );
    r.register(
        "dlq_drain_paused",
        "Times a due record waited because its target's breaker was open",
        paused,
    );
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_beyond_the_maximum_fold_into_other() {
        let rows = vec![
            ("a".into(), "new".into(), 5),
            ("b".into(), "new".into(), 1),
            ("c".into(), "new".into(), 3),
            ("c".into(), "review".into(), 1),
        ];
        let folded = fold(rows, 2);
        assert_eq!(
            folded,
            vec![
                ("a".to_string(), "new".to_string(), 5),
                ("c".into(), "new".into(), 3),
                ("c".into(), "review".into(), 1),
                ("other".into(), "new".into(), 1),
            ]
        );
    }
}
