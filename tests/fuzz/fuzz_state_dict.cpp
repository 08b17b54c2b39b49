// libFuzzer target: a safetensors file mapped to a module (module_from_state_dict). Mapping
// returns or throws mha::format_error / mha::invalid_argument; what it returns is a valid module
// (validate() passes) that runs on the naive backend at the context length it states and that
// to_state_dict -> module_from_state_dict reproduces exactly.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.hpp"
#include "mha/error.hpp"
#include "mha/io.hpp"

namespace {

bool same_layer(const mha::linear_weights& a, const mha::linear_weights& b) {
  return a.out == b.out && a.in == b.in && mha_fuzz::same_bits(a.weight, b.weight) &&
         mha_fuzz::same_bits(a.bias, b.bias);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  mha::io::loaded_module m;
  try {
    m = mha::io::module_from_state_dict(
        mha::io::parse_safetensors({reinterpret_cast<const std::byte*>(data), size}));
  } catch (const mha::format_error&) {
    return 0;
  } catch (const mha::invalid_argument&) {
    return 0;
  }
  // Without a mask the context length is the caller's to choose.
  if (m.cfg.context_length == 0) m.cfg.context_length = 1;
  mha::validate(m.cfg, m.w);  // must not throw
  mha_fuzz::run_first_tokens(m.cfg, m.w);
  const mha::io::loaded_module back =
      mha::io::module_from_state_dict(mha::io::to_state_dict(m.cfg, m.w, m.layout));
  mha_fuzz::require(mha::to_string(back.cfg) == mha::to_string(m.cfg), "config round trip");
  mha_fuzz::require(back.layout == m.layout, "layout round trip");
  mha_fuzz::require(same_layer(back.w.query, m.w.query) && same_layer(back.w.key, m.w.key) &&
                        same_layer(back.w.value, m.w.value) &&
                        same_layer(back.w.out_proj, m.w.out_proj),
                    "weights round trip");
  return 0;
}
