#include "ep/cpu_ep_plan.hpp"

#include "ep/ep_index.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::ep {

CpuDispatchPlan plan_cpu_dispatch(const int32_t* ids, int64_t tokens, int32_t top_k, int32_t experts,
                                  int32_t ranks, int64_t recv_capacity) {
  NVFP4_CHECK(ranks >= 1 && experts % ranks == 0, "expert parallelism: E=", experts,
              " experts are not divisible by R=", ranks, " ranks");
  CpuDispatchPlan p;
  p.ranks = ranks;
  p.experts_per_rank = experts_per_rank(experts, ranks);
  p.token_begin.resize(size_t(ranks + 1));
  for (int32_t r = 0; r <= ranks; ++r) p.token_begin[size_t(r)] = token_chunk_begin(tokens, ranks, r);
  p.send_count.assign(size_t(ranks * ranks), 0);
  p.recv_count.assign(size_t(ranks), 0);
  p.recv_offset.assign(size_t(ranks * ranks), 0);
  for (int32_t src = 0; src < ranks; ++src)
    for (int64_t t = p.token_begin[size_t(src)]; t < p.token_begin[size_t(src + 1)]; ++t)
      for (int32_t j = 0; j < top_k; ++j) {
        const int32_t dst = slot_owner(ids[t * top_k + j], experts, p.experts_per_rank);
        if (dst >= 0) ++p.send_count[size_t(src * ranks + dst)];
      }
  for (int32_t dst = 0; dst < ranks; ++dst) {
    int64_t at = 0;
    for (int32_t src = 0; src < ranks; ++src) {
      p.recv_offset[size_t(src * ranks + dst)] = at;
      at += p.send_count[size_t(src * ranks + dst)];
    }
    p.recv_count[size_t(dst)] = at;
    NVFP4_CHECK(recv_capacity <= 0 || at <= recv_capacity, "expert parallelism: rank ", dst, " would receive ", at,
                " (token, expert) pairs, above its receive capacity ", recv_capacity);
  }
  return p;
}

}  // namespace nvfp4moe::ep
