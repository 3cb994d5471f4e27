//! The tracker's frame index of a live stream's frames ([`FrameClock`]).
//!
//! A live stream's frames are numbered as they are read, from 1, across reopenings: a frame
//! dropped because detection was slower than the stream, or left out by `--vid-stride`, keeps
//! its number, so the tracker's filter steps over it. An outage is not counted that way: while
//! the stream was away (ffmpeg ended, the back-off, failed attempts) no frame was read, yet the
//! objects moved on. On the first delivered frame of a new connection the clock therefore adds
//! the outage at the stream's rate, rounded: the time from the last frame read before that
//! connection to its opening (`yolo9::detect::stream::LiveFrame::outage`). Every later index
//! is the frame number plus all that was added.
//!
//! The outage ends when the connection opens, not when its first frame arrives: ffmpeg probes a
//! new live connection for up to 2 s and then hands over the frames it gathered meanwhile in one
//! burst, each read and numbered. Counting that wait as well counted it twice (measured on the
//! loopback test stream at 10 fps: 29 frames added for a 9-frame gap).
//!
//! Example, 10 fps: frame 20 is the last read on the first connection; the next connection
//! opens 2 s later and its first delivered frame is number 25 (21-24 read while it started and
//! dropped). 20 frames are added: frame 25 is index 45, frame 26 index 46, and so on.

use std::time::Duration;

/// Maps a live frame's number, its connection and that connection's outage to the tracker's
/// frame index (see the module docs). One per stream.
#[derive(Debug, Clone)]
pub struct FrameClock {
    fps: f64,
    added: u64,
    connection: Option<u64>,
}

impl FrameClock {
    /// A clock for a stream of `fps` frames per second (finite and > 0; the caller validates
    /// it, as `--fps` does). A rate that is not adds nothing over outages.
    pub fn new(fps: f64) -> FrameClock {
        FrameClock {
            fps: if fps.is_finite() && fps > 0.0 {
                fps
            } else {
                0.0
            },
            added: 0,
            connection: None,
        }
    }

    /// The tracker's index of the frame numbered `frame` (from 1, across reopenings), read on
    /// connection `connection` (the reopenings before it: 0 for the first), which opened
    /// `outage` after the last frame read before it. Frames come in the order of their
    /// numbers; so do their indices.
    pub fn index(&mut self, frame: u64, connection: u64, outage: Duration) -> u64 {
        if self.connection.is_some_and(|c| connection > c) {
            self.added += (outage.as_secs_f64() * self.fps).round() as u64;
        }
        self.connection = Some(connection);
        frame + self.added
    }

    /// The frames added over outages so far.
    pub fn added(&self) -> u64 {
        self.added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn without_a_reconnection_the_index_is_the_frame_number() {
        let mut c = FrameClock::new(10.0);
        assert_eq!(c.index(1, 0, Duration::ZERO), 1);
        // Frames 2-4 dropped by a slow detector: their numbers count.
        assert_eq!(c.index(5, 0, Duration::ZERO), 5);
        assert_eq!(c.index(6, 0, Duration::ZERO), 6);
        assert_eq!(c.added(), 0);
    }

    #[test]
    fn a_reconnection_adds_the_outage_at_the_frame_rate() {
        let mut c = FrameClock::new(10.0);
        assert_eq!(c.index(20, 0, Duration::ZERO), 20);
        // Opened 2 s after frame 20 was read: 20 frames added; 21-24 were read (and dropped)
        // on the new connection before 25 and count by their numbers.
        assert_eq!(c.index(25, 1, s(2.0)), 45);
        assert_eq!(c.added(), 20);
        // The same connection's outage is not added again.
        assert_eq!(c.index(26, 1, s(2.0)), 46);
        // A second outage of 0.84 s: 8.4 frames, rounded to 8.
        assert_eq!(c.index(28, 2, s(0.84)), 28 + 20 + 8);
        // 0.86 s: 8.6, rounded to 9.
        assert_eq!(c.index(29, 3, s(0.86)), 29 + 20 + 8 + 9);
        assert_eq!(c.added(), 37);
    }

    #[test]
    fn several_reopenings_between_two_frames_count_once() {
        // Connections 1 and 2 gave no frame; the outage of connection 3 runs from the last
        // frame read on connection 0 (the reader measures it so).
        let mut c = FrameClock::new(25.0);
        assert_eq!(c.index(7, 0, Duration::ZERO), 7);
        assert_eq!(c.index(8, 3, s(3.5)), 8 + 88);
    }

    #[test]
    fn the_first_connection_adds_nothing_and_a_bad_rate_nothing() {
        // Attempts failed before the first frame: nothing to step over.
        let mut c = FrameClock::new(10.0);
        assert_eq!(c.index(1, 2, s(5.0)), 1);
        let mut c = FrameClock::new(f64::NAN);
        c.index(1, 0, Duration::ZERO);
        assert_eq!(c.index(2, 1, s(10.0)), 2);
    }
}
