// quantize's pipeline (cli/quantize_pipeline.hpp): the groups follow the
// file (an expert's gate and up together), the streamed file holds the bytes
// that adding quantize_matrix's results to a SafetensorsWriter gives, each
// group meets the engine in the order load -> amaxes -> quantize -> result
// on three threads, and a gate whose up lies in another file is measured
// once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_files.hpp"
#include "cli/quantize_pipeline.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cli {
namespace {

using test::ScratchDir;

const char* kExperts = R"(^layers\.[0-9]+\.ffn\.experts\.[0-9]+\.w[123]\.weight$)";
const std::string kFfn = "layers.0.ffn.experts.";

struct Tensor {
  std::string name;
  int64_t rows, cols;
  std::vector<Bf16> v;
  float amax() const {
    float m = 0;
    for (Bf16 x : v) m = std::max(m, std::fabs(bf16_to_float(x)));
    return m;
  }
};

Tensor random_tensor(test::Rng& rng, const std::string& name, int64_t rows, int64_t cols, float scale) {
  Tensor t{name, rows, cols, {}};
  for (float x : test::random_normal(rng, rows * cols, scale)) t.v.push_back(bf16_from_float(x));
  return t;
}

// One file: two experts in a shuffled order and an attention weight between
// them (kept as it is).
std::vector<Tensor> layer_tensors(test::Rng& rng) {
  const int64_t H = 64, I = 32;
  return {random_tensor(rng, kFfn + "1.w3.weight", I, H, 2.0f), random_tensor(rng, kFfn + "0.w2.weight", H, I, 1.0f),
          random_tensor(rng, kFfn + "0.w1.weight", I, H, 1.0f), random_tensor(rng, "layers.0.attn.wq.weight", I, H, 1.0f),
          random_tensor(rng, kFfn + "1.w1.weight", I, H, 0.5f), random_tensor(rng, kFfn + "0.w3.weight", I, H, 3.0f),
          random_tensor(rng, kFfn + "1.w2.weight", H, I, 1.0f)};
}

void write_file(const std::string& path, const std::vector<Tensor>& ts) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const Tensor& t : ts) w.add(t.name, DType::BF16, {t.rows, t.cols}, t.v.data());
  w.write(path);
}

// quantize's file as SafetensorsWriter builds it from quantize_matrix's
// results, tensor by tensor (gate and up under the g of the larger amax).
void write_expected(const std::string& path, const std::vector<Tensor>& ts) {
  std::map<std::string, float> amax;
  for (const Tensor& t : ts) amax[t.name] = t.amax();
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const Tensor& t : ts) {
    if (t.name.find(".experts.") == std::string::npos) {
      w.add(t.name, DType::BF16, {t.rows, t.cols}, t.v.data());
      continue;
    }
    float a = amax[t.name];
    for (const auto& [from, to] : {std::pair{".w1.", ".w3."}, std::pair{".w3.", ".w1."}})
      if (const size_t at = t.name.find(from); at != std::string::npos)
        a = std::max(a, amax[std::string(t.name).replace(at, 4, to)]);
    const float g = global_scale_for_amax(a);
    Nvfp4Matrix m = quantize_matrix(t.v.data(), t.rows, t.cols, ScaleScope::Static, g, true, t.name.c_str());
    const std::string prefix = t.name.substr(0, t.name.size() - 7);
    w.add_owned(prefix + ".weight", DType::U8, {t.rows, t.cols / 2}, std::move(m.codes));
    w.add_owned(prefix + ".weight_scale", DType::F8E4M3, {t.rows, t.cols / 16}, std::move(m.scales));
    std::vector<uint8_t> gb(4);
    std::memcpy(gb.data(), &g, 4);
    w.add_owned(prefix + ".weight_scale_2", DType::F32, {}, std::move(gb));
  }
  w.write(path);
}

TEST(QuantizePipeline, GroupsFollowTheFileWithGateAndUpTogether) {
  test::Rng rng(test::fresh_seed());
  ScratchDir dir;
  write_file(dir / "x.safetensors", layer_tensors(rng));
  const ModelDir md(dir / "x.safetensors");
  const Pattern include(kExperts);
  const QuantizePlan plan(md, include);
  const SafetensorsFile f(dir / "x.safetensors");
  auto index = [&](const std::string& n) { return size_t(f.find(n) - f.tensors().data()); };
  const std::vector<std::vector<size_t>> want = {
      {index(kFfn + "1.w3.weight"), index(kFfn + "1.w1.weight")},
      {index(kFfn + "0.w2.weight")},
      {index(kFfn + "0.w1.weight"), index(kFfn + "0.w3.weight")},
      {index("layers.0.attn.wq.weight")},
      {index(kFfn + "1.w2.weight")}};
  EXPECT_EQ(quantize_groups(f, plan), want);
}

TEST(QuantizePipeline, TheStreamedFileHoldsTheWritersBytes) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir dir;
  const std::vector<Tensor> ts = layer_tensors(rng);
  write_file(dir / "in.safetensors", ts);
  write_expected(dir / "want.safetensors", ts);
  const ModelDir md(dir / "in.safetensors");
  const Pattern include(kExperts);
  QuantizePlan plan(md, include);
  const std::unique_ptr<QuantizeEngine> engine = make_quantize_engine("cpu", false);
  QuantizeTimes times;
  int ticks = 0;
  const SafetensorsFile src(dir / "in.safetensors");
  SafetensorsWriter w;
  for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
  add_quantized_file(src, w, plan, *engine, [&] { ++ticks; }, times);
  w.write(dir / "got.safetensors");
  EXPECT_EQ(test::read_bytes(dir / "got.safetensors"), test::read_bytes(dir / "want.safetensors"));
  EXPECT_EQ(ticks, int(ts.size()));
  EXPECT_EQ(times.groups, 5);
  uint64_t in = 0;
  for (const Tensor& t : ts) in += t.v.size() * 2;
  EXPECT_EQ(times.bytes_in, in);
}

float amax_of(const TensorInfo& t) {
  std::vector<Bf16> x(size_t(t.numel()));
  std::memcpy(x.data(), t.data, t.nbytes);
  float m = 0;
  for (Bf16 v : x) m = std::max(m, std::fabs(bf16_to_float(v)));
  return m;
}

// The host's arithmetic, recording what the pipeline asks of it and from
// which thread.
class RecordingEngine final : public QuantizeEngine {
 public:
  struct Call {
    std::string what;   // "load", "amaxes", "quantize", "result", "amax"
    std::string first;  // the group's first tensor (amax: the tensor)
    std::thread::id thread;
  };
  std::vector<Call> calls;

  int slots() const override { return 3; }
  void load(int slot, const SafetensorsFile&, const std::vector<const TensorInfo*>& group) override {
    record("load", group[0]->name);
    group_[size_t(slot)] = group;
  }
  std::vector<float> amaxes(int slot) override {
    record("amaxes", group_[size_t(slot)][0]->name);
    std::vector<float> a;
    for (const TensorInfo* t : group_[size_t(slot)]) a.push_back(amax_of(*t));
    return a;
  }
  void quantize(int slot, float g) override {
    record("quantize", group_[size_t(slot)][0]->name);
    out_[size_t(slot)].clear();
    for (const TensorInfo* t : group_[size_t(slot)]) {
      std::vector<Bf16> x(size_t(t->numel()));
      std::memcpy(x.data(), t->data, t->nbytes);
      out_[size_t(slot)].push_back(quantize_matrix(x.data(), t->shape[0], t->shape[1], ScaleScope::Static, g));
    }
  }
  Result result(int slot, size_t j) override {
    record("result", group_[size_t(slot)][0]->name);
    const Nvfp4Matrix& m = out_[size_t(slot)].at(j);
    return {m.codes.data(), m.scales.data()};
  }
  float amax(const TensorInfo& t) override {
    record("amax", t.name);
    return amax_of(t);
  }

 private:
  void record(const char* what, const std::string& first) {
    std::lock_guard<std::mutex> lock(m_);
    calls.push_back({what, first, std::this_thread::get_id()});
  }
  std::mutex m_;
  std::vector<const TensorInfo*> group_[3];
  std::vector<Nvfp4Matrix> out_[3];
};

// Two shards: expert 0's up in the second, the rest in the first.
void write_sharded(const std::string& dir, const std::vector<Tensor>& ts) {
  std::vector<Tensor> a, b;
  for (const Tensor& t : ts) (t.name == kFfn + "0.w3.weight" ? b : a).push_back(t);
  write_file(dir + "/model-00001-of-00002.safetensors", a);
  write_file(dir + "/model-00002-of-00002.safetensors", b);
  json::Value map = json::Value::object();
  for (const Tensor& t : a) map.set(t.name, json::Value::string("model-00001-of-00002.safetensors"));
  for (const Tensor& t : b) map.set(t.name, json::Value::string("model-00002-of-00002.safetensors"));
  test::write_text(dir + "/model.safetensors.index.json",
                   json::dump(json::Value::object({{"metadata", json::Value::object()}, {"weight_map", map}})));
}

TEST(QuantizePipeline, EachGroupMeetsTheEngineInOrderOnThreeThreads) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir dir, out;
  const std::vector<Tensor> ts = layer_tensors(rng);
  write_sharded(dir.path(), ts);
  const ModelDir md(dir.path());
  const Pattern include(kExperts);
  QuantizePlan plan(md, include);
  const SafetensorsFile shard1(dir / "model-00001-of-00002.safetensors");
  const SafetensorsFile shard2(dir / "model-00002-of-00002.safetensors");
  RecordingEngine engine;
  QuantizeTimes times;
  size_t shard1_calls = 0;  // each file has a pipeline, and threads, of its own
  for (const SafetensorsFile* f : {&shard1, &shard2}) {
    SafetensorsWriter w;
    add_quantized_file(*f, w, plan, engine, [] {}, times);
    w.write(out / f->path().substr(f->path().rfind('/') + 1));
    if (f == &shard1) shard1_calls = engine.calls.size();
  }
  // Shard 1's quantized groups in file order: (1.w3, 1.w1), 0.w2, 0.w1 (its
  // up in shard 2), 1.w2; then shard 2's 0.w3.
  const std::vector<std::string> order = {kFfn + "1.w3.weight", kFfn + "0.w2.weight", kFfn + "0.w1.weight",
                                          kFfn + "1.w2.weight", kFfn + "0.w3.weight"};
  for (const char* what : {"load", "amaxes", "quantize", "result"}) {
    std::vector<std::string> seen;  // the groups, a group's results counted once
    for (const auto& c : engine.calls)
      if (c.what == what && (seen.empty() || seen.back() != c.first)) seen.push_back(c.first);
    EXPECT_EQ(seen, order) << what;
  }
  std::map<std::string, std::set<std::thread::id>> threads_of;
  std::set<std::thread::id> stage_threads;
  for (size_t k = 0; k < shard1_calls; ++k) {
    const auto& c = engine.calls[k];
    if (c.what == "amax") continue;
    threads_of[c.what == "quantize" ? "amaxes" : c.what].insert(c.thread);
    stage_threads.insert(c.thread);
  }
  for (const auto& [what, ids] : threads_of) EXPECT_EQ(ids.size(), 1u) << what << " from one thread";
  EXPECT_EQ(stage_threads.size(), 3u) << "load, compute (amaxes, quantize) and result on three threads";
  // A group's calls in order: load, amaxes, quantize, then its results.
  for (const std::string& first : order) {
    std::vector<std::string> seq;
    for (const auto& c : engine.calls)
      if (c.first == first && c.what != "amax" && (seq.empty() || seq.back() != c.what)) seq.push_back(c.what);
    EXPECT_EQ(seq, (std::vector<std::string>{"load", "amaxes", "quantize", "result"})) << first;
  }
  // 0.w3 lies in the other shard: measured once for 0.w1's scale, then
  // remembered (shard 2 measures it again only in its own group).
  int lone = 0;
  for (const auto& c : engine.calls) lone += c.what == "amax";
  EXPECT_EQ(lone, 1);
  // Both halves of the pair carry the g of the larger amax.
  const ModelDir q(out.path() + "/model-00001-of-00002.safetensors");
  const ModelDir q2(out.path() + "/model-00002-of-00002.safetensors");
  float g1, g3;
  std::memcpy(&g1, q.get(kFfn + "0.w1.weight_scale_2").data, 4);
  std::memcpy(&g3, q2.get(kFfn + "0.w3.weight_scale_2").data, 4);
  EXPECT_EQ(g1, g3);
  EXPECT_EQ(g1, global_scale_for_amax(std::max(ts[2].amax(), ts[5].amax())));
}

}  // namespace
}  // namespace nvfp4moe::cli
