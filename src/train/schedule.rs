//! Learning-rate, momentum and accumulation schedules of the official `train_dual.py`.
//!
//! - LR factor per epoch `lf(e)`: linear `(1 − e/E)(1 − lrf) + lrf`, or with `--cos-lr`
//!   `one_cycle(1, lrf, E)`: `((1 − cos(e·π/E)) / 2)(lrf − 1) + 1`.
//! - Warmup over `nw = max(round(warmup_epochs · nb), 100)` iterations (`ni` counts batches since
//!   the start of training): bias LR falls linearly from `warmup_bias_lr` (0.1) to `lr0 · lf(e)`,
//!   the other groups rise from 0; momentum rises from `warmup_momentum` (0.8) to `momentum`;
//!   accumulation rises from 1 to `nbs / batch` (rounded).
//! - Nominal batch size `nbs = 64`: `accumulate = max(round(64 / batch), 1)` and the weight decay is
//!   scaled by `batch · accumulate / 64`.

/// Hyper-parameters that drive the schedules (values of `hyp.scratch-high.yaml`).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Total epochs `E`.
    pub epochs: usize,
    /// Initial LR `lr0` (0.01).
    pub lr0: f64,
    /// Final LR fraction `lrf` (0.01).
    pub lrf: f64,
    /// SGD momentum (0.937).
    pub momentum: f64,
    /// Warmup epochs (3.0).
    pub warmup_epochs: f64,
    /// Momentum at the start of warmup (0.8).
    pub warmup_momentum: f64,
    /// Bias LR at the start of warmup (0.1).
    pub warmup_bias_lr: f64,
    /// Cosine instead of linear decay (`--cos-lr`).
    pub cos_lr: bool,
    /// Nominal batch size (64).
    pub nbs: usize,
}

/// Optimizer settings for one iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSettings {
    /// LR per group `[bias, weight, bn_weight]`.
    pub lr: [f64; 3],
    /// Momentum.
    pub momentum: f64,
    /// Micro-batches to accumulate before an optimizer step.
    pub accumulate: usize,
}

fn interp(x: f64, x1: f64, y0: f64, y1: f64) -> f64 {
    // np.interp(x, [0, x1], [y0, y1]) with clamping at both ends.
    if x1 <= 0.0 || x >= x1 {
        y1
    } else if x <= 0.0 {
        y0
    } else {
        y0 + (y1 - y0) * x / x1
    }
}

/// Python's `round` (banker's rounding: halves go to the even neighbour), as used by the official
/// code for `accumulate` and `nw`.
pub fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

impl Schedule {
    /// The official defaults (`hyp.scratch-high.yaml`) for `epochs` epochs.
    pub fn scratch_high(epochs: usize) -> Self {
        Schedule {
            epochs,
            lr0: 0.01,
            lrf: 0.01,
            momentum: 0.937,
            warmup_epochs: 3.0,
            warmup_momentum: 0.8,
            warmup_bias_lr: 0.1,
            cos_lr: false,
            nbs: 64,
        }
    }

    /// LR factor `lf(epoch)`.
    pub fn lf(&self, epoch: usize) -> f64 {
        let e = epoch as f64;
        let n = self.epochs.max(1) as f64;
        if self.cos_lr {
            ((1.0 - (e * std::f64::consts::PI / n).cos()) / 2.0) * (self.lrf - 1.0) + 1.0
        } else {
            (1.0 - e / n) * (1.0 - self.lrf) + self.lrf
        }
    }

    /// Number of warmup iterations for `nb` batches per epoch: `max(round(warmup_epochs·nb), 100)`.
    pub fn warmup_iters(&self, nb: usize) -> usize {
        (round_half_even(self.warmup_epochs * nb as f64) as usize).max(100)
    }

    /// Accumulation after warmup: `max(round(nbs / batch), 1)`.
    pub fn accumulate(&self, batch: usize) -> usize {
        (round_half_even(self.nbs as f64 / batch.max(1) as f64) as usize).max(1)
    }

    /// Weight decay scaled to the effective batch: `wd · batch · accumulate / nbs`.
    pub fn scaled_weight_decay(&self, weight_decay: f64, batch: usize) -> f64 {
        weight_decay * (batch * self.accumulate(batch)) as f64 / self.nbs as f64
    }

    /// Settings at iteration `ni` (batches since training start) of `epoch`, with `nb` batches
    /// per epoch and micro-batch `batch`. After warmup the LR is `lr0 · lf(epoch)` in every
    /// group.
    pub fn at(&self, ni: usize, epoch: usize, nb: usize, batch: usize) -> StepSettings {
        let nw = self.warmup_iters(nb);
        let target = self.lr0 * self.lf(epoch);
        if ni <= nw {
            let x = ni as f64;
            let x1 = nw as f64;
            let acc = interp(x, x1, 1.0, self.nbs as f64 / batch.max(1) as f64);
            StepSettings {
                lr: [
                    interp(x, x1, self.warmup_bias_lr, target),
                    interp(x, x1, 0.0, target),
                    interp(x, x1, 0.0, target),
                ],
                momentum: interp(x, x1, self.warmup_momentum, self.momentum),
                accumulate: (round_half_even(acc) as usize).max(1),
            }
        } else {
            StepSettings {
                lr: [target; 3],
                momentum: self.momentum,
                accumulate: self.accumulate(batch),
            }
        }
    }
}

/// The epoch count of a `--time HOURS` run after epoch `epoch` (0-based) ended (Ultralytics
/// semantics): `elapsed_s` seconds were spent on the epochs `start_epoch..=epoch` of this
/// session, so with their mean time `m` the run gets `start_epoch + ceil(hours · 3600 / m)`
/// epochs (never fewer than the `epoch + 1` done). Returns that count and whether training
/// stops now: the time is used up, or the count says this was the last epoch.
pub fn epochs_for_time(
    hours: f64,
    elapsed_s: f64,
    start_epoch: usize,
    epoch: usize,
) -> (usize, bool) {
    let limit = hours * 3600.0;
    let done = (epoch + 1).saturating_sub(start_epoch).max(1);
    let mean = (elapsed_s / done as f64).max(1e-9);
    let fit = (limit / mean).ceil();
    let total = if fit.is_finite() && fit < 1e9 {
        start_epoch + fit as usize
    } else {
        usize::MAX / 2
    };
    let total = total.max(epoch + 1);
    (total, elapsed_s >= limit || epoch + 1 >= total)
}

#[cfg(test)]
mod time_tests {
    use super::epochs_for_time;

    /// Hand-computed `--time` estimates.
    #[test]
    fn time_limit_re_estimates_the_epochs() {
        // 1 h, the first epoch took 10 min: 6 epochs in all, go on.
        assert_eq!(epochs_for_time(1.0, 600.0, 0, 0), (6, false));
        // 3 epochs in 33 min (11 min each): ceil(60 / 11) = 6.
        assert_eq!(epochs_for_time(1.0, 1980.0, 0, 2), (6, false));
        // Resumed at epoch 4, one epoch of 20 min: 4 + 3.
        assert_eq!(epochs_for_time(1.0, 1200.0, 4, 4), (7, false));
        // 10 h at 10 min an epoch: 60 epochs, whatever --epochs said.
        assert_eq!(epochs_for_time(10.0, 600.0, 0, 0), (60, false));
        // Time used up: stop; the count is what was done.
        assert_eq!(epochs_for_time(1.0, 3700.0, 0, 4), (5, true));
        // A tiny limit stops after the first epoch.
        assert_eq!(epochs_for_time(1e-6, 2.0, 0, 0), (1, true));
    }
}
