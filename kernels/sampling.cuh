// Token sampling on the GPU from fp32 logits [batch, vocab]: greedy, and temperature + top-k +
// top-p. Each row's random draw depends only on that sequence's (seed, step), so a sequence
// samples the same token whatever its batch neighbours.
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Candidate cap of sample_top_k_top_p: top_k <= 0 (off) or above the cap means the cap, and
/// top-p is applied within those candidates.
constexpr int kSamplingMaxK = 1024;

/// Per-row sampling controls; every array has `batch` entries.
struct SamplingParams {
  int32_t* out_tokens = nullptr;
  const float* logits = nullptr;       ///< [batch, vocab]
  const float* temperature = nullptr;  ///< <= 0: greedy for that row
  const int32_t* top_k = nullptr;      ///< <= 0 or > kSamplingMaxK: kSamplingMaxK
  const float* top_p = nullptr;        ///< keep the shortest best-first prefix with mass >= top_p
  const uint64_t* seeds = nullptr;     ///< per-sequence seed
  const uint64_t* steps = nullptr;     ///< per-sequence counter (e.g. tokens generated so far)
  int batch = 0;
  int vocab = 0;
};

/// out[b] = argmax logits[b, :] (ties: lowest id; NaN never wins).
void sample_greedy(int32_t* out, const float* logits, int batch, int vocab, cudaStream_t stream);

/// Candidates = the top_k largest logits (ties: lowest id), sorted best first; probabilities
/// softmax(logit / temperature) over them; kept = shortest prefix whose exclusive cumulative
/// mass is below top_p of the total (at least one); token = first kept candidate whose
/// cumulative mass exceeds uniform01(seed, step) * kept mass.
void sample_top_k_top_p(const SamplingParams& p, cudaStream_t stream);

}  // namespace moebatch::kernels
