//! The constant-velocity Kalman filter of ByteTrack (and of DeepSORT before it), on the box state
//! `(cx, cy, a, h, vcx, vcy, va, vh)`: centre and height in pixels, aspect `a = w / h`, and their
//! velocities per frame.
//!
//! Follows `yolox/tracker/kalman_filter.py` of the ByteTrack authors (ifzhang/ByteTrack): the
//! noise is relative to the box height `h` with the weights 1/20 (position) and 1/160 (velocity);
//! the aspect's noise is fixed (1e-2 and 1e-5 in the motion model, 1e-1 in the measurement). All
//! arithmetic is in f64 like the authors' numpy code.

/// An 8-vector: `(cx, cy, a, h, vcx, vcy, va, vh)`.
pub type Mean = [f64; 8];
/// An 8x8 covariance matrix, row-major.
pub type Cov = [[f64; 8]; 8];

/// Weight of the position noise, relative to the height (`_std_weight_position`).
const W_POS: f64 = 1.0 / 20.0;
/// Weight of the velocity noise, relative to the height (`_std_weight_velocity`).
const W_VEL: f64 = 1.0 / 160.0;

/// A new track's state from a measurement `(cx, cy, a, h)` (pixels, aspect w/h): velocities 0,
/// a diagonal covariance with standard deviations `2·h/20` (centre, height), `1e-2` (aspect),
/// `10·h/160` (centre and height velocities) and `1e-5` (aspect velocity) (`initiate`).
pub fn initiate(z: [f64; 4]) -> (Mean, Cov) {
    let h = z[3];
    let std = [
        2.0 * W_POS * h,
        2.0 * W_POS * h,
        1e-2,
        2.0 * W_POS * h,
        10.0 * W_VEL * h,
        10.0 * W_VEL * h,
        1e-5,
        10.0 * W_VEL * h,
    ];
    let mut mean = [0.0; 8];
    mean[..4].copy_from_slice(&z);
    let mut cov = [[0.0; 8]; 8];
    for i in 0..8 {
        cov[i][i] = std[i] * std[i];
    }
    (mean, cov)
}

/// One frame of the motion model (`predict`): `x ← F x`, `P ← F P Fᵀ + Q` with `F` adding each
/// velocity to its quantity and `Q` diagonal with standard deviations `h/20, h/20, 1e-2, h/20`
/// (positions) and `h/160, h/160, 1e-5, h/160` (velocities), `h` the height before the step.
pub fn predict(mean: &mut Mean, cov: &mut Cov) {
    let h = mean[3];
    let q = [
        W_POS * h,
        W_POS * h,
        1e-2,
        W_POS * h,
        W_VEL * h,
        W_VEL * h,
        1e-5,
        W_VEL * h,
    ];
    for i in 0..4 {
        mean[i] += mean[i + 4];
    }
    // F P: row i (< 4) gains row i + 4.
    let mut fp = *cov;
    for i in 0..4 {
        for j in 0..8 {
            fp[i][j] += cov[i + 4][j];
        }
    }
    // (F P) Fᵀ: column j (< 4) gains column j + 4.
    for row in fp.iter_mut() {
        for j in 0..4 {
            row[j] += row[j + 4];
        }
    }
    for i in 0..8 {
        fp[i][i] += q[i] * q[i];
    }
    *cov = fp;
}

/// The measurement update with `z = (cx, cy, a, h)` (`update`): the projected covariance
/// `S = H P Hᵀ + R` (`R` diagonal with standard deviations `h/20, h/20, 1e-1, h/20` of the
/// predicted height), the gain `K = P Hᵀ S⁻¹` (through the Cholesky factor of `S`, as the
/// authors' `cho_solve`), `x ← x + K (z − H x)`, `P ← P − K S Kᵀ`.
pub fn update(mean: &mut Mean, cov: &mut Cov, z: [f64; 4]) {
    let h = mean[3];
    let r = [W_POS * h, W_POS * h, 1e-1, W_POS * h];
    let mut s = [[0.0f64; 4]; 4];
    for i in 0..4 {
        for j in 0..4 {
            s[i][j] = cov[i][j];
        }
        s[i][i] += r[i] * r[i];
    }
    let l = cholesky4(&s);
    // K = P Hᵀ S⁻¹: row k of K solves S kᵀ = (P Hᵀ)ₖᵀ (S symmetric).
    let mut k = [[0.0f64; 4]; 8];
    for (row, krow) in k.iter_mut().enumerate() {
        let b = [cov[row][0], cov[row][1], cov[row][2], cov[row][3]];
        *krow = cho_solve4(&l, b);
    }
    let innov = [
        z[0] - mean[0],
        z[1] - mean[1],
        z[2] - mean[2],
        z[3] - mean[3],
    ];
    for i in 0..8 {
        mean[i] += (0..4).map(|j| k[i][j] * innov[j]).sum::<f64>();
    }
    // K S Kᵀ, with K S = P Hᵀ.
    let mut ks = [[0.0f64; 4]; 8];
    for i in 0..8 {
        for j in 0..4 {
            ks[i][j] = (0..4).map(|m| k[i][m] * s[m][j]).sum();
        }
    }
    for i in 0..8 {
        for j in 0..8 {
            cov[i][j] -= (0..4).map(|m| ks[i][m] * k[j][m]).sum::<f64>();
        }
    }
}

/// The lower Cholesky factor of a symmetric positive-definite 4x4 matrix (the projected
/// covariance always is: `R` adds a positive diagonal).
fn cholesky4(a: &[[f64; 4]; 4]) -> [[f64; 4]; 4] {
    let mut l = [[0.0f64; 4]; 4];
    for i in 0..4 {
        for j in 0..=i {
            let s: f64 = (0..j).map(|m| l[i][m] * l[j][m]).sum();
            if i == j {
                l[i][j] = (a[i][i] - s).max(f64::MIN_POSITIVE).sqrt();
            } else {
                l[i][j] = (a[i][j] - s) / l[j][j];
            }
        }
    }
    l
}

/// Solves `L Lᵀ x = b` for the factor `l` of [`cholesky4`].
fn cho_solve4(l: &[[f64; 4]; 4], b: [f64; 4]) -> [f64; 4] {
    let mut y = [0.0f64; 4];
    for i in 0..4 {
        let s: f64 = (0..i).map(|m| l[i][m] * y[m]).sum();
        y[i] = (b[i] - s) / l[i][i];
    }
    let mut x = [0.0f64; 4];
    for i in (0..4).rev() {
        let s: f64 = (i + 1..4).map(|m| l[m][i] * x[m]).sum();
        x[i] = (y[i] - s) / l[i][i];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initiate_then_predict_by_hand() {
        let (mut m, mut p) = initiate([10.0, 20.0, 0.5, 40.0]);
        // std of cx: 2 * 40 / 20 = 4 → var 16; of vcx: 10 * 40 / 160 = 2.5 → 6.25.
        assert_eq!(p[0][0], 16.0);
        assert_eq!(p[4][4], 6.25);
        m[4] = 1.0;
        predict(&mut m, &mut p);
        assert_eq!(m[0], 11.0);
        // var(cx) = 16 + 6.25 + (40/20)^2 = 26.25; cov(cx, vcx) = 6.25.
        assert!((p[0][0] - 26.25).abs() < 1e-12);
        assert!((p[0][4] - 6.25).abs() < 1e-12);
        assert!((p[4][0] - 6.25).abs() < 1e-12);
        // var(vcx) = 6.25 + (40/160)^2.
        assert!((p[4][4] - (6.25 + 0.0625)).abs() < 1e-12);
    }

    #[test]
    fn update_pulls_toward_the_measurement_by_the_gain() {
        let (mut m, mut p) = initiate([0.0, 0.0, 1.0, 20.0]);
        // Scalar case for cx: P = 4, R = 1 → K = 0.8 for the position; the velocity's
        // covariance with cx is 0, so vcx stays 0.
        update(&mut m, &mut p, [10.0, 0.0, 1.0, 20.0]);
        assert!((m[0] - 8.0).abs() < 1e-12, "{}", m[0]);
        assert!((p[0][0] - 0.8).abs() < 1e-12, "{}", p[0][0]);
        assert_eq!(m[4], 0.0);
    }
}
