//! The reprint header: a job that may already have printed (pixgate crashed, or the
//! connection dropped, while writing it) is printed again under a header line, so the
//! second copy never passes for a second original.
//!
//! The header is pt-BR's "2ª VIA / REIMPRESSÃO" (second copy / reprint), centred and bold,
//! encoded in the receipt's code page and placed right after the receipt's own `ESC @`
//! `ESC t n` (initialize, select the code page), where that table is in force.

use render::codepage::CodePage;

/// The header's text.
pub const HEADER: &str = "2ª VIA / REIMPRESSÃO";

/// `job` with the reprint header in `code_page` after its leading `ESC @ ESC t n`, or
/// first when it does not start so.
pub fn with_header(job: &[u8], code_page: CodePage) -> Vec<u8> {
    let at = if job.len() >= 5 && job[..2] == [0x1B, 0x40] && job[2..4] == [0x1B, 0x74] { 5 } else { 0 };
    let mut out = Vec::with_capacity(job.len() + 64);
    out.extend_from_slice(&job[..at]);
    // ESC a 1 (centre), ESC E 1 (bold), the line, ESC E 0, ESC a 0 (left).
    out.extend_from_slice(&[0x1B, 0x61, 0x01, 0x1B, 0x45, 0x01]);
    code_page.encode_lossy_into(HEADER, &mut out);
    out.extend_from_slice(&[0x0A, 0x1B, 0x45, 0x00, 0x1B, 0x61, 0x00]);
    out.extend_from_slice(&job[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header sits after the receipt's code page selection, in that code page: CP860
    /// has `ª` at 0xA6 and `Ã` at 0x8E (decoded back to check).
    #[test]
    fn the_header_follows_the_code_page_selection_in_that_code_page() {
        let job = [0x1B, 0x40, 0x1B, 0x74, 0x03, b'h', b'i', 0x0A];
        let out = with_header(&job, CodePage::Cp860);
        assert_eq!(&out[..5], &job[..5]);
        assert_eq!(&out[out.len() - 3..], b"hi\n");
        let text = CodePage::Cp860.decode(&out[11..out.len() - 10]);
        assert_eq!(text, HEADER);
        assert!(out[11..].starts_with(&[b'2', 0xA6]), "ª in CP860");
        let bare = with_header(b"xy", CodePage::Cp860);
        assert_eq!(&bare[..3], &[0x1B, 0x61, 0x01], "first when there is no ESC @ ESC t");
        assert!(bare.ends_with(b"xy"));
    }
}
