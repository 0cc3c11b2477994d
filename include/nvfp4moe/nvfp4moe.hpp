// nvfp4moe — NVFP4 Mixture-of-Experts for Hopper. The umbrella header.
#pragma once

#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"
#include "nvfp4moe/types.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/ep.hpp"
