#include "engine/cuda/stage_timer.h"

#include <algorithm>

#include "kernels/cuda_check.cuh"

namespace moebatch {

StageTimer::~StageTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StageTimer::begin(cudaStream_t stream) {
  used_ = 0;
  labels_.clear();
  mark(nullptr, stream);
}

void StageTimer::mark(const char* stage, cudaStream_t stream) {
  if (used_ == events_.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(events_[used_++], stream));
  labels_.push_back(stage);
}

void StageTimer::collect() {
  if (used_ == 0) return;
  CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
    auto it = std::find_if(totals_.begin(), totals_.end(),
                           [&](const auto& p) { return p.first == labels_[i]; });
    if (it == totals_.end()) {
      totals_.emplace_back(labels_[i], ms);
    } else {
      it->second += ms;
    }
  }
  used_ = 0;
  labels_.clear();
}

}  // namespace moebatch
