// Hooks into mha's internals for tests and benchmarks, never for users: the library mha_testing
// (src/testing/CMakeLists.txt), which only tests/ and bench/ link. Everything else reaches mha
// through include/mha.
#pragma once

#include <cstdint>
#include <functional>

#include "mha/kv_cache.hpp"

namespace mha_testing {

// Every sequence of `cache` as if it had been fed n tokens of x = 0 by a module without
// qkv_bias (keys and values 0), without computing them: a decode step over a long cache can be
// timed without its prefill. Valid while the cache's rows below n were never written (a cache
// is zeroed when made), e.g. to rewind to n after the steps that appended past it.
void hold_zero_tokens(mha::kv_cache& cache, std::int64_t n) noexcept;

// Runs f while `cache` is held as a call in progress holds it (kv_cache's one caller at a time),
// so that a test can make a second caller meet it.
void hold(mha::kv_cache& cache, const std::function<void()>& f);

}  // namespace mha_testing
