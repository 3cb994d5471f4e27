//! Ranks as threads of one process ([`local_group`]): each pair of ranks is joined by two std
//! channels; an operation sends this rank's buffer to the peers that need it and receives
//! theirs with the group's timeout. A rank whose [`LocalRank`] is dropped (its thread ended) is
//! seen by the others as [`DistError::Gone`].

use super::{Collective, DistError};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// What travels between two ranks.
enum Msg {
    /// A buffer of operation `seq` (`op` names it, for the error when ranks disagree).
    Data {
        seq: u64,
        op: &'static str,
        data: Vec<f32>,
    },
    /// The sender stopped on an error.
    Abort(String),
    /// The sender's operation failed because of another rank (gone, failed, silent): passed on
    /// so that every rank names that rank, not the relaying one that ended next.
    Relay(DistError),
}

/// One rank of a [`local_group`].
pub struct LocalRank {
    rank: usize,
    world: usize,
    timeout: Duration,
    seq: u64,
    /// `to[p]`: the channel to rank `p` (`None` for this rank).
    to: Vec<Option<Sender<Msg>>>,
    /// `from[p]`: the channel from rank `p`.
    from: Vec<Option<Receiver<Msg>>>,
}

/// `world` connected ranks (index = rank), each with operation timeout `timeout`; move each to
/// its thread. Errors when `world` is 0.
pub fn local_group(world: usize, timeout: Duration) -> Result<Vec<LocalRank>, DistError> {
    if world == 0 {
        return Err(DistError::Setup("a group needs at least one rank".into()));
    }
    let mut ranks: Vec<LocalRank> = (0..world)
        .map(|rank| LocalRank {
            rank,
            world,
            timeout,
            seq: 0,
            to: (0..world).map(|_| None).collect(),
            from: (0..world).map(|_| None).collect(),
        })
        .collect();
    for a in 0..world {
        for b in 0..world {
            if a != b {
                let (tx, rx) = channel();
                ranks[a].to[b] = Some(tx);
                ranks[b].from[a] = Some(rx);
            }
        }
    }
    Ok(ranks)
}

impl LocalRank {
    fn send(&self, peer: usize, op: &'static str, data: &[f32]) -> Result<(), DistError> {
        let tx = self.to[peer].as_ref().expect("a peer's channel");
        tx.send(Msg::Data {
            seq: self.seq,
            op,
            data: data.to_vec(),
        })
        .map_err(|_| self.gone(peer, format!("{op} #{}", self.seq)))
    }

    /// The error of a `peer` whose channel closed: what it said before ending (an abort, or a
    /// relayed error naming the rank at fault) when it said something, else [`DistError::Gone`].
    fn gone(&self, peer: usize, op: String) -> DistError {
        let rx = self.from[peer].as_ref().expect("a peer's channel");
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Abort(why) => return DistError::Failed { rank: peer, why },
                Msg::Relay(e) => return e,
                Msg::Data { .. } => {}
            }
        }
        DistError::Gone { rank: peer, op }
    }

    /// Passes `e` (this rank's operation failed because of another rank) to every other peer
    /// before the error is returned, and returns it.
    fn relay(&self, e: DistError) -> DistError {
        let culprit = e.rank();
        for (p, tx) in self.to.iter().enumerate() {
            if let Some(tx) = tx.as_ref().filter(|_| Some(p) != culprit) {
                let _ = tx.send(Msg::Relay(e.clone()));
            }
        }
        e
    }

    fn recv(
        &self,
        peer: usize,
        op: &'static str,
        len: usize,
        t0: Instant,
    ) -> Result<Vec<f32>, DistError> {
        let rx = self.from[peer].as_ref().expect("a peer's channel");
        let left = self.timeout.saturating_sub(t0.elapsed());
        let what = || format!("{op} #{}", self.seq);
        match rx.recv_timeout(left) {
            Ok(Msg::Data {
                seq,
                op: theirs,
                data,
            }) => {
                if seq != self.seq || theirs != op || data.len() != len {
                    return Err(DistError::Setup(format!(
                        "rank {peer} is at {theirs} #{seq} ({} values) while rank {} is at {} \
                         ({len} values): the ranks run different operations",
                        data.len(),
                        self.rank,
                        what()
                    )));
                }
                Ok(data)
            }
            Ok(Msg::Abort(why)) => Err(DistError::Failed { rank: peer, why }),
            Ok(Msg::Relay(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Err(DistError::Timeout {
                rank: peer,
                op: what(),
                secs: self.timeout.as_secs_f64(),
            }),
            Err(RecvTimeoutError::Disconnected) => Err(self.gone(peer, what())),
        }
    }
}

impl Collective for LocalRank {
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
        self.seq += 1;
        self.all_reduce_inner(buf).map_err(|e| self.relay(e))
    }

    fn broadcast(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        self.seq += 1;
        self.broadcast_inner(buf).map_err(|e| self.relay(e))
    }

    fn abort(&mut self, why: &str) {
        for tx in self.to.iter().flatten() {
            let _ = tx.send(Msg::Abort(why.to_string()));
        }
    }
}

impl LocalRank {
    /// [`Collective::all_reduce_sum`] of operation `self.seq`.
    fn all_reduce_inner(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        let t0 = Instant::now();
        for p in (0..self.world).filter(|&p| p != self.rank) {
            self.send(p, "all-reduce", buf)?;
        }
        // In rank order from rank 0's buffer, the same additions on every rank.
        let mut acc: Option<Vec<f32>> = None;
        for p in 0..self.world {
            let theirs = if p == self.rank {
                buf.to_vec()
            } else {
                self.recv(p, "all-reduce", buf.len(), t0)?
            };
            match &mut acc {
                None => acc = Some(theirs),
                Some(a) => a.iter_mut().zip(&theirs).for_each(|(a, b)| *a += *b),
            }
        }
        if let Some(a) = acc {
            buf.copy_from_slice(&a);
        }
        Ok(())
    }

    /// [`Collective::broadcast`] of operation `self.seq`.
    fn broadcast_inner(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        let t0 = Instant::now();
        if self.rank == 0 {
            for p in 1..self.world {
                self.send(p, "broadcast", buf)?;
            }
        } else {
            let data = self.recv(0, "broadcast", buf.len(), t0)?;
            buf.copy_from_slice(&data);
        }
        Ok(())
    }
}
