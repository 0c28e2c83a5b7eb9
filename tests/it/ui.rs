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
    let r = act(&[("action", "assign"), ("text", "bob"), ("csrf", &token)]);
    assert_eq!(r.status().as_u16(), 303, "{:?}", r.text());
    let rec = s
        .client
        .get(s.url(&format!("/v1/dead-letters/{id}")))
        .bearer_auth(OPS)
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap();
    assert_eq!(rec["owner"], "bob", "assigned from the page");
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

/// A real browser: headless Chromium driven by chromedriver (Debian's `chromium` and
/// `chromium-driver`; .ci/run installs them). Screenshots of each page are kept in
/// `target/ui-screenshots/` to look at.
mod browser {
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use fantoccini::{Client, ClientBuilder, Locator};
    use serde_json::json;

    use super::{server, INGEST, OPS};

    struct Driver(Child, u16);

    impl Drop for Driver {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn driver() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; .ci/run installs it)");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver(child, port)
    }

    async fn browser(port: u16, profile: &std::path::Path) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": "/usr/bin/chromium", "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,1000", format!("--user-data-dir={}", profile.display())]}),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session")
    }

    async fn shot(c: &Client, name: &str) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{name}.png")),
            c.screenshot().await.unwrap(),
        )
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sign_in_find_a_failure_note_it_resolve_it_in_a_real_browser() {
        let s = tokio::task::spawn_blocking(server).await.unwrap();
        let post = s.url("/v1/dead-letters");
        let id = tokio::task::spawn_blocking(move || {
            let r = reqwest::blocking::Client::new()
                .post(post)
                .bearer_auth(INGEST)
                .header("content-type", "application/json")
                .body(json!({"partition": "billing", "payload": {"orderId": "A-7", "note": "<script>document.title='pwned'</script>"},
                             "error": {"message": "amount is required", "status": 422}}).to_string())
                .send()
                .unwrap();
            r.json::<serde_json::Value>().unwrap()["id"].as_i64().unwrap()
        })
        .await
        .unwrap();
        let d = driver();
        let profile = tempfile::tempdir().unwrap();
        let c = browser(d.1, profile.path()).await;

        c.goto(&s.url("/ui")).await.unwrap();
        assert!(c
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/ui/signin"));
        shot(&c, "signin").await;
        c.find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(OPS)
            .await
            .unwrap();
        c.find(Locator::Css("form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let who = c
            .wait()
            .for_element(Locator::Css(".who strong"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(who, "ana");
        shot(&c, "overview").await;
        c.goto(&s.url("/ui/groups")).await.unwrap();
        c.wait()
            .for_element(Locator::Css("section.group"))
            .await
            .unwrap();
        shot(&c, "groups").await;

        c.find(Locator::LinkText("Records"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.wait()
            .for_element(Locator::Css("input[name=partition]"))
            .await
            .unwrap()
            .send_keys("billing")
            .await
            .unwrap();
        c.find(Locator::Css("form.filters button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // The filtered list (its URL has the query) has the record.
        for _ in 0..200 {
            let url = c.current_url().await.unwrap();
            if url.query().is_some_and(|q| q.contains("partition=billing")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let link = c
            .wait()
            .for_element(Locator::LinkText(&id.to_string()))
            .await
            .unwrap();
        shot(&c, "list").await;
        link.click().await.unwrap();
        // The payload's <script> is text on the page, and never ran.
        let pre = c
            .wait()
            .for_element(Locator::Css("pre.payload"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            pre.contains("<script>document.title='pwned'</script>"),
            "{pre}"
        );
        assert_eq!(
            c.title().await.unwrap(),
            format!("Record {id} · deadletter")
        );
        shot(&c, "detail").await;

        // A note, then resolve: both audited as the signed-in name.
        let trail_has = |c: Client, want: &'static str| async move {
            for _ in 0..100 {
                if let Ok(e) = c.find(Locator::Css("ol.events")).await {
                    if e.text().await.unwrap_or_default().contains(want) {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the audit trail never showed {want:?}");
        };
        c.find(Locator::Css("#text"))
            .await
            .unwrap()
            .send_keys("customer fixed the amount")
            .await
            .unwrap();
        c.find(Locator::Css("button[value=note]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        trail_has(c.clone(), "ana (ui) noted").await;
        c.find(Locator::Css("button[value=resolve]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        trail_has(c.clone(), "ana (ui) status_changed review → resolved").await;
        let status = c
            .find(Locator::XPath("//dt[.='Status']/following-sibling::dd[1]"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(status, "resolved");
        shot(&c, "resolved").await;

        // The same form without its CSRF token is refused (the page runs no script — its CSP
        // allows none; WebDriver's own script removes the field).
        c.execute(
            r#"document.querySelector('form[action$="/act"] input[name=csrf]').remove();"#,
            vec![],
        )
        .await
        .unwrap();
        c.find(Locator::Css("button[value=note]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let refused = c
            .wait()
            .for_element(Locator::Css("p.error"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            refused.contains("CSRF token is missing or wrong"),
            "{refused}"
        );
        shot(&c, "csrf-refused").await;
        c.close().await.unwrap();
    }
}

#[test]
fn a_failure_group_is_resolved_in_one_action_each_record_audited() {
    let s = server();
    let c = client();
    for n in 0..3 {
        let r = s
            .client
            .post(s.url("/v1/dead-letters"))
            .bearer_auth(INGEST)
            .header("content-type", "application/json")
            .body(
                json!({"payload": {"n": n}, "workflow": {"id": "wf-1", "name": "Invoices"},
                         "error": {"message": "customer <id> is missing", "status": 422}})
                .to_string(),
            )
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let r = c
        .post(s.url("/ui/signin"))
        .form(&[("token", OPS)])
        .send()
        .unwrap();
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = c
        .get(s.url("/ui/groups"))
        .header("cookie", &cookie)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(page.contains("3 open of 3"), "{page}");
    assert!(page.contains("customer &lt;id&gt; is missing"));
    let at = page.find("action=\"/ui/groups/").unwrap() + "action=\"/ui/groups/".len();
    let fp = page[at..at + 16].to_owned();
    let act = |fields: &[(&str, &str)]| {
        c.post(s.url(&format!("/ui/groups/{fp}/act")))
            .header("cookie", &cookie)
            .form(fields)
            .send()
            .unwrap()
    };
    assert_eq!(
        act(&[("action", "resolve")]).status().as_u16(),
        403,
        "no CSRF token"
    );
    let token = csrf(&page);
    let r = act(&[
        ("action", "resolve"),
        ("text", "fixed in the CRM"),
        ("csrf", &token),
    ]);
    assert_eq!(r.status().as_u16(), 200);
    assert!(r
        .text()
        .unwrap()
        .contains("<strong>3</strong> of 3 open record(s) changed"));
    let list = s
        .client
        .get(s.url(&format!("/v1/dead-letters?fingerprint={fp}")))
        .bearer_auth(OPS)
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap();
    for r in list["items"].as_array().unwrap() {
        assert_eq!(r["status"], "resolved");
        let rec = s
            .client
            .get(s.url(&format!("/v1/dead-letters/{}", r["id"])))
            .bearer_auth(OPS)
            .send()
            .unwrap()
            .json::<serde_json::Value>()
            .unwrap();
        assert_eq!(
            rec["events"].as_array().unwrap().last().unwrap()["actor"],
            "ana (ui)"
        );
    }
}

#[test]
fn a_payload_edit_shows_its_diff_first_and_keeps_the_original() {
    let s = server();
    let c = client();
    let r = s
        .client
        .post(s.url("/v1/dead-letters"))
        .bearer_auth(INGEST)
        .header("content-type", "application/json")
        .body(json!({"payload": {"orderId": "A-9", "amount": null}, "error": {"message": "amount is required", "status": 422}}).to_string())
        .send()
        .unwrap();
    let id = r.json::<serde_json::Value>().unwrap()["id"]
        .as_i64()
        .unwrap();
    let r = c
        .post(s.url("/ui/signin"))
        .form(&[("token", OPS)])
        .send()
        .unwrap();
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = c
        .get(s.url(&format!("/ui/records/{id}")))
        .header("cookie", &cookie)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let token = csrf(&page);
    let edit = |fields: &[(&str, &str)]| {
        c.post(s.url(&format!("/ui/records/{id}/edit")))
            .header("cookie", &cookie)
            .form(fields)
            .send()
            .unwrap()
    };
    let fixed = r#"{"orderId": "A-9", "amount": 12.5}"#;
    assert_eq!(
        edit(&[("json", "{not json"), ("version", "1"), ("csrf", &token)])
            .status()
            .as_u16(),
        400
    );
    assert_eq!(
        edit(&[("json", fixed), ("version", "1")]).status().as_u16(),
        403,
        "no CSRF token"
    );
    let preview = edit(&[("json", fixed), ("version", "1"), ("csrf", &token)]);
    assert_eq!(preview.status().as_u16(), 200);
    let preview = preview.text().unwrap();
    assert!(
        preview.contains("&quot;op&quot;: &quot;replace&quot;")
            || preview.contains("\"op\": \"replace\""),
        "{preview}"
    );
    assert!(preview.contains("/amount"));
    // Nothing is saved by a preview.
    let v = |s: &Server| {
        s.client
            .get(s.url(&format!("/v1/dead-letters/{id}")))
            .bearer_auth(OPS)
            .send()
            .unwrap()
            .json::<serde_json::Value>()
            .unwrap()
    };
    assert_eq!(v(&s)["payload_version"], 1);
    let r = edit(&[
        ("json", fixed),
        ("version", "1"),
        ("csrf", &token),
        ("confirm", "yes"),
    ]);
    assert_eq!(r.status().as_u16(), 303);
    let rec = v(&s);
    assert_eq!(rec["payload_version"], 2);
    assert_eq!(rec["payload"]["amount"], 12.5);
    assert_eq!(
        rec["payload_versions"].as_array().unwrap().len(),
        2,
        "the original is kept"
    );
    let last = rec["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["kind"].as_str(), last["actor"].as_str()),
        (Some("payload_edited"), Some("ana (ui)"))
    );
}
