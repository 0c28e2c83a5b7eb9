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
