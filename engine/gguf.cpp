#include "engine/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <regex>
#include <string_view>

#include "common/error.h"
#include "common/utf8.h"
#include "common/json_parse.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxCount = uint64_t{1} << 24;     // tensors, keys, array elements
constexpr uint64_t kMaxString = uint64_t{1} << 26;    // 64 MiB (chat templates are long)
constexpr uint64_t kMaxKey = 65535;                   // the GGUF spec's bound on a metadata key
constexpr uint64_t kMaxTensorName = 256;              // ggml's own bound is 64 (GGML_MAX_NAME)
constexpr uint64_t kMaxElements = uint64_t{1} << 44;  // per tensor
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 3;

[[noreturn]] void bad_gguf(const std::string& path, const std::string& what) {
  throw InputError(path + ": invalid GGUF: " + what);
}

// The ggml types this engine reads; others are refused by name.
bool ggml_type(uint32_t id, DType& out) {
  switch (id) {
    case 0:
      out = DType::F32;
      return true;
    case 1:
      out = DType::F16;
      return true;
    case 8:
      out = DType::Q8_0;
      return true;
    case 12:
      out = DType::Q4_K;
      return true;
    case 13:
      out = DType::Q5_K;
      return true;
    case 14:
      out = DType::Q6_K;
      return true;
    case 30:
      out = DType::BF16;
      return true;
    default:
      return false;
  }
}

// The pieces of a value's description, joined.
template <class... Parts>
std::string join(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

// A bounds-checked little-endian reader over the mapped bytes.
class Cursor {
 public:
  Cursor(const std::string& path, const std::byte* data, size_t size)
      : path_(path), p_(data), end_(data + size), begin_(data) {}
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  // `what` names the value for the error message, in pieces joined only when a read fails: a
  // long key read with each of an array's elements would otherwise be copied once per element.
  template <class T, class... Parts>
  T get(const Parts&... what) {
    if (left() < sizeof(T))
      bad_gguf(path_, join(what...) + ": truncated at byte " + std::to_string(offset()));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  // A length-prefixed string of at most max_len bytes (and the bytes left).
  template <class... Parts>
  std::string string(uint64_t max_len, const Parts&... what) {
    const auto n = get<uint64_t>(what..., " length");
    if (n > max_len || n > left())
      bad_gguf(path_, join(what...) + ": string of " + std::to_string(n) +
                          (n > left() ? " bytes runs past the file"
                                      : " bytes is longer than " + std::to_string(max_len)));
    std::string s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    // GGUF strings are UTF-8; the metadata becomes JSON, which cannot hold anything else (a
    // vocabulary token of stray bytes would otherwise fail later, in a JSON printer).
    if (!is_valid_utf8(s)) bad_gguf(path_, join(what...) + ": string is not valid UTF-8");
    p_ += n;
    return s;
  }
  json value(uint32_t type, const std::string& key, int depth) {
    switch (type) {
      case 0:
        return get<uint8_t>(key);
      case 1:
        return get<int8_t>(key);
      case 2:
        return get<uint16_t>(key);
      case 3:
        return get<int16_t>(key);
      case 4:
        return get<uint32_t>(key);
      case 5:
        return get<int32_t>(key);
      case 6:
        return get<float>(key);
      case 7: {
        const auto b = get<uint8_t>(key);
        if (b > 1) bad_gguf(path_, "metadata '" + key + "': bool is " + std::to_string(b));
        return b == 1;
      }
      case 8:
        return string(kMaxString, "metadata '", key, "'");
      case 9: {
        if (depth >= kMaxArrayDepth)
          bad_gguf(path_, "metadata '" + key + "': arrays nested too deep");
        const auto etype = get<uint32_t>(key, " array type");
        const auto n = get<uint64_t>(key, " array count");
        // every element takes at least one byte: a count beyond the bytes left is a lie
        if (n > kMaxCount || n > left())
          bad_gguf(path_, "metadata '" + key + "': array of " + std::to_string(n) +
                              " elements runs past the file");
        json arr = json::array();
        for (uint64_t i = 0; i < n; ++i) arr.push_back(value(etype, key, depth + 1));
        return arr;
      }
      case 10:
        return get<uint64_t>(key);
      case 11:
        return get<int64_t>(key);
      case 12:
        return get<double>(key);
      default:
        bad_gguf(path_, "metadata '" + key + "': unknown value type " + std::to_string(type));
    }
  }

 private:
  const std::string& path_;
  const std::byte* p_;
  const std::byte* end_;
  const std::byte* begin_;
};

}  // namespace

bool is_gguf_path(const std::filesystem::path& path) { return path.extension() == ".gguf"; }

GgufFile::GgufFile(const std::filesystem::path& path) : path_(path.string()) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path_ + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 24) {
    ::close(fd);
    bad_gguf(path_, "shorter than a GGUF header");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    bad_gguf(path_, "mmap failed");
  }
  try {
    const auto* base = static_cast<const std::byte*>(map_);
    Cursor c(path_, base, map_size_);
    if (std::memcmp(base, "GGUF", 4) != 0) bad_gguf(path_, "no GGUF magic");
    c.get<uint32_t>("magic");
    version_ = c.get<uint32_t>("version");
    if (version_ != 2 && version_ != 3)
      bad_gguf(path_, "version " + std::to_string(version_) + " (2 and 3 are read)");
    const auto n_tensors = c.get<uint64_t>("tensor count");
    const auto n_kv = c.get<uint64_t>("metadata count");
    if (n_tensors > kMaxCount || n_kv > kMaxCount || n_kv > c.left() || n_tensors > c.left())
      bad_gguf(path_, "tensor/metadata counts larger than the file can hold");
    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key = c.string(kMaxKey, "metadata key ", std::to_string(i));
      const auto type = c.get<uint32_t>("metadata '", key, "' type");
      json v = c.value(type, key, 0);
      if (meta_.contains(key)) bad_gguf(path_, "metadata key '" + key + "' appears twice");
      meta_[key] = std::move(v);
    }
    uint64_t align = 32;
    if (auto a = meta_.find("general.alignment"); a != meta_.end()) {
      if (!a->is_number_unsigned() || a->get<uint64_t>() == 0 || a->get<uint64_t>() > (1u << 20) ||
          (a->get<uint64_t>() & (a->get<uint64_t>() - 1)) != 0)
        bad_gguf(path_, "general.alignment must be a power of two up to 1 MiB");
      align = a->get<uint64_t>();
    }
    struct Info {
      std::string name;
      std::vector<int64_t> shape;
      DType dtype;
      uint64_t offset, nbytes;
    };
    std::vector<Info> infos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      Info t;
      t.name = c.string(kMaxTensorName, "tensor name ", std::to_string(i));
      const std::string where = "tensor '" + t.name + "'";
      const auto nd = c.get<uint32_t>(where, " dims");
      if (nd < 1 || nd > kMaxDims)
        bad_gguf(path_, where + ": " + std::to_string(nd) + " dimensions");
      uint64_t numel = 1;
      std::vector<int64_t> ne(nd);
      for (uint32_t d = 0; d < nd; ++d) {
        const auto n = c.get<uint64_t>(where, " dim");
        if (n == 0 || n > kMaxElements || numel > kMaxElements / n)
          bad_gguf(path_, where + ": dimensions overflow or are zero");
        numel *= n;
        ne[d] = static_cast<int64_t>(n);
      }
      t.shape.assign(ne.rbegin(), ne.rend());  // outermost first
      const auto type = c.get<uint32_t>(where, " type");
      if (!ggml_type(type, t.dtype))
        bad_gguf(path_, where + ": ggml type " + std::to_string(type) +
                            " is not read (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K are)");
      const DTypeBlock blk = dtype_block(t.dtype);
      if (ne[0] % blk.elems != 0)
        bad_gguf(path_, where + ": rows of " + std::to_string(ne[0]) + " elements are not whole " +
                            dtype_name(t.dtype) + " blocks");
      t.nbytes = numel / blk.elems * static_cast<uint64_t>(blk.bytes);
      t.offset = c.get<uint64_t>(where, " offset");
      if (t.offset % align != 0)
        bad_gguf(path_, where + ": offset not aligned to " + std::to_string(align));
      infos.push_back(std::move(t));
    }
    const uint64_t data_start = (c.offset() + align - 1) / align * align;
    if (data_start > map_size_) bad_gguf(path_, "data section starts past the end of the file");
    const uint64_t data_size = map_size_ - data_start;
    for (Info& t : infos) {
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        bad_gguf(path_, "tensor '" + t.name + "': bytes run past the end of the file");
      TensorView v;
      v.name = t.name;
      v.dtype = t.dtype;
      v.shape = std::move(t.shape);
      v.data = base + data_start + t.offset;
      v.nbytes = static_cast<size_t>(t.nbytes);
      v.file = path_;
      if (!tensors_.emplace(t.name, std::move(v)).second)
        bad_gguf(path_, "tensor '" + t.name + "' appears twice");
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, map_size_);
}

GgufModel::GgufModel(const std::filesystem::path& path) {
  // name-00001-of-00003.gguf: open every part
  static const std::regex split(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  std::smatch m;
  const std::string p = path.string();
  std::vector<std::string> files = {p};
  if (std::regex_match(p, m, split)) {
    const int count = std::stoi(m[3].str());
    if (m[2].str() != "00001")
      throw InputError(p + ": open a split model by its first part (-00001-)");
    if (count < 1 || count > 999) throw InputError(p + ": split count out of range");
    files.clear();
    for (int i = 1; i <= count; ++i) {
      char part[32];
      std::snprintf(part, sizeof part, "-%05d-of-%05d.gguf", i, count);
      files.push_back(m[1].str() + part);
    }
  }
  for (const std::string& f : files) {
    parts_.push_back(std::make_unique<GgufFile>(f));
    // llama.cpp's gguf-split records each part's place (split.no, from 0) and the part count:
    // where present they must agree with the file names, so a part of another split is refused.
    const nlohmann::json& meta = parts_.back()->metadata();
    const auto split_key = [&](const char* key, uint64_t expected) {
      auto it = meta.find(key);
      if (it == meta.end()) return;
      if (!it->is_number_unsigned() || it->get<uint64_t>() != expected)
        throw InputError(
            f + ": GGUF metadata '" + key + "' is " + json_excerpt(*it) + ", the file name says " +
            std::to_string(expected) +
            (files.size() == 1 ? " (open a split model by its -00001-of-0000N.gguf part)" : ""));
    };
    split_key("split.no", parts_.size() - 1);
    split_key("split.count", files.size());
    for (const auto& [name, view] : parts_.back()->tensors()) {
      if (!index_.emplace(name, &view).second)
        throw InputError(f + ": tensor '" + name + "' is also in an earlier part");
    }
  }
  if (auto it = parts_.front()->metadata().find("split.tensors.count");
      it != parts_.front()->metadata().end()) {
    if (!it->is_number_integer() || it->get<int64_t>() != static_cast<int64_t>(index_.size()))
      throw InputError(p + ": GGUF metadata 'split.tensors.count' is " + json_excerpt(*it) +
                       " but the parts hold " + std::to_string(index_.size()) + " tensors");
  }
}

const TensorView* GgufModel::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const nlohmann::json& GgufModel::require(const std::string& key) const {
  auto it = metadata().find(key);
  if (it == metadata().end() || it->is_null())
    throw InputError(path() + ": GGUF metadata '" + key + "' is missing");
  return *it;
}

}  // namespace moebatch
