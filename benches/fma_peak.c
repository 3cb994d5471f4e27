// Peak f32 FMA throughput of one core, the ceiling the CPU tables of docs/benchmarks.md compare
// the engine's GFLOP/s against: 12 independent chains of vector FMAs (enough to cover the FMA
// latency on two ports), nothing else in the loop.
//
//   gcc -O2 -mavx2 -mfma benches/fma_peak.c -o /tmp/fma_ymm && /tmp/fma_ymm
//   gcc -O2 -mavx512f -DZMM benches/fma_peak.c -o /tmp/fma_zmm && /tmp/fma_zmm
//   (/tmp/fma_ymm & /tmp/fma_ymm & wait)      # both cores of a 2-core machine at once
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#ifdef ZMM
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define STORE _mm512_storeu_ps
#define NAME "zmm"
#else
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define STORE _mm256_storeu_ps
#define NAME "ymm"
#endif

int main(void) {
    vec a[12];
    const vec m = SET1(0.9999f), c = SET1(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = SET1((float)i);
    const long n = 400000000L;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = FMA(a[i], m, c);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    float acc = 0, v[LANES];
    for (int i = 0; i < 12; i++) {
        STORE(v, a[i]);
        acc += v[0];
    }
    // 2 FLOP per lane per FMA; the sum keeps the chains alive.
    printf("fma_peak %s %.1f GFLOP/s per core (checksum %g)\n", NAME, n * 12.0 * LANES * 2 / s / 1e9, acc);
    return 0;
}
