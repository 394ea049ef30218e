// GGUF: the parser against malformed files built byte by byte (truncation, lying counts and
// lengths, bad offsets, overflowing dimensions, unknown types — the classes of the format's
// published parser CVEs), the k-quant decoders against a hand decode, and the name mapping. The
// fixture's oracle comparison is in test_reference.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/ggml_quants.h"
#include "engine/gguf.h"
#include "engine/gguf_source.h"
#include "tests/common/files.h"
#include "tests/common/sanitizers.h"

namespace moebatch {
namespace {

using test::TempDir;

// A little-endian GGUF image assembled field by field.
struct Bytes {
  std::string b;
  template <class T>
  Bytes& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
};

// A valid v3 file: one string key, general.alignment 32, one F32 tensor "w" [2, 4] (ne 4, 2).
Bytes valid_file(uint64_t offset = 0, uint32_t type = 0, uint64_t ne0 = 4) {
  Bytes f;
  f.b = "GGUF";
  f.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(2);
  f.str("general.architecture").put<uint32_t>(8).str("qwen3moe");
  f.str("general.alignment").put<uint32_t>(4).put<uint32_t>(32);
  f.str("w").put<uint32_t>(2).put<uint64_t>(ne0).put<uint64_t>(2).put<uint32_t>(type).put<uint64_t>(
      offset);
  f.b.resize((f.b.size() + 31) / 32 * 32, '\0');
  for (int i = 0; i < 8; ++i) f.put<float>(static_cast<float>(i) + 0.5f);
  return f;
}

std::string load_error(const std::string& bytes) {
  TempDir tmp;
  const std::string path = tmp.file("m.gguf");
  test::write_file(path, bytes);
  try {
    GgufFile f(path);
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

TEST(Gguf, ReadsAValidFile) {
  TempDir tmp;
  test::write_file(tmp.file("m.gguf"), valid_file().b);
  GgufFile f(tmp.file("m.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().at("general.architecture"), "qwen3moe");
  const TensorView& w = f.tensors().at("w");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 4}));  // ne reversed: outermost first
  EXPECT_EQ(w.get_f32(5), 5.5f);
}

TEST(Gguf, MalformedFilesGiveClearErrors) {
  const std::string good = valid_file().b;
  // truncated at every length up to the end of the header: never a crash, always an error
  for (size_t n = 0; n < good.size() - 32; n += 3) {
    const std::string err = load_error(good.substr(0, n));
    EXPECT_FALSE(err.empty()) << "truncated to " << n;
  }
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  };
  auto patched = [&](size_t at, uint64_t v) {
    std::string s = good;
    std::memcpy(s.data() + at, &v, 8);
    return s;
  };
  std::vector<Case> cases = {
      {"bad magic", "GGUX" + good.substr(4), "magic"},
      {"version 1",
       [&] {
         std::string s = good;
         s[4] = 1;
         return s;
       }(),
       "version"},
      {"huge tensor count", patched(8, uint64_t{1} << 40), "counts"},
      {"huge key count", patched(16, ~uint64_t{0}), "counts"},
      {"string longer than the file", patched(24, uint64_t{1} << 33), "runs past"},
      {"offset past the end", valid_file(4096).b, "past the end"},
      {"unaligned offset", valid_file(4).b, "aligned"},
      {"unknown ggml type", valid_file(0, 2).b, "ggml type 2"},
      {"rows not whole blocks", valid_file(0, 8, 4).b, "blocks"},
      {"dimension overflow", valid_file(0, 0, uint64_t{1} << 62).b, "overflow"},
  };
  for (const Case& c : cases) {
    const std::string err = load_error(c.bytes);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": " << err;
  }
  // an array whose count exceeds the bytes left
  Bytes arr;
  arr.b = "GGUF";
  arr.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  arr.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1000000);
  EXPECT_NE(load_error(arr.b).find("array"), std::string::npos);
  // arrays nested without end
  Bytes nest;
  nest.b = "GGUF";
  nest.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1).str("k");
  nest.put<uint32_t>(9);
  for (int i = 0; i < 8; ++i) nest.put<uint32_t>(9).put<uint64_t>(1);
  EXPECT_NE(load_error(nest.b).find("nested"), std::string::npos);
  // strings that are not UTF-8 (GGUF's strings are; the metadata becomes JSON, which cannot hold
  // them): a vocabulary token, a key, a tensor name — each named in the error
  Bytes vocab;
  vocab.b = "GGUF";
  vocab.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  vocab.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2);
  vocab.str("ok").str("bad\xC3(");
  const std::string vocab_err = load_error(vocab.b);
  EXPECT_NE(vocab_err.find("tokenizer.ggml.tokens"), std::string::npos) << vocab_err;
  EXPECT_NE(vocab_err.find("not valid UTF-8"), std::string::npos) << vocab_err;
  Bytes key;
  key.b = "GGUF";
  key.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  key.str("k\xFF").put<uint32_t>(4).put<uint32_t>(1);
  EXPECT_NE(load_error(key.b).find("not valid UTF-8"), std::string::npos) << load_error(key.b);
  std::string name = good;
  const size_t w = name.find("w\x02\x00\x00\x00");  // the tensor name "w" and its dimension count
  ASSERT_NE(w, std::string::npos);
  name[w] = '\x80';
  EXPECT_NE(load_error(name).find("not valid UTF-8"), std::string::npos) << load_error(name);
}

TEST(Gguf, LongKeysAndNamesAreBounded) {
  // A key over the spec's 65535 bytes, a tensor name over 256: refused by their lengths.
  Bytes key;
  key.b = "GGUF";
  key.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1).str(std::string(70000, 'k'));
  key.put<uint32_t>(4).put<uint32_t>(1);
  EXPECT_NE(load_error(key.b).find("longer than 65535"), std::string::npos) << load_error(key.b);
  Bytes name;
  name.b = "GGUF";
  name.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0).str(std::string(300, 'w'));
  name.put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(0);
  EXPECT_NE(load_error(name.b).find("longer than 256"), std::string::npos) << load_error(name.b);

  // The longest key with an array of a million strings (8 MB): the reader names the key only on
  // an error, so this is one pass over the bytes — not a copy of the key per element (60 GB).
  Bytes arr;
  arr.b = "GGUF";
  const std::string long_key(65535, 'a');
  arr.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1).str(long_key);
  arr.put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1'000'000);
  for (int i = 0; i < 1'000'000; ++i) arr.str("");
  arr.b.resize((arr.b.size() + 31) / 32 * 32, '\0');  // the (empty) data section's alignment
  TempDir tmp;
  test::write_file(tmp.file("m.gguf"), arr.b);
  const auto t0 = std::chrono::steady_clock::now();
  GgufFile f(tmp.file("m.gguf"));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(f.metadata().at(long_key).size(), 1'000'000u);
  EXPECT_LT(secs, test::kSanitizerBuild ? 60.0 : 10.0);  // linear: well under a second
}

// A part of a split model as llama.cpp's gguf-split writes it: split.no (from 0), split.count,
// split.tensors.count on the first part; one F32 tensor [4] per part.
std::string split_part(uint16_t no, uint16_t count, int32_t tensors, const std::string& tensor) {
  Bytes f;
  f.b = "GGUF";
  f.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(no == 0 ? 3 : 2);
  f.str("split.no").put<uint32_t>(2).put<uint16_t>(no);
  f.str("split.count").put<uint32_t>(2).put<uint16_t>(count);
  if (no == 0) f.str("split.tensors.count").put<uint32_t>(5).put<int32_t>(tensors);
  f.str(tensor).put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(0);
  f.b.resize((f.b.size() + 31) / 32 * 32, '\0');
  for (int i = 0; i < 4; ++i) f.put<float>(1.f);
  return f.b;
}

TEST(Gguf, SplitPartsMustAgreeWithTheirNames) {
  TempDir tmp;
  const std::string first = tmp.file("m-00001-of-00002.gguf"),
                    second = tmp.file("m-00002-of-00002.gguf");
  const auto open = [&]() -> std::string {
    try {
      GgufModel m(first);
      return "";
    } catch (const InputError& e) {
      return e.what();
    }
  };
  test::write_file(first, split_part(0, 2, 2, "a"));
  test::write_file(second, split_part(1, 2, 0, "b"));
  EXPECT_EQ(open(), "");
  // a part of another split (its place or count differ from the file name's)
  test::write_file(second, split_part(0, 2, 0, "b"));
  EXPECT_NE(open().find("split.no"), std::string::npos) << open();
  test::write_file(second, split_part(1, 3, 0, "b"));
  EXPECT_NE(open().find("split.count"), std::string::npos) << open();
  // the first part's tensor count disagrees with the parts
  test::write_file(first, split_part(0, 2, 7, "a"));
  test::write_file(second, split_part(1, 2, 0, "b"));
  EXPECT_NE(open().find("split.tensors.count"), std::string::npos) << open();
  // one part of a split opened under a plain name
  const std::string lone = tmp.file("lone.gguf");
  test::write_file(lone, split_part(0, 2, 1, "a"));
  try {
    GgufModel m(lone);
    ADD_FAILURE() << "a part of a split opened alone";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("-00001-of-"), std::string::npos) << e.what();
  }
}

// Q8_0 and Q6_K decoded by hand from their definitions on random blocks.
TEST(GgmlQuants, Q8_0AndQ6_KMatchTheirDefinition) {
  std::mt19937 rng(std::random_device{}());
  std::string q8(34, '\0');
  const uint16_t one_half = 0x3800;  // f16 0.5
  std::memcpy(q8.data(), &one_half, 2);
  for (int i = 0; i < 32; ++i) q8[2 + i] = static_cast<char>(rng());
  float y[256];
  dequantize_row(DType::Q8_0, reinterpret_cast<const std::byte*>(q8.data()), y, 32);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(y[i], 0.5f * static_cast<int8_t>(q8[2 + i]));

  std::string q6(210, '\0');
  for (int i = 0; i < 208; ++i) q6[i] = static_cast<char>(rng());
  const uint16_t two = 0x4000;  // f16 2.0
  std::memcpy(q6.data() + 208, &two, 2);
  dequantize_row(DType::Q6_K, reinterpret_cast<const std::byte*>(q6.data()), y, 256);
  auto u8 = [&](int i) { return static_cast<uint8_t>(q6[i]); };
  for (int e = 0; e < 256; ++e) {
    // element e: half h = e / 128, within it quarter k = (e % 128) / 32, lane l = e % 32
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t lo = u8(h * 64 + l + (k % 2) * 32);
    const int low4 = k < 2 ? lo & 15 : lo >> 4;
    const int high2 = (u8(128 + h * 32 + l) >> (2 * k)) & 3;
    const int8_t scale = static_cast<int8_t>(q6[192 + h * 8 + l / 16 + 2 * k]);
    ASSERT_EQ(y[e], 2.0f * scale * ((low4 | high2 << 4) - 32)) << e;
  }
}

// The integer form of every ggml format the GPU keeps (unpack_row) gives back ggml's decoded
// values exactly: code · scale − min in fp32 is the arithmetic the decoders do. Random blocks
// with finite f16 scales; every group size the loader uses (the sub-block, and 16).
TEST(GgmlQuants, UnpackedCodesReproduceTheDecodedValues) {
  std::mt19937 rng(std::random_device{}());
  for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const DTypeBlock blk = dtype_block(t);
    const int blocks = 3, n = blocks * static_cast<int>(blk.elems);
    std::string bytes(static_cast<size_t>(blocks * blk.bytes), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    // f16 scales (d, dmin; Q6_K's d is last): finite values in ±[2^-8, 2^2)
    const size_t d_at = t == DType::Q6_K ? 208 : 0;
    for (int b = 0; b < blocks; ++b)
      for (size_t off : t == DType::Q8_0 || t == DType::Q6_K ? std::vector<size_t>{d_at}
                                                             : std::vector<size_t>{0, 2}) {
        const auto h = static_cast<uint16_t>((rng() & 0x83ff) | ((7 + rng() % 10) << 10));
        std::memcpy(bytes.data() + b * blk.bytes + off, &h, 2);
      }
    const auto* src = reinterpret_cast<const std::byte*>(bytes.data());
    std::vector<float> want(static_cast<size_t>(n));
    dequantize_row(t, src, want.data(), n);
    for (int group : {ggml_subblock(t), 16}) {
      std::vector<int8_t> codes(static_cast<size_t>(n));
      std::vector<float> scales(static_cast<size_t>(n / group)), mins(scales.size());
      unpack_row(t, src, n, group, codes.data(), scales.data(), mins.data());
      for (int i = 0; i < n; ++i) {
        const auto g = static_cast<size_t>(i / group);
        ASSERT_EQ(static_cast<float>(codes[static_cast<size_t>(i)]) * scales[g] - mins[g],
                  want[static_cast<size_t>(i)])
            << dtype_name(t) << " group " << group << " element " << i;
      }
    }
  }
  std::vector<int8_t> c(32);
  std::vector<float> s(2), m(2);
  EXPECT_THROW(unpack_row(DType::Q6_K, nullptr, 256, 32, c.data(), s.data(), m.data()), Error)
      << "a group larger than Q6_K's sub-block of 16";
}

TEST(Gguf, HubNamesMapOntoGgufNames) {
  EXPECT_EQ(gguf_name_of("model.embed_tokens.weight")->name, "token_embd.weight");
  EXPECT_EQ(gguf_name_of("lm_head.weight")->name, "output.weight");
  EXPECT_EQ(gguf_name_of("model.layers.7.self_attn.k_norm.weight")->name,
            "blk.7.attn_k_norm.weight");
  const auto e = gguf_name_of("model.layers.2.mlp.experts.13.down_proj.weight");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->name, "blk.2.ffn_down_exps.weight");
  EXPECT_EQ(e->expert, 13);
  EXPECT_FALSE(gguf_name_of("model.layers.2.mlp.unknown.weight").has_value());
}

}  // namespace
}  // namespace moebatch
