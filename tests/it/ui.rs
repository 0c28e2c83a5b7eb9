//! The admin page over HTTP (the browser tests come with the rest of the UI issue): sign-in
//! into an HttpOnly SameSite=Strict session, the CSP on every answer, values escaped (a
//! `<script>` payload is text), forms refused without their CSRF token, and actions audited
//! as the signed-in name.

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::harness::Server;

const OPS: &str = "ui-operator-token-0123456789abcd";
const INGEST: &str = "ui-ingest-token-0123456789abcdef";

fn server() -> Server {
    let d = |t: &str| hex::encode(Sha256::digest(t.as_bytes()));
    Server::start_with(&format!(
        "[[auth.tokens]]\nname = \"ana\"\nrole = \"operator\"\nsha256 = \"{}\"\n\
         [[auth.tokens]]\nname = \"n8n\"\nrole = \"ingest\"\nsha256 = \"{}\"\n",
        d(OPS),
        d(INGEST)
    ))
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The `name="csrf"` hidden value in a page.
fn csrf(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..at + 64].to_owned()
}

#[test]
fn sign_in_escape_csrf_and_audit() {
    let s = server();
    let c = client();
    let r = s
        .client
        .post(s.url("/v1/dead-letters"))
        .bearer_auth(INGEST)
        .header("content-type", "application/json")
        .body(json!({"payload": {"note": "<script>alert('x')</script>"}, "error": {"message": "<b>boom</b>", "status": 422}}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let id = r.json::<serde_json::Value>().unwrap()["id"]
        .as_i64()
        .unwrap();

    let r = c.get(s.url("/ui")).send().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/ui/signin");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );

    let signin = |token: &str| {
        c.post(s.url("/ui/signin"))
            .form(&[("token", token)])
            .send()
            .unwrap()
    };
    assert_eq!(signin("nope").status().as_u16(), 401);
    assert_eq!(
        signin(INGEST).status().as_u16(),
        403,
        "ingest tokens cannot use the page"
    );
    let r = signin(OPS);
    assert_eq!(r.status().as_u16(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let get = |p: &str| {
        let r = c.get(s.url(p)).header("cookie", &cookie).send().unwrap();
        assert!(r.headers().contains_key("content-security-policy"));
        (r.status().as_u16(), r.text().unwrap())
    };

    let (st, overview) = get("/ui");
    assert_eq!(st, 200);
    assert!(overview.contains("<svg") && overview.contains("Signed in as <strong>ana</strong>"));
    let (_, list) = get("/ui/records?partition=default");
    assert!(list.contains(&format!("href=\"/ui/records/{id}\"")));
    let (_, page) = get(&format!("/ui/records/{id}"));
    assert!(
        !page.contains("<script>alert"),
        "the payload must render as text"
    );
    assert!(
        page.contains("&lt;script&gt;alert('x')&lt;/script&gt;")
            || page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"),
        "{page}"
    );
    assert!(!page.contains("<b>boom</b>"));

    // A form without its CSRF token (or with another) is refused and changes nothing.
    let act = |fields: &[(&str, &str)]| {
        c.post(s.url(&format!("/ui/records/{id}/act")))
            .header("cookie", &cookie)
            .form(fields)
            .send()
            .unwrap()
    };
    assert_eq!(
        act(&[("action", "resolve"), ("text", "x"), ("csrf", "")])
            .status()
            .as_u16(),
        403
    );
    assert_eq!(
        act(&[
            ("action", "resolve"),
            ("text", "x"),
            ("csrf", &"0".repeat(64))
        ])
        .status()
        .as_u16(),
        403
    );
    let rec = s
        .client
        .get(s.url(&format!("/v1/dead-letters/{id}")))
        .bearer_auth(OPS)
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap();
    assert_eq!(rec["status"], "review");

    let token = csrf(&page);
    let r = act(&[
        ("action", "resolve"),
        ("text", "fixed upstream"),
        ("csrf", &token),
    ]);
    assert_eq!(r.status().as_u16(), 303, "{:?}", r.text());
    let rec = s
        .client
        .get(s.url(&format!("/v1/dead-letters/{id}")))
        .bearer_auth(OPS)
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap();
    assert_eq!(rec["status"], "resolved");
    let last = rec["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["actor"], "ana (ui)", "audited as the signed-in name");

    // Signing out ends the session.
    let r = c
        .post(s.url("/ui/signout"))
        .header("cookie", &cookie)
        .form(&[("csrf", token.as_str())])
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let r = c
        .get(s.url("/ui"))
        .header("cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
}
