// Groups routed pairs by expert with a counting sort, so each expert's weight
// tiles are dequantized once and reused across every token routed to it.
#include "cpu/cpu_moe.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

ExpertGroups group_by_expert(const ExpertPair* pairs, int64_t n, int64_t experts) {
  ExpertGroups g;
  g.offsets.assign(size_t(experts + 1), 0);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t e = pairs[p].expert;
    NVFP4_CHECK(e >= 0 && e < experts, "group_by_expert: pair ", p, " has local expert ", e,
                " outside [0, ", experts, ")");
    ++g.offsets[size_t(e + 1)];
  }
  for (int64_t e = 0; e < experts; ++e) g.offsets[size_t(e + 1)] += g.offsets[size_t(e)];
  std::vector<int64_t> fill(g.offsets.begin(), g.offsets.end() - 1);
  g.pair.resize(size_t(n));
  for (int64_t p = 0; p < n; ++p) g.pair[size_t(fill[size_t(pairs[p].expert)]++)] = int32_t(p);
  return g;
}

}  // namespace nvfp4moe::cpu
