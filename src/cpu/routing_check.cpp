// Expert ids from the caller are checked before any work (docs/numerics.md §6): each must
// be a GLOBAL id in [0, E) or -1 ("no expert").
#include "cpu/cpu_moe.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

namespace {
template <typename Id>
void check_ids(const Id* ids, int64_t tokens, int64_t k, int64_t experts) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = int64_t(ids[t * k + j]);
      NVFP4_CHECK(id >= -1 && id < experts, "topk_ids: token ", t, " slot ", j, " has expert id ", id,
                  " outside [-1, E=", experts, ")");
    }
}
}  // namespace

void check_topk_ids(const int32_t* ids, int64_t tokens, int64_t k, int64_t experts) {
  check_ids(ids, tokens, k, experts);
}
void check_topk_ids(const int64_t* ids, int64_t tokens, int64_t k, int64_t experts) {
  check_ids(ids, tokens, k, experts);
}

}  // namespace nvfp4moe::cpu
