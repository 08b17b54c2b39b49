// mha: a non-owning view of a (batch, seq_len, features) row-major float tensor.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

namespace mha {

// A non-owning, contiguous, row-major (batch, seq_len, features) tensor: element (b, t, f)
// lives at data()[(b * seq_len + t) * features + f]. T is float (output) or const float (input).
// The view never allocates or frees; the caller keeps the storage alive while it is used.
template <class T>
class tensor_view {
 public:
  constexpr tensor_view() noexcept = default;

  // Views `data` as (batch, seq_len, features). Shapes are checked by whoever consumes the
  // view (plan::run), so a view of a bad shape can be built and is rejected at use.
  constexpr tensor_view(T* data, std::int64_t batch, std::int64_t seq_len,
                        std::int64_t features) noexcept
      : data_(data), batch_(batch), seq_len_(seq_len), features_(features) {}

  // Views a span as (batch, seq_len, features). Throws mha::invalid_argument when the span's
  // size is not batch * seq_len * features: nothing is silently truncated or over-read.
  tensor_view(std::span<T> storage, std::int64_t batch, std::int64_t seq_len,
              std::int64_t features);

  // A view of float converts to a view of const float.
  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>) constexpr tensor_view(
      tensor_view<U> other) noexcept  // NOLINT(google-explicit-constructor)
      : data_(other.data()),
        batch_(other.batch()),
        seq_len_(other.seq_len()),
        features_(other.features()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::int64_t batch() const noexcept { return batch_; }
  constexpr std::int64_t seq_len() const noexcept { return seq_len_; }
  constexpr std::int64_t features() const noexcept { return features_; }
  // Number of elements, batch * seq_len * features (meaningful once the shape is validated).
  constexpr std::int64_t size() const noexcept { return batch_ * seq_len_ * features_; }

 private:
  T* data_ = nullptr;
  std::int64_t batch_ = 0, seq_len_ = 0, features_ = 0;
};

extern template class tensor_view<float>;
extern template class tensor_view<const float>;

}  // namespace mha
