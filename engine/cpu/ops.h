// fp32 reference ops of the CPU backend. Every op computes each output element in an order that
// does not depend on how many rows are in the batch or how work is split across threads, so a
// sequence's results are bitwise independent of its batch neighbours.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cpu/thread_pool.h"

namespace moebatch::cpu {

/// y[n, m] = x[n, k] · W[m, k]ᵀ (+ bias[m] when non-null). Parallel over output columns.
void matmul(ThreadPool& pool, const float* x, int64_t n, int64_t k, const float* w, int64_t m,
            const float* bias, float* y);

/// Dot product with a fixed 8-lane accumulation order.
float dot(const float* a, const float* b, int64_t k);

/// out[i, :] = x[i, :] / rms(x[i, :]) * w for n rows of width d (out may alias x).
void rmsnorm(const float* x, const float* w, int64_t n, int64_t d, double eps, float* out);

/// Rotary embedding, NEOX style (pairs (i, i + hd/2)), in place on x[n, heads, hd];
/// inv_freq_i = theta^(-2i/hd), angle = position * inv_freq_i.
void rope_neox(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t hd,
               double theta);

/// out[n, I] = silu(gu[:, 0:I]) * gu[:, I:2I] for gu[n, 2I] (gate rows first, as stacked).
void silu_mul(const float* gu, int64_t n, int64_t inter, float* out);

/// Router: softmax over E logits in fp32, top-k (ties to the lower index), renormalized when
/// `norm`. Writes k expert ids and weights, highest probability first.
void route_topk(const float* logits, int64_t num_experts, int64_t k, bool norm, int32_t* ids,
                float* weights);

}  // namespace moebatch::cpu
