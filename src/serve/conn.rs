//! The service's connections ([`Limited`], an axum [`Listener`]):
//!
//! - at most [`crate::serve::ServeConfig::max_conns`] are open at once: at the cap, a new
//!   connection closes the one that has waited longest for a request header (an idle keep-alive,
//!   a connection that sent nothing, a slowloris header), so idle clients cannot lock the others
//!   out; when every open connection is inside a request, the new one waits until one closes (in
//!   the kernel's backlog behind it);
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
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
    /// The open connections, for closing the longest-waiting one at the cap.
    slots: Arc<Mutex<Vec<Weak<Slot>>>>,
    epoch: std::time::Instant,
}

/// What the listener knows of one open connection.
struct Slot {
    /// Waiting for a request header (since its start or its previous answer).
    waiting: AtomicBool,
    /// When it started waiting, in milliseconds since the listener's epoch.
    since_ms: AtomicU64,
    /// Set by the listener: the connection's next read fails and it is closed.
    evict: AtomicBool,
    /// The task reading the connection, woken to see `evict`.
    waker: Mutex<Option<Waker>>,
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
            slots: Arc::new(Mutex::new(Vec::new())),
            epoch: std::time::Instant::now(),
        }
    }

    /// Closes the open connection that has waited longest for a request header, if any: `true`
    /// when one was told to close (its slot comes back once it has).
    fn evict_longest_waiting(&self) -> bool {
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        slots.retain(|w| w.strong_count() > 0);
        let victim = slots
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.waiting.load(Ordering::Acquire) && !s.evict.load(Ordering::Acquire))
            .min_by_key(|s| s.since_ms.load(Ordering::Acquire));
        match victim {
            Some(s) => {
                s.evict.store(true, Ordering::Release);
                let w = match s.waker.lock() {
                    Ok(mut w) => w.take(),
                    Err(p) => p.into_inner().take(),
                };
                if let Some(w) = w {
                    w.wake();
                }
                true
            }
            None => false,
        }
    }
}

impl Listener for Limited {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Conn, Self::Addr) {
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // At the cap: make room by closing the connection that has waited longest for a
                // header; when none is waiting, wait for one to close.
                self.evict_longest_waiting();
                // The semaphore is never closed.
                match self.permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => unreachable!("the connection semaphore is never closed"),
                }
            }
        };
        let slot = Arc::new(Slot {
            waiting: AtomicBool::new(true),
            since_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            evict: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        match self.slots.lock() {
            Ok(mut s) => s.push(Arc::downgrade(&slot)),
            Err(p) => p.into_inner().push(Arc::downgrade(&slot)),
        }
        let conn = Conn {
            slot,
            epoch: self.epoch,
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
    slot: Arc<Slot>,
    epoch: std::time::Instant,
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
                self.slot.waiting.store(false, Ordering::Release);
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
        if this.slot.evict.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection (the cap was reached)",
            )));
        }
        if this.in_header {
            let mut w = match this.slot.waker.lock() {
                Ok(w) => w,
                Err(p) => p.into_inner(),
            };
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
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
                // An interim answer (`100 Continue` to `Expect: 100-continue`, which curl sends
                // above 1 MB) is not the answer: the body it asks for follows, under the body's
                // own rate limit, not a new header deadline.
                let interim = buf.starts_with(b"HTTP/1.") && buf.get(9) == Some(&b'1');
                if matches!(r, Ok(n) if n > 0) && interim {
                    this.progress();
                } else if matches!(r, Ok(n) if n > 0) {
                    this.progress();
                    // An answer: the next request's header is due within the header timeout.
                    if !this.in_header {
                        this.slot
                            .since_ms
                            .store(this.epoch.elapsed().as_millis() as u64, Ordering::Release);
                        this.slot.waiting.store(true, Ordering::Release);
                    }
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
