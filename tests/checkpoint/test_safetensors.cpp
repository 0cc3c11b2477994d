// safetensors: the writer's byte layout, a round trip of every dtype, and
// every malformed file of docs/numerics.md §6 giving an error that names the file,
// the tensor and the values.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>

#include "checkpoint/checkpoint_files.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::as_bytes;
using test::read_bytes;
using test::safetensors_bytes;
using test::ScratchDir;
using test::write_bytes;

TEST(Safetensors, WriterLayoutGolden) {
  ScratchDir dir;
  SafetensorsWriter w;
  const std::vector<uint8_t> u8 = {1, 2, 3};
  const std::vector<float> f = {1.5f};
  w.add("b", DType::U8, {3}, u8.data());
  w.add("a", DType::F32, {}, f.data());  // larger element size: laid out first
  w.write(dir / "x.safetensors");
  const std::string header = R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[3],"data_offsets":[4,7]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> want = safetensors_bytes(padded, {0, 0, 0xC0, 0x3F, 1, 2, 3});
  EXPECT_EQ(read_bytes(dir / "x.safetensors"), want);
  EXPECT_EQ(padded.size() % 8, 0u);
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors.tmp." + std::to_string(::getpid())));
}

// Every dtype of the safetensors reference implementation
// (huggingface/safetensors, safetensors/src/tensor.rs, enum Dtype).
const DType kAllDtypes[] = {DType::F64,    DType::F32,        DType::F16,        DType::BF16,   DType::I64,
                            DType::I32,    DType::I16,        DType::I8,         DType::U64,    DType::U32,
                            DType::U16,    DType::U8,         DType::Bool,       DType::F8E4M3, DType::F8E5M2,
                            DType::F8E8M0, DType::F8E4M3Fnuz, DType::F8E5M2Fnuz, DType::F4,     DType::F6E2M3,
                            DType::F6E3M2, DType::C64};

TEST(Safetensors, RoundTripOfEveryDtype) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir dir;
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> payload;
  std::vector<std::vector<int64_t>> shapes;
  for (DType t : kAllDtypes) {
    // Sub-byte dtypes: 4 columns a row keep every tensor whole bytes (F4: 2 bytes, F6: 3 bytes).
    const int64_t rows = 1 + rng.below(5), cols = dtype_bits(t) < 8 ? 4 : 1 + rng.below(7);
    std::vector<uint8_t> b(size_t(rows * cols) * dtype_bits(t) / 8);
    for (auto& x : b) x = uint8_t(rng.next());
    if (t == DType::Bool)
      for (auto& x : b) x &= 1;
    payload.push_back(b);
    shapes.push_back({rows, cols});
    w.add_owned(std::string("t_") + dtype_name(t), t, {rows, cols}, b);
    EXPECT_EQ(parse_safetensors_dtype(dtype_name(t)), t);
  }
  w.add("empty", DType::F32, {0, 4}, nullptr);
  w.set_metadata("format", "pt");
  w.write(dir / "all.safetensors");

  SafetensorsFile f(dir / "all.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), std::size(kAllDtypes) + 1);
  for (size_t i = 0; i < std::size(kAllDtypes); ++i) {
    const DType t = kAllDtypes[i];
    const TensorInfo& ti = f.get(std::string("t_") + dtype_name(t));
    EXPECT_EQ(ti.dtype, t);
    EXPECT_EQ(ti.shape, shapes[i]) << dtype_name(t);
    ASSERT_EQ(ti.nbytes, payload[i].size()) << dtype_name(t);
    EXPECT_BYTES_EQ(ti.data, payload[i].data(), int64_t(ti.nbytes), dtype_name(t));
    const size_t align = std::max<size_t>(1, dtype_bits(t) / 8);
    EXPECT_EQ(uintptr_t(ti.data) % align, 0u) << dtype_name(t) << " not aligned";
  }
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_ERROR_CONTAINS(f.get("nope"), "all.safetensors", "missing tensor \"nope\"");
}

TEST(Safetensors, SubByteDtypesCountBitsAndMustFillWholeBytes) {
  EXPECT_EQ(dtype_bits(DType::F4), 4u);
  EXPECT_EQ(dtype_bits(DType::F6E2M3), 6u);
  EXPECT_EQ(dtype_bits(DType::F6E3M2), 6u);
  EXPECT_EQ(dtype_bits(DType::C64), 64u);
  EXPECT_EQ(dtype_size(DType::C64), 8u);
  EXPECT_EQ(dtype_size(DType::F8E8M0), 1u);
  EXPECT_ERROR_CONTAINS(dtype_size(DType::F4), "F4", "4-bit");
  // F4 [2, 3]: 24 bits = 3 bytes; F6 [4]: 3 bytes; a header saying so is read.
  const std::string h = R"({"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]},)"
                        R"("b":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[3,6]}})";
  SafetensorsHeader parsed = parse_safetensors_header(h.data(), h.size(), 6, "mem");
  ASSERT_EQ(parsed.entries.size(), 2u);
  EXPECT_EQ(parsed.entries[0].dtype, DType::F4);
  EXPECT_EQ(parsed.entries[1].end - parsed.entries[1].begin, 3u);
  // F4 [3] is 12 bits: not whole bytes, refused as the reference implementation does.
  const std::string odd = R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})";
  EXPECT_ERROR_CONTAINS(parse_safetensors_header(odd.data(), odd.size(), 2, "mem"), "tensor \"a\"", "12 bits of F4",
                        "not a whole number of bytes");
  SafetensorsWriter w;
  const uint8_t b[2] = {0, 0};
  EXPECT_ERROR_CONTAINS(w.add("odd", DType::F6E2M3, {3}, b), "\"odd\"", "18 bits of F6_E2M3");
}

TEST(Safetensors, ToF32ConvertsFloatDtypes) {
  ScratchDir dir;
  SafetensorsWriter w;
  const std::vector<double> d = {1.25, -3.0};
  const std::vector<uint16_t> h = {0x3C00, 0xC500, 0x0001};  // 1, -5, smallest subnormal 2^-24
  const std::vector<uint16_t> bf = {0x3F80, 0xC0A0};           // 1, -5
  w.add("d", DType::F64, {2}, d.data());
  w.add("h", DType::F16, {3}, h.data());
  w.add("bf", DType::BF16, {2}, bf.data());
  w.add("i", DType::I32, {1}, d.data());
  w.write(dir / "f.safetensors");
  SafetensorsFile f(dir / "f.safetensors");
  EXPECT_EQ(f.get("d").to_f32(), (std::vector<float>{1.25f, -3.0f}));
  EXPECT_EQ(f.get("h").to_f32(), (std::vector<float>{1.0f, -5.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(f.get("bf").to_f32(), (std::vector<float>{1.0f, -5.0f}));
  EXPECT_ERROR_CONTAINS(f.get("i").to_f32(), "tensor i", "I32");
}

// The FP8 dtypes as bit patterns: each value checked against its definition.
TEST(Safetensors, ToF32DecodesEveryFp8Dtype) {
  struct Case {
    DType dtype;
    std::vector<uint8_t> bytes;
    std::vector<float> want;  // NaN where the byte is NaN
  };
  const float nan = NAN;
  const Case cases[] = {
      // float8_e4m3fn: bias 7; 0x3F = 1.875 (never 63), 0x01 = 2^-9, 0x7E = 448, 0x7F NaN.
      {DType::F8E4M3, {0x38, 0x3F, 0xBF, 0x01, 0x7E, 0x7F}, {1.0f, 1.875f, -1.875f, std::ldexp(1.0f, -9), 448.0f, nan}},
      // float8_e5m2: bias 15; 0x3C = 1, 0x01 = 2^-16, 0x7C = Inf, 0x7D NaN.
      {DType::F8E5M2, {0x3C, 0xC2, 0x01, 0x7B, 0x7C, 0x7D}, {1.0f, -3.0f, std::ldexp(1.0f, -16), 57344.0f, INFINITY, nan}},
      // UE8M0: 2^(b-127); 0 -> 2^-127 (an FP32 subnormal), 254 -> 2^127, 0xFF NaN.
      {DType::F8E8M0, {127, 128, 120, 0, 254, 0xFF}, {1.0f, 2.0f, 1.0f / 128, std::ldexp(1.0f, -127), std::ldexp(1.0f, 127), nan}},
      // float8_e4m3fnuz: bias 8; 0x40 = 1, 0x01 = 2^-10, 0x80 the only NaN, 0xFF = -240.
      {DType::F8E4M3Fnuz, {0x40, 0x01, 0x80, 0xFF, 0x00}, {1.0f, std::ldexp(1.0f, -10), nan, -240.0f, 0.0f}},
      // float8_e5m2fnuz: bias 16; 0x40 = 1, 0x01 = 2^-17, 0x80 NaN, 0x7F = 57344.
      {DType::F8E5M2Fnuz, {0x40, 0x01, 0x80, 0x7F}, {1.0f, std::ldexp(1.0f, -17), nan, 57344.0f}},
  };
  ScratchDir dir;
  SafetensorsWriter w;
  for (const auto& c : cases)
    w.add(dtype_name(c.dtype), c.dtype, {int64_t(c.bytes.size())}, c.bytes.data());
  w.write(dir / "f8.safetensors");
  SafetensorsFile f(dir / "f8.safetensors");
  for (const auto& c : cases) {
    SCOPED_TRACE(dtype_name(c.dtype));
    const std::vector<float> got = f.get(dtype_name(c.dtype)).to_f32();
    ASSERT_EQ(got.size(), c.want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(c.want[i])) EXPECT_TRUE(std::isnan(got[i])) << "byte " << i << " = " << got[i];
      else EXPECT_EQ(got[i], c.want[i]) << "byte " << i;
    }
  }
  const std::vector<uint8_t> packed = {0x21};
  SafetensorsWriter w4;
  w4.add("q", DType::F4, {2}, packed.data());
  w4.write(dir / "f4.safetensors");
  EXPECT_ERROR_CONTAINS(SafetensorsFile(dir / "f4.safetensors").get("q").to_f32(), "tensor q", "F4",
                        "cannot be read as floats");
}

TEST(Safetensors, WriterRefusesDuplicatesAndShortBuffers) {
  SafetensorsWriter w;
  const float x = 1;
  w.add("a", DType::F32, {1}, &x);
  EXPECT_ERROR_CONTAINS(w.add("a", DType::F32, {1}, &x), "duplicate tensor \"a\"");
  EXPECT_ERROR_CONTAINS(w.add_owned("b", DType::F32, {2}, {1, 2, 3}), "\"b\"", "needs 8 bytes, got 3");
}

TEST(Safetensors, FailedWriteLeavesTheOldFileIntact) {
  ScratchDir dir;
  const std::string path = dir / "keep.safetensors";
  write_bytes(path, {1, 2, 3});
  // A path whose temporary cannot be created: the directory does not exist.
  SafetensorsWriter w;
  const float x = 1;
  w.add("a", DType::F32, {1}, &x);
  EXPECT_ERROR_CONTAINS(w.write(dir / "no/such/dir/x.safetensors"), "cannot create");
  EXPECT_EQ(read_bytes(path), (std::vector<uint8_t>{1, 2, 3}));
}

// ---- deferred tensors (SafetensorsStream) --------------------------------------

// A mix of dtypes (sub-byte, 0-d, empty) whose layout reorders them.
struct MixedTensors {
  std::vector<std::string> names = {"codes", "g", "w", "empty", "f4", "scales"};
  std::vector<DType> dtypes = {DType::U8, DType::F32, DType::BF16, DType::F32, DType::F4, DType::F8E4M3};
  std::vector<std::vector<int64_t>> shapes = {{7, 5}, {}, {3, 64}, {0, 4}, {2, 6}, {7, 3}};
  std::vector<std::vector<uint8_t>> bytes;
  explicit MixedTensors(test::Rng& rng) {
    for (size_t i = 0; i < names.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      std::vector<uint8_t> b(size_t(n * dtype_bits(dtypes[i]) / 8));
      for (auto& x : b) x = uint8_t(rng.next());
      bytes.push_back(std::move(b));
    }
  }
};

TEST(SafetensorsStream, DeferredTensorsWrittenInAnyOrderGiveTheWritersBytes) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const MixedTensors t(rng);
  ScratchDir dir;
  SafetensorsWriter whole;
  whole.set_metadata("format", "pt");
  for (size_t i = 0; i < t.names.size(); ++i) whole.add(t.names[i], t.dtypes[i], t.shapes[i], t.bytes[i].data());
  whole.write(dir / "whole.safetensors");

  // Every other tensor deferred; the filler writes them last to first, in
  // 3-byte pieces spread over threads.
  SafetensorsWriter streamed;
  streamed.set_metadata("format", "pt");
  std::vector<size_t> deferred;
  for (size_t i = 0; i < t.names.size(); ++i) {
    if (i % 2 == 0) {
      EXPECT_EQ(streamed.add_deferred(t.names[i], t.dtypes[i], t.shapes[i]), i) << t.names[i];
      deferred.push_back(i);
    } else {
      streamed.add(t.names[i], t.dtypes[i], t.shapes[i], t.bytes[i].data());
    }
  }
  int fills = 0;
  streamed.set_filler([&](SafetensorsStream& s) {
    ++fills;
    std::vector<std::thread> threads;
    for (auto it = deferred.rbegin(); it != deferred.rend(); ++it) {
      const size_t i = *it;
      ASSERT_EQ(s.bytes(i), t.bytes[i].size()) << t.names[i];
      for (uint64_t at = 0; at < s.bytes(i); at += 3)
        threads.emplace_back([&, i, at] {
          s.write(i, t.bytes[i].data() + at, std::min<uint64_t>(3, s.bytes(i) - at), at);
        });
    }
    for (auto& th : threads) th.join();
  });
  streamed.write(dir / "streamed.safetensors");
  EXPECT_EQ(fills, 1);
  EXPECT_EQ(read_bytes(dir / "streamed.safetensors"), read_bytes(dir / "whole.safetensors"));
  const SafetensorsFile f(dir / "streamed.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (size_t i = 0; i < t.names.size(); ++i) {
    const TensorInfo& ti = f.get(t.names[i]);
    EXPECT_EQ(std::vector<uint8_t>(ti.data, ti.data + ti.nbytes), t.bytes[i]) << t.names[i];
  }
}

TEST(SafetensorsStream, ATensorLeftShortFailsNamingItAndLeavesTheOldFile) {
  ScratchDir dir;
  const std::string path = dir / "keep.safetensors";
  write_bytes(path, {1, 2, 3});
  SafetensorsWriter w;
  const std::vector<float> x = {1, 2, 3, 4};
  w.add("a", DType::F32, {4}, x.data());
  const size_t b = w.add_deferred("b", DType::F32, {4});
  w.set_filler([&](SafetensorsStream& s) { s.write(b, x.data(), 8); });  // 8 of its 16 bytes
  EXPECT_ERROR_CONTAINS(w.write(path), "keep.safetensors", "tensor \"b\"", "not all written");
  EXPECT_EQ(read_bytes(path), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(SafetensorsStream, WritesOutsideATensorAndFillerErrorsAreRefused) {
  ScratchDir dir;
  SafetensorsWriter w;
  const std::vector<float> x = {1, 2, 3, 4, 5};
  const size_t a = w.add_deferred("a", DType::F32, {4});
  w.set_filler([&](SafetensorsStream& s) { s.write(a, x.data(), 8, 12); });
  EXPECT_ERROR_CONTAINS(w.write(dir / "x.safetensors"), "bytes [12, 20)", "outside its 16 bytes");
  w.set_filler([&](SafetensorsStream&) { NVFP4_FAIL("the filler failed"); });
  EXPECT_ERROR_CONTAINS(w.write(dir / "x.safetensors"), "the filler failed");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "x.safetensors.tmp." + std::to_string(::getpid())));
}

TEST(SafetensorsStream, FileOffsetLocatesEveryTensorsBytes) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const MixedTensors t(rng);
  ScratchDir dir;
  SafetensorsWriter w;
  for (size_t i = 0; i < t.names.size(); ++i) w.add(t.names[i], t.dtypes[i], t.shapes[i], t.bytes[i].data());
  w.write(dir / "x.safetensors");
  const std::vector<uint8_t> file = read_bytes(dir / "x.safetensors");
  const SafetensorsFile f(dir / "x.safetensors");
  for (size_t i = 0; i < t.names.size(); ++i) {
    const uint64_t at = f.file_offset(f.get(t.names[i]));
    ASSERT_LE(at + t.bytes[i].size(), file.size()) << t.names[i];
    EXPECT_EQ(std::vector<uint8_t>(file.begin() + int64_t(at), file.begin() + int64_t(at + t.bytes[i].size())),
              t.bytes[i])
        << t.names[i] << " at " << at;
  }
  TensorInfo other = f.get("w");
  other.data = nullptr;
  EXPECT_ERROR_CONTAINS(f.file_offset(other), "tensor \"w\"", "not one of this file's");
}

// ---- malformed files ---------------------------------------------------------

struct BadFile {
  const char* label;
  std::vector<uint8_t> bytes;
  std::vector<const char*> message;  // substrings the error must contain
};

std::vector<BadFile> bad_files() {
  const std::vector<uint8_t> d16(16, 0);
  auto st = [](const std::string& h, const std::vector<uint8_t>& d) { return safetensors_bytes(h, d); };
  return {
      {"empty file", {}, {"truncated", "0 bytes"}},
      {"truncated length", {4, 0, 0}, {"truncated", "3 bytes"}},
      {"header length beyond file", safetensors_bytes("{}", {}, 1000), {"header length 1000", "beyond the file"}},
      {"non-JSON header", st("not json", {}), {"invalid JSON at byte 0"}},
      {"header not an object", st("[1]", {}), {"must be a JSON object", "array"}},
      {"unknown dtype", st(R"({"w":{"dtype":"F8_E3M4","shape":[2],"data_offsets":[0,2]}})", {0, 0}),
       {"tensor \"w\"", "unknown or unsupported safetensors dtype 'F8_E3M4'"}},
      {"shape/dtype/bytes mismatch", st(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", d16),
       {"tensor \"w\"", "need 24 bytes", "[0, 16) hold 16"}},
      {"offsets outside data", st(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", d16),
       {"tensor \"w\"", "[0, 32)", "outside the data section of 16 bytes"}},
      {"overlapping offsets",
       st(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", d16),
       {"\"b\" [8, 16) overlaps tensor \"a\" [0, 12)"}},
      {"gap in data",
       st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", d16),
       {"bytes [8, 12)", "belong to no tensor"}},
      {"data not covered", st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d16),
       {"16 bytes but the tensors cover only 8"}},
      {"duplicate names",
       st(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})", d16),
       {"duplicate key \"a\""}},
      {"negative dimension", st(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", {}), {"negative dimension -1"}},
      {"shape overflow",
       st(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", {}), {"overflows"}},
      {"reversed offsets", st(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", d16), {"bad data_offsets [8, 0)"}},
      {"missing field", st(R"({"a":{"dtype":"U8","shape":[16]}})", d16), {"tensor \"a\"", "needs dtype, shape and data_offsets"}},
      {"metadata not strings", st(R"({"__metadata__":{"k":1}})", {}), {"__metadata__ value of \"k\""}},
  };
}

TEST(Safetensors, EveryMalformedFileIsAClearError) {
  ScratchDir dir;
  for (const auto& bad : bad_files()) {
    SCOPED_TRACE(bad.label);
    const std::string path = dir / "bad.safetensors";
    write_bytes(path, bad.bytes);
    bool thrown = false;
    try {
      SafetensorsFile f(path);
    } catch (const Error& e) {
      thrown = true;
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
      for (const char* want : bad.message)
        EXPECT_NE(msg.find(want), std::string::npos) << "message \"" << msg << "\" lacks \"" << want << "\"";
    }
    EXPECT_TRUE(thrown);
  }
}

TEST(Safetensors, HeaderParserAloneMatchesTheFileReader) {
  const std::string h = R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  SafetensorsHeader parsed = parse_safetensors_header(h.data(), h.size(), 8, "mem");
  ASSERT_EQ(parsed.entries.size(), 1u);
  EXPECT_EQ(parsed.entries[0].dtype, DType::BF16);
  EXPECT_EQ(parsed.entries[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(parsed.metadata.at("format"), "pt");
  EXPECT_ERROR_CONTAINS(parse_safetensors_header(h.data(), h.size(), 4, "mem"), "mem header", "outside");
}

}  // namespace
}  // namespace nvfp4moe
