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
