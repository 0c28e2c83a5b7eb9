//! The two shapes producers post, parsed into one `ParsedFailure`.
//!
//! - n8n's Error Trigger item, exactly as n8n emits it (`execution{…}` or, when a trigger or
//!   activation failed, `trigger{…}`, plus `workflow{id,name}`). The `error` object is kept as
//!   opaque JSON; only what triage needs is derived from it. Unknown fields are never refused.
//! - The generic envelope: the failing item itself (`payload`, or `item` as n8n's error output
//!   sends it) with optional routing and identity fields.
//!
//! Parsing is pure: no I/O, no redaction (that is `redact`'s job, done before anything is
//! stored), no classification (`classify`'s job).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::ids::{Partition, ShortText};
use super::record::FailureFacts;

/// Longest accepted identity field (idempotency key, event id, tenant …), in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest stored error message; longer ones are cut (the whole error object is kept anyway).
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Longest name-like field (workflow name, node name, urls …).
pub const MAX_NAME_BYTES: usize = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    ErrorTrigger,
    Envelope,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::ErrorTrigger => "n8n_error_trigger",
            Source::Envelope => "envelope",
        }
    }
}

/// Why a body was refused. `Syntax` is not JSON at all (400); `Field` is JSON of the wrong
/// shape, naming the field by its path (422).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("the body is not valid JSON: {0}")]
    Syntax(String),
    #[error("`{path}`: {message}")]
    Field { path: String, message: String },
}

impl InputError {
    fn field(path: impl Into<String>, message: impl Into<String>) -> Self {
        InputError::Field {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// One failure as a producer reported it, before redaction and classification.
#[derive(Debug, Default)]
pub struct ParsedFailure {
    pub source: Option<Source>,
    pub partition: Option<Partition>,
    pub facts: FailureFacts,
    pub error_description: Option<String>,
    /// The producer's error object, opaque. Redacted before it is stored.
    pub error: Option<Value>,
    /// The failing item, parsed (for redaction) …
    pub payload: Option<Value>,
    /// … and its exact bytes as posted, stored verbatim when redaction changes nothing, so the
    /// item reads back byte for byte.
    pub payload_raw: Option<Box<RawValue>>,
}

impl ParsedFailure {
    pub fn source(&self) -> Source {
        self.source.unwrap_or(Source::Envelope)
    }

    /// The key that makes a repeat of this failure count as another occurrence of an open
    /// record rather than a new record: the producer's idempotency key, else its event id,
    /// else n8n's workflow + execution + node (what n8n's Retry On Fail resends unchanged).
    /// `None` means "no identity given"; ingest then falls back to the body's hash.
    pub fn dedup_key(&self) -> Option<String> {
        if let Some(k) = &self.facts.idempotency_key {
            return Some(format!("idem:{k}"));
        }
        if let Some(k) = &self.facts.external_event_id {
            return Some(format!("ext:{k}"));
        }
        match (&self.facts.workflow_id, &self.facts.execution_id) {
            (Some(w), Some(e)) => Some(format!(
                "n8n:{w}\u{1f}{e}\u{1f}{}",
                self.facts.node_name.as_deref().unwrap_or("")
            )),
            _ => None,
        }
    }

    /// The text the classifier's `error_text` rules and the fingerprint look at.
    pub fn error_text(&self) -> String {
        match (&self.facts.error_message, &self.error_description) {
            (Some(m), Some(d)) if m != d => format!("{m}\n{d}"),
            (Some(m), _) => m.clone(),
            (None, Some(d)) => d.clone(),
            (None, None) => String::new(),
        }
    }
}

/// serde_json refuses JSON nested deeper than this (and so do we, by name).
pub const MAX_DEPTH: usize = 128;

fn too_deep(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

fn depth_error(path: &str) -> InputError {
    InputError::field(path, format!("JSON nested deeper than {MAX_DEPTH} levels"))
}

fn parse_json(body: &[u8]) -> Result<Value, InputError> {
    serde_json::from_slice(body).map_err(|e| {
        if too_deep(&e) {
            depth_error("$")
        } else {
            InputError::Syntax(e.to_string())
        }
    })
}

/// Parse n8n's Error Trigger item (`POST /v1/n8n/error-trigger`).
pub fn parse_error_trigger(body: &[u8]) -> Result<ParsedFailure, InputError> {
    let root = parse_json(body)?;
    let Value::Object(mut root) = root else {
        return Err(InputError::field(
            "$",
            "expected a JSON object: the item n8n's Error Trigger emits",
        ));
    };
    let mut out = ParsedFailure {
        source: Some(Source::ErrorTrigger),
        ..ParsedFailure::default()
    };
    read_workflow(&root, &mut out)?;

    if let Some(exec) = opt_object(&root, "execution", "execution")? {
        out.facts.execution_id = opt_id(exec, "id", "execution.id")?;
        out.facts.execution_url = opt_string(exec, "url", "execution.url")?;
        out.facts.execution_mode = opt_string(exec, "mode", "execution.mode")?;
        out.facts.retry_of = opt_id(exec, "retryOf", "execution.retryOf")?;
        out.facts.node_name = opt_string(exec, "lastNodeExecuted", "execution.lastNodeExecuted")?;
        out.error = take_error(&mut root, "execution");
    } else if let Some(trigger) = opt_object(&root, "trigger", "trigger")? {
        out.facts.execution_mode = opt_string(trigger, "mode", "trigger.mode")?;
        out.error = take_error(&mut root, "trigger");
    } else {
        return Err(InputError::field(
            "execution",
            "missing: an Error Trigger item has `execution` (or `trigger` when a trigger or activation failed)",
        ));
    }
    describe_error(&mut out);
    Ok(out)
}

/// The generic envelope's declared fields. Everything else in the body is allowed and ignored.
#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, alias = "failedNode", alias = "failed_node")]
    node: Option<String>,
    #[serde(default)]
    node_type: Option<String>,
    // Read as plain JSON and checked by hand: a derived struct would also accept an array.
    #[serde(default)]
    workflow: Option<Value>,
    #[serde(default)]
    execution: Option<Value>,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    external_event_id: Option<String>,
    #[serde(default)]
    correlation_id: Option<String>,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    contract_version: Option<String>,
    #[serde(default)]
    business_object_type: Option<String>,
    #[serde(default)]
    business_object_id: Option<String>,
    #[serde(default)]
    replay_url: Option<String>,
    #[serde(default)]
    http_status: Option<u16>,
}

/// Parse one generic envelope (`POST /v1/dead-letters`, or one element of a batch).
pub fn parse_envelope(body: &[u8]) -> Result<ParsedFailure, InputError> {
    // serde would happily read a struct from a JSON array (by position): refuse anything but an
    // object, telling "not JSON" (400) from "JSON, but not an object" (422).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Err(e) if too_deep(&e) => depth_error("$"),
                Err(e) => InputError::Syntax(e.to_string()),
                Ok(_) => {
                    InputError::field("$", "expected a JSON object with `payload` (or `item`)")
                }
            },
        );
    }
    // Syntax first, so that "not JSON" (400) and "JSON of the wrong shape" (422) stay apart.
    let de = &mut serde_json::Deserializer::from_slice(body);
    let raw: RawEnvelope<'_> = match serde_path_to_error::deserialize(de) {
        Ok(v) => v,
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if too_deep(&inner) {
                // Name the top-level field only: the full path is 128 segments long.
                let top = path.split(['.', '[']).next().filter(|p| !p.is_empty());
                return Err(depth_error(top.unwrap_or("$")));
            }
            return Err(if inner.is_syntax() || inner.is_eof() || path == "." {
                if inner.is_data() {
                    InputError::field("$", "expected a JSON object with `payload` (or `item`)")
                } else {
                    InputError::Syntax(inner.to_string())
                }
            } else {
                InputError::field(path, strip_position(&inner.to_string()))
            });
        }
    };
    let raw_item = match (raw.payload, raw.item) {
        (Some(_), Some(_)) => {
            return Err(InputError::field(
                "payload",
                "give the failing item as `payload` or as `item`, not both",
            ))
        }
        (Some(p), None) => p,
        (None, Some(i)) => i,
        (None, None) => return Err(InputError::field(
            "payload",
            "missing or null: the failing item, as `payload` (or `item`, as n8n's error output sends it)",
        )),
    };
    let payload: Value = serde_json::from_str(raw_item.get()).map_err(|e| {
        if too_deep(&e) {
            depth_error("payload")
        } else {
            InputError::field(
                "payload",
                format!("cannot be read: {}", strip_position(&e.to_string())),
            )
        }
    })?;

    let mut out = ParsedFailure {
        source: Some(Source::Envelope),
        ..ParsedFailure::default()
    };
    out.partition = raw
        .partition
        .map(|p| Partition::parse(&p).map_err(|m| InputError::field("partition", m)))
        .transpose()?;
    let key = |field: &str, v: Option<String>| -> Result<Option<String>, InputError> {
        v.map(|s| {
            ShortText::parse(field, &s, MAX_KEY_BYTES)
                .map(ShortText::into_string)
                .map_err(|m| InputError::field(field, m))
        })
        .transpose()
    };
    out.facts.idempotency_key = key("idempotency_key", raw.idempotency_key)?;
    out.facts.external_event_id = key("external_event_id", raw.external_event_id)?;
    out.facts.correlation_id = key("correlation_id", raw.correlation_id)?;
    out.facts.tenant_id = key("tenant_id", raw.tenant_id)?;
    out.facts.contract_version = key("contract_version", raw.contract_version)?;
    out.facts.business_object_type = key("business_object_type", raw.business_object_type)?;
    out.facts.business_object_id = key("business_object_id", raw.business_object_id)?;
    out.facts.replay_url = raw.replay_url.map(|u| parse_replay_url(&u)).transpose()?;
    let mut refs = Map::new();
    for (key, v) in [("workflow", raw.workflow), ("execution", raw.execution)] {
        if let Some(v) = v {
            refs.insert(key.to_owned(), v);
        }
    }
    read_workflow(&refs, &mut out)?;
    if let Some(x) = opt_object(&refs, "execution", "execution")? {
        out.facts.execution_id = opt_id(x, "id", "execution.id")?;
        out.facts.execution_mode = opt_string(x, "mode", "execution.mode")?;
        out.facts.execution_url = opt_string(x, "url", "execution.url")?;
    }
    out.facts.node_name = raw.node;
    out.facts.node_type = raw.node_type;
    out.error = match raw.error {
        Some(Value::Null) | None => payload.get("error").filter(|v| !v.is_null()).cloned(),
        Some(e) => Some(e),
    };
    out.payload = Some(payload);
    out.payload_raw = Some(raw_item.to_owned());
    for (name, v) in [
        ("workflow.id", &out.facts.workflow_id),
        ("workflow.name", &out.facts.workflow_name),
        ("execution.id", &out.facts.execution_id),
        ("execution.mode", &out.facts.execution_mode),
        ("execution.url", &out.facts.execution_url),
        ("node", &out.facts.node_name),
        ("node_type", &out.facts.node_type),
    ] {
        check_len(name, v.as_deref())?;
    }
    describe_error(&mut out);
    if raw.http_status.is_some() {
        out.facts.http_status = raw.http_status;
    }
    Ok(out)
}

fn parse_replay_url(u: &str) -> Result<String, InputError> {
    let u = u.trim();
    if u.len() > MAX_NAME_BYTES {
        return Err(InputError::field("replay_url", "is too long"));
    }
    let lower = u.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') && !u.chars().any(char::is_whitespace) => {
            Ok(u.to_owned())
        }
        _ => Err(InputError::field(
            "replay_url",
            format!("`{u}` is not an absolute http:// or https:// URL"),
        )),
    }
}

/// serde_json appends " at line 1 column 42" to its messages; the path already says where.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

fn check_len(field: &str, v: Option<&str>) -> Result<(), InputError> {
    match v {
        Some(s) if s.len() > MAX_NAME_BYTES => Err(InputError::field(
            field,
            format!(
                "is {} bytes long; at most {MAX_NAME_BYTES} are allowed",
                s.len()
            ),
        )),
        _ => Ok(()),
    }
}

/// Move `root[outer].error` out (no copy of what can be a large document); null means none.
fn take_error(root: &mut Map<String, Value>, outer: &str) -> Option<Value> {
    match root.get_mut(outer)?.as_object_mut()?.remove("error")? {
        Value::Null => None,
        e => Some(e),
    }
}

fn read_workflow(root: &Map<String, Value>, out: &mut ParsedFailure) -> Result<(), InputError> {
    if let Some(wf) = opt_object(root, "workflow", "workflow")? {
        out.facts.workflow_id = opt_id(wf, "id", "workflow.id")?;
        out.facts.workflow_name = opt_string(wf, "name", "workflow.name")?;
    }
    Ok(())
}

fn opt_object<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Map<String, Value>>, InputError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(other) => Err(InputError::field(
            path,
            format!("expected an object, got {}", kind(other)),
        )),
    }
}

fn opt_string(m: &Map<String, Value>, key: &str, path: &str) -> Result<Option<String>, InputError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            check_len(path, Some(s))?;
            Ok(Some(s.clone()))
        }
        Some(other) => Err(InputError::field(
            path,
            format!("expected a string, got {}", kind(other)),
        )),
    }
}

fn opt_id(m: &Map<String, Value>, key: &str, path: &str) -> Result<Option<String>, InputError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            check_len(path, Some(s))?;
            Ok(Some(s.clone()))
        }
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(InputError::field(
            path,
            format!("expected a string or number id, got {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Derive message, name, HTTP status, error code and node from the producer's error object,
/// whatever its exact shape (n8n's NodeApiError, NodeOperationError, an AxiosError from an
/// error output, or a plain string).
fn describe_error(out: &mut ParsedFailure) {
    let Some(err) = &out.error else { return };
    let text = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    match err {
        Value::String(s) => out.facts.error_message = Some(s.clone()),
        Value::Object(o) => {
            out.facts.error_message = text(o.get("message"));
            out.error_description = text(o.get("description"));
            out.facts.error_name = text(o.get("name"));
            for key in ["httpCode", "status", "statusCode"] {
                if let Some(code) = text(o.get(key)) {
                    match code.parse::<u16>() {
                        Ok(n) if (100..=599).contains(&n) => {
                            out.facts.http_status.get_or_insert(n);
                        }
                        _ => {
                            out.facts.error_code.get_or_insert(code);
                        }
                    }
                }
            }
            if let Some(code) = text(o.get("code")) {
                out.facts.error_code.get_or_insert(code);
            }
            if let Some(Value::Object(node)) = o.get("node") {
                if out.facts.node_name.is_none() {
                    out.facts.node_name = text(node.get("name"));
                }
                if out.facts.node_type.is_none() {
                    out.facts.node_type = text(node.get("type"));
                }
            }
        }
        _ => {}
    }
    if let Some(m) = &mut out.facts.error_message {
        truncate_utf8(m, MAX_MESSAGE_BYTES);
    }
    if let Some(d) = &mut out.error_description {
        truncate_utf8(d, MAX_MESSAGE_BYTES);
    }
}

fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/n8n");

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).unwrap()
    }

    #[test]
    fn code_node_error_trigger_names_workflow_execution_and_node() {
        let p = parse_error_trigger(&fixture("error-trigger-body.raw.json")).unwrap();
        assert_eq!(p.facts.workflow_id.as_deref(), Some("dlqMainWf0000001"));
        assert_eq!(
            p.facts.workflow_name.as_deref(),
            Some("Orders (fails on purpose)")
        );
        assert_eq!(p.facts.execution_id.as_deref(), Some("1"));
        assert_eq!(p.facts.node_name.as_deref(), Some("Process order"));
        assert_eq!(p.facts.execution_mode.as_deref(), Some("webhook"));
        assert_eq!(p.facts.http_status, None);
        assert!(p
            .facts
            .error_message
            .unwrap()
            .starts_with("order processing failed"));
        assert!(p.payload.is_none());
    }

    #[test]
    fn node_api_error_carries_http_code_and_node_type() {
        let p =
            parse_error_trigger(&fixture("error-trigger-body.dlqHttp500Wf0001.raw.json")).unwrap();
        assert_eq!(p.facts.http_status, Some(500));
        assert_eq!(p.facts.error_name.as_deref(), Some("NodeApiError"));
        assert_eq!(
            p.facts.node_type.as_deref(),
            Some("n8n-nodes-base.httpRequest")
        );
        let p =
            parse_error_trigger(&fixture("error-trigger-body.dlqHttpRefWf0001.raw.json")).unwrap();
        assert_eq!(p.facts.http_status, None);
        assert_eq!(p.facts.error_code.as_deref(), Some("ECONNREFUSED"));
    }

    #[test]
    fn trigger_failures_have_no_execution() {
        let body = br#"{"trigger":{"error":{"message":"Webhook could not be activated","name":"WorkflowActivationError"},"mode":"trigger"},"workflow":{"id":"wf1","name":"Poller"},"extra":1}"#;
        let p = parse_error_trigger(body).unwrap();
        assert_eq!(p.facts.execution_id, None);
        assert_eq!(p.facts.execution_mode.as_deref(), Some("trigger"));
        assert_eq!(
            p.facts.error_name.as_deref(),
            Some("WorkflowActivationError")
        );
        assert_eq!(p.dedup_key(), None);
    }

    #[test]
    fn error_trigger_refuses_wrong_shapes_by_path() {
        let e = parse_error_trigger(br#"{"workflow":{"id":"w"}}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "execution"),
            "{e}"
        );
        let e = parse_error_trigger(br#"{"execution":{"id":[1]}}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "execution.id"),
            "{e}"
        );
        let e = parse_error_trigger(b"[1]").unwrap_err();
        assert!(matches!(e, InputError::Field { .. }));
        let e = parse_error_trigger(b"{").unwrap_err();
        assert!(matches!(e, InputError::Syntax(_)));
    }

    #[test]
    fn error_output_item_keeps_the_item_bytes_and_reads_the_axios_error() {
        let body = fixture("error-output-item.raw.json");
        let p = parse_envelope(&body).unwrap();
        assert_eq!(p.facts.http_status, Some(500));
        assert_eq!(p.facts.error_code.as_deref(), Some("ERR_BAD_RESPONSE"));
        assert_eq!(p.facts.node_name.as_deref(), Some("Call downstream"));
        assert_eq!(p.facts.workflow_id.as_deref(), Some("dlqErrOutWf00001"));
        assert_eq!(p.facts.execution_id.as_deref(), Some("1"));
        let raw = p.payload_raw.unwrap();
        let whole: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(raw.get()).unwrap(),
            whole["item"]
        );
        assert!(std::str::from_utf8(&body).unwrap().contains(raw.get()));
    }

    #[test]
    fn envelope_type_errors_name_the_field() {
        let e = parse_envelope(br#"{"payload":{},"partition":5}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "partition"),
            "{e}"
        );
        let e = parse_envelope(br#"{"payload":{},"workflow":{"id":true}}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path.starts_with("workflow")),
            "{e}"
        );
        let e = parse_envelope(br#"{"error":"x"}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "payload"),
            "{e}"
        );
        let e = parse_envelope(br#"{"payload":1,"replay_url":"ftp://x"}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "replay_url"),
            "{e}"
        );
        let e = parse_envelope(br#"{"payload":1,"partition":"a b"}"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "partition"),
            "{e}"
        );
        let e = parse_envelope(b"[]").unwrap_err();
        assert!(matches!(e, InputError::Field { .. }), "{e}");
        // A struct must not be read from an array by position.
        let e = parse_envelope(br#"[{"a":1}]"#).unwrap_err();
        assert!(
            matches!(e, InputError::Field { ref path, .. } if path == "$"),
            "{e}"
        );
        let e = parse_envelope(b"[1,").unwrap_err();
        assert!(matches!(e, InputError::Syntax(_)), "{e}");
        let e = parse_envelope(b"{\"payload\":").unwrap_err();
        assert!(matches!(e, InputError::Syntax(_)), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!(
            "{{\"payload\":{}1{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(parse_envelope(deep.as_bytes()).is_err());
        let deep = format!(
            "{{\"execution\":{{\"error\":{}1{}}}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(parse_error_trigger(deep.as_bytes()).is_err());
    }

    #[test]
    fn dedup_key_prefers_the_producers_identity() {
        let p = parse_envelope(br#"{"payload":1,"idempotency_key":"k1","external_event_id":"e"}"#)
            .unwrap();
        assert_eq!(p.dedup_key().as_deref(), Some("idem:k1"));
        let p = parse_envelope(br#"{"payload":1,"external_event_id":"e"}"#).unwrap();
        assert_eq!(p.dedup_key().as_deref(), Some("ext:e"));
        let p = parse_envelope(br#"{"payload":1}"#).unwrap();
        assert_eq!(p.dedup_key(), None);
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        pub fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                "[a-zA-Z0-9 _:/.-]{0,12}".prop_map(Value::from),
            ];
            leaf.prop_recursive(4, 40, 6, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    proptest::collection::vec(
                        (
                            prop_oneof![
                                "[a-z]{1,8}",
                                Just("error".to_string()),
                                Just("execution".to_string()),
                                Just("workflow".to_string()),
                                Just("payload".to_string()),
                                Just("id".to_string()),
                                Just("httpCode".to_string()),
                                Just("partition".to_string())
                            ],
                            inner
                        ),
                        0..6
                    )
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn parsers_never_panic_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = parse_error_trigger(&body);
                let _ = parse_envelope(&body);
            }

            #[test]
            fn parsers_answer_every_json_document(v in json_value()) {
                let body = v.to_string();
                for r in [parse_error_trigger(body.as_bytes()), parse_envelope(body.as_bytes())] {
                    match r {
                        Ok(_) => {}
                        // Valid JSON is never a syntax error: it is accepted or named by field.
                        Err(InputError::Field { path, message }) => {
                            prop_assert!(!path.is_empty() && !message.is_empty());
                        }
                        Err(e @ InputError::Syntax(_)) => prop_assert!(false, "{e} for {body}"),
                    }
                }
            }

            #[test]
            fn an_envelope_payload_reads_back_as_posted(v in json_value().prop_filter("null is no item", |v| !v.is_null())) {
                let body = serde_json::json!({"payload": v}).to_string();
                let p = parse_envelope(body.as_bytes()).unwrap();
                prop_assert_eq!(p.payload.unwrap(), v);
            }
        }
    }
}
