// `nvfp4moe inspect` on a model directory of the real release's size reads
// headers, configs and the 0-d scales only. The directory is DeepSeek-V4-
// Flash's routed experts (61 layers x 256 experts x 3 projections, H = 4096,
// I = 2048: 211 GB of codes and block scales) in 64 shards, written sparse:
// headers and the small tensors at the front of each data section are real
// bytes, the codes, block scales and router weights behind them a hole. A
// hole's pages enter the page cache only when something reads them, so
// mincore() after the command shows what it read of the large tensors.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

constexpr int kLayers = 61, kExperts = 256, kShards = 64;
constexpr int64_t kH = 4096, kI = 2048;

struct Shard {
  std::string file;
  uint64_t small_end = 0, data_end = 0;  // data-section offsets: [0, small_end) written, the rest a hole
  uint64_t header_len = 0;
};

std::string shard_name(int s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", s + 1, kShards);
  return buf;
}

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t bytes;
};

// Writes one shard: the 4-byte tensors first (their values real), then the large ones as a hole.
Shard write_shard(const std::string& dir, int s, const std::vector<Entry>& small, const std::vector<Entry>& large,
                  float scalar_value) {
  Shard sh;
  sh.file = shard_name(s);
  // The header text is assembled directly: json::Value::set looks keys up
  // linearly, too slow for thousands of tensors.
  std::string text = "{";
  uint64_t at = 0;
  for (const auto* list : {&small, &large}) {
    for (const Entry& e : *list) {
      std::string shape;
      for (int64_t v : e.shape) {
        if (!shape.empty()) shape += ',';
        shape += std::to_string(v);
      }
      if (text.size() > 1) text += ',';
      text += json::quote(e.name);
      text += ":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(at) +
              "," + std::to_string(at + e.bytes) + "]}";
      at += e.bytes;
    }
    if (list == &small) sh.small_end = at;
  }
  text += "}";
  sh.data_end = at;
  sh.header_len = text.size();
  std::vector<uint8_t> head(8 + text.size() + sh.small_end);
  for (int i = 0; i < 8; ++i) head[size_t(i)] = uint8_t(uint64_t(text.size()) >> (8 * i));
  std::memcpy(head.data() + 8, text.data(), text.size());
  for (uint64_t o = 0; o < sh.small_end; o += 4) std::memcpy(head.data() + 8 + text.size() + o, &scalar_value, 4);
  const std::string path = dir + "/" + sh.file;
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::write(fd, head.data(), head.size()), ssize_t(head.size()));
  EXPECT_EQ(::ftruncate(fd, off_t(8 + text.size() + sh.data_end)), 0);  // the large tensors: a hole
  ::close(fd);
  return sh;
}

// Bytes of [from, to) of `path` that are in the page cache.
uint64_t resident_bytes(const std::string& path, uint64_t from, uint64_t to) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  struct stat st;
  EXPECT_TRUE(fd >= 0 && ::fstat(fd, &st) == 0) << path;
  const size_t size = size_t(st.st_size), page = size_t(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  EXPECT_NE(p, MAP_FAILED) << path;
  std::vector<unsigned char> vec((size + page - 1) / page);
  EXPECT_EQ(::mincore(p, size, vec.data()), 0) << path;
  uint64_t n = 0;
  for (size_t i = from / page; i < (to + page - 1) / page && i < vec.size(); ++i) n += (vec[i] & 1) ? page : 0;
  ::munmap(p, size);
  return n;
}

TEST(InspectScale, ReleaseSizedModelIsInspectedFromHeadersAndScalarsOnly) {
  ScratchDir d;
  // The method first: reading a hole of a fresh sparse file puts its pages in the page cache.
  {
    const std::string probe = d / "probe";
    const int fd = ::open(probe.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 8 << 20), 0);
    ::close(fd);
    ASSERT_EQ(resident_bytes(probe, 0, 8 << 20), 0u) << "a fresh hole is already cached";
    const int rd = ::open(probe.c_str(), O_RDONLY);
    void* p = ::mmap(nullptr, 8 << 20, PROT_READ, MAP_SHARED, rd, 0);
    ::close(rd);
    ASSERT_NE(p, MAP_FAILED);
    volatile uint8_t sink = 0;
    for (size_t o = 2 << 20; o < (3 << 20); o += 4096) sink = sink + static_cast<const uint8_t*>(p)[o];
    ::munmap(p, 8 << 20);
    if (resident_bytes(probe, 2 << 20, 3 << 20) < (1 << 20) / 2)
      GTEST_SKIP() << "this file system does not cache the pages of a hole that was read; mincore cannot tell";
  }

  const std::string model = d / "model";
  std::filesystem::create_directories(model);
  const int total = kLayers * kExperts * 3;
  std::vector<Shard> shards;
  std::string map;  // the index's weight_map, as text
  uint64_t large_bytes = 0, block_scale_bytes = 0;
  int next = 0;
  for (int s = 0; s < kShards; ++s) {
    std::vector<Entry> small, large;
    const int end = int(int64_t(total) * (s + 1) / kShards);
    for (; next < end; ++next) {
      const int L = next / (kExperts * 3), e = next / 3 % kExperts, p = next % 3;
      const std::string prefix = "layers." + std::to_string(L) + ".ffn.";
      if (e == 0 && p == 0) {
        small.push_back({prefix + "gate.bias", "F32", {kExperts}, uint64_t(kExperts) * 4});
        large.push_back({prefix + "gate.weight", "F32", {kExperts, kH}, uint64_t(kExperts * kH) * 4});
      }
      const char* proj[] = {"w1", "w3", "w2"};
      const int64_t N = p == 2 ? kH : kI, K = p == 2 ? kI : kH;
      const std::string w = prefix + "experts." + std::to_string(e) + "." + proj[p];
      small.push_back({w + ".weight_scale_2", "F32", {}, 4});
      small.push_back({w + ".input_scale", "F32", {}, 4});
      large.push_back({w + ".weight", "U8", {N, K / 2}, uint64_t(N * K / 2)});
      large.push_back({w + ".weight_scale", "F8_E4M3", {N, K / 16}, uint64_t(N * K / 16)});
      block_scale_bytes += uint64_t(N * K / 16);
    }
    for (const auto* list : {&small, &large})
      for (const Entry& e : *list) {
        if (!map.empty()) map += ',';
        map += json::quote(e.name);
        map += ":\"" + shard_name(s) + "\"";
      }
    for (const Entry& e : large) large_bytes += e.bytes;
    shards.push_back(write_shard(model, s, small, large, 1.0f / 2688.0f));
  }
  test::write_text(model + "/model.safetensors.index.json", "{\"metadata\":{},\"weight_map\":{" + map + "}}");
  test::write_text(model + "/config.json",
                   R"({"hidden_size": 4096, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                       "num_experts_per_tok": 6, "n_shared_experts": 0, "num_hash_layers": 0,
                       "num_hidden_layers": 61, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0})");
  ASSERT_GT(large_bytes, 200ull << 30);  // the release's size, as holes
  ASSERT_GT(block_scale_bytes, 20ull << 30);

  for (const char* args : {"inspect ", "inspect --json --summary "}) {
    SCOPED_TRACE(args);
    const test::ToolRun r = test::run_tool(args + model);
    ASSERT_EQ(r.code, 0) << r.err;
    if (std::string(args).find("--json") != std::string::npos) {
      // The 0-d scales were read: every layer's weight_scale_2 range counts its 768 projections.
      const json::Value j = json::parse(r.out);
      const auto& layers = j.find("moe_layers")->items();
      ASSERT_EQ(layers.size(), size_t(kLayers));
      for (const json::Value& l : layers) {
        EXPECT_EQ(l.find("routed_format")->as_string(), "NVFP4");
        EXPECT_EQ(l.find("experts")->as_int(), kExperts);
        EXPECT_EQ(l.find("weight_scale_2")->find("count")->as_int(), kExperts * 3);
        EXPECT_EQ(float(l.find("weight_scale_2")->find("max")->as_double()), 1.0f / 2688.0f);
      }
    } else {
      EXPECT_NE(r.out.find("block scales not read"), std::string::npos) << r.out.substr(0, 2000);
    }
    // What it read of the large tensors: no more than readahead around the small ones.
    uint64_t read = 0;
    for (const Shard& s : shards) {
      const uint64_t base = 8 + s.header_len;
      read += resident_bytes(model + "/" + s.file, base + s.small_end, base + s.data_end);
    }
    EXPECT_LT(read, uint64_t(kShards) * (1u << 20))
        << read << " bytes of codes, block scales and router weights were read (of " << large_bytes << ")";
  }
}

}  // namespace
}  // namespace nvfp4moe
