//! The service's connections ([`Limited`], an axum [`Listener`]):
//!
//! - at most [`crate::serve::ServeConfig::max_conns`] are open at once (the next one is accepted
//!   when one closes; until then it waits in the kernel's backlog, so idle keep-alive connections
//!   can no longer lock every other client out without bound);
//! - a request's header must be complete (its blank line received) within
//!   [`crate::serve::ServeConfig::header_timeout`] of the connection's start or of the previous
//!   answer, however slowly its bytes trickle in (a slowloris header, an idle keep-alive);
//! - a connection on which nothing is read or written for
//!   [`crate::serve::ServeConfig::effective_idle`] is closed (a stalled body).
//!
//! The header is followed at the byte level (the end of the header is the first `\r\n\r\n`
//! after an answer), which is what HTTP/1.1 without pipelining sends.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A TCP listener with a connection cap and an idle timeout (see the module docs).
pub struct Limited {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
    header: Duration,
}

impl Limited {
    /// `inner` with at most `max_conns` connections open (≥ 1), each closed after `idle` without
    /// progress or when a request header takes longer than `header`.
    pub fn new(inner: TcpListener, max_conns: usize, idle: Duration, header: Duration) -> Self {
        Limited {
            inner,
            permits: Arc::new(Semaphore::new(max_conns.max(1))),
            idle,
            header,
        }
    }
}

impl Listener for Limited {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Conn, Self::Addr) {
        // The semaphore is never closed.
        let permit = match self.permits.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => unreachable!("the connection semaphore is never closed"),
        };
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let conn = Conn {
            io,
            _permit: permit,
            idle: self.idle,
            timer: Box::pin(tokio::time::sleep(self.idle)),
            header: self.header,
            in_header: true,
            matched: 0,
            header_timer: Box::pin(tokio::time::sleep(self.header)),
        };
        (conn, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// One connection of [`Limited`]: its slot is given back when it is dropped.
pub struct Conn {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    header: Duration,
    /// Waiting for the end of a request header (since the start or the last answer).
    in_header: bool,
    /// Bytes of `\r\n\r\n` matched so far.
    matched: u8,
    header_timer: Pin<Box<Sleep>>,
}

impl Conn {
    fn progress(&mut self) {
        let next = Instant::now() + self.idle;
        self.timer.as_mut().reset(next);
    }

    /// Follows the bytes of a request header; its end stops the header deadline.
    fn scan_header(&mut self, bytes: &[u8]) {
        if !self.in_header {
            return;
        }
        for &b in bytes {
            self.matched = match (self.matched, b) {
                (0 | 2, b'\r') => self.matched + 1,
                (1 | 3, b'\n') => self.matched + 1,
                (_, b'\r') => 1,
                _ => 0,
            };
            if self.matched == 4 {
                self.in_header = false;
                return;
            }
        }
    }

    /// An error once the connection has been idle, or its header pending, too long; `Pending`
    /// (with the timers' wake-ups registered) otherwise.
    fn deadline_check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.in_header && self.header_timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "request header not complete in time",
            ));
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle too long",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A header still incomplete at its deadline ends the connection even while bytes trickle.
        if this.in_header {
            if let Poll::Ready(e) = this.deadline_check(cx) {
                return Poll::Ready(Err(e));
            }
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.progress();
                    let new = buf.filled()[before..].to_vec();
                    this.scan_header(&new);
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.deadline_check(cx).map(Err),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    this.progress();
                    // An answer: the next request's header is due within the header timeout.
                    this.in_header = true;
                    this.matched = 0;
                    let next = Instant::now() + this.header;
                    this.header_timer.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.deadline_check(cx).map(Err),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
