// The layer geometries the tool's --model options name.
#pragma once

#include <string>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cli {

// small (the demo's default: small_demo_config), dsv4-flash or dsv4-pro; any
// other name is an error naming it. Each command lists the names it takes
// in its own option choices.
MoeConfig model_option_config(const std::string& name);

}  // namespace nvfp4moe::cli
