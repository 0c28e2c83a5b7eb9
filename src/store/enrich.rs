//! n8n enrichment, the store's side: which Error Trigger records still want their execution
//! fetched, and what a fetch (or an operator asking again) does to a record — all through the
//! writer, audited.

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use super::codec::Encoded;
use super::StoreError;
use crate::model::EventKind;

/// A record to fetch: id, n8n execution id, first seen (the give-up clock starts there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: i64,
    pub execution_id: String,
    pub first_seen_ms: i64,
}

/// Records never looked at, then those whose retry time has come (the partial index holds
/// exactly these).
pub fn candidates(
    conn: &Connection,
    now_ms: i64,
    limit: usize,
) -> Result<Vec<Candidate>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, execution_id, first_seen_at FROM dead_letters
             WHERE source = 'n8n_error_trigger' AND execution_id IS NOT NULL
               AND (enrichment IS NULL OR enrichment = 'pending')
               AND (enrich_after IS NULL OR enrich_after <= ?1)
             ORDER BY enrich_after IS NOT NULL, enrich_after, id LIMIT ?2",
        )?
        .query_map(params![now_ms, limit as i64], |r| {
            Ok(Candidate {
                id: r.get(0)?,
                execution_id: r.get(1)?,
                first_seen_ms: r.get(2)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// What happened when deadletter asked n8n.
#[derive(Debug, Clone)]
pub enum EnrichResult {
    /// The execution was there: its trigger item (the payload, when the record has none) and
    /// the failing node's input items, redacted and encoded; what was learnt.
    Enriched {
        payload: Option<Encoded>,
        inputs: Option<Encoded>,
        detail: Value,
    },
    /// Not now (n8n down, key refused): try again at `after_ms`.
    Retry { after_ms: i64, detail: Value },
    /// It will never be there (pruned, not saved, or given up on).
    Unavailable { detail: Value },
    /// An operator asks for another try now.
    Requested,
}

#[derive(Debug, Clone)]
pub struct Enrich {
    pub id: i64,
    pub at_ms: i64,
    pub actor: String,
    pub result: EnrichResult,
}

fn event(conn: &Connection, e: &Enrich, kind: EventKind, detail: &Value) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO events (record_id, at, actor, kind, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        e.id,
        e.at_ms,
        e.actor,
        kind.as_str(),
        detail.to_string()
    ])?;
    Ok(())
}

fn insert_doc(
    conn: &Connection,
    id: i64,
    kind: &str,
    doc: &Encoded,
    e: &Enrich,
) -> Result<i64, StoreError> {
    let version: i64 = conn
        .prepare_cached(
            "SELECT coalesce(max(version), 0) + 1 FROM payloads WHERE record_id = ?1 AND kind = ?2",
        )?
        .query_row(params![id, kind], |r| r.get(0))?;
    super::apply::insert_document(conn, id, kind, version, doc, e.at_ms, &e.actor)?;
    conn.prepare_cached("UPDATE dead_letters SET stored_bytes = stored_bytes + ?2 WHERE id = ?1")?
        .execute(params![id, doc.bytes.len() as i64])?;
    Ok(version)
}

/// Apply one outcome. A record removed meanwhile is left alone (NotFound).
pub fn apply(conn: &Connection, e: &Enrich) -> Result<(), StoreError> {
    let current: Option<(Option<i64>, String, Option<String>)> = conn
        .prepare_cached(
            "SELECT payload_version, source, execution_id FROM dead_letters WHERE id = ?1",
        )?
        .query_row([e.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((payload_version, source, execution)) = current else {
        return Err(StoreError::NotFound(e.id));
    };
    if matches!(e.result, EnrichResult::Requested)
        && (source != "n8n_error_trigger" || execution.is_none())
    {
        return Err(StoreError::Invalid(format!(
            "dead letter {} did not come from n8n's Error Trigger with an execution id: there is nothing to fetch",
            e.id
        )));
    }
    match &e.result {
        EnrichResult::Enriched {
            payload,
            inputs,
            detail,
        } => {
            let mut detail = detail.clone();
            // The record's own payload (an edit, or the envelope's item) wins over n8n's.
            if let (Some(doc), None) = (payload, payload_version) {
                let v = insert_doc(conn, e.id, "item", doc, e)?;
                conn.prepare_cached("UPDATE dead_letters SET payload_version = ?2 WHERE id = ?1")?
                    .execute(params![e.id, v])?;
                detail["payload"] = json!("from n8n: the trigger item");
            } else if payload.is_some() {
                detail["payload"] = json!("kept: the record already had one");
            }
            if let Some(doc) = inputs {
                insert_doc(conn, e.id, "n8n_inputs", doc, e)?;
            }
            conn.prepare_cached(
                "UPDATE dead_letters SET enrichment = 'enriched', enrichment_detail = ?2, enrich_after = NULL,
                     updated_at = ?3, version = version + 1 WHERE id = ?1",
            )?
            .execute(params![e.id, detail.to_string(), e.at_ms])?;
            event(conn, e, EventKind::Enriched, &detail)?;
        }
        EnrichResult::Retry { after_ms, detail } => {
            conn.prepare_cached(
                "UPDATE dead_letters SET enrichment = 'pending', enrichment_detail = ?2, enrich_after = ?3
                 WHERE id = ?1",
            )?
            .execute(params![e.id, detail.to_string(), after_ms])?;
        }
        EnrichResult::Unavailable { detail } => {
            conn.prepare_cached(
                "UPDATE dead_letters SET enrichment = 'unavailable', enrichment_detail = ?2, enrich_after = NULL,
                     updated_at = ?3, version = version + 1 WHERE id = ?1",
            )?
            .execute(params![e.id, detail.to_string(), e.at_ms])?;
            event(conn, e, EventKind::EnrichmentUnavailable, detail)?;
        }
        EnrichResult::Requested => {
            conn.prepare_cached(
                "UPDATE dead_letters SET enrichment = 'pending', enrich_after = ?2, updated_at = ?2,
                     version = version + 1 WHERE id = ?1",
            )?
            .execute(params![e.id, e.at_ms])?;
            event(conn, e, EventKind::EnrichmentRequested, &json!({}))?;
        }
    }
    Ok(())
}

/// A record's enrichment state and what was learnt (for the record's detail view).
pub fn state(conn: &Connection, id: i64) -> Result<(Option<String>, Option<Value>), StoreError> {
    Ok(conn
        .prepare_cached("SELECT enrichment, enrichment_detail FROM dead_letters WHERE id = ?1")?
        .query_row([id], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<String>>(1)?
                    .and_then(|d| serde_json::from_str(&d).ok()),
            ))
        })
        .optional()?
        .unwrap_or((None, None)))
}

/// Does a record (open or closed) already stand for this n8n execution?
pub fn known_execution(
    conn: &Connection,
    workflow_id: &str,
    execution_id: &str,
) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM dead_letters WHERE execution_id = ?1 AND workflow_id = ?2 LIMIT 1",
        )?
        .exists(params![execution_id, workflow_id])?)
}

/// A named number kept in the database (`counters`), e.g. the reconciliation watermark.
pub fn counter(conn: &Connection, name: &str) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT value FROM counters WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?)
}

pub fn set_counter(conn: &Connection, name: &str, value: i64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![name, value])?;
    Ok(())
}
