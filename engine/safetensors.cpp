#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_set>

#include "common/error.h"
#include "common/json_parse.h"
#include "common/paths.h"
#include "engine/ggml_quants.h"

namespace moebatch {
namespace {

using nlohmann::json;

// The format allows up to 100 MB of header; real checkpoints use a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr int kMaxRank = 8;
constexpr uint64_t kMaxTensorElements = uint64_t{1} << 40;  // per tensor, and per dimension
constexpr std::uintmax_t kMaxIndexBytes = 64u << 20;

[[noreturn]] void bad_safetensors(const std::string& file, const std::string& what) {
  throw InputError(file + ": " + what);
}

DType parse_dtype(const std::string& s, const std::string& file, const std::string& name) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  bad_safetensors(file, "tensor '" + name + "': unsupported dtype '" + s +
                            "' (supported: F32, F16, BF16, F8_E4M3, I32, I64, U8)");
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::F8_E4M3:
    case DType::U8:
      return 1;
    case DType::I64:
      return 8;
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return 0;
  }
  return 0;
}

DTypeBlock dtype_block(DType t) {
  // ggml's block layouts (engine/ggml_quants.cpp)
  switch (t) {
    case DType::Q8_0:
      return {32, 34};
    case DType::Q4_K:
      return {256, 144};
    case DType::Q5_K:
      return {256, 176};
    case DType::Q6_K:
      return {256, 210};
    default:
      return {1, static_cast<int64_t>(dtype_size(t))};
  }
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F8_E4M3:
      return "F8_E4M3";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
    case DType::Q8_0:
      return "Q8_0";
    case DType::Q4_K:
      return "Q4_K";
    case DType::Q5_K:
      return "Q5_K";
    case DType::Q6_K:
      return "Q6_K";
  }
  return "?";
}

float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

float f16_to_f32(uint16_t v) {
  uint32_t sign = (v >> 15) & 1, exp = (v >> 10) & 0x1f, man = v & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);  // subnormal
  } else if (exp == 31) {
    mag = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -mag : mag;
}

float fp8_e4m3_to_f32(uint8_t v) {
  // E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN.
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 0x7;
  float mag;
  if (exp == 15 && man == 7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    mag = std::ldexp(static_cast<float>(man | 0x8), static_cast<int>(exp) - 10);
  }
  return sign ? -mag : mag;
}

uint16_t f32_to_bf16(float v) {
  uint32_t u = std::bit_cast<uint32_t>(v);
  if (std::isnan(v)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

float TensorView::get_f32(int64_t i) const {
  if (dtype_is_block(dtype)) {
    const DTypeBlock b = dtype_block(dtype);
    std::vector<float> block(static_cast<size_t>(b.elems));
    dequantize_row(dtype, data + (i / b.elems) * b.bytes, block.data(), b.elems);
    return block[static_cast<size_t>(i % b.elems)];
  }
  const std::byte* p = data + static_cast<size_t>(i) * dtype_size(dtype);
  switch (dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case DType::F8_E4M3:
      return fp8_e4m3_to_f32(static_cast<uint8_t>(*p));
    case DType::I32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return static_cast<float>(x);
    }
    default:
      break;
  }
  throw InputError(file + ": tensor '" + name + "': dtype " + dtype_name(dtype) +
                   " cannot be read as float");
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path.string()) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_safetensors(path_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    bad_safetensors(path_, "cannot stat");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    bad_safetensors(path_, "file is " + std::to_string(map_size_) +
                               " bytes, shorter than the 8-byte header "
                               "length (truncated?)");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    bad_safetensors(path_, "mmap failed");
  }
  try {
    const auto* base = static_cast<const std::byte*>(map_);
    uint64_t hlen;
    std::memcpy(&hlen, base, 8);  // little-endian on every supported host
    if (hlen > kMaxHeaderBytes) {
      bad_safetensors(path_, "header length " + std::to_string(hlen) + " exceeds the " +
                                 std::to_string(kMaxHeaderBytes) + "-byte limit");
    }
    if (hlen > map_size_ - 8) {
      bad_safetensors(path_, "header length " + std::to_string(hlen) +
                                 " runs past the end of the " + std::to_string(map_size_) +
                                 "-byte file (truncated?)");
    }
    const char* hp = reinterpret_cast<const char*>(base + 8);
    std::string problem;
    json h = parse_json_bounded(std::string_view(hp, hlen), &problem);
    if (!problem.empty() || !h.is_object())
      bad_safetensors(
          path_, "header is not a valid JSON object" + (problem.empty() ? "" : ": " + problem));
    const size_t data_size = map_size_ - 8 - hlen;
    const std::byte* data = base + 8 + hlen;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto& [name, e] : h.items()) {
      if (name == "__metadata__") continue;
      auto where = "tensor '" + name + "': ";
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
          !e.contains("data_offsets")) {
        bad_safetensors(path_, where + "entry needs dtype, shape and data_offsets");
      }
      if (!e["dtype"].is_string()) bad_safetensors(path_, where + "dtype is not a string");
      TensorView t;
      t.name = name;
      t.file = path_;
      t.dtype = parse_dtype(e["dtype"].get<std::string>(), path_, name);
      const auto& sh = e["shape"];
      if (!sh.is_array() || sh.size() > kMaxRank)
        bad_safetensors(path_, where + "shape must be an array of rank <= 8");
      uint64_t numel = 1;
      for (const auto& d : sh) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > kMaxTensorElements) {
          bad_safetensors(path_,
                          where + "shape entry " + json_excerpt(d) + " is not a valid dimension");
        }
        const uint64_t n = d.get<uint64_t>();
        // checked before multiplying: two dimensions of up to 2^40 would wrap 64 bits
        if (n != 0 && numel > kMaxTensorElements / n)
          bad_safetensors(path_, where + "too many elements");
        t.shape.push_back(static_cast<int64_t>(n));
        numel *= n;
      }
      const auto& off = e["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
          !off[1].is_number_unsigned()) {
        bad_safetensors(path_, where + "data_offsets must be two non-negative integers");
      }
      uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      if (b > en || en > data_size) {
        bad_safetensors(path_, where + "data_offsets [" + std::to_string(b) + ", " +
                                   std::to_string(en) + ") outside the " +
                                   std::to_string(data_size) + "-byte data section");
      }
      uint64_t want = numel * dtype_size(t.dtype);
      if (en - b != want) {
        bad_safetensors(path_, where + "holds " + std::to_string(en - b) + " bytes but shape x " +
                                   dtype_name(t.dtype) + " needs " + std::to_string(want));
      }
      t.data = data + b;
      t.nbytes = want;
      if (want > 0) ranges.emplace_back(b, en);
      tensors_.emplace(name, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) {
        bad_safetensors(path_,
                        "tensor data ranges overlap at byte " + std::to_string(ranges[i].first));
      }
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorView& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) bad_safetensors(path_, "missing tensor '" + name + "'");
  return it->second;
}

Checkpoint::Checkpoint(const std::filesystem::path& dir) : dir_(dir.string()) {
  auto index = dir / "model.safetensors.index.json";
  std::vector<std::string> names;  // shards in the index's order
  std::unordered_set<std::string> seen;
  if (std::filesystem::exists(index)) {
    json j = parse_json_bounded(read_file_limited(index, kMaxIndexBytes));
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      bad_safetensors(index.string(), "expected a JSON object with a 'weight_map' object");
    }
    for (auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        bad_safetensors(index.string(), "weight_map['" + tensor + "'] is not a string");
      auto f = file.get<std::string>();
      // Shard names are plain file names; refuse paths that would escape the directory.
      if (f.empty() || f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        bad_safetensors(index.string(),
                        "weight_map['" + tensor + "'] names an invalid shard '" + f + "'");
      }
      if (seen.insert(f).second) names.push_back(f);
    }
    if (names.empty()) bad_safetensors(index.string(), "weight_map is empty");
  } else {
    names.push_back("model.safetensors");
  }
  for (const auto& n : names) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir / n));
    for (const auto& [name, view] : files_.back()->tensors()) {
      if (!index_.emplace(name, &view).second) {
        bad_safetensors(dir_, "tensor '" + name + "' appears in more than one shard");
      }
    }
  }
}

bool Checkpoint::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorView& Checkpoint::at(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) bad_safetensors(dir_, "checkpoint has no tensor '" + name + "'");
  return *it->second;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<OutTensor>& tensors) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (auto d : t.shape) numel *= static_cast<uint64_t>(d);
    MB_CHECK(numel * dtype_size(t.dtype) == t.bytes.size(), "tensor byte size must match shape");
    h[t.name] = {{"dtype", dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string hs = h.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(path.string() + ": cannot open for writing");
  uint64_t hlen = hs.size();
  out.write(reinterpret_cast<const char*>(&hlen), 8);
  out.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  if (!out) throw Error(path.string() + ": write failed");
}

}  // namespace moebatch
