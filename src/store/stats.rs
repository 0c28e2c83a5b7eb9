//! Figures for metrics and stats, read from the totals the store keeps (`partition_stats`,
//! `removals`) and from index probes — never a scan of every record.

use rusqlite::Connection;

use super::schema::CLOSED_SQL;
use super::StoreError;

/// The database's part of a metrics scrape.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// (partition, status, records)
    pub depth: Vec<(String, String, i64)>,
    /// (partition, first seen of its oldest open record, unix ms)
    pub oldest_open: Vec<(String, i64)>,
    /// (reason, records removed)
    pub removed: Vec<(String, i64)>,
    pub over_3_attempts: i64,
}

pub fn gauges(conn: &Connection) -> Result<Gauges, StoreError> {
    let depth: Vec<(String, String, i64)> = conn
        .prepare_cached(
            "SELECT partition, status, records FROM partition_stats WHERE records > 0 ORDER BY 1, 2",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut partitions: Vec<&str> = depth.iter().map(|(p, _, _)| p.as_str()).collect();
    partitions.dedup();
    let mut oldest_open = Vec::new();
    let mut probe = conn.prepare_cached(&format!(
        "SELECT min(first_seen_at) FROM dead_letters WHERE partition = ?1 AND status NOT IN {CLOSED_SQL}"
    ))?;
    for p in partitions {
        if let Some(t) = probe.query_row([p], |r| r.get::<_, Option<i64>>(0))? {
            oldest_open.push((p.to_owned(), t));
        }
    }
    let removed = conn
        .prepare_cached("SELECT reason, sum(records) FROM removals GROUP BY reason ORDER BY 1")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let over_3_attempts = conn.query_row(
        "SELECT count(*) FROM dead_letters WHERE attempts > 3",
        [],
        |r| r.get(0),
    )?;
    Ok(Gauges {
        depth,
        oldest_open,
        removed,
        over_3_attempts,
    })
}

/// An operator's view of the queue (`GET /v1/stats`, `deadletter stats`).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Stats {
    pub generated_at: chrono::DateTime<chrono::Utc>,
    pub total: i64,
    pub open: i64,
    /// Records by status (all partitions).
    pub by_status: std::collections::BTreeMap<String, i64>,
    pub partitions: Vec<PartitionStats>,
    pub new_last_hour: i64,
    pub new_last_day: i64,
    pub open_older_than_hour: i64,
    pub open_older_than_day: i64,
    /// Open records past their due time (their class's SLA).
    pub open_past_sla: i64,
    /// The most frequent failures among open records.
    pub top_fingerprints: Vec<TopFingerprint>,
    pub top_workflows: Vec<TopWorkflow>,
    /// Of the closed records still kept: the share replayed, resolved, skipped.
    pub closed_shares: std::collections::BTreeMap<String, f64>,
    /// First failure to closing, for records closed in the last 7 days.
    pub time_to_resolution: Option<Resolution>,
    /// Records first seen between 7 days and 48 hours ago: the share replayed or given an
    /// explicit disposition within 48 hours.
    pub slo_48h: Option<Slo>,
    /// Open records in partitions marked money-impacting (`metrics.money_partitions`).
    pub business_loss_risk: i64,
    /// Records first seen in each of the last 24 hours, oldest first.
    pub ingress_per_hour: Vec<i64>,
    /// GET /v1/stats only: what the last call to n8n's API found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n8n_api: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct PartitionStats {
    pub partition: String,
    pub open: i64,
    pub closed: i64,
    pub money_impacting: bool,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct TopFingerprint {
    pub fingerprint: String,
    pub open: i64,
    pub failure_class: String,
    pub workflow_name: Option<String>,
    pub sample_message: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct TopWorkflow {
    pub workflow_id: Option<String>,
    pub workflow_name: Option<String>,
    pub open: i64,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Resolution {
    pub records: i64,
    pub mean_seconds: f64,
    pub p90_seconds: f64,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Slo {
    pub eligible: i64,
    pub met: i64,
    pub ratio: f64,
}

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// Figures at `now_ms`. Counts by status come from the kept totals; the rest reads the open
/// records (few, on a healthy queue), the last day's index entries and the last week's closed
/// ones. A record's closing time is its last update while closed.
pub fn stats(conn: &Connection, now_ms: i64, money: &[String]) -> Result<Stats, StoreError> {
    use crate::model::Status;
    let rows: Vec<(String, String, i64)> = conn
        .prepare_cached("SELECT partition, status, records FROM partition_stats WHERE records > 0")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut by_status = std::collections::BTreeMap::new();
    let mut parts: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
    for (p, s, n) in &rows {
        *by_status.entry(s.clone()).or_insert(0) += n;
        let closed = s.parse::<Status>().map(Status::is_closed).unwrap_or(false);
        let e = parts.entry(p.clone()).or_default();
        if closed {
            e.1 += n;
        } else {
            e.0 += n;
        }
    }
    let total: i64 = by_status.values().sum();
    let closed_total: i64 = Status::CLOSED
        .iter()
        .map(|s| by_status.get(s.as_str()).copied().unwrap_or(0))
        .sum();
    let closed_shares = Status::CLOSED
        .iter()
        .map(|s| {
            let n = by_status.get(s.as_str()).copied().unwrap_or(0);
            (
                s.as_str().to_owned(),
                if closed_total > 0 {
                    n as f64 / closed_total as f64
                } else {
                    0.0
                },
            )
        })
        .collect();

    // The last 24 hours, partition by partition along the (partition, first seen) index.
    let mut ingress_per_hour = vec![0i64; 24];
    let start = now_ms - DAY;
    let mut hourly = conn.prepare_cached(
        "SELECT (first_seen_at - ?2) / 3600000, count(*) FROM dead_letters
         WHERE partition = ?1 AND first_seen_at >= ?2 GROUP BY 1",
    )?;
    for p in parts.keys() {
        let counts = hourly
            .query_map(rusqlite::params![p, start], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        for (h, n) in counts {
            // A record first seen at `now` itself (or later: a clock step) is this hour's.
            ingress_per_hour[h.clamp(0, 23) as usize] += n;
        }
    }
    let new_last_day = ingress_per_hour.iter().sum();
    let new_last_hour: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM dead_letters WHERE partition = ?1 AND first_seen_at >= ?2",
        )
        .and_then(|mut s| {
            parts
                .keys()
                .map(|p| s.query_row(rusqlite::params![p, now_ms - HOUR], |r| r.get::<_, i64>(0)))
                .sum::<Result<i64, _>>()
        })?;

    let (open, older_hour, older_day, past_sla): (i64, i64, i64, i64) = conn.query_row(
        &format!(
            "SELECT count(*), count(*) FILTER (WHERE first_seen_at < ?1),
                    count(*) FILTER (WHERE first_seen_at < ?2), count(*) FILTER (WHERE due_at < ?3)
             FROM dead_letters WHERE status NOT IN {CLOSED_SQL}"
        ),
        rusqlite::params![now_ms - HOUR, now_ms - DAY, now_ms],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    let top_fingerprints = conn
        .prepare_cached(&format!(
            "SELECT fingerprint, count(*) AS n, max(failure_class), max(workflow_name), max(error_message)
             FROM dead_letters WHERE status NOT IN {CLOSED_SQL}
             GROUP BY fingerprint ORDER BY n DESC, fingerprint LIMIT 5"
        ))?
        .query_map([], |r| {
            Ok(TopFingerprint {
                fingerprint: crate::model::Fingerprint::from_i64(r.get(0)?).to_string(),
                open: r.get(1)?,
                failure_class: r.get(2)?,
                workflow_name: r.get(3)?,
                sample_message: r.get(4)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    let top_workflows = conn
        .prepare_cached(&format!(
            "SELECT workflow_id, max(workflow_name), count(*) AS n
             FROM dead_letters WHERE status NOT IN {CLOSED_SQL}
             GROUP BY workflow_id ORDER BY n DESC, workflow_id LIMIT 5"
        ))?
        .query_map([], |r| {
            Ok(TopWorkflow {
                workflow_id: r.get(0)?,
                workflow_name: r.get(1)?,
                open: r.get(2)?,
            })
        })?
        .collect::<Result<_, _>>()?;

    // Closed in the last 7 days (the partial index on closed records' updated_at).
    let mut took: Vec<i64> = conn
        .prepare_cached(&format!(
            "SELECT updated_at - first_seen_at FROM dead_letters
             WHERE status IN {CLOSED_SQL} AND updated_at >= ?1"
        ))?
        .query_map([now_ms - 7 * DAY], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    took.sort_unstable();
    let time_to_resolution = (!took.is_empty()).then(|| Resolution {
        records: took.len() as i64,
        mean_seconds: took.iter().sum::<i64>() as f64 / took.len() as f64 / 1000.0,
        p90_seconds: took[((took.len() * 9).div_ceil(10)).saturating_sub(1)] as f64 / 1000.0,
    });
    let (eligible, met): (i64, i64) = {
        let mut q = conn.prepare_cached(&format!(
            "SELECT count(*), count(*) FILTER (WHERE status IN {CLOSED_SQL} AND updated_at - first_seen_at <= ?4)
             FROM dead_letters WHERE partition = ?1 AND first_seen_at >= ?2 AND first_seen_at < ?3"
        ))?;
        let mut sum = (0, 0);
        for p in parts.keys() {
            let (e, m): (i64, i64) = q.query_row(
                rusqlite::params![p, now_ms - 7 * DAY, now_ms - 2 * DAY, 2 * DAY],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            sum = (sum.0 + e, sum.1 + m);
        }
        sum
    };
    let slo_48h = (eligible > 0).then(|| Slo {
        eligible,
        met,
        ratio: met as f64 / eligible as f64,
    });
    let partitions: Vec<PartitionStats> = parts
        .into_iter()
        .map(|(partition, (open, closed))| PartitionStats {
            money_impacting: money.contains(&partition),
            partition,
            open,
            closed,
        })
        .collect();
    let business_loss_risk = partitions
        .iter()
        .filter(|p| p.money_impacting)
        .map(|p| p.open)
        .sum();
    Ok(Stats {
        generated_at: super::query::ms_to_time(now_ms),
        total,
        open,
        by_status,
        partitions,
        new_last_hour,
        new_last_day,
        open_older_than_hour: older_hour,
        open_older_than_day: older_day,
        open_past_sla: past_sla,
        top_fingerprints,
        top_workflows,
        closed_shares,
        time_to_resolution,
        slo_48h,
        business_loss_risk,
        ingress_per_hour,
        n8n_api: None,
    })
}

/// What the alert rules read: open records per partition (kept totals) and how many open
/// records are past their due time (the open records only).
pub fn alert_inputs(
    conn: &Connection,
    now_ms: i64,
) -> Result<(Vec<(String, i64)>, i64), StoreError> {
    let open = conn
        .prepare_cached(&format!(
            "SELECT partition, sum(records) FROM partition_stats
             WHERE status NOT IN {CLOSED_SQL} GROUP BY partition HAVING sum(records) > 0"
        ))?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let past_sla = conn.query_row(
        &format!(
            "SELECT count(*) FROM dead_letters WHERE status NOT IN {CLOSED_SQL} AND due_at < ?1"
        ),
        [now_ms],
        |r| r.get(0),
    )?;
    Ok((open, past_sla))
}

/// Records first seen, and records closed, in each of the last `hours` hours (oldest first):
/// the overview chart. Along the (partition, first seen) index and the closed records' index.
pub fn hourly(
    conn: &Connection,
    now_ms: i64,
    hours: usize,
) -> Result<(Vec<i64>, Vec<i64>), StoreError> {
    let start = now_ms - hours as i64 * HOUR;
    let mut ingress = vec![0i64; hours];
    let mut closed = vec![0i64; hours];
    let partitions: Vec<String> = conn
        .prepare_cached(
            "SELECT partition FROM partition_stats GROUP BY partition HAVING sum(records) > 0",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut q = conn.prepare_cached(
        "SELECT (first_seen_at - ?2) / 3600000, count(*) FROM dead_letters
         WHERE partition = ?1 AND first_seen_at >= ?2 GROUP BY 1",
    )?;
    let last = hours as i64 - 1;
    for p in &partitions {
        for row in q.query_map(rusqlite::params![p, start], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })? {
            let (h, n) = row?;
            ingress[h.clamp(0, last) as usize] += n;
        }
    }
    let rows = conn
        .prepare_cached(&format!(
            "SELECT (updated_at - ?1) / 3600000, count(*) FROM dead_letters
             WHERE status IN {CLOSED_SQL} AND updated_at >= ?1 GROUP BY 1"
        ))?
        .query_map([start], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    for (h, n) in rows {
        closed[h.clamp(0, last) as usize] += n;
    }
    Ok((ingress, closed))
}
