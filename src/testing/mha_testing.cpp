#include "mha_testing.hpp"

#include "driver/kv_cache_access.hpp"

namespace mha_testing {

void hold_zero_tokens(mha::kv_cache& cache, std::int64_t n) noexcept {
  mha::detail::kv_cache_access::hold_zero_tokens(cache, n);
}

void hold(mha::kv_cache& cache, const std::function<void()>& f) {
  mha::detail::kv_cache_access::hold(cache, f);
}

}  // namespace mha_testing
