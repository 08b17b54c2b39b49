// The six layouts of a state_dict (mha/io.hpp): their names, shapes and buffers, read into the
// split layout of mha::weights and written back from it.
#include "io/layouts.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <utility>

#include "io/common.hpp"

namespace mha::io::detail {
namespace {

using mha::detail::text;

// The names of the three input projections and the output projection of a layout that keeps
// them apart (each an nn.Linear: <name>.weight, <name>.bias).
struct projection_names {
  std::string_view query, key, value, out;
};
constexpr projection_names seeds_names{"W_query", "W_key", "W_value", "out_proj"};
constexpr projection_names llama_names{"q_proj", "k_proj", "v_proj", "o_proj"};
constexpr projection_names bert_names{"self.query", "self.key", "self.value", "output.dense"};
constexpr std::string_view heads_prefix = "heads.";

// ---- reading ----

// The tensor `name` of the block, which must exist; messages name it with the block's prefix.
const tensor& find(const tensor_map& block, std::string_view prefix, std::string_view name,
                   std::string_view source) {
  const auto it = block.find(name);
  if (it == block.end()) fail(source, "tensor ", printable(text(prefix, name)), " is missing");
  return it->second;
}

// The values of tensor `name`, checked to have `shape`, taken out of the block.
std::vector<float> take(tensor_map& block, std::string_view prefix, std::string_view name,
                        std::span<const std::int64_t> shape, std::string_view source) {
  const tensor& t = find(block, prefix, name, source);
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    fail(source, "tensor ", printable(text(prefix, name)), " has shape ", shape_text(t.shape),
         ", expected ", shape_text(shape));
  }
  return std::move(block.extract(block.find(name)).mapped().values);
}

// The shape (rows, columns) of matrix `name`, both >= 1.
std::array<std::int64_t, 2> matrix(const tensor_map& block, std::string_view prefix,
                                   std::string_view name, std::string_view source) {
  const std::vector<std::int64_t>& s = find(block, prefix, name, source).shape;
  if (s.size() != 2 || s[0] < 1 || s[1] < 1) {
    fail(source, "tensor ", printable(text(prefix, name)), " has shape ", shape_text(s),
         ", expected (out, in) with both >= 1");
  }
  return {s[0], s[1]};
}

// The nn.Linear `name` of `rows` outputs and `in` inputs, with a bias when `bias`.
linear_weights take_linear(tensor_map& block, std::string_view prefix, std::string_view name,
                           std::int64_t rows, std::int64_t in, bool bias, std::string_view source) {
  const std::array<std::int64_t, 2> shape = {rows, in};
  linear_weights l{rows, in, take(block, prefix, text(name, ".weight"), shape, source), {}};
  if (bias) l.bias = take(block, prefix, text(name, ".bias"), std::span(shape).first(1), source);
  return l;
}

// Q (rows, d_in), K and V (kv_rows, d_in) alike, as three nn.Linear with all three biases or
// none.
void read_qkv(tensor_map& block, std::string_view prefix, const projection_names& n, weights& w,
              std::string_view source) {
  const auto [rows, in] = matrix(block, prefix, text(n.query, ".weight"), source);
  const auto [kv_rows, key_in] = matrix(block, prefix, text(n.key, ".weight"), source);
  if (key_in != in) {
    fail(source, "tensor ", printable(text(prefix, n.key, ".weight")), " has ", key_in,
         " columns but ", printable(text(prefix, n.query, ".weight")), " has ", in,
         "; expected the same d_in");
  }
  const std::array<std::string_view, 3> qkv = {n.query, n.key, n.value};
  const std::size_t biases =
      static_cast<std::size_t>(std::count_if(qkv.begin(), qkv.end(), [&](std::string_view p) {
        return block.contains(text(p, ".bias"));
      }));
  if (biases != 0 && biases != 3) {
    fail(source, "has ", biases, " of the 3 biases ", prefix, n.query, ".bias, ", prefix, n.key,
         ".bias, ", prefix, n.value, ".bias; expected all or none");
  }
  w.query = take_linear(block, prefix, n.query, rows, in, biases != 0, source);
  w.key = take_linear(block, prefix, n.key, kv_rows, in, biases != 0, source);
  w.value = take_linear(block, prefix, n.value, kv_rows, in, biases != 0, source);
}

// <name>.weight (out, d_out) with an optional <name>.bias, or neither (no out_proj): out is d_out
// or the module's out_features (config::out_features, Gemma's hidden size).
void read_out(tensor_map& block, std::string_view prefix, std::string_view name, weights& w,
              std::string_view source) {
  const bool weight = block.contains(text(name, ".weight"));
  const bool bias = block.contains(text(name, ".bias"));
  if (!weight && bias) {
    fail(source, "tensor ", printable(text(prefix, name, ".bias")), " is present without ",
         printable(text(prefix, name, ".weight")));
  }
  if (!weight) return;
  const std::int64_t rows = matrix(block, prefix, text(name, ".weight"), source)[0];
  w.out_proj = take_linear(block, prefix, name, rows, w.query.out, bias, source);
}

// The q/k norms' weights q_norm.weight and k_norm.weight (head_dim each, which the module's
// config checks), both or neither.
void read_norms(tensor_map& block, std::string_view prefix, weights& w, std::string_view source) {
  const bool q = block.contains("q_norm.weight"), k = block.contains("k_norm.weight");
  if (q != k) {
    fail(source, "has ", printable(text(prefix, q ? "q_norm.weight" : "k_norm.weight")),
         " without ", printable(text(prefix, q ? "k_norm.weight" : "q_norm.weight")),
         "; expected both q/k norms or neither");
  }
  for (auto [name, into] :
       {std::pair{"q_norm.weight", &w.q_norm}, std::pair{"k_norm.weight", &w.k_norm}}) {
    if (!block.contains(name)) continue;
    const std::vector<std::int64_t> shape = find(block, prefix, name, source).shape;
    if (shape.size() != 1 || shape[0] < 1) {
      fail(source, "tensor ", printable(text(prefix, name)), " has shape ", shape_text(shape),
           ", expected (head_dim)");
    }
    *into = take(block, prefix, name, shape, source);
  }
}

// The size C of the (C, C) mask buffer `name`, taken out of the block; 0 when it has none.
std::int64_t take_mask(tensor_map& block, std::string_view prefix, std::string_view name,
                       std::string_view source) {
  const auto it = block.find(name);
  if (it == block.end()) return 0;
  const std::vector<std::int64_t>& s = it->second.shape;
  if (s.size() != 2 || s[0] != s[1] || s[0] < 1) {
    fail(source, "tensor ", printable(text(prefix, name)), " has shape ", shape_text(s),
         ", expected (C, C) with C >= 1 (the context length)");
  }
  const std::int64_t size = s[0];
  block.erase(it);
  return size;
}

[[noreturn]] void unexpected(std::string_view prefix, std::string_view name, io::layout l,
                             std::string_view source) {
  fail(source, "unexpected tensor ", printable(text(prefix, name)), " in a ", to_string(l),
       " block; it has ", rules(l).tensors);
}

// Every tensor of the block was read.
void check_all_used(const tensor_map& block, std::string_view prefix, io::layout l,
                    std::string_view source) {
  if (!block.empty()) unexpected(prefix, block.begin()->first, l, source);
}

// `a` then `b`'s rows, as one layer.
void stack(linear_weights& a, const linear_weights& b) {
  a.out += b.out;
  a.in = b.in;
  a.weight.insert(a.weight.end(), b.weight.begin(), b.weight.end());
  a.bias.insert(a.bias.end(), b.bias.begin(), b.bias.end());
}

// A (rows, cols) row-major matrix transposed: GPT-2's Conv1D keeps (in, out), nn.Linear
// (out, in).
std::vector<float> transposed(std::span<const float> m, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  }
  return t;
}

block_weights read_split(tensor_map& block, std::string_view prefix, std::string_view source) {
  block_weights b;
  read_qkv(block, prefix, seeds_names, b.w, source);
  read_out(block, prefix, seeds_names.out, b.w, source);
  b.mask_size = take_mask(block, prefix, "mask", source);
  check_all_used(block, prefix, layout::split, source);
  return b;
}

block_weights read_llama(tensor_map& block, std::string_view prefix, std::string_view source) {
  block_weights b;
  read_qkv(block, prefix, llama_names, b.w, source);
  read_out(block, prefix, llama_names.out, b.w, source);
  read_norms(block, prefix, b.w, source);
  // gpt-oss's sinks: one logit per query head (the module's config checks their count).
  if (block.contains("sinks")) {
    const std::vector<std::int64_t> shape = find(block, prefix, "sinks", source).shape;
    if (shape.size() != 1 || shape[0] < 1) {
      fail(source, "tensor ", printable(text(prefix, "sinks")), " has shape ", shape_text(shape),
           ", expected (n_heads)");
    }
    b.w.sinks = take(block, prefix, "sinks", shape, source);
  }
  // Older Hugging Face checkpoints store RoPE's inverse frequencies; the base says the same.
  block.erase("rotary_emb.inv_freq");
  check_all_used(block, prefix, layout::llama, source);
  return b;
}

block_weights read_bert(tensor_map& block, std::string_view prefix, std::string_view source) {
  block_weights b;
  read_qkv(block, prefix, bert_names, b.w, source);
  find(block, prefix, "output.dense.weight", source);  // BertSelfOutput always has it
  read_out(block, prefix, bert_names.out, b.w, source);
  // The LayerNorm after the residual add lies outside the function mha computes (its output is
  // the dense layer's, before dropout, the residual and the LayerNorm).
  block.erase("output.LayerNorm.weight");
  block.erase("output.LayerNorm.bias");
  check_all_used(block, prefix, layout::bert, source);
  return b;
}

// The head index h of "heads.{h}.<rest>", digits only as ModuleList writes it (no sign: "-0"
// would read as 0 and shadow heads.0; no leading zero); nullopt when the name has no <rest>.
std::optional<std::int64_t> head_index(std::string_view name, std::string_view prefix,
                                       std::string_view source) {
  const std::string_view after = name.substr(heads_prefix.size());
  const std::size_t dot = after.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view index = after.substr(0, dot);
  std::int64_t h = -1;
  const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), h);
  const bool digits = !index.empty() && std::all_of(index.begin(), index.end(),
                                                    [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || (index.size() > 1 && index[0] == '0')) {
    fail(source, "unexpected tensor ", printable(text(prefix, name)), ": its head index ",
         printable(index),
         " is not canonical (expected heads.{h}.<name> with h = 0, 1, ... in digits only: no "
         "sign, no leading zero)");
  }
  if (ec != std::errc{} || end != index.data() + index.size()) return std::nullopt;
  return h;
}

block_weights read_wrapper(tensor_map& block, std::string_view prefix, std::string_view source) {
  std::map<std::int64_t, tensor_map> heads;
  for (auto it = block.begin(); it != block.end();) {
    if (!it->first.starts_with(heads_prefix)) {
      ++it;
      continue;
    }
    const std::optional<std::int64_t> h = head_index(it->first, prefix, source);
    if (!h) unexpected(prefix, it->first, layout::wrapper, source);
    const std::string rest = it->first.substr(it->first.find('.', heads_prefix.size()) + 1);
    heads[*h].emplace(rest, std::move(it->second));
    it = block.erase(it);
  }
  // Indices 0..H-1 each once (detect() saw at least one): the map is sorted, so the last is H-1
  // exactly when none is missing.
  if (const std::int64_t last = heads.rbegin()->first;
      last != static_cast<std::int64_t>(heads.size()) - 1) {
    std::int64_t missing = 0;
    while (heads.contains(missing)) ++missing;
    fail(source, "has heads up to ", prefix, "heads.", last, " but no ", prefix, "heads.", missing);
  }
  block_weights b;
  std::string first_mask;
  linear_weights first;  // head 0's W_query, which every head's must match
  for (auto& [h, tensors] : heads) {
    const std::string head = text(prefix, heads_prefix, h, ".");
    weights one;
    read_qkv(tensors, head, seeds_names, one, source);
    if (one.key.out != one.query.out) {
      fail(source, "tensor ", printable(text(head, "W_key.weight")), " has ", one.key.out,
           " rows but ", printable(text(head, "W_query.weight")), " has ", one.query.out,
           "; a wrapper head's K and V are as wide as its Q");
    }
    if (h == 0) first = one.query;
    if (one.query.in != first.in || one.query.out != first.out ||
        one.query.has_bias() != first.has_bias()) {
      fail(source, "head ", h, " has W_query.weight (", one.query.out, ", ", one.query.in, ")",
           one.query.has_bias() ? " with" : " without", " biases but head 0 has (", first.out, ", ",
           first.in, ")", first.has_bias() ? " with" : " without", " biases");
    }
    if (const std::int64_t c = take_mask(tensors, head, "mask", source); c != 0) {
      if (b.mask_size != 0 && c != b.mask_size) {
        fail(source, "tensor ", printable(text(head, "mask")), " is (", c, ", ", c, ") but ",
             printable(first_mask), " is (", b.mask_size, ", ", b.mask_size, "); masks must agree");
      }
      if (first_mask.empty()) first_mask = text(head, "mask");
      b.mask_size = c;
    }
    check_all_used(tensors, head, layout::wrapper, source);
    stack(b.w.query, one.query);
    stack(b.w.key, one.key);
    stack(b.w.value, one.value);
  }
  read_out(block, prefix, seeds_names.out, b.w, source);
  check_all_used(block, prefix, layout::wrapper, source);
  b.heads = static_cast<std::int64_t>(heads.size());
  return b;
}

// `fused`'s rows as Q, K and V of d rows each.
void split_fused(const linear_weights& fused, std::int64_t d, weights& w) {
  w.query = fused.rows(0, d);
  w.key = fused.rows(d, d);
  w.value = fused.rows(2 * d, d);
}

block_weights read_torch_mha(tensor_map& block, std::string_view prefix, std::string_view source) {
  const auto [rows, d] = matrix(block, prefix, "in_proj_weight", source);
  if (rows % 3 != 0 || rows / 3 != d) {  // not rows != 3 * d, which can overflow
    fail(source, "tensor ", printable(text(prefix, "in_proj_weight")), " has shape (", rows, ", ",
         d, "), expected (3 d, d) with d = ", d,
         ": [W_q; W_k; W_v] of nn.MultiheadAttention(d, ...)");
  }
  const std::array<std::int64_t, 2> shape = {3 * d, d};
  linear_weights fused{3 * d, d, take(block, prefix, "in_proj_weight", shape, source), {}};
  if (block.contains("in_proj_bias")) {
    fused.bias = take(block, prefix, "in_proj_bias", std::span(shape).first(1), source);
  }
  block_weights b;
  split_fused(fused, d, b.w);
  find(block, prefix, "out_proj.weight", source);  // nn.MultiheadAttention always has it
  read_out(block, prefix, "out_proj", b.w, source);
  check_all_used(block, prefix, layout::torch_mha, source);
  return b;
}

block_weights read_gpt2(tensor_map& block, std::string_view prefix, std::string_view source) {
  const auto [d, columns] = matrix(block, prefix, "c_attn.weight", source);
  if (columns % 3 != 0 || columns / 3 != d) {  // not columns != 3 * d, which can overflow
    fail(source, "tensor ", printable(text(prefix, "c_attn.weight")), " has shape (", d, ", ",
         columns, "), expected (d, 3 d) with d = ", d, ": GPT-2's Conv1D stores (in, out)");
  }
  // Conv1D always has a bias; c_attn is [Q K V] along its columns.
  const std::array<std::int64_t, 2> shape = {d, 3 * d}, out_shape = {d, d};
  const std::array<std::int64_t, 1> bias = {3 * d};
  const linear_weights fused{
      3 * d, d, transposed(take(block, prefix, "c_attn.weight", shape, source), d, 3 * d),
      take(block, prefix, "c_attn.bias", bias, source)};
  block_weights b;
  split_fused(fused, d, b.w);
  b.w.out_proj = {d, d, transposed(take(block, prefix, "c_proj.weight", out_shape, source), d, d),
                  take(block, prefix, "c_proj.bias", std::span(out_shape).first(1), source)};
  // The causal mask buffer (1, 1, C, C) of older checkpoints gives the context length;
  // masked_bias (the value masked scores got) says nothing mha needs.
  if (const auto it = block.find("bias"); it != block.end()) {
    const std::vector<std::int64_t>& s = it->second.shape;
    if (s.size() != 4 || s[0] != 1 || s[1] != 1 || s[2] != s[3] || s[2] < 1) {
      fail(source, "tensor ", printable(text(prefix, "bias")), " has shape ", shape_text(s),
           ", expected (1, 1, C, C) with C >= 1 (GPT-2's causal mask buffer)");
    }
    b.mask_size = s[2];
    block.erase(it);
  }
  block.erase("masked_bias");
  check_all_used(block, prefix, layout::gpt2, source);
  return b;
}

// ---- writing ----

void put(tensor_map& out, std::string_view name, const linear_weights& l) {
  out[text(name, ".weight")] = {{l.out, l.in}, l.weight};
  if (l.has_bias()) out[text(name, ".bias")] = {{l.out}, l.bias};
}

// The causal mask of C = cfg.context_length as the module registers it: `future` where query i
// may not see key j > i, 1 - future elsewhere, of shape (C, C) or (1, 1, C, C).
tensor causal_mask(const config& cfg, float future, bool four_dimensional) {
  const std::int64_t c = cfg.context_length;
  std::int64_t elements = 0;
  const std::array<std::int64_t, 2> square = {c, c};
  if (!element_count(square, sizeof(float), elements)) {
    throw invalid_argument(
        text("to_state_dict: context_length ", c, " is too large for a (C, C) mask buffer"));
  }
  tensor mask{{c, c}, std::vector<float>(static_cast<std::size_t>(elements), 1.0f - future)};
  if (four_dimensional) mask.shape = {1, 1, c, c};
  for (std::int64_t i = 0; i < c; ++i) {
    for (std::int64_t j = i + 1; j < c; ++j)
      mask.values[static_cast<std::size_t>(i * c + j)] = future;
  }
  return mask;
}

// Throws unless `holds`: the layout `l` cannot express the module.
void require(bool holds, io::layout l, std::string_view what) {
  if (!holds) {
    throw invalid_argument(
        text("to_state_dict: the ", to_string(l), " layout (", rules(l).module, ") needs ", what));
  }
}

// Layouts other than llama's hold no q/k norms.
void require_no_norms(const config& cfg, io::layout l) {
  require(!cfg.qk_norm && !cfg.sinks, l,
          "no q/k norms or sinks (Llama's layout holds q_norm, k_norm and sinks)");
}

void write_separate(const weights& w, const projection_names& n, tensor_map& out) {
  put(out, n.query, w.query);
  put(out, n.key, w.key);
  put(out, n.value, w.value);
  if (w.out_proj.out != 0) put(out, n.out, w.out_proj);
}

void write_split(const config& cfg, const weights& w, tensor_map& out) {
  require_no_norms(cfg, layout::split);
  write_separate(w, seeds_names, out);
  out["mask"] = causal_mask(cfg, 1.0f, false);  // triu(ones(C, C), diagonal=1)
}

void write_llama(const config&, const weights& w, tensor_map& out) {
  write_separate(w, llama_names, out);
  if (!w.q_norm.empty()) {
    const std::int64_t hd = static_cast<std::int64_t>(w.q_norm.size());
    out["q_norm.weight"] = {{hd}, w.q_norm};
    out["k_norm.weight"] = {{hd}, w.k_norm};
  }
  if (!w.sinks.empty()) out["sinks"] = {{static_cast<std::int64_t>(w.sinks.size())}, w.sinks};
}

void write_bert(const config& cfg, const weights& w, tensor_map& out) {
  require(cfg.out_proj, layout::bert, "an out_proj (BertSelfOutput's dense layer)");
  require_no_norms(cfg, layout::bert);
  write_separate(w, bert_names, out);
}

void write_wrapper(const config& cfg, const weights& w, tensor_map& out) {
  require(cfg.kv_heads() == cfg.n_heads, layout::wrapper,
          "a K/V projection per head: n_kv_heads = n_heads");
  require_no_norms(cfg, layout::wrapper);
  const tensor mask = causal_mask(cfg, 1.0f, false);
  for (std::int64_t h = 0; h < cfg.n_heads; ++h) {
    const head_weights hw = w.head(cfg, h);
    const std::string head = text(heads_prefix, h, ".");
    put(out, head + "W_query", hw.query);
    put(out, head + "W_key", hw.key);
    put(out, head + "W_value", hw.value);
    out[head + "mask"] = mask;
  }
  if (cfg.out_proj) put(out, "out_proj", w.out_proj);
}

// What nn.MultiheadAttention and GPT-2 share: one width d, no grouped K/V heads, an out_proj.
void require_fused(const config& cfg, io::layout l) {
  require(cfg.d_in == cfg.d_out, l, "d_in = d_out");
  require(cfg.kv_heads() == cfg.n_heads, l, "n_kv_heads = n_heads");
  require(cfg.out_proj && cfg.out_features == 0, l, "an out_proj of d_out features");
  require_no_norms(cfg, l);
}

void write_torch_mha(const config& cfg, const weights& w, tensor_map& out) {
  require_fused(cfg, layout::torch_mha);
  const linear_weights fused = w.fused_qkv();
  out["in_proj_weight"] = {{fused.out, fused.in}, fused.weight};
  if (fused.has_bias()) out["in_proj_bias"] = {{fused.out}, fused.bias};
  put(out, "out_proj", w.out_proj);
}

void write_gpt2(const config& cfg, const weights& w, tensor_map& out) {
  require_fused(cfg, layout::gpt2);
  require(cfg.qkv_bias && cfg.out_proj_bias, layout::gpt2, "every bias (Conv1D has one)");
  const linear_weights fused = w.fused_qkv();
  const std::int64_t d = cfg.d_out;
  out["c_attn.weight"] = {{d, 3 * d}, transposed(fused.weight, 3 * d, d)};
  out["c_attn.bias"] = {{3 * d}, fused.bias};
  out["c_proj.weight"] = {{d, d}, transposed(w.out_proj.weight, d, d)};
  out["c_proj.bias"] = {{d}, w.out_proj.bias};
  out["bias"] = causal_mask(cfg, 0.0f, true);  // tril(ones(C, C)).view(1, 1, C, C)
}

// ---- telling them apart ----

bool is_any(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool split_tensor(std::string_view n) {
  return is_any(n, {"W_query.weight", "W_key.weight", "W_value.weight"});
}

// heads.{h}.W_query.weight, ... with h in canonical digits.
bool wrapper_tensor(std::string_view n) {
  if (!n.starts_with(heads_prefix)) return false;
  const std::string_view after = n.substr(heads_prefix.size());
  const std::size_t dot = after.find('.');
  const std::string_view index = after.substr(0, dot);
  return dot != std::string_view::npos && !index.empty() &&
         std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         (index.size() == 1 || index[0] != '0') && split_tensor(after.substr(dot + 1));
}

bool torch_mha_tensor(std::string_view n) { return is_any(n, {"in_proj_weight", "in_proj_bias"}); }
bool gpt2_tensor(std::string_view n) { return is_any(n, {"c_attn.weight", "c_attn.bias"}); }
bool llama_tensor(std::string_view n) {
  return is_any(n, {"q_proj.weight", "k_proj.weight", "v_proj.weight"});
}
bool bert_tensor(std::string_view n) {
  return is_any(n, {"self.query.weight", "self.key.weight", "self.value.weight"});
}

constexpr layout_rules table[] = {
    {layout::split, "the seeds' MultiHeadAttention or GroupedQueryAttention",
     "W_query.weight, W_key.weight, W_value.weight (each with an optional .bias), "
     "out_proj.weight, out_proj.bias, mask",
     "W_key.weight", split_tensor, read_split, write_split, true},
    {layout::wrapper, "the seeds' MultiHeadAttentionWrapper",
     "heads.{h}.W_query.weight, heads.{h}.W_key.weight, heads.{h}.W_value.weight (each with an "
     "optional .bias), heads.{h}.mask, out_proj.weight, out_proj.bias",
     "heads.{h}.W_key.weight", wrapper_tensor, read_wrapper, write_wrapper, true},
    {layout::torch_mha, "torch.nn.MultiheadAttention",
     "in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias", "in_proj_weight",
     torch_mha_tensor, read_torch_mha, write_torch_mha, true},
    {layout::gpt2, "GPT-2's attention",
     "c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias, bias, masked_bias", "c_attn.weight",
     gpt2_tensor, read_gpt2, write_gpt2, true},
    {layout::llama, "Llama's attention",
     "q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight (each with an optional .bias), "
     "q_norm.weight and k_norm.weight (both or neither), sinks, rotary_emb.inv_freq",
     "k_proj.weight", llama_tensor, read_llama, write_llama, true},
    {layout::bert, "BERT's attention (BertSelfAttention and BertSelfOutput's dense layer)",
     "self.query.weight, self.key.weight, self.value.weight (each with an optional .bias), "
     "output.dense.weight, output.dense.bias, output.LayerNorm.weight and .bias (ignored)",
     "self.key.weight", bert_tensor, read_bert, write_bert, false},
};

}  // namespace

const layout_rules& rules(io::layout l) {
  for (const layout_rules& r : table) {
    if (r.id == l) return r;
  }
  throw invalid_argument(text("mha: unknown layout value ", static_cast<int>(l)));
}

}  // namespace mha::io::detail

namespace mha::io {

std::span<const layout> layouts() noexcept {
  static constexpr layout all[] = {layout::split, layout::wrapper, layout::torch_mha,
                                   layout::gpt2,  layout::llama,   layout::bert};
  return all;
}

std::string_view to_string(layout l) noexcept {
  switch (l) {
    case layout::split:
      return "split";
    case layout::wrapper:
      return "wrapper";
    case layout::torch_mha:
      return "torch_mha";
    case layout::gpt2:
      return "gpt2";
    case layout::llama:
      return "llama";
    case layout::bert:
      return "bert";
  }
  return "unknown";
}

}  // namespace mha::io
