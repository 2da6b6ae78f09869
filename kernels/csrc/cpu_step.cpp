// The work of a CPU decoder layer around its products, a few calls per layer instead of a few
// dozen torch operators: at one to a few rows each operator's fixed cost (dispatch, allocation,
// a thread-pool wake-up) is most of its time, and on the development machine the operators
// between the products took a third of a decode row's forward.
//
//   add_rms     x' = x + r; h = w * (x' * rsqrt(mean(x'^2) + eps))     (r may be absent)
//   silu_mul    out = silu(gate) * up, the halves of one gate|up row side by side
//   rope_write  rotate the queries and keys of each row at its position (RoPE as
//               x * cos + roll(x, D/2) * signed sin), the queries into a buffer, the keys and
//               the values into their cache slots
//   attend      each row's attention over its sequence's cached columns (runs of consecutive
//               slots, read in place) and over the fed columns it sees: a chain's earlier rows,
//               or a tree node's ancestors; softmax in float32
//
// Every output row is computed by the same sequence of operations whatever else shares the call:
// work is split over torch's threads by rows (and heads), never inside a row's sums. So a row's
// bits do not depend on the row count, the batch, or the thread count; a verified row gets a
// decode row's numbers. Built by kernels/cpu_step.py with -ffp-contract=off: rope_write's
// products and sum are rounded one by one, as torch's mul, mul, add round them, so the keys a
// row writes are the ones the torch operators write.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// exp(x) for float32 in a form the compiler vectorizes: 2^n * p(r), n = round(x / ln 2),
// r = x - n ln 2 (two-part ln 2), p a degree-6 polynomial (relative error ~2e-7 on the range).
inline float exp_approx(float x) {
  x = std::min(88.3762626647949f, std::max(-87.3365447505531f, x));
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(n) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

CLONES void add_rms_row(const float* x, const float* r, const float* w, float eps, int64_t H,
                        float* x_out, float* h_out) {
  const float* src = x;
  if (r != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) x_out[j] = x[j] + r[j];
    src = x_out;
  }
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < H; ++j) sum += src[j] * src[j];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(H) + eps);
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) h_out[j] = w[j] * (src[j] * inv);
}

CLONES void silu_mul_row(const float* gu, int64_t I, float* out) {
  const float* up = gu + I;
#pragma omp simd
  for (int64_t j = 0; j < I; ++j) {
    const float g = gu[j];
    out[j] = g / (1.0f + exp_approx(-g)) * up[j];
  }
}

// One row's heads (queries then keys, each D wide) rotated: out[d] = x[d] * cos[d] +
// x[(d + D/2) % D] * sin[d].
void rope_head(const float* x, const float* cos, const float* sin, int64_t D, float* out) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) out[d] = x[d] * cos[d] + x[d + half] * sin[d];
  for (int64_t d = half; d < D; ++d) out[d] = x[d] * cos[d] + x[d - half] * sin[d];
}

struct Seq {  // one sequence's rows and where its context lies
  int64_t first_row, rows, start, run_off, runs, anc_off;
};

// Rows r0..r1 of sequence s, the query heads of kv head kvh (rows x group queries): each
// query's softmax(q K^T * scale) V over the columns it sees. The queries share each key and value
// read (one pass over the context for all of them); each query's own arithmetic (its dots, its
// maximum, its sum, its weighted values, column after column) is the same whichever queries share
// its block. scores: [queries, columns] scratch; out: [T, Hq * D].
CLONES void attend_block(const float* q, const float* k_cache, const float* v_cache, int64_t Hq,
                         int64_t Hkv, int64_t D, float scale, const Seq& s, const int64_t* runs,
                         const uint8_t* anc, int64_t r0, int64_t r1, int64_t kvh, float* scores,
                         float* out) {
  const int64_t group = Hq / Hkv, nq = (r1 - r0) * group, stride = Hkv * D;
  const bool chain = s.anc_off < 0;
  const int64_t cols = chain ? s.start + r1 : s.start + s.rows;  // the block's widest view
  std::vector<float> best(nq), total(nq);
  std::vector<const float*> qs(nq);
  std::vector<float*> outs(nq);
  std::vector<int64_t> seen(nq);
  std::vector<const uint8_t*> mine(nq);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t r = r0 + i / group, h = kvh * group + i % group, row = s.first_row + r;
    qs[i] = q + (row * Hq + h) * D;
    outs[i] = out + (row * Hq + h) * D;
    seen[i] = chain ? s.start + r + 1 : s.start + s.rows;
    mine[i] = chain ? nullptr : anc + s.anc_off + r * s.rows;
    best[i] = -INFINITY;
  }
  int64_t col = 0;
  for (int64_t run = 0; run < s.runs && col < cols; ++run) {
    const int64_t first = runs[2 * (s.run_off + run)], n = runs[2 * (s.run_off + run) + 1];
    for (int64_t c = 0; c < n && col < cols; ++c, ++col) {
      const float* k = k_cache + (first + c) * stride + kvh * D;
      for (int64_t i = 0; i < nq; ++i) {
        if (col >= seen[i]) continue;
        float* sc = scores + i * cols + col;
        if (mine[i] != nullptr && col >= s.start && !mine[i][col - s.start]) {
          *sc = -INFINITY;
          continue;
        }
        const float* qi = qs[i];
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qi[d] * k[d];
        *sc = dot * scale;
        best[i] = std::max(best[i], *sc);
      }
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* sc = scores + i * cols;
    const float m = best[i];
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < seen[i]; ++c) {
      const float e = exp_approx(sc[c] - m);
      sc[c] = sc[c] == -INFINITY ? 0.f : e;
      sum += sc[c];
    }
    total[i] = sum;
    for (int64_t d = 0; d < D; ++d) outs[i][d] = 0.f;
  }
  col = 0;
  for (int64_t run = 0; run < s.runs && col < cols; ++run) {
    const int64_t first = runs[2 * (s.run_off + run)], n = runs[2 * (s.run_off + run) + 1];
    for (int64_t c = 0; c < n && col < cols; ++c, ++col) {
      const float* v = v_cache + (first + c) * stride + kvh * D;
      for (int64_t i = 0; i < nq; ++i) {
        if (col >= seen[i]) continue;
        const float p = scores[i * cols + col];
        if (p == 0.f) continue;
        float* o = outs[i];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
      }
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    const float inv = 1.0f / total[i];
    float* o = outs[i];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
  }
}

constexpr int64_t ROW_BLOCK = 2;  // rows a task takes (with its kv head's query heads)

// rows below this many (per call) run on the calling thread: waking the pool costs more
template <typename F>
void over(int64_t n, int64_t grain, const F& f) {
  if (n <= grain) {
    f(0, n);
  } else {
    at::parallel_for(0, n, grain, f);
  }
}

}  // namespace

extern "C" {

// x, r, x_out, h_out: [rows, H] contiguous (r and x_out may be null: h = rms(x)); w [H].
void splitspec_add_rms(const float* x, const float* r, const float* w, float eps, int64_t rows,
                       int64_t H, float* x_out, float* h_out) {
  over(rows, 4, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t)
      add_rms_row(x + t * H, r ? r + t * H : nullptr, w, eps, H, x_out ? x_out + t * H : nullptr,
                  h_out + t * H);
  });
}

// gu [rows, 2I] (gate, then up), out [rows, I].
void splitspec_silu_mul(const float* gu, int64_t rows, int64_t I, float* out) {
  over(rows, 2, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) silu_mul_row(gu + t * 2 * I, I, out + t * I);
  });
}

// qkv [T, ld]: each row's Hq query heads, Hkv key heads and Hkv value heads (D each) from
// column 0; pos [T]; cos, sin [positions, D] (sin signed); slots [T]; q_out [T, Hq, D];
// k_cache, v_cache [slots, Hkv, D] (one layer).
void splitspec_rope_write(const float* qkv, int64_t T, int64_t ld, int64_t Hq, int64_t Hkv,
                          int64_t D, const int64_t* pos, const float* cos, const float* sin,
                          const int64_t* slots, float* q_out, float* k_cache, float* v_cache) {
  over(T, 8, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) {
      const float* row = qkv + t * ld;
      const float* c = cos + pos[t] * D;
      const float* s = sin + pos[t] * D;
      for (int64_t h = 0; h < Hq; ++h) rope_head(row + h * D, c, s, D, q_out + (t * Hq + h) * D);
      float* k = k_cache + slots[t] * Hkv * D;
      for (int64_t h = 0; h < Hkv; ++h) rope_head(row + (Hq + h) * D, c, s, D, k + h * D);
      std::memcpy(v_cache + slots[t] * Hkv * D, row + (Hq + Hkv) * D, Hkv * D * sizeof(float));
    }
  });
}

// q [T, Hq, D]; k_cache, v_cache [slots, Hkv, D]; seqs [n_seqs, 6]: first row, rows, cached
// columns, first run, runs, offset of its [rows, rows] ancestor bytes in anc (-1: a chain,
// row r sees fed rows 0..r); runs [*, 2]: first slot, columns, in column order; out [T, Hq * D]
// (rows of sequences not listed are left as they are). max_ctx: the longest context listed.
void splitspec_attend(const float* q, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                      const float* k_cache, const float* v_cache, const int64_t* seqs,
                      int64_t n_seqs, const int64_t* runs, const uint8_t* anc, int64_t max_ctx,
                      float* out) {
  // tasks: (sequence, block of up to ROW_BLOCK rows, kv head), in that order
  std::vector<int64_t> ends(n_seqs);
  int64_t tasks = 0;
  for (int64_t i = 0; i < n_seqs; ++i)
    ends[i] = tasks += (seqs[6 * i + 1] + ROW_BLOCK - 1) / ROW_BLOCK * Hkv;
  const int64_t group = Hq / Hkv;
  // a task costs ~25 ns a column and query on the development machine: chunks of ~20 us, so a
  // decode row's kv heads already split over two threads and the pool's wake-up stays small
  const int64_t per_task = std::max<int64_t>(1, max_ctx * group * ROW_BLOCK);
  over(tasks, std::max<int64_t>(1, 800 / per_task), [&](int64_t a, int64_t b) {
    std::vector<float> scores(ROW_BLOCK * group * std::max<int64_t>(1, max_ctx));
    int64_t i = std::upper_bound(ends.begin(), ends.end(), a) - ends.begin();
    for (int64_t task = a; task < b; ++task) {
      while (task >= ends[i]) ++i;
      const int64_t* f = seqs + 6 * i;
      const Seq s{f[0], f[1], f[2], f[3], f[4], f[5]};
      const int64_t local = task - (ends[i] - (s.rows + ROW_BLOCK - 1) / ROW_BLOCK * Hkv);
      const int64_t block = local / Hkv, kvh = local % Hkv;
      const int64_t r0 = block * ROW_BLOCK, r1 = std::min(s.rows, r0 + ROW_BLOCK);
      attend_block(q, k_cache, v_cache, Hq, Hkv, D, scale, s, runs, anc, r0, r1, kvh,
                   scores.data(), out);
    }
  });
}

}  // extern "C"
