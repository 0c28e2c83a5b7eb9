//! The rule table that turns a failure into a `FailureClass`: ordered rules, each matching on any
//! of HTTP status, error code (ECONNREFUSED …), error text (regex), node type (regex) and
//! workflow (regex on id or name); every matcher a rule gives must match, and the first rule
//! that matches wins. Operators' rules from config go first, then the built-in table that
//! follows DESIGN.md's "Failure classes". Applied at ingest; each record keeps the rule name.
//!
//! Also the fingerprint: class + workflow + node + the message with numbers and ids masked, so
//! "order 1001 failed" and "order 1002 failed" land in one group.

use regex::Regex;
use sha2::{Digest, Sha256};

use crate::model::{FailureClass, Fingerprint, ParsedFailure};

/// One rule as configured, before its regexes are compiled.
#[derive(Debug, Clone)]
pub struct RuleSpec {
    pub name: String,
    pub class: FailureClass,
    pub http_status: Vec<u16>,
    pub error_code: Vec<String>,
    pub error_text: Option<String>,
    pub node_type: Option<String>,
    pub workflow: Option<String>,
}

#[derive(Debug, Clone)]
struct Rule {
    name: String,
    class: FailureClass,
    http_status: Vec<u16>,
    error_code: Vec<String>,
    error_text: Option<Regex>,
    node_type: Option<Regex>,
    workflow: Option<Regex>,
}

/// The compiled, ordered rule table.
#[derive(Debug, Clone)]
pub struct Rules {
    rules: Vec<Rule>,
}

/// What classification decided, and which rule decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub class: FailureClass,
    pub rule: String,
}

const TRANSIENT_CODES: &[&str] = &[
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ESOCKETTIMEDOUT",
    "ECONNABORTED",
    "EAI_AGAIN",
    "EPIPE",
    "EHOSTUNREACH",
    "ENETUNREACH",
];

/// The built-in table (kept in step with the comment in config.example.toml).
fn default_specs() -> Vec<RuleSpec> {
    use FailureClass::*;
    let status = |name: &str, class, codes: &[u16]| RuleSpec {
        name: name.into(),
        class,
        http_status: codes.to_vec(),
        error_code: vec![],
        error_text: None,
        node_type: None,
        workflow: None,
    };
    let text = |name: &str, class, re: &str| RuleSpec {
        name: name.into(),
        class,
        http_status: vec![],
        error_code: vec![],
        error_text: Some(re.into()),
        node_type: None,
        workflow: None,
    };
    vec![
        status("rate-limited-status", RateLimited, &[429]),
        status("auth-status", Auth, &[401, 403]),
        status("transient-status", Transient, &[408, 500, 502, 503, 504]),
        status("validation-status", Validation, &[400, 422]),
        status("conflict-status", Conflict, &[409]),
        RuleSpec {
            name: "transient-code".into(),
            class: Transient,
            http_status: vec![],
            error_code: TRANSIENT_CODES.iter().map(|s| s.to_string()).collect(),
            error_text: None,
            node_type: None,
            workflow: None,
        },
        text(
            "rate-limited-text",
            RateLimited,
            r"(?i)rate.?limit|too many requests",
        ),
        text(
            "auth-text",
            Auth,
            r"(?i)unauthori[sz]ed|forbidden|invalid (api )?key|token .*expired|invalid_grant|authentication failed",
        ),
        text(
            "transient-text",
            Transient,
            r"(?i)timed? ?out|socket hang up|service unavailable|bad gateway|temporarily unavailable",
        ),
        text("conflict-text", Conflict, r"(?i)already exists|duplicate"),
        text(
            "validation-text",
            Validation,
            r"(?i)invalid json|unexpected token|validation|is required|schema|parse error|malformed",
        ),
        text(
            "business-text",
            Business,
            r"(?i)cancell?ed|rejected|not allowed|insufficient funds|out of stock",
        ),
    ]
}

impl Rules {
    /// Compile the operator's rules (each with its config path, for error messages), followed
    /// by the built-in table when `include_defaults`. Every bad regex is reported.
    pub fn build(
        user: Vec<(String, RuleSpec)>,
        include_defaults: bool,
    ) -> Result<Rules, Vec<String>> {
        let mut all = user;
        if include_defaults {
            all.extend(
                default_specs()
                    .into_iter()
                    .map(|s| (format!("built-in rule {}", s.name), s)),
            );
        }
        let mut errors = Vec::new();
        let mut rules = Vec::with_capacity(all.len());
        for (path, spec) in all {
            let mut re = |field: &str, src: Option<String>| -> Option<Regex> {
                let src = src?;
                Regex::new(&src)
                    .map_err(|e| errors.push(format!("{path}.{field}: invalid regex `{src}`: {e}")))
                    .ok()
            };
            let error_text = re("error_text", spec.error_text);
            let node_type = re("node_type", spec.node_type);
            let workflow = re("workflow", spec.workflow);
            rules.push(Rule {
                name: spec.name,
                class: spec.class,
                http_status: spec.http_status,
                error_code: spec
                    .error_code
                    .iter()
                    .map(|c| c.to_ascii_uppercase())
                    .collect(),
                error_text,
                node_type,
                workflow,
            });
        }
        if errors.is_empty() {
            Ok(Rules { rules })
        } else {
            Err(errors)
        }
    }

    /// The built-in table alone.
    pub fn defaults() -> Rules {
        // The built-in regexes are literals checked by `the_built_in_table_compiles`.
        Rules::build(Vec::new(), true).expect("built-in rules compile")
    }

    pub fn classify(&self, f: &ParsedFailure) -> Verdict {
        let text = f.error_text();
        let code = f.facts.error_code.as_deref().map(str::to_ascii_uppercase);
        for r in &self.rules {
            if !r.http_status.is_empty()
                && !f
                    .facts
                    .http_status
                    .is_some_and(|s| r.http_status.contains(&s))
            {
                continue;
            }
            if !r.error_code.is_empty() && !code.as_ref().is_some_and(|c| r.error_code.contains(c))
            {
                continue;
            }
            if let Some(re) = &r.error_text {
                if !re.is_match(&text) {
                    continue;
                }
            }
            if let Some(re) = &r.node_type {
                if !f.facts.node_type.as_deref().is_some_and(|t| re.is_match(t)) {
                    continue;
                }
            }
            if let Some(re) = &r.workflow {
                let id = f
                    .facts
                    .workflow_id
                    .as_deref()
                    .is_some_and(|t| re.is_match(t));
                let name = f
                    .facts
                    .workflow_name
                    .as_deref()
                    .is_some_and(|t| re.is_match(t));
                if !(id || name) {
                    continue;
                }
            }
            return Verdict {
                class: r.class,
                rule: r.name.clone(),
            };
        }
        Verdict {
            class: FailureClass::Unknown,
            rule: "default".into(),
        }
    }
}

/// Replace what varies between occurrences of one failure (numbers, uuids, long hex ids) so
/// that like failures share a fingerprint.
pub fn mask_message(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        if token.is_empty() {
            return;
        }
        let hexish = token.len() >= 8
            && token.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
            && token.chars().any(|c| c.is_ascii_digit());
        if hexish {
            out.push('#');
        } else {
            let mut prev_digit = false;
            for c in token.chars() {
                if c.is_ascii_digit() {
                    if !prev_digit {
                        out.push('#');
                    }
                    prev_digit = true;
                } else {
                    out.push(c);
                    prev_digit = false;
                }
            }
        }
        token.clear();
    };
    for c in msg.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

pub fn fingerprint(class: FailureClass, f: &ParsedFailure) -> Fingerprint {
    let mut h = Sha256::new();
    for part in [
        class.as_str(),
        f.facts.workflow_id.as_deref().unwrap_or(""),
        f.facts.node_name.as_deref().unwrap_or(""),
        &mask_message(f.facts.error_message.as_deref().unwrap_or("")),
    ] {
        h.update(part.as_bytes());
        h.update([0x1f]);
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    Fingerprint::from_u64(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParsedFailure;

    fn failure(status: Option<u16>, code: Option<&str>, msg: &str) -> ParsedFailure {
        ParsedFailure {
            facts: crate::model::FailureFacts {
                http_status: status,
                error_code: code.map(str::to_owned),
                error_message: Some(msg.to_owned()),
                ..Default::default()
            },
            ..ParsedFailure::default()
        }
    }

    #[test]
    fn the_built_in_table_compiles() {
        Rules::defaults();
    }

    #[test]
    fn the_default_table_follows_the_design() {
        let r = Rules::defaults();
        let c = |s, code, m| r.classify(&failure(s, code, m)).class;
        use FailureClass::*;
        for s in [500, 502, 503, 504] {
            assert_eq!(c(Some(s), None, "x"), Transient);
        }
        assert_eq!(c(None, Some("ECONNREFUSED"), "refused"), Transient);
        assert_eq!(c(None, Some("econnreset"), "x"), Transient);
        assert_eq!(c(None, None, "Request timed out after 300000ms"), Transient);
        assert_eq!(c(Some(429), None, "x"), RateLimited);
        assert_eq!(c(Some(401), None, "x"), Auth);
        assert_eq!(c(Some(403), None, "x"), Auth);
        assert_eq!(c(None, None, "The access token has expired"), Auth);
        assert_eq!(c(Some(400), None, "x"), Validation);
        assert_eq!(c(Some(422), None, "x"), Validation);
        assert_eq!(c(None, None, "Unexpected token } in JSON"), Validation);
        assert_eq!(c(Some(409), None, "x"), Conflict);
        assert_eq!(c(None, None, "customer already exists"), Conflict);
        assert_eq!(c(None, None, "order cancelled by customer"), Business);
        assert_eq!(c(None, None, "something odd"), Unknown);
        assert_eq!(r.classify(&failure(None, None, "odd")).rule, "default");
        assert_eq!(
            r.classify(&failure(Some(503), None, "x")).rule,
            "transient-status"
        );
    }

    #[test]
    fn operator_rules_go_first_and_need_every_matcher() {
        let spec = RuleSpec {
            name: "billing-cancel".into(),
            class: FailureClass::Business,
            http_status: vec![500],
            error_code: vec![],
            error_text: Some("(?i)cancel".into()),
            node_type: None,
            workflow: Some("^Billing".into()),
        };
        let r = Rules::build(vec![("classify.rules[0]".into(), spec)], true).unwrap();
        let mut f = failure(Some(500), None, "Order cancelled");
        f.facts.workflow_name = Some("Billing sync".into());
        assert_eq!(r.classify(&f).rule, "billing-cancel");
        f.facts.workflow_name = Some("Shop".into());
        assert_eq!(r.classify(&f).class, FailureClass::Transient);
    }

    #[test]
    fn without_defaults_only_operator_rules_apply() {
        let r = Rules::build(vec![], false).unwrap();
        assert_eq!(
            r.classify(&failure(Some(500), None, "x")).class,
            FailureClass::Unknown
        );
    }

    #[test]
    fn masking_groups_messages_that_differ_only_in_ids() {
        assert_eq!(
            mask_message("order processing failed for orderId=A-1001 [line 2]"),
            mask_message("order processing failed for orderId=A-2002 [line 3]")
        );
        assert_eq!(
            mask_message("id 6a1f0c52-0003-4c1e-9b7a-000000000002 gone"),
            "id # gone"
        );
        assert_ne!(mask_message("order failed"), mask_message("payment failed"));
    }

    #[test]
    fn fingerprints_differ_by_class_workflow_and_node() {
        let mut a = failure(Some(500), None, "order 1 failed");
        a.facts.workflow_id = Some("w1".into());
        let mut b = failure(Some(500), None, "order 2 failed");
        b.facts.workflow_id = Some("w1".into());
        let fa = fingerprint(FailureClass::Transient, &a);
        assert_eq!(fa, fingerprint(FailureClass::Transient, &b));
        assert_ne!(fa, fingerprint(FailureClass::Unknown, &b));
        b.facts.node_name = Some("Other".into());
        assert_ne!(fa, fingerprint(FailureClass::Transient, &b));
    }
}
