//! The n8n templates in packaging/n8n/: well-formed workflows that reference each other, and
//! the "Describe failure" Code node, run by Node.js on the item n8n's error output really
//! emits, produces an envelope a real deadletter stores with the partition, key and replay
//! URL the template promises. (The on-demand tests/e2e/n8n.sh imports them into a real n8n.)

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::harness::{fixture, Server};

fn load(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging/n8n")
        .join(name);
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn node<'a>(wf: &'a Value, name: &str) -> &'a Value {
    wf["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("no node {name} in {}", wf["name"]))
}

#[test]
fn the_workflows_are_well_formed_and_wired_to_each_other() {
    let error = load("error-workflow.json");
    let send = load("send-to-deadletter.json");
    let main = load("example-orders-workflow.json");
    for wf in [&error, &send, &main] {
        assert_eq!(
            wf["id"].as_str().unwrap().len(),
            16,
            "n8n ids are 16 characters"
        );
        let names: BTreeSet<&str> = wf["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                assert!(
                    n["type"].as_str().unwrap().starts_with("n8n-nodes-base."),
                    "{n}"
                );
                assert!(
                    n["typeVersion"].is_number() && n["parameters"].is_object(),
                    "{n}"
                );
                assert_eq!(n["position"].as_array().unwrap().len(), 2);
                n["name"].as_str().unwrap()
            })
            .collect();
        assert_eq!(
            names.len(),
            wf["nodes"].as_array().unwrap().len(),
            "node names are unique"
        );
        for (from, outputs) in wf["connections"].as_object().unwrap() {
            assert!(names.contains(from.as_str()), "{from}");
            for output in outputs["main"].as_array().unwrap() {
                for c in output.as_array().unwrap() {
                    assert!(names.contains(c["node"].as_str().unwrap()), "{c}");
                }
            }
        }
    }
    // The error workflow posts n8n's Error Trigger item as is, retrying, with the ingest token.
    assert_eq!(
        node(&error, "Error Trigger")["type"],
        "n8n-nodes-base.errorTrigger"
    );
    let post = node(&error, "Send to deadletter");
    assert_eq!(
        post["parameters"]["url"],
        "http://127.0.0.1:7680/v1/n8n/error-trigger"
    );
    assert_eq!(
        post["parameters"]["jsonBody"],
        "={{ JSON.stringify($json) }}"
    );
    assert_eq!(post["retryOnFail"], true);
    assert!(post["parameters"]["options"]["timeout"].as_i64().unwrap() <= 10_000);
    assert_eq!(
        post["credentials"]["httpHeaderAuth"]["name"],
        "deadletter ingest token"
    );
    let cred = load("credential-deadletter-ingest.json");
    assert_eq!(cred[0]["id"], post["credentials"]["httpHeaderAuth"]["id"]);
    assert_eq!(cred[0]["data"]["name"], "Authorization");
    // The sub-workflow takes any caller's items and posts each to the envelope endpoint.
    assert_eq!(
        node(&send, "When called by another workflow")["parameters"]["inputSource"],
        "passthrough"
    );
    assert_eq!(
        node(&send, "Post to deadletter")["parameters"]["url"],
        "http://127.0.0.1:7680/v1/dead-letters"
    );
    // The example: its HTTP Request's error output goes to the sub-workflow; its error
    // workflow is the template's.
    assert_eq!(main["settings"]["errorWorkflow"], error["id"]);
    assert_eq!(
        node(&main, "Call orders API")["onError"],
        "continueErrorOutput"
    );
    assert_eq!(
        main["connections"]["Call orders API"]["main"][1][0]["node"],
        "Describe failure"
    );
    assert_eq!(
        node(&main, "Send to deadletter")["parameters"]["workflowId"]["value"],
        send["id"]
    );
}

#[test]
fn describe_failure_turns_n8ns_error_output_item_into_an_envelope_deadletter_stores() {
    let main = load("example-orders-workflow.json");
    let code = node(&main, "Describe failure")["parameters"]["jsCode"]
        .as_str()
        .unwrap();
    // What the error output of an HTTP Request node emits (captured from n8n 2.8.4).
    let captured: Value = serde_json::from_slice(&fixture("error-output-item.raw.json")).unwrap();
    let item = &captured["item"];
    // n8n's Code node, as far as this code uses it: $input, $workflow, $execution.
    let script = format!(
        "const $input = {{ all: () => [{{ json: {item} }}] }};\n\
         const $workflow = {{ id: 'dlqExampleMain01', name: 'deadletter: example orders workflow' }};\n\
         const $execution = {{ id: '4242', mode: 'webhook' }};\n\
         const out = (() => {{ {code} }})();\n\
         process.stdout.write(JSON.stringify(out));"
    );
    let o = Command::new("node")
        .arg("-e")
        .arg(&script)
        .output()
        .expect("node (Debian's nodejs; .ci/run installs it)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    let envelope = &out[0]["json"];
    assert_eq!(envelope["partition"], "orders");
    assert_eq!(envelope["replay_url"], item["webhookUrl"]);

    let s = Server::start();
    let r = s.post("/v1/dead-letters", envelope.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    let rec = s.get(&format!("/v1/dead-letters/{}", r.json["id"])).json;
    assert_eq!(rec["partition"], "orders");
    assert_eq!(
        rec["idempotency_key"],
        json!(format!(
            "order-{}",
            item["body"]["orderId"].as_str().unwrap()
        ))
    );
    assert_eq!(rec["replay_url"], item["webhookUrl"]);
    assert_eq!(rec["workflow_id"], "dlqExampleMain01");
    assert_eq!(rec["node_name"], "Call orders API");
    // The payload is the webhook item (what a replay unwraps to its body).
    let payload: Value = serde_json::from_str(
        &s.get(&format!("/v1/dead-letters/{}/payload", r.json["id"]))
            .text,
    )
    .unwrap();
    assert_eq!(payload["body"], item["body"]);
}

#[test]
fn the_on_demand_e2e_script_stays_valid_shell_and_uses_these_templates() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/n8n.sh");
    let o = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&script).unwrap();
    for id in ["dlqErrorWf000001", "dlqSendToDlq0001", "dlqExampleMain01"] {
        assert!(text.contains(id), "the e2e script does not publish {id}");
    }
    assert!(text.contains("packaging/n8n/*.json"));
}

mod connector {
    //! n8n connector: enrichment of Error Trigger records from n8n's API (a fake one serving
    //! a real execution's shape).

    use std::time::Duration;

    use serde_json::{json, Value};

    use crate::fake_n8n::{FakeN8n, KEY, PLANTED};
    use crate::harness::{eventually, fixture, Server};

    fn server(n8n: &FakeN8n, key: &str) -> (Server, tempfile::NamedTempFile) {
        server_with(n8n, key, "", "")
    }

    /// A server talking to `n8n` with `key` (kept in the returned file); `before` goes ahead of
    /// the `[n8n]` table, `n8n_extra` into it.
    fn server_with(
        n8n: &FakeN8n,
        key: &str,
        before: &str,
        n8n_extra: &str,
    ) -> (Server, tempfile::NamedTempFile) {
        let key_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(key_file.path(), format!("{key}\n")).unwrap();
        // A fast enricher unless the test sets its own tick.
        let tick = if n8n_extra.contains("tick =") {
            ""
        } else {
            "tick = \"100ms\"\n"
        };
        let s = Server::start_with(&format!(
            "{before}[n8n]\nbase_url = \"{}\"\napi_key = {{ file = \"{}\" }}\n{tick}timeout = \"1s\"\n{n8n_extra}",
            n8n.url,
            key_file.path().display()
        ));
        (s, key_file)
    }

    fn error_trigger(s: &Server, execution: &str) -> i64 {
        let mut body: Value =
            serde_json::from_slice(&fixture("error-trigger-body.raw.json")).unwrap();
        body["execution"]["id"] = json!(execution);
        let r = s.post("/v1/n8n/error-trigger", body.to_string());
        assert_eq!(r.status, 201, "{}", r.text);
        r.json["id"].as_i64().unwrap()
    }

    fn wait_state(s: &Server, id: i64, want: &str) -> Value {
        eventually(
            &format!("record {id} {want}"),
            Duration::from_secs(10),
            || {
                let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
                (rec["enrichment"]["state"] == want).then_some(rec)
            },
        )
    }

    #[test]
    fn an_error_trigger_record_gets_its_trigger_item_and_failing_inputs_from_n8n() {
        let n8n = FakeN8n::start();
        let (s, _key) = server(&n8n, KEY);
        let id = error_trigger(&s, "81");
        let rec = wait_state(&s, id, "enriched");
        let e = &rec["enrichment"];
        assert_eq!(e["detail"]["trigger_node"], "Webhook");
        assert_eq!(e["detail"]["failing_node"], "Process order");
        assert_eq!(
            e["detail"]["workflow_version_id"],
            "e8be7eec-a06a-4327-b929-c485c320134e"
        );
        assert_eq!(e["detail"]["started_at"], "2026-11-29T23:04:02.720Z");
        assert_eq!(e["detail"]["payload"], "from n8n: the trigger item");
        assert_eq!(e["failing_node_inputs"][0]["body"]["orderId"], "A-1001");
        // The trigger item is now the payload a replay sends — redacted like any payload.
        assert_eq!(rec["payload"]["body"]["orderId"], "A-1001");
        assert_eq!(
            rec["payload"]["webhookUrl"],
            "http://127.0.0.1:5678/webhook/orders"
        );
        let text = rec.to_string();
        assert!(!text.contains(PLANTED), "the planted secret was stored");
        assert!(rec["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "enriched"));
        assert!(n8n
            .asked()
            .iter()
            .any(|p| p == "/api/v1/executions/81?includeData=true"));
        assert!(s.get("/readyz").json["n8n_api"] == "ok");
        // The web page (open mode: no tokens) shows the provenance, the webhook's headers with
        // the planted authorization redacted, and the failing node's inputs.
        let page = s.get(&format!("/ui/records/{id}")).text;
        assert!(
            page.contains("From n8n") && page.contains("enriched"),
            "{page}"
        );
        assert!(page.contains("Headers the webhook received"), "{page}");
        assert!(
            page.contains("<td><code>authorization</code></td><td><code>[REDACTED]</code>"),
            "{page}"
        );
        assert!(!page.contains(PLANTED));
        assert!(page.contains("input items, as n8n had them"));

        // Pruned in n8n: unavailable, with the reason.
        let gone = error_trigger(&s, "404");
        let rec = wait_state(&s, gone, "unavailable");
        assert!(rec["enrichment"]["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("404"));
        assert!(rec["payload"].is_null());

        // An operator can ask again; a record not from the Error Trigger has nothing to fetch.
        let r = s
            .client
            .post(s.url(&format!("/v1/dead-letters/{gone}/enrich")))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        // …and from the web page, audited.
        let page = s.get(&format!("/ui/records/{gone}")).text;
        let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
        let r = s
            .client
            .post(s.url(&format!("/ui/records/{gone}/act")))
            .form(&[("action", "enrich"), ("csrf", &page[at..at + 64])])
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.status());
        let rec = s.get(&format!("/v1/dead-letters/{gone}")).json;
        assert!(
            rec["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["actor"] == "local (ui)"),
            "{rec}"
        );
        let env = s
            .post("/v1/dead-letters", json!({"payload": {"a": 1}}).to_string())
            .json["id"]
            .as_i64()
            .unwrap();
        let r = s
            .client
            .post(s.url(&format!("/v1/dead-letters/{env}/enrich")))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 422);

        // n8n too slow (3 s against a 1 s timeout): tried again later, the record waits.
        let slow = error_trigger(&s, "slow");
        let rec = wait_state(&s, slow, "pending");
        assert!(rec["enrichment"]["detail"]["last_error"]
            .as_str()
            .unwrap()
            .contains("unreachable"));
    }

    #[test]
    fn a_wrong_key_or_a_dead_n8n_never_gets_in_the_way() {
        let n8n = FakeN8n::start();
        let (s, _key) = server(&n8n, "not-the-key");
        let id = error_trigger(&s, "82");
        let rec = wait_state(&s, id, "pending");
        assert!(rec["enrichment"]["detail"]["last_error"]
            .as_str()
            .unwrap()
            .contains("refused the API key (401)"));
        let ready = s.get("/readyz");
        assert_eq!(
            ready.status, 200,
            "n8n's state never makes deadletter unready"
        );
        assert!(ready.json["n8n_api"].as_str().unwrap().contains("refused"));
        assert!(s.get("/v1/stats").json["n8n_api"]
            .as_str()
            .unwrap()
            .contains("refused"));
        let metrics = s.get("/metrics").text;
        assert!(
            metrics.contains("dlq_n8n_api_errors_total{kind=\"refused\"}"),
            "{metrics}"
        );
        // Ingest goes on as ever.
        for n in 0..20 {
            assert_eq!(
                s.post("/v1/dead-letters", json!({"payload": {"n": n}}).to_string())
                    .status,
                201
            );
        }
        // n8n not there at all: the same.
        let (s2, _k) = {
            let key_file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(key_file.path(), KEY).unwrap();
            let s = Server::start_with(&format!(
                "[n8n]\nbase_url = \"http://127.0.0.1:9\"\napi_key = {{ file = \"{}\" }}\ntick = \"100ms\"\ntimeout = \"500ms\"\n",
                key_file.path().display()
            ));
            (s, key_file)
        };
        let id = error_trigger(&s2, "83");
        let rec = wait_state(&s2, id, "pending");
        assert!(rec["enrichment"]["detail"]["last_error"]
            .as_str()
            .unwrap()
            .contains("unreachable"));
        assert_eq!(s2.get("/readyz").status, 200);
    }

    #[test]
    fn reconciliation_creates_records_for_failures_n8n_never_reported_once() {
        let n8n = FakeN8n::with_failed(vec![
            (105, "wfNoErrorFlow01"),
            (104, "wfNoErrorFlow01"),
            (103, "dlqMainWf0000001"),
            (102, "wfNoErrorFlow02"),
            (101, "dlqMainWf0000001"),
        ]);
        let key_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(key_file.path(), KEY).unwrap();
        // No reconciliation until the Error Workflow's record for 103 is in.
        let config = format!(
            "[n8n]\nbase_url = \"{}\"\napi_key = {{ file = \"{}\" }}\ntick = \"100ms\"\nreconcile = false\n",
            n8n.url,
            key_file.path().display()
        );
        let dir = tempfile::tempdir().unwrap();
        let mut s = Server::start_in(dir.path(), &config).unwrap();
        let mut body: Value =
            serde_json::from_slice(&fixture("error-trigger-body.raw.json")).unwrap();
        body["execution"]["id"] = json!("103");
        body["workflow"]["id"] = json!("dlqMainWf0000001");
        assert_eq!(
            s.post("/v1/n8n/error-trigger", body.to_string()).status,
            201
        );
        s.terminate();
        let mut s = Server::start_in(
            dir.path(),
            &config.replace(
                "reconcile = false",
                "reconcile = true\nreconcile_every = \"300ms\"",
            ),
        )
        .unwrap();
        let list = |s: &Server| {
            s.get("/v1/dead-letters?limit=100").json["items"]
                .as_array()
                .unwrap()
                .clone()
        };
        let items = eventually("four failures found", Duration::from_secs(10), || {
            let items = list(&s);
            (items.len() == 5).then_some(items)
        });
        let mut executions: Vec<&str> = items
            .iter()
            .map(|r| r["execution_id"].as_str().unwrap())
            .collect();
        executions.sort();
        assert_eq!(
            executions,
            ["101", "102", "103", "104", "105"],
            "103 was known: not twice"
        );
        let metrics = s.get("/metrics").text;
        assert!(
            metrics.contains("dlq_n8n_reconciled_total{workflow_id=\"wfNoErrorFlow01\"} 2"),
            "{metrics}"
        );
        assert!(metrics.contains("dlq_n8n_reconciled_total{workflow_id=\"wfNoErrorFlow02\"} 1"));
        assert!(metrics.contains("dlq_n8n_reconciled_total{workflow_id=\"dlqMainWf0000001\"} 1"));
        // Each found one is then enriched like an Error Trigger record, and says who found it.
        let found = items.iter().find(|r| r["execution_id"] == "105").unwrap()["id"]
            .as_i64()
            .unwrap();
        let rec = wait_state(&s, found, "enriched");
        assert_eq!(rec["events"][0]["actor"], "n8n-reconciliation");
        assert_eq!(rec["workflow_id"], "wfNoErrorFlow01");
        assert_eq!(rec["payload"]["body"]["orderId"], "A-1001");
        // Paged through with the cursor; later rounds stop at the watermark and add nothing.
        let asked = n8n.asked();
        assert!(asked.iter().any(|p| p.contains("cursor=p2")), "{asked:?}");
        eventually("another round", Duration::from_secs(10), || {
            let rounds = n8n
                .asked()
                .iter()
                .filter(|p| p.starts_with("/api/v1/executions?") && !p.contains("cursor"))
                .count();
            (rounds >= 2).then_some(())
        });
        assert_eq!(list(&s).len(), 5);
        s.terminate();
    }

    #[test]
    fn an_enriched_webhook_record_replays_its_body_to_the_webhook_without_a_target() {
        use crate::target::{ok, Target};
        let hook = Target::start(vec![], ok());
        let n8n = FakeN8n::serving(Vec::new(), Some(hook.url.clone()));
        let (s, _key) = server_with(
            &n8n,
            KEY,
            "[delivery]\ntick = \"50ms\"\n[policy.unknown]\ninitial = \"review\"\n",
            "reconcile = false\n",
        );
        let id = error_trigger(&s, "90");
        wait_state(&s, id, "enriched");
        let r = crate::replays::replay(&s, json!({"ids": [id]}), "ana");
        assert_eq!(r.status, 201, "{}", r.text);
        eventually("replayed", Duration::from_secs(10), || {
            (s.get(&format!("/v1/dead-letters/{id}")).json["status"] == "replayed").then_some(())
        });
        let got = hook.got();
        assert_eq!(got.len(), 1);
        let body: Value = serde_json::from_str(&got[0].body).unwrap();
        assert_eq!(
            body,
            json!({"orderId": "A-1001", "amount": 42.5, "customer": {"email": "x@example.test"}}),
            "the webhook's original body, unwrapped"
        );
    }

    #[test]
    fn a_record_without_a_webhook_item_replays_as_n8ns_own_retry() {
        let n8n = FakeN8n::start();
        let (s, _key) = server_with(
            &n8n,
            KEY,
            "[delivery]\ntick = \"50ms\"\n[policy.unknown]\ninitial = \"review\"\n",
            "reconcile = false\nretry_load_workflow = false\n",
        );
        // n8n no longer has its data (404): no payload, so a replay asks n8n to retry.
        let id = error_trigger(&s, "404");
        wait_state(&s, id, "unavailable");
        let r = crate::replays::replay(&s, json!({"ids": [id]}), "ana");
        assert_eq!(r.status, 201, "{}", r.text);
        let rec = eventually("replayed", Duration::from_secs(10), || {
            let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
            (rec["status"] == "replayed").then_some(rec)
        });
        let sent: Vec<String> = n8n
            .asked()
            .into_iter()
            .filter(|p| p.starts_with("POST "))
            .collect();
        assert_eq!(
            sent,
            [r#"POST /api/v1/executions/404/retry {"loadWorkflow":false}"#],
            "n8n's retry, with the configured loadWorkflow"
        );
        let attempt = &rec["deliveries"][0];
        assert_eq!(
            attempt["downstream_execution_id"], "555",
            "the new n8n execution"
        );
        assert!(attempt["target"].as_str().unwrap().starts_with("n8n retry"));
    }

    #[test]
    fn an_automatic_retry_waits_for_the_enricher_and_goes_to_the_webhook() {
        use crate::target::{ok, Target};
        let hook = Target::start(vec![], ok());
        let n8n = FakeN8n::serving(Vec::new(), Some(hook.url.clone()));
        let (s, _key) = server_with(&n8n, KEY, "[delivery]\ntick = \"20ms\"\n[policy.transient]\nretry_base = \"10ms\"\nretry_cap = \"20ms\"\n", "tick = \"300ms\"\nreconcile = false\n");
        // An HTTP 500 failure: transient, retried automatically — but only once n8n's API has
        // supplied the item.
        let mut body: Value =
            serde_json::from_slice(&fixture("error-trigger-body.dlqHttp500Wf0001.raw.json"))
                .unwrap();
        body["execution"]["id"] = json!("91");
        let r = s.post("/v1/n8n/error-trigger", body.to_string());
        assert_eq!(
            (r.status, r.json["status"].as_str()),
            (201, Some("retry_scheduled")),
            "{}",
            r.text
        );
        let id = r.json["id"].as_i64().unwrap();
        eventually("replayed", Duration::from_secs(10), || {
            (s.get(&format!("/v1/dead-letters/{id}")).json["status"] == "replayed").then_some(())
        });
        assert_eq!(hook.got().len(), 1, "sent to the webhook");
        assert!(
            !n8n.asked().iter().any(|p| p.starts_with("POST ")),
            "not retried blind through n8n before the item came"
        );
    }
}
