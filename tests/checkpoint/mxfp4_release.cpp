// The MXFP4 release fixture (see mxfp4_release.hpp).
#include "checkpoint/mxfp4_release.hpp"

#include <filesystem>

#include "checkpoint/checkpoint_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe::test {

Mxfp4Matrix random_mxfp4(Rng& rng, int64_t N, int64_t K, int base, int spread) {
  Mxfp4Matrix m{N, K, std::vector<uint8_t>(size_t(N * K / 2)), std::vector<uint8_t>(size_t(N * K / 32))};
  for (auto& b : m.codes) b = uint8_t(rng.next());
  for (auto& s : m.scales) s = uint8_t(base + rng.below(spread));
  return m;
}

Mxfp4Release make_mxfp4_release(Rng& rng, int spread, int64_t H, int64_t I, int64_t E) {
  Mxfp4Release r;
  r.hidden = H;
  r.intermediate = I;
  r.experts = E;
  r.attn.assign(size_t(128 * H), 0x3A);
  for (const char* block : {"layers.0", "mtp.0"})
    for (int64_t e = 0; e < E; ++e)
      for (const char* p : {"w1", "w3", "w2"}) {
        const bool down = std::string(p) == "w2";
        r.weights[std::string(block) + ".ffn.experts." + std::to_string(e) + "." + p] =
            random_mxfp4(rng, down ? H : I, down ? I : H, 118, spread);
      }
  return r;
}

void write_mxfp4_release(const Mxfp4Release& r, const std::string& dir) {
  std::filesystem::create_directories(dir + "/inference");
  SafetensorsWriter s1, s2;
  json::Value map = json::Value::object();
  for (const auto& [path, m] : r.weights) {
    SafetensorsWriter& w = path.rfind("mtp.", 0) == 0 ? s2 : s1;
    w.add(path + ".weight", DType::I8, {m.rows, m.cols / 2}, m.codes.data());
    w.add(path + ".scale", DType::F8E8M0, {m.rows, m.cols / 32}, m.scales.data());
    const char* shard = &w == &s1 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    map.set(path + ".weight", json::Value::string(shard));
    map.set(path + ".scale", json::Value::string(shard));
  }
  s1.add("layers.0.attn.wq_a.weight", DType::F8E4M3, {128, r.hidden}, r.attn.data());
  s1.add("layers.0.attn.wq_a.scale", DType::F8E8M0, {1, 1}, r.attn_scale.data());
  map.set("layers.0.attn.wq_a.weight", json::Value::string("model-00001-of-00002.safetensors"));
  map.set("layers.0.attn.wq_a.scale", json::Value::string("model-00001-of-00002.safetensors"));
  s1.write(dir + "/model-00001-of-00002.safetensors");
  s2.write(dir + "/model-00002-of-00002.safetensors");
  const json::Value metadata = json::Value::object({{"total_size", json::Value::integer(1)}});
  write_text(dir + "/model.safetensors.index.json",
             json::dump(json::Value::object({{"metadata", metadata}, {"weight_map", map}}), 2));
  write_text(dir + "/config.json", "{\"hidden_size\": " + std::to_string(r.hidden) + R"(, "expert_dtype": "fp4",
      "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
      "activation_scheme": "dynamic", "weight_block_size": [128, 128]}})");
  write_text(dir + "/inference/config.json", "{\"dim\": " + std::to_string(r.hidden) + "}");
  write_text(dir + "/tokenizer.json", "{}");
}

}  // namespace nvfp4moe::test
