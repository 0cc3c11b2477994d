// fp8_fragments (see fp8_fragment_layout.hpp).
#include "cuda/layout/fp8_fragment_layout.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

std::vector<uint8_t> fp8_fragments(const std::vector<uint8_t>& w, const Fp8FragmentGeometry& g) {
  NVFP4_CHECK(int64_t(w.size()) == g.rows * g.cols && g.cols % 16 == 0 && (!g.pairs || g.rows % 16 == 0),
              "fp8_fragments: ", w.size(), " bytes for a [", g.rows, ", ", g.cols, "] matrix",
              g.pairs ? " of paired gate/up rows (rows a multiple of 16)" : "", ", columns a multiple of 16");
  std::vector<uint8_t> out(size_t(g.bytes()), 0);
  for (int64_t row = 0; row < g.rows; ++row)
    for (int64_t k = 0; k < g.cols; k += 16) {  // 16 columns stay contiguous
      const int64_t o = fp8_fragment_offset(g, row, k);
      for (int64_t j = 0; j < 16; ++j) out[size_t(o + j)] = w[size_t(row * g.cols + k + j)];
    }
  return out;
}

}  // namespace nvfp4moe::cuda
