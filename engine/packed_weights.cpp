#include "engine/packed_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "engine/ggml_quants.h"
#include "engine/hub_tensor.h"
#include "engine/safetensors.h"

namespace moebatch {
namespace {

// The weights of linear layers: the only tensors a kernel reads through the compressed-weight
// GEMMs (engine/cuda/linear.h). Everything else is read element-wise as bf16.
template <class F>
void for_each_linear(LayerWeightsT<TensorPlan>& L, F&& f) {
  for (TensorPlan* p : {&L.wqkv, &L.wo, &L.mlp_gate_up, &L.mlp_down, &L.w_gate_up, &L.w_down,
                        &L.shared_gate_up, &L.shared_down})
    if (!p->empty()) f(*p);
}

// A compressed form and its inputs per scale.
struct Form {
  WeightFormat format = WeightFormat::Bf16;
  int group = 0;
  bool operator==(const Form&) const = default;
};

// How every piece of `p` is stored, as the form a GPU keeps: Fp8Block / Nvfp4 when all pieces
// agree on it; ggml integer blocks as Int4 (all Q4_K) or Int8 (all Q8_0, Q5_K or Q6_K, or a mix
// of ggml formats with the smallest sub-block as the group); else Bf16 (plain, or a mix of
// kinds: decoded).
Form stored_form(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& p) {
  bool all_fp8 = true, all_fp4 = true, all_ggml = true, one_ggml = true;
  DType ggml = DType::F32;
  int group = 32;
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const PlanPiece& pc = p.pieces[i];
    const HubTensorReader in(src, cfg, pc.name, pc.src_shape);
    const StoredAs s = in.stored_as();
    all_fp8 = all_fp8 && s == StoredAs::Fp8Block;
    all_fp4 = all_fp4 && s == StoredAs::Nvfp4;
    const int sub = s == StoredAs::GgmlBlocks ? ggml_subblock(in.stored_dtype()) : 0;
    all_ggml = all_ggml && sub > 0;
    if (i == 0) ggml = in.stored_dtype();
    one_ggml = one_ggml && in.stored_dtype() == ggml;
    if (sub > 0) group = std::min(group, sub);
  }
  if (all_fp8) return {WeightFormat::Fp8Block, static_cast<int>(cfg.quant_block_cols)};
  if (all_fp4) return {WeightFormat::Nvfp4, 16};
  if (all_ggml) {
    if (one_ggml && ggml == DType::Q4_K) return {WeightFormat::Int4, 32};
    return {WeightFormat::Int8, group};
  }
  return {};
}

// The compressed kernels take rows of whole 32-input MMA steps (the expert GEMM's unit; the
// GEMV's 16-byte loads divide it) and scale groups of whole 16-byte loads.
bool kernel_takes(WeightFormat f, int64_t cols, int group) {
  switch (f) {
    case WeightFormat::Fp8Block:
      return cols % 32 == 0 && group > 0 && group % 16 == 0;
    case WeightFormat::Nvfp4:
    case WeightFormat::Int4:
      return cols % 32 == 0;
    case WeightFormat::Int8:
      return cols % 32 == 0 && (group == 16 || group == 32);
    default:
      return true;
  }
}

// Codes, scales and mins of ggml integer blocks in the Int8 / Int4 layouts: row r of piece pc
// into destination row pc.dst_row0 + r.
void read_piece_ggml(const HubTensorReader& in, const PlanPiece& pc, WeightFormat f, int64_t cols,
                     int group, PackedHost& out) {
  int64_t src_cols = 1;
  for (size_t i = 1; i < pc.src_shape.size(); ++i) src_cols *= pc.src_shape[i];
  std::vector<int8_t> codes(static_cast<size_t>(src_cols));
  std::vector<float> sc(static_cast<size_t>(src_cols / group)), mn(sc.size());
  const int64_t groups = cols / group;
  const size_t row_bytes = f == WeightFormat::Int8 ? cols : cols / 2;
  for (int64_t r = 0; r < pc.rows; ++r) {
    const int64_t dr = pc.dst_row0 + r;
    unpack_row(in.stored_dtype(), reinterpret_cast<const std::byte*>(in.stored_row(pc.row0 + r)),
               src_cols, group, codes.data(), sc.data(), mn.data());
    uint8_t* to = out.data.data() + static_cast<size_t>(dr) * row_bytes;
    const int8_t* from = codes.data() + pc.col0;
    if (f == WeightFormat::Int8) {
      std::memcpy(to, from, row_bytes);
    } else {
      for (size_t j = 0; j < row_bytes; ++j)
        to[j] = static_cast<uint8_t>((from[2 * j] & 0xF) | ((from[2 * j + 1] & 0xF) << 4));
    }
    const size_t g0 = static_cast<size_t>(pc.col0 / group), gd = static_cast<size_t>(dr * groups);
    std::memcpy(out.scales.data() + 4 * gd, sc.data() + g0, 4 * static_cast<size_t>(groups));
    std::memcpy(out.mins.data() + gd, mn.data() + g0, 4 * static_cast<size_t>(groups));
  }
}

}  // namespace

Quantization parse_quantization(std::string_view s) {
  if (s == "auto") return Quantization::Auto;
  if (s == "none") return Quantization::None;
  if (s == "fp8") return Quantization::Fp8;
  if (s == "nvfp4") return Quantization::Nvfp4;
  if (s == "int4") return Quantization::Int4;
  throw InputError("quantization '" + std::string(s) + "': expected auto, none, fp8, nvfp4 or int4");
}

const char* quantization_name(Quantization q) {
  switch (q) {
    case Quantization::Auto:
      return "auto";
    case Quantization::None:
      return "none";
    case Quantization::Fp8:
      return "fp8";
    case Quantization::Nvfp4:
      return "nvfp4";
    case Quantization::Int4:
      return "int4";
  }
  return "?";
}

PackedSizes packed_sizes(WeightFormat f, int64_t rows, int64_t cols, int group) {
  const auto r = static_cast<size_t>(rows), c = static_cast<size_t>(cols);
  PackedSizes s;
  switch (f) {
    case WeightFormat::F32:
      s.data = 4 * r * c;
      break;
    case WeightFormat::Bf16:
      s.data = 2 * r * c;
      break;
    case WeightFormat::Fp8Block:
      MB_CHECK(group > 0, "fp8 blocks need a group size");
      s.data = r * c;
      s.scales = 4 * r * ((c + group - 1) / group);
      break;
    case WeightFormat::Nvfp4:
      s.data = r * c / 2;
      s.scales = r * c / 16;
      s.row_scales = 4 * r;
      break;
    case WeightFormat::Int8:
    case WeightFormat::Int4:
      MB_CHECK(group > 0, "integer formats need a group size");
      s.data = f == WeightFormat::Int8 ? r * c : r * c / 2;
      s.scales = 4 * r * ((c + group - 1) / group);
      s.mins = s.scales;
      break;
  }
  return s;
}

int64_t plan_cols(const TensorPlan& p) { return p.shape.size() > 1 ? p.shape.back() : 1; }
int64_t plan_rows(const TensorPlan& p) { return p.numel() / plan_cols(p); }

void assign_weight_formats(ModelPlan& plan, const ModelConfig& cfg, const WeightSource* src,
                           Quantization q) {
  auto assign = [&](TensorPlan& p) {
    p.format = WeightFormat::Bf16;
    p.group = 0;
    if (q == Quantization::None) return;
    const Form form = src ? stored_form(*src, cfg, p) : Form{};
    const WeightFormat stored = form.format;
    WeightFormat f = stored;
    int group = form.group;
    if (stored == WeightFormat::Bf16 && q == Quantization::Fp8) {
      f = WeightFormat::Fp8Block;
      group = 128;
    } else if (stored == WeightFormat::Bf16 && q == Quantization::Nvfp4) {
      f = WeightFormat::Nvfp4;
      group = 16;
    } else if (stored == WeightFormat::Bf16 && q == Quantization::Int4) {
      f = WeightFormat::Int4;
      group = 32;
    }
    if (!kernel_takes(f, plan_cols(p), group)) return;  // decoded to bf16
    if (f == stored && f != WeightFormat::Bf16) {
      for (const PlanPiece& pc : p.pieces) {
        if (pc.col0 % group == 0) continue;
        throw InputError(
            "tensor '" + pc.name + "': this rank's columns start at " + std::to_string(pc.col0) +
            ", inside a " + weight_format_name(f) + " scale group of " + std::to_string(group) +
            " inputs; choose a tensor-parallel size whose column shard is a multiple of " +
            std::to_string(group) + " (expert weights: or --enable-expert-parallel)");
      }
    }
    p.format = f;
    p.group = group;
  };
  for (auto& L : plan.layers) for_each_linear(L, assign);
}

std::string describe_weight_groups(const ModelPlan& plan) {
  struct Group {
    const char* name;
    std::vector<TensorPlan LayerWeightsT<TensorPlan>::*> fields;
    std::string formats;
  };
  std::vector<Group> groups = {
      {"attention", {&LayerWeightsT<TensorPlan>::wqkv, &LayerWeightsT<TensorPlan>::wo}, {}},
      {"experts", {&LayerWeightsT<TensorPlan>::w_gate_up, &LayerWeightsT<TensorPlan>::w_down}, {}},
      {"shared expert",
       {&LayerWeightsT<TensorPlan>::shared_gate_up, &LayerWeightsT<TensorPlan>::shared_down},
       {}},
      {"dense mlp", {&LayerWeightsT<TensorPlan>::mlp_gate_up, &LayerWeightsT<TensorPlan>::mlp_down},
       {}},
  };
  std::string out;
  for (Group& g : groups) {
    for (const auto& L : plan.layers)
      for (auto field : g.fields) {
        const TensorPlan& t = L.*field;
        const std::string f = weight_format_name(t.format);
        if (t.empty() || ("+" + g.formats + "+").find("+" + f + "+") != std::string::npos) continue;
        g.formats += (g.formats.empty() ? "" : "+") + f;
      }
    if (!g.formats.empty()) out += (out.empty() ? "" : ", ") + std::string(g.name) + " " + g.formats;
  }
  return out;
}

bool stored_as_planned(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan) {
  return plan.format != WeightFormat::Bf16 &&
         stored_form(src, cfg, plan) == Form{plan.format, plan.group};
}

void read_plan_packed(const WeightSource& src, const ModelConfig& cfg, const TensorPlan& plan,
                      PackedHost& out) {
  const WeightFormat f = plan.format;
  MB_CHECK(f != WeightFormat::Bf16 && f != WeightFormat::F32,
           "read_plan_packed: plan is not in a compressed format");
  const int64_t rows = plan_rows(plan), cols = plan_cols(plan);
  const int group = plan.group;
  const PackedSizes sz = packed_sizes(f, rows, cols, group);
  out.data.assign(sz.data, 0);
  out.scales.assign(sz.scales, 0);
  out.row_scales.assign(sz.row_scales / sizeof(float), 0.0f);
  out.mins.assign(sz.mins / sizeof(float), 0.0f);
  if (f == WeightFormat::Int8 || f == WeightFormat::Int4) {
    for (const PlanPiece& pc : plan.pieces) {
      MB_CHECK(pc.cols == cols && pc.dst_row0 + pc.rows <= rows && pc.col0 % group == 0,
               "plan piece must fit its destination on scale-group boundaries");
      read_piece_ggml(HubTensorReader(src, cfg, pc.name, pc.src_shape), pc, f, cols, group, out);
    }
    return;
  }
  const size_t row_bytes = sz.data / static_cast<size_t>(rows);
  const int64_t groups = f == WeightFormat::Fp8Block ? (cols + group - 1) / group : cols / 16;
  for (const PlanPiece& pc : plan.pieces) {
    const HubTensorReader in(src, cfg, pc.name, pc.src_shape);
    MB_CHECK(pc.cols == cols && pc.dst_row0 + pc.rows <= rows && pc.col0 % group == 0,
             "plan piece must fit its destination on scale-group boundaries");
    MB_CHECK(f != WeightFormat::Fp8Block || in.block_cols() == group,
             "FP8 block columns differ from the plan's group");
    for (int64_t r = 0; r < pc.rows; ++r) {
      const int64_t sr = pc.row0 + r, dr = pc.dst_row0 + r;
      const uint8_t* from = in.stored_row(sr);
      uint8_t* to = out.data.data() + static_cast<size_t>(dr) * row_bytes;
      if (f == WeightFormat::Fp8Block) {
        std::memcpy(to, from + pc.col0, row_bytes);
        for (int64_t g = 0; g < groups; ++g) {
          const float s = in.block_scale(sr, pc.col0 + g * group);
          std::memcpy(out.scales.data() + 4 * static_cast<size_t>(dr * groups + g), &s, 4);
        }
      } else {
        std::memcpy(to, from + pc.col0 / 2, row_bytes);
        for (int64_t g = 0; g < groups; ++g)
          out.scales[static_cast<size_t>(dr * groups + g)] = in.group_scale_byte(sr, pc.col0 / 16 + g);
        out.row_scales[static_cast<size_t>(dr)] = in.global_scale();
      }
    }
  }
}

float packed_value(WeightFormat f, const PackedHost& m, int64_t cols, int group, int64_t r,
                   int64_t c) {
  const auto i = static_cast<size_t>(r * cols + c);
  switch (f) {
    case WeightFormat::Fp8Block: {
      const int64_t groups = (cols + group - 1) / group;
      float s;
      std::memcpy(&s, m.scales.data() + 4 * static_cast<size_t>(r * groups + c / group), 4);
      return fp8_e4m3_to_f32(m.data[i]) * s;
    }
    case WeightFormat::Nvfp4: {
      const uint8_t byte = m.data[i / 2];
      const float code = e2m1_to_f32((c & 1) ? byte >> 4 : byte & 0xF);
      return code * fp8_e4m3_to_f32(m.scales[i / 16]) * m.row_scales[static_cast<size_t>(r)];
    }
    case WeightFormat::Int8:
    case WeightFormat::Int4: {
      const int64_t groups = (cols + group - 1) / group;
      const auto gi = static_cast<size_t>(r * groups + c / group);
      float s;
      std::memcpy(&s, m.scales.data() + 4 * gi, 4);
      const int code = f == WeightFormat::Int8 ? static_cast<int8_t>(m.data[i])
                       : (c & 1)               ? m.data[i / 2] >> 4
                                               : m.data[i / 2] & 0xF;
      return static_cast<float>(code) * s - m.mins[gi];
    }
    case WeightFormat::Bf16: {
      uint16_t b;
      std::memcpy(&b, m.data.data() + 2 * i, 2);
      return bf16_to_f32(b);
    }
    case WeightFormat::F32: {
      float v;
      std::memcpy(&v, m.data.data() + 4 * i, 4);
      return v;
    }
  }
  return 0.0f;
}

}  // namespace moebatch
