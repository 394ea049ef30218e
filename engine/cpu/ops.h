// fp32 reference ops of the CPU backend. Every op computes each output element in an order that
// does not depend on how many rows are in the batch or how work is split across threads, so a
// sequence's results are bitwise independent of its batch neighbours.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/cpu/thread_pool.h"

namespace moebatch::cpu {

/// y[n, m] = x[n, k] · W[m, k]ᵀ (+ bias[m] when non-null). Parallel over output columns.
void matmul(ThreadPool& pool, const float* x, int64_t n, int64_t k, const float* w, int64_t m,
            const float* bias, float* y);

/// Dot product with a fixed 8-lane accumulation order.
float dot(const float* a, const float* b, int64_t k);

/// out[i, :] = x[i, :] / rms(x[i, :]) * (w_offset + w) for n rows of width d (out may alias
/// x); w_offset is 1 for zero-centred norms (Qwen3-Next), else 0.
void rmsnorm(const float* x, const float* w, int64_t n, int64_t d, double eps, float* out,
             float w_offset);

/// Rotary embedding, NEOX style, in place on the first `rot` dims of each head of x[n, heads,
/// hd] (pairs (i, i + rot/2); rot = hd for full rotary); inv_freq_i = theta^(-2i/rot),
/// angle = position * inv_freq_i.
void rope_neox(float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t hd,
               int64_t rot, double theta);

/// x[i, :] *= 1 / sqrt(sum(x[i, :]^2) + eps) for n rows of width d (transformers' l2norm).
void l2norm(float* x, int64_t n, int64_t d, double eps);

/// Logistic sigmoid.
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

/// SiLU: x · sigmoid(x).
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

/// softplus(x) = log(1 + e^x), linear above 20 as torch computes it.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

/// out[n, I] = silu(gu[:, 0:I]) * gu[:, I:2I] for gu[n, 2I] (gate rows first, as stacked).
void silu_mul(const float* gu, int64_t n, int64_t inter, float* out);

/// Router: softmax over E logits in fp32, top-k (ties to the lower index), renormalized when
/// `norm`. Writes k expert ids and weights, highest probability first.
void route_topk(const float* logits, int64_t num_experts, int64_t k, bool norm, int32_t* ids,
                float* weights);

}  // namespace moebatch::cpu
