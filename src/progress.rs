//! Progress bars (training epochs, validation, downloads): indicatif's bar with a rate and a
//! remaining time of our own, `{rate}` and `{remaining}` in a template. indicatif's estimate
//! follows the last steps and a bar that starts part-way (a resumed epoch) or whose first steps
//! are slow (warm-up, memory probing) showed remaining times such as `10493d`; these are the
//! plain mean since the bar started, counted from its first position, `?` until a step and a
//! second have passed, and capped at `>99d`.

use indicatif::{ProgressState, ProgressStyle};
use std::time::Duration;

/// The style of `template` (indicatif's keys plus `{rate}` and `{remaining}`) for a bar whose
/// counting starts at position `first` (steps before it were done earlier).
pub(crate) fn style(template: &str, first: u64) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key(
            "remaining",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let left = s.len().map(|l| l.saturating_sub(s.pos()));
                let _ = w.write_str(&remaining(s.pos().saturating_sub(first), left, s.elapsed()));
            },
        )
        .with_key(
            "rate",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&rate(s.pos().saturating_sub(first), s.elapsed()));
            },
        )
}

/// The remaining time at the mean rate of `done` steps in `elapsed`, `left` steps to go:
/// `HH:MM:SS`, `Nd HH:MM:SS` past a day, `>99d` beyond, `?` before one step and one second.
pub(crate) fn remaining(done: u64, left: Option<u64>, elapsed: Duration) -> String {
    let Some(left) = left else {
        return "?".into();
    };
    let secs = elapsed.as_secs_f64();
    if done == 0 || secs < 1.0 {
        return "?".into();
    }
    let eta = (left as f64 * secs / done as f64).round();
    if eta > 99.0 * 86_400.0 {
        return ">99d".into();
    }
    let eta = eta as u64;
    let (d, h, m, s) = (eta / 86_400, eta / 3600 % 24, eta / 60 % 60, eta % 60);
    if d > 0 {
        format!("{d}d {h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// The mean rate of `done` steps in `elapsed`: `12.3it/s`, or `4.5s/it` below one a second.
pub(crate) fn rate(done: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if done == 0 || secs <= 0.0 {
        return "?it/s".into();
    }
    let r = done as f64 / secs;
    if r >= 1.0 {
        format!("{r:.1}it/s")
    } else {
        format!("{:.1}s/it", 1.0 / r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_time_and_rate_from_the_mean_since_the_start() {
        let s = Duration::from_secs;
        assert_eq!(remaining(0, Some(100), s(50)), "?");
        assert_eq!(remaining(3, Some(100), Duration::from_millis(500)), "?");
        assert_eq!(remaining(10, None, s(5)), "?");
        assert_eq!(remaining(10, Some(100), s(10)), "00:01:40");
        assert_eq!(remaining(1, Some(1000), s(200)), "2d 07:33:20");
        // A first step of an hour with a million to go: capped, not 10493d.
        assert_eq!(remaining(1, Some(1_000_000), s(3600)), ">99d");
        assert_eq!(rate(30, s(10)), "3.0it/s");
        assert_eq!(rate(2, s(9)), "4.5s/it");
        assert_eq!(rate(0, s(9)), "?it/s");
    }
}
