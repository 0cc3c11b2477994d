// nvfp4moe_shared_expert_bench: the shared expert of DeepSeek-V4-Pro
// (H=7168, Is=3072) and -Flash (H=4096, Is=2048) on one GPU, through the
// backend's DeviceSharedExpert, with block-scaled FP8 weights (on their FP8
// bytes) and with the BF16 weights of the same values, side by side.
//
// Three copies of each layer's weights are cycled (the weights of
// consecutive layers, as in a model), so that no run finds the previous
// run's weights in L2. Ceilings are measured in the same run: HBM read
// bandwidth and the BF16 dense peak (cuBLAS). Roofline per row:
// max(weight bytes / read BW, 6 T H Is / BF16 peak). Two times per form:
// host-inclusive (each forward launched on an idle GPU and timed with
// events around the launches, as an eager caller sees it) and device time
// (each copy's forward captured as a CUDA graph between two event nodes, so
// the launches are not in it, as an engine replaying a captured decode step
// sees it); the fraction is of the device time, and the last column gives
// each FP8 path's device time (the default rule's thresholds). Usage:
//   nvfp4moe_shared_expert_bench [--tokens 1,8,16,32,64,128,512,2048] [--reps N]
// Prints one markdown table.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_ceilings.hpp"
#include "common/splitmix.hpp"
#include "cuda/backend/device_shared_expert.hpp"
#include "cuda/cuda_check.hpp"
#include "format/nvfp4_codec.hpp"
#include "moe/random_weights.hpp"
#include "nvfp4moe/moe.hpp"

using namespace nvfp4moe;
using namespace nvfp4moe::cuda;

namespace {

constexpr int kCopies = 3;

struct Geometry {
  const char* name;
  int64_t hidden, inter;
};

// Random E4M3 weights (no NaN) with power-of-two tile scales, as DeepSeek-V4
// stores its shared experts (make_random_fp8_shared_expert), and the BF16
// weights of the same values.
struct Layer {
  SharedExpertWeights fp8, bf16;
};

std::vector<Bf16> widen(const std::vector<uint8_t>& q, const std::vector<float>& scale, int64_t rows, int64_t cols) {
  const int64_t tiles_k = (cols + 127) / 128;
  std::vector<Bf16> w(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      w[size_t(r * cols + c)] =
          bf16_from_float(fmt::e4m3_value(q[size_t(r * cols + c)]) * scale[size_t((r / 128) * tiles_k + c / 128)]);
  return w;
}

Layer make_layer(const Geometry& g, uint64_t seed) {
  const int64_t H = g.hidden, Is = g.inter;
  Layer l;
  l.fp8 = make_random_fp8_shared_expert(H, Is, seed);
  const SharedExpertWeights& f = l.fp8;
  l.bf16.format = SharedExpertFormat::Bf16;
  l.bf16.w1 = widen(f.w1_fp8, f.w1_scale, Is, H);
  l.bf16.w3 = widen(f.w3_fp8, f.w3_scale, Is, H);
  l.bf16.w2 = widen(f.w2_fp8, f.w2_scale, H, Is);
  return l;
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64_mix(seed + i * kSplitMixGamma);
    p[i] = __float2bfloat16(float(int(r % 17) - 8) / 8.0f);
  }
}

// Median device time of one forward: each copy's forward captured once as a
// graph with external event nodes before and after it, replayed in turn.
double graph_time_us(int reps, std::vector<std::unique_ptr<DeviceSharedExpert>>& layers, const __nv_bfloat16* x,
                     int64_t tokens, float* out, cudaStream_t s) {
  struct Captured {
    CudaEvent begin, end;
    cudaGraphExec_t exec = nullptr;
  };
  std::vector<Captured> graphs(layers.size());
  for (size_t c = 0; c < layers.size(); ++c) {
    cudaGraph_t graph = nullptr;
    NVFP4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    NVFP4_CUDA_CHECK(cudaEventRecordWithFlags(graphs[c].begin.get(), s, cudaEventRecordExternal));
    layers[c]->run(x, true, tokens, out, s);
    NVFP4_CUDA_CHECK(cudaEventRecordWithFlags(graphs[c].end.get(), s, cudaEventRecordExternal));
    NVFP4_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    NVFP4_CUDA_CHECK(cudaGraphInstantiate(&graphs[c].exec, graph, 0));
    NVFP4_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  std::vector<double> us;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    Captured& g = graphs[size_t(rep + 1) % graphs.size()];
    NVFP4_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
    NVFP4_CUDA_CHECK(cudaEventSynchronize(g.end.get()));
    float ms = 0;
    NVFP4_CUDA_CHECK(cudaEventElapsedTime(&ms, g.begin.get(), g.end.get()));
    if (rep >= 0) us.push_back(1e3 * double(ms));
  }
  for (Captured& g : graphs) NVFP4_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p || x < 1 || x > 65536) {
      std::fprintf(stderr, "--tokens: '%s' is not a list of integers in [1, 65536]\n", s);
      std::exit(2);
    }
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> tokens = {1, 8, 16, 32, 64, 128, 512, 2048};
  int reps = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) {
      tokens = parse_list(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: nvfp4moe_shared_expert_bench [--tokens LIST] [--reps N]\n");
      return 2;
    }
  }
  const int64_t max_t = *std::max_element(tokens.begin(), tokens.end());
  const double read_bw = measure_read_bandwidth(int64_t(2) << 30, 10);
  const double peak = measure_bf16_gemm_flops(8192, 8192, 8192, 5);
  std::printf("device: %s\n", device_description().c_str());
  std::printf("ceilings: HBM read %.2f TB/s, BF16 dense %.0f TFLOP/s\n\n", read_bw / 1e12, peak / 1e12);
  std::printf("| geometry | T | BF16 us | FP8 us | FP8 speed-up | BF16 device us | FP8 device us | device speed-up | "
              "FP8 roofline us | FP8 fraction | FP8 device us: split / GEMV / wgmma / dequant + GEMM | "
              "GEMV device us: 4 warps x 2 / 3 stages, 3 warps x 2 stages |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  CudaStream stream;
  for (const Geometry g : {Geometry{"V4-Pro", 7168, 3072}, Geometry{"V4-Flash", 4096, 2048}}) {
    MoeConfig cfg = dsv4_pro_config();
    cfg.hidden = g.hidden;
    cfg.intermediate = g.inter;
    cfg.shared_experts = 1;
    cfg.shared_intermediate = g.inter;
    const Layer layer = make_layer(g, 0x5eed + uint64_t(g.hidden));
    std::vector<std::unique_ptr<DeviceSharedExpert>> fp8, bf16;
    for (int c = 0; c < kCopies; ++c) {
      fp8.push_back(std::make_unique<DeviceSharedExpert>(layer.fp8, cfg, max_t));
      bf16.push_back(std::make_unique<DeviceSharedExpert>(layer.bf16, cfg, max_t));
    }
    DeviceBuffer<__nv_bfloat16> x(size_t(max_t * g.hidden));
    DeviceBuffer<float> out(size_t(max_t * g.hidden));
    fill_bf16<<<1024, 256>>>(x.get(), x.size(), 7);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    const double weight_bytes = 3.0 * double(g.hidden) * double(g.inter);  // FP8: one byte per weight
    for (const int64_t T : tokens) {
      int next = 0;
      auto timed = [&](std::vector<std::unique_ptr<DeviceSharedExpert>>& layers) {
        return median_time_us(reps, [&] {
          layers[size_t(next)]->run(x.get(), true, T, out.get(), nullptr);
          next = (next + 1) % kCopies;
        });
      };
      const double t16 = timed(bf16), t8 = timed(fp8);
      const double g16 = graph_time_us(reps, bf16, x.get(), T, out.get(), stream.get());
      const double g8 = graph_time_us(reps, fp8, x.get(), T, out.get(), stream.get());
      // Device time of each forced choice, " / "-joined; "-" where the GEMV form cannot take T, or the
      // dequantization + GEMM path is not there.
      using Choice = DeviceSharedExpert::Fp8Choice;
      auto forced = [&](std::initializer_list<Choice> choices) {
        std::string cells;
        for (const Choice& v : choices) {
          char cell[32] = "-";
          if ((v.kernels != Fp8SharedPath::Gemv || T <= 16) && (v.dequant_gemm != 1 || fp8[0]->fp8_dequant_gemm_available())) {
            for (auto& l : fp8) l->set_fp8_choice(v);
            std::snprintf(cell, sizeof cell, "%.1f", graph_time_us(reps, fp8, x.get(), T, out.get(), stream.get()));
          }
          cells += cells.empty() ? cell : std::string(" / ") + cell;
        }
        return cells;
      };
      const std::string sweep = forced({{Fp8SharedPath::Split, 0, 0}, {Fp8SharedPath::Gemv, 0, 0},
                                        {Fp8SharedPath::Wgmma, 0, 0}, {Fp8SharedPath::Auto, 0, 1}});
      // The GEMV form's CTA shapes, each forced (the launcher takes the first whose grid fits the SMs).
      const std::string stages = forced({{.kernels = Fp8SharedPath::Gemv, .gemv_stages = 2, .gemv_warps = 4},
                                         {.kernels = Fp8SharedPath::Gemv, .gemv_stages = 3, .gemv_warps = 4},
                                         {.kernels = Fp8SharedPath::Gemv, .gemv_stages = 2, .gemv_warps = 3}});
      for (auto& l : fp8) l->set_fp8_choice(Choice{});
      const double roof = std::max(weight_bytes / read_bw, 6.0 * double(T) * double(g.hidden) * double(g.inter) / peak) * 1e6;
      std::printf("| %s | %lld | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %.1f | %.0f%% | %s | %s |\n", g.name,
                  static_cast<long long>(T), t16, t8, t16 / t8, g16, g8, g16 / g8, roof, 100.0 * roof / g8,
                  sweep.c_str(), stages.c_str());
    }
  }
  return 0;
}
