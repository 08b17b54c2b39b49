// Internal: the validation every public entry point shares (docs/design.md §1.2).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "mha/backend.hpp"
#include "mha/config.hpp"

// MHA_EXPECTS(condition): an internal contract (a kernel's precondition: tile widths, rows per
// block, tile rows), checked where a broken one should stop the program with its place: debug
// builds and the sanitizer builds (the test command's are RelWithDebInfo, where assert() is
// off). Release builds compile it away. Not for input checks, which throw mha::error.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MHA_CHECKED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MHA_CHECKED_BUILD 1
#endif
#endif
#if !defined(NDEBUG) || defined(MHA_CHECKED_BUILD)
#define MHA_EXPECTS(...) \
  ((__VA_ARGS__) ? void(0) : ::mha::detail::broken_contract(#__VA_ARGS__, __FILE__, __LINE__))
#else
#define MHA_EXPECTS(...) ((void)0)
#endif

namespace mha::detail {

// Prints "<file>:<line>: contract broken: <condition>" to stderr and aborts (MHA_EXPECTS).
[[noreturn]] void broken_contract(const char* condition, const char* file, int line) noexcept;

// What a backend computes beyond the default (fp32 multi-head attention, full forward).
struct computed_axes {
  bool grouped_kv = false, decode = false, bf16 = false;
  bool coded_cache = false;  // a KV cache of int8, k8v4 or int4 with a plan of either precision
                             // (§1.7)
  bool extensions = false;   // config::window, softcap and sinks (§1.9)
};

// backend::supports() of a backend that computes `axes`: the reason for the first axis of p it
// does not compute, in the words every backend uses.
support supports_axes(const problem& p, computed_axes axes);

// validate(cfg) with messages prefixed by `where` ("mha", or a backend's name).
void check_config(const config& cfg, std::string_view where);

// Throws mha::invalid_argument unless the product of `dims` times `element_bytes` fits in
// std::int64_t; `what` names the tensor in the message. Dims are assumed >= 0.
void check_byte_count(std::string_view where, std::string_view what,
                      std::initializer_list<std::int64_t> dims, std::int64_t element_bytes);

// The score-memory limit: MHA_MAX_SCORE_BYTES when set (mha::invalid_argument naming it unless
// it is a decimal integer), else default_max_score_bytes (mha/run_options.hpp).
std::uint64_t max_score_bytes();

// Throws mha::invalid_argument naming T, the bytes and the limit unless `slices` (rows, keys)
// float matrices (T x T in a full forward) fit in max_score_bytes(). `where` names the backend.
void check_score_memory(std::string_view where, std::int64_t rows, std::int64_t keys,
                        std::int64_t slices);

}  // namespace mha::detail
