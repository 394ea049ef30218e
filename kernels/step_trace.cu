// The step trace's registry of translation units (kernels/step_trace.cuh).
#include <algorithm>

#include "kernels/step_trace.cuh"

namespace moebatch::kernels {

#if MOEBATCH_STEP_TRACE
namespace {
std::vector<StepTraceTake>& units() {
  static std::vector<StepTraceTake> all;  // filled during static initialization, read after
  return all;
}
}  // namespace

bool register_step_trace_unit(StepTraceTake take) {
  units().push_back(take);
  return true;
}
#endif

std::vector<StepTraceSample> take_step_trace() {
  std::vector<StepTraceSample> out;
#if MOEBATCH_STEP_TRACE
  CUDA_CHECK(cudaDeviceSynchronize());
  for (StepTraceTake take : units()) take(out);
  std::sort(out.begin(), out.end(), [](const StepTraceSample& a, const StepTraceSample& b) { return a.after < b.after; });
#endif
  return out;
}

}  // namespace moebatch::kernels
