// y[M, N] = (x[M, K] @ Q[N, K]^T) * scale[N] (+ bias): fp32 rows, weights stored as int8 with one
// fp32 scale per output column (weight-only, symmetric, per-channel quantization).
//
// Every output is the plain sequential sum acc = fma(x[m, k], float(Q[n, k]), acc) over
// k = 0..K-1 from zero, then acc * scale[n] (then + bias[n]), one column per SIMD lane: the same
// scheme as fp16_dot.cpp with half its weight bytes. Rows are tiled (a tile of rows shares each
// loaded and converted weight chunk), columns are split over threads (at::parallel_for, torch's
// thread pool) and the vector width is AVX-512's or AVX2's, but none of that changes the
// operations any one output sees: a row's bits do not depend on how many rows share the call, on
// the thread count, or on which of the two instruction sets runs. Built with -ffp-contract=off
// (kernels/cpp_build.py) so the scale's product and the bias's sum stay two roundings in both
// instruction sets. Loaded by kernels/int8_dot.py.
//
// The weight is packed by panels of PANEL columns: [ceil(N / PANEL)][K][PANEL] int8, zero-padded,
// so one thread streams its panels' weights as one sequential read (a decode row is bound by
// reading the weights), asking for the line PREFETCH bytes ahead as it goes.

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

#define UNROLL _Pragma("GCC unroll 16")

constexpr int PANEL = 32;  // columns per panel: 2 AVX-512 or 4 AVX2 vectors, 32 bytes per k
constexpr int PREFETCH = 2048;  // bytes ahead of the weight read (fp16_dot.cpp: 4 KiB at 64 B/k)

// Rows [MT] x columns [NB vectors of 16] of one panel, or of two side by side when NB is 4
// (w: the first panel's first column; the second panel K * PANEL further).
template <int MT, int NB>
__attribute__((target("avx512f")))
void tile_avx512(const float* x, const int8_t* w, int64_t K, const float* scale,
                 const float* bias, float* y, int64_t ldy, int cols) {
  const int64_t second = K * PANEL;
  __m512 acc[MT][NB];
  UNROLL for (int m = 0; m < MT; ++m)
    UNROLL for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k, w += PANEL, x += MT) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH, _MM_HINT_T0);
    if (NB > 2) _mm_prefetch(reinterpret_cast<const char*>(w + second) + PREFETCH, _MM_HINT_T0);
    __m512 wv[NB];
    UNROLL for (int j = 0; j < NB; ++j)
      wv[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(w + (j / 2) * second + 16 * (j % 2)))));
    UNROLL for (int m = 0; m < MT; ++m) {
      const __m512 xv = _mm512_set1_ps(x[m]);
      UNROLL for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  UNROLL for (int j = 0; j < NB; ++j) {
    const int left = std::min(16, cols - 16 * j);
    if (left <= 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << left) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(mask, scale + 16 * j);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * j) : _mm512_setzero_ps();
    UNROLL for (int m = 0; m < MT; ++m) {
      const __m512 scaled = _mm512_mul_ps(acc[m][j], s);
      const __m512 out = bias ? _mm512_add_ps(scaled, b) : scaled;
      _mm512_mask_storeu_ps(y + m * ldy + 16 * j, mask, out);
    }
  }
}

template <int MT, int NB>
__attribute__((target("avx2,fma")))
void tile_avx2(const float* x, const int8_t* w, int64_t K, const float* scale, const float* bias,
               float* y, int64_t ldy, int cols) {
  __m256 acc[MT][NB];
  UNROLL for (int m = 0; m < MT; ++m)
    UNROLL for (int j = 0; j < NB; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k, w += PANEL, x += MT) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + PREFETCH, _MM_HINT_T0);
    __m256 wv[NB];
    UNROLL for (int j = 0; j < NB; ++j)
      wv[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 8 * j))));
    UNROLL for (int m = 0; m < MT; ++m) {
      const __m256 xv = _mm256_broadcast_ss(x + m);
      UNROLL for (int j = 0; j < NB; ++j) acc[m][j] = _mm256_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  alignas(32) static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  UNROLL for (int j = 0; j < NB; ++j) {
    const int left = std::min(8, cols - 8 * j);
    if (left <= 0) break;
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones + 8 - left));
    const __m256 s = _mm256_maskload_ps(scale + 8 * j, mask);
    const __m256 b = bias ? _mm256_maskload_ps(bias + 8 * j, mask) : _mm256_setzero_ps();
    UNROLL for (int m = 0; m < MT; ++m) {
      const __m256 scaled = _mm256_mul_ps(acc[m][j], s);
      const __m256 out = bias ? _mm256_add_ps(scaled, b) : scaled;
      _mm256_maskstore_ps(y + m * ldy + 8 * j, mask, out);
    }
  }
}

using Tile = void (*)(const float*, const int8_t*, int64_t, const float*, const float*, float*,
                      int64_t, int);

// AVX-512: a whole panel (2 vectors) against up to 14 rows: 28 accumulators, 2 weights, 1 row.
constexpr int MT512 = 14;
const Tile avx512_tiles[MT512] = {
    tile_avx512<1, 2>, tile_avx512<2, 2>, tile_avx512<3, 2>, tile_avx512<4, 2>,
    tile_avx512<5, 2>, tile_avx512<6, 2>, tile_avx512<7, 2>, tile_avx512<8, 2>,
    tile_avx512<9, 2>, tile_avx512<10, 2>, tile_avx512<11, 2>, tile_avx512<12, 2>,
    tile_avx512<13, 2>, tile_avx512<14, 2>};
// AVX-512 with up to 7 rows: two panels at once, 4 accumulators a row.
constexpr int PAIR_MT = 7;
const Tile avx512_pair_tiles[PAIR_MT] = {
    tile_avx512<1, 4>, tile_avx512<2, 4>, tile_avx512<3, 4>, tile_avx512<4, 4>,
    tile_avx512<5, 4>, tile_avx512<6, 4>, tile_avx512<7, 4>};
// AVX2: a half panel (2 vectors) against up to 6 rows: 12 accumulators, 2 weights, 1 row.
constexpr int MT256 = 6;
const Tile avx2_tiles[MT256] = {tile_avx2<1, 2>, tile_avx2<2, 2>, tile_avx2<3, 2>,
                                tile_avx2<4, 2>, tile_avx2<5, 2>, tile_avx2<6, 2>};

int isa_here() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 256;
  return 0;
}

// The rows x [M, K] (stride ldx) as the tiles read them: each tile of mt rows k-major.
void pack_rows(const float* x, int64_t M, int64_t K, int64_t ldx, int mt, float* xt) {
  for (int64_t m0 = 0; m0 < M; m0 += mt) {
    const int64_t rows = std::min<int64_t>(mt, M - m0);
    float* out = xt + m0 * K;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t m = 0; m < rows; ++m) out[k * rows + m] = x[(m0 + m) * ldx + k];
  }
}

// One panel of columns [n0, n0 + cols) for every row: tiles of up to mt rows; AVX2's tiles take
// half a panel (16 columns) at a time.
void panel(int isa, const float* xt, int64_t M, int64_t K, const int8_t* wp, const float* sp,
           const float* bp, float* y, int64_t ldy, int cols) {
  const int mt = isa == 512 ? MT512 : MT256;
  for (int half = 0; half < (isa == 512 ? 1 : 2) && 16 * half < cols; ++half)
    for (int64_t m0 = 0; m0 < M; m0 += mt) {
      const int rows = static_cast<int>(std::min<int64_t>(mt, M - m0));
      const Tile tile = isa == 512 ? avx512_tiles[rows - 1] : avx2_tiles[rows - 1];
      tile(xt + m0 * K, wp + 16 * half, K, sp + 16 * half, bp ? bp + 16 * half : nullptr,
           y + m0 * ldy + 16 * half, ldy, cols - 16 * half);
    }
}

int product(int isa, const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* w,
            const float* scale, int64_t N, const float* bias, float* y, int64_t ldy,
            bool threads) {
  if (isa == 0) return -1;
  std::vector<float> packed;
  const float* xt = x;  // one row is its own packing
  if (M > 1 || ldx < K) {
    packed.resize(M * K);
    pack_rows(x, M, K, ldx, isa == 512 ? MT512 : MT256, packed.data());
    xt = packed.data();
  }
  const int64_t panels = (N + PANEL - 1) / PANEL;
  const bool pairs = isa == 512 && M <= PAIR_MT;
  const auto run = [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * PANEL;
      if (pairs && p + 1 < p1) {
        avx512_pair_tiles[M - 1](xt, w + p * K * PANEL, K, scale + n0,
                                 bias ? bias + n0 : nullptr, y + n0, ldy,
                                 static_cast<int>(std::min<int64_t>(2 * PANEL, N - n0)));
        ++p;
        continue;
      }
      panel(isa, xt, M, K, w + p * K * PANEL, scale + n0, bias ? bias + n0 : nullptr, y + n0,
            ldy, static_cast<int>(std::min<int64_t>(PANEL, N - n0)));
    }
  };
  if (!threads) {
    run(0, panels);
    return 0;
  }
  // at least ~16 KiB of weights per task: the pool's wake-up is not worth less
  at::parallel_for(0, panels, std::max<int64_t>(1, 16384 / (K * PANEL)), run);
  return 0;
}

}  // namespace

extern "C" {

// The vector width this CPU runs the product with (512, 256), 0 where neither runs.
int splitspec_int8_dot_isa() { return isa_here(); }

// Columns per panel of the packed layout.
int splitspec_int8_dot_panel() { return PANEL; }

// x: [M, K] rows with stride ldx; w: packed (see above) for N columns; scale: [N]; bias: [N] or
// null; y: [M, N] with stride ldy.
// Returns 0, or -1 where the CPU runs neither instruction set.
int splitspec_int8_dot(const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* w,
                       const float* scale, int64_t N, const float* bias, float* y, int64_t ldy) {
  return product(isa_here(), x, M, K, ldx, w, scale, N, bias, y, ldy, true);
}

// The same product with AVX2's code on one thread (where the CPU has AVX2): for the test that
// both instruction sets and every thread count give the same bits.
int splitspec_int8_dot_avx2(const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* w,
                            const float* scale, int64_t N, const float* bias, float* y,
                            int64_t ldy) {
  return product(isa_here() ? 256 : 0, x, M, K, ldx, w, scale, N, bias, y, ldy, false);
}

}  // extern "C"
