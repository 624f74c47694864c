//! Python clients that are not pixgate's (an upstream producer, an MQTT 5 device): each in a
//! virtualenv made once under the tests' target folder, its one package installed from PyPI
//! at a pinned version.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One virtualenv made at a time (tests run in parallel).
static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The python of the virtualenv `dir`, with `requirement` (`paho-mqtt==2.1.0`) installed
/// so that `module` imports: made on first use (`python3 -m venv`, `pip install`).
///
/// # Panics
/// The virtualenv cannot be made, or the package not installed (no PyPI): the test fails.
pub fn venv(dir: &Path, requirement: &str, module: &str) -> PathBuf {
    let _once = MAKING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let py = dir.join("bin/python");
    let ready = |py: &Path| {
        Command::new(py)
            .args(["-c", &format!("import {module}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ready(&py) {
        let ok = Command::new("python3").args(["-m", "venv"]).arg(dir).status().is_ok_and(|s| s.success());
        assert!(ok, "python3 -m venv {} failed", dir.display());
        let ok = Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", requirement])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pip install {requirement} failed");
        assert!(ready(&py), "{module} does not import in {}", dir.display());
    }
    py
}
