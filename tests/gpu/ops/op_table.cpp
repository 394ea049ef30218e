// The two op-case tables: what the GPU tests check and what the kernel benchmark times. A new
// kernel or weight format adds its shapes here (and its case class in cases_*.cpp).
#include <algorithm>
#include <bit>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/moe_routing.cuh"
#include "tests/gpu/ops/op_shapes.h"

namespace moebatch::ops {

std::vector<OpCaseDef> op_cases_test() {
  std::vector<OpCaseDef> t;
  // Element-wise and copies.
  t.push_back(embedding_case({.tokens = 37, .hidden = 264, .vocab = 1000, .bad_ids = true}));
  t.push_back(rmsnorm_case({.rows = 13, .cols = 2048}));
  t.push_back(rmsnorm_case({.rows = 5, .cols = 128}));
  t.push_back(rmsnorm_case({.rows = 13, .cols = 2048, .add = true}));
  t.push_back(rmsnorm_case({.rows = 7, .cols = 136, .add = true}));
  t.push_back(rmsnorm_case({.rows = 9, .cols = 2048, .add = true, .weight_offset = 1.f}));
  for (auto [head_dim, norm, cache, table] :
       {std::tuple{128, true, false, false}, {32, true, false, false}, {16, false, false, true},
        {128, true, true, false}, {128, true, true, true}, {64, false, true, false},
        // 96 dims: not a power of two, so the warp-per-head form (the wide one takes the rest)
        {96, true, true, true}})
    t.push_back(qk_norm_rope_case({.tokens = 19, .n_q_heads = 8, .n_kv_heads = 4, .head_dim = head_dim,
                                   .norm = norm, .cache = cache, .table = table}));
  // Enough (token, head) items for groups of four heads; 12 heads per token (6 q, 3 k, 3 v), so
  // groups mix q with k and k with v, and a 9-head row ends in a partial group
  t.push_back(qk_norm_rope_case({.tokens = 800, .n_q_heads = 6, .n_kv_heads = 3, .head_dim = 128, .cache = true,
                                 .table = true}));
  t.push_back(qk_norm_rope_case({.tokens = 1000, .n_q_heads = 6, .n_kv_heads = 3, .head_dim = 128}));
  // k heads alone with the cache write (a prefill whose attention rotates q: AttentionParams::rope_q)
  t.push_back(qk_norm_rope_case({.tokens = 800, .n_q_heads = 0, .n_kv_heads = 3, .head_dim = 128, .cache = true,
                                 .table = true}));
  // ... and at Qwen3-Next's shape (a whole warp per head, a quarter rotating: tail lanes)
  t.push_back(qk_norm_rope_case({.tokens = 500, .n_q_heads = 16, .n_kv_heads = 2, .head_dim = 256, .cache = true,
                                 .rotary_dim = 64, .norm_offset = 1.f, .table = true}));
  // The warp-per-head form's other instantiations: rotated halves of 12 dims (not whole 8-dim
  // lanes), heads of 192 dims with and without an unrotated tail
  for (auto [head_dim, rotary_dim] : {std::pair{96, 24}, {192, 0}, {192, 160}})
    t.push_back(qk_norm_rope_case({.tokens = 19, .n_q_heads = 8, .n_kv_heads = 4, .head_dim = head_dim,
                                   .cache = true, .rotary_dim = rotary_dim, .table = true}));
  // Qwen3-Next: a quarter of the head rotates, zero-centred norm weights; head_dim 256
  for (auto [head_dim, table] : {std::pair{64, false}, {256, false}, {256, true}})
    t.push_back(qk_norm_rope_case({.tokens = 19, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = head_dim,
                                   .cache = true, .rotary_dim = head_dim / 4, .norm_offset = 1.f, .table = table}));
  // k/v inside a wider row, still 16-byte aligned
  t.push_back(kv_cache_write_case({.tokens = 45, .n_kv_heads = 4, .head_dim = 128, .num_slots = 16 * 12,
                                   .k_offset = 512, .stride = 3 * 512 + 32, .padding = true}));
  t.push_back(silu_mul_case({.rows = 33, .inter = 768}));
  t.push_back(sigmoid_gate_case({.rows = 21, .cols = 512, .gate_offset = 768}));
  t.push_back(moe_combine_case({.tokens = 21, .top_k = 8, .hidden = 2048, .weighted = true}));
  t.push_back(moe_combine_case({.tokens = 21, .top_k = 8, .hidden = 2048, .weighted = false}));
  // fused with the residual add + RMSNorm (one rank; the weight as w and as 1 + w), and with an
  // expert-parallel rank's pairs
  for (float offset : {0.f, 1.f})
    t.push_back(moe_combine_case({.tokens = 21, .top_k = 8, .hidden = 2048, .add_rmsnorm = true, .weight_offset = offset}));
  t.push_back(moe_combine_case({.tokens = 9, .top_k = 4, .hidden = 136, .weighted = true, .experts = 16, .expert0 = 4,
                                .local_experts = 8, .add_rmsnorm = true}));
  // more pairs than one load batch (Qwen3-Next's top 10), and rows wider than the fused kernel's
  // two vectors a thread held in registers (5120: a third, re-read)
  t.push_back(moe_combine_case({.tokens = 5, .top_k = 10, .hidden = 2048, .weighted = true}));
  t.push_back(moe_combine_case({.tokens = 7, .top_k = 10, .hidden = 5120, .weighted = true, .add_rmsnorm = true}));
  t.push_back(moe_combine_case({.tokens = 7, .top_k = 8, .hidden = 4096, .weighted = true, .add_rmsnorm = true,
                                .weight_offset = 1.f}));
  // more tokens than the batched loads take (kCombineBatchMaxTokens 1024): the per-pair form
  t.push_back(moe_combine_case({.tokens = 1100, .top_k = 8, .hidden = 256, .weighted = true}));
  t.push_back(moe_combine_case({.tokens = 1100, .top_k = 8, .hidden = 256, .weighted = true, .add_rmsnorm = true}));
  t.push_back(moe_combine_case({.tokens = 1100, .top_k = 4, .hidden = 136, .weighted = true, .experts = 16,
                                .expert0 = 4, .local_experts = 8, .add_rmsnorm = true}));
  // ... and the fused kernel's staged form there at full width: the engine's rows (one held vector
  // a thread), an expert-parallel rank's, and wider rows in two batches of pairs (re-read past 2048)
  t.push_back(moe_combine_case({.tokens = 1100, .top_k = 8, .hidden = 2048, .add_rmsnorm = true}));
  t.push_back(moe_combine_case({.tokens = 1100, .top_k = 8, .hidden = 2048, .weighted = true, .experts = 128,
                                .expert0 = 64, .local_experts = 64, .add_rmsnorm = true}));
  t.push_back(moe_combine_case({.tokens = 1100, .top_k = 10, .hidden = 5120, .weighted = true, .add_rmsnorm = true,
                                .weight_offset = 1.f}));
  // Expert parallel: only this rank's pairs; the others' rows are NaN and must not be read.
  t.push_back(moe_combine_case({.tokens = 21, .top_k = 8, .hidden = 2048, .weighted = true, .experts = 128,
                                .expert0 = 64, .local_experts = 64}));
  t.push_back(moe_combine_case({.tokens = 9, .top_k = 4, .hidden = 136, .weighted = true, .experts = 16,
                                .expert0 = 4, .local_experts = 4}));
  t.push_back(shared_expert_gate_case({.tokens = 17, .hidden = 2048}));

  // Attention. Prefill: whole prompts, a chunk continuing a cached prefix and a decode token in
  // one step. head_dim 32/64/128 run on tensor cores (64-row, 64-key mma.sync tiles; at head_dim
  // 128 a step whose longest sequence has ≥ 512 rows takes the wgmma kernel's 128-row, 128-key
  // tiles on Hopper, else mma.sync's 128-row tiles: the first two cases, and the third at 504
  // rows the 64-row ones); head_dim 256 the wgmma kernel on Hopper; head_dim 16, 256 elsewhere
  // and split-K take the CUDA-core kernel.
  for (bool mma_sync : {false, true})
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {37, 64, 20, 1},
                                .kv_lens = {37, 64, 85, 130}, .mma_sync = mma_sync}));
  // Prompt lengths around the tiles (64 rows = 8 tokens of 8 heads, or 64 tokens of 1 head; 64
  // keys): a decode token, whole prompts and chunks on a cached prefix that ends mid-tile.
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {1, 63, 64, 65, 200},
                              .kv_lens = {17, 63, 128, 145, 277}}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {1, 63, 40, 17},
                              .kv_lens = {17, 63, 104, 81}}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 8, .n_kv_heads = 8, .q_lens = {1, 63, 64, 65, 200},
                              .kv_lens = {1, 100, 64, 65, 456}}));
  // Long prompts and chunks across several 128-key tiles (the wgmma kernel's three stages wrap
  // around; the first warpgroup of a block stops a tile before the second), a block of 64 rows
  // only (16 tokens of a 4-head group in a 128-row tile: the second warpgroup has no rows),
  // 1 head per kv head, cache blocks of 8 and 32; and the same on the mma.sync kernel.
  for (bool mma_sync : {false, true}) {
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {700, 129, 1, 300},
                                .kv_lens = {700, 1000, 40, 333}, .mma_sync = mma_sync}));
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 16, .n_kv_heads = 4, .q_lens = {144, 16},
                                .kv_lens = {400, 16}, .block_size = 8, .mma_sync = mma_sync}));
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 8, .n_kv_heads = 8, .q_lens = {513, 64},
                                .kv_lens = {600, 900}, .block_size = 32, .mma_sync = mma_sync}));
  }
  // The same on the persistent head_dim-128 wgmma kernel capped at 1 and 3 blocks
  // (AttentionParams::max_blocks), so that a block walks many work items and its Q buffers, K/V
  // rings and barrier phases wrap across them: partial last cache blocks, row tiles past a short
  // sequence's rows (skipped items: the decode token's, the 16-token sequence's), a warpgroup
  // without rows, warpgroups a tile apart.
  for (int blocks : {1, 3}) {
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {700, 129, 1, 300},
                                .kv_lens = {700, 1000, 40, 333}, .max_blocks = blocks}));
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 16, .n_kv_heads = 4, .q_lens = {144, 16},
                                .kv_lens = {400, 16}, .block_size = 8, .max_blocks = blocks}));
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 8, .n_kv_heads = 8, .q_lens = {513, 64},
                                .kv_lens = {600, 900}, .block_size = 32, .max_blocks = blocks}));
  }
  // q normalised and rotated by the prefill attention itself (AttentionParams::rope_q): on the
  // persistent kernel as it loads each row tile's Q (one block and the full grid, without norms,
  // a partial last row tile), and the other kernels after a q-only rotation launch (mma.sync;
  // head_dim 64).
  for (int blocks : {0, 1})
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {700, 129, 1, 300},
                                .kv_lens = {700, 1000, 40, 333}, .max_blocks = blocks, .rope_q = true}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 16, .n_kv_heads = 4, .q_lens = {144, 16},
                              .kv_lens = {400, 16}, .block_size = 8, .rope_norm = false, .rope_q = true}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 8, .n_kv_heads = 8, .q_lens = {513, 64},
                              .kv_lens = {600, 900}, .block_size = 32, .max_blocks = 3, .rope_q = true}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {700, 129, 1, 300},
                              .kv_lens = {700, 1000, 40, 333}, .mma_sync = true, .rope_q = true}));
  t.push_back(attention_case({.head_dim = 64, .n_q_heads = 16, .n_kv_heads = 4, .q_lens = {130, 7},
                              .kv_lens = {130, 71}, .rope_q = true}));
  t.push_back(attention_case({.head_dim = 64, .n_q_heads = 16, .n_kv_heads = 4, .q_lens = {130, 7}, .kv_lens = {130, 71}}));
  t.push_back(attention_case({.head_dim = 32, .n_q_heads = 8, .n_kv_heads = 4, .q_lens = {50, 3}, .kv_lens = {50, 40}}));
  t.push_back(attention_case({.head_dim = 16, .n_q_heads = 8, .n_kv_heads = 4, .q_lens = {17, 33}, .kv_lens = {17, 33}}));
  // Qwen3-Next's full attention: head_dim 256, 8 q heads per kv head — on Hopper the wgmma
  // kernel's 64-key tiles (two stages: chunks on cached prefixes wrap them several times), cache
  // blocks of 8 and 32, 1 head per kv head; and the same on the CUDA-core kernel.
  for (bool mma_sync : {false, true}) {
    t.push_back(attention_case({.head_dim = 256, .n_q_heads = 16, .n_kv_heads = 2, .q_lens = {70, 5},
                                .kv_lens = {70, 90}, .mma_sync = mma_sync}));
    t.push_back(attention_case({.head_dim = 256, .n_q_heads = 16, .n_kv_heads = 2, .q_lens = {300, 1, 129},
                                .kv_lens = {300, 700, 200}, .block_size = 8, .mma_sync = mma_sync}));
    t.push_back(attention_case({.head_dim = 256, .n_q_heads = 8, .n_kv_heads = 8, .q_lens = {100, 37},
                                .kv_lens = {250, 37}, .block_size = 32, .mma_sync = mma_sync}));
  }
  t.push_back(attention_case(
      {.head_dim = 64, .n_q_heads = 16, .n_kv_heads = 16, .q_lens = {40}, .kv_lens = {90}, .splits = 2}));
  // Decode: 23 sequences of random length 1-700, with lengths at block edges (1, 16, 17), in one
  // split (92 pairs: the split kernel at d 128, the 64-row tensor-core kernel at d 32).
  std::vector<int> kv23(23, 0);
  kv23[0] = 1;
  kv23[1] = 16;
  kv23[2] = 17;
  for (auto [head_dim, nq] : {std::pair{128, 32}, {32, 8}})
    t.push_back(attention_case({.head_dim = head_dim, .n_q_heads = nq, .n_kv_heads = 4, .q_lens = std::vector<int>(23, 1),
                                .kv_lens = kv23, .random_kv_max = 700, .decode = true}));
  // Decode batches of >= kWarpDecodeMinUnits (sequence, kv head) pairs: the warp-per-sequence
  // kernel at 8 query heads per kv head (Qwen3-MoE), 16 (both m16 halves real) and 1.
  std::vector<int> kv130(130, 0);
  kv130[0] = 1;
  kv130[1] = 16;
  kv130[2] = 17;
  for (auto [head_dim, nq, nkv, seqs] : {std::tuple{128, 32, 4, 130}, {64, 64, 4, 130}, {128, 8, 8, 70}})
    t.push_back(attention_case({.head_dim = head_dim, .n_q_heads = nq, .n_kv_heads = nkv,
                                .q_lens = std::vector<int>(seqs, 1),
                                .kv_lens = std::vector<int>(kv130.begin(), kv130.begin() + seqs),
                                .random_kv_max = 700, .decode = true}));
  // Decode split-K: an odd split count and the engine's heuristic on the split kernel; head_dim 16
  // and 256 on the CUDA-core kernel and its combine launch.
  const std::vector<int> kv5 = {1500, 3, 800, 257, 1024};
  for (auto [head_dim, nq, splits] : {std::tuple{128, 32, 7}, {128, 32, kSplitsAuto}, {16, 8, 4}, {256, 16, 3}})
    t.push_back(attention_case({.head_dim = head_dim, .n_q_heads = nq, .n_kv_heads = 4, .q_lens = std::vector<int>(5, 1),
                                .kv_lens = kv5, .decode = true, .splits = splits}));
  // The split kernel below kWarpDecodeMinUnits pairs (one launch; each pair's last split to finish
  // combines). Batch 1 as the engine's decode graphs run it: the kv bound is the context's bucket
  // (max(64, next power of 2)) and the heuristic's splits reach past the context (neutral
  // partials); contexts around a 16-key step.
  const auto bucket = [](int ctx) {
    return std::max(64, static_cast<int>(std::bit_ceil(static_cast<unsigned>(ctx))));
  };
  for (int ctx : {1, 15, 16, 17, 150, 1500})
    t.push_back(attention_case({.head_dim = 128,
                                .n_q_heads = 32,
                                .n_kv_heads = 4,
                                .q_lens = {1},
                                .kv_lens = {ctx},
                                .decode = true,
                                .splits = kSplitsAuto,
                                .kv_bound = bucket(ctx)}));
  // Three sequences, one without keys: one split (no workspace: the block's merge writes the
  // output), an odd count, 16 and 32 (the last split loads partials 8 splits at a time); and the
  // heuristic with a bucket.
  const std::vector<int> q3(3, 1), kv3 = {17, kEmptyContext, 1500};
  for (int splits : {1, 5, 16, 32})
    t.push_back(attention_case({.head_dim = 128,
                                .n_q_heads = 32,
                                .n_kv_heads = 4,
                                .q_lens = q3,
                                .kv_lens = kv3,
                                .decode = true,
                                .splits = splits}));
  t.push_back(attention_case({.head_dim = 128,
                              .n_q_heads = 32,
                              .n_kv_heads = 4,
                              .q_lens = q3,
                              .kv_lens = {1, 150, 15},
                              .decode = true,
                              .splits = kSplitsAuto,
                              .kv_bound = 256}));
  // Decode with the q/k norm + rope + cache write fused (AttentionParams::fused_rope), on the
  // warp kernel (the only one that fuses: >= kWarpDecodeMinUnits pairs, one split): 130
  // sequences and 8/8 heads; then 130 sequences with an empty context and one of 1500 keys at 16
  // q heads per kv head (both m16 halves) at d 128, d 64 without norms (Qwen2-MoE) at 4 and 16 q
  // heads per kv head, and cache blocks of 8 (a table lookup per key) and 24 (steps straddling
  // blocks).
  for (auto [head_dim, nq, nkv, seqs] : {std::tuple{128, 32, 4, 130}, {128, 8, 8, 70}})
    t.push_back(attention_case({.head_dim = head_dim, .n_q_heads = nq, .n_kv_heads = nkv,
                                .q_lens = std::vector<int>(seqs, 1),
                                .kv_lens = std::vector<int>(kv130.begin(), kv130.begin() + seqs),
                                .random_kv_max = 700, .decode = true, .fused_rope = true}));
  std::vector<int> kv130e = kv130;
  kv130e[3] = kEmptyContext;
  kv130e[4] = 1500;
  const std::vector<int> q130(130, 1);
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 64, .n_kv_heads = 4, .q_lens = q130, .kv_lens = kv130e,
                              .random_kv_max = 700, .decode = true, .fused_rope = true}));
  for (int nq : {16, 64})
    t.push_back(attention_case({.head_dim = 64, .n_q_heads = nq, .n_kv_heads = 4, .q_lens = q130, .kv_lens = kv130e,
                                .random_kv_max = 700, .decode = true, .fused_rope = true, .rope_norm = false}));
  for (auto [head_dim, nq, block] : {std::tuple{128, 32, 8}, {64, 16, 24}})
    t.push_back(attention_case({.head_dim = head_dim, .n_q_heads = nq, .n_kv_heads = 4, .q_lens = q130,
                                .kv_lens = kv130e, .random_kv_max = 700, .decode = true, .block_size = block,
                                .fused_rope = true}));
  // head_dim 64 (4 q heads per kv head), and 16 q heads per kv head (both m16 halves) at 128
  // and 64.
  t.push_back(attention_case({.head_dim = 64,
                              .n_q_heads = 16,
                              .n_kv_heads = 4,
                              .q_lens = q3,
                              .kv_lens = {16, kEmptyContext, 1500},
                              .decode = true,
                              .splits = 5}));
  t.push_back(attention_case({.head_dim = 64,
                              .n_q_heads = 16,
                              .n_kv_heads = 4,
                              .q_lens = {1},
                              .kv_lens = {150},
                              .decode = true,
                              .splits = kSplitsAuto,
                              .kv_bound = 256}));
  t.push_back(attention_case({.head_dim = 128,
                              .n_q_heads = 64,
                              .n_kv_heads = 4,
                              .q_lens = {1, 1},
                              .kv_lens = {150, 1500},
                              .decode = true,
                              .splits = 5}));
  t.push_back(attention_case({.head_dim = 64,
                              .n_q_heads = 16,
                              .n_kv_heads = 1,
                              .q_lens = q3,
                              .kv_lens = {17, 150, 700},
                              .decode = true,
                              .splits = kSplitsAuto}));
  // Cache blocks of 8 (a table lookup per key) and of 32 (two 16-key steps per block).
  t.push_back(attention_case({.head_dim = 128,
                              .n_q_heads = 32,
                              .n_kv_heads = 4,
                              .q_lens = q3,
                              .kv_lens = {17, 150, 1500},
                              .decode = true,
                              .splits = 5,
                              .block_size = 8}));
  t.push_back(attention_case({.head_dim = 128,
                              .n_q_heads = 32,
                              .n_kv_heads = 4,
                              .q_lens = q3,
                              .kv_lens = {15, 150, 1500},
                              .decode = true,
                              .splits = 7,
                              .block_size = 32}));
  // The split kernel's settled keys loaded before its wait and the new token's after it: steps
  // that straddle blocks at varying offsets (blocks of 24), and a split that holds only the new
  // key (305 keys in splits of 304: nothing to load before the wait).
  t.push_back(attention_case({.head_dim = 64, .n_q_heads = 16, .n_kv_heads = 4, .q_lens = q3,
                              .kv_lens = {23, 150, 1500}, .decode = true, .splits = 5, .block_size = 24}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = q3,
                              .kv_lens = {305, kEmptyContext, 1500}, .decode = true, .splits = 5}));
  // The splits merged across a thread block cluster (cluster_merge): batch 1 as the engine runs
  // it (8 splits at contexts 17 and 150; 1500 takes 16, past a cluster: the workspace merge), an
  // odd count with an empty context, 2 splits at d 64 with 16 q heads per kv head, and blocks of
  // 8.
  for (int ctx : {17, 150, 1500})
    t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = {1}, .kv_lens = {ctx},
                                .decode = true, .splits = kSplitsAuto, .kv_bound = bucket(ctx),
                                .cluster_merge = true}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = q3, .kv_lens = kv3,
                              .decode = true, .splits = 5, .cluster_merge = true}));
  t.push_back(attention_case({.head_dim = 64, .n_q_heads = 64, .n_kv_heads = 4, .q_lens = q3,
                              .kv_lens = {16, kEmptyContext, 700}, .decode = true, .splits = 2,
                              .cluster_merge = true}));
  t.push_back(attention_case({.head_dim = 128, .n_q_heads = 32, .n_kv_heads = 4, .q_lens = q3,
                              .kv_lens = {17, 150, 1500}, .decode = true, .splits = 7, .block_size = 8,
                              .cluster_merge = true}));
  // More pairs: 31 sequences (124 pairs, 2 splits on an H200) and 40 (160 pairs, 1 split) of random
  // lengths, one without keys.
  for (int seqs : {31, 40}) {
    std::vector<int> kv(seqs, 0);
    kv[0] = kEmptyContext;
    kv[1] = 16;
    kv[2] = 17;
    t.push_back(attention_case({.head_dim = 128,
                                .n_q_heads = 32,
                                .n_kv_heads = 4,
                                .q_lens = std::vector<int>(seqs, 1),
                                .kv_lens = kv,
                                .random_kv_max = 700,
                                .decode = true,
                                .splits = kSplitsAuto}));
  }

  // MoE routing.
  for (int E : {128, 16, 60, 256})  // 1, 2, 4 and 8 slots a lane (512: route_small below)
    for (bool renorm : {true, false})
      for (bool bf16_logits : {false, true})
        t.push_back(router_case({.tokens = 67, .experts = E, .top_k = E >= 64 ? 8 : 4, .renormalize = renorm,
                                 .bf16_logits = bf16_logits}));
  for (int tokens : {1, 64, 300})  // 300 tokens: every one also picks expert 5
    t.push_back(align_case({.tokens = tokens, .experts = 128, .top_k = 8, .hot = tokens == 300 ? 5 : -1}));
  // a prefill's pairs: on many blocks (a workspace), and on one block in several rounds of its
  // batched passes, the last partial
  t.push_back(align_case({.tokens = 8000, .experts = 128, .top_k = 8, .hot = 9}));
  t.push_back(align_case({.tokens = 2100, .experts = 128, .top_k = 8, .hot = 9, .one_block = true}));
  // Expert parallel: one rank's experts of the routing (first, last and a middle quarter)
  for (auto [tokens, expert0, local] : {std::tuple{1, 0, 64}, {64, 64, 64}, {300, 32, 32}, {5000, 40, 48}})
    t.push_back(align_case({.tokens = tokens, .experts = 128, .top_k = 8, .hot = tokens >= 300 ? 40 : -1,
                            .expert0 = expert0, .local_experts = local}));
  // The many-token expert path's gather (and its pair → row map), a hot expert included.
  t.push_back(gather_sorted_case({.tokens = 300, .experts = 128, .top_k = 8, .hidden = 2048, .hot = 5}));
  t.push_back(gather_sorted_case({.tokens = 37, .experts = 16, .top_k = 4, .hidden = 136}));
  for (int E : {128, 60, 16})
    for (int tokens : {1, 3, 8})
      for (bool renorm : {true, false})
        t.push_back(route_small_case({.tokens = tokens, .experts = E, .top_k = E >= 64 ? 8 : 4,
                                      .hidden = E == 60 ? 1000 : 2048, .renormalize = renorm}));
  // the MLP's add + RMSNorm fused in front: 1 and 2 tokens (the most that fit at hidden 2048),
  // hidden 1000 (a partial weight chunk), 4096 (one token fits), 512 experts
  for (auto [tokens, E, H] :
       {std::tuple{1, 128, 2048}, {2, 128, 2048}, {3, 60, 1000}, {1, 512, 2048}, {1, 128, 4096}})
    t.push_back(route_small_case({.tokens = tokens, .experts = E, .top_k = E >= 64 ? 8 : 4, .hidden = H,
                                  .norm = true}));
  // one token without the align (the engine's one-token step), with and without the norm
  for (bool norm : {false, true})
    t.push_back(route_small_case({.tokens = 1, .experts = 128, .top_k = 8, .hidden = 2048, .norm = norm,
                                  .skip_align = true}));
  // Qwen3-Next: 512 experts, top-10
  for (int tokens : {1, 8})
    t.push_back(route_small_case({.tokens = tokens, .experts = 512, .top_k = 10, .hidden = 2048}));
  t.push_back(align_case({.tokens = 300, .experts = 512, .top_k = 10, .hot = 7}));
  // The top-k's selection: top-1, 8 and 10 over 128, 60 (a partial slot), 33 (one expert in a
  // second slot), 256 and 512 experts, most with exact ties that the lower id must break (router
  // row e = row e % tie: at tie 16 the top-8 is one group of 8 equal logits, at tie 3 every logit
  // is one of three values)
  for (auto [E, K, tie] : {std::tuple{128, 1, 0}, {128, 1, 3}, {128, 8, 16}, {60, 10, 7}, {33, 4, 2},
                           {256, 8, 5}, {512, 10, 100}})
    for (int tokens : {1, 8})
      for (bool renorm : {true, false})
        t.push_back(route_small_case({.tokens = tokens, .experts = E, .top_k = K, .hidden = 2048,
                                      .renormalize = renorm, .tie_period = tie}));
  // The cluster form: the engine's one-token step with and without the norm, 2 and 8 tokens,
  // ties, 60 experts (warps without one), 256 and 512 (warps with 2 and 4), the align, expert
  // parallel; the same checks, so the same bits as the ticket form.
  for (const RouteSmallShape& c : std::initializer_list<RouteSmallShape>{
           {.tokens = 1, .experts = 128, .top_k = 8, .hidden = 2048, .skip_align = true},
           {.tokens = 1, .experts = 128, .top_k = 8, .hidden = 2048, .norm = true, .skip_align = true},
           {.tokens = 2, .experts = 128, .top_k = 8, .hidden = 2048, .norm = true},
           {.tokens = 1, .experts = 128, .top_k = 8, .hidden = 4096, .norm = true},
           {.tokens = 8, .experts = 128, .top_k = 8, .hidden = 2048, .renormalize = false},
           {.tokens = 8, .experts = 128, .top_k = 8, .hidden = 2048, .tie_period = 16},
           {.tokens = 3, .experts = 60, .top_k = 4, .hidden = 1000, .norm = true},
           {.tokens = 1, .experts = 256, .top_k = 8, .hidden = 4096, .norm = true, .tie_period = 5},
           {.tokens = 8, .experts = 512, .top_k = 10, .hidden = 2048},
           {.tokens = 8, .experts = 128, .top_k = 8, .hidden = 2048, .expert0 = 0, .local_experts = 32}}) {
    RouteSmallShape shape = c;
    shape.cluster = true;
    t.push_back(route_small_case(shape));
  }
  // Expert parallel: the router over every expert, the align of one rank's
  for (auto [tokens, E, expert0, local] : {std::tuple{1, 128, 64, 64}, {8, 128, 0, 32}, {3, 16, 8, 8}})
    t.push_back(route_small_case({.tokens = tokens, .experts = E, .top_k = E >= 64 ? 8 : 4, .hidden = 2048,
                                  .expert0 = expert0, .local_experts = local}));

  // Expert GEMM: each shape's gate+up and down on a grid over all experts, gate+up+SiLU over the
  // experts with pairs (the engine's launch), in every weight format. fp8 (groups of 128): a
  // partial last group at k 64, 96 and 608, a partial last 64-k window at 96 and 608; nvfp4: a
  // partial last 128-k window at k 64, 96 and 608.
  const MoeGemmShape gemm_shapes[] = {
      {.tokens = 9, .experts = 16, .top_k = 4, .hidden = 128, .inter = 64},              // qwen2_moe_tiny-like
      {.tokens = 50, .experts = 16, .top_k = 4, .hidden = 128, .inter = 128, .hot = 2},  // a 50-row expert: two passes
      {.tokens = 3, .experts = 8, .top_k = 2, .hidden = 96, .inter = 64},                // k not a multiple of the 256 chunk
      {.tokens = 40, .experts = 8, .top_k = 2, .hidden = 608, .inter = 96, .hot = 1},    // 3 chunks, last partial; 2 passes
      {.tokens = 1, .experts = 64, .top_k = 8, .hidden = 2048, .inter = 768},            // Qwen3 shapes
      {.tokens = 12, .experts = 32, .top_k = 8, .hidden = 2048, .inter = 768, .hot = 7},
  };
  for (WeightFormat format : {WeightFormat::bf16, WeightFormat::fp8_block, WeightFormat::nvfp4,
                              WeightFormat::int8, WeightFormat::int4})
    for (MoeGemmShape s : gemm_shapes)
      for (MoeGemmStage stage : {MoeGemmStage::gate_up, MoeGemmStage::gate_up_silu, MoeGemmStage::down}) {
        s.stage = stage;
        s.gemv = false;
        s.active_experts = stage == MoeGemmStage::gate_up_silu;
        s.format = format;
        t.push_back(moe_gemm_case(s));
        // the decode GEMV on the shapes with few tokens (every stage over the active experts)
        if (s.tokens <= kernels::kMoeGemvMaxTokens) {
          s.active_experts = s.gemv = true;
          t.push_back(moe_gemm_case(s));
          // one token: the experts straight from topk_ids, as the engine's gate+up takes them
          if (s.tokens == 1) {
            s.direct = true;
            t.push_back(moe_gemm_case(s));
            s.direct = false;
          }
          // 4-bit weights: the tensor-core walk above, the CUDA-core one here
          if (format == WeightFormat::nvfp4 || format == WeightFormat::int4) {
            s.cuda_cores = true;
            t.push_back(moe_gemm_case(s));
            s.cuda_cores = false;
          }
        }
      }
  // One token's down GEMV with the MoE combine and the residual add in it (moe_gemv_combine):
  // the Qwen3 shape, top-10 (Qwen3-Next's), k 64 (a lane's one granule), and for the rows a warp
  // takes (bf16) R = 2 at k 1024 with top-16 (512 threads) and R = 1 at k 2048; every format.
  for (WeightFormat format : {WeightFormat::bf16, WeightFormat::fp8_block, WeightFormat::nvfp4,
                              WeightFormat::int8, WeightFormat::int4})
    for (MoeGemmShape s : {MoeGemmShape{.tokens = 1, .experts = 64, .top_k = 8, .hidden = 2048, .inter = 768},
                           MoeGemmShape{.tokens = 1, .experts = 32, .top_k = 10, .hidden = 512, .inter = 256},
                           MoeGemmShape{.tokens = 1, .experts = 16, .top_k = 4, .hidden = 256, .inter = 64},
                           MoeGemmShape{.tokens = 1, .experts = 32, .top_k = 16, .hidden = 256, .inter = 1024},
                           MoeGemmShape{.tokens = 1, .experts = 16, .top_k = 8, .hidden = 128, .inter = 2048}}) {
      s.stage = MoeGemmStage::down;
      s.active_experts = s.gemv = s.direct = s.combine = true;
      s.format = format;
      t.push_back(moe_gemm_case(s));
    }
  // The bf16 tiled GEMM on TMA + wgmma (Hopper) on the same shapes: partial 64-row boxes (I 64
  // and 96 with SiLU, H 96 and 608 down), k past the last 64-input stage (96, 608), hot experts
  // over two passes of 32 pairs, and the Qwen3 shapes with more tiles than CTAs (each CTA's ring
  // wraps over several tiles); over every expert and over the active list.
  for (MoeGemmShape s : gemm_shapes)
    for (MoeGemmStage stage : {MoeGemmStage::gate_up, MoeGemmStage::gate_up_silu, MoeGemmStage::down})
      for (bool active : {false, true}) {
        s.stage = stage;
        s.active_experts = active;
        s.tma = true;
        t.push_back(moe_gemm_case(s));
      }
  // W8A8 on the fp8 grouped GEMM (e4m3 rows, k % 128 == 0): two passes of a hot expert, three
  // chunks with a one-group last chunk (k 640), the Qwen3 shapes; every stage.
  const MoeGemmShape w8a8_shapes[] = {
      {.tokens = 50, .experts = 16, .top_k = 4, .hidden = 128, .inter = 128, .hot = 2},
      {.tokens = 40, .experts = 8, .top_k = 2, .hidden = 640, .inter = 128, .hot = 1},
      {.tokens = 1, .experts = 64, .top_k = 8, .hidden = 2048, .inter = 768},
      {.tokens = 12, .experts = 32, .top_k = 8, .hidden = 2048, .inter = 768, .hot = 7},
  };
  // The same on moe_gemm_tma (one 128-input stage per scale group: k 640 is five stages).
  for (MoeGemmShape s : w8a8_shapes)
    for (MoeGemmStage stage : {MoeGemmStage::gate_up, MoeGemmStage::gate_up_silu, MoeGemmStage::down})
      for (bool tma : {false, true}) {
        s.stage = stage;
        s.active_experts = stage == MoeGemmStage::gate_up_silu;
        s.format = WeightFormat::fp8_block;
        s.w8a8 = true;
        s.tma = tma;
        t.push_back(moe_gemm_case(s));
      }
  // The many-token path's expert GEMM on wgmma: experts spanning several 128-row tiles (a hot
  // one), empty experts, a partial last tile of output columns (I 72 of 128, H 136 of 256) and
  // of k (72, 136: a last slice of 8 of 64), more experts than one pass of the tile lookup
  // takes (160 > 128), k of a single slice (H 64, I 48) over more tiles than an H200 has SMs; the
  // cuBLAS fallback on the same shapes.
  const SortedExpertGemmShape sorted_shapes[] = {
      {.tokens = 300, .experts = 16, .top_k = 4, .hidden = 256, .inter = 128, .hot = 3},
      {.tokens = 400, .experts = 160, .top_k = 4, .hidden = 256, .inter = 128, .hot = 150},
      {.tokens = 40, .experts = 64, .top_k = 2, .hidden = 136, .inter = 72, .hot = 9},
      {.tokens = 160, .experts = 128, .top_k = 8, .hidden = 2048, .inter = 768, .hot = 5},
      {.tokens = 10000, .experts = 8, .top_k = 2, .hidden = 64, .inter = 48, .hot = 3},
  };
  for (SortedExpertGemmShape s : sorted_shapes)
    for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
      for (bool cublas : {false, true}) {
        s.stage = stage;
        s.cublas = cublas;
        s.gather = false;
        t.push_back(sorted_expert_gemm_case(s));
        if (!cublas && stage == MoeGemmStage::gate_up_silu) {
          s.gather = true;  // the engine's gate+up: rows gathered in the kernel
          t.push_back(sorted_expert_gemm_case(s));
        }
        if (!cublas) {  // sorted rows by TMA (the engine's down stage; rows past a tile's own read too)
          s.gather = false;
          s.tma_rows = true;
          t.push_back(sorted_expert_gemm_case(s));
          s.tma_rows = false;
        }
      }
  // W8A8 (FP8 tensor cores; k and output columns multiples of 16): H 144 and I 80 end in a
  // partial 128-group of k and a partial last tile of columns (and of the activations' scale
  // group); a hot expert over several row tiles; the 30B shape.
  const SortedExpertGemmShape fp8_shapes[] = {
      {.tokens = 300, .experts = 16, .top_k = 4, .hidden = 256, .inter = 128, .hot = 3},
      {.tokens = 40, .experts = 64, .top_k = 2, .hidden = 144, .inter = 80, .hot = 9},
      {.tokens = 160, .experts = 128, .top_k = 8, .hidden = 2048, .inter = 768, .hot = 5},
  };
  for (SortedExpertGemmShape s : fp8_shapes)
    for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
      for (bool gather : {false, true})
        for (bool block : {false, true}) {
          if (gather && stage == MoeGemmStage::down) continue;
          s.stage = stage;
          s.gather = gather;
          s.fp8 = true;
          s.block_scales = block;  // I 80 / H 144: not 128-aligned, so the kernel keeps per-row scales
          t.push_back(sorted_expert_gemm_case(s));
        }
  // the persistent walk with few blocks, so that each takes many tiles on small shapes too: ring
  // slots and the tile hand-off reused across tiles, k shorter than the ring (H 144: 2 stages),
  // one-slab tiles between full ones
  for (int blocks : {1, 3})
    for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down}) {
      SortedExpertGemmShape s = fp8_shapes[1];
      s.stage = stage;
      s.gather = stage == MoeGemmStage::gate_up_silu;
      s.fp8 = true;
      s.max_blocks = blocks;
      t.push_back(sorted_expert_gemm_case(s));
      s = fp8_shapes[0];
      s.stage = stage;
      s.fp8 = true;
      s.block_scales = true;
      s.max_blocks = blocks;
      t.push_back(sorted_expert_gemm_case(s));
    }
  // The same for the bf16 kernel's walk: k of 1 to 4 slices (no more than the ring's 4 slots, so
  // tiles share a lap of it; H 64 / I 48 over many tiles), the 30B shape's 12 and 32 (the ring
  // wraps inside a tile), one-slab tiles between full ones, empty experts; the engine's gather
  // (gate+up) and TMA rows (down), and sorted rows by cp.async on shape 0.
  for (int blocks : {1, 3})
    for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
      for (int shape : {0, 2, 3, 4}) {
        SortedExpertGemmShape s = sorted_shapes[shape];
        s.stage = stage;
        s.gather = shape != 0 && stage == MoeGemmStage::gate_up_silu;
        s.tma_rows = shape != 0 && stage == MoeGemmStage::down;
        s.max_blocks = blocks;
        t.push_back(sorted_expert_gemm_case(s));
      }
  // moe_gemv at every pair count it rounds to (1, 2, 4, 8) with a hot expert holding all tokens;
  // on 4-bit weights those pairs are the tensor-core walk's B columns (sentinels past them)
  for (WeightFormat format : {WeightFormat::bf16, WeightFormat::nvfp4, WeightFormat::int4})
    for (int tokens : {2, 5, 8})
      for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
        t.push_back(moe_gemm_case({.tokens = tokens, .experts = 16, .top_k = 4, .hidden = 256, .inter = 128,
                                   .hot = 3, .stage = stage, .active_experts = true, .format = format,
                                   .gemv = true}));

  // Dense GEMM and sampling.
  t.push_back(linear_case({.m = 5, .n = 1000, .k = 256, .fp32_out = false}));
  t.push_back(linear_case({.m = 5, .n = 1000, .k = 256, .fp32_out = true}));
  t.push_back(sample_greedy_case({.batch = 9, .vocab = 151936, .plant_tie = true}));
  // 6 rows each of: plain top-k, top-p only, wide k, greedy, top_p 0, k 1, k above the cap, narrow
  t.push_back(top_k_top_p_case({.batch = 48, .vocab = 20000,
                                .controls = {{1.0f, 1.0f, 50}, {0.7f, 0.9f, 0}, {1.5f, 0.5f, 1000}, {0.0f, 0.9f, 40},
                                             {1.0f, 0.0f, 20}, {1.0f, 1.0f, 1}, {2.0f, 0.95f, 5000}, {0.3f, 0.8f, 7}},
                                .quantize_rows = true}));

  // Dense GEMM on compressed weights: the decode GEMV (m <= 8; k 128 and 256 leave lanes
  // without a granule, n 37 a last warp with rows past n) and dequantize + cuBLAS (m 9, 40);
  // fp8 k 1040 ends in a partial 128-group, nvfp4 k 1056 has 33 granules (one lane takes two).
  // int8 (groups of 16) and int4 (32, with mins) as fp8 and nvfp4: the same granule sizes.
  for (WeightFormat f : {WeightFormat::fp8_block, WeightFormat::nvfp4, WeightFormat::int8,
                         WeightFormat::int4}) {
    const bool byte_codes = f == WeightFormat::fp8_block || f == WeightFormat::int8;
    const int odd_k = f == WeightFormat::fp8_block ? 1040 : f == WeightFormat::int8 ? 1056 + 32 : 1056;
    for (int m : {1, 5, 8, 9, 40})
      for (auto [n, k] : {std::pair{512, 2048}, {1000, 128}, {1000, odd_k}})
        t.push_back(quant_linear_case({.m = m, .n = n, .k = k, .format = f}));
    for (int m : {3, 5}) t.push_back(quant_linear_case({.m = m, .n = 37, .k = 256, .format = f}));
    // 257 granules per row: several chunks per warp, the last with one granule (1, 2 rows per warp)
    for (int m : {1, 4, 8})
      t.push_back(quant_linear_case({.m = m, .n = 300, .k = byte_codes ? 4112 + (f == WeightFormat::int8 ? 16 : 0) : 8224, .format = f}));
    for (int m : {1, 40}) t.push_back(quant_linear_case({.m = m, .n = 1000, .k = 2048, .fp32_out = true, .format = f}));
  }
  for (bool fp32_out : {false, true})  // bf16 weights: cuBLAS through the same entry
    t.push_back(quant_linear_case({.m = 5, .n = 1000, .k = 256, .fp32_out = fp32_out, .format = WeightFormat::bf16}));
  // The persistent bulk-copy GEMV on bf16 weights (gemv_stream, sm_90a) at m 1, 2, 8 (1, 2, 4
  // rows per warp): qkv and o_proj (several stages per CTA, the last partial; o_proj's 8 KB rows
  // give fewer groups per stage than warps), n 1000 and 37 (rows split unevenly over the CTAs; 37:
  // one row each), k 528 (1056-byte rows: 16-byte but not 128-byte multiples; a lane with one
  // granule more), n 32768 at k 1024 (16 stages per CTA: the ring wraps four times); fp32 out.
  for (int m : {1, 2, 8})
    for (auto [n, k] :
         {std::pair{5120, 2048}, {2048, 4096}, {1000, 2048}, {37, 512}, {300, 528}, {32768, 1024}})
      t.push_back(quant_linear_case(
          {.m = m, .n = n, .k = k, .format = WeightFormat::bf16, .stream = true}));
  for (int m : {1, 8})
    t.push_back(quant_linear_case({.m = m,
                                   .n = 1000,
                                   .k = 2048,
                                   .fp32_out = true,
                                   .format = WeightFormat::bf16,
                                   .stream = true}));
  // The one-token combine + add + norm formed inside it (gemv_stream_combine_norm): the 30B
  // layer's qkv (top-8, hidden 2048), the seed class's (hidden 4096: two vectors a thread), top-10
  // with 1 + w, and hidden 520 (fewer vectors than threads; 37 rows).
  for (GemvCombineNormShape c : {GemvCombineNormShape{8, 2048, 5120}, {8, 4096, 5120}, {10, 2048, 1000, 1.f},
                                 {4, 520, 37}})
    t.push_back(gemv_combine_norm_case(c));
  for (auto [f, cols] : {std::pair{WeightFormat::fp8_block, 1040}, {WeightFormat::fp8_block, 2048},
                         {WeightFormat::nvfp4, 1056}, {WeightFormat::nvfp4, 2048}, {WeightFormat::bf16, 272},
                         {WeightFormat::int8, 1056}, {WeightFormat::int8, 2048}, {WeightFormat::int4, 1056},
                         {WeightFormat::int4, 2048}})
    t.push_back(dequantize_case({.rows = 37, .cols = cols, .format = f}));
  // fp8: a partial last group at 1040 (group 128) and 208 (group 64)
  t.push_back(quantize_case({.rows = 37, .cols = 1040, .format = WeightFormat::fp8_block, .group = 128}));
  t.push_back(quantize_case({.rows = 16, .cols = 2048, .format = WeightFormat::fp8_block, .group = 128}));
  t.push_back(quantize_case({.rows = 9, .cols = 208, .format = WeightFormat::fp8_block, .group = 64}));
  // group-major scales (kernels::Fp8BlockGemm's activations): the vector path (whole groups of
  // 128) and a partial last group
  for (int cols : {2048, 1040})
    t.push_back(quantize_case(
        {.rows = 37, .cols = cols, .format = WeightFormat::fp8_block, .group = 128, .group_major = true}));
  // Block-scaled FP8 GEMM (cuBLASLt, Hopper): k of 1 and 3 scale blocks (a block-grid pitch
  // padded to four), m 12 and 36 (not multiples of the tile), the 30B projections' shapes.
  for (auto [m, n, k] : {std::tuple{12, 256, 128}, {36, 384, 384}, {64, 512, 128}, {40, 128, 256},
                         {264, 5120, 2048}, {128, 2048, 4096}})
    t.push_back(fp8_block_gemm_case({.m = m, .n = n, .k = k}));
  t.push_back(quantize_case({.rows = 37, .cols = 1056, .format = WeightFormat::nvfp4}));
  t.push_back(quantize_case({.rows = 8, .cols = 4096, .format = WeightFormat::nvfp4}));
  t.push_back(quantize_case({.rows = 37, .cols = 1056, .format = WeightFormat::int4}));
  t.push_back(quantize_case({.rows = 8, .cols = 4096, .format = WeightFormat::int4}));

  // Gated DeltaNet (Qwen3-Next linear attention). Every step mixes sequences starting at position
  // 0 (their slots hold random values that must be ignored) with ones continuing a random state;
  // spare slots must stay untouched. Lengths around the kernels' steps: 1, 2 (< K - 1: the new
  // conv state keeps old inputs), 7, 16/17/33 (the delta rule stages 16 tokens), 64/65/130 (the
  // prefill conv steps 64 tokens). Dims: Qwen3-Next-80B's rank (16/32 heads of 128), the tiny
  // fixture's (4/8 of 32), dk != dv, r = 1 and 3.
  const kernels::GdnDims next80b{16, 32, 128, 128, 4}, tiny{4, 8, 32, 32, 4};
  using kernels::DeltaRuleForm;
  auto step = [](kernels::GdnDims d, std::vector<int> q_lens, std::vector<int> first_pos, int pad_seq,
                 bool decode, DeltaRuleForm form = DeltaRuleForm::by_length) {
    return GdnStepShape{.nk = d.nk, .nv = d.nv, .dk = d.dk, .dv = d.dv, .conv_kernel = d.conv_kernel,
                        .q_lens = std::move(q_lens), .first_pos = std::move(first_pos), .pad_seq = pad_seq,
                        .decode = decode, .form = form};
  };
  const GdnStepShape gdn_steps[] = {
      step(next80b, {1, 7, 64, 130, 2, 17}, {0, 5, 0, 300, 9, 33}, -1, false),
      // an empty sequence, a padding row (slot -1)
      step(tiny, {130, 1, 0, 65, 7, 16, 33, 2}, {0, 17, 3, 1, 0, 40, 12, 0}, 1, false),
      step({2, 4, 128, 64, 3}, {20, 5, 1}, {11, 0, 4}, -1, false),
      step({1, 3, 32, 96, 2}, {9, 1, 70}, {0, 8, 33}, -1, false),
      step({2, 2, 64, 64, 4}, {40, 3}, {0, 9}, -1, false),
      // the chunked delta rule (64-token chunks; by_length takes it for runs >= 48 at dk 64/128,
      // dv % 64) and the recurrent one on the same steps: lengths around a chunk, 0, 1, 47/48 at
      // the switch, continuing states, a long padding row at a nonzero position; dv of 1-4 tiles
      step(next80b, {63, 64, 65, 200, 1, 47, 300, 48}, {0, 9, 300, 0, 4, 17, 5, 0}, 6, false),
      step(next80b, {63, 64, 65, 200, 1, 47, 300, 48}, {0, 9, 300, 0, 4, 17, 5, 0}, 6, false, DeltaRuleForm::chunked),
      step(next80b, {63, 64, 65, 200, 1, 47, 300, 48}, {0, 9, 300, 0, 4, 17, 5, 0}, 6, false, DeltaRuleForm::recurrent),
      step({2, 4, 64, 64, 4}, {65, 0, 130, 1, 33, 63}, {3, 0, 0, 7, 1, 64}, 2, false),
      step({2, 4, 64, 64, 4}, {65, 0, 130, 1, 33, 63}, {3, 0, 0, 7, 1, 64}, 2, false, DeltaRuleForm::chunked),
      step({2, 4, 64, 64, 4}, {65, 0, 130, 1, 33, 63}, {3, 0, 0, 7, 1, 64}, 2, false, DeltaRuleForm::recurrent),
      step({1, 3, 128, 256, 4}, {100, 64, 7}, {12, 0, 3}, -1, false, DeltaRuleForm::chunked),
      step({2, 6, 64, 192, 4}, {65, 17, 300}, {1, 0, 8}, 0, false, DeltaRuleForm::chunked),
      // decode batches (one token each) with a padding row; the decode kernels on mixed lengths
      step(next80b, std::vector<int>(23, 1), {0, 41, 7, 1000}, 5, true),
      step({2, 4, 128, 64, 4}, std::vector<int>(9, 1), {3, 0}, -1, true),
      step(tiny, {1, 7, 64, 130, 2}, {0, 5, 0, 300, 1}, -1, true),
  };
  for (const GdnStepShape& s : gdn_steps) {
    if (s.form == DeltaRuleForm::by_length) t.push_back(causal_conv_case(s));  // forced forms: the rule only
    t.push_back(gated_delta_rule_case(s));
  }
  t.push_back(gated_rmsnorm_case({.tokens = 37, .nk = 16, .nv = 32, .dk = 128, .dv = 128}));
  t.push_back(gated_rmsnorm_case({.tokens = 19, .nk = 4, .nv = 8, .dk = 32, .dv = 32, .in_place = true}));
  t.push_back(gated_rmsnorm_case({.tokens = 5, .nk = 2, .nv = 6, .dk = 64, .dv = 256}));
  return t;
}

std::vector<OpCaseDef> op_cases_bench() {
  // Qwen3-30B-A3B: hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8, moe_intermediate
  // 768, vocab 151936; paged cache in blocks of 16.
  constexpr int kH = 2048, kNq = 32, kNkv = 4, kD = 128, kE = 128, kK = 8, kI = 768, kV = 151936;
  constexpr int kQkvWidth = (kNq + 2 * kNkv) * kD, kRoutings = 8;
  constexpr int64_t kRotateBytes = int64_t{256} << 20;  // > the H200's 50 MB L2
  std::vector<OpCaseDef> t;
  auto add = [&](int batch, OpCaseDef d) {
    d.batch = batch;
    t.push_back(std::move(d));
  };
  for (int B : {1, 64, 256}) {
    add(B, embedding_case({.tokens = B, .hidden = kH, .vocab = kV}));
    add(B, rmsnorm_case({.rows = B, .cols = kH, .add = true}));
    // (cos, sin) computed in the kernel, and from the forward's table (the engine's way)
    for (bool table : {false, true})
      add(B, named(qk_norm_rope_case({.tokens = B, .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD,
                                      .position = 191, .table = table}),
                   table ? "qk_norm_rope table" : "qk_norm_rope"));
    // k and v from the fused qkv row into a context-192 cache
    add(B, kv_cache_write_case({.tokens = B, .n_kv_heads = kNkv, .head_dim = kD, .num_slots = B * 192,
                                .k_offset = kNq * kD, .stride = kQkvWidth}));
    for (int ctx : {192, 2048})
      add(B, named(attention_case({.head_dim = kD, .n_q_heads = kNq, .n_kv_heads = kNkv, .q_lens = std::vector<int>(B, 1),
                                   .kv_lens = std::vector<int>(B, ctx), .decode = true, .splits = kSplitsAuto,
                                   .q_pad = 2 * kNkv * kD}),
                   "attn_decode ctx" + std::to_string(ctx)));
    // a batch-1 decode graph's shape: context 150 in the 256 bucket (8 splits)
    if (B == 1)
      add(B, named(attention_case({.head_dim = kD,
                                   .n_q_heads = kNq,
                                   .n_kv_heads = kNkv,
                                   .q_lens = {1},
                                   .kv_lens = {150},
                                   .decode = true,
                                   .splits = kSplitsAuto,
                                   .q_pad = 2 * kNkv * kD,
                                   .kv_bound = 256}),
                   "attn_decode ctx150 bound256"));
    // the same with fewer splits (each a ticket and a partial fewer to merge)
    if (B == 1)
      for (int splits : {1, 2, 4})
        add(B, named(attention_case({.head_dim = kD, .n_q_heads = kNq, .n_kv_heads = kNkv, .q_lens = {1},
                                     .kv_lens = {150}, .decode = true, .splits = splits,
                                     .q_pad = 2 * kNkv * kD, .kv_bound = 256}),
                     "attn_decode ctx150 bound256 splits" + std::to_string(splits)));
    add(B, named(linear_case({.m = B, .n = kE, .k = kH, .fp32_out = true, .w_scale = 0.02f}), "router_gemm (cuBLAS)"));
    add(B, router_case({.tokens = B, .experts = kE, .top_k = kK}));
    if (B <= kernels::kRouteSmallMaxTokens) {
      add(B, route_small_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH}));
      add(B, named(route_small_case({.tokens = B, .experts = 512, .top_k = 10, .hidden = kH}),
                   "route_small E512 k10 (Qwen3-Next)"));
      // with the MLP's add + RMSNorm in front, beside "rmsnorm add" + "moe_route_small"
      if (kernels::moe_route_small_fuses_norm(B, kH))
        add(B, named(route_small_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .norm = true}),
                     "moe_route_small add+norm"));
    }
    // The expert GEMMs rotate over several routings so repeated runs do not just re-read L2.
    add(B, align_case({.tokens = B, .experts = kE, .top_k = kK, .routings = kRoutings}));
    // In each weight format: the compressed rows are "moe_gemm <stage> fp8" / "... nvfp4".
    // Batches of ≤ 8 tokens also as the decode GEMV ("moe_gemv <stage>", the engine's path there).
    for (WeightFormat format : {WeightFormat::bf16, WeightFormat::fp8_block, WeightFormat::nvfp4, WeightFormat::int4})
      for (MoeGemmStage stage : {MoeGemmStage::gate_up, MoeGemmStage::down, MoeGemmStage::gate_up_silu})
        for (bool gemv : {false, true}) {
          if (gemv && B > kernels::kMoeGemvMaxTokens) continue;
          add(B, moe_gemm_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI, .stage = stage,
                                .active_experts = true, .routings = kRoutings, .format = format, .gemv = gemv}));
          // 4-bit decode GEMVs also on CUDA cores ("... cuda-cores"), beside the tensor-core walk
          if (gemv && (format == WeightFormat::nvfp4 || format == WeightFormat::int4))
            add(B, moe_gemm_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI,
                                  .stage = stage, .active_experts = true, .routings = kRoutings,
                                  .format = format, .gemv = true, .cuda_cores = true}));
          // one token's down with the combine and the residual add ("moe_gemv_combine down ...")
          if (gemv && B == 1 && stage == MoeGemmStage::down)
            add(B, moe_gemm_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI,
                                  .stage = stage, .active_experts = true, .routings = kRoutings,
                                  .format = format, .gemv = true, .direct = true, .combine = true}));
        }
    // "moe_gemm_tma <stage>" and "... fp8 w8a8": the engine's bf16 and W8A8 paths there on Hopper
    if (B > kernels::kMoeGemvMaxTokens)
      for (MoeGemmStage stage : {MoeGemmStage::down, MoeGemmStage::gate_up_silu})
        for (bool a8 : {false, true})
          add(B, moe_gemm_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI, .stage = stage,
                                .active_experts = true, .routings = kRoutings,
                                .format = a8 ? WeightFormat::fp8_block : WeightFormat::bf16, .w8a8 = a8,
                                .tma = true}));
    for (MoeGemmStage stage : {MoeGemmStage::down, MoeGemmStage::gate_up_silu})  // "moe_gemm <stage> fp8 w8a8"
      add(B, moe_gemm_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI, .stage = stage,
                            .active_experts = true, .routings = kRoutings, .format = WeightFormat::fp8_block,
                            .w8a8 = true}));
    add(B, silu_mul_case({.rows = B * kK, .inter = kI}));
    add(B, moe_combine_case({.tokens = B, .top_k = kK, .hidden = kH}));
    // Dense projections in each weight format, named by the path quant_linear takes; run() walks
    // copies of W filling kRotateBytes so the decode GEMV reads HBM, not L2.
    for (WeightFormat f : {WeightFormat::bf16, WeightFormat::fp8_block, WeightFormat::nvfp4})
      for (auto [proj, n, k] : {std::tuple{"qkv", kQkvWidth, kH}, {"o_proj", kH, kNq * kD}}) {
        const QuantLinearShape s{.m = B, .n = n, .k = k, .format = f, .w_scale = 0.02f, .rotate_bytes = kRotateBytes};
        add(B, named(quant_linear_case(s), std::string(proj) + " " + weight_format_name(f) + " (" +
                                               quant_linear_path_name(s) + ")"));
      }
    // FP8 weights as W8A8 on cuBLASLt's block-scaled GEMM (the engine's path past 8 rows on Hopper)
    if (B > 8)
      for (auto [proj, n, k] : {std::tuple{"qkv", kQkvWidth, kH}, {"o_proj", kH, kNq * kD}})
        add(B, named(fp8_block_gemm_case({.m = B, .n = n, .k = k}), std::string(proj) + " fp8 (w8a8 cuBLASLt)"));
    // The persistent bulk-copy GEMV (gemv_stream, sm_90a) beside "qkv bf16 (gemv)" on the same
    // rotation of copies; both GEMVs again with one copy of W, resident in L2 after the warm-up
    // ("L2-resident": what they cost when the bytes are no object — launch, ramp, reductions,
    // tail —, the floor for any scheme that moves weights closer ahead of time); gemv_stream on
    // an lm_head-shaped matrix (622 MB: more than L2 as it is) beside "lm_head (cuBLAS)".
    if (B == 1) {
      for (auto [resident, stream] : {std::pair{false, true}, {true, false}, {true, true}})
        for (auto [proj, n, k] : {std::tuple{"qkv", kQkvWidth, kH}, {"o_proj", kH, kNq * kD}})
          add(B, named(quant_linear_case({.m = B,
                                          .n = n,
                                          .k = k,
                                          .format = WeightFormat::bf16,
                                          .w_scale = 0.02f,
                                          .rotate_bytes = resident ? 0 : kRotateBytes,
                                          .stream = stream}),
                       std::string(proj) + " bf16 " + (resident ? "L2-resident " : "") + "(" +
                           (stream ? "gemv_stream" : "gemv") + ")"));
      add(B, named(quant_linear_case({.m = B,
                                      .n = kV,
                                      .k = kH,
                                      .fp32_out = true,
                                      .format = WeightFormat::bf16,
                                      .w_scale = 0.02f,
                                      .stream = true}),
                   "lm_head bf16 (gemv_stream)"));
    }
    add(B, named(linear_case({.m = B, .n = kV, .k = kH, .fp32_out = true, .w_scale = 0.02f}), "lm_head (cuBLAS)"));
    add(B, sample_greedy_case({.batch = B, .vocab = kV}));
    add(B, named(top_k_top_p_case({.batch = B, .vocab = kV, .controls = {{0.8f, 0.95f, 50}}}),
                 "sample_top_k_top_p (k50 p.95)"));
  }
  // Prefill experts (batch column: the tokens): 64 prompts × 128 tokens in one step, as the
  // engine benchmark's prefill; wgmma against the cuBLAS grouped GEMM (+ silu_mul) it replaces.
  for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
    for (bool cublas : {false, true})
      add(8192, sorted_expert_gemm_case({.tokens = 8192, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI,
                                         .stage = stage, .cublas = cublas,
                                         .gather = !cublas && stage == MoeGemmStage::gate_up_silu}));
  // ... and with the sorted rows by TMA (the engine's down stage; gate+up on rows gathered
  // beforehand, which measured slower than gathering in the kernel with the gather's pass added)
  for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
    add(8192, sorted_expert_gemm_case({.tokens = 8192, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI,
                                       .stage = stage, .tma_rows = true}));
  for (MoeGemmStage stage : {MoeGemmStage::gate_up_silu, MoeGemmStage::down})
    for (bool block : {false, true})
      add(8192, sorted_expert_gemm_case({.tokens = 8192, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI,
                                         .stage = stage, .gather = stage == MoeGemmStage::gate_up_silu,
                                         .fp8 = true, .block_scales = block}));
  // Prefill attention: whole prompts, causal (batch column: the tokens), on the kernel the
  // engine takes and on the mma.sync one; at 8 × 1024 also with q rotated as it loads (rope_q,
  // the engine's form: q raw in the fused qkv rows).
  for (auto [prompts, len] : {std::pair{64, 128}, {32, 256}, {8, 512}, {8, 1024}, {1, 2048}})
    for (bool mma_sync : {false, true})
      add(prompts * len, named(attention_case({.head_dim = kD, .n_q_heads = kNq, .n_kv_heads = kNkv,
                                               .q_lens = std::vector<int>(prompts, len),
                                               .kv_lens = std::vector<int>(prompts, len), .q_pad = 0,
                                               .mma_sync = mma_sync}),
                               "attn_prefill " + std::to_string(prompts) + "x" + std::to_string(len) + " causal" +
                                   (mma_sync ? " mma_sync" : "")));
  for (bool rope_q : {false, true})
    add(8192, named(attention_case({.head_dim = kD, .n_q_heads = kNq, .n_kv_heads = kNkv,
                                    .q_lens = std::vector<int>(8, 1024), .kv_lens = std::vector<int>(8, 1024),
                                    .q_pad = 0, .rope_q = rope_q}),
                    std::string("attn_prefill 8x1024 causal qkv-rows") + (rope_q ? " rope_q" : "")));
  // Qwen3-Next-80B's full-attention layers (16 q / 2 kv heads of 256): the wgmma kernel against
  // the CUDA-core one it replaces there.
  for (auto [prompts, len] : {std::pair{64, 128}, {8, 1024}})
    for (bool mma_sync : {false, true})
      add(prompts * len, named(attention_case({.head_dim = 256, .n_q_heads = 16, .n_kv_heads = 2,
                                               .q_lens = std::vector<int>(prompts, len),
                                               .kv_lens = std::vector<int>(prompts, len), .q_pad = 0,
                                               .mma_sync = mma_sync}),
                               "attn_prefill d256 " + std::to_string(prompts) + "x" + std::to_string(len) +
                                   " causal" + (mma_sync ? " cuda-core" : "")));

  // A prefill's align: 65,536 (token, expert) pairs counted and scattered (on many blocks).
  add(8192, align_case({.tokens = 8192, .experts = kE, .top_k = kK}));
  // the MoE's combine + residual add + next norm of a prefill step (the engine's fused form)
  add(8192, moe_combine_case({.tokens = 8192, .top_k = kK, .hidden = kH, .add_rmsnorm = true}));

  // A prefill's rotation with the fused cache write (8192 tokens at positions up to 40000), with
  // (cos, sin) computed in the kernel and from the forward's table.
  for (bool table : {false, true})
    add(8192, named(qk_norm_rope_case({.tokens = 8192, .n_q_heads = kNq, .n_kv_heads = kNkv, .head_dim = kD,
                                       .cache = true, .table = table}),
                    table ? "qk_norm_rope table" : "qk_norm_rope"));
  // ... its k heads alone, as the engine's prefill leaves q to the attention (rope_q)
  add(8192, named(qk_norm_rope_case({.tokens = 8192, .n_q_heads = 0, .n_kv_heads = kNkv, .head_dim = kD,
                                     .cache = true, .table = true}),
                  "qk_norm_rope table k only"));

  // Qwen3-Next-80B-A3B's Gated DeltaNet layers on one GPU: 16 key / 32 value heads of 128, conv
  // kernel 4. Decode continues every sequence's state (2 MB of delta-rule state per sequence and
  // layer, read and written); prefill starts whole prompts at position 0 (batch column: tokens).
  constexpr int kLinNk = 16, kLinNv = 32, kLinD = 128, kConvK = 4;
  for (int B : {1, 64, 256}) {
    const GdnStepShape s{.nk = kLinNk, .nv = kLinNv, .dk = kLinD, .dv = kLinD, .conv_kernel = kConvK,
                         .q_lens = std::vector<int>(B, 1), .first_pos = {191}, .decode = true};
    add(B, causal_conv_case(s));
    add(B, gated_delta_rule_case(s));
    add(B, gated_rmsnorm_case({.tokens = B, .nk = s.nk, .nv = s.nv, .dk = s.dk, .dv = s.dv}));
  }
  // The delta rule's prefill as the engine picks it (chunked for these runs) and in the recurrent
  // form; below and at the switch (runs of 32, kernels/gated_delta_chunked.cuh) both forms forced.
  for (auto [prompts, len] : {std::pair{1, 2048}, {8, 512}, {64, 128}, {64, 32}, {64, 16}}) {
    GdnStepShape s{.nk = kLinNk, .nv = kLinNv, .dk = kLinD, .dv = kLinD, .conv_kernel = kConvK,
                   .q_lens = std::vector<int>(prompts, len), .first_pos = {0}};
    const std::string shape = " " + std::to_string(prompts) + "x" + std::to_string(len);
    if (len >= 512) add(prompts * len, named(causal_conv_case(s), "causal_conv prefill" + shape));
    if (len >= 128) add(prompts * len, named(gated_delta_rule_case(s), "gated_delta_rule prefill" + shape));
    for (auto [form, name] : {std::pair{kernels::DeltaRuleForm::recurrent, " recurrent"},
                              {kernels::DeltaRuleForm::chunked, " chunked"}}) {
      if (form == kernels::DeltaRuleForm::chunked && len >= 128) continue;  // the engine's row above
      s.form = form;
      add(prompts * len, named(gated_delta_rule_case(s), "gated_delta_rule prefill" + shape + name));
    }
  }
  // The expert kernels at the other decode buckets (2, 4, 8 tokens): where the grouped GEMV
  // stops beating the tiled GEMMs (engine/cuda/linear.cpp kExpertGemvMaxTokens), and which tiled
  // GEMM is the faster there (moe_gemm or moe_gemm_tma).
  for (int B : {2, 4, 8})
    for (int kernel = 0; kernel < 3; ++kernel)
      add(B, moe_gemm_case({.tokens = B, .experts = kE, .top_k = kK, .hidden = kH, .inter = kI,
                            .stage = MoeGemmStage::gate_up_silu, .active_experts = true,
                            .routings = kRoutings, .gemv = kernel == 1, .tma = kernel == 2}));
  // The projections of an 8 × 1024-token prefill: bf16 cuBLAS, FP8 decoded to bf16 for cuBLAS,
  // FP8 as W8A8 on cuBLASLt (batch column: tokens).
  constexpr int kPrefillRows = 8192;
  for (auto [proj, n, k] : {std::tuple{"qkv", kQkvWidth, kH}, {"o_proj", kH, kNq * kD}}) {
    for (WeightFormat f : {WeightFormat::bf16, WeightFormat::fp8_block}) {
      const QuantLinearShape s{.m = kPrefillRows, .n = n, .k = k, .format = f, .w_scale = 0.02f};
      add(kPrefillRows, named(quant_linear_case(s), std::string(proj) + " " + weight_format_name(f) + " (" +
                                                        quant_linear_path_name(s) + ")"));
    }
    add(kPrefillRows, named(fp8_block_gemm_case({.m = kPrefillRows, .n = n, .k = k}),
                            std::string(proj) + " fp8 (w8a8 cuBLASLt)"));
  }
  // Dense bf16 projections at 8 rows: gemv_stream (near FMA-bound there, by estimate) against the
  // cuBLAS GEMM quant_linear takes, on the same rotation of copies.
  for (auto [proj, n, k] : {std::tuple{"qkv", kQkvWidth, kH}, {"o_proj", kH, kNq * kD}})
    for (bool stream : {false, true}) {
      const QuantLinearShape s{.m = 8,
                               .n = n,
                               .k = k,
                               .format = WeightFormat::bf16,
                               .w_scale = 0.02f,
                               .rotate_bytes = kRotateBytes,
                               .stream = stream};
      add(8, named(quant_linear_case(s),
                   std::string(proj) + " bf16 (" + quant_linear_path_name(s) + ")"));
    }
  return t;
}

}  // namespace moebatch::ops
