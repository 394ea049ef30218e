#include "engine/hub_tensor.h"

#include <sstream>

#include "common/error.h"
#include "engine/ggml_quants.h"

namespace moebatch {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// A companion tensor (scales) that must exist with one of `dtypes` and shape `want`.
const TensorView& companion(const WeightSource& src, const std::string& name,
                            std::initializer_list<DType> dtypes, const std::vector<int64_t>& want,
                            const std::string& why) {
  const std::string where = src.source_name() + ": tensor '" + name + "'";
  if (!src.has_tensor(name)) throw InputError(where + " is missing (" + why + ")");
  const TensorView& t = *src.find_tensor(name).view;
  bool ok = false;
  std::string names;
  for (DType d : dtypes) {
    ok = ok || t.dtype == d;
    names += std::string(names.empty() ? "" : " or ") + dtype_name(d);
  }
  if (!ok) throw InputError(where + ": dtype " + dtype_name(t.dtype) + ", expected " + names);
  if (t.shape != want) {
    throw InputError(where + ": shape " + shape_str(t.shape) + " but " + why + " implies " +
                     shape_str(want));
  }
  return t;
}

}  // namespace

float e2m1_to_f32(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[code & 7];
  return (code & 8) ? -m : m;
}

HubTensorReader::HubTensorReader(const WeightSource& src, const ModelConfig& cfg,
                                 const std::string& name, const std::vector<int64_t>& shape) {
  const SourceTensor found = src.find_tensor(name);
  t_ = found.view;
  row0_ = found.row0;
  const std::string where = src.source_name() + ": tensor '" + name + "'";
  const int64_t rows = shape[0];
  cols_ = 1;  // N-D tensors (conv1d [C, 1, K]) are read as [shape[0], product of the rest]
  for (size_t i = 1; i < shape.size(); ++i) cols_ *= shape[i];
  const std::string module =
      name.size() > 7 && name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;

  if (t_->dtype == DType::U8) {
    // NVFP4: [rows, cols / 2] bytes, element 2k in the low nibble of byte k
    if (cfg.quant != QuantMethod::Nvfp4)
      throw InputError(where +
                       ": U8 (packed FP4) weight but the config states no NVFP4 quantization");
    if (quant_excluded(cfg, module))
      throw InputError(where + ": packed FP4 weight of a module the quantization config excludes");
    if (shape.size() != 2 || cols_ % cfg.quant_group_size != 0 || row0_ != 0) {
      throw InputError(where +
                       ": NVFP4 needs a whole 2-D weight whose inputs divide into groups of " +
                       std::to_string(cfg.quant_group_size));
    }
    const std::vector<int64_t> packed = {rows, cols_ / 2};
    if (found.shape != packed) {
      throw InputError(where + ": shape " + shape_str(found.shape) + " but a packed FP4 [" +
                       std::to_string(rows) + ", " + std::to_string(cols_) + "] weight is " +
                       shape_str(packed));
    }
    kind_ = StoredAs::Nvfp4;
    scale_cols_ = cols_ / cfg.quant_group_size;
    scale_ = &companion(src, name + "_scale", {DType::F8_E4M3}, {rows, scale_cols_},
                        "an NVFP4 weight's group scales");
    const TensorView& s2 =
        companion(src, name + "_scale_2", {DType::F32}, {}, "an NVFP4 weight's global scale");
    scale2_ = s2.get_f32(0);
    return;
  }

  if (found.shape != shape) {
    throw InputError(where + ": shape " + shape_str(found.shape) + " but the config implies " +
                     shape_str(shape));
  }
  MB_CHECK(row0_ >= 0 && (row0_ + rows) * cols_ <= t_->numel(),
           "a source tensor's rows must lie inside its file tensor");
  if (t_->dtype == DType::F8_E4M3) {
    // Fine-grained FP8: w = w_fp8 * weight_scale_inv[row / br, col / bc]
    if (cfg.quant != QuantMethod::Fp8Block)
      throw InputError(where + ": F8_E4M3 weight but config.json has no fp8 quantization_config");
    MB_CHECK(row0_ == 0, "FP8 block scales index whole tensors");
    kind_ = StoredAs::Fp8Block;
    br_ = cfg.quant_block_rows;
    bc_ = cfg.quant_block_cols;
    scale_cols_ = (cols_ + bc_ - 1) / bc_;
    scale_ = &companion(src, name + "_scale_inv", {DType::F32, DType::BF16},
                        {(rows + br_ - 1) / br_, scale_cols_},
                        "blocks of " + std::to_string(br_) + "x" + std::to_string(bc_));
    return;
  }
  if (dtype_is_block(t_->dtype)) {
    // ggml blocks run along the rows (GGUF's fastest dimension)
    if (cols_ % dtype_block(t_->dtype).elems != 0) {
      throw InputError(where + ": rows of " + std::to_string(cols_) + " elements are not whole " +
                       dtype_name(t_->dtype) + " blocks");
    }
    kind_ = StoredAs::GgmlBlocks;
    return;
  }
  if (t_->dtype != DType::F32 && t_->dtype != DType::F16 && t_->dtype != DType::BF16) {
    throw InputError(where + ": dtype " + dtype_name(t_->dtype) +
                     " is not a weight dtype (expected BF16, F16, F32, F8_E4M3 or packed FP4 U8)");
  }
  // A linear layer ModelOpt should have quantized but that is stored plain: the config and the
  // tensors disagree.
  if (cfg.quant == QuantMethod::Nvfp4 && name.ends_with("_proj.weight") &&
      !quant_excluded(cfg, module)) {
    throw InputError(where + ": stored " + dtype_name(t_->dtype) +
                     " but the NVFP4 quantization config does not exclude '" + module + "'");
  }
}

const uint8_t* HubTensorReader::stored_row(int64_t r) const {
  MB_CHECK(kind_ == StoredAs::Fp8Block || kind_ == StoredAs::Nvfp4 || kind_ == StoredAs::GgmlBlocks,
           "stored_row: only FP8 blocks, NVFP4 and ggml blocks keep their stored form");
  if (kind_ == StoredAs::GgmlBlocks) {
    const DTypeBlock b = dtype_block(t_->dtype);
    return reinterpret_cast<const uint8_t*>(t_->data) + (row0_ + r) * (cols_ / b.elems) * b.bytes;
  }
  const int64_t row_bytes = kind_ == StoredAs::Fp8Block ? cols_ : cols_ / 2;
  return reinterpret_cast<const uint8_t*>(t_->data) + r * row_bytes;
}

float HubTensorReader::block_scale(int64_t r, int64_t c) const {
  MB_CHECK(kind_ == StoredAs::Fp8Block, "block_scale: not an FP8 block tensor");
  return scale_->get_f32((r / br_) * scale_cols_ + c / bc_);
}

uint8_t HubTensorReader::group_scale_byte(int64_t r, int64_t g) const {
  MB_CHECK(kind_ == StoredAs::Nvfp4, "group_scale_byte: not an NVFP4 tensor");
  return static_cast<uint8_t>(scale_->data[r * scale_cols_ + g]);
}

float HubTensorReader::at(int64_t r, int64_t c) const {
  switch (kind_) {
    case StoredAs::Plain:
      return t_->get_f32((row0_ + r) * cols_ + c);
    case StoredAs::Fp8Block:
      return t_->get_f32(r * cols_ + c) * scale_->get_f32((r / br_) * scale_cols_ + c / bc_);
    case StoredAs::Nvfp4: {
      const auto byte = static_cast<uint8_t>(t_->data[r * (cols_ / 2) + c / 2]);
      const uint8_t code = (c & 1) ? (byte >> 4) : (byte & 0xF);
      return e2m1_to_f32(code) * scale_->get_f32(r * scale_cols_ + c / 16) * scale2_;
    }
    case StoredAs::GgmlBlocks: {
      if (row_index_ != r) {
        const DTypeBlock b = dtype_block(t_->dtype);
        row_.resize(static_cast<size_t>(cols_));
        dequantize_row(t_->dtype, t_->data + (row0_ + r) * (cols_ / b.elems) * b.bytes, row_.data(),
                       cols_);
        row_index_ = r;
      }
      return row_[static_cast<size_t>(c)];
    }
  }
  return 0.0f;
}

}  // namespace moebatch
