#include "engine/weights.h"

#include <algorithm>

#include "common/error.h"
#include "engine/hub_tensor.h"

namespace moebatch {
namespace {

void require_divisible(int64_t n, int world, const char* field) {
  if (n % world != 0) {
    throw InputError(std::string("tensor parallel: ") + field + " = " + std::to_string(n) +
                     " is not divisible by tp = " + std::to_string(world));
  }
}

// Whole tensor [rows, cols] (cols = 1 for 1-D) copied as is.
TensorPlan whole(const std::string& name, std::vector<int64_t> shape) {
  int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  return TensorPlan{shape, {PlanPiece{name, shape, 0, rows, 0, cols, 0}}};
}

// Rows [row0, row0+rows) of a 2-D (or 1-D) tensor.
TensorPlan row_slice(const std::string& name, std::vector<int64_t> full, int64_t row0,
                     int64_t rows) {
  int64_t cols = full.size() > 1 ? full[1] : 1;
  std::vector<int64_t> shape = full;
  shape[0] = rows;
  return TensorPlan{shape, {PlanPiece{name, full, row0, rows, 0, cols, 0}}};
}

// Columns [col0, col0+cols) of a 2-D tensor.
TensorPlan col_slice(const std::string& name, std::vector<int64_t> full, int64_t col0,
                     int64_t cols) {
  return TensorPlan{{full[0], cols}, {PlanPiece{name, full, 0, full[0], col0, cols, 0}}};
}

// A full-attention layer's tensors for this rank's heads.
void plan_attention(const ModelConfig& c, const ShardDims& d, const std::string& a,
                    LayerWeightsT<TensorPlan>& L) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  // Column-parallel q/k/v fused into one matrix: this rank's q heads, then its k and v heads
  // (contiguous rows of each hub tensor), so one GEMM yields [q | k | v] per token. With an
  // output gate q_proj holds [query hd | gate hd] per head; the gate rows of this rank's heads
  // go after v, so q, k and v keep the layout of ungated attention and the gate is one block.
  const int64_t qm = c.attn_output_gate ? 2 : 1;
  const int64_t q_rows = c.num_heads * hd * qm, kv_rows = c.num_kv_heads * hd;
  const int64_t nq = d.num_heads * hd, nkv = d.num_kv_heads * hd;
  const int64_t q0 = d.head0 * hd * qm, kv0 = d.kv_head0 * hd;
  const std::string q_name = a + "q_proj.weight";
  L.wqkv.shape = {nq * qm + 2 * nkv, H};
  if (qm == 1) {
    L.wqkv.pieces = {{q_name, {q_rows, H}, q0, nq, 0, H, 0}};
  } else {
    for (int64_t h = 0; h < d.num_heads; ++h) {
      L.wqkv.pieces.push_back({q_name, {q_rows, H}, q0 + 2 * h * hd, hd, 0, H, h * hd});
      L.wqkv.pieces.push_back(
          {q_name, {q_rows, H}, q0 + (2 * h + 1) * hd, hd, 0, H, nq + 2 * nkv + h * hd});
    }
  }
  L.wqkv.pieces.push_back({a + "k_proj.weight", {kv_rows, H}, kv0, nkv, 0, H, nq});
  L.wqkv.pieces.push_back({a + "v_proj.weight", {kv_rows, H}, kv0, nkv, 0, H, nq + nkv});
  if (c.qkv_bias) {
    L.bqkv.shape = {nq + 2 * nkv};
    L.bqkv.pieces = {{a + "q_proj.bias", {q_rows}, q0, nq, 0, 1, 0},
                     {a + "k_proj.bias", {kv_rows}, kv0, nkv, 0, 1, nq},
                     {a + "v_proj.bias", {kv_rows}, kv0, nkv, 0, 1, nq + nkv}};
  }
  if (c.qk_norm) {
    L.q_norm = whole(a + "q_norm.weight", {hd});
    L.k_norm = whole(a + "k_norm.weight", {hd});
  }
  // Row-parallel o_proj: the input columns of this rank's heads.
  L.wo = col_slice(a + "o_proj.weight", {H, c.num_heads * hd}, d.head0 * hd, d.num_heads * hd);
}

// A Gated DeltaNet layer's tensors for this rank's key-head group (see LayerWeightsT).
void plan_linear_attention(const ModelConfig& c, const ShardDims& d, const std::string& prefix,
                           LayerWeightsT<TensorPlan>& L) {
  const LinearAttentionDims& a = c.linear;
  const int64_t H = c.hidden_size, dk = a.k_head_dim, dv = a.v_head_dim;
  const int64_t r = a.num_v_heads / a.num_k_heads, grp = 2 * dk + 2 * r * dv;
  const int64_t nk = d.lin_k_heads, nv = d.lin_v_heads, kh0 = d.lin_k_head0, vh0 = kh0 * r;
  const int64_t key_dim = a.num_k_heads * dk, value_dim = a.num_v_heads * dv;
  // in_proj_qkvz and in_proj_ba are grouped by key head, so a rank's rows are contiguous.
  L.lin_in.shape = {nk * grp + 2 * nv, H};
  L.lin_in.pieces = {
      {prefix + "in_proj_qkvz.weight", {a.num_k_heads * grp, H}, kh0 * grp, nk * grp, 0, H, 0},
      {prefix + "in_proj_ba.weight", {2 * a.num_v_heads, H}, kh0 * 2 * r, 2 * nv, 0, H, nk * grp}};
  // conv1d.weight [C, 1, K]: this rank's q, k and v channels.
  const int64_t K = a.conv_kernel;
  const std::vector<int64_t> conv_full = {a.conv_dim(), 1, K};
  const std::string conv = prefix + "conv1d.weight";
  L.lin_conv.shape = {2 * nk * dk + nv * dv, K};
  L.lin_conv.pieces = {{conv, conv_full, kh0 * dk, nk * dk, 0, K, 0},
                       {conv, conv_full, key_dim + kh0 * dk, nk * dk, 0, K, nk * dk},
                       {conv, conv_full, 2 * key_dim + vh0 * dv, nv * dv, 0, K, 2 * nk * dk}};
  L.lin_dt_bias = row_slice(prefix + "dt_bias", {a.num_v_heads}, vh0, nv);
  L.lin_a_log = row_slice(prefix + "A_log", {a.num_v_heads}, vh0, nv);
  L.lin_norm = whole(prefix + "norm.weight", {dv});
  L.lin_out = col_slice(prefix + "out_proj.weight", {H, value_dim}, vh0 * dv, nv * dv);
}

// gate rows then up rows of a SwiGLU MLP, each sliced to [i0, i0+n) of width `inter`.
void add_gate_up(TensorPlan& p, const std::string& prefix, int64_t inter, int64_t hidden,
                 int64_t i0, int64_t n, int64_t dst_row0) {
  p.pieces.push_back({prefix + "gate_proj.weight", {inter, hidden}, i0, n, 0, hidden, dst_row0});
  p.pieces.push_back({prefix + "up_proj.weight", {inter, hidden}, i0, n, 0, hidden, dst_row0 + n});
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32:
      return "f32";
    case WeightFormat::Bf16:
      return "bf16";
    case WeightFormat::Fp8Block:
      return "fp8";
    case WeightFormat::Nvfp4:
      return "nvfp4";
    case WeightFormat::Int8:
      return "int8";
    case WeightFormat::Int4:
      return "int4";
  }
  return "?";
}

int64_t TensorPlan::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return shape.empty() ? 0 : n;
}

LinearStateFloats linear_state_floats(const ModelConfig& cfg, const ShardDims& d) {
  const LinearAttentionDims& a = cfg.linear;
  const int64_t channels = 2 * d.lin_k_heads * a.k_head_dim + d.lin_v_heads * a.v_head_dim;
  return {.conv = channels * (a.conv_kernel - 1),
          .ssm = d.lin_v_heads * a.k_head_dim * a.v_head_dim};
}

ShardDims shard_dims(const ModelConfig& c, const ShardSpec& s) {
  if (s.world < 1 || s.world > 64 || s.rank < 0 || s.rank >= s.world) {
    throw InputError("tensor parallel: rank " + std::to_string(s.rank) + " of world " +
                     std::to_string(s.world) + " is invalid (world must be 1..64)");
  }
  ShardDims d;
  const int w = s.world;
  require_divisible(c.num_heads, w, "num_attention_heads");
  if (c.num_kv_heads % w != 0 && w % c.num_kv_heads != 0) {
    throw InputError("tensor parallel: num_key_value_heads = " + std::to_string(c.num_kv_heads) +
                     " neither divides nor is a multiple of tp = " + std::to_string(w));
  }
  d.num_heads = c.num_heads / w;
  d.num_kv_heads = std::max<int64_t>(1, c.num_kv_heads / w);
  d.head0 = s.rank * d.num_heads;
  // With fewer kv heads than ranks, each kv head is replicated on world/nkv consecutive ranks.
  d.kv_head0 = d.head0 / (c.num_heads / c.num_kv_heads);
  require_divisible(c.intermediate_size, w, "intermediate_size");
  d.intermediate = c.intermediate_size / w;
  if (c.num_experts > 0) {
    if (s.expert_split == ExpertSplit::Expert) {
      require_divisible(c.num_experts, w, "num_experts");
      d.num_experts = c.num_experts / w;
      d.expert0 = s.rank * d.num_experts;
      d.moe_intermediate = c.moe_intermediate_size;
    } else {
      require_divisible(c.moe_intermediate_size, w, "moe_intermediate_size");
      d.num_experts = c.num_experts;
      d.moe_intermediate = c.moe_intermediate_size / w;
    }
    require_divisible(c.shared_expert_intermediate_size, w, "shared_expert_intermediate_size");
    d.shared_intermediate = c.shared_expert_intermediate_size / w;
  }
  if (c.num_linear_layers() > 0) {
    require_divisible(c.linear.num_k_heads, w, "linear_num_key_heads");
    d.lin_k_heads = c.linear.num_k_heads / w;
    d.lin_v_heads = c.linear.num_v_heads / w;
    d.lin_k_head0 = s.rank * d.lin_k_heads;
  }
  d.vocab_split = s.vocab_parallel_lm_head && w > 1 && c.vocab_size % w == 0;
  d.vocab = d.vocab_split ? c.vocab_size / w : c.vocab_size;
  d.vocab0 = d.vocab_split ? s.rank * d.vocab : 0;
  return d;
}

ModelPlan plan_weights(const ModelConfig& c, const ShardSpec& s) {
  const ShardDims d = shard_dims(c, s);
  const int64_t H = c.hidden_size;
  ModelPlan m;
  m.embed = whole("model.embed_tokens.weight", {c.vocab_size, H});
  m.final_norm = whole("model.norm.weight", {H});
  const std::string head_name =
      c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  m.lm_head = row_slice(head_name, {c.vocab_size, H}, d.vocab0, d.vocab);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeightsT<TensorPlan> L;
    L.input_norm = whole(p + "input_layernorm.weight", {H});
    L.post_norm = whole(p + "post_attention_layernorm.weight", {H});
    if (c.layers[static_cast<size_t>(l)].mixer == MixerKind::LinearAttention) {
      plan_linear_attention(c, d, p + "linear_attn.", L);
    } else {
      plan_attention(c, d, p + "self_attn.", L);
    }
    const std::string mlp = p + "mlp.";
    if (!c.is_moe_layer(l)) {
      const int64_t I = c.intermediate_size, n = d.intermediate, i0 = s.rank * n;
      L.mlp_gate_up.shape = {2 * n, H};
      add_gate_up(L.mlp_gate_up, mlp, I, H, i0, n, 0);
      L.mlp_down = col_slice(mlp + "down_proj.weight", {H, I}, i0, n);
      m.layers.push_back(std::move(L));
      continue;
    }
    const int64_t E = c.num_experts, Ie = c.moe_intermediate_size, n = d.moe_intermediate;
    const int64_t i0 = s.expert_split == ExpertSplit::Expert ? 0 : s.rank * n;
    L.router = whole(mlp + "gate.weight", {E, H});
    L.w_gate_up.shape = {d.num_experts, 2 * n, H};
    L.w_down.shape = {d.num_experts, H, n};
    for (int64_t e = 0; e < d.num_experts; ++e) {
      const std::string ep = mlp + "experts." + std::to_string(d.expert0 + e) + ".";
      add_gate_up(L.w_gate_up, ep, Ie, H, i0, n, e * 2 * n);
      L.w_down.pieces.push_back({ep + "down_proj.weight", {H, Ie}, 0, H, i0, n, e * H});
    }
    if (c.has_shared_expert()) {
      const int64_t Is = c.shared_expert_intermediate_size, ns = d.shared_intermediate;
      L.shared_gate_up.shape = {2 * ns, H};
      add_gate_up(L.shared_gate_up, mlp + "shared_expert.", Is, H, s.rank * ns, ns, 0);
      L.shared_down = col_slice(mlp + "shared_expert.down_proj.weight", {H, Is}, s.rank * ns, ns);
      L.shared_gate = whole(mlp + "shared_expert_gate.weight", {1, H});
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}

namespace {

template <class Out, class Conv>
void read_plan(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan, Out* dst,
               Conv conv) {
  const int64_t dst_cols = plan.shape.size() > 1 ? plan.shape.back() : 1;
  const int64_t dst_rows = plan.numel() / dst_cols;
  for (const auto& pc : plan.pieces) {
    const HubTensorReader in(src, cfg, pc.name, pc.src_shape);
    MB_CHECK(pc.cols == dst_cols && pc.dst_row0 + pc.rows <= dst_rows,
             "plan piece must fit its destination");
    for (int64_t r = 0; r < pc.rows; ++r) {
      Out* out = dst + (pc.dst_row0 + r) * dst_cols;
      for (int64_t c = 0; c < pc.cols; ++c) out[c] = conv(in.at(pc.row0 + r, pc.col0 + c));
    }
  }
}

}  // namespace

void read_plan_f32(const WeightSource& ckpt, const ModelConfig& cfg, const TensorPlan& plan,
                   float* dst) {
  read_plan(ckpt, cfg, plan, dst, [](float v) { return v; });
}

void read_plan_bf16(const WeightSource& ckpt, const ModelConfig& cfg, const TensorPlan& plan,
                    uint16_t* dst) {
  read_plan(ckpt, cfg, plan, dst, [](float v) { return f32_to_bf16(v); });
}

void check_weight_plan(const WeightSource& src, const ModelConfig& cfg, const ModelPlan& plan) {
  const auto check = [&](const TensorPlan& p) {
    for (const auto& pc : p.pieces) (void)HubTensorReader(src, cfg, pc.name, pc.src_shape);
  };
  check(plan.embed);
  check(plan.final_norm);
  check(plan.lm_head);
  for (const auto& layer : plan.layers) {
    LayerWeightsT<bool> fields;  // zip pairs each field of the plan with one of these; unused
    fields.zip(layer, [&](bool&, const TensorPlan& p) { check(p); });
  }
}

ModelWeights load_weights(const WeightSource& ckpt, const ModelConfig& cfg, const ShardSpec& spec) {
  const ModelPlan plan = plan_weights(cfg, spec);
  // A wrong checkpoint is refused before gigabytes are allocated.
  check_weight_plan(ckpt, cfg, plan);
  auto load = [&](HostTensor& t, const TensorPlan& p) {
    if (p.empty()) return;
    t.shape = p.shape;
    t.data.resize(static_cast<size_t>(p.numel()));
    read_plan_f32(ckpt, cfg, p, t.data.data());
  };
  ModelWeights w;
  load(w.embed, plan.embed);
  load(w.final_norm, plan.final_norm);
  load(w.lm_head, plan.lm_head);
  w.layers.resize(plan.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) w.layers[l].zip(plan.layers[l], load);
  return w;
}

}  // namespace moebatch
