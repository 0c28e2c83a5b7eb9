//! Secrets and credentials out of everything before it is stored or logged.
//!
//! n8n's NodeApiError carries `context.request` (the outgoing headers and body) and the whole
//! node with its `parameters`, which can hold literal credentials; webhook items carry the
//! caller's headers. The redactor replaces, in place:
//! - the value under any configured key (any case, `-`/`_` ignored, also as a suffix:
//!   `X-Auth-Token` matches `token`);
//! - the `value` of `{name, value}` pairs and of `[name, value]` pairs whose name is such a key
//!   (n8n's header/query parameter lists, captured header lists);
//! - inside any string: `Bearer …`/`Basic …` credentials, `key=value` query parameters,
//!   `"key": "value"` in embedded JSON text, and the password of `scheme://user:pass@host`.
//!
//! It also caps the stored outgoing request headers. It never logs what it sees.

use std::borrow::Cow;

use regex::Regex;
use serde_json::{Map, Value};

pub const REDACTED: &str = "[REDACTED]";

#[derive(Debug, Clone)]
pub struct Redactor {
    /// Normalised keys (lowercase, without `-` and `_`).
    keys: Vec<String>,
    bearer: Regex,
    query: Regex,
    json_pair: Regex,
    userinfo: Regex,
}

fn normalise(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

impl Redactor {
    pub fn new(keys: &[String]) -> Redactor {
        let mut norm: Vec<String> = keys
            .iter()
            .map(|k| normalise(k))
            .filter(|k| !k.is_empty())
            .collect();
        norm.sort();
        norm.dedup();
        // Key spellings as they appear in text: the configured forms plus their -/_ variants.
        let mut spellings: Vec<String> = Vec::new();
        for k in keys {
            let k = k.trim().to_ascii_lowercase();
            if k.is_empty() {
                continue;
            }
            for v in [
                k.clone(),
                k.replace('-', "_"),
                k.replace('_', "-"),
                k.replace(['-', '_'], ""),
            ] {
                if !spellings.contains(&v) {
                    spellings.push(v);
                }
            }
        }
        let alt = spellings
            .iter()
            .map(|s| regex::escape(s))
            .collect::<Vec<_>>()
            .join("|");
        // The patterns are built from escaped literals, so they always compile.
        Redactor {
            keys: norm,
            // `Bearer x` always; `Basic`/`token` only when what follows looks like a credential
            // (has a digit or base64 padding), so "basic plan" stays readable.
            bearer: Regex::new(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=\-]{6,}|\b(basic|token)\s+[A-Za-z0-9._~+/\-]*[0-9=][A-Za-z0-9._~+/=\-]*").expect("static regex"),
            query: Regex::new(&format!(r"(?i)([?&;](?:[a-z0-9_\-]*?)(?:{alt})=)[^&#\s'\x22]+")).expect("escaped regex"),
            json_pair: Regex::new(&format!(r#"(?i)(\\?"(?:[a-z0-9_\-]*?)(?:{alt})\\?"\s*:\s*\\?")[^"\\]+"#)).expect("escaped regex"),
            userinfo: Regex::new(r"(?i)([a-z][a-z0-9+.\-]*://[^/\s:@]+:)[^@/\s]+@").expect("static regex"),
        }
    }

    /// Called for every key of every stored document, so it does not allocate for the usual
    /// short ASCII key.
    pub fn is_sensitive_key(&self, key: &str) -> bool {
        let mut buf = [0u8; 64];
        let mut len = 0;
        if key.is_ascii() && key.len() <= buf.len() {
            for b in key.bytes().filter(|b| *b != b'-' && *b != b'_') {
                buf[len] = b.to_ascii_lowercase();
                len += 1;
            }
            let n = &buf[..len];
            self.keys.iter().any(|k| n.ends_with(k.as_bytes()))
        } else {
            let n = normalise(key);
            self.keys.iter().any(|k| n.ends_with(k.as_str()))
        }
    }

    /// Redact credentials inside free text. Borrowed when nothing was found.
    pub fn redact_str<'a>(&self, s: &'a str) -> Cow<'a, str> {
        // Cheap byte checks first: most strings (messages, stack traces) hold none of what the
        // patterns need, and a regex replace costs far more than a scan.
        let has = |b: u8| s.as_bytes().contains(&b);
        let mut out = Cow::Borrowed(s);
        for (wanted, re, rep) in [
            (s.len() > 6 && has(b' '), &self.bearer, "$1$2 [REDACTED]"),
            (has(b'='), &self.query, "${1}[REDACTED]"),
            (has(b'"') && has(b':'), &self.json_pair, "${1}[REDACTED]"),
            (
                has(b'@') && s.contains("://"),
                &self.userinfo,
                "${1}[REDACTED]@",
            ),
        ] {
            if !wanted || !re.is_match(&out) {
                continue;
            }
            if let Cow::Owned(o) = re.replace_all(&out, rep) {
                out = Cow::Owned(o);
            }
        }
        out
    }

    /// Redact a JSON document in place; true when anything changed.
    pub fn redact_value(&self, v: &mut Value) -> bool {
        match v {
            Value::Object(map) => self.redact_map(map),
            Value::Array(items) => {
                let mut changed = false;
                if items.len() == 2 {
                    if let (Value::String(name), true) = (&items[0], is_secret_bearing(&items[1])) {
                        if self.is_sensitive_key(name) {
                            items[1] = Value::String(REDACTED.into());
                            changed = true;
                        }
                    }
                }
                for item in items.iter_mut() {
                    changed |= self.redact_value(item);
                }
                changed
            }
            Value::String(s) => match self.redact_str(s) {
                Cow::Borrowed(_) => false,
                Cow::Owned(o) => {
                    *s = o;
                    true
                }
            },
            _ => false,
        }
    }

    fn redact_map(&self, map: &mut Map<String, Value>) -> bool {
        let mut changed = false;
        // n8n parameter lists: {"name": "Authorization", "value": "Bearer …"}.
        let pair_is_secret =
            matches!(map.get("name"), Some(Value::String(n)) if self.is_sensitive_key(n));
        for (k, val) in map.iter_mut() {
            let secret = self.is_sensitive_key(k) || (pair_is_secret && k == "value");
            if secret && is_secret_bearing(val) {
                if val.as_str() != Some(REDACTED) {
                    *val = Value::String(REDACTED.into());
                    changed = true;
                }
            } else {
                changed |= self.redact_value(val);
            }
        }
        changed
    }
}

/// Null, booleans and empty strings carry no secret; everything else under a secret key goes.
fn is_secret_bearing(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(_) => false,
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

/// Cut `error.context.request.headers` (n8n's NodeApiError) to at most `max` bytes of
/// serialized JSON, keeping whole headers in order and saying how many were dropped.
pub fn cap_request_headers(error: &mut Value, max: usize) {
    let Some(Value::Object(headers)) = error.pointer_mut("/context/request/headers") else {
        return;
    };
    let total: usize = headers
        .iter()
        .map(|(k, v)| k.len() + v.to_string().len() + 6)
        .sum();
    if total <= max {
        return;
    }
    let mut kept = Map::new();
    let mut used = 0;
    let mut dropped = 0usize;
    for (k, v) in std::mem::take(headers) {
        let size = k.len() + v.to_string().len() + 6;
        if used + size <= max.saturating_sub(48) {
            used += size;
            kept.insert(k, v);
        } else {
            dropped += 1;
        }
    }
    kept.insert(
        "x-deadletter-truncated".into(),
        Value::String(format!("{dropped} header(s) dropped: over {max} bytes")),
    );
    *headers = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_REDACT_KEYS;
    use serde_json::json;

    fn redactor() -> Redactor {
        Redactor::new(
            &DEFAULT_REDACT_KEYS
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn keys_match_in_any_case_and_as_suffix() {
        let r = redactor();
        for k in [
            "Authorization",
            "X-API-KEY",
            "api-key",
            "ApiKey",
            "X-Auth-Token",
            "client_secret",
            "Set-Cookie",
        ] {
            assert!(r.is_sensitive_key(k), "{k}");
        }
        for k in [
            "authentication",
            "tokens_used",
            "passwordResetRequired",
            "orderId",
        ] {
            assert!(!r.is_sensitive_key(k), "{k}");
        }
    }

    #[test]
    fn secrets_go_from_every_place_n8n_puts_them() {
        let r = redactor();
        let mut v = json!({
            "context": {"request": {"headers": {"Authorization": "Bearer s3cr3t-A", "accept": "*/*"},
                                     "uri": "https://api.test/x?api_key=s3cr3t-B&page=2",
                                     "body": {"password": "s3cr3t-C", "n": 1}}},
            "node": {"parameters": {
                "headerParameters": {"parameters": [{"name": "X-API-Key", "value": "s3cr3t-D"}]},
                "jsonBody": "{\"client_secret\": \"s3cr3t-E\", \"ok\": true}",
                "curlImport": "curl -H 'Authorization: Bearer s3cr3t-F-long' https://u:s3cr3t-G@h.test/",
                "authentication": "none"
            }},
            "captured": [["Cookie", "s3cr3t-H"], ["Accept", "x"]],
            "token": 123456789,
            "flag": {"secret": true}
        });
        assert!(r.redact_value(&mut v));
        let text = v.to_string();
        for s in [
            "s3cr3t-A",
            "s3cr3t-B",
            "s3cr3t-C",
            "s3cr3t-D",
            "s3cr3t-E",
            "s3cr3t-F",
            "s3cr3t-G",
            "s3cr3t-H",
            "123456789",
        ] {
            assert!(!text.contains(s), "{s} survived in {text}");
        }
        assert_eq!(v["node"]["parameters"]["authentication"], "none");
        assert_eq!(v["context"]["request"]["headers"]["accept"], "*/*");
        assert!(text.contains("page=2"));
        assert_eq!(v["flag"]["secret"], true);
    }

    #[test]
    fn clean_documents_are_left_alone() {
        let r = redactor();
        let mut v = json!({"orderId": "A-1", "amount": 9.5, "note": "basic plan", "url": "http://x/?page=1"});
        let before = v.clone();
        assert!(!r.redact_value(&mut v));
        assert_eq!(v, before);
    }

    #[test]
    fn request_headers_are_capped_whole() {
        let mut e = json!({"context": {"request": {"headers": {}}}});
        let h = e
            .pointer_mut("/context/request/headers")
            .unwrap()
            .as_object_mut()
            .unwrap();
        for i in 0..200 {
            h.insert(format!("x-h-{i}"), json!("v".repeat(40)));
        }
        cap_request_headers(&mut e, 4096);
        let h = &e["context"]["request"]["headers"];
        assert!(h.to_string().len() <= 4096, "{}", h.to_string().len());
        assert!(h["x-deadletter-truncated"]
            .as_str()
            .unwrap()
            .contains("dropped"));
        assert_eq!(h["x-h-0"], json!("v".repeat(40)));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn doc() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<u32>().prop_map(Value::from),
                "[a-zA-Z0-9 =&?:/@.-]{0,16}".prop_map(Value::from),
            ];
            let key = prop_oneof![
                "[a-z]{1,6}",
                Just("Authorization".to_string()),
                Just("x-api-key".to_string()),
                Just("password".to_string()),
                Just("name".to_string()),
                Just("value".to_string()),
            ];
            leaf.prop_recursive(4, 48, 6, move |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    proptest::collection::vec((key.clone(), inner), 0..5)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        fn no_secret_left(r: &Redactor, v: &Value) -> bool {
            match v {
                Value::Object(m) => m.iter().all(|(k, v)| {
                    (!r.is_sensitive_key(k) || !is_secret_bearing(v) || v == REDACTED)
                        && no_secret_left(r, v)
                }),
                Value::Array(a) => a.iter().all(|v| no_secret_left(r, v)),
                _ => true,
            }
        }

        proptest! {
            #[test]
            fn redaction_leaves_no_value_under_a_secret_key_and_is_idempotent(mut v in doc()) {
                let r = redactor();
                r.redact_value(&mut v);
                prop_assert!(no_secret_left(&r, &v), "{v}");
                let once = v.clone();
                prop_assert!(!r.redact_value(&mut v), "a second pass changed {once}");
                prop_assert_eq!(v, once);
            }
        }
    }
}
