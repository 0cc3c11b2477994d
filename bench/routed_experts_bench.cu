// sm90_gemm_bench: the routed-expert path of a DeepSeek-V4-Pro MoE layer
// (H=7168, I=3072, top-6) on one H200, per stage and as one CUDA graph:
//
//   group_pairs_ref -> quantize x -> L1 gate/up + SwiGLU -> requantize h ->
//   L2 down x w_j -> combine
//
// with the fast staging (sm90_nvfp4_stage / _requant) and the GEMMs the
// backend runs (run_expert_gemm: decode sm90_nvfp4_decode_gemm or prefill
// sm90_nvfp4_prefill_gemm, chosen on the device), and, side by side, the simple
// staging, the correctness-first GEMM (grouped_gemm_ref) and a sweep
// of the other kernels and configurations. Ceilings are measured in
// the same run: HBM read bandwidth (a large sum) and BF16 dense peak (cuBLAS
// 8192^3). Roofline of the GEMMs: max(bytes of the touched experts' codes +
// scales / read BW, 2 * pairs * 3 * H * I / BF16 peak).
//
// Weights and inputs are random bytes (timing does not depend on values; the
// GPU tests check the numbers). Usage:
//   sm90_gemm_bench [--experts 48,384] [--tokens 1,8,64,512,2048,4096,8192]
//                   [--reps N] [--json FILE] [--no-simple]
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/backend/expert_gemm.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/grouping.hpp"
#include "cuda/kernels/ref/grouped_gemm_ref.hpp"
#include "cuda/kernels/ref/grouping_ref.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/kernels/sm90_nvfp4_prefill_gemm.hpp"
#include "cuda/kernels/staging.hpp"

using namespace nvfp4moe;
using namespace nvfp4moe::cuda;
using bf16 = __nv_bfloat16;

namespace {

constexpr int64_t kH = 7168, kI = 3072, kTopK = 6;

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random bytes; span > 0 keeps them in [lo, lo + span) (scale bytes of sane size).
__global__ void fill_bytes(uint8_t* p, size_t n, uint64_t seed, int lo, int span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix(seed + i * 0x9e3779b97f4a7c15ull);
    p[i] = span > 0 ? uint8_t(lo + int(r % uint64_t(span))) : uint8_t(r);
  }
}

__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix(seed + i * 0x9e3779b97f4a7c15ull);
    p[i] = __float2bfloat16(float(int64_t(r % 2001) - 1000) * 0.004f);
  }
}

__global__ void read_sum(const uint4* p, size_t n, unsigned* out) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x + v.y + v.z + v.w;
  }
  if (acc == 0x12345678u) *out = acc;  // keeps the loads alive
}

void fill(uint8_t* p, size_t n, uint64_t seed, int lo = 0, int span = 0) {
  fill_bytes<<<2048, 256>>>(p, n, seed, lo, span);
  NVFP4_CUDA_CHECK_LAUNCH("fill_bytes");
}

// The middle value of t (the upper one of an even count).
double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median time (us) of `reps` runs of fn between two events.
double time_us(int reps, const std::function<void()>& fn) {
  CudaEvent a, b;
  std::vector<double> t;
  fn();  // warm-up
  for (int i = 0; i < reps; ++i) {
    NVFP4_CUDA_CHECK(cudaEventRecord(a.get()));
    fn();
    NVFP4_CUDA_CHECK(cudaEventRecord(b.get()));
    NVFP4_CUDA_CHECK(cudaEventSynchronize(b.get()));
    float ms = 0;
    NVFP4_CUDA_CHECK(cudaEventElapsedTime(&ms, a.get(), b.get()));
    t.push_back(ms * 1e3);
  }
  return median(t);
}

double measure_read_bw() {
  const size_t bytes = size_t(4) << 30;
  DeviceBuffer<uint8_t> buf(bytes);
  DeviceBuffer<unsigned> out(1);
  fill(buf.get(), bytes, 1);
  const double us = time_us(10, [&] {
    read_sum<<<132 * 8, 512>>>(reinterpret_cast<const uint4*>(buf.get()), bytes / 16, out.get());
  });
  return double(bytes) / (us * 1e-6);
}

// A device-to-device copy's bytes moved (read + written) per second: the
// ceiling of a kernel that reads and writes the same amount (the staging),
// which mixed read/write traffic keeps below the read ceiling.
double measure_copy_bw() {
  const size_t bytes = size_t(256) << 20;
  DeviceBuffer<uint8_t> src(bytes), dst(bytes);
  fill(src.get(), bytes, 1);
  const double us = time_us(10, [&] {
    NVFP4_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr));
  });
  return 2.0 * double(bytes) / (us * 1e-6);
}

double measure_bf16_peak() {
  const int n = 8192;
  DeviceBuffer<bf16> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  fill_bf16<<<2048, 256>>>(a.get(), a.size(), 2);
  fill_bf16<<<2048, 256>>>(b.get(), b.size(), 3);
  CublasHandle h;
  const float one = 1.0f, zero = 0.0f;
  const double us = time_us(10, [&] {
    NVFP4_CUBLAS_CHECK(cublasGemmEx(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.get(), CUDA_R_16BF, n, b.get(),
                                    CUDA_R_16BF, n, &zero, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  });
  return 2.0 * n * double(n) * n / (us * 1e-6);
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

struct Stages {
  double group = 0, quant = 0, l1 = 0, requant = 0, l2 = 0, combine = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> experts_list = {48, 384}, tokens_list = {1, 8, 64, 512, 2048, 4096, 8192};
  int reps = 20;
  bool run_simple = true;
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--experts" && i + 1 < argc) experts_list = parse_list(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) tokens_list = parse_list(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--no-simple") run_simple = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  FILE* js = json_path ? std::fopen(json_path, "w") : nullptr;

  const double bw = measure_read_bw();
  const double copy_bw = measure_copy_bw();
  const double peak = measure_bf16_peak();
  std::printf("ceilings: HBM read %.2f TB/s, copy (read + write) %.2f TB/s, BF16 dense %.0f TFLOP/s\n", bw * 1e-12,
              copy_bw * 1e-12, peak * 1e-12);
  if (js)
    std::fprintf(js, "{\"kind\":\"ceilings\",\"read_tbps\":%.4f,\"copy_tbps\":%.4f,\"bf16_tflops\":%.1f}\n",
                 bw * 1e-12, copy_bw * 1e-12, peak * 1e-12);

  const int64_t max_T = *std::max_element(tokens_list.begin(), tokens_list.end());
  const int64_t max_P = max_T * kTopK;
  const FragmentGeometry g1 = fragment_geometry(Projection::GateUp, kH, kI), g2 = fragment_geometry(Projection::Down, kH, kI);
  const PackedGeometry q1 = packed_geometry(Projection::GateUp, kH, kI), q2 = packed_geometry(Projection::Down, kH, kI);
  const int64_t kp1 = q1.k_steps * kTileK, kp2 = q2.k_steps * kTileK;

  // Per-forward buffers, sized for the largest T.
  DeviceBuffer<int32_t> ids(static_cast<size_t>(max_P)), ids32(static_cast<size_t>(max_P)), pair_of_pos(static_cast<size_t>(max_P)), pos_of_pair(static_cast<size_t>(max_P)),
      expert_of_pos(static_cast<size_t>(max_P)), num_tiles(1);
  DeviceBuffer<float> wts(static_cast<size_t>(max_P)), gx(static_cast<size_t>(max_T)), gh(static_cast<size_t>(max_P));
  DeviceBuffer<uint32_t> err(4);
  NVFP4_CUDA_CHECK(cudaMemset(err.get(), 0, 16));
  DeviceBuffer<bf16> x(size_t(max_T * kH)), xq(size_t(max_T * kp1)), hq(size_t(max_P * kp2)), y(size_t(max_T * kH));
  DeviceBuffer<float> h(size_t(max_P * kI)), y_pair(size_t(max_P * kH));
  fill_bf16<<<2048, 256>>>(x.get(), x.size(), 7);
  NVFP4_CUDA_CHECK(cudaMemset(xq.get(), 0, xq.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(hq.get(), 0, hq.bytes()));

  std::printf("\n%-4s %6s %7s %5s %-9s %9s %9s %9s %9s %7s %9s %8s %9s %9s %7s %7s\n", "EP", "T", "pairs", "exps", "config",
              "L1 us", "L2 us", "GEMM us", "floor us", "frac", "simple us", "speedup", "stage us", "graph us", "stageBW", "vs copy");
  for (const int64_t E : experts_list) {
    const char* ep = E == 48 ? "EP8" : (E == 384 ? "EP1" : "E?");
    // Weights: the decode layout and the correctness-first tile layout, random bytes.
    DeviceBuffer<uint8_t> c1(size_t(E * g1.code_bytes_per_expert())), s1(size_t(E * g1.scale_bytes_per_expert())),
        c2(size_t(E * g2.code_bytes_per_expert())), s2(size_t(E * g2.scale_bytes_per_expert()));
    fill(c1.get(), c1.size(), 11);
    fill(s1.get(), s1.size(), 12, 0x30, 0x20);
    fill(c2.get(), c2.size(), 13);
    fill(s2.get(), s2.size(), 14, 0x30, 0x20);
    // The tile layout only feeds the correctness-first kernel's column.
    DeviceBuffer<uint8_t> t1(run_simple ? size_t(E * q1.bytes_per_expert()) : 1), t2(run_simple ? size_t(E * q2.bytes_per_expert()) : 1);
    if (run_simple) {  // scale bytes sit inside each tile: bound every byte to a sane scale
      fill(t1.get(), t1.size(), 15, 0x30, 0x20);
      fill(t2.get(), t2.size(), 16, 0x30, 0x20);
    }
    prepare_expert_gemm(E);
    std::vector<float> w13g(size_t(2 * E), 1e-3f), w2g(size_t(E), 1e-3f);
    DeviceBuffer<float> dw13g(w13g.size()), dw2g(w2g.size());
    dw13g.upload(w13g.data(), w13g.size());
    dw2g.upload(w2g.data(), w2g.size());
    DeviceBuffer<GemmTile> tiles(size_t(max_gemm_tiles(max_P, E, kGemmTileTokens)));

    for (const int64_t T : tokens_list) {
      const int64_t P = T * kTopK;
      // Routing: top-6 distinct experts per token, uniform.
      std::mt19937_64 rng(uint64_t(T * 1000 + E));
      std::vector<int32_t> hid(static_cast<size_t>(P));
      std::vector<float> hw(static_cast<size_t>(P));
      std::set<int32_t> touched;
      for (int64_t t = 0; t < T; ++t) {
        std::set<int32_t> pick;
        while (int64_t(pick.size()) < kTopK) pick.insert(int32_t(rng() % uint64_t(E)));
        int j = 0;
        for (int32_t e : pick) {
          hid[size_t(t * kTopK + j)] = e;
          hw[size_t(t * kTopK + j)] = 0.25f;
          ++j;
          touched.insert(e);
        }
      }
      ids.upload(hid.data(), hid.size());
      wts.upload(hw.data(), hw.size());
      const int64_t max_tiles = max_gemm_tiles(P, E, kGemmTileTokens);

      GroupingArgs ga;
      ga.topk_ids = ids.get();
      ga.tokens = T;
      ga.top_k = int(kTopK);
      ga.experts = E;
      ga.local_experts = E;
      ga.tile_rows = kGemmTileTokens;
      ga.ids_out = ids32.get();
      ga.offsets = nullptr;
      DeviceBuffer<int32_t> offsets(size_t(E + 1));
      ga.offsets = offsets.get();
      ga.pair_of_pos = pair_of_pos.get();
      ga.pos_of_pair = pos_of_pair.get();
      ga.expert_of_pos = expert_of_pos.get();
      ga.tiles = tiles.get();
      ga.num_tiles = num_tiles.get();
      ga.error_word = err.get();

      QuantizeActArgs qa;
      qa.x = x.get();
      qa.x_is_bf16 = true;
      qa.rows = T;
      qa.cols = kH;
      qa.g_out = gx.get();
      qa.deq = xq.get();
      qa.deq_ld = kp1;

      GroupedGemmPlan l1;
      l1.projection = Projection::GateUp;
      l1.weights = t1.get();
      l1.geometry = q1;
      l1.n_valid = kI;
      l1.w_global = dw13g.get();
      l1.act = xq.get();
      l1.ld_act = kp1;
      l1.act_rows = max_T;
      l1.pair_of_pos = pair_of_pos.get();
      l1.top_k = int(kTopK);
      l1.act_g = gx.get();
      l1.tiles = tiles.get();
      l1.num_tiles = num_tiles.get();
      l1.max_tiles = max_tiles;
      l1.offsets = offsets.get();
      l1.local_experts = E;
      l1.h_out = h.get();
      l1.ld_h = kI;
      l1.has_limit = true;
      l1.limit = 10.0f;

      RequantRowsArgs rq;
      rq.h = h.get();
      rq.ld_h = kI;
      rq.cols = kI;
      rq.rows_max = P;
      rq.num_rows = offsets.get() + E;
      rq.g_out = gh.get();
      rq.deq = hq.get();
      rq.deq_ld = kp2;

      GroupedGemmPlan l2 = l1;
      l2.projection = Projection::Down;
      l2.weights = t2.get();
      l2.geometry = q2;
      l2.n_valid = kH;
      l2.w_global = dw2g.get();
      l2.act = hq.get();
      l2.ld_act = kp2;
      l2.act_rows = max_P;
      l2.act_g = gh.get();
      l2.h_out = nullptr;
      l2.y_pair = y_pair.get();
      l2.topk_weights = wts.get();

      CombineArgs ca;
      ca.y_pair = y_pair.get();
      ca.pos_of_pair = pos_of_pair.get();
      ca.tokens = T;
      ca.hidden = kH;
      ca.top_k = int(kTopK);
      ca.y = y.get();

      const Sm90DecodeGemmConfig cfg = sm90_nvfp4_decode_gemm_config(P, E);
      const FragmentWeights m1{c1.get(), s1.get(), g1}, m2{c2.get(), s2.get(), g2};
      // The backend's GEMM: run_expert_gemm's device-side choice (its kernel name in the table).
      const ExpertGemmChoice choice = expert_gemm_choice(E, P, &m1, &m2);
      qa.deq_order = rq.deq_order = choice.operand_order(offsets.get() + E);
      const char* chosen = "?";
      for (int i = 0; i < choice.count; ++i)
        if (choice.candidates[i].above < P && P <= choice.candidates[i].at_most) {
          static const char* names[] = {"simple", "decode", "split"};
          chosen = names[choice.candidates[i].kind];
        }
      group_pairs_ref(ga, nullptr);
      quantize_activations_ref(qa, nullptr);
      run_expert_gemm(l1, &m1, choice, nullptr);
      requantize_rows_ref(rq, nullptr);
      NVFP4_CUDA_CHECK(cudaDeviceSynchronize());

      const int r = T >= 2048 ? std::max(3, reps / 4) : reps;
      Stages st;
      st.group = time_us(r, [&] { group_pairs_ref(ga, nullptr); });
      st.quant = time_us(r, [&] { quantize_activations_ref(qa, nullptr); });
      st.l1 = time_us(r, [&] { run_expert_gemm(l1, &m1, choice, nullptr); });
      st.requant = time_us(r, [&] { requantize_rows_ref(rq, nullptr); });
      st.l2 = time_us(r, [&] { run_expert_gemm(l2, &m2, choice, nullptr); });
      st.combine = time_us(r, [&] { combine_slots(ca, nullptr); });
      const double fast_group = time_us(r, [&] { group_pairs(ga, nullptr); });
      const double fast_quant = time_us(r, [&] { sm90_nvfp4_stage(qa, nullptr); });
      const double fast_requant = time_us(r, [&] { sm90_nvfp4_requant(rq, nullptr); });
      // Every wgmma tile width over all blocks (TokenBlocks::All), the four
      // Split launches together; every decode configuration where decode is
      // in the running.
      std::string sweep;
      // One sweep entry: "label:L1+L2" (decode, whose projections may prefer
      // different configurations) or "label:sum" (wgmma), run(plan, weights) timing one projection.
      auto add = [&](const std::string& label, bool split_projections, auto run) {
        const double a = time_us(std::max(3, r / 2), [&] { run(l1, m1); });
        const double b = time_us(std::max(3, r / 2), [&] { run(l2, m2); });
        char buf[64];
        if (split_projections) {
          std::snprintf(buf, sizeof buf, "%s%s:%.0f+%.0f", sweep.empty() ? "" : " ", label.c_str(), a, b);
        } else {
          std::snprintf(buf, sizeof buf, "%s%s:%.0f", sweep.empty() ? "" : " ", label.c_str(), a + b);
        }
        sweep += buf;
      };
      for (auto it = std::rbegin(kWgmmaWidths); it != std::rend(kWgmmaWidths); ++it) {  // narrowest first
        const int bn = *it;
        add("wgmma" + std::to_string(bn), false, [&](const GroupedGemmPlan& p, const FragmentWeights& m) {
          sm90_nvfp4_prefill_gemm(p, m, Sm90PrefillGemmConfig{bn, 0}, nullptr);
        });
      }
      add("split", false, [](const GroupedGemmPlan& p, const FragmentWeights& m) { sm90_nvfp4_prefill_gemm_split(p, m, nullptr); });
      const std::vector<Sm90DecodeGemmConfig> decode_configs{
          {Sm90DecodeGemmConfig{1, 1, 0}, Sm90DecodeGemmConfig{2, 1, 0}, Sm90DecodeGemmConfig{4, 1, 0},
           Sm90DecodeGemmConfig{1, 2, 0}, Sm90DecodeGemmConfig{2, 2, 0}, Sm90DecodeGemmConfig{4, 2, 0}}};
      for (const Sm90DecodeGemmConfig& c : P > 32 * E ? std::vector<Sm90DecodeGemmConfig>{} : decode_configs)
        add(std::to_string(c.n_tiles) + "x" + std::to_string(c.m_tiles), true,
            [&](const GroupedGemmPlan& p, const FragmentWeights& m) { sm90_nvfp4_decode_gemm(p, m, c, nullptr); });
      // Persistent grid size (CTAs per SM) for the chosen configuration.
      for (int per_sm : P > 32 * E ? std::vector<int>{} : std::vector<int>{2, 3, 4, 5}) {
        Sm90DecodeGemmConfig c = cfg;
        c.grid = 132 * per_sm;
        const double a = time_us(std::max(3, r / 2), [&] { sm90_nvfp4_decode_gemm(l1, m1, c, nullptr); });
        const double b = time_us(std::max(3, r / 2), [&] { sm90_nvfp4_decode_gemm(l2, m2, c, nullptr); });
        char buf[64];
        std::snprintf(buf, sizeof buf, " grid%d:%.0f", c.grid, a + b);
        sweep += buf;
      }
      double simple_l1 = 0, simple_l2 = 0;
      if (run_simple) {
        const int rs = std::max(3, r / 4);
        simple_l1 = time_us(rs, [&] { grouped_gemm_ref(l1, nullptr); });
        simple_l2 = time_us(rs, [&] { grouped_gemm_ref(l2, nullptr); });
      }

      // The whole routed path as one graph (no host sync inside: capturable),
      // with the backend's GEMM choice: timed as it is, then with event nodes
      // between its stages (where the graph's time goes, next to the stages
      // timed one by one above; medians).
      CudaStream cs;
      const std::function<void()> stages[6] = {
          [&] { group_pairs(ga, cs.get()); },          [&] { sm90_nvfp4_stage(qa, cs.get()); },
          [&] { run_expert_gemm(l1, &m1, choice, cs.get()); }, [&] { sm90_nvfp4_requant(rq, cs.get()); },
          [&] { run_expert_gemm(l2, &m2, choice, cs.get()); }, [&] { combine_slots(ca, cs.get()); }};
      std::vector<CudaEvent> marks(7);
      // The graph of the six stages, with an event record node (one the host can wait on) before each and after the last.
      auto capture = [&](bool with_marks) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        auto mark = [&](size_t i) {
          if (with_marks) NVFP4_CUDA_CHECK(cudaEventRecordWithFlags(marks[i].get(), cs.get(), cudaEventRecordExternal));
        };
        NVFP4_CUDA_CHECK(cudaStreamBeginCapture(cs.get(), cudaStreamCaptureModeGlobal));
        for (size_t i = 0; i < 6; ++i) {
          mark(i);
          stages[i]();
        }
        mark(6);
        NVFP4_CUDA_CHECK(cudaStreamEndCapture(cs.get(), &graph));
        NVFP4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        NVFP4_CUDA_CHECK(cudaGraphDestroy(graph));
        return exec;
      };
      cudaGraphExec_t exec = capture(false);
      const double graph_us = time_us(r, [&] { NVFP4_CUDA_CHECK(cudaGraphLaunch(exec, nullptr)); });
      NVFP4_CUDA_CHECK(cudaGraphExecDestroy(exec));
      exec = capture(true);
      std::vector<std::vector<double>> in_graph(6);
      for (int rep = 0; rep <= r; ++rep) {  // rep 0: warm-up
        NVFP4_CUDA_CHECK(cudaGraphLaunch(exec, nullptr));
        NVFP4_CUDA_CHECK(cudaEventSynchronize(marks[6].get()));
        for (size_t i = 0; rep > 0 && i < 6; ++i) {
          float ms = 0;
          NVFP4_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i].get(), marks[i + 1].get()));
          in_graph[i].push_back(ms * 1e3);
        }
      }
      NVFP4_CUDA_CHECK(cudaGraphExecDestroy(exec));
      double graph_stage[6];
      for (size_t i = 0; i < 6; ++i) graph_stage[i] = median(in_graph[i]);
      // L1 and L2 launched back to back, 4 of each per timing (no host wait between launches, as in a graph
      // replay), per launch: whether the GEMMs slow down under sustained load or only inside the graph.
      const double l1_steady = time_us(r, [&] {
        for (int i = 0; i < 4; ++i) run_expert_gemm(l1, &m1, choice, nullptr);
      }) / 4;
      const double l2_steady = time_us(r, [&] {
        for (int i = 0; i < 4; ++i) run_expert_gemm(l2, &m2, choice, nullptr);
      }) / 4;

      const double nt = double(touched.size());
      const double bytes = nt * (2.0 * kI * kH + double(kH) * kI) * 0.5625;
      const double mem_us = bytes / bw * 1e6;
      const double comp_us = 2.0 * double(P) * 3.0 * kH * kI / peak * 1e6;
      const double floor_us = std::max(mem_us, comp_us);
      const double gemm = st.l1 + st.l2;
      const double stage_bytes = double(T) * kH * 2 + double(T) * kp1 * 2 + 4.0 * T;
      const double stage_frac = stage_bytes / bw * 1e6 / fast_quant;
      char cfgs[16];
      std::snprintf(cfgs, sizeof cfgs, "%s", chosen);
      std::printf("%-4s %6lld %7lld %5d %-9s %9.1f %9.1f %9.1f %9.1f %6.0f%% %9.1f %7.2fx %9.1f %9.1f %6.0f%% %6.0f%%\n", ep,
                  (long long)T, (long long)P, int(touched.size()), cfgs, st.l1, st.l2, gemm, floor_us,
                  100.0 * floor_us / gemm, simple_l1 + simple_l2, run_simple ? (simple_l1 + simple_l2) / gemm : 0.0,
                  fast_quant, graph_us, 100.0 * stage_frac, 100.0 * stage_frac * bw / copy_bw);
      std::printf("     in the graph us: group %.1f stage %.1f L1 %.1f requant %.1f L2 %.1f combine %.1f | back to back: L1 %.1f L2 %.1f\n",
                  graph_stage[0], graph_stage[1], graph_stage[2], graph_stage[3], graph_stage[4], graph_stage[5],
                  l1_steady, l2_steady);
      std::printf("     stages us: group %.1f (fast %.1f) quant %.1f (fast %.1f) L1 %.1f requant %.1f (fast %.1f) L2 %.1f combine %.1f | "
                  "sweep (us; decode configurations L1+L2) %s\n",
                  st.group, fast_group, st.quant, fast_quant, st.l1, st.requant, fast_requant, st.l2, st.combine, sweep.c_str());
      std::fflush(stdout);
      if (js)
        std::fprintf(js,
                     "{\"kind\":\"ours\",\"ep\":\"%s\",\"experts\":%lld,\"T\":%lld,\"pairs\":%lld,\"touched\":%d,"
                     "\"config\":\"%s\",\"l1_us\":%.2f,\"l2_us\":%.2f,\"gemm_us\":%.2f,\"floor_us\":%.2f,"
                     "\"mem_floor_us\":%.2f,\"comp_floor_us\":%.2f,\"simple_gemm_us\":%.2f,\"group_us\":%.2f,"
                     "\"quant_us\":%.2f,\"fast_quant_us\":%.2f,\"requant_us\":%.2f,\"fast_requant_us\":%.2f,\"combine_us\":%.2f,\"graph_us\":%.2f,\"sweep\":\"%s\"}\n",
                     ep, (long long)E, (long long)T, (long long)P, int(touched.size()), cfgs, st.l1, st.l2, gemm,
                     floor_us, mem_us, comp_us, simple_l1 + simple_l2, st.group, st.quant, fast_quant, st.requant, fast_requant, st.combine,
                     graph_us, sweep.c_str());
    }
  }
  if (js) std::fclose(js);
  return 0;
}
