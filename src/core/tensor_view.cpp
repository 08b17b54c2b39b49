#include "mha/tensor_view.hpp"

#include "base/text.hpp"
#include "mha/error.hpp"

namespace mha {

template <class T>
tensor_view<T>::tensor_view(std::span<T> storage, std::int64_t batch, std::int64_t seq_len,
                            std::int64_t features)
    : tensor_view(storage.data(), batch, seq_len, features) {
  std::int64_t expected = 0;
  if (batch < 0 || seq_len < 0 || features < 0 ||
      __builtin_mul_overflow(batch, seq_len, &expected) ||
      __builtin_mul_overflow(expected, features, &expected) ||
      static_cast<std::uint64_t>(expected) != storage.size()) {
    throw invalid_argument(detail::text("mha: a span of ", storage.size(),
                                        " floats cannot be viewed as (", batch, ", ", seq_len, ", ",
                                        features, ")"));
  }
}

template class tensor_view<float>;
template class tensor_view<const float>;

}  // namespace mha
