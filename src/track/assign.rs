//! Linear assignment with a cost limit, as ByteTrack's `matching.linear_assignment`
//! (`lap.lapjv(cost, extend_cost=True, cost_limit=thresh)`).
//!
//! lapjv with a cost limit solves the square problem extended by one dummy column per row and one
//! dummy row per column at cost `thresh / 2`: a pair `(i, j)` is matched only when it beats
//! leaving both unmatched, and the matching minimises `Σ (cost − thresh)` over the matched pairs.
//! That is the maximum-weight matching with weights `thresh − cost` over the pairs with
//! `cost < thresh`, which is solved here exactly with the Kuhn–Munkres algorithm of the
//! `pathfinding` crate, one connected component of the allowed pairs at a time (an IoU cost
//! allows few pairs, so the components are small and the O(n³) solver stays cheap at hundreds
//! of boxes).

use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;

/// Weights are `thresh − cost` in units of 1e-12 (Kuhn–Munkres needs an ordered sum; costs are
/// in 0..=1, so the sums of up to millions of pairs stay far inside i64).
const SCALE: f64 = 1e12;

/// The pairs `(row, col)` of the minimum-cost matching of `cost` (`rows x cols`, row-major,
/// values in any range, NaN never matched) among the pairs with `cost < thresh`, sorted by row.
/// Rows and columns left out are unmatched. Panics only if `cost.len() != rows * cols`.
pub fn linear_assignment(
    cost: &[f64],
    rows: usize,
    cols: usize,
    thresh: f64,
) -> Vec<(usize, usize)> {
    assert_eq!(cost.len(), rows * cols, "cost matrix of {rows}x{cols}");
    let weight = |i: usize, j: usize| -> i64 {
        let c = cost[i * cols + j];
        if c < thresh {
            ((thresh - c) * SCALE).round() as i64
        } else {
            0
        }
    };
    // Union-find over rows (0..rows) and columns (rows..rows+cols) joined by allowed pairs.
    let mut parent: Vec<usize> = (0..rows + cols).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    let mut any = false;
    for i in 0..rows {
        for j in 0..cols {
            if weight(i, j) > 0 {
                any = true;
                let (a, b) = (find(&mut parent, i), find(&mut parent, rows + j));
                if a != b {
                    parent[a] = b;
                }
            }
        }
    }
    if !any {
        return Vec::new();
    }
    let mut comps: std::collections::BTreeMap<usize, (Vec<usize>, Vec<usize>)> =
        std::collections::BTreeMap::new();
    for i in 0..rows {
        let r = find(&mut parent, i);
        comps.entry(r).or_default().0.push(i);
    }
    for j in 0..cols {
        let r = find(&mut parent, rows + j);
        comps.entry(r).or_default().1.push(j);
    }
    let mut out = Vec::new();
    for (rs, cs) in comps.values() {
        if rs.is_empty() || cs.is_empty() {
            continue;
        }
        if rs.len() == 1 && cs.len() == 1 {
            out.push((rs[0], cs[0]));
            continue;
        }
        // Kuhn–Munkres wants rows <= columns.
        let transpose = rs.len() > cs.len();
        let (a, b) = if transpose { (cs, rs) } else { (rs, cs) };
        let m = Matrix::from_fn(a.len(), b.len(), |(x, y)| {
            if transpose {
                weight(b[y], a[x])
            } else {
                weight(a[x], b[y])
            }
        });
        let (_, assign) = kuhn_munkres(&m);
        for (x, &y) in assign.iter().enumerate() {
            let (i, j) = if transpose {
                (b[y], a[x])
            } else {
                (a[x], b[y])
            };
            if weight(i, j) > 0 {
                out.push((i, j));
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_the_total_over_the_greedy_pair() {
        // Greedy takes (0,0)=0.1 and leaves row 1 with 0.9 (over the limit); the optimum is
        // (0,1)+(1,0) = 0.2 + 0.3.
        let c = [0.1, 0.2, 0.3, 0.9];
        assert_eq!(linear_assignment(&c, 2, 2, 0.8), vec![(0, 1), (1, 0)]);
    }

    #[test]
    fn a_pair_at_or_over_the_limit_is_unmatched() {
        let c = [0.8, 0.5, 0.79, 1.0];
        assert_eq!(linear_assignment(&c, 2, 2, 0.8), vec![(0, 1), (1, 0)]);
        let c = [0.8, f64::NAN];
        assert_eq!(linear_assignment(&c, 1, 2, 0.8), vec![]);
    }

    #[test]
    fn more_rows_than_columns() {
        let c = [0.5, 0.1, 0.2];
        assert_eq!(linear_assignment(&c, 3, 1, 0.8), vec![(1, 0)]);
        // Two rows compete for one column inside a larger component.
        let c = [0.1, 0.3, 0.2, 0.9, 0.15, 0.95];
        // Weights thresh − c: row 0 (0.7, 0.5), row 1 (0.6, -), row 2 (0.65, -): (0,1)+(2,0)
        // = 1.15 beats (0,1)+(1,0) = 1.1 and (0,0) alone = 0.7.
        assert_eq!(linear_assignment(&c, 3, 2, 0.8), vec![(0, 1), (2, 0)]);
    }
}
