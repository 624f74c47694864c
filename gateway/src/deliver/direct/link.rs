//! An open connection to a direct printer: bytes written in chunks under a deadline, and
//! the `DLE EOT` status asked and read back.
//!
//! Blocking I/O (a serial line is a file descriptor; `serialport` is blocking): call it
//! from a thread of its own or `spawn_blocking`.

use super::status::{PrinterStatus, QUERIES};
use crate::model::endpoint::{Endpoint, SerialSettings};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Bytes written at a time: small enough that a printer's flow control (RTS/CTS, XON/XOFF,
/// a full TCP window) stops the next write rather than a megabyte already in the kernel.
pub const CHUNK_BYTES: usize = 4096;

/// What went wrong talking to a printer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// It could not be opened (refused, unreachable, no such device, busy).
    #[error("opening {endpoint}: {source}")]
    Open {
        /// Where.
        endpoint: String,
        /// Why.
        source: std::io::Error,
    },
    /// A write failed (the connection dropped, the device was unplugged).
    #[error("writing to {endpoint}: {source}")]
    Write {
        /// Where.
        endpoint: String,
        /// Why.
        source: std::io::Error,
    },
    /// A write made no progress for the write timeout (flow control held, printer busy).
    #[error("writing to {endpoint}: stalled for {waited_ms} ms with {left} bytes left")]
    Stalled {
        /// Where.
        endpoint: String,
        /// How long, ms.
        waited_ms: u64,
        /// Bytes not written.
        left: usize,
    },
}

/// A connection to one printer.
pub struct Link {
    endpoint: Endpoint,
    io: Box<dyn ReadWrite>,
}

/// Read and write (a `TcpStream`, a serial port, a device file), and drop what was
/// received and not read.
pub trait ReadWrite: Read + Write + Send {
    /// Drops the bytes received and not read yet, without waiting for more.
    ///
    /// # Errors
    /// The transport's own.
    fn discard_input(&mut self) -> std::io::Result<()>;
}

/// Most bytes [`ReadWrite::discard_input`] reads off a TCP printer: one that keeps sending
/// (Automatic Status Back) is not read for ever.
const DISCARD_MAX: usize = 4096;

impl ReadWrite for std::net::TcpStream {
    fn discard_input(&mut self) -> std::io::Result<()> {
        self.set_nonblocking(true)?;
        let mut buf = [0u8; 256];
        let mut dropped = 0;
        let read = loop {
            match self.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    dropped += n;
                    if dropped >= DISCARD_MAX {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.set_nonblocking(false)?;
        read
    }
}

impl ReadWrite for Box<dyn serialport::SerialPort> {
    fn discard_input(&mut self) -> std::io::Result<()> {
        self.clear(serialport::ClearBuffer::Input).map_err(std::io::Error::from)
    }
}

impl ReadWrite for WriteOnly {
    fn discard_input(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A USB line printer is written only: reading gives nothing.
struct WriteOnly(std::fs::File);

impl Read for WriteOnly {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "a USB line printer is written only"))
    }
}

impl Write for WriteOnly {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

fn serial(s: &SerialSettings, timeout: Duration) -> serialport::Result<Box<dyn serialport::SerialPort>> {
    use serialport::{DataBits, FlowControl, Parity, StopBits};
    let data_bits = match s.data_bits {
        5 => DataBits::Five,
        6 => DataBits::Six,
        7 => DataBits::Seven,
        _ => DataBits::Eight,
    };
    let parity = match s.parity.as_str() {
        "odd" => Parity::Odd,
        "even" => Parity::Even,
        _ => Parity::None,
    };
    let stop_bits = if s.stop_bits == 2 { StopBits::Two } else { StopBits::One };
    let flow = match s.flow.as_str() {
        "rtscts" => FlowControl::Hardware,
        "xonxoff" => FlowControl::Software,
        _ => FlowControl::None,
    };
    serialport::new(&s.path, s.baud)
        .data_bits(data_bits)
        .parity(parity)
        .stop_bits(stop_bits)
        .flow_control(flow)
        .timeout(timeout)
        .open()
}

impl Link {
    /// Opens `endpoint`; reads and writes each wait at most `timeout`.
    ///
    /// # Errors
    /// [`LinkError::Open`].
    pub fn open(endpoint: &Endpoint, timeout: Duration) -> Result<Link, LinkError> {
        let err = |source| LinkError::Open { endpoint: endpoint.to_string(), source };
        let io: Box<dyn ReadWrite> = match endpoint {
            Endpoint::Tcp { host, port } => {
                use std::net::ToSocketAddrs;
                let addr =
                    (host.as_str(), *port).to_socket_addrs().map_err(err)?.next().ok_or_else(|| {
                        err(std::io::Error::new(std::io::ErrorKind::NotFound, "the host has no address"))
                    })?;
                let s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(err)?;
                s.set_read_timeout(Some(timeout)).map_err(err)?;
                s.set_write_timeout(Some(timeout)).map_err(err)?;
                let _ = s.set_nodelay(true);
                Box::new(s)
            }
            Endpoint::Serial(s) => Box::new(serial(s, timeout).map_err(|e| err(e.into()))?),
            Endpoint::Usb { path } => {
                Box::new(WriteOnly(std::fs::OpenOptions::new().write(true).open(path).map_err(err)?))
            }
        };
        Ok(Link { endpoint: endpoint.clone(), io })
    }

    /// Where it is connected.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Asks `DLE EOT` n = 1..4, one at a time, each reply waited for up to the link's
    /// timeout. `None` for a transport that cannot answer (USB). Bytes waiting before each
    /// query are dropped: a reply has no mark of the query it answers, so one that came
    /// after its timeout would otherwise be read as the next query's, and every reply
    /// after it one query late for as long as the connection lasts (paper near end read
    /// as offline, the drawer as an open cover).
    ///
    /// # Errors
    /// A write failed: the printer is gone.
    pub fn status(&mut self) -> Result<Option<PrinterStatus>, LinkError> {
        if !self.endpoint.answers_status() {
            return Ok(None);
        }
        let mut replies = [None; 4];
        for (i, n) in QUERIES.into_iter().enumerate() {
            if let Err(e) = self.io.discard_input() {
                tracing::debug!(endpoint = %self.endpoint, error = %e, "cannot drop the printer's unread bytes");
            }
            self.io
                .write_all(&[0x10, 0x04, n])
                .and_then(|()| self.io.flush())
                .map_err(|source| LinkError::Write { endpoint: self.endpoint.to_string(), source })?;
            let mut b = [0u8; 1];
            // A read error or timeout is "no reply": the printer has no such sensor, or is
            // switched off; the caller decides from the whole status.
            replies[i] = match self.io.read(&mut b) {
                Ok(1) => Some(b[0]),
                _ => None,
            };
        }
        Ok(Some(PrinterStatus::decode(replies)))
    }

    /// Writes `bytes` in chunks of [`CHUNK_BYTES`]; gives up when no byte could be written
    /// for `stall` (the printer's flow control held the line).
    ///
    /// # Errors
    /// [`LinkError::Write`] (gone), [`LinkError::Stalled`].
    pub fn write_job(&mut self, bytes: &[u8], stall: Duration) -> Result<(), LinkError> {
        let mut at = 0;
        let mut progress = Instant::now();
        while at < bytes.len() {
            let end = (at + CHUNK_BYTES).min(bytes.len());
            match self.io.write(&bytes[at..end]) {
                Ok(0) => {
                    let source = std::io::Error::new(std::io::ErrorKind::WriteZero, "the printer took nothing");
                    return Err(LinkError::Write { endpoint: self.endpoint.to_string(), source });
                }
                Ok(n) => {
                    at += n;
                    progress = Instant::now();
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    if progress.elapsed() >= stall {
                        let waited_ms = progress.elapsed().as_millis() as u64;
                        return Err(LinkError::Stalled {
                            endpoint: self.endpoint.to_string(),
                            waited_ms,
                            left: bytes.len() - at,
                        });
                    }
                }
                Err(source) => return Err(LinkError::Write { endpoint: self.endpoint.to_string(), source }),
            }
        }
        self.io.flush().map_err(|source| LinkError::Write { endpoint: self.endpoint.to_string(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP printer that answers the first `DLE EOT` after the link's timeout: that round
    /// may read its reply as the next query's, but the rounds after it read each reply
    /// against its own query.
    #[test]
    fn a_late_status_reply_does_not_shift_the_rounds_after_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // Says each reply it wrote, so that the test knows when all are on their way.
        let (answered, replies) = std::sync::mpsc::channel();
        let printer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Each reply sent as it is written (no Nagle hold behind an unacknowledged one).
            s.set_nodelay(true).unwrap();
            let (mut first, mut held) = (true, None);
            let mut q = [0u8; 3];
            while s.read_exact(&mut q).is_ok() {
                assert_eq!(&q[..2], &[0x10, 0x04]);
                // n = 1 answers "online" with bit 2 set (the drawer), which read as n = 2's
                // reply is an open cover; the others answer all clear.
                let reply = if q[2] == 1 { 0x16 } else { 0x12 };
                if std::mem::take(&mut first) {
                    // Answered only once the next query came: after its timeout, however
                    // busy the machine.
                    held = Some(reply);
                    continue;
                }
                for r in held.take().into_iter().chain([reply]) {
                    if s.write_all(&[r]).is_err() || answered.send(()).is_err() {
                        return;
                    }
                }
            }
        });
        // Rounds come `direct.poll_ms` apart, not back to back: by the next one, the
        // printer has answered every query of the round before.
        let all_answered = || {
            for _ in 0..4 {
                replies.recv_timeout(Duration::from_secs(30)).expect("the printer answers each query");
            }
        };
        let endpoint = Endpoint::Tcp { host: "127.0.0.1".into(), port };
        let mut link = Link::open(&endpoint, Duration::from_millis(200)).unwrap();
        let first = link.status().unwrap().unwrap();
        assert_eq!(first.replies[0], None, "the late reply timed out: {first:?}");
        all_answered();
        for round in 0..3 {
            let s = link.status().unwrap().unwrap();
            all_answered();
            assert_eq!(s.replies, [Some(0x16), Some(0x12), Some(0x12), Some(0x12)], "round {round}");
            assert!(s.can_print() && !s.cover_open, "round {round}: {s:?}");
        }
        drop(link);
        printer.join().unwrap();
    }
}
