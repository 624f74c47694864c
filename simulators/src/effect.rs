//! What a simulated device leaves behind when it carries out a job: a picture on disk, a
//! transcript line and an [`EffectRecord`], or a [`JobError`] that becomes a `failed` ack.

use device_protocol::{EffectKind, Job};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One job a device carried out (printed or shown), in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectRecord {
    /// Device registry id.
    pub device: String,
    /// What was done (`display_qr`, `payment_confirmed`, `print_receipt`, `charge_expired`).
    pub kind: EffectKind,
    /// The charge's `_id`.
    pub charge: String,
    /// The job's message id.
    pub message_id: String,
    /// The job's per-device sequence number.
    pub seq: u64,
    /// The PNG written for it.
    pub file: String,
}

/// Why a job was not carried out; becomes an ack with `result: failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// Human-readable reason for the ack.
    pub reason: String,
    /// A permanent failure (undecodable, wrong content type, expired) must not be retried.
    pub permanent: bool,
}

impl JobError {
    /// A failure that retrying cannot fix.
    pub fn permanent(reason: impl Into<String>) -> Self {
        JobError { reason: reason.into(), permanent: true }
    }

    /// A failure that may go away (disk full, …).
    pub fn transient(reason: impl Into<String>) -> Self {
        JobError { reason: reason.into(), permanent: false }
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.reason, if self.permanent { "permanent" } else { "transient" })
    }
}

impl std::error::Error for JobError {}

/// The payload bytes of `job` for a device that takes `content_type` (`device` names it in
/// the error).
///
/// # Errors
/// Permanent: another content type, or a payload that is not base64.
pub fn payload_for(job: &Job, content_type: &str, device: &str) -> Result<Vec<u8>, JobError> {
    if job.content_type != content_type {
        return Err(JobError::permanent(format!("{device} cannot handle content type {:?}", job.content_type)));
    }
    job.payload_bytes().map_err(|e| JobError::permanent(format!("payload is not base64: {e}")))
}

/// Keeps `[A-Za-z0-9_-]` of an id so it is safe in a file name (never empty).
pub fn file_safe(s: &str) -> String {
    let t: String = s.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').take(64).collect();
    if t.is_empty() {
        "unknown".into()
    } else {
        t
    }
}

/// `{dir}/{seq:04}-{kind}-{charge_id}.png`: where the picture of `job` goes.
pub fn png_path(dir: &Path, job: &Job) -> PathBuf {
    dir.join(format!("{:04}-{}-{}.png", job.seq, job.kind.as_str(), file_safe(&job.charge_id)))
}

/// Writes `bytes` to `path` (creating parent directories).
///
/// # Errors
/// I/O failures, as transient [`JobError`]s.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), JobError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| JobError::transient(format!("mkdir {}: {e}", parent.display())))?;
    }
    std::fs::write(path, bytes).map_err(|e| JobError::transient(format!("write {}: {e}", path.display())))
}

/// Appends `text` to `{dir}/transcript.txt` (a newline is added if missing).
///
/// # Errors
/// I/O failures, as transient [`JobError`]s.
pub fn append_transcript(dir: &Path, text: &str) -> Result<(), JobError> {
    std::fs::create_dir_all(dir).map_err(|e| JobError::transient(format!("mkdir {}: {e}", dir.display())))?;
    let path = dir.join("transcript.txt");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| JobError::transient(format!("open {}: {e}", path.display())))?;
    let mut t = text.to_string();
    if !t.ends_with('\n') {
        t.push('\n');
    }
    f.write_all(t.as_bytes()).map_err(|e| JobError::transient(format!("append {}: {e}", path.display())))
}

/// The header line written before each job in a transcript.
pub fn transcript_header(job: &Job) -> String {
    format!(
        "===== seq {:04} {} charge {} message {} event {} =====",
        job.seq,
        job.kind.as_str(),
        job.charge_id,
        job.message_id,
        job.event_id
    )
}
