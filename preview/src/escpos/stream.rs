//! An ESC/POS stream arriving in pieces (TCP segments, serial reads), split into whole
//! commands as it comes, so that a printer on a byte transport can answer each `DLE EOT n`
//! the moment its last byte arrives and knows where a job ends (at a cut).
//!
//! A command counts once all its bytes are there: the [`Parser`] is run on what has
//! arrived, and a command it could only read short (a length field pointing past the
//! bytes received, a `GS k` without its NUL yet) waits for more. `DLE EOT` is therefore
//! recognised only between commands, never inside another command's data (a QR raster can
//! hold the bytes `10 04 01`). That is how Epson asks hosts to use it; a real printer may
//! also answer such a run inside image data (Epson ESC/POS Command Reference, `DLE EOT`).

use super::parser::{Command, Parser};
use super::Warnings;

/// What the stream said that needs an action now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// `DLE EOT n`: answer with one status byte ([`super::status::dle_eot_reply`]).
    StatusRequest(u8),
    /// A job ended with a cut (`GS V`, `ESC i`, `ESC m`): its bytes, from the end of the
    /// previous job through the cut command.
    Job(Vec<u8>),
}

/// Bytes of a job without a cut after which the scanner ends it anyway (a stream that
/// never cuts must not grow memory without bound): 16 MiB.
pub const MAX_JOB_BYTES: usize = 16 << 20;

/// Splits a stream into whole commands as it arrives (see the module documentation).
#[derive(Debug, Default)]
pub struct StreamScanner {
    /// Bytes of the current job, complete commands first, then an incomplete tail.
    buf: Vec<u8>,
    /// Length of the prefix of `buf` that is whole commands.
    parsed: usize,
    /// Whether a command other than a status request was parsed since the last job.
    content: bool,
}

impl StreamScanner {
    /// A scanner at the start of a stream.
    pub fn new() -> Self {
        StreamScanner::default()
    }

    /// Takes the next piece of the stream; returns, in stream order, the status requests
    /// and the jobs it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<StreamEvent> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        loop {
            let rest = &self.buf[self.parsed..];
            if rest.is_empty() {
                break;
            }
            let mut warnings = Warnings::default();
            let mut parser = Parser::new(rest);
            let cmd = parser.next_command(&mut warnings);
            let end = parser.offset();
            // Read short: the parser warned and stopped at the end of what has arrived.
            let short = cmd.is_none() || (!warnings.is_empty() && end == rest.len());
            if short {
                break;
            }
            let action = match cmd {
                Some(Command::StatusRequest(n)) => Some(StreamEvent::StatusRequest(n)),
                Some(Command::Cut { .. }) => Some(StreamEvent::Job(Vec::new())),
                _ => None,
            };
            self.parsed += end;
            self.content |= !matches!(action, Some(StreamEvent::StatusRequest(_)));
            match action {
                Some(StreamEvent::Job(_)) => events.push(StreamEvent::Job(self.take_parsed())),
                Some(e) => events.push(e),
                None => {}
            }
        }
        if self.buf.len() > MAX_JOB_BYTES {
            events.push(StreamEvent::Job(self.finish()));
        }
        events
    }

    /// Ends the stream (connection closed, line idle): everything received since the last
    /// job, including an incomplete command at the end, which the decoder reports.
    pub fn finish(&mut self) -> Vec<u8> {
        self.parsed = 0;
        self.content = false;
        std::mem::take(&mut self.buf)
    }

    /// Whether the current job has begun: a command other than a status request arrived
    /// since the last job.
    pub fn has_content(&self) -> bool {
        self.content
    }

    /// Whether bytes since the last job are waiting.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn take_parsed(&mut self) -> Vec<u8> {
        let job: Vec<u8> = self.buf.drain(..self.parsed).collect();
        self.parsed = 0;
        self.content = false;
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Status requests alone do not begin a job; the first other command does, and the
    /// job's end (a cut) or the stream's resets it.
    #[test]
    fn a_job_begins_with_its_first_command_that_is_not_a_status_request() {
        let mut s = StreamScanner::new();
        s.push(b"\x10\x04\x01\x10\x04\x04");
        assert!(!s.has_content(), "queries only");
        s.push(b"\x1b@Hello");
        assert!(s.has_content());
        s.push(b"\n\x1dVA\x03");
        assert!(!s.has_content(), "cut: the job is over");
        s.push(b"\x1b@");
        s.finish();
        assert!(!s.has_content(), "stream over");
    }

    /// Everything, one byte at a time: the same events as all at once.
    fn bytewise(bytes: &[u8]) -> Vec<StreamEvent> {
        let mut s = StreamScanner::new();
        bytes.iter().flat_map(|b| s.push(std::slice::from_ref(b))).collect()
    }

    #[test]
    fn status_requests_between_commands_and_jobs_at_cuts() {
        let mut stream = b"\x1b@Hello\n\x10\x04\x01World\n\x1dVA\x03".to_vec();
        stream.extend_from_slice(b"\x10\x04\x04Second\n\x1dV\x00tail");
        let first = stream[..stream.iter().position(|&b| b == 0x56).unwrap() + 3].to_vec();
        let want = vec![
            StreamEvent::StatusRequest(1),
            StreamEvent::Job(first.clone()),
            StreamEvent::StatusRequest(4),
            StreamEvent::Job(b"\x10\x04\x04Second\n\x1dV\x00".to_vec()),
        ];
        let mut s = StreamScanner::new();
        assert_eq!(s.push(&stream), want);
        assert_eq!(s.finish(), b"tail");
        assert_eq!(bytewise(&stream), want);
    }

    /// `10 04 01` inside raster data or a QR store is data, not a request; it is not
    /// answered even when the image arrives in pieces.
    #[test]
    fn dle_eot_bytes_inside_image_data_are_not_requests() {
        let mut stream = vec![0x1D, 0x76, 0x30, 0x00, 0x03, 0x00, 0x02, 0x00];
        stream.extend_from_slice(&[0x10, 0x04, 0x01, 0x10, 0x04, 0x02]);
        stream.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x06, 0x00, 0x31, 0x50, 0x30, 0x10, 0x04, 0x03]);
        stream.extend_from_slice(&[0x10, 0x04, 0x02]);
        for cut in 0..stream.len() {
            let mut s = StreamScanner::new();
            let mut ev = s.push(&stream[..cut]);
            ev.extend(s.push(&stream[cut..]));
            assert_eq!(ev, [StreamEvent::StatusRequest(2)], "split at {cut}");
        }
    }

    #[test]
    fn a_status_request_split_across_reads_is_answered_when_whole() {
        let mut s = StreamScanner::new();
        assert!(s.push(&[0x10]).is_empty());
        assert!(s.push(&[0x04]).is_empty());
        assert_eq!(s.push(&[0x03]), [StreamEvent::StatusRequest(3)]);
        assert!(!s.is_empty(), "the request stays part of the job's bytes");
    }
}
