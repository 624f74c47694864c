//! Direct printers in tests: `printer-sim listen` as a child process on loopback TCP or a
//! pseudo-terminal (real transports, not mocks), switched at run time through its state
//! file and read back through its stdout lines and transcript; `printer-sim cloudprnt`, a
//! Star CloudPRNT printer polling a server, likewise; and a registry file in which a
//! fixture printer is driven directly.

use serde_json::Value;
use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a line the test waits for may take.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `printer-sim listen` and the lines it prints (`listening …`, `receiving …`,
/// `printed …`, `overrun …`).
pub struct RawSim {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Where its PNGs, `transcript.txt` and `state` file are.
    pub out: PathBuf,
}

/// `path` as text for a command line (test paths are UTF-8).
fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Starts `printer-sim ARGS…` with its stdout read line by line into the returned channel
/// (stderr dropped).
///
/// # Panics
/// The binary is not built (`cargo build --workspace --bins`) or cannot start.
fn spawn_with_lines(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let bin = crate::gateway::find_binary().expect("pixgate built").with_file_name("printer-sim");
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("printer-sim starts (cargo build --workspace --bins)");
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

impl RawSim {
    /// Starts `printer-sim listen TRANSPORT…` (e.g. `["--tcp", "127.0.0.1:0"]`, `["--pty"]`)
    /// writing into `out` (created), a printer of `model` (e.g. `Epson TM-T20X`: its
    /// `ESC t` numbering) with `paper_mm` paper (58 or 80), in `state` (the state file's
    /// words, e.g. `ready`, `paper-out`, `slow`).
    ///
    /// # Panics
    /// The binary is not built (`cargo build --workspace --bins`) or cannot start.
    pub fn start(out: &Path, transport: &[&str], model: &str, paper_mm: u8, state: &str) -> RawSim {
        std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
        std::fs::write(out.join("state"), state).expect("state file");
        let mut args = vec!["listen"];
        args.extend(transport);
        let state = out.join("state");
        let paper = paper_mm.to_string();
        args.extend(["--out", path_str(out), "--state-file", path_str(&state)]);
        args.extend(["--model", model, "--paper", &paper, "--idle-ms", "0"]);
        let (child, lines) = spawn_with_lines(&args);
        RawSim { child, lines, out: out.to_path_buf() }
    }

    /// The rest of the next line starting with `prefix`, skipping others.
    ///
    /// # Panics
    /// No such line within [`LINE_TIMEOUT`].
    pub fn line(&self, prefix: &str) -> String {
        loop {
            let l =
                self.lines.recv_timeout(LINE_TIMEOUT).unwrap_or_else(|e| panic!("printer-sim said no {prefix:?}: {e}"));
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    /// The lines it has said and nobody has read yet, without waiting.
    pub fn lines_now(&self) -> Vec<String> {
        std::iter::from_fn(|| self.lines.try_recv().ok()).collect()
    }

    /// Every line up to and including the next that starts with `prefix`.
    ///
    /// # Panics
    /// No such line within [`LINE_TIMEOUT`].
    pub fn lines_until(&self, prefix: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let l =
                self.lines.recv_timeout(LINE_TIMEOUT).unwrap_or_else(|e| panic!("printer-sim said no {prefix:?}: {e}"));
            let done = l.starts_with(prefix);
            seen.push(l);
            if done {
                return seen;
            }
        }
    }

    /// Switches the simulated printer (the state file's words).
    ///
    /// # Panics
    /// The file cannot be written.
    pub fn set_state(&self, words: &str) {
        std::fs::write(self.out.join("state"), words).expect("state file");
    }

    /// Its transcript so far (empty before the first job).
    pub fn transcript(&self) -> String {
        std::fs::read_to_string(self.out.join("transcript.txt")).unwrap_or_default()
    }

    /// The transcript's jobs, each its own section (`===== seq NNNN print via …`).
    pub fn jobs(&self) -> Vec<String> {
        self.transcript().split("===== seq ").skip(1).map(str::to_string).collect()
    }

    /// Kills it at once (SIGKILL), as a printer switched off mid-job.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RawSim {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `printer-sim cloudprnt` (or `sdp`) and the lines it prints (`polling …`,
/// `refused …`, `duplicate …`, `printed … token=…`).
pub struct CloudSim {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// `printed` lines read so far, by any method.
    printed_seen: Cell<usize>,
    /// Where its PNGs, `jobs.jsonl` and `state` file are.
    pub out: PathBuf,
}

impl CloudSim {
    /// Starts `printer-sim cloudprnt --out OUT --state-file OUT/state ARGS…` (ARGS: at
    /// least `--url URL --mac MAC`). `out` is created; the state file is written `ready`
    /// unless it exists (write it first to start in another condition).
    ///
    /// # Panics
    /// The binary is not built (`cargo build --workspace --bins`) or cannot start.
    pub fn start(out: &Path, args: &[&str]) -> CloudSim {
        CloudSim::start_as("cloudprnt", out, args)
    }

    /// [`CloudSim::start`] for `printer-sim sdp` (ARGS: at least `--url URL --id ID`): an
    /// Epson printer on Server Direct Print (its state file is always `OUT/state`).
    ///
    /// # Panics
    /// As [`CloudSim::start`].
    pub fn start_sdp(out: &Path, args: &[&str]) -> CloudSim {
        CloudSim::start_as("sdp", out, args)
    }

    fn start_as(mode: &str, out: &Path, args: &[&str]) -> CloudSim {
        std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
        let state = out.join("state");
        if !state.exists() {
            std::fs::write(&state, "ready").expect("state file");
        }
        let mut all = vec![mode, "--out", path_str(out)];
        if mode == "cloudprnt" {
            all.extend(["--state-file", path_str(&state)]);
        }
        all.extend(args);
        let (child, lines) = spawn_with_lines(&all);
        CloudSim { child, lines, printed_seen: Cell::new(0), out: out.to_path_buf() }
    }

    /// The next line, counting `printed` lines.
    fn next_line(&self, waiting_for: &str) -> String {
        let l = self
            .lines
            .recv_timeout(LINE_TIMEOUT)
            .unwrap_or_else(|e| panic!("printer-sim cloudprnt said no {waiting_for:?}: {e}"));
        self.counted(l)
    }

    /// `l`, counted if it is a `printed` line.
    fn counted(&self, l: String) -> String {
        if l.starts_with("printed ") {
            self.printed_seen.set(self.printed_seen.get() + 1);
        }
        l
    }

    /// The rest of the next line starting with `prefix`, skipping others.
    ///
    /// # Panics
    /// No such line within [`LINE_TIMEOUT`].
    pub fn line(&self, prefix: &str) -> String {
        loop {
            if let Some(rest) = self.next_line(prefix).strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    /// Every line up to and including the next that starts with `prefix`.
    ///
    /// # Panics
    /// No such line within [`LINE_TIMEOUT`].
    pub fn lines_until(&self, prefix: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let l = self.next_line(prefix);
            let done = l.starts_with(prefix);
            seen.push(l);
            if done {
                return seen;
            }
        }
    }

    /// Waits until the `n`-th `printed` line since the start (counting those already read
    /// by [`CloudSim::line`] and [`CloudSim::lines_until`]); returns the lines read on the
    /// way (empty if it had already come).
    ///
    /// # Panics
    /// No such line within [`LINE_TIMEOUT`] of each other line.
    pub fn wait_printed(&self, n: usize) -> Vec<String> {
        let mut seen = Vec::new();
        while self.printed_seen.get() < n {
            seen.push(self.next_line(&format!("printed (number {n})")));
        }
        seen
    }

    /// Switches the simulated printer (the state file's words: `ready`, `paper-out`,
    /// `paper-near-end`, `cover-open`, `offline`).
    ///
    /// # Panics
    /// The file cannot be written.
    pub fn set_state(&self, words: &str) {
        std::fs::write(self.out.join("state"), words).expect("state file");
    }

    /// The lines it has said and nobody has read yet, without waiting.
    pub fn lines_now(&self) -> Vec<String> {
        std::iter::from_fn(|| self.lines.try_recv().ok()).map(|l| self.counted(l)).collect()
    }

    /// The jobs printed so far, from `jobs.jsonl`: each PNG's path and its job token (empty
    /// when the server gave none).
    ///
    /// # Panics
    /// A line of `jobs.jsonl` is not a job record.
    pub fn printed(&self) -> Vec<(PathBuf, String)> {
        let text = std::fs::read_to_string(self.out.join("jobs.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let rec: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("jobs.jsonl line {l:?}: {e}"));
                let file = rec["file"].as_str().unwrap_or_else(|| panic!("no file in {l:?}"));
                (self.out.join(file), rec["token"].as_str().unwrap_or("").to_string())
            })
            .collect()
    }

    /// Kills it at once (SIGKILL), as a printer switched off mid-job.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for CloudSim {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `devices.jsonl` of `fixtures` to `to` with each printer of `direct`, given as
/// `(device, transport, endpoint)`, driven directly: `printer.transport` and the pixgate
/// extension `printer.endpoint` set in its document.
///
/// # Panics
/// The fixture is unreadable, a device is not one of its printers, or `to` cannot be
/// written.
pub fn registry_with_direct_printers(fixtures: &Path, to: &Path, direct: &[(&str, &str, &str)]) {
    let text = std::fs::read_to_string(fixtures.join("devices.jsonl")).expect("devices.jsonl");
    let mut found = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            let mut rec: Value = serde_json::from_str(l).expect("JSON line");
            if let Some((_, transport, endpoint)) = direct.iter().find(|(d, _, _)| rec["key"] == *d) {
                let p = &mut rec["value"]["fullDocument"]["printer"];
                assert!(p.is_object(), "{} is not a printer", rec["key"]);
                p["transport"] = (*transport).into();
                p["endpoint"] = (*endpoint).into();
                found += 1;
            }
            rec.to_string()
        })
        .collect();
    assert_eq!(found, direct.len(), "every direct printer is a fixture device record");
    std::fs::write(to, lines.join("\n") + "\n").expect("registry file");
}
