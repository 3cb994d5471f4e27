//! Ranks as processes over TCP ([`SocketRank`]): rank 0 listens at the group's address
//! (torchrun's `MASTER_ADDR:MASTER_PORT`) and is the hub, every other rank connects to it.
//!
//! An all-reduce sends each rank's buffer to rank 0, which sums them in rank order and sends the
//! sum back; a broadcast sends rank 0's buffer to every rank. When rank 0 sees a rank fail
//! (closed connection: [`DistError::Gone`]; an abort message: [`DistError::Failed`]; silence
//! past the timeout: [`DistError::Timeout`]) it relays that same error to the other ranks before
//! returning it, so every rank stops with one error naming the rank at fault. The other ranks
//! wait for rank 0 a little longer than the timeout (`timeout · 1.1 + 2 s`), so that rank 0's
//! relay reaches them before their own timeout would blame rank 0.
//!
//! Frames: `kind u8 | op u8 | seq u64 LE | len u64 LE | payload`. Data: `len` f32 LE. Abort:
//! `len` bytes: `code u8 | rank u32 | secs f64 | UTF-8 text` (the relayed [`DistError`]).

use super::{Collective, DistError};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"YOLO9DDP";
const DATA: u8 = 1;
const ABORT: u8 = 2;
const ALL_REDUCE: u8 = 1;
const BROADCAST: u8 = 2;

fn op_name(op: u8) -> &'static str {
    if op == BROADCAST {
        "broadcast"
    } else {
        "all-reduce"
    }
}

/// One rank of a TCP group.
pub struct SocketRank {
    rank: usize,
    world: usize,
    timeout: Duration,
    seq: u64,
    /// Rank 0: `peers[p]` is rank `p`'s connection (`None` at 0). Others: `peers[0]` only.
    peers: Vec<Option<TcpStream>>,
    /// Set after an error: the group is unusable.
    broken: Option<DistError>,
}

fn io_setup(what: &str, e: std::io::Error) -> DistError {
    DistError::Setup(format!("{what}: {e}"))
}

impl SocketRank {
    /// Forms the group: rank 0 listens on `addr` (e.g. `127.0.0.1:29500`), the others connect
    /// to it (retrying until the timeout while rank 0 is not up yet). Errors: `rank >= world`,
    /// the address in use or unresolvable, a rank that did not connect within `timeout`.
    pub fn connect(
        addr: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<SocketRank, DistError> {
        if world == 0 || rank >= world {
            return Err(DistError::Setup(format!(
                "rank {rank} of world size {world}: the rank must be below the world size"
            )));
        }
        let sa: SocketAddr = addr
            .to_socket_addrs()
            .map_err(|e| io_setup(&format!("the group address {addr}"), e))?
            .next()
            .ok_or_else(|| {
                DistError::Setup(format!("the group address {addr} resolves to nothing"))
            })?;
        if rank == 0 {
            let l = TcpListener::bind(sa)
                .map_err(|e| io_setup(&format!("rank 0 cannot listen on {addr}"), e))?;
            Self::host(l, world, timeout)
        } else {
            Self::join(sa, rank, world, timeout)
        }
    }

    /// Rank 0 on an already bound listener: accepts the `world − 1` other ranks within
    /// `timeout`.
    pub fn host(l: TcpListener, world: usize, timeout: Duration) -> Result<SocketRank, DistError> {
        let t0 = Instant::now();
        l.set_nonblocking(true)
            .map_err(|e| io_setup("the listener", e))?;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        let mut joined = 1;
        while joined < world {
            match l.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false)
                        .map_err(|e| io_setup("a connection", e))?;
                    prepare(&s, timeout)?;
                    let mut hello = [0u8; 16];
                    s.read_exact(&mut hello)
                        .map_err(|e| io_setup(&format!("the greeting from {from}"), e))?;
                    let r = u32::from_le_bytes(hello[8..12].try_into().unwrap()) as usize;
                    let w = u32::from_le_bytes(hello[12..16].try_into().unwrap()) as usize;
                    if &hello[..8] != MAGIC || w != world || r == 0 || r >= world {
                        return Err(DistError::Setup(format!(
                            "{from} greeted as rank {r} of world size {w}; this group has world \
                             size {world} (or it is not a yolo9 rank)"
                        )));
                    }
                    if peers[r].is_some() {
                        return Err(DistError::Setup(format!(
                            "rank {r} connected twice (two processes were given RANK={r})"
                        )));
                    }
                    s.write_all(&hello)
                        .map_err(|e| io_setup(&format!("the reply to rank {r}"), e))?;
                    peers[r] = Some(s);
                    joined += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if t0.elapsed() > timeout {
                        let missing: Vec<String> = (1..world)
                            .filter(|&r| peers[r].is_none())
                            .map(|r| r.to_string())
                            .collect();
                        return Err(DistError::Setup(format!(
                            "rank(s) {} did not connect within {:.1} s",
                            missing.join(", "),
                            timeout.as_secs_f64()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io_setup("accepting a rank", e)),
            }
        }
        Ok(SocketRank {
            rank: 0,
            world,
            timeout,
            seq: 0,
            peers,
            broken: None,
        })
    }

    /// Rank `rank > 0`: connects to rank 0 at `addr`, retrying until `timeout`.
    pub fn join(
        addr: SocketAddr,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<SocketRank, DistError> {
        let t0 = Instant::now();
        let mut s = loop {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() < timeout => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(io_setup(
                        &format!(
                            "rank {rank} could not reach rank 0 at {addr} within {:.1} s",
                            timeout.as_secs_f64()
                        ),
                        e,
                    ))
                }
            }
        };
        prepare(&s, timeout)?;
        let mut hello = [0u8; 16];
        hello[..8].copy_from_slice(MAGIC);
        hello[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
        hello[12..16].copy_from_slice(&(world as u32).to_le_bytes());
        s.write_all(&hello)
            .map_err(|e| io_setup(&format!("rank {rank} greeting rank 0"), e))?;
        let mut back = [0u8; 16];
        s.read_exact(&mut back).map_err(|e| {
            io_setup(
                &format!("rank {rank}: rank 0 at {addr} refused the greeting (world size or rank)"),
                e,
            )
        })?;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        peers[0] = Some(s);
        Ok(SocketRank {
            rank,
            world,
            timeout,
            seq: 0,
            peers,
            broken: None,
        })
    }

    /// How long a rank other than 0 waits for rank 0 (which waits for the slowest rank).
    fn client_wait(&self) -> Duration {
        self.timeout.mul_f64(1.1) + Duration::from_secs(2)
    }

    fn write_frame(
        &mut self,
        peer: usize,
        kind: u8,
        op: u8,
        payload: &[u8],
        count: usize,
    ) -> Result<(), DistError> {
        let seq = self.seq;
        let s = self.peers[peer].as_mut().expect("a peer's connection");
        let mut head = [0u8; 18];
        head[0] = kind;
        head[1] = op;
        head[2..10].copy_from_slice(&seq.to_le_bytes());
        head[10..18].copy_from_slice(&(count as u64).to_le_bytes());
        let r = s.write_all(&head).and_then(|_| s.write_all(payload));
        r.map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => DistError::Timeout {
                rank: peer,
                op: format!("{} #{seq}", op_name(op)),
                secs: self.timeout.as_secs_f64(),
            },
            _ => DistError::Gone {
                rank: peer,
                op: format!("{} #{seq}", op_name(op)),
            },
        })
    }

    fn send_data(&mut self, peer: usize, op: u8, buf: &[f32]) -> Result<(), DistError> {
        let bytes: Vec<u8> = buf.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_frame(peer, DATA, op, &bytes, buf.len())
    }

    /// Reads rank `peer`'s data frame of operation `op` (`len` values) by `deadline`.
    fn recv_data(
        &mut self,
        peer: usize,
        op: u8,
        len: usize,
        wait: Duration,
        t0: Instant,
    ) -> Result<Vec<f32>, DistError> {
        let seq = self.seq;
        let what = format!("{} #{seq}", op_name(op));
        let map_io = |e: std::io::Error, what: &str| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => DistError::Timeout {
                rank: peer,
                op: what.to_string(),
                secs: wait.as_secs_f64(),
            },
            _ => DistError::Gone {
                rank: peer,
                op: what.to_string(),
            },
        };
        let s = self.peers[peer].as_mut().expect("a peer's connection");
        let left = wait
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(left))
            .map_err(|e| map_io(e, &what))?;
        let mut head = [0u8; 18];
        s.read_exact(&mut head).map_err(|e| map_io(e, &what))?;
        let count = u64::from_le_bytes(head[10..18].try_into().unwrap()) as usize;
        if head[0] == ABORT {
            let mut p = vec![0u8; count.min(1 << 20)];
            s.read_exact(&mut p).map_err(|e| map_io(e, &what))?;
            return Err(decode_abort(&p, peer));
        }
        let their_seq = u64::from_le_bytes(head[2..10].try_into().unwrap());
        if head[0] != DATA || head[1] != op || their_seq != seq || count != len {
            return Err(DistError::Setup(format!(
                "rank {peer} is at {} #{their_seq} ({count} values) while rank {} is at {what} \
                 ({len} values): the ranks run different operations",
                op_name(head[1]),
                self.rank
            )));
        }
        let mut p = vec![0u8; count * 4];
        s.read_exact(&mut p).map_err(|e| map_io(e, &what))?;
        Ok(p.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect())
    }

    /// Rank 0: tells every rank but `except` about `e`, best effort.
    fn relay(&mut self, e: &DistError, except: Option<usize>) {
        let payload = encode_abort(e);
        for p in 1..self.world {
            if Some(p) != except && self.peers[p].is_some() {
                let _ = self.write_frame(p, ABORT, 0, &payload, payload.len());
            }
        }
    }

    fn fail(&mut self, e: DistError, culprit: Option<usize>) -> DistError {
        if self.rank == 0 {
            self.relay(&e, culprit);
        }
        self.broken = Some(e.clone());
        e
    }

    /// On a rank other than 0: the error rank 0 relayed (an abort frame already received and
    /// not yet read), or `None` when nothing is waiting or it is not an abort frame (a data
    /// frame is left for its operation).
    fn pending_abort(&mut self) -> Option<DistError> {
        let s = self.peers.first()?.as_ref()?;
        s.set_nonblocking(true).ok()?;
        let mut kind = [0u8; 1];
        let peeked = s.peek(&mut kind);
        s.set_nonblocking(false).ok()?;
        if !matches!(peeked, Ok(1)) || kind[0] != ABORT {
            return None;
        }
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut head = [0u8; 18];
        s.read_exact(&mut head).ok()?;
        let count = u64::from_le_bytes(head[10..18].try_into().ok()?) as usize;
        let mut p = vec![0u8; count.min(1 << 20)];
        s.read_exact(&mut p).ok()?;
        Some(decode_abort(&p, 0))
    }

    fn check(&self) -> Result<(), DistError> {
        match &self.broken {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for SocketRank {
    /// Closes each connection gracefully: this side's end first (what was written, an abort
    /// message included, arrives before the end), then what the peer sent and nobody read is
    /// read away for at most 200 ms, so that the close does not reset the connection (a reset can
    /// discard the abort message before the peer reads it).
    fn drop(&mut self) {
        let t0 = Instant::now();
        for s in self.peers.iter_mut().flatten() {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        let mut buf = [0u8; 4096];
        for s in self.peers.iter_mut().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
            while t0.elapsed() < Duration::from_millis(200) {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    }
}

fn prepare(s: &TcpStream, timeout: Duration) -> Result<(), DistError> {
    s.set_nodelay(true)
        .map_err(|e| io_setup("TCP_NODELAY", e))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| io_setup("the read timeout", e))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| io_setup("the write timeout", e))
}

fn encode_abort(e: &DistError) -> Vec<u8> {
    let (code, rank, secs, text) = match e {
        DistError::Gone { rank, op } => (0u8, *rank, 0.0, op.clone()),
        DistError::Failed { rank, why } => (1, *rank, 0.0, why.clone()),
        DistError::Timeout { rank, op, secs } => (2, *rank, *secs, op.clone()),
        DistError::Setup(t) => (3, 0, 0.0, t.clone()),
        // The sender's own device failed: the others name the sender.
        DistError::Device(_) => (4, 0, 0.0, e.to_string()),
    };
    let mut p = vec![code];
    p.extend_from_slice(&(rank as u32).to_le_bytes());
    p.extend_from_slice(&secs.to_le_bytes());
    p.extend_from_slice(text.as_bytes());
    p
}

fn decode_abort(p: &[u8], from: usize) -> DistError {
    if p.len() < 13 {
        return DistError::Failed {
            rank: from,
            why: "stopped (an unreadable abort message)".into(),
        };
    }
    let rank = u32::from_le_bytes(p[1..5].try_into().unwrap()) as usize;
    let secs = f64::from_le_bytes(p[5..13].try_into().unwrap());
    let text = String::from_utf8_lossy(&p[13..]).into_owned();
    match p[0] {
        0 => DistError::Gone { rank, op: text },
        1 => DistError::Failed { rank, why: text },
        2 => DistError::Timeout {
            rank,
            op: text,
            secs,
        },
        4 => DistError::Failed {
            rank: from,
            why: text,
        },
        _ => DistError::Setup(text),
    }
}

impl Collective for SocketRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        self.check()?;
        self.seq += 1;
        let t0 = Instant::now();
        if self.rank == 0 {
            // In rank order from rank 0's buffer.
            let mut acc = buf.to_vec();
            for p in 1..self.world {
                match self.recv_data(p, ALL_REDUCE, buf.len(), self.timeout, t0) {
                    Ok(d) => acc.iter_mut().zip(&d).for_each(|(a, b)| *a += *b),
                    Err(e) => {
                        let culprit = culprit_of(&e, p);
                        return Err(self.fail(e, culprit));
                    }
                }
            }
            for p in 1..self.world {
                if let Err(e) = self.send_data(p, ALL_REDUCE, &acc) {
                    return Err(self.fail(e, Some(p)));
                }
            }
            buf.copy_from_slice(&acc);
        } else {
            // Rank 0 may have stopped already and relayed why: read that before writing (a
            // write to its closed connection resets it, which can discard the message).
            if let Some(e) = self.pending_abort() {
                return Err(self.fail(e, None));
            }
            let wait = self.client_wait();
            let r = self
                .send_data(0, ALL_REDUCE, buf)
                .and_then(|_| self.recv_data(0, ALL_REDUCE, buf.len(), wait, t0));
            match r {
                Ok(d) => buf.copy_from_slice(&d),
                Err(e) => {
                    let e = self.pending_abort().unwrap_or(e);
                    return Err(self.fail(e, None));
                }
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        self.check()?;
        self.seq += 1;
        let t0 = Instant::now();
        if self.rank == 0 {
            for p in 1..self.world {
                if let Err(e) = self.send_data(p, BROADCAST, buf) {
                    return Err(self.fail(e, Some(p)));
                }
            }
        } else {
            let wait = self.client_wait();
            match self.recv_data(0, BROADCAST, buf.len(), wait, t0) {
                Ok(d) => buf.copy_from_slice(&d),
                Err(e) => return Err(self.fail(e, None)),
            }
        }
        Ok(())
    }

    fn abort(&mut self, why: &str) {
        let e = DistError::Failed {
            rank: self.rank,
            why: why.to_string(),
        };
        let payload = encode_abort(&e);
        for p in 0..self.world {
            if self.peers[p].is_some() {
                let _ = self.write_frame(p, ABORT, 0, &payload, payload.len());
            }
        }
        self.broken = Some(e);
    }
}

/// The rank an error received from `peer` is about (rank 0 does not relay back to it).
fn culprit_of(e: &DistError, peer: usize) -> Option<usize> {
    match e {
        DistError::Setup(_) => Some(peer),
        e => e.rank().filter(|&r| r == peer),
    }
}
