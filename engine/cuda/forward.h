// The CUDA forward of one rank (engine/cuda/forward.cpp).
#pragma once

#include "engine/cuda/cuda_rank.h"

namespace moebatch {

/// Runs the decoder over the call's tokens on r.stream: embeddings through the final norm (into
/// r.buf.h), writing every token's k/v into its slot; with world > 1 each branch output is
/// all-reduced before its residual add. `timer` may be null.
void cuda_forward(const ModelConfig& cfg, CudaRank& r, const StepShape& s, StageTimer* timer);

/// lm_head on logits rows [first, first + rows) of the call (rows <= cap.logits_rows): gathers
/// the final-normed rows and writes r.buf.logits [rows, V] in fp32 (on rank 0 when the lm_head
/// is vocab-parallel: every rank's slice is all-gathered and interleaved there).
void cuda_lm_head(const ModelConfig& cfg, CudaRank& r, int first, int rows, int tokens,
                  StageTimer* timer);

}  // namespace moebatch
