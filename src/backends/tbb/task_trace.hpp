// Internal: the TBB backend's runs recorded task by task, the input of the scaling model
// (docs/design.md §3.2): mha_bench --trace records a plan's run on one thread, and
// tools/mhapy/scaling_model.py schedules the recorded tasks on more. Recording is off unless a
// task_trace is alive; off, a task or a loop costs one atomic load and a predictable branch more
// (2.2 ns per loop and task: about 2 us of a 12.5 ms GPT-2 forward's 793 loops and tasks, so it
// stays in every build rather than behind an option; docs/design.md §5.1).
//
// A phase is one top-level parallel loop of a run (the fused projection's tiles, attention's
// cache appends, its tasks, its merges, out_proj's tiles; the wrapper's per-head projections with
// the tiles nested in them): every task of a phase may run at once, and a phase starts when the
// one before has finished. A task is the innermost traced unit: a loop body that runs traced
// tasks of its own on the same thread (a wrapper head's GEMM tiles) is not a task itself.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace mha::detail {

// gemm: a projection's tiles; convert: x rounded to bf16 pairs for one; attention_*: the phases of
// an attention_schedule; for_each: the driver's per-head (or per-sequence) loop bodies.
enum class phase_kind { gemm, convert, attention_append, attention, attention_merge, for_each };

// "gemm", "convert", "attention_append", "attention", "attention_merge", "for_each".
std::string_view to_string(phase_kind kind) noexcept;

struct traced_phase {
  phase_kind kind = phase_kind::gemm;
  // The bytes the phase must move at least, once each, when its operands are not in a cache:
  // a GEMM's A, B and C; attention's keys and values read from a KV cache (a prefill's own K and
  // V come from the phase before and are not counted); summed over the loops nested in it.
  std::int64_t bytes = 0;
  std::int64_t span_ns = 0;           // from the loop's start to its end on the calling thread
  std::vector<std::int64_t> task_ns;  // each task's time, in the order the tasks ended
};

// Records every phase the TBB backend runs, on any thread, from construction to finish().
// One trace at a time in a process.
class task_trace {
 public:
  // Throws std::logic_error when another task_trace is alive.
  task_trace();
  ~task_trace();
  task_trace(const task_trace&) = delete;
  task_trace& operator=(const task_trace&) = delete;

  // Stops recording and returns the phases in the order they started (at most once; later calls
  // return nothing). Call it when no run is in flight.
  std::vector<traced_phase> finish();

 private:
  void* state_ = nullptr;  // the recording's state (task_trace.cpp), nullptr once finished
};

// The framework's hooks (parallel.cpp, tbb_backend.cpp). A phase_scope around every parallel
// loop: outside any task it opens a phase of `kind` and closes it when destroyed; inside a task
// (a nested loop) it adds `bytes` to the enclosing phase.
class phase_scope {
 public:
  phase_scope(phase_kind kind, std::int64_t bytes) noexcept;
  ~phase_scope();
  phase_scope(const phase_scope&) = delete;
  phase_scope& operator=(const phase_scope&) = delete;

 private:
  bool opened_ = false;
  std::int64_t start_ns_ = 0;
};

// Marks the calling thread as running a task of the current phase from construction to
// destruction, and records the task's time then (unless a trace was not alive at construction,
// or tasks nested in it were recorded on this thread).
class task_scope {
 public:
  task_scope() noexcept;
  ~task_scope();
  task_scope(const task_scope&) = delete;
  task_scope& operator=(const task_scope&) = delete;

 private:
  bool traced_ = false;
  std::int64_t start_ns_ = 0, recorded_before_ = 0;
};

}  // namespace mha::detail
