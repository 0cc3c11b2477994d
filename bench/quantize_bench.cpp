// `nvfp4moe quantize --device cuda` against the speed of reading its input:
// one BF16 MoE layer of DeepSeek-V4-Pro's geometry (H = 7168, I = 3072; 48
// experts by default, 6.3 GB) in DeepSeek's names, one shard, quantized by
// the CLI itself (a child process, as a user runs it), and the same file
// read once before into a buffer (the read rate the quantizer has to keep
// up with; the file is in the page cache after it is written, so it is the
// upper end of what a disk gives). With --shards N the input is a model
// directory instead: N such layers (layers 0 .. N-1), one a shard, and
// their model.safetensors.index.json, quantized as a whole checkpoint is
// (the fixed costs of the command paid once over N x 6.3 GB).
//
// Prints the input size, its read rate, and per device the wall time of the
// command and the rate of input it took in, then the command's own --timing
// lines: where its time went (setup, the read / compute / write stages of
// its pipeline with their busy and waiting times, the device's streams), so
// a row says what bounds it. Weights are a few random BF16
// patterns shared by every expert: the work does not depend on the values.
// The scratch directory under DIR (default /tmp) is removed at the end.
//
// Built with -DNVFP4MOE_BUILD_BENCH=ON as nvfp4moe_quantize_bench.
// Run: nvfp4moe_quantize_bench [experts] [DIR] [cpu] [--shards N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"

using namespace nvfp4moe;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Normal-ish BF16 values of magnitude ~0.02 (as trained expert weights).
std::vector<Bf16> random_weights(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<Bf16> v(n);
  for (auto& x : v) x = bf16_from_float(d(rng));
  return v;
}

// Reads `path` once in 64 MiB pieces; returns GB/s.
double read_rate(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0.0;
  std::vector<char> buf(size_t(64) << 20);
  size_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) total += n;
  const double s = seconds_since(t0);
  std::fclose(f);
  return double(total) / s / 1e9;
}

// The "timing:" lines of a quantize log, indented under the row.
void print_timing_lines(const std::string& log) {
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);)
    if (line.rfind("timing: ", 0) == 0) std::printf("    %s\n", line.c_str() + 8);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  int64_t shards = 0;  // 0: one .safetensors file
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--shards" && i + 1 < argc)
      shards = std::atoll(argv[++i]);
    else
      pos.push_back(argv[i]);
  }
  const int64_t E = pos.size() > 0 ? std::atoll(pos[0].c_str()) : 48, H = 7168, I = 3072;
  const std::string parent = pos.size() > 1 ? pos[1] : "/tmp";
  const bool with_cpu = pos.size() > 2 && pos[2] == "cpu";
  if (E < 1 || E > 384 || shards < 0 || shards > 64) {
    std::fprintf(stderr, "nvfp4moe_quantize_bench: experts must be in [1, 384] and --shards in [1, 64], got %lld and %lld\n",
                 (long long)E, (long long)shards);
    return 2;
  }
  std::string tmpl = parent + "/nvfp4moe-quantize-bench-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "nvfp4moe_quantize_bench: cannot create a directory under %s\n", parent.c_str());
    return 1;
  }
  const std::string dir = tmpl;
  std::mt19937_64 rng(1);
  const std::vector<Bf16> w13 = random_weights(rng, size_t(I * H)), w2 = random_weights(rng, size_t(H * I));
  auto t0 = std::chrono::steady_clock::now();
  // Layer L's experts as one shard file.
  auto write_layer = [&](int64_t L, const std::string& path, std::string* index_entries) {
    SafetensorsWriter w;
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = "layers." + std::to_string(L) + ".ffn.experts." + std::to_string(e) + ".";
      for (const char* proj : {"w1", "w3", "w2"}) {
        const bool down = proj[1] == '2';
        w.add(p + proj + ".weight", DType::BF16, {down ? H : I, down ? I : H}, down ? w2.data() : w13.data());
        if (index_entries)
          *index_entries += std::string(index_entries->empty() ? "" : ",\n") + "    \"" + p + proj +
                            ".weight\": \"" + path.substr(path.find_last_of('/') + 1) + "\"";
      }
    }
    w.write(path);
  };
  std::string in;
  std::vector<std::string> inputs;  // the files the command reads
  if (shards == 0) {
    in = dir + "/layer.safetensors";
    write_layer(0, in, nullptr);
    inputs.push_back(in);
  } else {
    in = dir + "/model";
    std::filesystem::create_directory(in);
    std::string entries;
    for (int64_t L = 0; L < shards; ++L) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors", (long long)L + 1, (long long)shards);
      inputs.push_back(in + "/" + name);
      write_layer(L, inputs.back(), &entries);
    }
    std::ofstream(in + "/model.safetensors.index.json") << "{\n  \"metadata\": {},\n  \"weight_map\": {\n"
                                                        << entries << "\n  }\n}\n";
  }
  double bytes = 0;
  for (const std::string& f : inputs) bytes += double(std::filesystem::file_size(f));
  const double gb = bytes / 1e9;
  std::printf("%lld BF16 MoE layer(s), DeepSeek-V4-Pro geometry: H=%lld I=%lld, %lld experts each, %s, %.2f GB "
              "(written in %.1f s)\n",
              (long long)std::max<int64_t>(shards, 1), (long long)H, (long long)I, (long long)E,
              shards == 0 ? "one file" : "a model directory of one shard a layer", gb, seconds_since(t0));
  double read_s = 0;  // the inputs read once, one after another
  for (const std::string& f : inputs) read_s += double(std::filesystem::file_size(f)) / 1e9 / read_rate(f);
  const double read = gb / read_s;
  std::printf("reading it: %.2f GB/s\n%-8s %10s %10s %12s\n", read, "device", "wall s", "GB/s in", "x read rate");
  int rc_all = 0;
  for (const char* device : {"cuda", "cpu"}) {
    if (std::string(device) == "cpu" && !with_cpu) continue;
    const std::string out = dir + "/out-" + device + (shards == 0 ? ".safetensors" : "");
    const std::string cmd = std::string(NVFP4MOE_CLI_PATH) + " quantize --in " + in + " --out " + out +
                            " --device " + device + " --timing > " + dir + "/log-" + device + " 2>&1";
    std::fflush(stdout);
    t0 = std::chrono::steady_clock::now();
    const int rc = std::system(cmd.c_str());
    const double wall = seconds_since(t0);
    if (rc != 0) {
      std::printf("%-8s quantize failed (status %d), the end of its log:\n", device, rc);
      std::fflush(stdout);
      std::system(("tail -3 " + dir + "/log-" + device).c_str());
      rc_all = 1;
      continue;
    }
    std::printf("%-8s %10.2f %10.2f %12.2f\n", device, wall, gb / wall, gb / wall / read);
    print_timing_lines(dir + "/log-" + device);
    std::fflush(stdout);
    std::filesystem::remove_all(out);
  }
  std::filesystem::remove_all(dir);
  return rc_all;
}
