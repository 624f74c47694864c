//! A device's TLS connection on rustls's unbuffered API, its buffers let go while it is
//! idle.
//!
//! rustls's buffered connection (what `tokio_rustls` wraps) keeps a receive buffer of at
//! least 4 KiB for the connection's whole life: 40 MiB for 10,000 idle devices, a quarter
//! of what each held. Here the TLS bytes read, the TLS bytes to write and the plaintext not
//! yet read are this stream's own buffers: each is allocated while it holds something
//! and freed once the device is idle again (nothing to read, everything sent).
//!
//! The TLS protocol is rustls's ([`UnbufferedServerConnection`], RFC 8446 and RFC 5246);
//! this file only moves its records between the socket and the buffers.

use rustls::server::{ServerConfig, UnbufferedServerConnection};
use rustls::unbuffered::{AppDataRecord, ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use rustls::CommonState;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Room made for each read from the socket, bytes.
const READ_ROOM: usize = 4096;

/// Most TLS bytes held while a record or handshake message is incomplete, bytes: the
/// bound rustls's buffered connection puts on handshake data (64 KiB: a client's
/// certificate chain) and a record's header.
const MAX_INCOMING: usize = 0x1_0000 + 5;

/// Most plaintext taken into one `poll_write`, bytes: four full TLS records.
const MAX_WRITE: usize = 4 * 16_384;

/// What the TLS records processed so far leave to do.
enum Next {
    /// More TLS bytes from the peer are needed (the handshake is blocked on them, or
    /// everything received is processed).
    Read,
    /// `n` bytes of the plaintext given were encrypted into the outgoing buffer.
    Encrypted(usize),
    /// Both sides sent close_notify.
    Closed,
}

/// A server-side TLS stream over a TCP socket ([`accept`]), read and written from one task
/// (a device's session, through [`tokio::io::split`]'s halves).
pub struct TlsStream {
    io: TcpStream,
    conn: UnbufferedServerConnection,
    /// TLS bytes read and not yet processed: `incoming[..used]`.
    incoming: Vec<u8>,
    used: usize,
    /// TLS bytes to send: `outgoing[sent..]`.
    outgoing: Vec<u8>,
    sent: usize,
    /// Decrypted bytes not yet read: `plaintext[taken..]`.
    plaintext: Vec<u8>,
    taken: usize,
    /// The peer closed its side (close_notify, or the socket's end).
    read_closed: bool,
    /// close_notify is queued.
    close_queued: bool,
    /// The session failed, and why (a TLS error): rustls is not called again, its alert
    /// is queued.
    failed: Option<String>,
}

fn tls_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Appends to `out` what `write` puts into a buffer: `room` bytes are offered first, then
/// the size rustls says it needs (`needed`); on an error `out` is left as it was.
fn append<E>(
    out: &mut Vec<u8>,
    room: usize,
    needed: impl Fn(&E) -> Option<usize>,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, E>,
) -> Result<(), E> {
    let at = out.len();
    out.resize(at + room, 0);
    let mut written = write(&mut out[at..]);
    if let Some(size) = written.as_ref().err().and_then(&needed) {
        out.resize(at + size, 0);
        written = write(&mut out[at..]);
    }
    match written {
        Ok(n) => {
            out.truncate(at + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(at);
            Err(e)
        }
    }
}

/// The room an encoding asked for, if that is why it failed.
fn encode_room(e: &EncodeError) -> Option<usize> {
    match e {
        EncodeError::InsufficientSize(e) => Some(e.required_size),
        _ => None,
    }
}

/// The room an encryption asked for, if that is why it failed.
fn encrypt_room(e: &EncryptError) -> Option<usize> {
    match e {
        EncryptError::InsufficientSize(e) => Some(e.required_size),
        _ => None,
    }
}

/// Runs the TLS handshake of `io` as the server `config` describes.
///
/// # Errors
/// A socket error, the peer closing during the handshake, or a TLS error (a bad
/// certificate, a protocol violation; the peer is sent the alert rustls chose).
pub async fn accept(io: TcpStream, config: Arc<ServerConfig>) -> io::Result<TlsStream> {
    let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
    let mut stream = TlsStream {
        io,
        conn,
        incoming: Vec::new(),
        used: 0,
        outgoing: Vec::new(),
        sent: 0,
        plaintext: Vec::new(),
        taken: 0,
        read_closed: false,
        close_queued: false,
        failed: None,
    };
    std::future::poll_fn(|cx| stream.poll_handshake(cx)).await?;
    Ok(stream)
}

impl TlsStream {
    /// The TLS session's state: the peer's certificates, the version and suite agreed.
    pub fn session(&self) -> &CommonState {
        &self.conn
    }

    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let next = match self.process(None) {
                Ok(next) => next,
                Err(e) => {
                    // The alert for the peer goes out if the socket takes it at once.
                    let _ = self.poll_send(cx);
                    return Poll::Ready(Err(e));
                }
            };
            match next {
                Next::Closed => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                Next::Read | Next::Encrypted(_) if !self.conn.is_handshaking() => {
                    // Session tickets and the like, queued after the handshake.
                    ready!(self.poll_send(cx))?;
                    return Poll::Ready(Ok(()));
                }
                Next::Read | Next::Encrypted(_) => {}
            }
            ready!(self.poll_send(cx))?;
            if self.read_closed {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            ready!(self.poll_fill(cx))?;
        }
    }

    /// Processes the TLS records received so far: application data into `plaintext`,
    /// handshake records and alerts into `outgoing`; `data`, if given, is encrypted into
    /// `outgoing` once the session allows it. After an error the session is failed: the
    /// alert rustls chose is queued, and every later call is an error.
    fn process(&mut self, data: Option<&[u8]>) -> io::Result<Next> {
        if let Some(why) = &self.failed {
            return Err(tls_error(why));
        }
        let next = self.process_records(data);
        if let Err(e) = &next {
            self.failed = Some(e.to_string());
            self.queue_alert();
        }
        next
    }

    /// What rustls queued to send with its error (its fatal alert, if it chose one), into
    /// `outgoing`. Only while it has something queued: rustls encodes that before it looks
    /// at the records again, and looking at them after some errors (a handshake message
    /// over its bound) panics.
    fn queue_alert(&mut self) {
        while self.conn.wants_write() {
            let UnbufferedStatus { state, .. } = self.conn.process_tls_records(&mut []);
            let Ok(ConnectionState::EncodeTlsData(mut encode)) = state else { return };
            if append(&mut self.outgoing, READ_ROOM, encode_room, |out| encode.encode(out)).is_err() {
                return;
            }
        }
    }

    fn process_records(&mut self, data: Option<&[u8]>) -> io::Result<Next> {
        loop {
            let UnbufferedStatus { mut discard, state } =
                self.conn.process_tls_records(&mut self.incoming[..self.used]);
            let next = match state.map_err(tls_error)? {
                ConnectionState::ReadTraffic(mut traffic) => {
                    while let Some(record) = traffic.next_record() {
                        let AppDataRecord { discard: more, payload } = record.map_err(tls_error)?;
                        discard += more;
                        self.plaintext.extend_from_slice(payload);
                    }
                    None
                }
                ConnectionState::EncodeTlsData(mut encode) => {
                    append(&mut self.outgoing, READ_ROOM, encode_room, |out| encode.encode(out)).map_err(tls_error)?;
                    None
                }
                // Sent in order with whatever follows: `outgoing` is written out before
                // anything is read again.
                ConnectionState::TransmitTlsData(transmit) => {
                    transmit.done();
                    None
                }
                ConnectionState::BlockedHandshake => Some(Next::Read),
                ConnectionState::WriteTraffic(mut traffic) => match data.filter(|d| !d.is_empty()) {
                    Some(data) => {
                        let data = &data[..data.len().min(MAX_WRITE)];
                        // A record adds a header, a tag and the content type: 22 bytes
                        // for TLS 1.3's AEADs, less than 64 for any suite rustls has.
                        let room = data.len() + 64 * data.len().div_ceil(16_384);
                        append(&mut self.outgoing, room, encrypt_room, |out| traffic.encrypt(data, out))
                            .map_err(tls_error)?;
                        Some(Next::Encrypted(data.len()))
                    }
                    None => Some(Next::Read),
                },
                ConnectionState::PeerClosed => {
                    self.read_closed = true;
                    None
                }
                ConnectionState::Closed => {
                    self.read_closed = true;
                    Some(Next::Closed)
                }
                // Early data is not enabled in the server's configuration.
                ConnectionState::ReadEarlyData(_) => return Err(tls_error("early data from the device")),
                _ => return Err(tls_error("a TLS state this stream does not know")),
            };
            if discard > 0 {
                self.incoming.copy_within(discard..self.used, 0);
                self.used -= discard;
            }
            if let Some(next) = next {
                return Ok(next);
            }
        }
    }

    /// Queues close_notify (once), after the records received so far are processed.
    fn queue_close(&mut self) -> io::Result<()> {
        if self.close_queued {
            return Ok(());
        }
        self.close_queued = true;
        if let Next::Closed = self.process(None)? {
            return Ok(());
        }
        // Everything received is processed: the session is in its traffic state, or still
        // in its handshake (then there is nothing to close).
        let UnbufferedStatus { state, .. } = self.conn.process_tls_records(&mut self.incoming[..self.used]);
        if let ConnectionState::WriteTraffic(mut traffic) = state.map_err(tls_error)? {
            append(&mut self.outgoing, 64, encrypt_room, |out| traffic.queue_close_notify(out)).map_err(tls_error)?;
        }
        Ok(())
    }

    /// Writes `outgoing` to the socket; then lets the buffer go.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.outgoing = Vec::new();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Reads more TLS bytes from the socket into `incoming`. While nothing is pending the
    /// buffer is freed and the socket's readiness awaited without one.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.used == 0 && self.io.poll_read_ready(cx)?.is_pending() {
                self.incoming = Vec::new();
                return Poll::Pending;
            }
            if self.incoming.len() - self.used < READ_ROOM {
                if self.used >= MAX_INCOMING {
                    return Poll::Ready(Err(tls_error("a TLS message larger than 64 KiB")));
                }
                self.incoming.resize(self.used + READ_ROOM, 0);
            }
            match self.io.try_read(&mut self.incoming[self.used..]) {
                Ok(0) => {
                    self.read_closed = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(n) => {
                    self.used += n;
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.used > 0 {
                        ready!(self.io.poll_read_ready(cx))?;
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Moves decrypted bytes into `buf`; true if any were.
    fn take_plaintext(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let pending = &self.plaintext[self.taken..];
        if pending.is_empty() || buf.remaining() == 0 {
            return false;
        }
        let n = pending.len().min(buf.remaining());
        buf.put_slice(&pending[..n]);
        self.taken += n;
        if self.taken == self.plaintext.len() {
            self.plaintext = Vec::new();
            self.taken = 0;
        }
        true
    }
}

impl AsyncRead for TlsStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 || this.take_plaintext(buf) {
            return Poll::Ready(Ok(()));
        }
        // Only `process` adds plaintext: it is looked for again after each pass.
        loop {
            match this.process(None) {
                Ok(Next::Closed) => this.read_closed = true,
                Ok(_) => {}
                // What was decrypted before the failure is read first; the error comes on
                // the next read.
                Err(e) => return Poll::Ready(if this.take_plaintext(buf) { Ok(()) } else { Err(e) }),
            }
            if this.take_plaintext(buf) {
                return Poll::Ready(Ok(()));
            }
            // What the records asked to send (a key update's answer, an alert) goes out as
            // the socket takes it; reading does not wait for a device that does not read.
            if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                return Poll::Ready(Err(e));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            ready!(this.poll_fill(cx))?;
        }
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // What is still unsent bounds what is taken: at most MAX_WRITE waits.
        if this.outgoing.len() - this.sent >= MAX_WRITE {
            ready!(this.poll_send(cx))?;
        }
        if this.close_queued {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        match this.process(Some(data))? {
            Next::Encrypted(n) => {
                // Sent now if the socket takes it; else by the next write or flush.
                if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(n))
            }
            Next::Read if data.is_empty() => Poll::Ready(Ok(0)),
            Next::Read => Poll::Ready(Err(io::Error::new(io::ErrorKind::NotConnected, "TLS session not established"))),
            Next::Closed => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A failed session sends its alert instead.
        if this.failed.is_none() {
            this.queue_close()?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A server configuration with a self-signed certificate for `localhost`, and a client
    /// one trusting it, speaking `versions`.
    fn configs(
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> (Arc<ServerConfig>, Arc<rustls::ClientConfig>) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = CertificateDer::from(cert.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    /// A server stream and the rustls client (tokio-rustls, rustls's buffered API) at the
    /// other end of a loopback socket.
    async fn pair(
        server: Arc<ServerConfig>,
        client: Arc<rustls::ClientConfig>,
    ) -> (io::Result<TlsStream>, io::Result<tokio_rustls::client::TlsStream<TcpStream>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = async {
            let (socket, _) = listener.accept().await.unwrap();
            accept(socket, server).await
        };
        let connected = async {
            let socket = TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            tokio_rustls::TlsConnector::from(client).connect(name, socket).await
        };
        tokio::join!(accepted, connected)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// Large messages both ways (many records, buffers grown and let go), the buffers
    /// freed once idle, and close_notify each way.
    async fn exchange(versions: &[&'static rustls::SupportedProtocolVersion]) {
        let (server, client) = configs(versions);
        let (server, client) = pair(server, client).await;
        let (mut server, mut client) = (server.unwrap(), client.unwrap());
        assert_eq!(server.session().protocol_version(), Some(versions[0].version));

        let up = pattern(100_000, 7);
        let reading = async {
            let mut got = vec![0u8; up.len()];
            server.read_exact(&mut got).await.unwrap();
            got
        };
        let (got, ()) = tokio::join!(reading, async { client.write_all(&up).await.unwrap() });
        assert!(got == up, "the server read what the client wrote");

        let down = pattern(300_000, 3);
        let writing = async {
            server.write_all(&down).await.unwrap();
            server.flush().await.unwrap();
        };
        let reading = async {
            let mut got = vec![0u8; down.len()];
            client.read_exact(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::join!(writing, reading);
        assert!(got == down, "the client read what the server wrote");

        // Idle: a read finds nothing, and the stream holds no buffer.
        let mut one = [0u8; 1];
        let idle = tokio::time::timeout(Duration::from_millis(100), server.read(&mut one)).await;
        assert!(idle.is_err(), "nothing to read");
        assert_eq!(
            (server.incoming.capacity(), server.outgoing.capacity(), server.plaintext.capacity()),
            (0, 0, 0),
            "buffers held while idle"
        );

        // The client's close (close_notify, then its FIN) is the server's end of stream,
        // after the last bytes; the server's close_notify reaches the client, which would
        // report a truncation otherwise.
        client.write_all(b"last").await.unwrap();
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"last");
        server.shutdown().await.unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.expect("a clean close from the server");
        assert!(rest.is_empty());
    }

    /// Longest an exchange may take: a stream that stops moving bytes or never reports the
    /// other side's close fails the test instead of hanging it.
    const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn tls13_carries_large_messages_both_ways_frees_its_buffers_and_closes_cleanly() {
        let done = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(&[&rustls::version::TLS13])).await;
        done.expect("the exchange ends");
    }

    #[tokio::test]
    async fn tls12_carries_large_messages_both_ways_frees_its_buffers_and_closes_cleanly() {
        let done = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(&[&rustls::version::TLS12])).await;
        done.expect("the exchange ends");
    }

    #[tokio::test]
    async fn a_client_that_does_not_trust_the_server_fails_the_handshake_on_both_sides() {
        let (server, _) = configs(&[&rustls::version::TLS13]);
        let (_, stranger) = configs(&[&rustls::version::TLS13]);
        let (server, client) = tokio::time::timeout(EXCHANGE_TIMEOUT, pair(server, stranger)).await.expect("no hang");
        // The stranger trusts another key under the same name: the signature fails.
        let refused = client.expect_err("the client refuses the certificate");
        assert!(refused.to_string().contains("BadSignature"), "{refused}");
        let e = server.err().expect("the server sees the handshake fail");
        assert!(e.to_string().contains("received fatal alert"), "{e}");
    }

    /// What a client sends before the handshake fails it: the handshake's error, no panic.
    async fn refused(hello: &[u8]) -> io::Error {
        let (server, _) = configs(&[&rustls::version::TLS13]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        client.write_all(hello).await.unwrap();
        let (socket, _) = listener.accept().await.unwrap();
        let accepted = tokio::spawn(tokio::time::timeout(Duration::from_secs(5), accept(socket, server)));
        let accepted = accepted.await.expect("the handshake's task does not panic");
        accepted.expect("no hang").err().expect("refused")
    }

    #[tokio::test]
    async fn handshake_errors_rustls_sends_no_alert_for_end_the_handshake_without_a_panic() {
        // A ClientHello header claiming 16 MiB, over rustls's 64 KiB bound.
        let e = refused(&[0x16, 3, 1, 0, 4, 0x01, 0xff, 0xff, 0xff]).await;
        assert!(e.to_string().contains("HandshakePayloadTooLarge"), "{e}");
        // Half a handshake message, then a ChangeCipherSpec record in its middle.
        let e = refused(&[0x16, 3, 1, 0, 2, 0x01, 0x00, 0x14, 3, 3, 0, 1, 1]).await;
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[tokio::test]
    async fn plain_mqtt_on_the_tls_port_is_a_handshake_error_not_a_hang() {
        let (server, _) = configs(&[&rustls::version::TLS13]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut device = TcpStream::connect(addr).await.unwrap();
        // An MQTT 3.1.1 CONNECT, client id "d".
        device.write_all(&[0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'd']).await.unwrap();
        let (socket, _) = listener.accept().await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(5), accept(socket, server)).await;
        let e = accepted.expect("no hang").err().expect("not TLS");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // The device is told: a fatal alert record (RFC 8446 §6: type 21, level 2).
        let mut alert = [0u8; 7];
        tokio::time::timeout(Duration::from_secs(5), device.read_exact(&mut alert)).await.unwrap().unwrap();
        assert_eq!((alert[0], alert[5]), (21, 2), "{alert:?}");
    }
}
