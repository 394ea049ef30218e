// Compressed weights kept compressed (engine/packed_weights.h): which tensors of a weight plan a
// GPU backend holds as FP8 blocks or NVFP4, and that the packed bytes a loader uploads decode to
// exactly the values the fp32 loader reads from the same checkpoint (the GPU kernels are checked
// against packed_value in tests/gpu/ops).
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "engine/model_files.h"
#include "engine/packed_weights.h"
#include "tests/engine/reference.h"

namespace moebatch {
namespace {

struct Loaded {
  ModelFiles files;
  ModelPlan plan;
};

Loaded plan_of(const std::string& fixture, int world = 1, int rank = 0,
               ExpertSplit split = ExpertSplit::Intermediate) {
  Loaded l{open_model_files(fixture_path(fixture)), {}};
  ShardSpec spec;
  spec.world = world;
  spec.rank = rank;
  spec.expert_split = split;
  l.plan = plan_weights(l.files.config, spec);
  return l;
}

// Every element of the packed form of `p` equals read_plan_f32's value of it.
void expect_packed_matches_f32(const Loaded& l, const TensorPlan& p, const std::string& what) {
  PackedHost packed;
  ASSERT_TRUE(stored_as_planned(*l.files.weights, l.files.config, p)) << what;
  read_plan_packed(*l.files.weights, l.files.config, p, packed);
  std::vector<float> ref(static_cast<size_t>(p.numel()));
  read_plan_f32(*l.files.weights, l.files.config, p, ref.data());
  const int64_t rows = plan_rows(p), cols = plan_cols(p);
  ASSERT_EQ(packed.data.size() + packed.scales.size() +
                4 * (packed.row_scales.size() + packed.mins.size()),
            packed_sizes(p.format, rows, cols, p.group).total());
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      mismatches += packed_value(p.format, packed, cols, p.group, r, c) !=
                    ref[static_cast<size_t>(r * cols + c)];
  EXPECT_EQ(mismatches, 0) << what;
}

TEST(PackedWeights, Fp8CheckpointKeepsLinearWeightsInFp8) {
  Loaded l = plan_of("qwen3_moe_tiny_fp8");
  assign_weight_formats(l.plan, l.files.config, l.files.weights.get(), Quantization::Auto);
  for (const auto& L : l.plan.layers) {
    for (const TensorPlan* t : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down}) {
      EXPECT_EQ(t->format, WeightFormat::Fp8Block);
      EXPECT_EQ(t->group, 128);
    }
    EXPECT_EQ(L.router.format, WeightFormat::Bf16);
    EXPECT_EQ(L.input_norm.format, WeightFormat::Bf16);
  }
  EXPECT_EQ(l.plan.embed.format, WeightFormat::Bf16);
  EXPECT_EQ(l.plan.lm_head.format, WeightFormat::Bf16);
  for (size_t i = 0; i < l.plan.layers.size(); ++i) {
    const auto& L = l.plan.layers[i];
    expect_packed_matches_f32(l, L.wqkv, "wqkv " + std::to_string(i));
    expect_packed_matches_f32(l, L.wo, "wo " + std::to_string(i));
    expect_packed_matches_f32(l, L.w_gate_up, "w_gate_up " + std::to_string(i));
    expect_packed_matches_f32(l, L.w_down, "w_down " + std::to_string(i));
  }
}

TEST(PackedWeights, Nvfp4CheckpointHonoursExcludedModules) {
  Loaded l = plan_of("qwen3_moe_tiny_nvfp4");
  assign_weight_formats(l.plan, l.files.config, l.files.weights.get(), Quantization::Auto);
  // exclude_modules: model.layers.2.self_attn*, model.layers.3.self_attn* (stored bf16)
  for (size_t i = 0; i < l.plan.layers.size(); ++i) {
    const auto& L = l.plan.layers[i];
    const WeightFormat attn = i >= 2 ? WeightFormat::Bf16 : WeightFormat::Nvfp4;
    EXPECT_EQ(L.wqkv.format, attn) << i;
    EXPECT_EQ(L.wo.format, attn) << i;
    EXPECT_EQ(L.w_gate_up.format, WeightFormat::Nvfp4) << i;
    EXPECT_EQ(L.w_down.format, WeightFormat::Nvfp4) << i;
    EXPECT_EQ(L.router.format, WeightFormat::Bf16) << i;
    if (L.wqkv.format == WeightFormat::Nvfp4) expect_packed_matches_f32(l, L.wqkv, "wqkv");
    expect_packed_matches_f32(l, L.w_gate_up, "w_gate_up " + std::to_string(i));
    expect_packed_matches_f32(l, L.w_down, "w_down " + std::to_string(i));
  }
  EXPECT_EQ(describe_weight_groups(l.plan), "attention nvfp4+bf16, experts nvfp4");
}

// GGUF Q4_K_M: Q4_K tensors stay Int4, Q6_K / Q8_0 ones Int8, a tensor fused from several
// ggml formats (q/k/v in different types) Int8 with groups of 16; F16 / F32 ones bf16. The packed
// values equal the fp32 loader's, on one rank and on both ranks of TP=2 (column shards of o_proj
// and down_proj start on a 32-input group, not on ggml's 256-input super-block).
TEST(PackedWeights, GgufIntegerBlocksStayIntegers) {
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      Loaded l = plan_of("qwen3moe_tiny_q4km", world, rank);
      assign_weight_formats(l.plan, l.files.config, l.files.weights.get(), Quantization::Auto);
      int int4 = 0, int8 = 0;
      for (size_t i = 0; i < l.plan.layers.size(); ++i) {
        const auto& L = l.plan.layers[i];
        for (const TensorPlan* t : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down}) {
          const std::string what = "layer " + std::to_string(i) + " rank " + std::to_string(rank) +
                                   " " + weight_format_name(t->format);
          if (t->format == WeightFormat::Int4) {
            ++int4;
            EXPECT_EQ(t->group, 32) << what;
          } else if (t->format == WeightFormat::Int8) {
            ++int8;
            EXPECT_TRUE(t->group == 16 || t->group == 32) << what;
          } else {
            continue;  // stored as F16 / F32 in the file
          }
          expect_packed_matches_f32(l, *t, what);
        }
        EXPECT_EQ(L.router.format, WeightFormat::Bf16);
      }
      EXPECT_GT(int4, 0) << "no Q4_K tensor kept as int4";
      EXPECT_GT(int8, 0) << "no Q6_K / Q8_0 tensor kept as int8";
      // Decoding everything stays possible.
      assign_weight_formats(l.plan, l.files.config, l.files.weights.get(), Quantization::None);
      EXPECT_EQ(l.plan.layers[0].w_gate_up.format, WeightFormat::Bf16);
    }
  }
}

TEST(PackedWeights, TensorParallelShardsKeepTheirBlocks) {
  // o_proj's 256 inputs split in two start at column 128: a block boundary.
  for (int rank : {0, 1}) {
    Loaded l = plan_of("qwen3_moe_tiny_fp8", 2, rank, ExpertSplit::Expert);
    assign_weight_formats(l.plan, l.files.config, l.files.weights.get(), Quantization::Auto);
    expect_packed_matches_f32(l, l.plan.layers[0].wo, "wo rank " + std::to_string(rank));
    expect_packed_matches_f32(l, l.plan.layers[1].w_down, "w_down rank " + std::to_string(rank));
    Loaded n = plan_of("qwen3_moe_tiny_nvfp4", 2, rank);
    assign_weight_formats(n.plan, n.files.config, n.files.weights.get(), Quantization::Auto);
    expect_packed_matches_f32(n, n.plan.layers[0].w_down, "nvfp4 w_down rank " + std::to_string(rank));
    expect_packed_matches_f32(n, n.plan.layers[1].wo, "nvfp4 wo rank " + std::to_string(rank));
  }
}

TEST(PackedWeights, ShardThroughAnFp8BlockIsRefusedWithTheRemedy) {
  // Experts split along their 128-wide intermediate dim: rank 1's down_proj columns start at 64.
  Loaded l = plan_of("qwen3_moe_tiny_fp8", 2, 1);
  try {
    assign_weight_formats(l.plan, l.files.config, l.files.weights.get(), Quantization::Auto);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("down_proj.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("start at 64"), std::string::npos) << m;
    EXPECT_NE(m.find("--enable-expert-parallel"), std::string::npos) << m;
  }
  // Decoding to bf16 sidesteps the blocks.
  EXPECT_NO_THROW(assign_weight_formats(l.plan, l.files.config, l.files.weights.get(),
                                        Quantization::None));
}

TEST(PackedWeights, QuantizationChoices) {
  Loaded fp8 = plan_of("qwen3_moe_tiny_fp8");
  assign_weight_formats(fp8.plan, fp8.files.config, fp8.files.weights.get(), Quantization::None);
  for (const auto& L : fp8.plan.layers) EXPECT_EQ(L.w_gate_up.format, WeightFormat::Bf16);
  // A bf16 checkpoint: auto keeps bf16; fp8 / nvfp4 quantize every linear weight on load.
  Loaded plain = plan_of("qwen3_moe_tiny");
  assign_weight_formats(plain.plan, plain.files.config, plain.files.weights.get(), Quantization::Auto);
  EXPECT_EQ(plain.plan.layers[0].wqkv.format, WeightFormat::Bf16);
  assign_weight_formats(plain.plan, plain.files.config, plain.files.weights.get(), Quantization::Fp8);
  EXPECT_EQ(plain.plan.layers[0].wqkv.format, WeightFormat::Fp8Block);
  EXPECT_EQ(plain.plan.layers[0].wqkv.group, 128);
  EXPECT_FALSE(stored_as_planned(*plain.files.weights, plain.files.config, plain.plan.layers[0].wqkv));
  assign_weight_formats(plain.plan, plain.files.config, nullptr, Quantization::Nvfp4);
  EXPECT_EQ(plain.plan.layers[0].w_down.format, WeightFormat::Nvfp4);
  EXPECT_EQ(plain.plan.layers[0].router.format, WeightFormat::Bf16);
  EXPECT_EQ(plain.plan.embed.format, WeightFormat::Bf16);
  // an NVFP4 checkpoint asked for fp8 keeps its NVFP4 tensors and quantizes the excluded ones
  Loaded fp4 = plan_of("qwen3_moe_tiny_nvfp4");
  assign_weight_formats(fp4.plan, fp4.files.config, fp4.files.weights.get(), Quantization::Fp8);
  EXPECT_EQ(fp4.plan.layers[0].wqkv.format, WeightFormat::Nvfp4);
  EXPECT_EQ(fp4.plan.layers[3].wqkv.format, WeightFormat::Fp8Block);

  EXPECT_EQ(parse_quantization("nvfp4"), Quantization::Nvfp4);
  EXPECT_EQ(parse_quantization("int4"), Quantization::Int4);
  try {
    parse_quantization("int3");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, none, fp8, nvfp4 or int4"), std::string::npos);
  }
}

TEST(PackedWeights, Sizes) {
  EXPECT_EQ(packed_sizes(WeightFormat::Fp8Block, 3, 200, 128).total(), 3u * 200 + 3 * 2 * 4);
  EXPECT_EQ(packed_sizes(WeightFormat::Nvfp4, 3, 64, 16).total(), 3u * 32 + 3 * 4 + 3 * 4);
  EXPECT_EQ(packed_sizes(WeightFormat::Bf16, 3, 64, 0).total(), 3u * 64 * 2);
}

}  // namespace
}  // namespace moebatch
