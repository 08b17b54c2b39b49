// Internal: the attention half of the SIMD kernels' framework (ISA-neutral, compiled once): the
// geometry of the fused kernel (query blocks, key tiles, workspaces), the packing of a head's K
// and V, and the single-threaded loop over heads and blocks. The per-ISA kernel is in
// micro/attention_kernel.hpp.
//
// Per (batch, head), K^T and V are packed into the GEMM's panel form (gemm.hpp); query rows are
// processed in blocks whose scores stay in cache (attention_layout).
#pragma once

#include <cstdint>

#include "common/attention_args.hpp"
#include "common/buffer.hpp"
#include "simd/gemm.hpp"

namespace mha::detail {

// Keys per online-softmax step. Attention alone (head-major Q, K, V), one core, median ms at
// (B, T, H, head_dim) = (1, 1024, 12, 64) / (1, 4096, 12, 64) / (1, 256, 96, 8), 64 query rows
// per block, by key tile:
//   128: 17.8 / 261 / 2.51    256: 17.2 / 256 / 2.37    512: 17.1 / 253 / 2.34
//   whole rows (the unfused form): 17.1 / 257 / 2.34   (medians of 3 runs).
// Narrower tiles pay per-tile costs (row maxima, the rescale); 512 keys make a 64 x 512 score
// tile of 128 KB per thread, which stays in L2 between the three stages.
inline constexpr std::int64_t default_key_tile = 512;

// The parts of one query block's scratch (attention_layout::scratch_parts).
struct attention_scratch {
  float* queries;       // padded_rows x head_dim: the block's queries times scale, zero-padded
  float* scores;        // padded_rows x score_cols: one key tile's scores, then weights
  float* accumulators;  // padded_rows x acc_cols: the output rows before dividing by row_sum
  float* row_max;       // padded_rows: running max of each row's scores
  float* row_sum;       // padded_rows: running sum of exp(score - row_max), undropped
  float* rescale;       // padded_rows: exp(previous row_max - row_max) of the current key tile
  float* dropout;       // score_cols: one row's dropout multipliers over a key tile
};

// The per-(seq_len, keys, head_dim, key tile) geometry of the attention kernel on one ISA: panel
// widths, the query-row block, the key tile, and the floats each workspace needs.
struct attention_layout {
  tile_shape scores, values;  // micro-kernels of S = Q K^T and of O = P V
  std::int64_t seq_len = 0;   // query rows (attention_args::seq_len)
  std::int64_t keys = 0;      // key/value rows (attention_args::keys(): past + seq_len)
  std::int64_t head_dim = 0;
  std::int64_t block_rows = 0;   // query rows per attention_rows call (the last may be fewer)
  std::int64_t padded_rows = 0;  // block_rows rounded up for both micro-kernels' row counts
  std::int64_t key_tile = 0;     // keys per online-softmax step: a multiple of scores.nr and of
                                 // the lanes; >= keys means one step over whole rows
  std::int64_t score_cols = 0;   // columns of a scores tile: key_tile, or keys rounded up
                                 // like key_tile when that is smaller
  std::int64_t acc_cols = 0;     // head_dim rounded up to values.nr

  // Packed K^T (head_dim, keys) at the start, then packed V (keys, head_dim) at
  // values_offset(), of one head.
  std::int64_t head_floats() const noexcept;
  std::int64_t values_offset() const noexcept;
  // One query block's scratch: O(block_rows * (score_cols + head_dim)), independent of the
  // keys once keys >= key_tile.
  std::int64_t scratch_floats() const noexcept;
  // Carves `scratch` (scratch_floats() floats, 64-byte aligned) into its parts, each aligned.
  attention_scratch scratch_parts(float* scratch) const noexcept;
  // Query blocks per head: ceil(seq_len / block_rows).
  std::int64_t blocks() const noexcept { return (seq_len + block_rows - 1) / block_rows; }
};

// Head (b, h) of args.k and args.v packed into `head` (layout.head_floats() floats), as every
// row block of that head reads them.
void pack_head(const attention_args& args, const attention_layout& layout, std::int64_t b,
               std::int64_t h, float* head) noexcept;

// One thread's attention workspace for one attention call (one args, one layout): a packed
// head and one query block's scratch, O(seq_len * head_dim + block_rows * (key_tile +
// head_dim)) floats whatever the batch and head count. Allocated once; run_block() allocates
// nothing. Not shared between threads.
class attention_workspace {
 public:
  // Throws std::bad_alloc.
  explicit attention_workspace(const attention_layout& layout);

  // Query block `block` (rows [block * block_rows, ...)) of head (b, h) of `args`, with the
  // layout the workspace was made for. Packs K and V of (b, h) unless they are the ones packed
  // last, so blocks of one head in a row pack it once.
  void run_block(const isa_kernels& kernels, const attention_args& args, std::int64_t b,
                 std::int64_t h, std::int64_t block) noexcept;

 private:
  attention_layout layout_;
  float_buffer head_, scratch_;
  std::int64_t packed_ = -1;  // b * heads + h of the packed head, -1 before the first
};

// Every query block of every (b, h) of `args`, in order, on the calling thread, with the
// kernels' layout for key_tile (default: the fused kernel's). Throws std::bad_alloc.
void attention(const isa_kernels& kernels, const attention_args& args,
               std::int64_t key_tile = default_key_tile);

}  // namespace mha::detail
