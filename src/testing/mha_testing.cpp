#include "mha_testing.hpp"

#include "driver/kv_cache_access.hpp"

namespace mha_testing {

void hold_zero_tokens(mha::kv_cache& cache, std::int64_t n) noexcept {
  mha::detail::kv_cache_access::hold_zero_tokens(cache, n);
}

}  // namespace mha_testing
