// How the CUDA backend cuts a step into forward calls (engine/cuda/step_chunk.h) and picks decode
// attention's split count (kernels::attention_decode_splits): host code only, so these run in CI
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/cuda/step_chunk.h"
#include "kernels/attention.cuh"

namespace moebatch {
namespace {

constexpr int kBlock = 16, kKvHeads = 4, kSms = 132, kScratch = 999;

ChunkLimits limits() {
  ChunkLimits lim;
  lim.tokens = 64;
  lim.max_num_seqs = 64;
  lim.block_size = kBlock;
  lim.scratch_block = kScratch;
  lim.table_cap = 256;
  lim.num_kv_heads = kKvHeads;
  lim.num_sms = kSms;
  return lim;
}

// One decode token per sequence at contexts `ctx` (the new token is the last), every row
// sampled; sequence s owns blocks 100·s, 100·s + 1, ...
StepBatch decode_batch(const std::vector<int>& ctx) {
  StepBatch b;
  int width = 0;
  for (int c : ctx) width = std::max(width, (c + kBlock - 1) / kBlock);
  b.max_blocks_per_seq = width;
  for (size_t s = 0; s < ctx.size(); ++s) {
    const int pos = ctx[s] - 1;
    b.tokens.push_back(static_cast<int32_t>(7 + s));
    b.positions.push_back(pos);
    b.seq_index.push_back(static_cast<int32_t>(s));
    b.slot_mapping.push_back(static_cast<int32_t>((100 * s + pos / kBlock) * kBlock + pos % kBlock));
    for (int j = 0; j < width; ++j) b.block_tables.push_back(static_cast<int32_t>(100 * s + j));
    b.logits_rows.push_back(static_cast<int32_t>(s));
  }
  return b;
}

TEST(AttentionDecodeSplits, FillTwiceTheSmsWithinTheContextAndTheCap) {
  // (sequence, kv head) pairs that cover the SMs need no split
  EXPECT_EQ(kernels::attention_decode_splits(33, 4, 4096, kSms, 16), 1);
  // one sequence, 4 pairs: bounded by 32-key tiles of the context, then by the cap
  EXPECT_EQ(kernels::attention_decode_splits(1, 4, 256, kSms, 16), 8);
  EXPECT_EQ(kernels::attention_decode_splits(1, 4, 4096, kSms, 16), 16);
  // 16 pairs: 2 · 132 / 16 = 16 blocks a pair at most
  EXPECT_EQ(kernels::attention_decode_splits(4, 4, 4096, kSms, 64), 16);
  // a floor of keys a split: 256 / 64, 256 / 256; below one tile it is the tile
  EXPECT_EQ(kernels::attention_decode_splits(1, 4, 256, kSms, 16, 64), 4);
  EXPECT_EQ(kernels::attention_decode_splits(1, 4, 256, kSms, 16, 256), 1);
  EXPECT_EQ(kernels::attention_decode_splits(1, 4, 256, kSms, 16, 8), 8);
  EXPECT_EQ(kernels::attention_decode_splits(0, 4, 256, kSms, 16), 1);
}

TEST(PrepareChunks, DecodeStepIsPaddedToItsBuckets) {
  const StepBatch b = decode_batch({150, 40, 300});
  for (int min_keys : {32, 128}) {
    ChunkLimits lim = limits();
    lim.min_split_keys = min_keys;
    const std::vector<StepChunk> chunks = prepare_chunks(b, lim);
    ASSERT_EQ(chunks.size(), 1u);
    const StepChunk& c = chunks[0];
    EXPECT_TRUE(c.decode_graph);
    EXPECT_TRUE(c.shape.decode);
    // 3 rows → a batch bucket of 4; the longest context 300 → a kv bucket of 512
    EXPECT_EQ(c.key, std::make_pair(4, 512));
    EXPECT_EQ(c.shape.tokens, 4);
    EXPECT_EQ(c.shape.seqs, 4);
    EXPECT_EQ(c.shape.max_kv_len, 512);
    EXPECT_EQ(c.shape.table_width, 512 / kBlock);
    EXPECT_EQ(c.shape.attn_splits, kernels::attention_decode_splits(4, kKvHeads, 512, kSms, kMaxAttnSplits, min_keys));
    EXPECT_EQ(c.shape.attn_splits, min_keys == 32 ? 16 : 4);
    // the padded row reads and writes only the scratch block, its context one key
    EXPECT_EQ(c.kv_lens, (std::vector<int32_t>{150, 40, 300, 1}));
    EXPECT_EQ(c.q_start, (std::vector<int32_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(c.slots.back(), kScratch * kBlock);
    EXPECT_EQ(c.logits_rows, (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(c.out_rows, (std::vector<int32_t>{0, 1, 2}));
    // each real row's table holds its own blocks, the rest of the row the scratch block
    const int w = c.shape.table_width;
    ASSERT_EQ(c.tables.size(), static_cast<size_t>(4 * w));
    EXPECT_EQ(c.tables[0], 0);
    EXPECT_EQ(c.tables[(150 + kBlock - 1) / kBlock - 1], (150 + kBlock - 1) / kBlock - 1);
    EXPECT_EQ(c.tables[(150 + kBlock - 1) / kBlock], kScratch);
    EXPECT_EQ(c.tables[2 * w + 18], 218);  // row 2 (context 300): block 18 of sequence 2
    EXPECT_EQ(c.tables[3 * w], kScratch);
  }
}

TEST(PrepareChunks, PrefillIsCutAtTheTokenCapacityInPositionOrder) {
  // one 150-token prompt: chunks of 64, 64 and 22 tokens, each one attention sequence whose
  // context ends at its last token (the chunk before wrote the earlier keys)
  StepBatch b;
  b.max_blocks_per_seq = 10;
  for (int j = 0; j < 10; ++j) b.block_tables.push_back(j);
  for (int p = 0; p < 150; ++p) {
    b.tokens.push_back(1000 + p);
    b.positions.push_back(p);
    b.seq_index.push_back(0);
    b.slot_mapping.push_back(p);
  }
  b.logits_rows = {149};
  const std::vector<StepChunk> chunks = prepare_chunks(b, limits());
  ASSERT_EQ(chunks.size(), 3u);
  const int sizes[] = {64, 64, 22};
  for (int i = 0; i < 3; ++i) {
    const StepChunk& c = chunks[static_cast<size_t>(i)];
    EXPECT_FALSE(c.decode_graph);
    EXPECT_FALSE(c.shape.decode);
    ASSERT_EQ(c.tokens.size(), static_cast<size_t>(sizes[i]));
    EXPECT_EQ(c.positions.front(), 64 * i);
    EXPECT_EQ(c.tokens.front(), 1000 + 64 * i);
    EXPECT_EQ(c.q_start, (std::vector<int32_t>{0, sizes[i]}));
    EXPECT_EQ(c.kv_lens, (std::vector<int32_t>{64 * i + sizes[i]}));
    EXPECT_EQ(c.shape.max_q_len, sizes[i]);
  }
  // only the last chunk holds the sampled row (its row 21 → output row 0)
  EXPECT_TRUE(chunks[0].logits_rows.empty());
  EXPECT_EQ(chunks[2].logits_rows, (std::vector<int32_t>{21}));
  EXPECT_EQ(chunks[2].out_rows, (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace moebatch
