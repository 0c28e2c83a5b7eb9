//! The ingest pipeline, pure CPU work between the HTTP edge and the writer: parse the n8n or
//! generic shape → redact → classify and fingerprint → encode the documents. What comes out
//! (`NewRecord`) holds no secret and needs nothing more from the writer than copying bytes.
//!
//! It never does I/O and never logs a payload or an error text.

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::classify::{fingerprint, Rules};
use crate::config::{Config, TriageConfig};
use crate::model::{
    parse_envelope, parse_error_trigger, InputError, ParsedFailure, Partition, ShortText, Source,
};
use crate::redact::{cap_request_headers, Redactor};
use crate::store::{codec, Encoded, NewRecord};

/// What the request itself says, beside its body (query parameters and headers).
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    pub partition: Option<Partition>,
    pub idempotency_key: Option<ShortText>,
    pub actor: String,
}

pub struct Ingestor {
    rules: Rules,
    redactor: Redactor,
    default_partition: Partition,
    dedup_identical_bodies: bool,
    max_request_header_bytes: usize,
    compress_above: usize,
    zstd_level: i32,
    triage: TriageConfig,
}

impl Ingestor {
    pub fn new(config: &Config) -> Ingestor {
        Ingestor {
            rules: config.rules.clone(),
            redactor: Redactor::new(&config.redact.keys),
            default_partition: config.ingest.default_partition.clone(),
            dedup_identical_bodies: config.ingest.dedup_identical_bodies,
            max_request_header_bytes: config.ingest.max_request_header_bytes,
            compress_above: config.storage.compress_above_bytes,
            zstd_level: config.storage.zstd_level,
            triage: config.triage.clone(),
        }
    }

    /// Turn one posted body into a record ready for the writer.
    pub fn prepare(
        &self,
        source: Source,
        body: &[u8],
        ctx: &RequestContext,
        now_ms: i64,
    ) -> Result<NewRecord, InputError> {
        let mut f = match source {
            Source::ErrorTrigger => parse_error_trigger(body)?,
            Source::Envelope => parse_envelope(body)?,
        };
        // The body's own fields win over the request's.
        if f.partition.is_none() {
            f.partition = ctx.partition.clone();
        }
        if f.facts.idempotency_key.is_none() {
            f.facts.idempotency_key = ctx.idempotency_key.clone().map(ShortText::into_string);
        }
        Ok(self.finish(f, body, ctx, now_ms))
    }

    /// An operator's new payload, made ready to store like an ingested one: redacted (the raw
    /// bytes kept when nothing had to change) and encoded. Returns the stored form and the
    /// redacted value (for the diff).
    pub fn prepare_payload(
        &self,
        raw: &RawValue,
    ) -> Result<(Encoded, serde_json::Value), InputError> {
        let mut value: serde_json::Value =
            serde_json::from_str(raw.get()).map_err(|e| InputError::Field {
                path: "payload".into(),
                message: format!("cannot be read: {e}"),
            })?;
        let bytes = if self.redactor.redact_value(&mut value) {
            value.to_string().into_bytes()
        } else {
            raw.get().as_bytes().to_vec()
        };
        Ok((
            codec::encode(&bytes, self.compress_above, self.zstd_level),
            value,
        ))
    }

    /// Split a batch body into its elements (each is then `prepare`d on its own).
    pub fn split_batch(body: &[u8]) -> Result<Vec<&RawValue>, InputError> {
        match serde_json::from_slice::<Vec<&RawValue>>(body) {
            Ok(items) => Ok(items),
            Err(e) if e.is_data() => Err(InputError::Field {
                path: "$".into(),
                message: "expected a JSON array of envelopes".into(),
            }),
            Err(e) => Err(InputError::Syntax(e.to_string())),
        }
    }

    fn finish(
        &self,
        mut f: ParsedFailure,
        body: &[u8],
        ctx: &RequestContext,
        now_ms: i64,
    ) -> NewRecord {
        // Redact first: everything derived below, and everything stored, is already clean.
        if let Some(err) = &mut f.error {
            self.redactor.redact_value(err);
            cap_request_headers(err, self.max_request_header_bytes);
        }
        let payload_changed = match &mut f.payload {
            Some(p) => self.redactor.redact_value(p),
            None => false,
        };
        for s in [
            &mut f.facts.error_message,
            &mut f.error_description,
            &mut f.facts.execution_url,
            &mut f.facts.replay_url,
        ]
        .into_iter()
        .flatten()
        {
            if let std::borrow::Cow::Owned(o) = self.redactor.redact_str(s) {
                *s = o;
            }
        }

        let verdict = self.rules.classify(&f);
        let fp = fingerprint(verdict.class, &f);
        let partition = f
            .partition
            .clone()
            .unwrap_or_else(|| self.default_partition.clone());

        let dedup_key = match f.dedup_key() {
            Some(identity) => Some(digest16(&[b"id\x1f", identity.as_bytes()])),
            None if self.dedup_identical_bodies => Some(digest16(&[b"body\x1f", body])),
            None => None,
        };

        let payload = match (&f.payload, &f.payload_raw) {
            // Untouched by redaction: store the bytes exactly as posted.
            (Some(_), Some(raw)) if !payload_changed => Some(codec::encode(
                raw.get().as_bytes(),
                self.compress_above,
                self.zstd_level,
            )),
            (Some(p), _) => Some(codec::encode(
                p.to_string().as_bytes(),
                self.compress_above,
                self.zstd_level,
            )),
            (None, _) => None,
        };
        let error = f.error.as_ref().map(|e| {
            codec::encode(
                e.to_string().as_bytes(),
                self.compress_above,
                self.zstd_level,
            )
        });

        // A replay that failed again: deadletter's own id comes back in the wrapped payload
        // (`replay_dlq_id`) or in the request headers n8n's webhook item keeps.
        let replay_of = f.payload.as_ref().and_then(|p| {
            let id = p
                .get("replay_dlq_id")
                .or_else(|| p.pointer("/headers/x-deadletter-id"))?;
            id.as_i64().or_else(|| id.as_str()?.parse().ok())
        });
        let policy = self.triage.policy(verdict.class);
        let sla_ms = i64::try_from(policy.sla.as_millis()).unwrap_or(i64::MAX);
        NewRecord {
            partition: partition.as_str().to_owned(),
            source: f.source(),
            status: policy.initial,
            owner: policy.owner.clone(),
            due_at_ms: Some(now_ms.saturating_add(sla_ms)),
            replay_of,
            next_attempt_at_ms: Some(
                now_ms.saturating_add(
                    policy.backoff.delay(1, rand::random::<f64>()).as_millis() as i64
                ),
            ),
            credential_incident: policy.credential_incident,
            failure_class: verdict.class,
            class_rule: verdict.rule,
            fingerprint: fp,
            dedup_key,
            at_ms: now_ms,
            actor: ctx.actor.clone(),
            facts: f.facts,
            payload,
            error,
        }
    }
}

fn digest16(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingestor() -> Ingestor {
        Ingestor::new(&Config::default_config().unwrap())
    }

    fn ctx() -> RequestContext {
        RequestContext {
            actor: "test".into(),
            ..RequestContext::default()
        }
    }

    #[test]
    fn an_http_500_error_trigger_is_transient_with_its_rule() {
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/n8n/error-trigger-body.dlqHttp500Wf0001.raw.json"
        ))
        .unwrap();
        let r = ingestor()
            .prepare(Source::ErrorTrigger, &body, &ctx(), 1)
            .unwrap();
        assert_eq!(r.failure_class, crate::model::FailureClass::Transient);
        assert_eq!(r.class_rule, "transient-status");
        assert_eq!(r.partition, "default");
        assert!(r.payload.is_none());
        assert!(r.error.is_some());
    }

    #[test]
    fn request_context_fills_what_the_body_leaves_out() {
        let mut c = ctx();
        c.partition = Some(Partition::parse("billing").unwrap());
        c.idempotency_key = Some(ShortText::parse("k", "hdr-key", 100).unwrap());
        let i = ingestor();
        let r = i
            .prepare(Source::Envelope, br#"{"payload":{"a":1}}"#, &c, 1)
            .unwrap();
        assert_eq!(r.partition, "billing");
        assert_eq!(r.facts.idempotency_key.as_deref(), Some("hdr-key"));
        let r = i
            .prepare(
                Source::Envelope,
                br#"{"payload":{"a":1},"partition":"own","idempotency_key":"body-key"}"#,
                &c,
                1,
            )
            .unwrap();
        assert_eq!(r.partition, "own");
        assert_eq!(r.facts.idempotency_key.as_deref(), Some("body-key"));
    }

    #[test]
    fn identical_bodies_without_identity_share_a_dedup_key() {
        let i = ingestor();
        let key = |body: &str| {
            i.prepare(Source::Envelope, body.as_bytes(), &ctx(), 1)
                .unwrap()
                .dedup_key
        };
        let a = key(r#"{"payload":{"orderId":"R-1"}}"#);
        assert_eq!(a, key(r#"{"payload":{"orderId":"R-1"}}"#));
        assert_ne!(a, key(r#"{"payload":{"orderId":"R-2"}}"#));
    }

    #[test]
    fn unredacted_payloads_keep_their_exact_bytes() {
        let body = br#"{"payload":{ "b" : 2,  "a":[1, 2.50]} }"#;
        let r = ingestor()
            .prepare(Source::Envelope, body, &ctx(), 1)
            .unwrap();
        let p = r.payload.unwrap();
        assert_eq!(p.bytes, br#"{ "b" : 2,  "a":[1, 2.50]}"#);
    }

    #[test]
    fn batches_split_into_raw_elements() {
        let items = Ingestor::split_batch(br#"[{"payload":1}, 5, {"x":{}}]"#).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[1].get(), "5");
        assert!(matches!(
            Ingestor::split_batch(br#"{"a":1}"#),
            Err(InputError::Field { .. })
        ));
        assert!(matches!(
            Ingestor::split_batch(b"[1,"),
            Err(InputError::Syntax(_))
        ));
    }
}
