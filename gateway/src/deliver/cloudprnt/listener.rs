//! The CloudPRNT server's sockets: TCP, TLS unless `cloudprnt.plain`, at most
//! `cloudprnt.max_connections` open at once, each handshake bounded by
//! `cloudprnt.request_timeout_ms`, and a connection on which nothing is read or written
//! for as long closed (the HTTP server keeps a connection between requests for ever, and
//! an HTTP client may open a second one while its first goes back to its pool: idle
//! connections would fill `max_connections`). An [`axum::serve::Listener`], so axum serves
//! HTTP on what it accepts; handshakes run in tasks of their own, so a slow one delays no
//! other.

use super::server::{Refusal, Server};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;

/// Connections accepted and set up, waiting for axum to take them.
const READY: usize = 64;

/// One accepted connection; its slot of `max_connections` is freed when it is dropped.
pub struct Conn {
    io: Io,
    /// How long it may stay idle.
    idle: Duration,
    /// When it is closed unless a byte moves first.
    deadline: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    fn new(io: Io, idle: Duration, slot: OwnedSemaphorePermit) -> Conn {
        Conn { io, idle, deadline: Box::pin(tokio::time::sleep(idle)), _slot: slot }
    }

    /// A byte moved: the idle time starts again.
    fn touch(&mut self) {
        let at = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(at);
    }

    /// Whether the idle time has run out (registers the waker otherwise).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

/// A plain or a TLS stream (boxed: a TLS stream's buffers are large).
type Io = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// The accepted connections, set up by a task of its own ([`CloudListener::start`]).
pub struct CloudListener {
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
    local: SocketAddr,
}

impl CloudListener {
    /// Accepts on `tcp` until the returned listener is dropped: over TLS with `tls`, at
    /// most `max_connections` at once (beyond, a socket is closed at once and counted
    /// `capacity`), a handshake failing or outlasting `handshake` counted
    /// `tls_handshake`.
    ///
    /// # Errors
    /// The socket's address cannot be read.
    pub fn start(
        tcp: TcpListener,
        tls: Option<TlsAcceptor>,
        max_connections: usize,
        handshake: Duration,
        server: Server,
    ) -> io::Result<CloudListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY);
        let slots = Arc::new(Semaphore::new(max_connections.max(1)));
        tokio::spawn(async move {
            loop {
                let (socket, addr) = tokio::select! {
                    accepted = tcp.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: wait rather than spin.
                            tracing::warn!(error = %e, "CloudPRNT listener cannot accept");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = tx.closed() => return,
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    server.refuse(Refusal::Capacity, &addr.ip().to_string(), "cloudprnt.max_connections reached");
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let Some(acceptor) = tls.clone() else {
                    if tx.send((Conn::new(Either::Left(socket), handshake, slot), addr)).await.is_err() {
                        return;
                    }
                    continue;
                };
                let (tx, server) = (tx.clone(), server.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake, acceptor.accept(socket)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((Conn::new(Either::Right(Box::new(s)), handshake, slot), addr)).await;
                        }
                        Ok(Err(e)) => server.refuse(Refusal::TlsHandshake, &addr.ip().to_string(), &e.to_string()),
                        Err(_) => server.refuse(Refusal::TlsHandshake, &addr.ip().to_string(), "timed out"),
                    }
                });
            }
        });
        Ok(CloudListener { ready, local })
    }
}

impl axum::serve::Listener for CloudListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (it ends only when this listener is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        match polled {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.touch();
                }
                Poll::Ready(r)
            }
            // Idle too long: read as the end of the stream, so the HTTP server closes it.
            Poll::Pending if self.expired(cx) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        match polled {
            Poll::Ready(Ok(n)) => {
                self.touch();
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => {
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the peer read nothing for too long")))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::cloudprnt::Board;
    use crate::model::{DirectPrinters, Directory};
    use crate::telemetry::Stats;
    use tokio::io::AsyncReadExt;

    /// A connection on which nothing moves is closed after the idle time and its slot freed:
    /// with room for one, a second connection is refused (counted) until then.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_connection_is_closed_and_frees_its_slot() {
        let printers = Arc::new(DirectPrinters::default());
        let board = Arc::new(Board::new(printers.clone(), mpsc::channel(1).0, Duration::from_secs(60), 4));
        let stats = Arc::new(Stats::default());
        let server = Server {
            board,
            printers,
            directory: Arc::new(Directory::default()),
            secrets: None,
            stats: stats.clone(),
            log: Arc::default(),
            drawing: Arc::new(Semaphore::new(1)),
            mqtt: None,
            scheme: "http",
        };
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listener = CloudListener::start(tcp, None, 1, Duration::from_millis(300), server.clone()).unwrap();
        let addr = axum::serve::Listener::local_addr(&listener).unwrap();
        tokio::spawn(async move { axum::serve(listener, super::super::server::routes(server, 1024)).await });

        let mut first = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let refused = tokio::time::timeout(Duration::from_secs(5), second.read(&mut byte)).await.unwrap();
        assert!(matches!(refused, Ok(0) | Err(_)), "no room for a second: closed at once");
        assert_eq!(stats.snapshot().cloudprnt_refusals.get("capacity"), Some(&1));
        let started = std::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(5), first.read(&mut byte)).await.unwrap();
        assert!(matches!(closed, Ok(0) | Err(_)), "the idle one is closed");
        assert!(started.elapsed() >= Duration::from_millis(100), "not before its idle time");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        use tokio::io::AsyncWriteExt;
        third.write_all(b"GET /nothing HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut answer = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut answer)).await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 404"), "its slot was freed");
    }
}
