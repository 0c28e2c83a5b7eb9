//! Pure pieces of delivery: the retry backoff schedule and how a payload is shaped into the
//! body of a replay. No I/O, no clock: time and randomness are passed in.

use std::time::Duration;

use serde_json::Value;

/// Exponential backoff with full jitter: attempt n (1-based) waits a uniformly random time in
/// `[0, min(cap, base · factorⁿ⁻¹)]`, so many records failing together do not come back
/// together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub base: Duration,
    pub factor: f64,
    pub cap: Duration,
}

impl Backoff {
    /// The ceiling of attempt `n`'s wait (what the jitter draws below).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exp = self.factor.powi(attempt.saturating_sub(1).min(64) as i32);
        let secs = (self.base.as_secs_f64() * exp).min(self.cap.as_secs_f64());
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// The wait before attempt `attempt`, given a uniform random number in `[0, 1)`.
    pub fn delay(&self, attempt: u32, unit_random: f64) -> Duration {
        self.ceiling(attempt).mul_f64(unit_random.clamp(0.0, 1.0))
    }
}

/// How a record's payload becomes the body of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// `webhook_body` for an n8n webhook item, `as_is` for anything else.
    Auto,
    /// The payload exactly as stored.
    AsIs,
    /// n8n's webhook item unwrapped to its `body` (what the original caller sent).
    WebhookBody,
    /// `{...payload, "replay": true, "replay_dlq_id": id}`.
    Wrapped,
    /// n8n's own retry of the failed execution (`POST /api/v1/executions/{id}/retry`): the
    /// body is `{"loadWorkflow": …}`, the payload is not sent (n8n has the data). Chosen by the
    /// n8n connector, not in the config.
    N8nRetry { load_workflow: bool },
}

impl BodyMode {
    pub fn parse(s: &str) -> Result<BodyMode, String> {
        match s {
            "auto" => Ok(BodyMode::Auto),
            "as_is" => Ok(BodyMode::AsIs),
            "webhook_body" => Ok(BodyMode::WebhookBody),
            "wrapped" => Ok(BodyMode::Wrapped),
            other => Err(format!(
                "`{other}` is not a body mode; expected auto, as_is, webhook_body or wrapped"
            )),
        }
    }
}

/// Does this payload look like the item n8n's Webhook node emits?
pub fn is_webhook_item(v: &Value) -> bool {
    v.get("body").is_some()
        && v.get("headers").is_some_and(Value::is_object)
        && v.get("webhookUrl").is_some()
}

/// The bytes to send for a stored payload (`raw`, exact JSON text).
pub fn shape_body(mode: BodyMode, raw: &str, record_id: i64) -> Result<Vec<u8>, String> {
    let parsed =
        || serde_json::from_str::<Value>(raw).map_err(|e| format!("the payload is not JSON: {e}"));
    match mode {
        BodyMode::N8nRetry { load_workflow } => {
            Ok(serde_json::json!({ "loadWorkflow": load_workflow })
                .to_string()
                .into_bytes())
        }
        BodyMode::AsIs => Ok(raw.as_bytes().to_vec()),
        BodyMode::Auto => {
            let v = parsed()?;
            if is_webhook_item(&v) {
                Ok(v["body"].to_string().into_bytes())
            } else {
                Ok(raw.as_bytes().to_vec())
            }
        }
        BodyMode::WebhookBody => {
            let v = parsed()?;
            match v.get("body") {
                Some(b) => Ok(b.to_string().into_bytes()),
                None => Err("the payload has no `body` to unwrap (body mode webhook_body)".into()),
            }
        }
        BodyMode::Wrapped => match parsed()? {
            Value::Object(mut m) => {
                m.insert("replay".into(), Value::Bool(true));
                m.insert("replay_dlq_id".into(), Value::from(record_id));
                Ok(Value::Object(m).to_string().into_bytes())
            }
            _ => Err("only an object payload can be wrapped (body mode wrapped)".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b() -> Backoff {
        Backoff {
            base: Duration::from_secs(30),
            factor: 2.0,
            cap: Duration::from_secs(3600),
        }
    }

    #[test]
    fn the_schedule_doubles_up_to_the_cap() {
        let ceilings: Vec<u64> = (1..=9).map(|n| b().ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(b().delay(3, 0.5), Duration::from_secs(60));
        assert_eq!(b().delay(1, 0.0), Duration::ZERO);
    }

    proptest! {
        #[test]
        fn jitter_stays_under_the_ceiling(n in 1u32..100, r in 0.0f64..1.0) {
            prop_assert!(b().delay(n, r) <= b().ceiling(n));
            prop_assert!(b().ceiling(n) <= Duration::from_secs(3600));
        }
    }

    #[test]
    fn bodies_are_shaped_by_mode() {
        let item = r#"{"headers":{"a":"b"},"params":{},"query":{},"body":{"orderId":"C-1"},"webhookUrl":"http://x/webhook/o"}"#;
        assert_eq!(
            shape_body(BodyMode::Auto, item, 7).unwrap(),
            br#"{"orderId":"C-1"}"#
        );
        assert_eq!(
            shape_body(BodyMode::AsIs, item, 7).unwrap(),
            item.as_bytes()
        );
        assert_eq!(
            shape_body(BodyMode::Auto, r#"{"x":1}"#, 7).unwrap(),
            br#"{"x":1}"#
        );
        let w: Value =
            serde_json::from_slice(&shape_body(BodyMode::Wrapped, r#"{"x":1}"#, 7).unwrap())
                .unwrap();
        assert_eq!(
            w,
            serde_json::json!({"x": 1, "replay": true, "replay_dlq_id": 7})
        );
        assert!(shape_body(BodyMode::Wrapped, "[1]", 7).is_err());
        assert!(shape_body(BodyMode::WebhookBody, r#"{"x":1}"#, 7).is_err());
    }
}
