#include "engine/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moebatch::cpu {

float dot(const float* a, const float* b, int64_t k) {
  // Eight independent partial sums: vectorizes without -ffast-math and keeps a fixed order.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < k; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void matmul(ThreadPool& pool, const float* x, int64_t n, int64_t k, const float* w, int64_t m,
            const float* bias, float* y) {
  pool.parallel_for(m, [&](int64_t j0, int64_t j1) {
    // Blocks of weight rows stay in cache while every activation row streams past them.
    constexpr int64_t kBlock = 16;
    for (int64_t jb = j0; jb < j1; jb += kBlock) {
      const int64_t je = std::min(j1, jb + kBlock);
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * k;
        for (int64_t j = jb; j < je; ++j) {
          y[i * m + j] = dot(xi, w + j * k, k) + (bias ? bias[j] : 0.0f);
        }
      }
    }
  });
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t d, double eps, float* out,
             float w_offset) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    const float ms = dot(xi, xi, d) / static_cast<float>(d);
    const float inv = 1.0f / std::sqrt(ms + static_cast<float>(eps));
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = xi[j] * inv * (w_offset + w[j]);
  }
}

void l2norm(float* x, int64_t n, int64_t d, double eps) {
  for (int64_t i = 0; i < n; ++i) {
    float* xi = x + i * d;
    const float inv = 1.0f / std::sqrt(dot(xi, xi, d) + static_cast<float>(eps));
    for (int64_t j = 0; j < d; ++j) xi[j] *= inv;
  }
}

void rope_neox(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t hd,
               int64_t rot, double theta) {
  const int64_t half = rot / 2;
  std::vector<float> cs(half), sn(half);
  for (int64_t t = 0; t < n; ++t) {
    // Angles in double: positions up to 1e5+ times inv_freq lose digits in fp32.
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / rot);
      const double a = positions[t] * inv_freq;
      cs[i] = static_cast<float>(std::cos(a));
      sn[i] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

void silu_mul(const float* gu, int64_t n, int64_t inter, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* g = gu + t * 2 * inter;
    const float* u = g + inter;
    for (int64_t i = 0; i < inter; ++i) out[t * inter + i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void route_topk(const float* logits, int64_t num_experts, int64_t k, bool norm, int32_t* ids,
                float* weights) {
  std::vector<float> p(logits, logits + num_experts);
  const float mx = *std::max_element(p.begin(), p.end());
  float sum = 0.0f;
  for (auto& v : p) sum += (v = std::exp(v - mx));
  for (auto& v : p) v /= sum;
  std::vector<int32_t> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float ksum = 0.0f;
  for (int64_t i = 0; i < k; ++i) ksum += p[order[i]];
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = order[i];
    weights[i] = norm ? p[order[i]] / ksum : p[order[i]];
  }
}

}  // namespace moebatch::cpu
