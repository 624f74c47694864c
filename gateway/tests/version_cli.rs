//! `pixgate --version` names the version and the git commit the binary was built from.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const PIXGATE: &str = env!("CARGO_BIN_EXE_pixgate");

#[test]
fn version_names_the_crate_version_and_the_commit() {
    for flag in ["--version", "-V"] {
        let out = Command::new(PIXGATE).arg(flag).output().unwrap();
        assert!(out.status.success(), "{flag}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let rest = text
            .trim_end()
            .strip_prefix(&format!("pixgate {} (", env!("CARGO_PKG_VERSION")))
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{flag} printed {text:?}"));
        // What build.rs takes: $GIT_COMMIT, else the checkout's HEAD.
        let expected = match std::env::var("GIT_COMMIT") {
            Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
            _ => Command::new("git")
                .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map_or_else(|| "unknown".to_string(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string()),
        };
        assert_eq!(rest, expected, "{flag} printed {text:?}");
    }
}
