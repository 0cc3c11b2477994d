// Combine: y_t = sum_j w_j * o_{idx_j} + shared(x_t), rounded to BF16 once.
// The weighting (w_j * o_j) is done where o_j is computed — on the owner rank
// under expert parallelism — and the sum in slot order on the token's rank, so
// R ranks give the same bits as one.
#include <cmath>

#include "cpu/cpu_moe.hpp"

namespace nvfp4moe::cpu {

void weight_rows(float* o, const float* w, int64_t n_pairs, int64_t hidden, WorkerPool& pool) {
  parallel_for(pool, n_pairs, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, hidden)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p)
                   for (int64_t i = 0; i < hidden; ++i) o[p * hidden + i] *= w[p];
               });
}

void weight_rows(float* o, const float* w, int64_t n_pairs, int64_t hidden) {
  WorkerPool pool(0);
  weight_rows(o, w, n_pairs, hidden, pool);
}

void combine_tokens(const float* contrib, const int64_t* pair_of_slot, int64_t tokens, int64_t k,
                    int64_t hidden, const float* shared, Bf16* y, WorkerPool& pool) {
  parallel_for(pool, tokens, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, hidden * k)),
               [&](int64_t t0, int64_t t1) {
                 std::vector<float> acc(static_cast<size_t>(hidden));
                 for (int64_t t = t0; t < t1; ++t) {
                   std::fill(acc.begin(), acc.end(), 0.0f);
                   for (int64_t j = 0; j < k; ++j) {
                     const int64_t p = pair_of_slot[t * k + j];
                     if (p < 0) continue;  // slot id -1: no expert
                     const float* c = contrib + p * hidden;
                     for (int64_t i = 0; i < hidden; ++i) acc[size_t(i)] += c[i];
                   }
                   if (shared)
                     for (int64_t i = 0; i < hidden; ++i) acc[size_t(i)] += shared[t * hidden + i];
                   for (int64_t i = 0; i < hidden; ++i) y[t * hidden + i] = bf16_from_float(acc[size_t(i)]);
                 }
               });
}

void combine_tokens(const float* contrib, const int64_t* pair_of_slot, int64_t tokens, int64_t k,
                    int64_t hidden, const float* shared, Bf16* y, int threads) {
  WorkerPool pool(threads);
  combine_tokens(contrib, pair_of_slot, tokens, k, hidden, shared, y, pool);
}

}  // namespace nvfp4moe::cpu
