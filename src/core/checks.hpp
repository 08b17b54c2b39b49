// Internal: the validation every public entry point shares (docs/design.md §1.2).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "mha/config.hpp"

namespace mha::detail {

// validate(cfg) with messages prefixed by `where` ("mha", or a backend's name).
void check_config(const config& cfg, std::string_view where);

// Throws mha::invalid_argument unless the product of `dims` times `element_bytes` fits in
// std::int64_t; `what` names the tensor in the message. Dims are assumed >= 0.
void check_byte_count(std::string_view where, std::string_view what,
                      std::initializer_list<std::int64_t> dims, std::int64_t element_bytes);

}  // namespace mha::detail
