// Dense TAL targets from the foreground rows of an assignment (src/loss/tal_loss.rs
// `DenseTargets`), launched by src/cuda/tal.rs. Output planes (10, B, A), f32:
//   0 weight (target score, 0 for background), 1 label, 2..6 target box xyxy (grid units),
//   6..10 DFL distances l, t, r, b (grid units).
// Background: weight 0, label 0, a unit box around the anchor, distances 0.
// fg rows (nfg, 11): [b * A + a, weight, label, box x1 y1 x2 y2, l, t, r, b].

extern "C" __global__ void tal_dense_init(const float* anc, float* out, int A, long long BA) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BA) return;
    const int a = (int)(i % A);
    const float ax = anc[2 * a], ay = anc[2 * a + 1];
    out[i] = 0.0f;
    out[BA + i] = 0.0f;
    out[2 * BA + i] = ax - 1.0f;
    out[3 * BA + i] = ay - 1.0f;
    out[4 * BA + i] = ax + 1.0f;
    out[5 * BA + i] = ay + 1.0f;
    for (int k = 6; k < 10; ++k) out[k * BA + i] = 0.0f;
}

extern "C" __global__ void tal_dense_fg(const float* fg, float* out, int nfg, long long BA) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= nfg) return;
    const float* row = fg + 11 * (long long)r;
    const long long i = (long long)row[0];
    if (i < 0 || i >= BA) return;
    for (int k = 0; k < 10; ++k) out[k * BA + i] = row[1 + k];
}
