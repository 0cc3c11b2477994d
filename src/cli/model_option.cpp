#include "cli/model_option.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cli {

MoeConfig model_option_config(const std::string& name) {
  if (name == "small") return small_demo_config();
  if (name == "dsv4-flash") return dsv4_flash_config();
  if (name == "dsv4-pro") return dsv4_pro_config();
  NVFP4_FAIL("--model: unknown model '", name, "', expected small, dsv4-flash or dsv4-pro");
}

}  // namespace nvfp4moe::cli
