//! schemathesis (from PyPI; `.ci/run` installs it) against the running binary and its own
//! /openapi.json, with an admin token: zero server errors, and every answer's status code,
//! content type, headers and body as the document says.

use std::process::Command;

use sha2::{Digest, Sha256};

use crate::harness::{fixture, Server};

const TOKEN: &str = "schemathesis-admin-token-0123456789";

/// Through the interpreter pip installed it into, so no PATH or shim matters.
fn schemathesis() -> Command {
    let mut c = Command::new("python3");
    c.args(["-m", "schemathesis.cli"]);
    c
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_that_breaks_the_document() {
    let probe = schemathesis().arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "schemathesis is not installed: `python3 -m pip install schemathesis` (.ci/run does)"
    );
    let s = Server::start_with(&format!(
        "[[auth.tokens]]\nname = \"admin\"\nrole = \"admin\"\nsha256 = \"{}\"\n",
        hex::encode(Sha256::digest(TOKEN.as_bytes()))
    ));
    // Some records, so reads and triage reach real data.
    for name in [
        "error-trigger-body.raw.json",
        "error-trigger-body.dlqHttp500Wf0001.raw.json",
        "error-trigger-body.dlqHttpRefWf0001.raw.json",
    ] {
        let r = s
            .client
            .post(s.url("/v1/n8n/error-trigger"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(fixture(name))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let r = s
        .client
        .post(s.url("/v1/dead-letters"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(fixture("error-output-item.raw.json"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);

    let work = tempfile::tempdir().unwrap();
    let out = schemathesis()
        .current_dir(work.path())
        .args([
            "run",
            &s.url("/openapi.json"),
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance",
            "--max-examples",
            "30",
            "--workers",
            "2",
            "--seed",
            "42",
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("passed"), "{report}");
    assert_eq!(s.get("/healthz").status, 200, "the server kept serving");
}
