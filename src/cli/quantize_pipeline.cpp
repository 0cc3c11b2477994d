// quantize's pipeline (see quantize_pipeline.hpp) and its two engines.
#include "cli/quantize_pipeline.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "common/worker_pool.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

#ifdef NVFP4MOE_HAS_CUDA
#include "cuda/backend/device_quantizer.hpp"
#endif

namespace nvfp4moe::cli {

namespace {

// The routed-expert fields of a name, or nullopt. quantize matches names as
// text (any length, any digits); a name whose index no loader could address
// (out of range, a leading zero) is simply not an expert here.
std::optional<ParsedMoeName> expert_name(const std::string& name) {
  try {
    std::optional<ParsedMoeName> p = parse_moe_name(name);
    if (p && p->kind == ParsedMoeName::Kind::Expert) return p;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// ---- the host engine ---------------------------------------------------------

// max |x| of a tensor; NaN or Inf is an error naming it and the index.
float amax_of(const TensorInfo& t) {
  const int64_t n = t.shape[0] * t.shape[1];
  float m = 0.0f;
  if (t.dtype == DType::BF16) {
    std::vector<Bf16> x(static_cast<size_t>(n));
    std::memcpy(x.data(), t.data, t.nbytes);
    check_finite(x.data(), n, t.name.c_str());
    for (const Bf16& v : x) m = std::max(m, std::fabs(bf16_to_float(v)));
  } else {
    const std::vector<float> x = t.to_f32();
    check_finite(x.data(), n, t.name.c_str());  // F64 beyond the F32 range becomes Inf: refused
    for (float v : x) m = std::max(m, std::fabs(v));
  }
  return m;
}

Nvfp4Matrix quantize_on_host(const TensorInfo& t, float g) {
  const int64_t N = t.shape[0], K = t.shape[1];
  if (t.dtype == DType::BF16) {
    std::vector<Bf16> x(size_t(N * K));
    std::memcpy(x.data(), t.data, t.nbytes);
    return quantize_matrix(x.data(), N, K, ScaleScope::Static, g, true, t.name.c_str());
  }
  std::vector<float> x = t.to_f32();
  if (t.dtype == DType::F64) check_finite(x.data(), int64_t(x.size()), t.name.c_str());  // f32 overflow -> Inf
  return quantize_matrix(x.data(), N, K, ScaleScope::Static, g, true, t.name.c_str());
}

// Reads the mapping where it quantizes; two slots let the writing of one
// group run next to the arithmetic of the next.
class HostEngine final : public QuantizeEngine {
 public:
  int slots() const override { return int(slots_.size()); }
  void load(int slot, const SafetensorsFile&, const std::vector<const TensorInfo*>& group) override {
    slots_[size_t(slot)].group = group;
  }
  std::vector<float> amaxes(int slot) override {
    std::vector<float> a;
    for (const TensorInfo* t : slots_[size_t(slot)].group) a.push_back(amax_of(*t));
    return a;
  }
  void quantize(int slot, float g) override {
    Slot& s = slots_[size_t(slot)];
    s.out.clear();
    for (const TensorInfo* t : s.group) s.out.push_back(quantize_on_host(*t, g));
  }
  Result result(int slot, size_t j) override {
    const Nvfp4Matrix& m = slots_[size_t(slot)].out.at(j);
    return {m.codes.data(), m.scales.data()};
  }
  float amax(const TensorInfo& t) override { return amax_of(t); }

 private:
  struct Slot {
    std::vector<const TensorInfo*> group;
    std::vector<Nvfp4Matrix> out;
  };
  std::array<Slot, 2> slots_;
};

// ---- the GPU engine ----------------------------------------------------------

#ifdef NVFP4MOE_HAS_CUDA

// Reads each group with pread into the quantizer's pinned staging, in pieces
// spread over several threads: one core copies some 5-10 GB/s out of the page
// cache, less than a fast disk or a cached file gives, and the pieces keep
// several requests in flight on a cold disk. The GPU side (upload, amax and
// quantize kernels, download) overlaps through the quantizer's slots.
class CudaEngine final : public QuantizeEngine {
 public:
  static constexpr int kSlots = 4;  // read, compute and write busy, one spare for jitter
  static constexpr uint64_t kPiece = 8ull << 20;

  explicit CudaEngine(bool timing) : q_(0), pool_(reader_threads()), timing_(timing) {
    q_.set_slots(kSlots);
    if (timing) q_.enable_timing();
  }
  ~CudaEngine() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int slots() const override { return kSlots; }

  void load(int slot, const SafetensorsFile& file, const std::vector<const TensorInfo*>& group) override {
    std::vector<cuda::DeviceQuantizer::GroupTensor> g;
    for (const TensorInfo* t : group) g.push_back({t->name, t->shape[0], t->shape[1], t->dtype == DType::BF16});
    const std::vector<uint8_t*> at = q_.stage_group(slot, g);
    for (size_t j = 0; j < group.size(); ++j) {
      const TensorInfo& t = *group[j];
      if (t.dtype == DType::BF16) {
        read(file, t, at[j]);
      } else {
        const std::vector<float> f = t.to_f32();  // F16 exactly, F64 rounded (beyond F32's range: Inf, refused)
        std::memcpy(at[j], f.data(), f.size() * sizeof(float));
      }
    }
  }
  std::vector<float> amaxes(int slot) override { return q_.group_amaxes(slot); }
  void quantize(int slot, float g) override { q_.quantize_group(slot, g); }
  Result result(int slot, size_t j) override {
    const cuda::DeviceQuantizer::GroupResult r = q_.group_result(slot, j);
    return {r.codes, r.scales};
  }
  float amax(const TensorInfo& t) override { return q_.amax(t); }

  std::string timing() override {
    if (!timing_) return "";
    const cuda::DeviceQuantizerTimes t = q_.times();
    char line[512];
    std::snprintf(line, sizeof line,
                  "timing: device streams: upload %.1f ms (%.2f GB, %.2f GB/s), kernels %.1f ms, download %.1f ms "
                  "(%.2f GB); %d reader threads\n",
                  t.upload_ms, double(t.upload_bytes) / 1e9, t.upload_ms > 0 ? double(t.upload_bytes) / t.upload_ms / 1e6 : 0.0,
                  t.kernel_ms, t.download_ms, double(t.download_bytes) / 1e9, pool_.size());
    return line;
  }

 private:
  static int reader_threads() {
    const unsigned hc = std::thread::hardware_concurrency();
    return std::clamp(int(hc / 2), 1, 8);
  }

  void read(const SafetensorsFile& file, const TensorInfo& t, uint8_t* dst) {
    if (file.path() != fd_path_) {
      if (fd_ >= 0) ::close(fd_);
      fd_path_.clear();
      fd_ = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
      NVFP4_CHECK(fd_ >= 0, file.path(), ": cannot open: ", std::strerror(errno));
      fd_path_ = file.path();
#ifdef POSIX_FADV_SEQUENTIAL
      ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger readahead window
#endif
    }
    const uint64_t base = file.file_offset(t), n = t.nbytes;
    parallel_for(pool_, int64_t((n + kPiece - 1) / kPiece), 1, [&](int64_t b, int64_t e) {
      const uint64_t end = std::min(n, uint64_t(e) * kPiece);
      for (uint64_t at = uint64_t(b) * kPiece; at < end;) {
        const ssize_t r = ::pread(fd_, dst + at, size_t(end - at), off_t(base + at));
        if (r < 0 && errno == EINTR) continue;
        NVFP4_CHECK(r > 0, file.path(), ": reading tensor \"", t.name, "\" at byte ", base + at, " failed: ",
                    r < 0 ? std::strerror(errno) : "the file ends early");
        at += uint64_t(r);
      }
    });
  }

  cuda::DeviceQuantizer q_;
  WorkerPool pool_;
  bool timing_;
  int fd_ = -1;
  std::string fd_path_;
};

#endif

}  // namespace

std::unique_ptr<QuantizeEngine> make_quantize_engine(const std::string& device, bool timing) {
  if (device == "cpu") return std::make_unique<HostEngine>();
#ifdef NVFP4MOE_HAS_CUDA
  return std::make_unique<CudaEngine>(timing);
#else
  (void)timing;
  NVFP4_FAIL("--device cuda: this build of nvfp4moe has no CUDA backend (nvcc was not found at configure time)");
#endif
}

// ---- the plan ------------------------------------------------------------------

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64; }

bool ends_with_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool QuantizePlan::quantized(const TensorInfo& t) const {
  return include_.search(t.name) && t.shape.size() == 2 && is_float_dtype(t.dtype);
}

std::optional<std::string> QuantizePlan::partner(const TensorInfo& t) const {
  const std::optional<ParsedMoeName> p = expert_name(t.name);
  if (!p || p->suffix != "weight" || p->proj == Proj::Down) return std::nullopt;
  std::string s = MoeNames(p->layout, p->block).expert(p->expert, p->proj == Proj::Gate ? Proj::Up : Proj::Gate) +
                  ".weight";
  if (!md_.has(s) || !quantized(md_.get(s))) return std::nullopt;
  return s;
}

float QuantizePlan::amax(const TensorInfo& t, QuantizeEngine& engine) {
  auto it = amax_.find(t.name);
  if (it == amax_.end()) it = amax_.emplace(t.name, engine.amax(t)).first;
  return it->second;
}

std::string QuantizePlan::module_of(const std::string& name) {
  if (const std::optional<ParsedMoeName> p = expert_name(name)) return MoeNames(p->layout, p->block).experts_module();
  return name.substr(0, name.size() - 7);
}

// ---- the pipeline --------------------------------------------------------------

std::vector<std::vector<size_t>> quantize_groups(const SafetensorsFile& file, const QuantizePlan& plan) {
  const std::vector<TensorInfo>& ts = file.tensors();
  std::vector<size_t> by_offset(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) by_offset[i] = i;
  std::stable_sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) { return ts[a].data < ts[b].data; });
  std::vector<bool> taken(ts.size(), false);
  std::vector<std::vector<size_t>> groups;
  for (size_t i : by_offset) {
    if (taken[i]) continue;
    taken[i] = true;
    std::vector<size_t>& g = groups.emplace_back(1, i);
    if (!plan.quantized(ts[i])) continue;
    if (const std::optional<std::string> p = plan.partner(ts[i]))
      if (const TensorInfo* q = file.find(*p)) {
        const size_t j = size_t(q - ts.data());
        taken[j] = true;
        g.push_back(j);
      }
  }
  return groups;
}

void add_quantized_file(const SafetensorsFile& file, SafetensorsWriter& w, QuantizePlan& plan,
                        QuantizeEngine& engine, std::function<void()> tick, QuantizeTimes& times) {
  const std::vector<TensorInfo>& ts = file.tensors();
  std::vector<size_t> out(ts.size());  // each input's first output tensor in w
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo& t = ts[i];
    if (!plan.quantized(t)) {
      out[i] = w.add_deferred(t.name, t.dtype, t.shape);
      continue;
    }
    NVFP4_CHECK(ends_with_weight(t.name), "tensor \"", t.name, "\" matches --include but does not end in \".weight\"");
    const int64_t N = t.shape[0], K = t.shape[1];
    NVFP4_CHECK(K % 16 == 0, "tensor \"", t.name, "\": K=", K, " (shape [", N, ", ", K,
                "]) is not a multiple of 16, cannot quantize to NVFP4");
    const Nvfp4Names n(t.name.substr(0, t.name.size() - 7));
    out[i] = w.add_deferred(n.weight, DType::U8, {N, K / 2});
    w.add_deferred(n.weight_scale, DType::F8E4M3, {N, K / 16});
    w.add_deferred(n.weight_scale_2, DType::F32, {});
  }
  w.set_filler([&file, &plan, &engine, &times, tick = std::move(tick), out = std::move(out),
                groups = quantize_groups(file, plan)](SafetensorsStream& s) {
    const std::vector<TensorInfo>& ts = file.tensors();
    std::vector<bool> is_quantized;
    for (const std::vector<size_t>& grp : groups) is_quantized.push_back(plan.quantized(ts[grp[0]]));
    auto quantized = [&](int64_t i) { return bool(is_quantized[size_t(i)]); };
    std::vector<float> g(groups.size());  // written by compute, read by write
    double io_ms = 0;
    uint64_t bytes_out = 0;
    auto put = [&](size_t index, const void* data, uint64_t n) {
      const auto t0 = std::chrono::steady_clock::now();
      s.write(index, data, n);
      io_ms += ms_since(t0);
      bytes_out += n;
    };
    const std::vector<Stage> stages = {
        // read
        [&](int64_t i, int slot) {
          if (!quantized(i)) return;
          std::vector<const TensorInfo*> members;
          for (size_t k : groups[size_t(i)]) members.push_back(&ts[k]);
          engine.load(slot, file, members);
        },
        // compute
        [&](int64_t i, int slot) {
          if (!quantized(i)) return;
          const std::vector<size_t>& grp = groups[size_t(i)];
          const std::vector<float> a = engine.amaxes(slot);
          float m = 0.0f;
          for (size_t j = 0; j < grp.size(); ++j) {
            plan.remember_amax(ts[grp[j]].name, a[j]);
            m = std::max(m, a[j]);
          }
          if (grp.size() == 1)  // a partner outside this file
            if (const std::optional<std::string> p = plan.partner(ts[grp[0]]))
              m = std::max(m, plan.amax(plan.tensor(*p), engine));
          g[size_t(i)] = global_scale_for_amax(m);
          engine.quantize(slot, g[size_t(i)]);
        },
        // write
        [&](int64_t i, int slot) {
          const std::vector<size_t>& grp = groups[size_t(i)];
          for (size_t j = 0; j < grp.size(); ++j) {
            const TensorInfo& t = ts[grp[j]];
            const size_t o = out[grp[j]];
            if (quantized(i)) {
              const QuantizeEngine::Result r = engine.result(slot, j);
              const uint64_t n = uint64_t(t.shape[0] * t.shape[1]);
              put(o, r.codes, n / 2);
              put(o + 1, r.scales, n / 16);
              put(o + 2, &g[size_t(i)], sizeof(float));
            } else {
              put(o, t.data, t.nbytes);
            }
            tick();
          }
        }};
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<StageTimes> st = run_stages(int64_t(groups.size()), engine.slots(), stages);
    times.pipeline_ms += ms_since(t0);
    StageTimes* sum[3] = {&times.read, &times.compute, &times.write};
    for (size_t k = 0; k < 3; ++k) {
      sum[k]->busy_ms += st[k].busy_ms;
      sum[k]->wait_ms += st[k].wait_ms;
    }
    times.write_io_ms += io_ms;
    times.bytes_out += bytes_out;
    for (const TensorInfo& t : ts) times.bytes_in += t.nbytes;
    times.groups += int64_t(groups.size());
  });
}

}  // namespace nvfp4moe::cli
