// read_mxfp4_weight on hand-written safetensors files: the official layout
// (I8 or U8 [N, K/2] + F8_E8M0 [N, K/32]) and F4 [N, K] are read zero-copy;
// wrong dtypes, shapes and NaN or overflowing scale bytes are errors naming
// the tensor.
#include <gtest/gtest.h>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/mxfp4_weights.hpp"
#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

struct File {
  ScratchDir d;
  std::vector<uint8_t> codes, scales;
  std::string write(DType wt, std::vector<int64_t> wshape, DType st, std::vector<int64_t> sshape) {
    SafetensorsWriter w;
    w.add("e.w1.weight", wt, wshape, codes.data());
    w.add("e.w1.scale", st, sshape, scales.data());
    const std::string path = d / "m.safetensors";
    w.write(path);
    return path;
  }
};

TEST(Mxfp4Weights, ReadsTheOfficialLayout) {
  File f;
  f.codes.resize(4 * 32);
  for (size_t i = 0; i < f.codes.size(); ++i) f.codes[i] = uint8_t(i * 37);
  f.scales = {120, 121, 122, 123, 124, 125, 126, 127};
  for (DType t : {DType::I8, DType::U8}) {
    const ModelDir dir(f.write(t, {4, 32}, DType::F8E8M0, {4, 2}));
    const Mxfp4WeightView v = read_mxfp4_weight(dir, "e.w1", 4, 64);
    EXPECT_EQ(v.rows, 4);
    EXPECT_EQ(v.cols, 64);
    EXPECT_BYTES_EQ(v.codes(), f.codes.data(), 128, "codes");
    EXPECT_BYTES_EQ(v.scales(), f.scales.data(), 8, "scales");
    EXPECT_EQ(read_mxfp4_weight(dir, "e.w1").cols, 64);  // shape from the tensor
  }
  const ModelDir f4(f.write(DType::F4, {4, 64}, DType::F8E8M0, {4, 2}));
  EXPECT_EQ(read_mxfp4_weight(f4, "e.w1", 4, 64).cols, 64);
}

TEST(Mxfp4Weights, MalformedTensorsAreErrorsNamingThem) {
  File f;
  f.codes.resize(4 * 32, 0x11);
  f.scales.assign(8, 127);
  {
    const ModelDir dir(f.write(DType::I8, {4, 32}, DType::F8E8M0, {4, 2}));
    EXPECT_ERROR_CONTAINS(read_mxfp4_weight(dir, "e.w1", 4, 128), "tensor \"e.w1.weight\"", "shape [4, 32]",
                          "expected [4, 64]");
  }
  {
    const ModelDir dir(f.write(DType::I8, {4, 32}, DType::U8, {4, 2}));
    EXPECT_ERROR_CONTAINS(read_mxfp4_weight(dir, "e.w1", 4, 64), "tensor \"e.w1.scale\"", "dtype U8",
                          "expected F8_E8M0");
  }
  {
    const ModelDir dir(f.write(DType::I8, {4, 32}, DType::F8E8M0, {2, 4}));
    EXPECT_ERROR_CONTAINS(read_mxfp4_weight(dir, "e.w1", 4, 64), "tensor \"e.w1.scale\"", "shape [2, 4]",
                          "expected [4, 2]");
  }
  {
    f.codes.resize(4 * 32 * 2, 0x11);  // an F16 [4, 32] tensor holds 256 bytes
    const ModelDir dir(f.write(DType::F16, {4, 32}, DType::F8E8M0, {4, 2}));
    EXPECT_ERROR_CONTAINS(read_mxfp4_weight(dir, "e.w1", 4, 64), "dtype F16", "expected I8 or U8");
  }
  f.scales[5] = 0xFF;
  {
    const ModelDir dir(f.write(DType::I8, {4, 32}, DType::F8E8M0, {4, 2}));
    EXPECT_ERROR_CONTAINS(read_mxfp4_weight(dir, "e.w1", 4, 64), "tensor \"e.w1.scale\"", "row 2, block 1",
                          "NaN byte 0xff");
  }
}

}  // namespace
}  // namespace nvfp4moe
