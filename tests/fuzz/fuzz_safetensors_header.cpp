// libFuzzer harness for the safetensors reader: the input is used twice —
// as a header text for parse_safetensors_header (with a data-section size
// taken from its first bytes), and as a whole file opened by SafetensorsFile
// through a temporary file. Any nvfp4moe::Error is an accepted outcome; a
// crash, a sanitizer report, another exception type or a hang is a bug. For
// files that open, every TensorInfo must lie inside the mapping and be read
// completely (ASan catches a read past the end).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace {

std::string temp_path() {
  static const std::string path = "/tmp/nvfp4moe_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // 1. The header parser on its own.
  uint64_t data_size = 0;
  for (size_t i = 0; i < 8 && i < size; ++i) data_size = (data_size << 8) | data[i];
  data_size %= (1ull << 40);
  try {
    nvfp4moe::SafetensorsHeader h =
        nvfp4moe::parse_safetensors_header(reinterpret_cast<const char*>(data), size, data_size, "fuzz");
    for (const auto& e : h.entries)
      if (e.end > data_size || e.begin > e.end) std::abort();  // validation let a bad range through
  } catch (const nvfp4moe::Error&) {
  }

  // 2. The whole input as a file.
  const std::string path = temp_path();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    nvfp4moe::SafetensorsFile file(path);
    unsigned sum = 0;
    for (const auto& t : file.tensors()) {
      for (uint64_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      try {  // every float dtype is decoded (FP8 ones included); the others refuse with an Error
        sum += unsigned(t.to_f32().size());
      } catch (const nvfp4moe::Error&) {
      }
    }
    if (sum == 0xFFFFFFFFu) std::fputc(0, stderr);  // keep the reads
  } catch (const nvfp4moe::Error&) {
  }
  return 0;
}
