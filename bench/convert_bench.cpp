// `nvfp4moe convert --device cuda` on one MoE layer of DeepSeek-V4-Pro's
// geometry (H = 7168, I = 3072; 48 experts by default: one EP8 rank's
// share of a layer's 384), MXFP4 as DeepSeek releases it: the whole
// conversion of a one-shard model through convert_mxfp4_to_nvfp4 with the
// GPU's numerics, the default cast and --lossless.
//
// Per mode it prints the device time of the layer (CUDA events on the
// quantizer's stream around its uploads, kernels and downloads: what the
// GPU spends; target under a second), the kernels alone, and the wall time
// of the whole command (reading the shard from the page cache, the host's
// share of the work and writing the output). `cpu` after the arguments
// also times the host path.
//
// Codes are random bytes and scale bytes in [118, 126): the work does not
// depend on the values. The input (about 1.7 GB for 48 experts) and the
// outputs go to a scratch directory under DIR (default /tmp), removed at
// the end.
//
// Built with -DNVFP4MOE_BUILD_BENCH=ON as nvfp4moe_convert_bench.
// Run: nvfp4moe_convert_bench [experts] [DIR] [cpu]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/convert.hpp"
#include "cuda/backend/device_quantizer.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"

using namespace nvfp4moe;

namespace {

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n, int lo, int spread) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t b = 0; b < 8 && i + b < n; ++b) {
      const uint8_t x = uint8_t(r >> (8 * b));
      v[i + b] = spread ? uint8_t(lo + x % spread) : x;
    }
  }
  return v;
}

// layers.0.ffn.experts.{0..E-1}.w1|w3 [I, H], w2 [H, I] in one shard; the
// experts share three sets of bytes (the writer reads them at write time).
void write_layer(const std::string& dir, int64_t E, int64_t H, int64_t I) {
  std::filesystem::create_directories(dir);
  std::mt19937_64 rng(1);
  const std::vector<uint8_t> c13 = random_bytes(rng, size_t(I * H / 2), 0, 0),
                             s13 = random_bytes(rng, size_t(I * H / 32), 118, 8),
                             c2 = random_bytes(rng, size_t(H * I / 2), 0, 0),
                             s2 = random_bytes(rng, size_t(H * I / 32), 118, 8);
  SafetensorsWriter w;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "layers.0.ffn.experts." + std::to_string(e) + ".";
    for (const char* proj : {"w1", "w3"}) {
      w.add(p + proj + ".weight", DType::I8, {I, H / 2}, c13.data());
      w.add(p + proj + ".scale", DType::F8E8M0, {I, H / 32}, s13.data());
    }
    w.add(p + "w2.weight", DType::I8, {H, I / 2}, c2.data());
    w.add(p + "w2.scale", DType::F8E8M0, {H, I / 32}, s2.data());
  }
  w.write(dir + "/model.safetensors");
  std::FILE* f = std::fopen((dir + "/config.json").c_str(), "w");
  std::fprintf(f, "{\"hidden_size\": %lld, \"moe_intermediate_size\": %lld, \"n_routed_experts\": %lld}\n",
               (long long)H, (long long)I, (long long)E);
  std::fclose(f);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t E = argc > 1 ? std::atoll(argv[1]) : 48, H = 7168, I = 3072;
  const std::string parent = argc > 2 ? argv[2] : "/tmp";
  const bool with_cpu = argc > 3 && std::string(argv[3]) == "cpu";
  if (!cuda_available()) {
    std::fprintf(stderr, "nvfp4moe_convert_bench: no CUDA device\n");
    return 1;
  }
  std::string tmpl = parent + "/nvfp4moe-convert-bench-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "nvfp4moe_convert_bench: cannot create a directory under %s\n", parent.c_str());
    return 1;
  }
  const std::string dir = tmpl;
  auto t0 = std::chrono::steady_clock::now();
  write_layer(dir + "/in", E, H, I);
  const double in_gb = double(E) * 3 * double(H * I) * (0.5 + 1.0 / 32) / 1e9;
  std::printf("one MoE layer, DeepSeek-V4-Pro geometry: H=%lld I=%lld, %lld experts (%.2f GB of MXFP4, written in "
              "%.1f s)\n%-10s %-8s %10s %10s %10s %10s %10s %8s\n",
              (long long)H, (long long)I, (long long)E, in_gb, seconds_since(t0), "mode", "device", "device ms",
              "kernels", "upload", "download", "wall s", "uploads");
  // GPU rows with one worker and with convert --device cuda's four (device
  // ms then sums the workers' streams, which overlap).
  for (const bool lossless : {false, true})
    for (const int workers : {1, 4, 0}) {  // 0: the host
      const bool gpu = workers > 0;
      if (!gpu && !with_cpu) continue;
      ConvertOptions o;
      o.lossless = lossless;
      std::vector<std::shared_ptr<cuda::DeviceQuantizer>> qs;
      if (gpu) {
        o.workers = workers;
        o.make_numerics = [&qs] {
          qs.push_back(std::make_shared<cuda::DeviceQuantizer>(0));
          qs.back()->enable_timing();
          return cuda::device_convert_numerics(qs.back());
        };
      }
      const std::string out = dir + "/out-" + std::to_string(int(lossless)) + std::to_string(workers);
      t0 = std::chrono::steady_clock::now();
      convert_mxfp4_to_nvfp4(dir + "/in", out, o);
      const double wall = seconds_since(t0);
      cuda::DeviceQuantizerTimes t{};
      for (const auto& q : qs) {
        const cuda::DeviceQuantizerTimes u = q->times();
        t.upload_ms += u.upload_ms;
        t.kernel_ms += u.kernel_ms;
        t.download_ms += u.download_ms;
        t.uploads += u.uploads;
      }
      const char* mode = lossless ? "lossless" : "amax";
      if (gpu)
        std::printf("%-10s cuda x%-2d %10.1f %10.1f %10.1f %10.1f %10.2f %8lld\n", mode, workers,
                    t.upload_ms + t.kernel_ms + t.download_ms, t.kernel_ms, t.upload_ms, t.download_ms, wall,
                    (long long)t.uploads);
      else
        std::printf("%-10s %-8s %10s %10s %10s %10s %10.2f %8s\n", mode, "cpu", "-", "-", "-", "-", wall, "-");
      std::fflush(stdout);
      std::filesystem::remove_all(out);
    }
  std::filesystem::remove_all(dir);
  return 0;
}
