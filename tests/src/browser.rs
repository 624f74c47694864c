//! A real browser for the tests of web pages: Debian's chromium, headless, driven over the
//! W3C WebDriver protocol by Debian's chromedriver (packages `chromium`,
//! `chromium-driver`; `scripts/ensure-chromium.sh` installs them, `scripts/test.sh` runs
//! it).
//!
//! [`Browser::start`] runs chromedriver on a free loopback port in a process group of its
//! own and opens one session; dropping the [`Browser`] kills the group (chromedriver and the
//! chromium it started), also when the test fails. Commands are the WebDriver endpoints
//! (W3C WebDriver, §10 navigation, §12 elements, §13 script execution, §17 screenshots).

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The key WebDriver wraps an element reference in (W3C WebDriver §12.1).
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where tests leave files for a person to look at (screenshots):
/// `$CARGO_TARGET_DIR/test-artifacts`, or `target/test-artifacts` in the repository; made
/// if missing.
///
/// # Panics
/// The folder cannot be made.
pub fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { crate::repo_root().join(t) })
        .unwrap_or_else(|| crate::repo_root().join("target"));
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The chromium binary: `$PIXGATE_CHROMIUM`, else `chromium` on `PATH`.
fn chromium_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("PIXGATE_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    which("chromium").context("chromium not found on PATH: run scripts/ensure-chromium.sh (Debian package chromium)")
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// One headless chromium session.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    /// `http://127.0.0.1:{port}/session/{id}`.
    session: String,
    /// chromium's profile folder, removed on drop.
    profile: PathBuf,
    /// chromium's `TMPDIR`, a short path under the system's temporary folder, removed on drop.
    tmp: PathBuf,
}

/// An element of the page (a WebDriver element reference).
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    /// Starts chromedriver and a headless chromium with a 1400 × 1000 window and a profile of
    /// its own under `scratch` (removed on drop; chromedriver's log stays there as
    /// `chromedriver.log`).
    ///
    /// # Errors
    /// chromium or chromedriver is missing, or the session does not open within 30 s.
    pub async fn start(scratch: &Path) -> anyhow::Result<Browser> {
        let chromium = chromium_binary()?;
        let driver_bin = which("chromedriver").context(
            "chromedriver not found on PATH: run scripts/ensure-chromium.sh (Debian package chromium-driver)",
        )?;
        let port = crate::net::free_port();
        let log = std::fs::File::create(scratch.join("chromedriver.log"))?;
        let profile = scratch.join(format!("chromium-profile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        // chromium, killed, cannot remove its scoped folders, so they go in one of ours. Not
        // under `scratch`: its process-singleton socket lives there, and a Unix socket's path
        // must fit in 108 bytes.
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let tmp = std::env::temp_dir().join(format!("pixgate-chromium-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .env("TMPDIR", &tmp)
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", driver_bin.display()))?;
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        let mut browser = Browser { driver, http, session: String::new(), profile, tmp };

        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = browser.http.get(format!("{base}/status")).send().await;
            if let Ok(r) = ready {
                let v: Value = r.json().await.unwrap_or_default();
                if v["value"]["ready"] == true {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "chromedriver on port {port} not ready after 30 s (see {})",
                    scratch.join("chromedriver.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([format!("--user-data-dir={}", browser.profile.display())])
        .collect::<Vec<_>>();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let r: Value = browser.http.post(format!("{base}/session")).json(&caps).send().await?.json().await?;
        let Some(id) = r["value"]["sessionId"].as_str() else { bail!("no session: {r}") };
        browser.session = format!("{base}/session/{id}");
        Ok(browser)
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.with_context(|| format!("WebDriver {path}"))?;
        let status = resp.status();
        let v: Value = resp.json().await.with_context(|| format!("WebDriver {path}: reply"))?;
        if !status.is_success() {
            bail!("WebDriver {path}: {status}: {}", v["value"]);
        }
        Ok(v["value"].clone())
    }

    /// Loads `url` and waits for it to load (WebDriver "Navigate To").
    ///
    /// # Errors
    /// The browser refuses or the page does not load.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await.map(drop)
    }

    /// Runs `script` (a function body: `return …;` gives the value) with `args` as
    /// `arguments`, and reads what it returns as `T`.
    ///
    /// # Errors
    /// The script throws, or its value is not a `T`.
    pub async fn execute<T: serde::de::DeserializeOwned>(&self, script: &str, args: Vec<Value>) -> anyhow::Result<T> {
        let v =
            self.command(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": args}))).await?;
        serde_json::from_value(v.clone()).with_context(|| format!("script returned {v}"))
    }

    /// Waits until the JavaScript expression `expr` is true, checking every 100 ms.
    ///
    /// # Errors
    /// Not true within `timeout`: the error carries the page's text for the test's log.
    pub async fn wait_for(&self, expr: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let script = format!("try {{ return !!({expr}); }} catch (e) {{ return false; }}");
        loop {
            if self.execute::<bool>(&script, vec![]).await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                let text: String = self
                    .execute("return document.body ? document.body.innerText.slice(0, 3000) : '';", vec![])
                    .await
                    .unwrap_or_default();
                bail!("not true after {timeout:?}: {expr}\n--- page text ---\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first element matching the CSS selector `css`.
    ///
    /// # Errors
    /// No element matches.
    pub async fn find(&self, css: &str) -> anyhow::Result<Element<'_>> {
        let v = self
            .command(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css})))
            .await
            .with_context(|| format!("finding {css}"))?;
        let Some(id) = v[ELEMENT_KEY].as_str() else { bail!("{css}: no element reference in {v}") };
        Ok(Element { browser: self, id: id.to_string() })
    }

    /// Saves a PNG of the window at `path` and returns the path.
    ///
    /// # Errors
    /// The browser gives no screenshot, or the file cannot be written.
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<PathBuf> {
        use base64::Engine as _;
        let v = self.command(reqwest::Method::GET, "/screenshot", None).await?;
        let png =
            base64::engine::general_purpose::STANDARD.decode(v.as_str().context("screenshot is not a string")?)?;
        std::fs::write(path, png).with_context(|| path.display().to_string())?;
        Ok(path.to_path_buf())
    }
}

impl Element<'_> {
    /// Types `text` into the element (WebDriver "Element Send Keys").
    ///
    /// # Errors
    /// The element cannot take keys.
    pub async fn send_keys(&self, text: &str) -> anyhow::Result<()> {
        let path = format!("/element/{}/value", self.id);
        self.browser.command(reqwest::Method::POST, &path, Some(json!({"text": text}))).await.map(drop)
    }

    /// Clicks the element (WebDriver "Element Click").
    ///
    /// # Errors
    /// The element is not clickable (hidden, covered).
    pub async fn click(&self) -> anyhow::Result<()> {
        let path = format!("/element/{}/click", self.id);
        self.browser.command(reqwest::Method::POST, &path, Some(json!({}))).await.map(drop)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromium is chromedriver's child, in the group chromedriver leads.
        if let Some(pid) = self.driver.id() {
            let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        }
        let _ = self.driver.start_kill();
        let _ = std::fs::remove_dir_all(&self.profile);
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}
