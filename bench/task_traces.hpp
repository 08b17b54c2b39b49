// mha_bench --trace: the TBB backend's runs task by task (src/backends/tbb/task_trace.hpp), the
// measured input of the scaling model (tools/mhapy/scaling_model.py, docs/design.md §3.2).
#pragma once

#include <iosfwd>
#include <span>
#include <string>

#include "mha/backend.hpp"
#include "sweep.hpp"

namespace mha_bench {

// For each of `cases` run by the tbb backend (others are left out): its plan on the case's
// inputs (shape_fixture; a decode step from `past` zero tokens, as the benchmark times it), one
// untimed run, then `runs` runs under a task trace, keeping the run of median wall time. Writes
// them to `path` as JSON with the machine and the streaming-read bandwidth at 1, 2, 4, ...
// `hardware_threads` threads:
//   {"context": {"mha_cpu_model", "mha_hardware_threads", "mha_tbb_isa", "mha_runs",
//                "mha_bandwidth_gbps": {"1": 17.2, "2": 31.0}, "mha_command"},
//    "traces": [{"name": "mha/tbb/<problem>/threads:<n>", "problem", "threads", "run_ns",
//                "phases": [{"kind", "bytes", "span_ns", "tasks_ns": [...]}, ...]}, ...]}
// Throws mha::invalid_argument when no case is tbb's, mha::error when it cannot write.
void write_task_traces(const std::string& path, std::span<const bench_case> cases,
                       std::span<const mha::backend* const> backends, int hardware_threads,
                       int runs, const std::string& command, std::ostream* log);

}  // namespace mha_bench
