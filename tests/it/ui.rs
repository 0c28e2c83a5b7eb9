//! The admin page, over HTTP and in a real browser (`mod browser`): sign-in into an HttpOnly
//! SameSite=Strict session, the CSP on every answer, values escaped (a `<script>` payload is
//! text), forms refused without their CSRF token, actions audited as the signed-in name, bulk
//! selection, payload versions, replay (dry run, confirm, job page, live progress) and the
//! two-person approval.

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

const ADMIN: &str = "ui-admin-token-0123456789abcdefgh";

/// A server with a replay target, an operator (ana), an admin (bob) and n8n's ingest token;
/// partition "billing" needs a second person to approve its replays.
fn replay_server(target: &str) -> Server {
    let d = |t: &str| hex::encode(Sha256::digest(t.as_bytes()));
    Server::start_with(&format!(
        "[[auth.tokens]]\nname = \"ana\"\nrole = \"operator\"\nsha256 = \"{}\"\n\
         [[auth.tokens]]\nname = \"bob\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
         [[auth.tokens]]\nname = \"n8n\"\nrole = \"ingest\"\nsha256 = \"{}\"\n\
         [delivery]\ntick = \"50ms\"\nrate_initial = 100.0\nrate_max = 100.0\n\
         [replay]\nrequire_approval = [\"billing\"]\n\
         [[targets]]\nname = \"orders\"\nurl = \"{target}\"\npartitions = [\"orders\", \"billing\"]\n",
        d(OPS),
        d(ADMIN),
        d(INGEST)
    ))
}

/// A signed-in browser stand-in: its session cookie, and the CSRF token of the last page read.
struct Ui<'a> {
    s: &'a Server,
    c: reqwest::blocking::Client,
    cookie: String,
    csrf: String,
}

impl<'a> Ui<'a> {
    fn sign_in(s: &'a Server, token: &str) -> Ui<'a> {
        let c = client();
        let r = c
            .post(s.url("/ui/signin"))
            .form(&[("token", token)])
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 303);
        let cookie = r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let mut ui = Ui {
            s,
            c,
            cookie,
            csrf: String::new(),
        };
        let (_, page) = ui.get("/ui/records");
        ui.csrf = csrf(&page);
        ui
    }

    fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .c
            .get(self.s.url(path))
            .header("cookie", &self.cookie)
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    }

    /// A form post (fields may repeat); `with_csrf` adds the session's token.
    fn post(&self, path: &str, fields: &[(&str, &str)], with_csrf: bool) -> (u16, String, String) {
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        if with_csrf {
            all.push(("csrf", &self.csrf));
        }
        let r = self
            .c
            .post(self.s.url(path))
            .header("cookie", &self.cookie)
            .form(&all)
            .send()
            .unwrap();
        let location = r
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (r.status().as_u16(), location, r.text().unwrap())
    }
}

/// The `seen` marks of a dry-run page's confirm form (how the dry run saw each record).
fn seen(dry: &str) -> Vec<String> {
    dry.match_indices("name=\"seen\" value=\"")
        .map(|(at, m)| {
            let rest = &dry[at + m.len()..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect()
}

impl Ui<'_> {
    /// Dry run, then confirm what it showed: the job's page (or the status and page).
    fn replay(&self, id: i64) -> (u16, String, String) {
        let ids = id.to_string();
        let (st, _, dry) = self.post("/ui/replay", &[("ids", &ids)], true);
        assert_eq!(st, 200, "{dry}");
        let marks = seen(&dry);
        let mut fields = vec![("ids", ids.as_str()), ("confirm", "yes")];
        fields.extend(marks.iter().map(|m| ("seen", m.as_str())));
        self.post("/ui/replay", &fields, true)
    }
}

/// A record posted with n8n's ingest token; its id.
fn post_record(s: &Server, body: serde_json::Value) -> i64 {
    let r = s
        .client
        .post(s.url("/v1/dead-letters"))
        .bearer_auth(INGEST)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    r.json::<serde_json::Value>().unwrap()["id"]
        .as_i64()
        .unwrap()
}

/// An order whose amount is missing (validation: it waits for a person), key `order-N`.
fn ingest(s: &Server, partition: &str, n: i64) -> i64 {
    post_record(
        s,
        json!({"partition": partition, "payload": {"orderId": format!("A-{n}"), "amount": null},
               "idempotency_key": format!("order-{n}"),
               "error": {"message": "amount is required", "status": 422}}),
    )
}

fn record(s: &Server, id: i64) -> serde_json::Value {
    s.client
        .get(s.url(&format!("/v1/dead-letters/{id}")))
        .bearer_auth(OPS)
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap()
}

#[test]
fn sign_in_escape_csrf_and_audit() {
    let s = server();
    let c = client();
    let id = post_record(
        &s,
        json!({"payload": {"note": "<script>alert('x')</script>"}, "error": {"message": "<b>boom</b>", "status": 422}}),
    );

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
    let rec = record(&s, id);
    assert_eq!(rec["status"], "review");

    let token = csrf(&page);
    let r = act(&[("action", "assign"), ("text", "bob"), ("csrf", &token)]);
    assert_eq!(r.status().as_u16(), 303, "{:?}", r.text());
    let rec = record(&s, id);
    assert_eq!(rec["owner"], "bob", "assigned from the page");
    let r = act(&[
        ("action", "resolve"),
        ("text", "fixed upstream"),
        ("csrf", &token),
    ]);
    assert_eq!(r.status().as_u16(), 303, "{:?}", r.text());
    let rec = record(&s, id);
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

    /// Wait (without navigating) until the element's text is `want`.
    async fn text_becomes(c: &Client, css: &str, want: &str, within: Duration) {
        let end = std::time::Instant::now() + within;
        let mut last = String::new();
        while std::time::Instant::now() < end {
            if let Ok(e) = c.find(Locator::Css(css)).await {
                last = e.text().await.unwrap_or_default();
                if last == want {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css} never said {want:?} (last: {last:?})");
    }

    async fn click(c: &Client, css: &str) {
        c.wait()
            .for_element(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
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
        click(&c, "form button[type=submit]").await;
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
        click(&c, "form.filters button").await;
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
        click(&c, "button[value=note]").await;
        trail_has(c.clone(), "ana (ui) noted").await;
        click(&c, "button[value=resolve]").await;
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

        // The same form without its CSRF token is refused (WebDriver's own script removes the
        // field; the page's CSP would refuse an inline one).
        c.execute(
            r#"document.querySelector('form[action$="/act"] input[name=csrf]').remove();"#,
            vec![],
        )
        .await
        .unwrap();
        click(&c, "button[value=note]").await;
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

    /// Edit → diff → save → dry run → replay to a local (slow) target → the job page follows
    /// the job live (its script; nobody reloads) → the record is replayed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edit_dry_run_and_replay_to_a_local_target_in_a_real_browser() {
        let target = crate::target::Target::start(
            vec![],
            crate::target::Behave::Slow(Duration::from_millis(1500)),
        );
        let url = target.url.clone();
        let s = tokio::task::spawn_blocking(move || super::replay_server(&url))
            .await
            .unwrap();
        let s = std::sync::Arc::new(s);
        let s2 = s.clone();
        let id = tokio::task::spawn_blocking(move || super::ingest(&s2, "orders", 42))
            .await
            .unwrap();
        let d = driver();
        let profile = tempfile::tempdir().unwrap();
        let c = browser(d.1, profile.path()).await;

        // Keyboard only: the token field has the focus, Enter signs in.
        c.goto(&s.url("/ui/signin")).await.unwrap();
        c.wait().for_element(Locator::Css("#token")).await.unwrap();
        let focused = c.active_element().await.unwrap();
        assert_eq!(focused.attr("id").await.unwrap().as_deref(), Some("token"));
        focused
            .send_keys(&format!("{OPS}{}", char::from(fantoccini::key::Key::Enter)))
            .await
            .unwrap();
        c.wait()
            .for_element(Locator::Css(".who strong"))
            .await
            .unwrap();

        // Find it: the records list filtered on its partition.
        c.goto(&s.url("/ui/records?partition=orders&status=review"))
            .await
            .unwrap();
        // The script's "select every record on this page" box ticks the rows' boxes.
        click(&c, "input[data-select-all]").await;
        let row = c
            .find(Locator::Css(&format!("input[name=ids][value='{id}']")))
            .await
            .unwrap();
        assert_eq!(row.prop("checked").await.unwrap().as_deref(), Some("true"));
        shot(&c, "list-selected").await;
        c.wait()
            .for_element(Locator::LinkText(&id.to_string()))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.wait()
            .for_element(Locator::Css("pre.payload"))
            .await
            .unwrap();

        // Edit the payload: the diff first, then save.
        let editor = c.find(Locator::Css("#json")).await.unwrap();
        editor.clear().await.unwrap();
        editor
            .send_keys(r#"{"orderId": "A-42", "amount": 99.5}"#)
            .await
            .unwrap();
        click(&c, "form[action$='/edit'] button[type=submit]").await;
        let diff = c
            .wait()
            .for_element(Locator::Css("pre.diff"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(diff.contains("/amount") && diff.contains("99.5"), "{diff}");
        shot(&c, "edit-diff").await;
        click(&c, "form[action$='/edit'] button[type=submit]").await;
        c.wait()
            .for_element(Locator::Css("ol.versions"))
            .await
            .unwrap();
        shot(&c, "versions").await;

        // The dry run: target, key, version 2; nothing sent yet.
        click(&c, "form[action='/ui/replay'] button[type=submit]").await;
        let dry = c
            .wait()
            .for_element(Locator::Css("table.dry-run"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            dry.contains(&target.url) && dry.contains("order-42"),
            "{dry}"
        );
        assert!(target.got().is_empty(), "a dry run sends nothing");
        shot(&c, "dry-run").await;
        click(&c, "form[action='/ui/replay'] button[type=submit]").await;

        // The job page, while the slow target answers, then done — without a reload by us.
        c.wait()
            .for_element(Locator::Css("section#progress"))
            .await
            .unwrap();
        let job_url = c.current_url().await.unwrap();
        assert!(job_url.path().starts_with("/ui/replays/"), "{job_url}");
        shot(&c, "job-running").await;
        text_becomes(&c, "dd.status", "done", Duration::from_secs(20)).await;
        let counts = c
            .find(Locator::Css("strong.counts"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(counts, "1 of 1");
        assert_eq!(c.current_url().await.unwrap().path(), job_url.path());
        shot(&c, "job-done").await;
        let got = target.got();
        assert_eq!(got.len(), 1);
        assert!(got[0].body.contains("99.5"), "the edited version was sent");

        // The record says replayed.
        click(&c, "table.items a").await;
        text_becomes(
            &c,
            "dl.meta dd:nth-of-type(1)",
            "replayed",
            Duration::from_secs(5),
        )
        .await;
        shot(&c, "replayed-record").await;
        let attempts = c.find(Locator::Css("table.attempts")).await.unwrap();
        assert!(attempts.text().await.unwrap().contains("order-42 v2"));
        c.execute(
            "document.querySelector('table.attempts').scrollIntoView();",
            vec![],
        )
        .await
        .unwrap();
        shot(&c, "attempts").await;
        c.goto(&s.url("/ui/replays")).await.unwrap();
        c.wait()
            .for_element(Locator::Css(&format!("a[href='{}']", job_url.path())))
            .await
            .unwrap();
        shot(&c, "replays").await;
        c.close().await.unwrap();
    }
}

#[test]
fn a_failure_group_is_resolved_in_one_action_each_record_audited() {
    let s = server();
    for n in 0..3 {
        post_record(
            &s,
            json!({"payload": {"n": n}, "workflow": {"id": "wf-1", "name": "Invoices"},
                   "error": {"message": "customer <id> is missing", "status": 422}}),
        );
    }
    let ana = Ui::sign_in(&s, OPS);
    let (_, page) = ana.get("/ui/groups");
    assert!(page.contains("3 open of 3"), "{page}");
    assert!(page.contains("customer &lt;id&gt; is missing"));
    let at = page.find("action=\"/ui/groups/").unwrap() + "action=\"/ui/groups/".len();
    let fp = page[at..at + 16].to_owned();
    let act = format!("/ui/groups/{fp}/act");
    let (st, _, _) = ana.post(&act, &[("action", "resolve")], false);
    assert_eq!(st, 403, "no CSRF token");
    let (st, _, done) = ana.post(
        &act,
        &[("action", "resolve"), ("text", "fixed in the CRM")],
        true,
    );
    assert_eq!(st, 200);
    assert!(done.contains("<strong>3</strong> of 3 open record(s) changed"));
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
        let rec = record(&s, r["id"].as_i64().unwrap());
        assert_eq!(
            rec["events"].as_array().unwrap().last().unwrap()["actor"],
            "ana (ui)"
        );
    }
}

#[test]
fn a_payload_edit_shows_its_diff_first_and_keeps_the_original() {
    let s = server();
    let id = post_record(
        &s,
        json!({"payload": {"orderId": "A-9", "amount": null}, "error": {"message": "amount is required", "status": 422}}),
    );
    let ana = Ui::sign_in(&s, OPS);
    let edit = format!("/ui/records/{id}/edit");
    let fixed = r#"{"orderId": "A-9", "amount": 12.5}"#;
    let (st, _, _) = ana.post(&edit, &[("json", "{not json"), ("version", "1")], true);
    assert_eq!(st, 400);
    let (st, _, _) = ana.post(&edit, &[("json", fixed), ("version", "1")], false);
    assert_eq!(st, 403, "no CSRF token");
    let (st, _, preview) = ana.post(&edit, &[("json", fixed), ("version", "1")], true);
    assert_eq!(st, 200);
    assert!(
        preview.contains("&quot;op&quot;: &quot;replace&quot;")
            || preview.contains("\"op\": \"replace\""),
        "{preview}"
    );
    assert!(preview.contains("/amount"));
    // Nothing is saved by a preview.
    assert_eq!(record(&s, id)["payload_version"], 1);
    let (st, _, _) = ana.post(
        &edit,
        &[("json", fixed), ("version", "1"), ("confirm", "yes")],
        true,
    );
    assert_eq!(st, 303);
    let rec = record(&s, id);
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

#[test]
fn a_replay_from_the_page_is_a_dry_run_first_then_a_job_that_delivers() {
    let target = crate::target::Target::start(vec![], crate::target::ok());
    let s = replay_server(&target.url);
    let id = ingest(&s, "orders", 1);
    let ana = Ui::sign_in(&s, OPS);

    // Fix the payload: the record page then lists both versions and the change between them.
    let fixed = r#"{"orderId": "A-1", "amount": 12.5}"#;
    let (st, _, _) = ana.post(
        &format!("/ui/records/{id}/edit"),
        &[("json", fixed), ("version", "1"), ("confirm", "yes")],
        true,
    );
    assert_eq!(st, 303);
    let (_, page) = ana.get(&format!("/ui/records/{id}"));
    assert!(page.contains("Payload versions"), "{page}");
    assert!(page.contains("Version 1 (the original) — "), "{page}");
    assert!(page.contains("Changes from version 1 (RFC 6902)"), "{page}");
    assert!(page.contains("/amount"));

    // Without the CSRF token: refused, nothing sent, no job.
    let (st, _, _) = ana.post("/ui/replay", &[("ids", &id.to_string())], false);
    assert_eq!(st, 403);
    // The dry run: where, with which key and version, what changed; nothing sent.
    let (st, _, dry) = ana.post("/ui/replay", &[("ids", &id.to_string())], true);
    assert_eq!(st, 200, "{dry}");
    assert!(dry.contains(&target.url), "{dry}");
    assert!(dry.contains("<code>order-1</code>"), "{dry}");
    assert!(dry.contains("Nothing has been sent."));
    assert!(
        dry.contains("/amount"),
        "the change from the original is shown"
    );
    assert!(dry.contains("Replay 1 record(s) now"), "{dry}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(target.got().is_empty(), "a dry run sends nothing");
    assert_eq!(record(&s, id)["status"], "review");

    // What the dry run showed is what is confirmed: a change in between (here a second edit)
    // shows the dry run again instead of sending.
    let marks = seen(&dry);
    assert_eq!(marks, [format!("{id}:2:review")]);
    let refixed = r#"{"orderId": "A-1", "amount": 13.5}"#;
    let (st, _, _) = ana.post(
        &format!("/ui/records/{id}/edit"),
        &[("json", refixed), ("version", "2"), ("confirm", "yes")],
        true,
    );
    assert_eq!(st, 303);
    let (st, _, again) = ana.post(
        "/ui/replay",
        &[
            ("ids", &id.to_string()),
            ("confirm", "yes"),
            ("seen", &marks[0]),
        ],
        true,
    );
    assert_eq!(st, 200);
    assert!(again.contains("changed since the dry run"), "{again}");
    assert!(target.got().is_empty());

    // Confirmed: a job, its page, the delivery.
    let (st, location, _) = ana.replay(id);
    assert_eq!(st, 303);
    assert!(location.starts_with("/ui/replays/"), "{location}");
    let job_page = crate::harness::eventually(
        "the job to finish",
        std::time::Duration::from_secs(10),
        || {
            let (_, p) = ana.get(&location);
            p.contains("data-status=\"done\"").then_some(p)
        },
    );
    assert!(job_page.contains("data-final=\"true\""));
    assert!(
        job_page.contains("1 sent, 0 failed, 0 skipped, 0 pending"),
        "{job_page}"
    );
    let got = target.got();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("idempotency-key"), Some("order-1"));
    let sent: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(sent["amount"], 13.5, "the newest version is what was sent");
    let rec = record(&s, id);
    assert_eq!(rec["status"], "replayed");
    assert!(rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["actor"] == "ana (ui)" && e["kind"] == "status_changed"));
    let (_, jobs) = ana.get("/ui/replays");
    assert!(jobs.contains(&format!("href=\"{location}\"")), "{jobs}");
    // The record's attempts show the key and version sent and the target's answer.
    let (_, page) = ana.get(&format!("/ui/records/{id}"));
    assert!(page.contains("<code>order-1</code> v3"), "{page}");
    assert!(page.contains("n8n execution <code>77</code>"), "{page}");

    // A second replay of the same record: the dry run says why it would be skipped.
    let (_, _, dry) = ana.post("/ui/replay", &[("ids", &id.to_string())], true);
    assert!(dry.contains("reopen it to replay it"), "{dry}");
    assert!(dry.contains("Nothing would be sent."));
}

#[test]
fn a_replay_in_an_approval_partition_waits_for_another_person() {
    let target = crate::target::Target::start(vec![], crate::target::ok());
    let s = replay_server(&target.url);
    let id = ingest(&s, "billing", 2);
    let ana = Ui::sign_in(&s, OPS);
    let (_, _, dry) = ana.post("/ui/replay", &[("ids", &id.to_string())], true);
    assert!(dry.contains("needs a second person"), "{dry}");
    let (st, job, _) = ana.replay(id);
    assert_eq!(st, 303);
    let (_, page) = ana.get(&job);
    assert!(page.contains("data-status=\"awaiting_approval\""), "{page}");
    assert!(
        page.contains("Waiting for an admin other than ana (ui)"),
        "{page}"
    );
    assert!(
        !page.contains("value=\"approve\""),
        "an operator gets no approve button"
    );
    // An operator cannot approve, even by hand-made post.
    let (st, _, refused) = ana.post(&format!("{job}/act"), &[("action", "approve")], true);
    assert_eq!(st, 403);
    assert!(refused.contains("needs an admin token"));

    // bob (admin) sees it first in the list and approves it.
    let bob = Ui::sign_in(&s, ADMIN);
    let (_, overview) = bob.get("/ui");
    assert!(
        overview.contains("1</span> replay job(s) awaiting approval"),
        "{overview}"
    );
    let (_, jobs) = bob.get("/ui/replays");
    assert!(
        jobs.contains("<strong>awaiting_approval</strong>"),
        "{jobs}"
    );
    let (_, page) = bob.get(&job);
    assert!(page.contains("value=\"approve\""), "{page}");
    // Without the CSRF token: refused.
    let (st, _, _) = bob.post(&format!("{job}/act"), &[("action", "approve")], false);
    assert_eq!(st, 403);
    let (st, location, _) = bob.post(&format!("{job}/act"), &[("action", "approve")], true);
    assert_eq!((st, location.as_str()), (303, job.as_str()));
    crate::harness::eventually(
        "the approved job to deliver",
        std::time::Duration::from_secs(10),
        || (record(&s, id)["status"] == "replayed").then_some(()),
    );
    let (_, page) = bob.get(&job);
    assert!(page.contains("bob (ui)"), "approved by bob: {page}");

    // bob's own request in billing needs someone else: he cannot approve it himself.
    let other = ingest(&s, "billing", 3);
    let (_, job2, _) = bob.replay(other);
    let (st, _, refused) = bob.post(&format!("{job2}/act"), &[("action", "approve")], true);
    assert_eq!(st, 409);
    assert!(refused.contains("needs a second person"), "{refused}");
    // Cancel it instead.
    let (st, _, _) = bob.post(&format!("{job2}/act"), &[("action", "cancel")], true);
    assert_eq!(st, 303);
    let (_, page) = bob.get(&job2);
    assert!(page.contains("data-status=\"cancelled\""), "{page}");
    assert_eq!(target.got().len(), 1, "only the approved job sent");
}

#[test]
fn records_chosen_in_the_list_are_changed_together_each_audited() {
    let s = server();
    let ids: Vec<i64> = (0..3).map(|n| ingest(&s, "orders", 10 + n)).collect();
    let ana = Ui::sign_in(&s, OPS);
    let (_, list) = ana.get("/ui/records");
    for id in &ids {
        assert!(
            list.contains(&format!("name=\"ids\" value=\"{id}\"")),
            "{list}"
        );
    }
    let (a, b) = (ids[0].to_string(), ids[1].to_string());
    let chosen = [
        ("ids", a.as_str()),
        ("ids", b.as_str()),
        ("action", "resolve"),
        ("text", "paid by hand"),
    ];
    let (st, _, _) = ana.post("/ui/records/bulk", &chosen, false);
    assert_eq!(st, 403, "no CSRF token");
    let (st, _, none) = ana.post("/ui/records/bulk", &[("action", "resolve")], true);
    assert_eq!(st, 422);
    assert!(none.contains("No record was selected"));
    let (st, _, done) = ana.post("/ui/records/bulk", &chosen, true);
    assert_eq!(st, 200);
    assert!(
        done.contains("<strong>2</strong> of 2 selected record(s) changed"),
        "{done}"
    );
    for id in &ids[..2] {
        let rec = record(&s, *id);
        assert_eq!(rec["status"], "resolved");
        let last = rec["events"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["actor"], "ana (ui)");
    }
    assert_eq!(record(&s, ids[2])["status"], "review", "not chosen");
    // Resolving a resolved record again is refused for that record, and said so.
    let (_, _, again) = ana.post(
        "/ui/records/bulk",
        &[
            ("ids", a.as_str()),
            ("ids", &ids[2].to_string()),
            ("action", "resolve"),
        ],
        true,
    );
    assert!(again.contains("<strong>1</strong> of 2"), "{again}");
    // A note on the chosen ones, in the same one transaction; a note longer than the API
    // allows is refused whole.
    let (st, _, _) = ana.post(
        "/ui/records/bulk",
        &[
            ("ids", &ids[2].to_string()),
            ("action", "note"),
            ("text", "called the customer"),
        ],
        true,
    );
    assert_eq!(st, 200);
    let last = record(&s, ids[2])["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last["kind"].as_str(), last["actor"].as_str()),
        (Some("noted"), Some("ana (ui)"))
    );
    let before = record(&s, ids[2])["events"].as_array().unwrap().len();
    let long = "x".repeat(5000);
    let (st, _, refused) = ana.post(
        "/ui/records/bulk",
        &[
            ("ids", &ids[2].to_string()),
            ("action", "note"),
            ("text", &long),
        ],
        true,
    );
    assert_eq!(st, 422);
    assert!(refused.contains("text"), "{refused}");
    assert_eq!(
        record(&s, ids[2])["events"].as_array().unwrap().len(),
        before,
        "nothing written"
    );

    // The list's filters are the API's: status (a choice), owner, dates, and paging keeps them.
    let c = ids[2].to_string();
    let (st, _, _) = ana.post(
        "/ui/records/bulk",
        &[("ids", c.as_str()), ("action", "assign"), ("text", "carl")],
        true,
    );
    assert_eq!(st, 200);
    let (_, mine) = ana.get("/ui/records?owner=carl&status=");
    assert!(mine.contains(&format!("value=\"{c}\"")), "{mine}");
    assert!(!mine.contains(&format!("value=\"{a}\"")), "{mine}");
    let (_, resolved) = ana.get("/ui/records?status=resolved&since=2020-01-01&limit=1");
    assert!(
        resolved.contains("<option value=\"resolved\" selected>"),
        "{resolved}"
    );
    assert!(
        resolved.contains("name=\"since\" value=\"2020-01-01\""),
        "{resolved}"
    );
    let at =
        resolved.find("rel=\"next\" href=\"").expect("a next page") + "rel=\"next\" href=\"".len();
    let next = resolved[at..at + resolved[at..].find('"').unwrap()].replace("&amp;", "&");
    assert!(
        next.contains("status=resolved") && next.contains("since=2020-01-01"),
        "{next}"
    );
    let (_, older) = ana.get(&next);
    assert!(older.contains(&format!("value=\"{a}\"")), "{older}");
    let (st, bad) = ana.get("/ui/records?since=yesterday");
    assert_eq!(st, 422);
    assert!(bad.contains("is not a time"), "{bad}");
}
