#include "backends/tbb/task_trace.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>

namespace mha::detail {
namespace {

struct trace_state {
  std::mutex mutex;
  std::vector<traced_phase> phases;
};

std::atomic<trace_state*> active{nullptr};
thread_local int task_depth = 0;               // traced tasks open on this thread
thread_local std::int64_t tasks_recorded = 0;  // tasks this thread has recorded, ever

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string_view to_string(phase_kind kind) noexcept {
  switch (kind) {
    case phase_kind::gemm:
      return "gemm";
    case phase_kind::convert:
      return "convert";
    case phase_kind::attention_append:
      return "attention_append";
    case phase_kind::attention:
      return "attention";
    case phase_kind::attention_merge:
      return "attention_merge";
    case phase_kind::for_each:
      break;
  }
  return "for_each";
}

task_trace::task_trace() {
  auto* state = new trace_state;
  trace_state* none = nullptr;
  if (!active.compare_exchange_strong(none, state)) {
    delete state;
    throw std::logic_error("mha: a task_trace is already recording in this process");
  }
  state_ = state;
}

task_trace::~task_trace() { finish(); }

std::vector<traced_phase> task_trace::finish() {
  if (state_ == nullptr) return {};
  trace_state* state = static_cast<trace_state*>(state_);
  state_ = nullptr;
  active.store(nullptr);
  std::vector<traced_phase> phases = std::move(state->phases);
  delete state;
  return phases;
}

phase_scope::phase_scope(phase_kind kind, std::int64_t bytes) noexcept {
  trace_state* state = active.load(std::memory_order_acquire);
  if (state == nullptr) return;
  const std::lock_guard lock(state->mutex);
  if (task_depth == 0) {
    state->phases.push_back({kind, bytes, 0, {}});
    opened_ = true;
    start_ns_ = now_ns();
  } else if (!state->phases.empty()) {
    state->phases.back().bytes += bytes;
  }
}

phase_scope::~phase_scope() {
  if (!opened_) return;
  const std::int64_t end = now_ns();
  trace_state* state = active.load(std::memory_order_acquire);
  if (state == nullptr) return;
  const std::lock_guard lock(state->mutex);
  if (!state->phases.empty()) state->phases.back().span_ns = end - start_ns_;
}

task_scope::task_scope() noexcept {
  if (active.load(std::memory_order_acquire) == nullptr) return;
  traced_ = true;
  ++task_depth;
  recorded_before_ = tasks_recorded;
  start_ns_ = now_ns();
}

task_scope::~task_scope() {
  if (!traced_) return;
  const std::int64_t end = now_ns();
  --task_depth;
  if (tasks_recorded != recorded_before_) return;  // its nested tasks are the tasks
  trace_state* state = active.load(std::memory_order_acquire);
  if (state == nullptr) return;
  const std::lock_guard lock(state->mutex);
  if (state->phases.empty()) return;
  state->phases.back().task_ns.push_back(end - start_ns_);
  ++tasks_recorded;
}

}  // namespace mha::detail
