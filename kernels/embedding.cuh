// Embedding gather: out[t, :] = table[ids[t], :].
#pragma once

#include "kernels/types.cuh"

namespace moebatch::kernels {

/// Gathers rows of `table` [vocab, hidden] into `out` [tokens, hidden]. hidden % 8 == 0.
/// An id outside [0, vocab) yields a zero row (the engine validates ids before this).
void embedding_gather(bf16* out, const bf16* table, const int32_t* ids, int tokens, int hidden,
                      int vocab, cudaStream_t stream);

}  // namespace moebatch::kernels
