//! Replay jobs in the database: creating one with its items in order, moving it between its
//! states, recording each item's outcome, and reading progress. Applied by the writer; read
//! through the reader pool.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use super::query::ms_to_time;
use super::StoreError;

/// A job's state. Only `running` jobs send; `awaiting_approval` waits for a second person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    AwaitingApproval,
    Running,
    Paused,
    Cancelled,
    /// Stopped by itself: the failure ratio passed its threshold.
    Stopped,
    Done,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::AwaitingApproval => "awaiting_approval",
            JobStatus::Running => "running",
            JobStatus::Paused => "paused",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Stopped => "stopped",
            JobStatus::Done => "done",
        }
    }

    pub fn parse(s: &str) -> Result<JobStatus, StoreError> {
        Ok(match s {
            "awaiting_approval" => JobStatus::AwaitingApproval,
            "running" => JobStatus::Running,
            "paused" => JobStatus::Paused,
            "cancelled" => JobStatus::Cancelled,
            "stopped" => JobStatus::Stopped,
            "done" => JobStatus::Done,
            other => return Err(StoreError::Corrupt(format!("unknown job status `{other}`"))),
        })
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobStatus::Cancelled | JobStatus::Stopped | JobStatus::Done
        )
    }
}

#[derive(Debug, Clone)]
pub struct NewJob {
    pub actor: String,
    /// The API token the request came with (the two-person rule compares tokens).
    pub token: Option<String>,
    pub at_ms: i64,
    pub record_ids: Vec<i64>,
    pub needs_approval: bool,
    pub new_keys: bool,
    pub batch_size: i64,
    pub stop_failure_ratio: f64,
    /// The request as the operator gave it (ids, or filter and expected count).
    pub spec: serde_json::Value,
}

/// An operator's (or the runner's) move of a job.
#[derive(Debug, Clone)]
pub struct JobMove {
    pub id: i64,
    pub actor: String,
    pub token: Option<String>,
    pub at_ms: i64,
    pub to: JobStatus,
    pub reason: Option<String>,
}

/// One item's outcome.
#[derive(Debug, Clone)]
pub struct ItemOutcome {
    pub job_id: i64,
    pub seq: i64,
    /// succeeded | failed | skipped
    pub state: &'static str,
    pub detail: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct JobItemView {
    pub seq: i64,
    pub record_id: i64,
    pub state: String,
    #[schema(value_type = Option<Object>)]
    pub detail: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct JobCounts {
    pub total: i64,
    pub pending: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub skipped: i64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct JobView {
    pub id: i64,
    pub status: JobStatus,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub created_by: String,
    pub approved_by: Option<String>,
    pub new_keys: bool,
    pub batch_size: i64,
    pub stop_failure_ratio: f64,
    pub stop_reason: Option<String>,
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
    pub counts: JobCounts,
    pub items: Vec<JobItemView>,
}

pub fn create(conn: &Connection, j: &NewJob) -> Result<i64, StoreError> {
    let status = if j.needs_approval {
        JobStatus::AwaitingApproval
    } else {
        JobStatus::Running
    };
    conn.prepare_cached(
        "INSERT INTO replay_jobs (created_at, created_by, created_by_token, status, new_keys, batch_size,
             stop_failure_ratio, spec, updated_at)
         VALUES (?1, ?2, ?8, ?3, ?4, ?5, ?6, ?7, ?1)",
    )?
    .execute(params![
        j.at_ms,
        j.actor,
        status.as_str(),
        j.new_keys,
        j.batch_size,
        j.stop_failure_ratio,
        j.spec.to_string(),
        j.token
    ])?;
    let id = conn.last_insert_rowid();
    let mut insert = conn.prepare_cached(
        "INSERT INTO replay_job_items (job_id, seq, record_id, state) VALUES (?1, ?2, ?3, 'pending')",
    )?;
    for (seq, rid) in j.record_ids.iter().enumerate() {
        insert.execute(params![id, seq as i64, rid])?;
    }
    Ok(id)
}

/// The moves a job may make, and who may make them.
pub fn apply_move(conn: &Connection, m: &JobMove) -> Result<JobStatus, StoreError> {
    let (status, created_by, created_token): (String, String, Option<String>) = conn
        .prepare_cached(
            "SELECT status, created_by, created_by_token FROM replay_jobs WHERE id = ?1",
        )?
        .query_row([m.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?
        .ok_or(StoreError::NoJob(m.id))?;
    let from = JobStatus::parse(&status)?;
    use JobStatus::*;
    let legal = matches!(
        (from, m.to),
        (AwaitingApproval, Running)
            | (AwaitingApproval, Cancelled)
            | (Running, Paused)
            | (Running, Cancelled)
            | (Running, Stopped)
            | (Running, Done)
            | (Paused, Running)
            | (Paused, Cancelled)
    );
    if !legal {
        return Err(StoreError::Invalid(format!(
            "replay job {} is {}; it cannot become {}",
            m.id,
            from.as_str(),
            m.to.as_str()
        )));
    }
    if from == AwaitingApproval && m.to == Running {
        // With tokens, the identity is the token: a second name under the same token is not a
        // second person.
        let same = match (&created_token, &m.token) {
            (Some(a), Some(b)) => a == b,
            _ => m.actor == created_by,
        };
        if same {
            return Err(StoreError::Invalid(format!(
                "replay job {} needs a second person: {} asked for it and cannot approve it",
                m.id, created_by
            )));
        }
        conn.prepare_cached(
            "UPDATE replay_jobs SET approved_by = ?2, approved_at = ?3 WHERE id = ?1",
        )?
        .execute(params![m.id, m.actor, m.at_ms])?;
    }
    conn.prepare_cached(
        "UPDATE replay_jobs SET status = ?2, stop_reason = COALESCE(?3, stop_reason), updated_at = ?4 WHERE id = ?1",
    )?
    .execute(params![m.id, m.to.as_str(), m.reason, m.at_ms])?;
    Ok(m.to)
}

pub fn set_item(conn: &Connection, o: &ItemOutcome) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE replay_job_items SET state = ?3, detail = ?4 WHERE job_id = ?1 AND seq = ?2",
    )?
    .execute(params![o.job_id, o.seq, o.state, o.detail.to_string()])?;
    Ok(())
}

/// The columns `job_row` reads, in its order.
const JOB_COLUMNS: &str = "j.id, j.status, j.created_at, j.created_by, j.approved_by, j.new_keys,
    j.batch_size, j.stop_failure_ratio, j.stop_reason, j.spec";

/// A job from a row of `JOB_COLUMNS` (items and counts left empty).
fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, JobView)> {
    let spec: String = r.get(9)?;
    Ok((
        r.get(1)?,
        JobView {
            id: r.get(0)?,
            status: JobStatus::Done,
            created_at: ms_to_time(r.get(2)?),
            created_by: r.get(3)?,
            approved_by: r.get(4)?,
            new_keys: r.get(5)?,
            batch_size: r.get(6)?,
            stop_failure_ratio: r.get(7)?,
            stop_reason: r.get(8)?,
            spec: serde_json::from_str(&spec).unwrap_or_default(),
            counts: JobCounts::default(),
            items: Vec::new(),
        },
    ))
}

/// The status column read as text, parsed.
fn with_status((status, mut job): (String, JobView)) -> Result<JobView, StoreError> {
    job.status = JobStatus::parse(&status)?;
    Ok(job)
}

pub fn get(conn: &Connection, id: i64) -> Result<JobView, StoreError> {
    let mut job = conn
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM replay_jobs j WHERE j.id = ?1"
        ))?
        .query_row([id], job_row)
        .optional()?
        .ok_or(StoreError::NoJob(id))
        .and_then(with_status)?;
    job.items = conn
        .prepare_cached("SELECT seq, record_id, state, detail FROM replay_job_items WHERE job_id = ?1 ORDER BY seq")?
        .query_map([id], |r| {
            let detail: Option<String> = r.get(3)?;
            Ok(JobItemView {
                seq: r.get(0)?,
                record_id: r.get(1)?,
                state: r.get(2)?,
                detail: detail.and_then(|d| serde_json::from_str(&d).ok()),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let c = &mut job.counts;
    c.total = job.items.len() as i64;
    for i in &job.items {
        match i.state.as_str() {
            "pending" => c.pending += 1,
            "succeeded" => c.succeeded += 1,
            "failed" => c.failed += 1,
            _ => c.skipped += 1,
        }
    }
    Ok(job)
}

/// Jobs the runner should be working on (after a restart too).
pub fn running(conn: &Connection) -> Result<Vec<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT id FROM replay_jobs WHERE status = 'running' ORDER BY id")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<Vec<_>, _>>()?)
}

/// Did any send with this idempotency key ever succeed (in any record)?
pub fn key_succeeded(conn: &Connection, key: &str) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT record_id FROM attempts WHERE idempotency_key = ?1 AND outcome = 'success' LIMIT 1")?
        .query_row([key], |r| r.get(0))
        .optional()?)
}

/// Jobs of this actor not yet ended (awaiting approval, running or paused).
pub fn open_jobs_of(conn: &Connection, actor: &str) -> Result<i64, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM replay_jobs
             WHERE created_by = ?1 AND status IN ('awaiting_approval', 'running', 'paused')",
        )?
        .query_row([actor], |r| r.get(0))?)
}

/// The newest jobs, newest first, each with its counts but not its items (one query).
pub fn list(conn: &Connection, limit: usize) -> Result<Vec<JobView>, StoreError> {
    let rows = conn
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS}, count(i.seq),
                    coalesce(sum(i.state = 'pending'), 0),
                    coalesce(sum(i.state = 'succeeded'), 0),
                    coalesce(sum(i.state = 'failed'), 0)
             FROM replay_jobs j LEFT JOIN replay_job_items i ON i.job_id = j.id
             GROUP BY j.id ORDER BY j.id DESC LIMIT ?1"
        ))?
        .query_map([limit as i64], |r| {
            let (status, mut job) = job_row(r)?;
            let (total, pending, succeeded, failed): (i64, i64, i64, i64) =
                (r.get(10)?, r.get(11)?, r.get(12)?, r.get(13)?);
            job.counts = JobCounts {
                total,
                pending,
                succeeded,
                failed,
                skipped: total - pending - succeeded - failed,
            };
            Ok((status, job))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(with_status).collect()
}

/// How many jobs wait for a second person's approval.
pub fn awaiting_approval(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn
        .prepare_cached("SELECT count(*) FROM replay_jobs WHERE status = 'awaiting_approval'")?
        .query_row([], |r| r.get(0))?)
}
