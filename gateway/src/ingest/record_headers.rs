//! A record's headers read as bytes, whatever bytes their keys are.
//!
//! A Kafka header key is a string on the wire with no encoding checked by the broker: a Go
//! client (sarama, franz-go) or librdkafka's C API writes any bytes there. rdkafka's
//! `Headers::iter` and `try_get` turn each key into a `&str` with `unwrap`, so a record with
//! one key that is not UTF-8 would panic the consumer, and panic it again after each
//! restart, since its offset is never stored. The keys are read here through librdkafka's
//! own `rd_kafka_header_get_all` instead, as the bytes they are.

use rdkafka::bindings::{rd_kafka_header_get_all, rd_kafka_headers_t, rd_kafka_resp_err_t};
use rdkafka::message::{BorrowedHeaders, Headers, OwnedHeaders};
use std::ffi::CStr;

/// A message's header collection, as librdkafka holds it.
pub trait NativeHeaders: Headers {
    /// The headers as rdkafka's zero-copy view of librdkafka's `rd_kafka_headers_t`.
    fn borrowed(&self) -> &BorrowedHeaders;
}

impl NativeHeaders for BorrowedHeaders {
    fn borrowed(&self) -> &BorrowedHeaders {
        self
    }
}

impl NativeHeaders for OwnedHeaders {
    fn borrowed(&self) -> &BorrowedHeaders {
        self.as_borrowed()
    }
}

/// The first header of `headers` whose key (bytes, not necessarily UTF-8) `matches`:
/// `Some(value)`, the value `None` for a header sent with a null value; `None` when no key
/// matches.
pub fn find(headers: &impl NativeHeaders, matches: impl Fn(&[u8]) -> bool) -> Option<Option<&[u8]>> {
    let borrowed = headers.borrowed();
    // rdkafka's `BorrowedHeaders` is a zero-sized view whose address is librdkafka's
    // `rd_kafka_headers_t` (its own `as_native_ptr` is this cast).
    let native = std::ptr::from_ref(borrowed).cast::<rd_kafka_headers_t>();
    for idx in 0..borrowed.count() {
        let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0usize);
        // SAFETY: `native` is a live header list for as long as `headers` is borrowed, and
        // `idx` is below its count; librdkafka only writes the three out-pointers.
        let err = unsafe { rd_kafka_header_get_all(native, idx, &mut name, &mut value, &mut size) };
        if err != rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka's header names are NUL-terminated and live with the list.
        let key = unsafe { CStr::from_ptr(name) }.to_bytes();
        if !matches(key) {
            continue;
        }
        if value.is_null() {
            return Some(None);
        }
        // SAFETY: `value` points at `size` bytes owned by the list, borrowed as `headers`.
        return Some(Some(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::bindings::rd_kafka_header_add;

    /// A header list as a non-Rust producer sends it: its first key not UTF-8.
    fn headers_with_raw_key() -> OwnedHeaders {
        let mut h = OwnedHeaders::new();
        let raw_key: &[u8] = b"x-\xff\xfe";
        let native = std::ptr::from_ref(h.as_borrowed()).cast_mut().cast::<rd_kafka_headers_t>();
        // SAFETY: `native` is the live list `h` owns; the name and value are copied in.
        let err = unsafe {
            rd_kafka_header_add(native, raw_key.as_ptr().cast(), raw_key.len() as isize, b"v".as_ptr().cast(), 1)
        };
        assert_eq!(err, rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        h = h.insert(rdkafka::message::Header { key: "traceparent", value: Some("t") });
        h.insert(rdkafka::message::Header { key: "empty", value: None::<&[u8]> })
    }

    #[test]
    fn a_key_that_is_not_utf8_is_read_as_bytes() {
        let h = headers_with_raw_key();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.iter().count()));
        assert!(panicked.is_err(), "rdkafka's own iterator panics on this key");
        assert_eq!(find(&h, |k| k == b"x-\xff\xfe"), Some(Some(&b"v"[..])));
        assert_eq!(find(&h, |k| k.eq_ignore_ascii_case(b"TRACEPARENT")), Some(Some(&b"t"[..])));
        assert_eq!(find(&h, |k| k == b"empty"), Some(None), "a header with a null value");
        assert_eq!(find(&h, |k| k == b"absent"), None);
    }
}
