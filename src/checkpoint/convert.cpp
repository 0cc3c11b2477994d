// `nvfp4moe convert --to nvfp4`: the checkpoint plumbing of ModelOpt's
// examples/deepseek/deepseek_v4/quantize_to_nvfp4.py (which routed-expert
// weights, the w1/w3 pairing, the tensors added and dropped, the index,
// config.json and hf_quant_config.json), over rewrite_checkpoint's streaming
// shard-by-shard rewrite. The numerics are convert_expert.cpp.
#include "checkpoint/convert.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "checkpoint/convert_expert.hpp"
#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/mxfp4_weights.hpp"
#include "common/json.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

namespace {

// quantize_to_nvfp4.py's _EXPERT_WEIGHT_RE: (mtp.N|layers.N).ffn.experts.E.w[123].weight,
// DeepSeek's names only; parsed in one pass (names come from untrusted files).
bool is_expert_weight(const std::string& name) {
  const std::optional<ParsedMoeName> p = parse_moe_name(name);
  return p && p->layout == CheckpointLayout::DeepSeek && p->kind == ParsedMoeName::Kind::Expert &&
         p->suffix == "weight";
}

std::string strip_weight(const std::string& name) { return name.substr(0, name.size() - 7); }  // "<path>.weight"
std::string proj_of(const std::string& path) { return path.substr(path.size() - 2); }          // "w1"
std::string sibling13(const std::string& path) {
  const std::string p = proj_of(path);
  return p == "w2" ? "" : path.substr(0, path.size() - 2) + (p == "w1" ? "w3" : "w1");
}
std::string experts_module(const std::string& path) { return path.substr(0, path.find(".experts.") + 8); }

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

// Objects with their keys sorted, recursively (json.dumps(sort_keys=True)).
json::Value sorted(const json::Value& v) {
  if (v.is_array()) {
    json::Value a = json::Value::array();
    for (const auto& x : v.items()) a.push(sorted(x));
    return a;
  }
  if (!v.is_object()) return v;
  std::vector<json::Value::Member> m = v.members();
  std::sort(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [k, x] : m) x = sorted(x);  // keys of one object are distinct: no set() lookups
  return json::Value::object(std::move(m));
}

json::Value producer() {
  return json::Value::object({{"name", json::Value::string("modelopt")},
                              {"version", json::Value::string("dsv4-nvfp4-experts")}});
}

json::Value config_groups() {
  using json::Value;
  auto q = [] {
    return Value::object({{"dynamic", Value::boolean(false)}, {"num_bits", Value::integer(4)},
                          {"type", Value::string("float")}, {"group_size", Value::integer(16)}});
  };
  return Value::object({{"group_0", Value::object({{"input_activations", q()}, {"weights", q()},
                                                   {"targets", Value::array({Value::string("Linear")})}})}});
}

// _rewrite_config_json: the FP8 quantization_config kept, the NVFP4 MoE
// manifest added to it; written with sorted keys and a final newline.
std::string edit_config(const std::string& text, const json::Value& manifest) {
  using json::Value;
  Value cfg = text.empty() ? Value::object() : json::parse(text, "config.json");
  const Value* q0 = cfg.find("quantization_config");
  Value q = q0 && q0->is_object() ? *q0 : Value::object();
  if (!q.find("activation_scheme")) q.set("activation_scheme", Value::string("dynamic"));
  q.set("quant_method", Value::string("fp8"));
  if (!q.find("weight_block_size")) q.set("weight_block_size", Value::array({Value::integer(128), Value::integer(128)}));
  q.set("moe_quant_algo", Value::string("NVFP4"));
  q.set("producer", producer());
  for (const char* k : {"quant_algo", "kv_cache_quant_algo", "group_size", "quantized_layers", "exclude_modules"})
    q.set(k, *manifest.find(k));
  q.set("config_groups", config_groups());
  q.set("ignore", *manifest.find("exclude_modules"));
  cfg.set("quantization_config", std::move(q));
  return json::dump(sorted(cfg), 2) + "\n";
}

struct Plan {
  std::set<std::string> paths;    // "<block>.ffn.experts.<e>.<wN>" converted
  std::set<std::string> modules;  // "<block>.ffn.experts" converted
  std::map<std::string, float> input_fallback;  // proj -> max calibrated input amax
};

const float* find_amax(const ConvertOptions& o, const std::string& path, const char* which) {
  const auto it = o.amax.find(path + "_" + which + "_quantizer._amax");
  return it == o.amax.end() ? nullptr : &it->second;
}

// The amax and k_max of each weight, taken once: a w1 and its w3 each ask
// for both (the sibling may sit in another shard).
struct WeightStats {
  const ModelDir& dir;
  const ConvertNumerics& num;
  std::map<std::string, float> amaxes;
  std::map<std::string, int> kmaxes;

  float amax(const std::string& path) {
    auto it = amaxes.find(path);
    if (it == amaxes.end()) it = amaxes.emplace(path, num.amax(read_mxfp4_weight(dir, path))).first;
    return it->second;
  }
  int kmax(const std::string& path) {
    auto it = kmaxes.find(path);
    if (it == kmaxes.end()) it = kmaxes.emplace(path, num.kmax(read_mxfp4_weight(dir, path))).first;
    return it->second;
  }
};

// The weight's amax: calibrated, or from its values; w1 and w3 share the max of theirs.
float weight_amax(WeightStats& stats, const Plan& plan, const ConvertOptions& o, const std::string& path) {
  auto one = [&](const std::string& p) {
    if (const float* a = find_amax(o, p, "weight")) return *a;
    return stats.amax(p);
  };
  const std::string sib = sibling13(path);
  return std::max(one(path), !sib.empty() && plan.paths.count(sib) ? one(sib) : 0.0f);
}

// The input amax: calibrated (w1 and w3 fused by max), else the max over the
// calibrated experts of the projection; nullopt when no amaxes were given.
std::optional<float> input_amax(const Plan& plan, const ConvertOptions& o, const std::string& path) {
  if (o.amax.empty()) return std::nullopt;
  const float* a = find_amax(o, path, "input");
  const std::string sib = sibling13(path);
  const float* b = sib.empty() ? nullptr : find_amax(o, sib, "input");
  if (a || b) return std::max(a ? *a : 0.0f, b ? *b : 0.0f);
  const auto fb = plan.input_fallback.find(proj_of(path));
  NVFP4_CHECK(fb != plan.input_fallback.end(), "convert: no input amax for ", path,
              " and no calibrated expert of projection ", proj_of(path), " to fall back on");
  return fb->second;
}

// Jobs 0..n-1 over one thread per numerics instance (the calling thread
// alone when there is one); the first exception is rethrown after all stop.
void run_workers(const std::vector<ConvertNumerics>& nums, int64_t n,
                 const std::function<void(const ConvertNumerics&, int64_t)>& job) {
  if (nums.size() == 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) job(nums[0], i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (size_t k = 0; k < nums.size() && int64_t(k) < n; ++k)
    threads.emplace_back([&, k] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        try {
          job(nums[k], i);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          next = n;  // the others stop at their next job
        }
      }
    });
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

Plan make_plan(const ModelDir& dir, const ConvertOptions& o) {
  Plan plan;
  for (const std::string& name : dir.tensor_names()) {
    if (!is_expert_weight(name)) continue;
    if (!o.include_mtp && name.rfind("mtp.", 0) == 0) continue;
    const std::string path = strip_weight(name);
    NVFP4_CHECK(dir.has(path + ".scale"), "convert: ", name, " has no paired \"", path,
                ".scale\" (an MXFP4 routed-expert weight needs its UE8M0 scales)");
    plan.paths.insert(path);
    plan.modules.insert(experts_module(path));
  }
  NVFP4_CHECK(!plan.paths.empty(), "convert: ", dir.path(), " has no MXFP4 routed-expert weights (names ",
              "layers.L.ffn.experts.E.w1|w2|w3.weight with .scale", o.include_mtp ? ", or mtp.N..." : "", ")");
  for (const auto& [key, v] : o.amax) {
    const size_t at = key.find("_input_quantizer._amax");
    if (at == std::string::npos) continue;
    const std::string proj = key.substr(at - 2, 2);
    float fused = v;  // the fallback is taken after w1/w3 fusion, as ModelOpt does
    const std::string sib = sibling13(key.substr(0, at));
    if (!sib.empty())
      if (const float* s = find_amax(o, sib, "input")) fused = std::max(fused, *s);
    plan.input_fallback[proj] = std::max(plan.input_fallback[proj], fused);
  }
  return plan;
}

}  // namespace

ConvertReport convert_mxfp4_to_nvfp4(const std::string& in, const std::string& out, const ConvertOptions& o) {
  const ModelDir dir(in);
  NVFP4_CHECK(dir.layout() == CheckpointLayout::DeepSeek, "convert: ", in, " has Hugging Face names; ",
              "ModelOpt's conversion reads the official release's names (layers.L.ffn.experts...)");
  const Plan plan = make_plan(dir, o);
  std::vector<std::string> excluded = deepseek_excluded_modules();
  if (o.include_mtp) excluded.erase(std::remove(excluded.begin(), excluded.end(), "mtp.*"), excluded.end());
  const json::Value manifest =
      mixed_precision_manifest(std::vector<std::string>(plan.modules.begin(), plan.modules.end()), excluded);
  const std::string hf_quant =
      json::dump(json::Value::object({{"producer", producer()}, {"quantization", manifest}}), 2);

  std::vector<ConvertNumerics> nums;  // one per worker
  if (o.make_numerics)
    for (int i = 0; i < std::max(1, o.workers); ++i) nums.push_back(o.make_numerics());
  else
    nums.push_back(o.numerics ? *o.numerics : host_convert_numerics(o.threads));
  const ConvertNumerics& num = nums[0];
  WeightStats stats{dir, num, {}, {}};
  ConvertReport report;
  const int64_t shard_count = int64_t(model_shard_files(in).size());
  std::mutex done_mu;  // orders the weight_done calls of the workers
  int64_t weights_done = 0;
  RewriteSpec spec;
  spec.copy_directories = true;
  spec.extra_files = {{"hf_quant_config.json", hf_quant}};
  spec.config_edit = [&](const std::string& text) { return edit_config(text, manifest); };
  // Per shard: the pass-through tensors go into the writer with their bytes,
  // the converted ones as deferred tensors that the filler computes and
  // writes during SafetensorsWriter::write: the workers take the amaxes (or
  // k_max) not known yet, then each converts a weight and writes it at its
  // offset at once, so the GPU's copies and kernels, the reads of the
  // mapped input and the writes overlap. Outputs keep the file order.
  struct Item {
    std::string name, path;
    int64_t rows = 0, cols = 0;
    size_t codes = 0, scales = 0, g = 0;  // deferred tensor indices
    int64_t blocks = 0, exact_blocks = 0;
  };
  spec.transform = [&](const SafetensorsFile& src, SafetensorsWriter& w) {
    auto items = std::make_shared<std::vector<Item>>();
    int64_t passed = 0;
    for (const TensorInfo& t : src.tensors()) {
      const bool is_weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      const bool is_scale = t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".scale") == 0;
      if (is_scale && plan.paths.count(t.name.substr(0, t.name.size() - 6))) continue;  // the .scale sibling: dropped
      if (!is_weight || !plan.paths.count(strip_weight(t.name))) {
        w.add(t.name, t.dtype, t.shape, t.data);  // passed through byte for byte
        ++passed;
        continue;
      }
      const std::string path = strip_weight(t.name);
      const Mxfp4WeightView v = read_mxfp4_weight(dir, path);  // checked here, before any output
      Item it{t.name, path, v.rows, v.cols};
      it.codes = w.add_deferred(t.name, DType::U8, {v.rows, v.cols / 2});
      it.scales = w.add_deferred(path + ".weight_scale", DType::F8E4M3, {v.rows, v.cols / 16});
      it.g = w.add_deferred(path + ".weight_scale_2", DType::F32, {});
      if (const std::optional<float> a = input_amax(plan, o, path))
        w.add_owned(path + ".input_scale", DType::F32, {}, f32_bytes(global_scale_for_amax(*a)));
      items->push_back(std::move(it));
    }
    const std::string shard_name = src.path().substr(src.path().rfind('/') + 1);
    ++report.shards;
    report.experts_converted += int64_t(items->size());
    report.tensors_passed += passed;
    const int64_t shard_index = report.shards;
    w.set_filler([&, items, passed, shard_name, shard_index](SafetensorsStream& stream) {
      std::vector<std::string> stat_paths;
      auto known = [&](const std::string& q) {
        return o.lossless ? stats.kmaxes.count(q) > 0 : stats.amaxes.count(q) > 0 || find_amax(o, q, "weight");
      };
      for (const Item& it : *items) {
        const std::string sib = sibling13(it.path);
        for (const std::string& q : {it.path, !sib.empty() && plan.paths.count(sib) ? sib : std::string()})
          if (!q.empty() && !known(q)) stat_paths.push_back(q);
      }
      std::sort(stat_paths.begin(), stat_paths.end());
      stat_paths.erase(std::unique(stat_paths.begin(), stat_paths.end()), stat_paths.end());
      std::vector<float> stat_amax(stat_paths.size());
      std::vector<int> stat_kmax(stat_paths.size());
      run_workers(nums, int64_t(stat_paths.size()), [&](const ConvertNumerics& n, int64_t i) {
        const Mxfp4WeightView v = read_mxfp4_weight(dir, stat_paths[size_t(i)]);
        if (o.lossless)
          stat_kmax[size_t(i)] = n.kmax(v);
        else
          stat_amax[size_t(i)] = n.amax(v);
      });
      for (size_t i = 0; i < stat_paths.size(); ++i)
        if (o.lossless)
          stats.kmaxes.emplace(stat_paths[i], stat_kmax[i]);
        else
          stats.amaxes.emplace(stat_paths[i], stat_amax[i]);
      // The per-weight parameters (map lookups, on this thread), then the workers.
      std::vector<float> g(items->size());
      std::vector<int> m(items->size());
      for (size_t i = 0; i < items->size(); ++i) {
        const std::string& path = (*items)[i].path;
        if (o.lossless) {
          int kmax = stats.kmax(path);
          const std::string sib = sibling13(path);
          if (!sib.empty() && plan.paths.count(sib)) kmax = std::max(kmax, stats.kmax(sib));
          m[i] = kmax - 8;
        } else {
          g[i] = global_scale_for_amax(weight_amax(stats, plan, o, path));
        }
      }
      run_workers(nums, int64_t(items->size()), [&](const ConvertNumerics& n, int64_t i) {
        Item& it = (*items)[size_t(i)];
        const Mxfp4WeightView v = read_mxfp4_weight(dir, it.path);
        const Nvfp4Tensor q = o.lossless ? n.cast_lossless(v, m[size_t(i)]) : n.requantize(v, g[size_t(i)]);
        stream.write(it.codes, q.codes.data(), q.codes.size());
        stream.write(it.scales, q.scales.data(), q.scales.size());
        stream.write(it.g, &q.g, sizeof q.g);
        it.blocks = q.blocks;
        it.exact_blocks = q.exact_blocks;
        if (o.weight_done) {
          const std::lock_guard<std::mutex> lock(done_mu);
          o.weight_done(++weights_done, int64_t(plan.paths.size()), shard_name);
        }
      });
      for (const Item& it : *items) {
        report.blocks += it.blocks;
        if (!o.lossless) continue;
        report.exact_blocks += it.exact_blocks;
        if (it.exact_blocks != it.blocks)
          report.inexact.push_back(it.name + ": " + std::to_string(it.blocks - it.exact_blocks) + " of " +
                                   std::to_string(it.blocks) + " blocks requantized");
      }
      if (o.progress)
        o.progress("convert: shard " + std::to_string(shard_index) + "/" + std::to_string(shard_count) + " " +
                   shard_name + ": " + std::to_string(items->size()) + " expert weights to NVFP4, " +
                   std::to_string(passed) + " tensors passed through");
    });
  };
  rewrite_checkpoint(in, out, spec);
  return report;
}

}  // namespace nvfp4moe
