// Per-stage device time of a forward from CUDA events recorded between stages (profiling only;
// never used inside a captured graph).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace moebatch {

/// Accumulates device time per forward stage from events recorded between stages.
class StageTimer {
 public:
  StageTimer() = default;
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  /// Starts timing on `stream`.
  void begin(cudaStream_t stream);
  /// Attributes the time since the previous mark to `stage`.
  void mark(const char* stage, cudaStream_t stream);
  /// Synchronizes and adds every interval to the per-stage totals (milliseconds).
  void collect();
  /// Stage name and total milliseconds, in first-seen order.
  const std::vector<std::pair<std::string, double>>& totals() const { return totals_; }

 private:
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> labels_;
  size_t used_ = 0;
  std::vector<std::pair<std::string, double>> totals_;
};

}  // namespace moebatch
