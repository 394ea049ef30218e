// Device memory of the CUDA backend: the weight arena laid out from the loader's plans (filled
// from a checkpoint through read_plan_bf16, or with seeded random values for benchmarks, one model
// over every rank) and the step buffers.
#include "engine/cuda/device_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "common/error.h"
#include "engine/cuda/linear.h"
#include "engine/packed_weights.h"
#include "kernels/attention.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/moe_gemm.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_wgmma.cuh"
#include "kernels/quant.cuh"
#include "kernels/random.cuh"
#include "kernels/rope.cuh"

namespace moebatch {
namespace {

// Hands out aligned sub-ranges of one allocation; with a null base it only counts bytes, so the
// memory plan and the carving share one description of the layout.
class Carver {
 public:
  Carver(char* base, size_t align) : base_(base), align_(align) {}
  template <class T>
  T* take(size_t n) {
    off_ = (off_ + align_ - 1) / align_ * align_;
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += std::max<size_t>(n, 1) * sizeof(T);
    return p;
  }
  size_t bytes() const { return off_; }

 private:
  char* base_;
  size_t align_;
  size_t off_ = 0;
};

void carve(Carver& c, const ModelConfig& cfg, const ShardDims& d, const StepCapacity& cap,
           StepBuffers& b) {
  const size_t T = cap.tokens, R = cap.logits_rows, W = cap.table_width;
  const size_t H = cfg.hidden_size, hd = cfg.head_dim, V = cfg.vocab_size, Vl = d.vocab;
  const size_t nh = d.num_heads, nkv = d.num_kv_heads;
  const size_t E = std::max<int64_t>(cfg.num_experts, 1);
  const size_t topk = std::max<int64_t>(cfg.num_experts_per_tok, 1);
  // expert rows: T·k pairs, or their sorted order with each expert padded to the GEMM tile
  // (the many-token path, kernels/moe_sorted.cuh)
  const size_t sorted_rows = static_cast<size_t>(kernels::moe_align_capacity(
      static_cast<int>(T * topk), static_cast<int>(E), kernels::kMoeGemmTileM));
  // gate_up also holds the step's rows quantized to e4m3 on the W8A8 expert path (forward.cpp's
  // moe(); act, with as many bytes as gate_up has elements, holds the e4m3 activations there)
  const size_t fp8_rows = (fp8_rows_bytes(static_cast<int64_t>(T), static_cast<int>(H)) + 1) / sizeof(bf16);
  const size_t gate_up = std::max({sorted_rows * 2 * d.moe_intermediate, T * 2 * d.intermediate,
                                   T * 2 * d.shared_intermediate, fp8_rows});
  b.tokens = c.take<int32_t>(T);
  b.positions = c.take<int32_t>(T);
  b.slots = c.take<int32_t>(T);
  b.q_start = c.take<int32_t>(T + 1);
  b.kv_lens = c.take<int32_t>(T);
  b.block_tables = c.take<int32_t>(T * W);
  b.logits_rows = c.take<int32_t>(T);
  b.state_slots = c.take<int32_t>(T);
  b.temperature = c.take<float>(R);
  b.top_k = c.take<int32_t>(R);
  b.top_p = c.take<float>(R);
  b.seeds = c.take<uint64_t>(R);
  b.steps = c.take<uint64_t>(R);
  b.sampled = c.take<int32_t>(R);
  b.x = c.take<bf16>(T * H);
  b.h = c.take<bf16>(T * H);
  b.o = c.take<bf16>(T * H);
  const size_t qm = cfg.attn_output_gate ? 2 : 1;
  b.qkv = c.take<bf16>(T * (nh * qm + 2 * nkv) * hd);
  const size_t rd = kernels::rope_rotated_dims(static_cast<int>(cfg.rotary_dim), static_cast<int>(hd));
  if (cfg.num_kv_layers() > 0) b.rope_rotation = c.take<float2>(T * (rd / 2));
  // Gated DeltaNet: in_proj rows per key head q, k, v and z, then b and a per value head
  const LinearAttentionDims& la = cfg.linear;
  const bool linear = cfg.state_bytes_per_seq() > 0;
  const size_t nk = d.lin_k_heads, nv = d.lin_v_heads, dk = la.k_head_dim, dv = la.v_head_dim;
  b.attn = c.take<bf16>(T * std::max(nh * hd, nv * dv));
  if (linear) {
    b.lin_proj = c.take<bf16>(T * (nk * 2 * dk + nv * 2 * dv + 2 * nv));
    b.lin_mixed = c.take<bf16>(T * (2 * nk * dk + nv * dv));
  }
  b.router_logits = c.take<float>(T * E);
  b.topk_ids = c.take<int32_t>(T * topk);
  b.topk_weights = c.take<float>(T * topk);
  b.sorted_ids = c.take<int32_t>(kernels::moe_align_capacity(static_cast<int>(T * topk),
                                                             static_cast<int>(E),
                                                             kernels::kMoeGemmTileM));
  b.expert_offsets = c.take<int32_t>(E + 1);
  b.active_experts = c.take<int32_t>(E + 1);
  b.align_ws = c.take<int32_t>(kernels::moe_align_workspace_ints(static_cast<int>(E)));
  b.route_counter = c.take<int32_t>(1);
  b.norm_counter = c.take<uint32_t>(1);
  b.gate_up = c.take<bf16>(gate_up);
  b.act = c.take<bf16>(gate_up / 2);
  b.gate_up_elems = gate_up;
  b.expert_out = c.take<bf16>(sorted_rows * H);
  b.row_of_pair = c.take<int32_t>(T * topk);
  b.sorted_rows = static_cast<int>(sorted_rows);
  b.attn_ws = c.take<float>(
      kernels::attention_workspace_floats(static_cast<int>(R), static_cast<int>(nh),
                                          static_cast<int>(hd), static_cast<int>(cap.attn_splits)));
  b.xr = c.take<bf16>(R * H);
  b.logits = c.take<float>(R * V);
  if (d.vocab_split) {
    // vocab-parallel lm_head: local rows, then the all-gather [world, R, V_local] (= R·V floats)
    // that rank 0 interleaves into `logits`
    b.logits_local = c.take<float>(R * Vl);
    b.logits_gather = c.take<float>(R * V);
  } else {
    b.logits_local = b.logits;
  }
  b.cap = cap;
}

// Assigns every plan field 16-byte aligned ranges in field order, in the format the plan assigns
// it (assign_weight_formats): the values, then a compressed format's scales and row scales.
WeightArena layout_weights(const ModelPlan& plan, bool alias_lm_head, char* base,
                           DeviceModelWeights& w) {
  Carver c(base, 16);
  WeightArena arena;
  auto place = [&](DeviceTensor& t, const TensorPlan& p) {
    if (p.empty()) return;
    t.shape = p.shape;
    t.format = p.format;
    t.group = p.group;
    const PackedSizes sz = packed_sizes(t.format, t.rows(), t.cols(), t.group);
    const size_t before = c.bytes();
    t.data = c.take<char>(sz.data);
    t.scales = sz.scales ? c.take<char>(sz.scales) : nullptr;
    t.row_scales = sz.row_scales ? c.take<float>(sz.row_scales / sizeof(float)) : nullptr;
    t.mins = sz.mins ? c.take<float>(sz.mins / sizeof(float)) : nullptr;
    const size_t used = c.bytes() - before;
    auto it = std::find_if(arena.formats.begin(), arena.formats.end(),
                           [&](const auto& f) { return f.first == t.format; });
    if (it == arena.formats.end()) {
      arena.formats.emplace_back(t.format, used);
    } else {
      it->second += used;
    }
  };
  place(w.embed, plan.embed);
  w.layers.resize(plan.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) w.layers[l].zip(plan.layers[l], place);
  place(w.final_norm, plan.final_norm);
  if (alias_lm_head) {
    w.lm_head = w.embed;  // tied embeddings, one rank: the lm_head is the embedding table
  } else {
    place(w.lm_head, plan.lm_head);
  }
  arena.bytes = c.bytes();
  return arena;
}

// Quantizes bf16 rows [rows, t.cols()] on the device into rows [row0, row0 + rows) of the
// compressed tensor t (the row layout makes any row range independent).
void quantize_rows(const bf16* in, int64_t rows, const DeviceTensor& t, int64_t row0,
                   cudaStream_t stream) {
  const DeviceTensor v = t.rows_from(row0);
  const int cols = static_cast<int>(v.cols());
  auto* data = static_cast<uint8_t*>(v.data);
  switch (v.format) {
    case WeightFormat::Fp8Block:
      // in 128-row blocks, as FP8 checkpoints hold weights (mark_block_scales then finds it)
      kernels::quantize_fp8_rows(in, rows, cols, v.group, data, static_cast<float*>(v.scales),
                                 stream, kernels::kWgmmaFp8Group);
      return;
    case WeightFormat::Nvfp4:
      kernels::quantize_nvfp4_rows(in, rows, cols, data, static_cast<uint8_t*>(v.scales),
                                   v.row_scales, stream);
      return;
    case WeightFormat::Int4:
      kernels::quantize_int4_rows(in, rows, cols, data, static_cast<float*>(v.scales), v.mins,
                                  stream);
      return;
    default:
      throw Error(std::string("quantize_rows: ") + weight_format_name(v.format) +
                  " is not a compressed format");
  }
}

// A device bf16 buffer that grows to the largest request (staging for quantization). Work on
// `stream` may still read the old buffer: growing waits for it before freeing.
class Staging {
 public:
  explicit Staging(cudaStream_t stream) : stream_(stream) {}
  ~Staging() {
    cudaStreamSynchronize(stream_);
    cudaFree(p_);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  bf16* get(size_t elems) {
    if (elems > n_) {
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      CUDA_CHECK(cudaMalloc(&p_, elems * sizeof(bf16)));
      n_ = elems;
    }
    return p_;
  }

 private:
  cudaStream_t stream_;
  bf16* p_ = nullptr;
  size_t n_ = 0;
};

bool aliases_lm_head(const ModelConfig& cfg, const ShardDims& d) {
  return cfg.tie_word_embeddings && !d.vocab_split;
}

// FNV-1a of a hub tensor name: the per-tensor seed of random weights, the same on every rank.
uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Sets scale_rows of every FP8-block tensor whose scales are uniform over aligned 128-row
// blocks (what the W8A8 expert GEMM's cheaper promotion needs; kernels/moe_wgmma_fp8.cu).
void mark_block_scales(DeviceModelWeights& w, cudaStream_t stream) {
  auto mark = [&](DeviceTensor& t, const DeviceTensor&) {
    if (t.empty() || t.format != WeightFormat::Fp8Block) return;
    const int groups = static_cast<int>((t.cols() + t.group - 1) / t.group);
    const int block = kernels::kWgmmaFp8Group;
    if (kernels::scales_block_uniform(static_cast<const float*>(t.scales), t.rows(), groups, block, stream))
      t.scale_rows = block;
  };
  for (auto& L : w.layers) L.zip(L, mark);
}

}  // namespace

size_t DeviceTensor::bytes() const {
  return empty() ? 0 : packed_sizes(format, rows(), cols(), group).total();
}

kernels::QuantMatrix DeviceTensor::matrix() const {
  kernels::QuantMatrix m;
  m.data = data;
  m.scales = scales;
  m.row_scales = row_scales;
  m.mins = mins;
  m.group = group;
  switch (format) {
    case WeightFormat::Bf16:
      m.codec = kernels::WeightCodec::Bf16;
      return m;
    case WeightFormat::Fp8Block:
      m.codec = kernels::WeightCodec::Fp8Block;
      return m;
    case WeightFormat::Nvfp4:
      m.codec = kernels::WeightCodec::Nvfp4;
      return m;
    case WeightFormat::Int8:
      m.codec = kernels::WeightCodec::Int8;
      return m;
    case WeightFormat::Int4:
      m.codec = kernels::WeightCodec::Int4;
      return m;
    case WeightFormat::F32:
      break;
  }
  throw Error(std::string("weight tensor holds ") + weight_format_name(format) +
              ", which no GPU kernel reads");
}

DeviceTensor DeviceTensor::rows_from(int64_t row0) const {
  MB_CHECK(row0 >= 0 && row0 < rows(), "rows_from: row outside the tensor");
  const PackedSizes per_row = packed_sizes(format, 1, cols(), group);
  DeviceTensor v = *this;
  v.shape = {rows() - row0, cols()};
  v.data = static_cast<char*>(data) + row0 * per_row.data;
  if (scales) v.scales = static_cast<char*>(scales) + row0 * per_row.scales;
  if (row_scales) v.row_scales = row_scales + row0;
  if (mins) v.mins = mins + row0 * static_cast<int64_t>(per_row.mins / sizeof(float));
  v.block_scales = nullptr;  // the block grid is the whole tensor's (rows need not start a block)
  return v;
}

int64_t DeviceTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return shape.empty() ? 0 : n;
}

bf16* DeviceTensor::as_bf16() const {
  if (format != WeightFormat::Bf16) {
    throw Error(std::string("weight tensor holds ") + weight_format_name(format) +
                ", read as bf16");
  }
  return static_cast<bf16*>(data);
}

size_t step_buffer_bytes(const ModelConfig& cfg, const ShardDims& d, const StepCapacity& cap) {
  Carver c(nullptr, 256);
  StepBuffers b;
  carve(c, cfg, d, cap, b);
  return c.bytes();
}

StepBuffers carve_step_buffers(void* base, const ModelConfig& cfg, const ShardDims& d,
                               const StepCapacity& cap) {
  Carver c(static_cast<char*>(base), 256);
  StepBuffers b;
  carve(c, cfg, d, cap, b);
  if (cap.attn_splits > 1) {
    // Decode attention's ticket counters (the workspace's head) start at zero, and every launch
    // leaves them so. The sync orders the memset (default stream) before the rank's own stream.
    CUDA_CHECK(cudaMemset(b.attn_ws, 0, kernels::kAttentionCounters * sizeof(uint32_t)));
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  return b;
}

std::string describe_formats(const std::vector<std::pair<WeightFormat, size_t>>& formats) {
  std::string s;
  for (const auto& [f, bytes] : formats) {
    if (!s.empty()) s += " + ";
    s += fmt::format("{:.2f} GiB {}", static_cast<double>(bytes) / (1u << 30),
                     weight_format_name(f));
  }
  return s;
}

WeightArena weight_arena(const ModelConfig& cfg, const ShardDims& d, const ModelPlan& plan) {
  DeviceModelWeights unused;
  return layout_weights(plan, aliases_lm_head(cfg, d), nullptr, unused);
}

DeviceModelWeights place_weights(const ModelConfig& cfg, const ShardDims& d,
                                 const ModelPlan& plan, void* base) {
  DeviceModelWeights w;
  layout_weights(plan, aliases_lm_head(cfg, d), static_cast<char*>(base), w);
  return w;
}

void load_weights_device(const WeightSource& ckpt, const ModelConfig& cfg, const ModelPlan& plan,
                         DeviceModelWeights& w, cudaStream_t stream) {
  std::vector<uint16_t> host;
  PackedHost packed;
  Staging staging(stream);
  auto upload = [&](void* dst, const void* src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  auto copy = [&](DeviceTensor& t, const TensorPlan& p) {
    if (p.empty()) return;
    if (t.format == WeightFormat::Bf16) {
      host.resize(static_cast<size_t>(p.numel()));
      read_plan_bf16(ckpt, cfg, p, host.data());
      upload(t.data, host.data(), host.size() * sizeof(uint16_t));
    } else if (stored_as_planned(ckpt, cfg, p)) {
      read_plan_packed(ckpt, cfg, p, packed);  // the checkpoint's bytes as they are
      upload(t.data, packed.data.data(), packed.data.size());
      upload(t.scales, packed.scales.data(), packed.scales.size());
      upload(t.row_scales, packed.row_scales.data(), packed.row_scales.size() * sizeof(float));
      upload(t.mins, packed.mins.data(), packed.mins.size() * sizeof(float));
    } else {
      // A plain weight compressed on load (--quantization): piece by piece through bf16 staging.
      for (const PlanPiece& pc : p.pieces) {
        TensorPlan one;
        one.shape = {pc.rows, pc.cols};
        one.pieces = {pc};
        one.pieces[0].dst_row0 = 0;
        host.resize(static_cast<size_t>(pc.rows * pc.cols));
        read_plan_bf16(ckpt, cfg, one, host.data());
        bf16* stage = staging.get(host.size());
        upload(stage, host.data(), host.size() * sizeof(uint16_t));
        quantize_rows(stage, pc.rows, t, pc.dst_row0, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is reused by the next piece
      }
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the host buffers are reused by the next tensor
  };
  copy(w.embed, plan.embed);
  for (size_t l = 0; l < plan.layers.size(); ++l) w.layers[l].zip(plan.layers[l], copy);
  copy(w.final_norm, plan.final_norm);
  if (w.lm_head.data != w.embed.data) copy(w.lm_head, plan.lm_head);
  mark_block_scales(w, stream);
}

void random_weights_device(uint64_t seed, const ModelPlan& plan, DeviceModelWeights& w,
                           cudaStream_t stream) {
  // A piece is either a whole hub tensor (filled in place) or a row/column block of one: the
  // whole tensor is then generated into a scratch buffer and the block copied out (only with
  // tensor parallelism: on one rank every piece is a whole hub tensor). A compressed tensor gets
  // each piece in bf16 staging first, quantized into its rows.
  auto src_cols = [](const PlanPiece& pc) {
    int64_t n = 1;
    for (size_t i = 1; i < pc.src_shape.size(); ++i) n *= pc.src_shape[i];
    return n;
  };
  auto whole = [&](const PlanPiece& pc) {
    return pc.row0 == 0 && pc.col0 == 0 && pc.rows == pc.src_shape[0] && pc.cols == src_cols(pc);
  };
  Staging scratch(stream), staging(stream);

  // Uniform in ±1/sqrt(fan-in) of the hub tensor keeps activations O(1) through the layers;
  // vectors (norms, biases) get ±1 so no norm weight collapses the signal.
  auto fill = [&](DeviceTensor& t, const TensorPlan& p) {
    if (p.empty()) return;
    const int64_t cols = t.cols();
    const bool packed = t.format != WeightFormat::Bf16;
    for (const PlanPiece& pc : p.pieces) {
      const int64_t scols = src_cols(pc);
      const float scale = pc.src_shape.size() >= 2
                              ? 1.0f / std::sqrt(static_cast<float>(pc.src_shape.back()))
                              : 1.0f;
      const uint64_t tseed = kernels::splitmix64(seed ^ name_hash(pc.name));
      MB_CHECK(pc.cols == cols, "random weights: a plan piece must fill whole destination rows");
      const size_t piece_elems = static_cast<size_t>(pc.rows * cols);
      bf16* dst = packed ? staging.get(piece_elems) : t.as_bf16() + pc.dst_row0 * cols;
      if (whole(pc)) {
        kernels::fill_uniform(dst, piece_elems, tseed, scale, stream);
      } else {
        bf16* all = scratch.get(static_cast<size_t>(pc.src_shape[0] * scols));
        kernels::fill_uniform(all, static_cast<size_t>(pc.src_shape[0] * scols), tseed, scale,
                              stream);
        CUDA_CHECK(cudaMemcpy2DAsync(dst, cols * sizeof(bf16), all + pc.row0 * scols + pc.col0,
                                     scols * sizeof(bf16), pc.cols * sizeof(bf16),
                                     static_cast<size_t>(pc.rows), cudaMemcpyDeviceToDevice,
                                     stream));
      }
      if (packed) quantize_rows(dst, pc.rows, t, pc.dst_row0, stream);
    }
  };
  try {
    fill(w.embed, plan.embed);
    for (size_t l = 0; l < plan.layers.size(); ++l) w.layers[l].zip(plan.layers[l], fill);
    fill(w.final_norm, plan.final_norm);
    if (w.lm_head.data != w.embed.data) fill(w.lm_head, plan.lm_head);
    mark_block_scales(w, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaStreamSynchronize(stream);
    throw;
  }
}

}  // namespace moebatch
