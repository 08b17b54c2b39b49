// Internal: the per-ISA attention kernel (isa_kernels::attention_rows): one block of query rows
// over key tiles with online softmax, on the path its layout and arguments choose, here. What
// the paths share is in micro/attention_block.hpp; each path is a type in its own file. Per-ISA
// code: see micro/micro_kernel.hpp for how it is compiled.
#pragma once

#include <cstdint>

#include "kernels/micro/attention_block.hpp"
#include "kernels/micro/attention_direct.hpp"
#include "kernels/micro/attention_narrow.hpp"
#include "kernels/micro/attention_packed.hpp"

namespace mha::detail::MHA_SIMD_ISA_NAMESPACE {

// The layout's path (attention_path, chosen by isa_kernels::layout) in the layout's unit: fp32,
// bf16 pairs (PairDot: on tiles where it has tile products, tile_path), or an int8 cache's codes.
template <class Arch, class Dot>
attention_block<Arch, Dot> block_of(const attention_args& args, const attention_layout& layout,
                                    const attention_task& task, float* scratch) noexcept {
  return {args, layout, task, (task.row_end - task.row_begin) * layout.group,
          layout.scratch_parts(scratch)};
}

template <class Arch, class Tiles, class PairDot>
void attention_rows(const attention_args& args, const attention_layout& layout,
                    const attention_task& task, float* scratch) noexcept {
  // A layout in place has no packed head (task.head is nullptr): K and V are read from `args`.
  const auto* head = static_cast<const std::uint8_t*>(task.head);
  const std::int64_t unit_bytes = layout.int8 ? 1 : 4;  // the layout's offsets count its units
  const std::uint8_t* values = head ? head + unit_bytes * layout.values_offset() : nullptr;
  switch (layout.path) {
    case attention_path::codes:
      packed_attention<Arch, Tiles, code_pair_dot>{
          block_of<Arch, code_pair_dot>(args, layout, task, scratch),
          reinterpret_cast<const code_pair*>(head), reinterpret_cast<const code_pair*>(values),
          reinterpret_cast<const int8_row*>(head + layout.scales_offset())}
          .run();
      return;
    case attention_path::packed:
    case attention_path::tiles:
      if (layout.bf16) {
        packed_attention<Arch, Tiles, PairDot>{block_of<Arch, PairDot>(args, layout, task, scratch),
                                               reinterpret_cast<const bf16_pair*>(head),
                                               reinterpret_cast<const bf16_pair*>(values), nullptr}
            .run();
      } else {
        packed_attention<Arch, Tiles, fma_dot>{block_of<Arch, fma_dot>(args, layout, task, scratch),
                                               reinterpret_cast<const float*>(head),
                                               reinterpret_cast<const float*>(values), nullptr}
            .run();
      }
      return;
    case attention_path::direct:
      if (layout.bf16) {
        direct_attention<Arch, PairDot>{block_of<Arch, PairDot>(args, layout, task, scratch)}.run();
      } else {
        direct_attention<Arch, fma_dot>{block_of<Arch, fma_dot>(args, layout, task, scratch)}.run();
      }
      return;
    case attention_path::narrow:
      narrow_attention<Arch>{block_of<Arch, fma_dot>(args, layout, task, scratch),
                             reinterpret_cast<const float*>(head),
                             reinterpret_cast<const float*>(values)}
          .run();
      return;
  }
}

}  // namespace mha::detail::MHA_SIMD_ISA_NAMESPACE
