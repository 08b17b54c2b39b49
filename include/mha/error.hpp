// mha: the exceptions every public entry point throws.
#pragma once

#include <stdexcept>
#include <string>

namespace mha {

// Every failure the library reports is an mha::error (or a subclass). Its what() names the
// offending value and what was expected, e.g.
//   "mha: d_out (10) must be divisible by n_heads (3)".
// The library never prints, never aborts, and never reports partial output as success.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value outside a documented contract: a shape, size, name or option.
class invalid_argument : public error {
 public:
  using error::error;
};

// A backend was asked for a problem it does not compute (backend::supports() says which and
// why): "onednn: does not compute split_weight with d_in=64 ... precision=bf16: bf16 needs
// oneDNN's avx512_core_bf16 kernels or newer, and its effective ISA here is avx2". The input is
// valid; another backend may accept it. Also a model whose attention no backend computes (a
// config.json key such as a relative position embedding), named with its key.
class unsupported : public error {
 public:
  using error::error;
};

// A file (weights, tensors) is malformed, truncated or of a kind the library cannot read.
class format_error : public error {
 public:
  using error::error;
};

}  // namespace mha
