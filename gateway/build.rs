//! Sets `PIXGATE_GIT_COMMIT` for `pixgate --version`: `$GIT_COMMIT` when the build is given
//! one (a build from a source archive, a container build without `.git`), else the short
//! hash of the checkout's `HEAD`, else `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GIT_COMMIT");
    // Without any rerun-if-changed line cargo runs this again at every change in the
    // package; with one, only when a listed file changes.
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let commit = match std::env::var("GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => {
            // A new commit moves `HEAD` (detached) or the branch it points to, loose or
            // packed; in a worktree `HEAD` is in the worktree's git folder and the refs in
            // the common one. Only files that exist are listed: cargo reruns the script at
            // every build for a listed file that is missing.
            if let (Some(git_dir), Some(common)) =
                (git(&dir, &["rev-parse", "--git-dir"]), git(&dir, &["rev-parse", "--git-common-dir"]))
            {
                let (git_dir, common) = (dir.join(git_dir), dir.join(common));
                let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
                if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
                    watched.push(common.join(branch));
                }
                for f in watched.iter().filter(|f| f.is_file()) {
                    println!("cargo:rerun-if-changed={}", f.display());
                }
            }
            git(&dir, &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=PIXGATE_GIT_COMMIT={commit}");
}
