// nvfp4moe_routed_bench: the routed-expert path of a DeepSeek-V4 MoE layer
// (--model dsv4-pro: H=7168, I=3072, 384 experts; dsv4-flash: H=4096,
// I=2048, 256 experts; top-6) on one GPU, stage by stage and as one CUDA
// graph, through the backend's own RoutedExperts:
//
//   group_pairs -> stage x -> gate/up + SwiGLU -> requantize h -> down x w_j -> combine
//
// Side by side: the reference kernels (group_pairs_ref, the reference
// staging, grouped_gemm_ref) and a sweep of the GEMM kernels'
// configurations on the same plans. Ceilings are measured in the same run:
// HBM read bandwidth, device copy bandwidth and BF16 dense peak. Roofline of
// the GEMMs: max(bytes of the touched experts' codes + scales / read BW,
// 2 * pairs * 3 * H * I / BF16 peak).
//
// One row per (experts, weight format, activation mode, T). NVFP4 weights
// and inputs are random bytes made on the device (timing does not depend on
// values; the GPU tests check the numbers). MXFP4 weights are made as
// DeepSeek's release holds them (cli/bench_weights.hpp: every code, UE8M0
// bytes 2^-8 .. 2^-4) and go through the backend's own upload, which turns
// them into one multiplier byte per 32 weights: the device reads the
// checkpoint's 4.25 bits a weight. Their rows state the bytes read and the
// fraction of the 4.25-bit roofline (the format's own) beside the NVFP4
// row's fraction. Weights whose rows qualify for the FP8 form of the
// prefill GEMM (MXFP4) run the fp8 mode twice: the BF16 form, then the FP8
// form at the sizes where the device runs the prefill kernel (its rows'
// kernel fp8-narrow / fp8-split). Usage:
//   nvfp4moe_routed_bench [--model dsv4-pro|dsv4-flash] [--experts 48,384]
//                         [--tokens 1,8,64,512,2048,4096,8192]
//                         [--format nvfp4,mxfp4] [--act nvfp4,bf16,fp8]
//                         [--reps N] [--json FILE] [--no-simple]
// EP8 is the experts of one rank of eight (V4-Pro 48, V4-Flash 32), EP1 all
// of them; --experts defaults to those two. --format and --act default to
// nvfp4 alone, whose output has no format columns.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <chrono>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/bench_ceilings.hpp"
#include "cli/bench_weights.hpp"
#include "cli/model_option.hpp"
#include "common/json.hpp"
#include "common/splitmix.hpp"
#include "cuda/backend/routed_experts.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/grouping.hpp"
#include "cuda/kernels/ref/grouped_gemm_ref.hpp"
#include "cuda/kernels/ref/grouping_ref.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/kernels/sm90_nvfp4_prefill_gemm.hpp"
#include "nvfp4moe/moe.hpp"

using namespace nvfp4moe;
using namespace nvfp4moe::cuda;
using bf16 = __nv_bfloat16;

namespace {

// The layer's shape: hidden size, expert intermediate size, experts a
// token picks, and the model's routed experts (EP8 holds an eighth).
struct Shape {
  int64_t H = 0, I = 0, top_k = 0, experts = 0;
};

// Random bytes; span > 0 keeps them in [lo, lo + span) (scale bytes of sane size).
__global__ void fill_bytes(uint8_t* p, size_t n, uint64_t seed, int lo, int span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64_mix(seed + i * kSplitMixGamma);
    p[i] = span > 0 ? uint8_t(lo + int(r % uint64_t(span))) : uint8_t(r);
  }
}

__global__ void fill_bf16(bf16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64_mix(seed + i * kSplitMixGamma);
    p[i] = __float2bfloat16(float(int64_t(r % 2001) - 1000) * 0.004f);
  }
}

void fill(uint8_t* p, size_t n, uint64_t seed, int lo = 0, int span = 0) {
  fill_bytes<<<2048, 256>>>(p, n, seed, lo, span);
  NVFP4_CUDA_CHECK_LAUNCH("fill_bytes");
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Options {
  std::string model = "dsv4-pro";
  std::vector<int64_t> experts, tokens = {1, 8, 64, 512, 2048, 4096, 8192};  // experts: default EP8, EP1
  std::vector<ExpertFormat> formats = {ExpertFormat::Nvfp4};
  std::vector<ActivationMode> acts = {ActivationMode::Nvfp4};
  int reps = 20;
  bool simple = true;
  const char* json = nullptr;
  // Anything but NVFP4 alone: the rows say their format and mode.
  bool modes() const {
    return formats != std::vector{ExpertFormat::Nvfp4} || acts != std::vector{ActivationMode::Nvfp4};
  }
};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

// A comma-separated list of names, each parsed by parse(name) (which throws
// for a name it does not know); the error names the option and the value,
// as it does for a name listed twice.
template <typename Parse>
auto parse_names(const std::string& option, const std::string& list, Parse parse) {
  std::vector<decltype(parse(std::string()))> v;
  for (size_t begin = 0;;) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    try {
      v.push_back(parse(name));
    } catch (const Error& e) {
      NVFP4_FAIL("nvfp4moe_routed_bench: ", option, " '", list, "': ", e.what());
    }
    NVFP4_CHECK(std::find(v.begin(), v.end() - 1, v.back()) == v.end() - 1, "nvfp4moe_routed_bench: ", option, " '",
                list, "': '", name, "' is listed twice");
    if (end == list.size()) return v;
    begin = end + 1;
  }
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) o.model = argv[++i];
    else if (a == "--experts" && i + 1 < argc) o.experts = parse_list(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) o.tokens = parse_list(argv[++i]);
    else if (a == "--format" && i + 1 < argc) o.formats = parse_names(a, argv[++i], parse_format_option);
    else if (a == "--act" && i + 1 < argc) o.acts = parse_names(a, argv[++i], parse_activation_mode);
    else if (a == "--reps" && i + 1 < argc) o.reps = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) o.json = argv[++i];
    else if (a == "--no-simple") o.simple = false;
    else NVFP4_FAIL("nvfp4moe_routed_bench: unknown argument ", a);
  }
  NVFP4_CHECK(o.model == "dsv4-pro" || o.model == "dsv4-flash", "nvfp4moe_routed_bench: --model '", o.model,
              "': expected dsv4-pro or dsv4-flash");
  return o;
}

struct Ceilings {
  double read = 0, copy = 0, bf16 = 0, fp8 = 0;  // bytes/s, bytes/s, FLOP/s, FLOP/s
};

// The model's layer with `experts` of its routed experts and no shared one.
MoeConfig layer_config(const std::string& model, int64_t experts) {
  MoeConfig c = cli::model_option_config(model);
  c.experts = experts;
  c.shared_experts = 0;
  return c;
}

Shape shape_of(const MoeConfig& c) {
  return Shape{.H = c.hidden, .I = c.intermediate, .top_k = c.top_k, .experts = c.experts};
}

// EP8: an eighth of the model's experts, EP1: all of them.
const char* workload_label(const Shape& s, int64_t E) {
  return E * 8 == s.experts ? "EP8" : (E == s.experts ? "EP1" : "E?");
}

// E experts' weights in the fragment layout as random code bytes and sane
// scale bytes, made on the device (14 GB for 384 experts), global scales 1e-3.
RoutedWeightsDevice random_device_weights(const Shape& s, int64_t E) {
  RoutedWeightsDevice w;
  w.count = E;
  w.hidden = s.H;
  w.inter = s.I;
  FragmentWeightsDevice* f[2] = {&w.w13_frag, &w.w2_frag};
  const Projection p[2] = {Projection::GateUp, Projection::Down};
  for (int i = 0; i < 2; ++i) {
    f[i]->geometry = fragment_geometry(p[i], s.H, s.I);
    f[i]->codes = DeviceBuffer<uint8_t>(size_t(E * f[i]->geometry.code_bytes_per_expert()));
    f[i]->scales = DeviceBuffer<uint8_t>(size_t(E * f[i]->geometry.scale_bytes_per_expert()));
    fill(f[i]->codes.get(), f[i]->codes.size(), 11 + 2 * i);
    fill(f[i]->scales.get(), f[i]->scales.size(), 12 + 2 * i, 0x30, 0x20);
  }
  const std::vector<float> g13(size_t(2 * E), 1e-3f), g2(size_t(E), 1e-3f);
  w.w13_global = DeviceBuffer<float>(g13.size());
  w.w13_global.upload(g13.data(), g13.size());
  w.w2_global = DeviceBuffer<float>(g2.size());
  w.w2_global.upload(g2.data(), g2.size());
  return w;
}

// Tile-layout weights for the reference GEMM's column: random bytes, every
// byte a sane scale (scale bytes sit inside each tile).
struct TileWeights {
  DeviceBuffer<uint8_t> w13, w2;
};
TileWeights random_tile_weights(const Shape& s, int64_t E, bool wanted) {
  TileWeights t;
  if (!wanted) return t;
  t.w13 = DeviceBuffer<uint8_t>(size_t(E * packed_geometry(Projection::GateUp, s.H, s.I).bytes_per_expert()));
  t.w2 = DeviceBuffer<uint8_t>(size_t(E * packed_geometry(Projection::Down, s.H, s.I).bytes_per_expert()));
  fill(t.w13.get(), t.w13.size(), 15, 0x30, 0x20);
  fill(t.w2.get(), t.w2.size(), 16, 0x30, 0x20);
  return t;
}

// One projection of ExpertWeights as the uploads take it.
LinearExperts linear_experts(const ExpertWeights& w, Projection p) {
  const bool gate_up = p == Projection::GateUp;
  return LinearExperts{.format = w.format,
                       .projection = p,
                       .codes = gate_up ? &w.w13_codes : &w.w2_codes,
                       .scales = gate_up ? &w.w13_scales : &w.w2_scales,
                       .count = w.count,
                       .first_expert = w.first_expert,
                       .hidden = w.hidden,
                       .inter = w.intermediate};
}

// The weights of one (experts, format) and the tile layout of the
// reference GEMM's column when wanted.
struct BenchWeights {
  RoutedWeightsDevice routed;
  TileWeights tiles;
};

// E MXFP4 experts as DeepSeek's release holds them, through the backend's
// own upload (upload_routed_weights: multiplier bytes per 16 weights and the
// row groups' factors in place of g_w), so that the kernels read what a
// real checkpoint gives them; the tile layout from the same bytes.
// Uploaded for the fp8 mode, so that they carry the FP8 form's row exponents
// (their bytes span 5 binades: every row qualifies).
BenchWeights mxfp4_weights(MoeConfig cfg, bool tiles) {
  const ExpertWeights ex = make_random_mxfp4_experts(cfg, 11, 0, cfg.experts);
  cfg.activation = ActivationMode::Fp8;
  BenchWeights w{upload_routed_weights(ex, cfg, RoutedKernels::Fast, /*fp8_mma=*/true), {}};
  NVFP4_CHECK(w.routed.w13_frag.codes.size() > 0, "routed bench: no fragment layout for H=", cfg.hidden,
              " I=", cfg.intermediate);
  if (tiles) {
    w.tiles.w13 = upload_tile_weights(linear_experts(ex, Projection::GateUp), nullptr);
    w.tiles.w2 = upload_tile_weights(linear_experts(ex, Projection::Down), nullptr);
  }
  return w;
}

BenchWeights bench_weights(const MoeConfig& cfg, ExpertFormat f, bool tiles) {
  if (f == ExpertFormat::Mxfp4) return mxfp4_weights(cfg, tiles);
  const Shape s = shape_of(cfg);
  return BenchWeights{random_device_weights(s, cfg.experts), random_tile_weights(s, cfg.experts, tiles)};
}

template <typename T>
DeviceBuffer<T> device_copy(const DeviceBuffer<T>& b) {
  DeviceBuffer<T> d(b.size());
  if (b.size()) NVFP4_CUDA_CHECK(cudaMemcpy(d.get(), b.get(), b.bytes(), cudaMemcpyDeviceToDevice));
  return d;
}

// A second copy of fragment-layout weights on the device (RoutedExperts owns
// its weights: each activation mode gets its own copy of the same bytes),
// with the FP8 form's row exponents or without them (the BF16 form).
RoutedWeightsDevice copy_weights(const RoutedWeightsDevice& w, bool fp8_rows) {
  NVFP4_CHECK(w.w13_tiles.size() == 0 && w.w13_codes.size() == 0 && w.w2_static_g.size() == 0,
              "routed bench: copy_weights copies the fragment layout and the global factors only");
  RoutedWeightsDevice d;
  d.format = w.format;
  d.count = w.count;
  d.hidden = w.hidden;
  d.inter = w.inter;
  for (auto [to, from] : {std::pair{&d.w13_frag, &w.w13_frag}, std::pair{&d.w2_frag, &w.w2_frag}}) {
    to->codes = device_copy(from->codes);
    to->scales = device_copy(from->scales);
    if (fp8_rows) to->fp8_rows = device_copy(from->fp8_rows);
    to->geometry = from->geometry;
  }
  d.w13_global = device_copy(w.w13_global);
  d.w2_global = device_copy(w.w2_global);
  return d;
}

// top_k distinct experts per token, uniform; every weight 0.25.
struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int64_t touched = 0;
};
Routing uniform_routing(int64_t T, int64_t E, int64_t top_k) {
  SplitMix64 rng{uint64_t(T * 1000 + E)};
  Routing r;
  std::set<int32_t> touched;
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> pick;
    while (int64_t(pick.size()) < top_k) pick.insert(int32_t(rng.next() % uint64_t(E)));
    for (int32_t e : pick) {
      r.ids.push_back(e);
      r.weights.push_back(0.25f);
      touched.insert(e);
    }
  }
  r.touched = int64_t(touched.size());
  return r;
}

// The device side of one forward: routing, grouping, y_pair, y.
struct Forward {
  Forward(const Shape& s, int64_t max_t, int64_t E)
      : shape(s), ids(size_t(max_t * s.top_k)), ids_out(ids.size()), pair_of_pos(ids.size()),
        pos_of_pair(ids.size()), expert_of_pos(ids.size()), offsets(size_t(E + 1)), num_tiles(1), wts(ids.size()),
        tiles(size_t(max_gemm_tiles(max_t * s.top_k, E, kGemmTileTokens))), err(kErrorWords),
        x(size_t(max_t * s.H)), y(size_t(max_t * s.H)), y_pair(size_t(max_t * s.top_k * s.H)) {
    NVFP4_CUDA_CHECK(cudaMemset(err.get(), 0, err.bytes()));
    fill_bf16<<<2048, 256>>>(x.get(), x.size(), 7);
    NVFP4_CUDA_CHECK_LAUNCH("fill_bf16");
  }
  Shape shape;
  DeviceBuffer<int32_t> ids, ids_out, pair_of_pos, pos_of_pair, expert_of_pos, offsets, num_tiles;
  DeviceBuffer<float> wts;
  DeviceBuffer<GemmTile> tiles;
  DeviceBuffer<uint32_t> err;
  DeviceBuffer<bf16> x, y;
  DeviceBuffer<float> y_pair;

  GroupingArgs grouping(int64_t T, int64_t E) {
    return GroupingArgs{.topk_ids = ids.get(), .tokens = T, .top_k = int(shape.top_k), .experts = E, .local_experts = E,
                        .tile_rows = kGemmTileTokens, .ids_out = ids_out.get(), .offsets = offsets.get(),
                        .pair_of_pos = pair_of_pos.get(), .pos_of_pair = pos_of_pair.get(),
                        .expert_of_pos = expert_of_pos.get(), .tiles = tiles.get(), .num_tiles = num_tiles.get(),
                        .error_word = err.get()};
  }
  RoutedPairs pairs(int64_t T) {
    return RoutedPairs{.pair_of_pos = pair_of_pos.get(), .top_k = int(shape.top_k),
                       .expert_of_pos = expert_of_pos.get(), .offsets = offsets.get(), .tiles = tiles.get(),
                       .num_tiles = num_tiles.get(), .pair_weights = wts.get(), .pairs_bound = T * shape.top_k};
  }
  CombineArgs combine(int64_t T) {
    return CombineArgs{.y_pair = y_pair.get(), .pos_of_pair = pos_of_pair.get(), .tokens = T, .hidden = shape.H,
                       .top_k = int(shape.top_k), .y = y.get()};
  }
};

// The kernel run_expert_gemm picks for P live pairs, as the table names it.
const char* chosen_kernel(const ExpertGemmChoice& c, int64_t P, bool fp8) {
  static const char* names[] = {"simple", "decode", "narrow", "split"};
  static const char* fp8_names[] = {"simple", "decode", "fp8-narrow", "fp8-split"};
  return (fp8 ? fp8_names : names)[c.kind_for(P)];
}

// Every prefill tile width over all blocks (TokenBlocks::All), the four
// Split launches together, and, where the decode kernel is in the running,
// each of its configurations (L1+L2) and persistent grid sizes.
std::string gemm_sweep(const RoutedExperts& routed, const RoutedExperts::Plan& p, int64_t P, int64_t E, int r) {
  const FragmentWeights& m1 = *routed.fragments(Projection::GateUp);
  const FragmentWeights& m2 = *routed.fragments(Projection::Down);
  std::string sweep;
  auto add = [&](const std::string& label, bool split_projections, auto run) {
    const double a = median_time_us(std::max(3, r / 2), [&] { run(p.gate_up, m1); });
    const double b = median_time_us(std::max(3, r / 2), [&] { run(p.down, m2); });
    char buf[64];
    if (split_projections)
      std::snprintf(buf, sizeof buf, "%s%s:%.0f+%.0f", sweep.empty() ? "" : " ", label.c_str(), a, b);
    else
      std::snprintf(buf, sizeof buf, "%s%s:%.0f", sweep.empty() ? "" : " ", label.c_str(), a + b);
    sweep += buf;
  };
  for (auto it = std::rbegin(kWgmmaWidths); it != std::rend(kWgmmaWidths); ++it) {  // narrowest first
    const int bn = *it;
    add("wgmma" + std::to_string(bn), false, [&](const GroupedGemmPlan& q, const FragmentWeights& m) {
      sm90_nvfp4_prefill_gemm(q, m, Sm90PrefillGemmConfig{bn, 0}, nullptr);
    });
  }
  add("split", false,
      [](const GroupedGemmPlan& q, const FragmentWeights& m) { sm90_nvfp4_prefill_gemm_split(q, m, nullptr); });
  if (P > 32 * E) return sweep;
  for (const Sm90DecodeGemmConfig c : {Sm90DecodeGemmConfig{1, 1, 0}, Sm90DecodeGemmConfig{2, 1, 0},
                                       Sm90DecodeGemmConfig{4, 1, 0}, Sm90DecodeGemmConfig{1, 2, 0},
                                       Sm90DecodeGemmConfig{2, 2, 0}, Sm90DecodeGemmConfig{4, 2, 0}})
    add(std::to_string(c.n_tiles) + "x" + std::to_string(c.m_tiles), true,
        [&](const GroupedGemmPlan& q, const FragmentWeights& m) { sm90_nvfp4_decode_gemm(q, m, c, nullptr); });
  for (int per_sm : {2, 3, 4, 5}) {
    Sm90DecodeGemmConfig c = sm90_nvfp4_decode_gemm_config(P, E);
    c.grid = 132 * per_sm;
    const double a = median_time_us(std::max(3, r / 2), [&] { sm90_nvfp4_decode_gemm(p.gate_up, m1, c, nullptr); });
    const double b = median_time_us(std::max(3, r / 2), [&] { sm90_nvfp4_decode_gemm(p.down, m2, c, nullptr); });
    char buf[64];
    std::snprintf(buf, sizeof buf, " grid%d:%.0f", c.grid, a + b);
    sweep += buf;
  }
  return sweep;
}

// The six stages of the routed path as one CUDA graph: its median time, and
// with event nodes between the stages, where the graph's time goes.
struct GraphTimes {
  double whole = 0, stage[6] = {};
};
GraphTimes graph_times(const std::function<void()> (&stages)[6], cudaStream_t s, int r) {
  std::vector<CudaEvent> marks(7);
  auto capture = [&](bool with_marks) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    auto mark = [&](size_t i) {
      if (with_marks) NVFP4_CUDA_CHECK(cudaEventRecordWithFlags(marks[i].get(), s, cudaEventRecordExternal));
    };
    NVFP4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (size_t i = 0; i < 6; ++i) {
      mark(i);
      stages[i]();
    }
    mark(6);
    NVFP4_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    NVFP4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    NVFP4_CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
  };
  GraphTimes g;
  cudaGraphExec_t exec = capture(false);
  g.whole = median_time_us(r, [&] { NVFP4_CUDA_CHECK(cudaGraphLaunch(exec, nullptr)); });
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
  for (size_t i = 0; i < 6; ++i) g.stage[i] = median(in_graph[i]);
  return g;
}

// floor, mem_floor: the bytes the device reads; ckpt_*: the format's
// checkpoint bytes (NVFP4 4.5, MXFP4 4.25 bits a weight; the same bytes).
struct Row {
  const char *model = "", *ep = "";
  int64_t H = 0, I = 0, E = 0, T = 0, P = 0, touched = 0;
  ExpertFormat format = ExpertFormat::Nvfp4;
  ActivationMode act = ActivationMode::Nvfp4;
  const char* config = "";
  double l1 = 0, l2 = 0, floor = 0, mem_floor = 0, comp_floor = 0, simple = 0;
  double device_bytes = 0, ckpt_bytes = 0, ckpt_mem_floor = 0, ckpt_floor = 0;
  double group = 0, fast_group = 0, quant = 0, fast_quant = 0, requant = 0, fast_requant = 0, combine = 0;
  double l1_steady = 0, l2_steady = 0, stage_frac = 0;
  GraphTimes graph;
  std::string sweep;
  double gemm() const { return l1 + l2; }
};

// The NVFP4 row of the same experts, mode and T among `rows`, or null.
const Row* nvfp4_twin(const std::vector<Row>& rows, const Row& w) {
  for (const Row& r : rows)
    if (r.format == ExpertFormat::Nvfp4 && r.E == w.E && r.T == w.T && r.act == w.act) return &r;
  return nullptr;
}

// modes: the format and mode columns, and for MXFP4 a line with both
// rooflines and, when measured before it, the NVFP4 row's fraction.
void print_row(const Row& w, const Ceilings& c, bool modes, const Row* twin, FILE* js) {
  const double gemm = w.gemm();
  std::printf("%-4s %6lld %7lld %5lld %-9s ", w.ep, (long long)w.T, (long long)w.P, (long long)w.touched, w.config);
  if (modes) std::printf("%-6s %-6s ", format_option_name(w.format), activation_mode_name(w.act));
  std::printf("%9.1f %9.1f %9.1f %9.1f %6.0f%% %9.1f %7.2fx %9.1f %9.1f %6.0f%% %6.0f%%\n", w.l1, w.l2, gemm, w.floor,
              100.0 * w.floor / gemm, w.simple, w.simple > 0 ? w.simple / gemm : 0.0, w.fast_quant, w.graph.whole,
              100.0 * w.stage_frac, 100.0 * w.stage_frac * c.read / c.copy);
  if (w.format == ExpertFormat::Mxfp4) {
    std::printf("     roofline: the device reads %.3f GB (%.2f bits a weight): floor %.1f us, GEMM %.0f%%; the MXFP4 "
                "checkpoint %.3f GB (%.2f bits): floor %.1f us, GEMM %.0f%%, path %.0f%%",
                w.device_bytes * 1e-9, checkpoint_bits_per_weight(w.format), w.floor, 100.0 * w.floor / gemm, w.ckpt_bytes * 1e-9,
                checkpoint_bits_per_weight(w.format), w.ckpt_floor, 100.0 * w.ckpt_floor / gemm,
                100.0 * w.ckpt_floor / w.graph.whole);
    if (twin)
      std::printf(" | NVFP4 row: GEMM %.0f%%, path %.0f%%", 100.0 * twin->ckpt_floor / twin->gemm(),
                  100.0 * twin->ckpt_floor / twin->graph.whole);
    std::printf("\n");
  }
  const double* g = w.graph.stage;
  std::printf("     in the graph us: group %.1f stage %.1f L1 %.1f requant %.1f L2 %.1f combine %.1f | "
              "back to back: L1 %.1f L2 %.1f\n", g[0], g[1], g[2], g[3], g[4], g[5], w.l1_steady, w.l2_steady);
  std::printf("     stages us: group %.1f (fast %.1f) quant %.1f (fast %.1f) L1 %.1f requant %.1f (fast %.1f) L2 %.1f "
              "combine %.1f | sweep (us; decode configurations L1+L2) %s\n", w.group, w.fast_group, w.quant,
              w.fast_quant, w.l1, w.requant, w.fast_requant, w.l2, w.combine, w.sweep.c_str());
  std::fflush(stdout);
  if (!js) return;
  std::fprintf(js,
               "{\"kind\":\"ours\",\"model\":\"%s\",\"hidden\":%lld,\"inter\":%lld,\"ep\":\"%s\",\"experts\":%lld,\"T\":%lld,\"pairs\":%lld,\"touched\":%lld,"
               "\"config\":\"%s\",\"l1_us\":%.2f,\"l2_us\":%.2f,\"gemm_us\":%.2f,\"floor_us\":%.2f,"
               "\"mem_floor_us\":%.2f,\"comp_floor_us\":%.2f,\"simple_gemm_us\":%.2f,\"group_us\":%.2f,"
               "\"quant_us\":%.2f,\"fast_quant_us\":%.2f,\"requant_us\":%.2f,\"fast_requant_us\":%.2f,"
               "\"combine_us\":%.2f,\"graph_us\":%.2f,\"sweep\":\"%s\",\"format\":\"%s\",\"act\":\"%s\","
               "\"device_bits\":%.2f,\"checkpoint_bits\":%.2f,\"device_bytes\":%.0f,\"checkpoint_bytes\":%.0f,"
               "\"checkpoint_mem_floor_us\":%.2f,\"checkpoint_floor_us\":%.2f}\n",
               w.model, (long long)w.H, (long long)w.I, w.ep, (long long)w.E, (long long)w.T, (long long)w.P, (long long)w.touched, w.config, w.l1, w.l2,
               gemm, w.floor, w.mem_floor, w.comp_floor, w.simple, w.group, w.quant, w.fast_quant, w.requant,
               w.fast_requant, w.combine, w.graph.whole, w.sweep.c_str(), format_option_name(w.format),
               activation_mode_name(w.act), checkpoint_bits_per_weight(w.format), checkpoint_bits_per_weight(w.format),
               w.device_bytes, w.ckpt_bytes, w.ckpt_mem_floor, w.ckpt_floor);
}

// MXFP4 rows beside the NVFP4 rows of the same experts, mode and T, each
// GEMM (and path) fraction of its format's own roofline: the open target is
// the same fraction at T <= 64. Nothing when no MXFP4 row has a twin.
void print_format_summary(const std::vector<Row>& rows) {
  bool header = false;
  for (const Row& m : rows) {
    const Row* n = m.format == ExpertFormat::Mxfp4 ? nvfp4_twin(rows, m) : nullptr;
    if (!n) continue;
    if (!header) {
      std::printf("\nMXFP4 against NVFP4: fractions of each format's own roofline (NVFP4 %.2f bits a weight, MXFP4 "
                  "%.2f, its checkpoint's, which the device reads)\n",
                  checkpoint_bits_per_weight(ExpertFormat::Nvfp4), checkpoint_bits_per_weight(ExpertFormat::Mxfp4));
      std::printf("%-4s %6s %-6s %-9s %11s %11s %10s %10s %7s %10s %10s\n", "EP", "T", "act", "config", "NVFP4 us",
                  "MXFP4 us", "NVFP4 frac", "MXFP4 frac", "ratio", "NVFP4 path", "MXFP4 path");
      header = true;
    }
    const double fn = n->ckpt_floor / n->gemm(), fm = m.ckpt_floor / m.gemm();
    std::printf("%-4s %6lld %-6s %-9s %11.1f %11.1f %9.0f%% %9.0f%% %6.2fx %9.0f%% %9.0f%%\n", m.ep, (long long)m.T,
                activation_mode_name(m.act), m.config, n->gemm(), m.gemm(), 100.0 * fn, 100.0 * fm, fm / fn,
                100.0 * n->ckpt_floor / n->graph.whole, 100.0 * m.ckpt_floor / m.graph.whole);
  }
  std::fflush(stdout);
}

// One row of the table: T tokens routed uniformly over E experts. Weights
// with the FP8 form's row exponents (the second fp8-mode run) give no row
// where the device runs the decode kernel: it would time the first run's
// kernels again.
std::optional<Row> bench_row(RoutedExperts& routed, const TileWeights& tiles, Forward& f, int64_t E, int64_t T,
                             ExpertFormat format, ActivationMode act, const Options& o, const Ceilings& c) {
  const Shape& s = f.shape;
  const int64_t P = T * s.top_k;
  const Routing routing = uniform_routing(T, E, s.top_k);
  f.ids.upload(routing.ids.data(), routing.ids.size());
  f.wts.upload(routing.weights.data(), routing.weights.size());
  const GroupingArgs ga = f.grouping(T, E);
  const RoutedExperts::Plan p =
      routed.plan(RoutedInput{.x = f.x.get(), .x_is_bf16 = true, .rows = T}, f.pairs(T), PairOutput{.rows = f.y_pair.get()});
  if (routed.fp8_prefill() && !ExpertGemmCandidate::prefill(p.gemm.kind_for(P))) return std::nullopt;
  const CombineArgs ca = f.combine(T);
  Row w{.model = o.model.c_str(), .ep = workload_label(s, E), .H = s.H, .I = s.I, .E = E, .T = T, .P = P, .touched = routing.touched,
        .format = format, .act = act, .config = chosen_kernel(p.gemm, P, p.fp8)};
  group_pairs(ga, nullptr);
  routed.stage(p, nullptr);
  routed.gate_up(p, nullptr);
  routed.requantize(p, nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());

  const int r = T >= 2048 ? std::max(3, o.reps / 4) : o.reps;
  w.group = median_time_us(r, [&] { group_pairs_ref(ga, nullptr); });
  w.fast_group = median_time_us(r, [&] { group_pairs(ga, nullptr); });
  w.quant = median_time_us(r, [&] { quantize_activations_ref(p.stage_x, nullptr); });
  w.fast_quant = median_time_us(r, [&] { routed.stage(p, nullptr); });
  w.l1 = median_time_us(r, [&] { routed.gate_up(p, nullptr); });
  w.requant = median_time_us(r, [&] { requantize_rows_ref(p.requant, nullptr); });
  w.fast_requant = median_time_us(r, [&] { routed.requantize(p, nullptr); });
  w.l2 = median_time_us(r, [&] { routed.down(p, nullptr); });
  w.combine = median_time_us(r, [&] { combine_slots(ca, nullptr); });
  w.sweep = gemm_sweep(routed, p, P, E, r);
  if (o.simple) {
    GroupedGemmPlan l1 = p.gate_up, l2 = p.down;
    l1.weights = tiles.w13.get();
    l2.weights = tiles.w2.get();
    const int rs = std::max(3, r / 4);
    w.simple = median_time_us(rs, [&] { grouped_gemm_ref(l1, nullptr); }) +
               median_time_us(rs, [&] { grouped_gemm_ref(l2, nullptr); });
  }
  CudaStream cs;
  const std::function<void()> stages[6] = {
      [&] { group_pairs(ga, cs.get()); },        [&] { routed.stage(p, cs.get()); },
      [&] { routed.gate_up(p, cs.get()); },      [&] { routed.requantize(p, cs.get()); },
      [&] { routed.down(p, cs.get()); },         [&] { combine_slots(ca, cs.get()); }};
  w.graph = graph_times(stages, cs.get(), r);
  // L1 and L2 launched back to back, 4 of each per timing (no host wait between launches, as in a graph
  // replay), per launch: whether the GEMMs slow down under sustained load or only inside the graph.
  w.l1_steady = median_time_us(r, [&] { for (int i = 0; i < 4; ++i) routed.gate_up(p, nullptr); }) / 4;
  w.l2_steady = median_time_us(r, [&] { for (int i = 0; i < 4; ++i) routed.down(p, nullptr); }) / 4;

  const double weights = double(routing.touched) * 3.0 * double(s.H) * double(s.I);
  w.device_bytes = weights * checkpoint_bits_per_weight(format) / 8;
  w.ckpt_bytes = weights * checkpoint_bits_per_weight(format) / 8;
  w.mem_floor = w.device_bytes / c.read * 1e6;
  // The FP8 form's ceiling is the dense FP8 peak, the BF16 form's the BF16 one.
  const bool fp8_mma = p.fp8 && ExpertGemmCandidate::prefill(p.gemm.kind_for(P));
  w.comp_floor = 2.0 * double(P) * 3.0 * s.H * s.I / (fp8_mma ? c.fp8 : c.bf16) * 1e6;
  w.floor = std::max(w.mem_floor, w.comp_floor);
  w.ckpt_mem_floor = w.ckpt_bytes / c.read * 1e6;
  w.ckpt_floor = std::max(w.ckpt_mem_floor, w.comp_floor);
  const double ld = double(p.stage_x.deq_ld);
  const double stage_bytes = double(T) * s.H * 2 + double(T) * ld * 2 + 4.0 * T;
  w.stage_frac = stage_bytes / c.read * 1e6 / w.fast_quant;
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  FILE* js = o.json ? std::fopen(o.json, "w") : nullptr;
  const Ceilings c{measure_read_bandwidth(int64_t(4) << 30, 10), measure_copy_bandwidth(int64_t(256) << 20, 10),
                   measure_bf16_gemm_flops(8192, 8192, 8192, 10), measure_fp8_gemm_flops(8192, 8192, 8192, 10)};
  const std::string device = nvfp4moe::cuda::device_description();
  std::printf("device: %s\n", device.c_str());
  std::printf("ceilings: HBM read %.2f TB/s, copy (read + write) %.2f TB/s, BF16 dense %.0f TFLOP/s, FP8 dense %.0f "
              "TFLOP/s\n",
              c.read * 1e-12, c.copy * 1e-12, c.bf16 * 1e-12, c.fp8 * 1e-12);
  if (js)
    std::fprintf(js,
                 "{\"kind\":\"ceilings\",\"device\":%s,\"read_tbps\":%.4f,\"copy_tbps\":%.4f,"
                 "\"bf16_tflops\":%.1f,\"fp8_tflops\":%.1f}\n",
                 json::quote(device).c_str(), c.read * 1e-12, c.copy * 1e-12, c.bf16 * 1e-12, c.fp8 * 1e-12);
  const Shape shape = shape_of(cli::model_option_config(o.model));
  if (o.experts.empty()) o.experts = {shape.experts / 8, shape.experts};
  std::printf("model: %s (H=%lld, I=%lld, top-%lld, %lld routed experts)\n", o.model.c_str(), (long long)shape.H,
              (long long)shape.I, (long long)shape.top_k, (long long)shape.experts);
  const int64_t max_t = *std::max_element(o.tokens.begin(), o.tokens.end());
  const bool modes = o.modes();
  std::printf("\n%-4s %6s %7s %5s %-9s ", "EP", "T", "pairs", "exps", "config");
  if (modes) std::printf("%-6s %-6s ", "format", "act");
  std::printf("%9s %9s %9s %9s %7s %9s %8s %9s %9s %7s %7s\n", "L1 us", "L2 us", "GEMM us", "floor us", "frac",
              "simple us", "speedup", "stage us", "graph us", "stageBW", "vs copy");
  std::vector<Row> rows;
  for (const int64_t E : o.experts) {
    MoeConfig cfg = layer_config(o.model, E);
    Forward f(shape, max_t, E);
    for (const ExpertFormat format : o.formats) {
      const auto t0 = std::chrono::steady_clock::now();
      BenchWeights w = bench_weights(cfg, format, o.simple);
      if (modes)
        std::printf("     weights: %lld %s experts made and uploaded in %.1f s\n", (long long)E,
                    format_option_name(format),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      // Each mode once; the fp8 mode of weights with the FP8 form's row
      // exponents twice, the BF16 form first, then the FP8 form on the same bytes.
      std::vector<std::pair<ActivationMode, bool>> runs;
      for (const ActivationMode m : o.acts) {
        const bool fp8_form = m == ActivationMode::Fp8 && w.routed.fp8_prefill();
        if (fp8_form) runs.push_back({m, false});
        runs.push_back({m, fp8_form});
      }
      for (size_t a = 0; a < runs.size(); ++a) {
        cfg.activation = runs[a].first;
        // The last run takes the weights themselves (when it wants their FP8 rows); the others a copy.
        const bool last = a + 1 == runs.size() && (runs[a].second || !w.routed.fp8_prefill());
        RoutedExperts routed(last ? std::move(w.routed) : copy_weights(w.routed, runs[a].second), cfg,
                             RoutedExperts::Capacity{.input_rows = max_t, .pairs = max_t * shape.top_k},
                             RoutedKernels::Fast, 0.0f);
        for (const int64_t T : o.tokens) {
          std::optional<Row> row = bench_row(routed, w.tiles, f, E, T, format, runs[a].first, o, c);
          if (!row) continue;
          rows.push_back(*row);
          print_row(rows.back(), c, modes, nvfp4_twin(rows, rows.back()), js);
        }
      }
    }
  }
  print_format_summary(rows);
  if (js) std::fclose(js);
  return 0;
}
