// Internal: the oneDNN backend's runtime: the CPU engine, each calling thread's stream, the
// OpenMP team oneDNN's primitives run on, and oneDNN's errors rethrown as mha::error.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string_view>

#include "base/text.hpp"
#include "mha/error.hpp"

namespace mha::detail {

inline constexpr std::string_view onednn_name = "onednn";

// The CPU engine every primitive and memory of the backend is made on.
const dnnl::engine& cpu_engine();

// The calling thread's stream, made once rather than per primitive call (the wrapper form makes
// 3 projection calls per head).
dnnl::stream& caller_stream();

// The calling thread's OpenMP team size (omp_get_max_threads()). oneDNN sizes a primitive's
// work partition by it when it creates the primitive and keeps that for every execution, so a
// primitive built for 1 thread runs single-threaded when asked for 2: it is part of every
// primitive's cache key (primitive_cache.hpp).
int team_size();

// run_options::threads as the calling thread's OpenMP team size for one run (oneDNN's OpenMP
// runtime reads it when it opens a parallel region), restored when this ends. 0 leaves it
// alone.
class openmp_team {
 public:
  explicit openmp_team(int threads);
  ~openmp_team();
  openmp_team(const openmp_team&) = delete;
  openmp_team& operator=(const openmp_team&) = delete;

 private:
  int previous_;
  bool set_;
};

// Runs f(), rethrowing a dnnl::error as mha::error naming the backend and what failed, as
// what() says it (called on failure only): "onednn: oneDNN failed in a (1024 rows)
// projection: could not execute a primitive (dnnl_status_t 5)".
template <class What, class F>
decltype(auto) rethrowing_dnnl_errors(What&& what, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw error(text(onednn_name, ": oneDNN failed ", what(), ": ", e.what(), " (dnnl_status_t ",
                     static_cast<int>(e.status), ")"));
  }
}

}  // namespace mha::detail
