// mha::naive: plain loops that read like the spec. The readable reference; always built.
#pragma once

#include "mha/backend.hpp"

namespace mha {

// The naive backend (link mha::naive). Single-threaded; ignores run_options::threads.
const backend& naive_backend();

}  // namespace mha
