// run_expert_gemm (see the header).
#include "cuda/backend/expert_gemm.hpp"
#include "cuda/kernels/ref/grouped_gemm_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda/kernels/sm90_nvfp4_prefill_gemm.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int64_t kDecodeMaxPerExpert = 3;
constexpr int64_t kNarrowMaxPerExpert = 16;
// NOTES (measured on the H200): above it the Split launches everywhere.
// With three consumer warpgroups in the 32-wide prefill kernel the decode
// kernel wins only up to 2-3 pairs per expert (one run, GEMMs us, decode /
// 32-wide prefill: EP8 T=16 (2 a expert) 513 / 589, T=32 (4) 614 / 579,
// T=64 (8) 687 / 586; EP1 T=128 (2) 3937 / 3898, T=256 (4) 4952 / 4596,
// T=512 (8) 6072 / 5168; on an H100, EP8 T=32: the best decode
// configuration 663-673, 32-wide 621-627); with two it won up to 16.
// A separate 64-wide candidate for 17-48 tokens per expert measured 2-4 %
// slower than Split at EP1 T=2048 (32 per expert) once the descriptors were
// uniform: Split runs those experts' blocks 32 or 64 wide, never wider.
// From 4 to 16 pairs per expert nearly every expert's rows fit one 32-wide
// block (uniform routing at 16 a expert: more than 32 rows once in ~10^4
// experts), so the Split launches amount to the 32-wide one and three that
// find nothing to do; the Narrow candidate is that one launch alone. On an
// H100, routed path in a graph, Split against Narrow: V4-Pro EP8 T=128 (16 a
// expert) 709 / 691 us; V4-Flash EP8 T=64 (12) 228 / 214, T=128 (24) 264 /
// 222. Above 16 an expert's rows spill into a second 32-wide block more
// often, which reads its weights twice where Split's 64-wide block reads
// them once (at 32 a expert: V4-Pro EP8 T=256, 885 against 773 us).

constexpr int64_t kDecodeMaxTouched = 80;
// NOTES (H100, routed path in a graph, decode / 32-wide launch forced on the
// same routing, two rounds): the decode kernel's lead over the 32-wide launch
// follows the number of experts touched, not the pairs an expert. EP1 V4-Pro
// (384 experts): 46 touched (T=8) 612 / 635 us, 64 (T=12) 836 / 859, 87
// (T=16) 1222 / 1146, 107 (T=20) 1504 / 1371, 128 (T=24) 1828 / 1658; EP1
// V4-Flash (256): 46 touched 254 / 263, 59 330 / 320, 85 465 / 485, 109 613 /
// 598, 144 772 / 717, 202 1094 / 1003; with 48 local experts (at most 48
// touched) the decode kernel leads up to 2.5 pairs an expert. The H200 rows
// at 239 and 300 touched (EP1 V4-Pro T=64, 128) tied: 2790 / 2796, 3937 /
// 3898. So the decode range also ends where uniform routing is expected to
// touch kDecodeMaxTouched experts. Near 80 the two models part: V4-Pro at
// T=15 (90 pairs, 80.3 experts expected) takes 1134 us with the decode
// kernel and 1045-1052 with the 32-wide launch, V4-Flash at T=16 (96 pairs,
// 80.2 expected) 464-466 and 482-486, and T=17 (84.3 expected) ties. 80
// keeps the larger of the two gains. On an H200 (same bench) V4-Pro crosses
// at the same place (80 and 87 touched tie: 941 / 946, 1039 / 1037; 107:
// 1303 / 1226), V4-Flash only near 144 (85 touched 414 / 460, 109 553 /
// 570, 144 676 / 669): the rule costs V4-Flash 3-10 % there.

}  // namespace

ExpertGemmChoice choose_expert_gemm(int64_t local, int64_t pairs_bound, int64_t pairs_planned, bool has_fragment,
                                    bool decode_supported, const char* forced) {
  NVFP4_CHECK(local > 0, "choose_expert_gemm: local_experts must be positive, got ", local);
  using C = ExpertGemmCandidate;
  const int64_t all = std::max<int64_t>(0, pairs_bound);
  ExpertGemmChoice out;
  out.decode_sized_for = pairs_planned < 0 ? all : std::min(pairs_planned, all);
  const bool decode = has_fragment && decode_supported;
  const bool named = forced && *forced;
  NVFP4_CHECK(!named || std::strcmp(forced, "wgmma") == 0 || std::strcmp(forced, "narrow") == 0 ||
                  std::strcmp(forced, "decode") == 0,
              "NVFP4MOE_GEMM=", forced, ": expected decode, narrow or wgmma");
  if (!has_fragment) {
    out.candidates[out.count++] = C{C::Simple, -1, all};
    return out;
  }
  if (named) {  // one kernel; decode where it cannot take the shape: the Split launches
    const C::Kind k = std::strcmp(forced, "narrow") == 0 ? C::Narrow
                      : std::strcmp(forced, "decode") == 0 && decode ? C::Decode
                                                                     : C::Wgmma;
    out.candidates[out.count++] = C{k, -1, all};
    return out;
  }
  const int64_t decode_end = std::min(kDecodeMaxPerExpert * local, pairs_touching_at_most(local, kDecodeMaxTouched));
  out.decode_sized_for = std::min(out.decode_sized_for, decode_end);
  const int64_t decode_max = decode ? decode_end : -1;
  const int64_t narrow_max = kNarrowMaxPerExpert * local;
  const C ranges[3] = {{C::Decode, -1, decode_max}, {C::Narrow, decode_max, narrow_max}, {C::Wgmma, narrow_max, all}};
  for (const C& c : ranges) {
    const int64_t hi = std::min(c.at_most, all);
    if (hi > c.above) out.candidates[out.count++] = C{c.kind, c.above, hi};
  }
  return out;
}

int64_t pairs_touching_at_most(int64_t experts, int64_t touched) {
  NVFP4_CHECK(experts >= 1 && touched >= 0, "pairs_touching_at_most: ", touched, " of ", experts, " experts");
  if (touched >= experts) return std::numeric_limits<int64_t>::max();
  // p pairs drawn uniformly leave an expert untouched with probability
  // (1 - 1/E)^p: E (1 - (1 - 1/E)^p) <= n  <=>  p <= log(1 - n/E) / log(1 - 1/E).
  const double e = double(experts), n = double(touched);
  return int64_t(std::floor(std::log1p(-n / e) / std::log1p(-1.0 / e) + 1e-9));
}

int64_t planned_pairs(int64_t slots, int64_t local_experts, int64_t experts) {
  NVFP4_CHECK(slots >= 0 && local_experts >= 1 && experts >= local_experts, "planned_pairs: ", slots, " slots, ",
              local_experts, " local experts of ", experts);
  // 1.5 times the uniform share, rounded up: headroom for an uneven step
  const int64_t planned = (3 * slots * local_experts + 2 * experts - 1) / (2 * experts);
  return std::min(slots, planned);
}

void prepare_expert_gemm(int64_t local_experts) { sm90_nvfp4_prefill_gemm_prepare(local_experts); }

OperandOrder ExpertGemmChoice::operand_order(const int32_t* live_pairs) const {
  // k-slot order exactly where the prefill kernel runs (the top ranges).
  OperandOrder o;  // logical
  for (int i = 0; i < count; ++i) {
    if (!ExpertGemmCandidate::prefill(candidates[i].kind)) continue;
    o.kslot_above = int32_t(candidates[i].above);
    o.live_pairs = count > 1 ? live_pairs : nullptr;  // one candidate: no count needed
    break;
  }
  return o;
}

ExpertGemmCandidate::Kind ExpertGemmChoice::kind_for(int64_t live) const {
  for (int i = 0; i < count; ++i)
    if (candidates[i].above < live && live <= candidates[i].at_most) return candidates[i].kind;
  NVFP4_FAIL("ExpertGemmChoice: no candidate for ", live, " live pairs");
}

ExpertGemmChoice expert_gemm_choice(int64_t local_experts, int64_t pairs_bound, int64_t pairs_planned,
                                    const FragmentWeights* gate_up, const FragmentWeights* down) {
  NVFP4_CHECK(!gate_up == !down, "expert_gemm_choice: both projections or neither in the fragment layout");
  const bool decode = gate_up && sm90_nvfp4_decode_fits(gate_up->geometry, down->geometry);
  return choose_expert_gemm(local_experts, pairs_bound, pairs_planned, gate_up != nullptr, decode,
                            std::getenv("NVFP4MOE_GEMM"));
}

void run_expert_gemm(const GroupedGemmPlan& plan, const FragmentWeights* fragment, const ExpertGemmChoice& choice,
                     cudaStream_t stream) {
  NVFP4_CHECK(plan.offsets && plan.local_experts > 0, "run_expert_gemm: plan.offsets and local_experts are required");
  NVFP4_CHECK(fragment || choice.count == 0 || choice.candidates[0].kind == ExpertGemmCandidate::Simple,
              "run_expert_gemm: the choice needs the fragment-layout weights");
  const int64_t local = plan.local_experts;
  for (int i = 0; i < choice.count; ++i) {
    const ExpertGemmCandidate& c = choice.candidates[i];
    if (c.at_most <= 0) continue;  // nothing can be live
    GroupedGemmPlan p = plan;
    if (choice.count > 1) {  // only the device knows which one is right
      p.live_pairs = plan.offsets + local;
      p.pairs_above = int32_t(c.above);
      p.pairs_at_most = int32_t(c.at_most);
    }
    switch (c.kind) {
      case ExpertGemmCandidate::Simple:
        grouped_gemm_ref(p, stream);
        break;
      case ExpertGemmCandidate::Decode:
        // decode_sized_for is at most the candidate's bound (choose_expert_gemm).
        sm90_nvfp4_decode_gemm(p, *fragment, sm90_nvfp4_decode_gemm_config(choice.decode_sized_for, local), stream);
        break;
      case ExpertGemmCandidate::Narrow:
        sm90_nvfp4_prefill_gemm(p, *fragment, Sm90PrefillGemmConfig{.block_n = 32, .blocks = TokenBlocks::All}, stream);
        break;
      case ExpertGemmCandidate::Wgmma:  // 128-wide blocks; a last block at the width of its rows
        sm90_nvfp4_prefill_gemm_split(p, *fragment, stream);
        break;
    }
  }
}

}  // namespace nvfp4moe::cuda
