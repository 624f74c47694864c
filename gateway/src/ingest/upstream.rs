//! What pixgate reads from a Kafka record besides its value: whether it is a tombstone,
//! and the W3C trace context a producer may have put in its headers.
//!
//! The upstream is any Kafka producer, configured as its owner likes: the codec (gzip,
//! snappy, lz4, zstd) is librdkafka's business (all four are built in), headers are
//! accepted and ignored except `traceparent`, and a null value is a tombstone.
//!
//! - A **tombstone** (`payload() == None`; an empty value is not one) is the marker a
//!   compacted topic keeps for a deleted key. The capture job's deletes are change events
//!   with an envelope (`operationType: delete`), so on either topic a tombstone means
//!   nothing: it is ignored with reason `tombstone` (`/stats` `ignored`), never
//!   dead-lettered, and its offset is stored like any finished record's.
//! - A **`traceparent`** header (W3C Trace Context, version `00`:
//!   `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lowercase) is carried into
//!   the log lines about the record's effects (a `record` span with `trace_id`, and the
//!   "record's effects accepted" line). A malformed one is ignored with a debug log line:
//!   tracing is the producer's convenience, not part of the event contract.

use crate::ingest::record_headers::{self, NativeHeaders};
use rdkafka::message::Message;
use std::fmt;

/// Whether `m` is a tombstone: its value is null (an empty value is not one).
pub fn is_tombstone(m: &impl Message) -> bool {
    m.payload().is_none()
}

/// A W3C trace context (`traceparent`, version `00`), as read from a record's headers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace id: 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// The parent (span) id: 16 lowercase hex digits, not all zero.
    pub parent_id: String,
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// Why a `traceparent` header was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceParentError {
    /// The value is not UTF-8 text.
    #[error("traceparent is not UTF-8")]
    NotText,
    /// The value is not `00-<32 hex>-<16 hex>-<2 hex>`.
    #[error("traceparent {0:?} is not 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>")]
    Shape(String),
    /// An all-zero trace id or parent id, which W3C Trace Context declares invalid.
    #[error("traceparent {0:?} has an all-zero trace id or parent id")]
    Zero(String),
}

impl TraceParent {
    /// Parses a `traceparent` value.
    ///
    /// # Errors
    /// [`TraceParentError`]: not text, not the version-00 shape, or an all-zero id.
    pub fn parse(value: &[u8]) -> Result<TraceParent, TraceParentError> {
        let text = std::str::from_utf8(value).map_err(|_| TraceParentError::NotText)?;
        let shape = || TraceParentError::Shape(text.chars().take(80).collect());
        let parts: Vec<&str> = text.split('-').collect();
        let hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let [version, trace, parent, flags] = parts.as_slice() else { return Err(shape()) };
        if *version != "00" || !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) {
            return Err(shape());
        }
        if trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0') {
            return Err(TraceParentError::Zero(text.to_string()));
        }
        let flags = u8::from_str_radix(flags, 16).map_err(|_| shape())?;
        Ok(TraceParent { trace_id: (*trace).to_string(), parent_id: (*parent).to_string(), flags })
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", self.trace_id, self.parent_id, self.flags)
    }
}

/// The record's `traceparent` header (the name compared without regard to ASCII case, the
/// first one if several), if it has a well-formed one; a malformed one is logged at debug
/// level and ignored. Every other header is ignored, whatever bytes its key is
/// ([`record_headers`]).
pub fn trace_parent<M: Message>(m: &M) -> Option<TraceParent>
where
    M::Headers: NativeHeaders,
{
    let headers = m.headers()?;
    let value = record_headers::find(headers, |k| k.eq_ignore_ascii_case(b"traceparent"))?;
    match TraceParent::parse(value.unwrap_or_default()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::debug!(topic = m.topic(), partition = m.partition(), offset = m.offset(), error = %e, "malformed traceparent header ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn message(value: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)]) -> OwnedMessage {
        let mut h = OwnedHeaders::new();
        for (key, value) in headers {
            h = h.insert(Header { key, value: *value });
        }
        OwnedMessage::new(
            value.map(<[u8]>::to_vec),
            Some(b"k".to_vec()),
            "charge.upserted".into(),
            Timestamp::NotAvailable,
            0,
            7,
            (!headers.is_empty()).then_some(h),
        )
    }

    #[test]
    fn a_null_value_is_a_tombstone_and_an_empty_one_is_not() {
        assert!(is_tombstone(&message(None, &[])));
        assert!(!is_tombstone(&message(Some(b""), &[])));
        assert!(!is_tombstone(&message(Some(b"{}"), &[])));
    }

    /// librdkafka is built with every codec a producer may use (the workspace's rdkafka
    /// features): a batch compressed with any of them can be read.
    #[test]
    fn librdkafka_has_every_codec_built_in() {
        let conf = rdkafka::ClientConfig::new().create_native_config().unwrap();
        let features = conf.get("builtin.features").unwrap();
        for codec in ["gzip", "snappy", "lz4", "zstd"] {
            assert!(features.split(',').any(|f| f == codec), "{codec} not in builtin.features {features}");
        }
    }

    #[test]
    fn parses_the_w3c_example_and_prints_it_back() {
        let t = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id, "00f067aa0ba902b7");
        assert_eq!(t.flags, 1);
        assert_eq!(t.to_string(), GOOD);
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(matches!(TraceParent::parse(bad.as_bytes()), Err(TraceParentError::Shape(_))), "{bad:?}");
        }
        assert!(matches!(
            TraceParent::parse(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Err(TraceParentError::Zero(_))
        ));
        assert!(matches!(
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            Err(TraceParentError::Zero(_))
        ));
        assert_eq!(TraceParent::parse(b"\xff\xfe"), Err(TraceParentError::NotText));
    }

    #[test]
    fn finds_traceparent_among_other_headers_and_ignores_a_bad_one() {
        let m = message(
            Some(b"{}"),
            &[("source", Some(b"capture")), ("TraceParent", Some(GOOD.as_bytes())), ("empty", None)],
        );
        assert_eq!(trace_parent(&m).map(|t| t.trace_id), Some("4bf92f3577b34da6a3ce929d0e0e4736".to_string()));
        assert_eq!(trace_parent(&message(Some(b"{}"), &[("traceparent", Some(b"not-a-trace"))])), None);
        assert_eq!(trace_parent(&message(Some(b"{}"), &[("traceparent", None)])), None);
        assert_eq!(trace_parent(&message(Some(b"{}"), &[])), None);
    }
}
