//! Export and import as JSON Lines: one header line, then one line per record (its columns,
//! every document version decoded to its original bytes, its audit events and delivery
//! attempts), then one line per tombstone. Export reads one snapshot (a single read
//! transaction) and streams it; import is idempotent: a record whose id is already there is
//! left alone, and a record this database removed (it has a tombstone) is never brought back —
//! an erased person stays erased.
//!
//! Columns travel by name, so a file written by this schema version (or an older one) imports
//! into this one; names are checked against the table before they reach SQL.

use std::collections::BTreeSet;
use std::io::Write;

use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::codec::{self, Codec};
use super::StoreError;

pub const FORMAT: &str = "deadletter-export";
pub const FORMAT_VERSION: i64 = 1;

/// The first line of an export.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: i64,
    /// The schema version of the database it came from.
    pub schema: i64,
    pub exported_at: chrono::DateTime<chrono::Utc>,
    pub records: i64,
    pub tombstones: i64,
}

/// One document version, decoded: the original bytes, as text when they are UTF-8 (payloads
/// are JSON, so in practice always), else hex.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub kind: String,
    pub version: i64,
    pub size: i64,
    pub sha256: String,
    pub created_at: i64,
    pub actor: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
}

impl Document {
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        match (&self.text, &self.hex) {
            (Some(t), None) => Ok(t.clone().into_bytes()),
            (None, Some(h)) => hex::decode(h).map_err(|e| format!("document hex: {e}")),
            _ => Err("a document needs exactly one of text or hex".into()),
        }
    }
}

/// One record with everything that hangs off it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordLine {
    pub record: Map<String, Value>,
    pub documents: Vec<Document>,
    pub events: Vec<Map<String, Value>>,
    pub attempts: Vec<Map<String, Value>>,
}

/// A line after the header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    Record(Box<RecordLine>),
    Tombstone { tombstone: Map<String, Value> },
}

/// A BLOB column travels as {"hex": "…"}.
fn to_json(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => Value::from(f),
        ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => serde_json::json!({ "hex": hex::encode(b) }),
    }
}

fn to_sql(column: &str, v: &Value) -> Result<SqlValue, StoreError> {
    Ok(match v {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => SqlValue::Real(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => SqlValue::Text(s.clone()),
        Value::Object(o) => match o.get("hex").and_then(Value::as_str) {
            Some(h) if o.len() == 1 => {
                SqlValue::Blob(hex::decode(h).map_err(|e| bad(format!("{column}: bad hex: {e}")))?)
            }
            _ => return Err(bad(format!("{column}: unexpected object"))),
        },
        Value::Array(_) => return Err(bad(format!("{column}: unexpected array"))),
    })
}

fn bad(m: String) -> StoreError {
    StoreError::Corrupt(format!("import: {m}"))
}

/// Rows of `sql` (one `?1` parameter) as column-name maps, without the columns in `skip`.
fn rows(
    conn: &Connection,
    sql: &str,
    arg: i64,
    skip: &[&str],
) -> Result<Vec<Map<String, Value>>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    let mut out = Vec::new();
    let mut q = stmt.query([arg])?;
    while let Some(r) = q.next()? {
        let mut m = Map::new();
        for (i, n) in names.iter().enumerate() {
            if !skip.contains(&n.as_str()) {
                m.insert(n.clone(), to_json(r.get_ref(i)?));
            }
        }
        out.push(m);
    }
    Ok(out)
}

fn documents(conn: &Connection, id: i64) -> Result<Vec<Document>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT kind, version, codec, size, sha256, bytes, created_at, actor
         FROM payloads WHERE record_id = ?1 ORDER BY kind, version",
    )?;
    let mut out = Vec::new();
    let mut q = stmt.query([id])?;
    while let Some(r) = q.next()? {
        let codec = Codec::parse(&r.get::<_, String>(2)?)?;
        let size: i64 = r.get(3)?;
        let bytes = codec::decode(codec, size as usize, r.get(5)?)?;
        let (text, hex) = match String::from_utf8(bytes) {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(hex::encode(e.into_bytes()))),
        };
        out.push(Document {
            kind: r.get(0)?,
            version: r.get(1)?,
            size,
            sha256: hex::encode(r.get::<_, Vec<u8>>(4)?),
            created_at: r.get(6)?,
            actor: r.get(7)?,
            text,
            hex,
        });
    }
    Ok(out)
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Exported {
    pub records: u64,
    pub tombstones: u64,
}

/// Write everything to `out` from one snapshot; `progress` is told of each record written
/// (after it is told the total, once, before the first).
pub fn export(
    conn: &Connection,
    out: &mut dyn Write,
    mut progress: impl FnMut(u64, u64),
) -> Result<Exported, StoreError> {
    let io = |e: std::io::Error| StoreError::Corrupt(format!("export: cannot write: {e}"));
    // One read transaction: every line comes from the same instant.
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let (records, tombstones): (i64, i64) = conn.query_row(
            "SELECT (SELECT count(*) FROM dead_letters), (SELECT count(*) FROM tombstones)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let header = Header {
            format: FORMAT.into(),
            version: FORMAT_VERSION,
            schema: super::schema::version(conn)?,
            exported_at: chrono::Utc::now(),
            records,
            tombstones,
        };
        serde_json::to_writer(&mut *out, &header).map_err(|e| io(e.into()))?;
        out.write_all(b"\n").map_err(io)?;
        progress(0, records as u64);
        let mut done = Exported::default();
        let mut stmt = conn.prepare("SELECT * FROM dead_letters ORDER BY id")?;
        let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
        let mut q = stmt.query([])?;
        while let Some(r) = q.next()? {
            let mut record = Map::new();
            for (i, n) in names.iter().enumerate() {
                record.insert(n.clone(), to_json(r.get_ref(i)?));
            }
            let id: i64 = r.get("id")?;
            let line = Line::Record(Box::new(RecordLine {
                record,
                documents: documents(conn, id)?,
                events: rows(
                    conn,
                    "SELECT * FROM events WHERE record_id = ?1 ORDER BY id",
                    id,
                    &["id", "record_id"],
                )?,
                attempts: rows(
                    conn,
                    "SELECT * FROM attempts WHERE record_id = ?1 ORDER BY id",
                    id,
                    &["id", "record_id"],
                )?,
            }));
            serde_json::to_writer(&mut *out, &line).map_err(|e| io(e.into()))?;
            out.write_all(b"\n").map_err(io)?;
            done.records += 1;
            progress(done.records, records as u64);
        }
        let mut stmt = conn.prepare("SELECT * FROM tombstones ORDER BY id")?;
        let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
        let mut q = stmt.query([])?;
        while let Some(r) = q.next()? {
            let mut tombstone = Map::new();
            for (i, n) in names.iter().enumerate() {
                if n != "id" {
                    tombstone.insert(n.clone(), to_json(r.get_ref(i)?));
                }
            }
            serde_json::to_writer(&mut *out, &Line::Tombstone { tombstone })
                .map_err(|e| io(e.into()))?;
            out.write_all(b"\n").map_err(io)?;
            done.tombstones += 1;
        }
        out.flush().map_err(io)?;
        Ok(done)
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

/// What an import did with the lines it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Imported {
    /// Records written.
    pub records: u64,
    /// Records already here (same id, same identity): left alone.
    pub present: u64,
    /// Records this database removed (a tombstone has their id): never brought back.
    pub removed_here: u64,
    /// Records whose id is taken here by a different record: left out, listed by the caller.
    pub conflicts: u64,
    pub tombstones: u64,
}

impl Imported {
    pub fn add(&mut self, o: Imported) {
        self.records += o.records;
        self.present += o.present;
        self.removed_here += o.removed_here;
        self.conflicts += o.conflicts;
        self.tombstones += o.tombstones;
    }
}

fn columns(conn: &Connection, table: &str) -> Result<BTreeSet<String>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT name FROM pragma_table_info(?1)")?
        .query_map([table], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// INSERT of the given columns, after checking each is one of the table's.
fn insert(
    conn: &Connection,
    table: &str,
    known: &BTreeSet<String>,
    row: &Map<String, Value>,
    extra: &[(&str, SqlValue)],
) -> Result<(), StoreError> {
    let mut names = Vec::new();
    let mut values = Vec::new();
    for (k, v) in row {
        if !known.contains(k) {
            return Err(bad(format!("{table} has no column `{k}`")));
        }
        if extra.iter().any(|(e, _)| e == k) {
            continue;
        }
        names.push(k.as_str());
        values.push(to_sql(k, v)?);
    }
    for (k, v) in extra {
        names.push(k);
        values.push(v.clone());
    }
    let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    conn.prepare_cached(&format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        names.join(", "),
        marks.join(", ")
    ))?
    .execute(params_from_iter(values))?;
    Ok(())
}

fn get_i64(m: &Map<String, Value>, k: &str) -> Result<i64, StoreError> {
    m.get(k)
        .and_then(Value::as_i64)
        .ok_or_else(|| bad(format!("`{k}` missing or not a number")))
}

/// Apply lines to the database (the writer calls this, one transaction per batch).
pub fn import(
    conn: &Connection,
    lines: &[Line],
    compress_above: usize,
    zstd_level: i32,
) -> Result<(Imported, Vec<i64>), StoreError> {
    let mut done = Imported::default();
    let mut conflicts = Vec::new();
    let record_cols = columns(conn, "dead_letters")?;
    let event_cols = columns(conn, "events")?;
    let attempt_cols = columns(conn, "attempts")?;
    let tomb_cols = columns(conn, "tombstones")?;
    for line in lines {
        match line {
            Line::Record(l) => {
                let id = get_i64(&l.record, "id")?;
                let here: Option<(String, i64, i64)> = conn
                    .prepare_cached(
                        "SELECT partition, first_seen_at, fingerprint FROM dead_letters WHERE id = ?1",
                    )?
                    .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?;
                if let Some((partition, first_seen, fingerprint)) = here {
                    let same = l.record.get("partition").and_then(Value::as_str)
                        == Some(partition.as_str())
                        && get_i64(&l.record, "first_seen_at")? == first_seen
                        && get_i64(&l.record, "fingerprint")? == fingerprint;
                    if same {
                        done.present += 1;
                    } else {
                        done.conflicts += 1;
                        conflicts.push(id);
                    }
                    continue;
                }
                let removed = conn
                    .prepare_cached("SELECT 1 FROM tombstones WHERE record_id = ?1")?
                    .exists([id])?;
                if removed {
                    done.removed_here += 1;
                    continue;
                }
                // Documents first (checked against their hashes), so the record's weight is
                // what this database stores, whatever codec wrote the export.
                let mut encoded = Vec::new();
                let mut stored = 0i64;
                for d in &l.documents {
                    let bytes = d.bytes().map_err(bad)?;
                    let e = codec::encode(&bytes, compress_above, zstd_level);
                    if hex::encode(e.sha256) != d.sha256 || e.size as i64 != d.size {
                        return Err(bad(format!(
                            "record {id}: {} version {} does not match its sha256/size",
                            d.kind, d.version
                        )));
                    }
                    stored += e.bytes.len() as i64;
                    encoded.push((d, e));
                }
                insert(
                    conn,
                    "dead_letters",
                    &record_cols,
                    &l.record,
                    &[("stored_bytes", SqlValue::Integer(stored))],
                )?;
                for (d, e) in encoded {
                    super::apply::insert_document(
                        conn,
                        id,
                        &d.kind,
                        d.version,
                        &e,
                        d.created_at,
                        &d.actor,
                    )?;
                }
                let rid = [("record_id", SqlValue::Integer(id))];
                for ev in &l.events {
                    insert(conn, "events", &event_cols, ev, &rid)?;
                }
                for a in &l.attempts {
                    insert(conn, "attempts", &attempt_cols, a, &rid)?;
                }
                count_into_group(conn, &l.record)?;
                raise_id_floor(conn, id)?;
                done.records += 1;
            }
            Line::Tombstone { tombstone } => {
                let (rid, at, reason) = (
                    get_i64(tombstone, "record_id")?,
                    get_i64(tombstone, "removed_at")?,
                    tombstone
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                );
                let there = conn
                    .prepare_cached(
                        "SELECT 1 FROM tombstones WHERE record_id = ?1 AND removed_at = ?2 AND reason = ?3",
                    )?
                    .exists(params![rid, at, reason])?;
                if !there {
                    insert(conn, "tombstones", &tomb_cols, tombstone, &[])?;
                    done.tombstones += 1;
                }
                // Its id was handed out once: never again.
                raise_id_floor(conn, rid)?;
            }
        }
    }
    Ok((done, conflicts))
}

fn raise_id_floor(conn: &Connection, id: i64) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE counters SET value = max(value, ?1) WHERE name = 'id_floor'")?
        .execute([id])?;
    Ok(())
}

/// Keep the failure groups (listing, poison detection) true for an imported record.
fn count_into_group(conn: &Connection, r: &Map<String, Value>) -> Result<(), StoreError> {
    let s = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned);
    let fp = get_i64(r, "fingerprint")?;
    let (first, last) = (get_i64(r, "first_seen_at")?, get_i64(r, "last_seen_at")?);
    conn.prepare_cached(
        "INSERT INTO groups (fingerprint, failure_class, workflow_id, workflow_name, node_name,
             sample_message, first_seen_at, last_seen_at, records, window_start, window_records)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?7, 0)
         ON CONFLICT (fingerprint) DO UPDATE SET records = records + 1,
             first_seen_at = min(first_seen_at, excluded.first_seen_at),
             last_seen_at = max(last_seen_at, excluded.last_seen_at)",
    )?
    .execute(params![
        fp,
        s("failure_class").unwrap_or_else(|| "unknown".into()),
        s("workflow_id"),
        s("workflow_name"),
        s("node_name"),
        s("error_message"),
        first,
        last
    ])?;
    Ok(())
}
