// `nvfp4moe run --ep R --device cuda` end to end on one GPU (R = 1: the
// launcher, the unique-id file, one rank process, the part file and the
// join), against the single-GPU layer on the same checkpoint and inputs;
// and R = 2 on fewer GPUs than ranks (CUDA_VISIBLE_DEVICES=0): the ranks
// emulated on one GPU, said on stderr, against the single-GPU run and, on a
// machine with two GPUs, against the two rank processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "ep/nccl_launcher.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "test_ep_util.hpp"

namespace nvfp4moe::test {
namespace {

namespace fs = std::filesystem;

// The CLI next to this test binary (build/tests/.. /nvfp4moe).
std::string cli_path() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const fs::path cli = self.parent_path().parent_path() / "nvfp4moe";
  return fs::exists(cli) ? cli.string() : std::string();
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/nvfp4moe-ep-cli-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<float> read_output(const std::string& file, int64_t T, int64_t H) {
  const SafetensorsFile f(file);
  const TensorInfo* y = f.find("output");
  EXPECT_TRUE(y && y->dtype == DType::BF16 && y->shape == std::vector<int64_t>({T, H})) << file;
  return y ? y->to_f32() : std::vector<float>();
}

TEST(EpCli, RunOnGpuRanksMatchesSingleGpu) {
  if (!gpu_available() || !nccl_ep_available()) GTEST_SKIP() << "needs a CUDA device and a build with NCCL";
  if (ep::rank_env()) GTEST_SKIP() << "not inside a rank process";
  const std::string cli = cli_path();
  if (cli.empty()) GTEST_SKIP() << "the nvfp4moe CLI is not built next to the tests";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  TempDir tmp;
  const std::string model = (tmp.path / "model").string(), in = (tmp.path / "x.safetensors").string(),
                    in_routed = (tmp.path / "xr.safetensors").string(), out = (tmp.path / "y.safetensors").string();
  save_moe_layer(model, 0, w);
  Rng rng(seed + 21);
  const int64_t T = 11, H = cfg.hidden, k = cfg.top_k;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.2);
  {
    SafetensorsWriter wr;
    wr.add("hidden_states", DType::F32, {T, H}, x.data());
    wr.write(in);
    SafetensorsWriter wr2;
    wr2.add("hidden_states", DType::F32, {T, H}, x.data());
    wr2.add("topk_ids", DType::I32, {T, k}, r.ids.data());
    wr2.add("topk_weights", DType::F32, {T, k}, r.weights.data());
    wr2.write(in_routed);
  }
  const std::string base = cli + " run --ep 1 --device cuda --model " + model + " --layer 0 --output " + out;

  // Caller routing from the file.
  ASSERT_EQ(std::system((base + " --input " + in_routed + " > /dev/null").c_str()), 0);
  const std::vector<float> y = read_output(out, T, H);
  EXPECT_EQ(count_non_finite(y), 0);
  EXPECT_LE(rel_l2(y, single_device_forward(w, x, T, r)), 1e-2);

  // The router on the rank (host router, same math as the GPU's).
  ASSERT_EQ(std::system((base + " --input " + in + " > /dev/null").c_str()), 0);
  Moe single(w, MoeOptions{});
  const std::vector<float> ref = single.forward_host({.x = x, .tokens = T}).y;
  const std::vector<float> y2 = read_output(out, T, H);
  EXPECT_LE(rel_l2(y2, ref), 1e-2);

  // A failing run (E=16 over 3 ranks) exits non-zero and leaves the earlier output intact.
  std::ifstream before(out, std::ios::binary);
  const std::string old_bytes((std::istreambuf_iterator<char>(before)), std::istreambuf_iterator<char>());
  const std::string bad = cli + " run --ep 3 --device cuda --model " + model + " --layer 0 --output " + out +
                          " --input " + in + " > /dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream after(out, std::ios::binary);
  const std::string new_bytes((std::istreambuf_iterator<char>(after)), std::istreambuf_iterator<char>());
  EXPECT_EQ(old_bytes, new_bytes) << "a failed run changed the earlier output";
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<int32_t> read_ids(const std::string& file) {
  const SafetensorsFile f(file);
  const TensorInfo* t = f.find("topk_ids");
  EXPECT_TRUE(t && t->dtype == DType::I32) << file;
  if (!t) return {};
  std::vector<int32_t> v(t->nbytes / 4);
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

TEST(EpCli, RunOnFewerGpusThanRanksIsEmulated) {
  if (!gpu_available()) GTEST_SKIP() << "needs a CUDA device";
  if (ep::rank_env()) GTEST_SKIP() << "not inside a rank process";
  const std::string cli = cli_path();
  if (cli.empty()) GTEST_SKIP() << "the nvfp4moe CLI is not built next to the tests";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  TempDir tmp;
  auto at = [&](const char* name) { return (tmp.path / name).string(); };
  save_moe_layer(at("model"), 0, w);
  Rng rng(seed + 5);
  const int64_t T = 13, H = cfg.hidden, k = cfg.top_k;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.2);
  {
    SafetensorsWriter wr;
    wr.add("hidden_states", DType::F32, {T, H}, x.data());
    wr.write(at("x.safetensors"));
    SafetensorsWriter wr2;
    wr2.add("hidden_states", DType::F32, {T, H}, x.data());
    wr2.add("topk_ids", DType::I32, {T, k}, r.ids.data());
    wr2.add("topk_weights", DType::F32, {T, k}, r.weights.data());
    wr2.write(at("xr.safetensors"));
  }
  const std::string run = cli + " run --device cuda --model " + at("model") + " --layer 0";
  // One GPU visible to the command: R = 2 is emulated.
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string first = visible && *visible ? std::string(visible).substr(0, std::string(visible).find(',')) : "0";
  const std::string one_gpu = "CUDA_VISIBLE_DEVICES='" + first + "' ";

  // Caller routing: the single-GPU layer's result.
  ASSERT_EQ(std::system((one_gpu + run + " --ep 2 --input " + at("xr.safetensors") + " --output " +
                         at("y_emu_r.safetensors") + " > /dev/null 2> " + at("err")).c_str()), 0)
      << read_text(at("err"));
  const std::string err = read_text(at("err"));
  EXPECT_NE(err.find("--ep 2 on cuda"), std::string::npos) << err;
  EXPECT_NE(err.find("emulated on GPU 0"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "one line: " << err;
  const std::vector<float> y_emu_r = read_output(at("y_emu_r.safetensors"), T, H);
  EXPECT_EQ(count_non_finite(y_emu_r), 0);
  EXPECT_LE(rel_l2(y_emu_r, single_device_forward(w, x, T, r)), 1e-2);

  // The router on each emulated rank against `run --device cuda` on one GPU.
  ASSERT_EQ(std::system((one_gpu + run + " --ep 2 --input " + at("x.safetensors") + " --output " +
                         at("y_emu.safetensors") + " > /dev/null 2>&1").c_str()), 0);
  ASSERT_EQ(std::system((run + " --input " + at("x.safetensors") + " --output " + at("y_one.safetensors") +
                         " > /dev/null 2>&1").c_str()), 0);
  const std::vector<float> y_emu = read_output(at("y_emu.safetensors"), T, H),
                           y_one = read_output(at("y_one.safetensors"), T, H);
  EXPECT_EQ(count_non_finite(y_emu), 0);
  EXPECT_LE(rel_l2(y_emu, y_one), 1e-2);
  EXPECT_EQ(read_ids(at("y_emu.safetensors")), read_ids(at("y_one.safetensors")));

  // Two GPUs and NCCL: the same command runs two rank processes; the emulation equals them.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2 || !nccl_ep_available()) {
    std::printf("[ INFO     ] fewer than 2 GPUs or no NCCL: the rank processes are not compared\n");
    return;
  }
  ASSERT_EQ(std::system((run + " --ep 2 --input " + at("x.safetensors") + " --output " + at("y_nccl.safetensors") +
                         " > /dev/null 2> " + at("err2")).c_str()), 0);
  EXPECT_EQ(read_text(at("err2")).find("emulated"), std::string::npos) << read_text(at("err2"));
  const std::vector<float> y_nccl = read_output(at("y_nccl.safetensors"), T, H);
  EXPECT_LE(rel_l2(y_emu, y_nccl), 1e-2);
  EXPECT_EQ(read_ids(at("y_emu.safetensors")), read_ids(at("y_nccl.safetensors")));
}

}  // namespace
}  // namespace nvfp4moe::test
