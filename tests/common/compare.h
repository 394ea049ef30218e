// Numeric comparison of outputs against a reference (logits rows, activations).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace moebatch::test {

/// ‖a − b‖ / ‖b‖ over n values; +inf when a holds a NaN (an unwritten or broken output).
inline double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace moebatch::test
