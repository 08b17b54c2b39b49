// Prefill through a KV cache vs the plain forward at GPT-2 small (B1 T1024 d768 H12), 1 thread
// and all: median of alternating repetitions.
#include <mha/mha.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  const mha::config cfg{.d_in = 768, .d_out = 768, .n_heads = 12, .context_length = 1024};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  const mha::weights w = mha::weights::random(cfg, 1);
  const auto fill = [&](std::vector<float>& v, std::size_t n) { v.resize(n); for (float& e : v) e = u(rng); };
  std::vector<float> x, y(1024 * 768), yc(1024 * 768);
  fill(x, 1024 * 768);
  for (const mha::backend* b : mha::available_backends()) {
    if (b->name() == "naive") continue;
    for (int threads : {1, 2}) {
      if (threads > b->max_threads()) continue;
      for (mha::formulation form : {mha::formulation::split_weight, mha::formulation::wrapper}) {
        auto plan = b->prepare(cfg, form, w);
        mha::kv_cache cache = plan->make_cache(1, 1024);
        std::vector<double> plain, cached;
        const mha::run_options o{.threads = threads};
        for (int r = 0; r < reps + 2; ++r) {
          auto t0 = std::chrono::steady_clock::now();
          plan->run({x.data(), 1, 1024, 768}, {y.data(), 1, 1024, 768}, o);
          auto t1 = std::chrono::steady_clock::now();
          cache.reset();
          auto t2 = std::chrono::steady_clock::now();
          plan->run({x.data(), 1, 1024, 768}, {yc.data(), 1, 1024, 768}, cache, o);
          auto t3 = std::chrono::steady_clock::now();
          if (r >= 2) {
            plain.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
            cached.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
          }
        }
        std::sort(plain.begin(), plain.end());
        std::sort(cached.begin(), cached.end());
        double diff = 0;
        for (std::size_t i = 0; i < y.size(); ++i) diff = std::max(diff, double(std::abs(y[i] - yc[i])));
        std::printf("%-7s %-12s threads %d: plain %.2f ms, through cache %.2f ms, ratio %.3f, max|dy| %.2g\n",
                    std::string(b->name()).c_str(), std::string(mha::to_string(form)).c_str(), threads,
                    plain[plain.size() / 2], cached[cached.size() / 2],
                    cached[cached.size() / 2] / plain[plain.size() / 2], diff);
      }
    }
  }
}
