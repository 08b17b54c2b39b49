// mha: everything, for users of the umbrella target mha::mha.
#pragma once

#include "mha/attention.hpp"
#include "mha/backend.hpp"
#include "mha/backends/all.hpp"  // every backend this build contains
#include "mha/build_config.hpp"
#include "mha/config.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"
#include "mha/problem.hpp"
#include "mha/registry.hpp"
#include "mha/run_options.hpp"
#include "mha/tensor_view.hpp"
#include "mha/weights.hpp"
