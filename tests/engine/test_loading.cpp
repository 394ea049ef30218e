// Config parsing, safetensors validation (malformed files generated here into a temp dir),
// dtype conversions and the weight plan / sharding logic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "tests/common/files.h"
#include "tests/engine/reference.h"

namespace moebatch {
namespace {

using nlohmann::json;
using test::TempDir;
using test::test_data_dir;
using test::write_file;

json base_moe_config() {
  return json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
    "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
    "norm_topk_prob": true, "rope_theta": 10000.0, "rms_norm_eps": 1e-6})");
}

TEST(ModelConfig, ParsesAllFixtures) {
  const std::string d = test_data_dir();
  auto q3 = load_model_config(d + "/qwen3_moe_tiny");
  EXPECT_EQ(q3.arch, ModelArch::Qwen3Moe);
  EXPECT_EQ(q3.num_experts, 16);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_DOUBLE_EQ(q3.rope_theta, 1e6);
  auto q2 = load_model_config(d + "/qwen2_moe_tiny");  // rope_parameters, no architectures
  EXPECT_EQ(q2.arch, ModelArch::Qwen2Moe);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_EQ(q2.shared_expert_intermediate_size, 256);
  EXPECT_FALSE(q2.norm_topk_prob);
  EXPECT_DOUBLE_EQ(q2.rope_theta, 1e6);
  auto dn = load_model_config(d + "/qwen3_dense_tiny");
  EXPECT_EQ(dn.arch, ModelArch::Qwen3Dense);
  EXPECT_TRUE(dn.tie_word_embeddings);
  EXPECT_FALSE(dn.is_moe_layer(0));
  auto f8 = load_model_config(d + "/qwen3_moe_tiny_fp8");  // num_local_experts spelling
  EXPECT_EQ(f8.num_experts, 16);
  EXPECT_EQ(f8.quant, QuantMethod::Fp8Block);
  EXPECT_EQ(f8.quant_block_rows, 128);
}

TEST(ModelConfig, SparseStepAndMlpOnlyLayers) {
  json j = base_moe_config();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto c = parse_model_config(j, "c");
  std::vector<bool> moe;
  for (int i = 0; i < 6; ++i) moe.push_back(c.is_moe_layer(i));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
}

TEST(ModelConfig, RejectsUnsupportedAndInvalidWithFieldName) {
  struct Case {
    const char* field;
    json value;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"model_type", "llama", "model_type"},
      {"use_sliding_window", true, "use_sliding_window"},
      {"rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4}}, "rope_scaling"},
      {"rope_parameters", json{{"rope_type", "linear"}, {"rope_theta", 1e4}}, "rope_type"},
      {"hidden_size", -5, "hidden_size"},
      {"num_key_value_heads", 3, "num_key_value_heads"},
      {"num_experts_per_tok", 9, "num_experts_per_tok"},
      {"head_dim", 7, "head_dim"},
      {"hidden_act", "gelu", "hidden_act"},
      {"vocab_size", "64", "vocab_size"},
      {"quantization_config", json{{"quant_method", "awq"}}, "quant_method"},
      // string fields holding another type: refused naming the field (nlohmann's value(key, "")
      // threw type_error out of the parser before)
      {"quantization_config", json{{"quant_method", json::array({"fp8"})}}, "quantization_config.quant_method': expected a string"},
      {"quantization_config", json{{"quant_method", "modelopt"}, {"quant_algo", 4}}, "quant_algo': expected a string"},
      {"rope_scaling", json{{"rope_type", json::object()}}, "rope_scaling"},
      {"rope_scaling", json{{"type", 1}}, "rope_scaling"},
      {"layer_types", json{"sliding_attention", "full_attention"}, "layer_types"},
  };
  for (const auto& c : cases) {
    json j = base_moe_config();
    if (std::string(c.field) == "model_type") j.erase("architectures");
    j[c.field] = c.value;
    std::string err = config_error(j);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.field << " -> '" << err << "'";
  }
  json j = base_moe_config();
  j.erase("hidden_size");
  EXPECT_NE(config_error(j).find("hidden_size': missing"), std::string::npos) << config_error(j);
  j = base_moe_config();
  j["architectures"] = {"MixtralForCausalLM"};
  EXPECT_NE(config_error(j).find("Mixtral"), std::string::npos);
}

TEST(ModelConfig, FileErrors) {
  TempDir tmp;
  EXPECT_THROW(load_model_config(tmp.path()), InputError);  // missing
  write_file(tmp.path() / "config.json", "{not json");
  EXPECT_THROW(load_model_config(tmp.path()), InputError);
  // Deep nesting is refused at the parse: quoting such a value in the error message (or
  // copying it) would overflow the stack.
  write_file(tmp.path() / "config.json",
             "{\"architectures\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  try {
    load_model_config(tmp.path());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than"), std::string::npos) << e.what();
  }
  // A wrong value is quoted in short.
  json j = base_moe_config();
  j["hidden_act"] = std::string(10000, 'x');
  write_file(tmp.path() / "config.json", j.dump());
  try {
    load_model_config(tmp.path());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
  }
}

TEST(Dtype, ConversionsMatchDefinitions) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (int i = 0; i < 1000; ++i) {
    float x = u(rng);
    float back = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(back - x), std::fabs(x) * (1.0f / 256)) << x;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);                  // exp 7, man 0
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
}

TEST(Safetensors, ReadsValidFileAndRoundTripsWriter) {
  TempDir tmp;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd;
  std::vector<float> a(12);
  for (auto& v : a) v = nd(rng);
  std::vector<int32_t> b = {1, -2, 3};
  write_safetensors(tmp.path() / "x.safetensors",
                    {{"a", {3, 4}, DType::F32, std::as_bytes(std::span(a))},
                     {"b", {3}, DType::I32, std::as_bytes(std::span(b))}});
  SafetensorsFile f(tmp.path() / "x.safetensors");
  const auto& ta = f.at("a");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{3, 4}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(ta.get_f32(i), a[i]);
  EXPECT_EQ(f.at("b").get_f32(1), -2.0f);
  EXPECT_THROW(f.at("c"), InputError);
}

struct Malformed {
  const char* label;
  std::string bytes;
  const char* expect;
};

std::string file_bytes(const std::string& header, size_t data_bytes, int64_t hlen_override = -1) {
  uint64_t n = hlen_override >= 0 ? static_cast<uint64_t>(hlen_override) : header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s + header + std::string(data_bytes, '\x11');
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  TempDir tmp;
  auto ok = json{{"w", {{"dtype", "BF16"}, {"shape", {2, 3}}, {"data_offsets", {0, 12}}}}};
  std::vector<Malformed> cases = {
      {"truncated_header_len", std::string("\x05\x00\x00", 3), "shorter than the 8-byte"},
      {"header_past_end", file_bytes(ok.dump(), 0, 1000), "runs past the end"},
      {"header_too_big", file_bytes("{}", 0, int64_t{1} << 40), "exceeds"},
      {"bad_json", file_bytes("{\"w\": [", 12), "not a valid JSON"},
      {"truncated_data", file_bytes(ok.dump(), 6), "outside the"},
      {"offset_out_of_range",
       file_bytes(
           json{{"w", {{"dtype", "BF16"}, {"shape", {2, 3}}, {"data_offsets", {8, 20}}}}}.dump(),
           12),
       "outside the"},
      {"size_mismatch",
       file_bytes(
           json{{"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 12}}}}}.dump(),
           12),
       "needs 24"},
      {"unknown_dtype",
       file_bytes(
           json{{"w", {{"dtype", "Q4_K"}, {"shape", {2, 3}}, {"data_offsets", {0, 12}}}}}.dump(),
           12),
       "unsupported dtype 'Q4_K'"},
      {"overlap",
       file_bytes(json{{"a", {{"dtype", "U8"}, {"shape", {8}}, {"data_offsets", {0, 8}}}},
                       {"b", {{"dtype", "U8"}, {"shape", {8}}, {"data_offsets", {4, 12}}}}}
                      .dump(),
                  12),
       "overlap"},
      {"negative_dim",
       file_bytes(json{{"w", {{"dtype", "U8"}, {"shape", {-1}}, {"data_offsets", {0, 0}}}}}.dump(),
                  0),
       "not a valid dimension"},
      {"missing_offsets", file_bytes(json{{"w", {{"dtype", "U8"}, {"shape", {1}}}}}.dump(), 1),
       "data_offsets"},
      // 2^40 · 2^24 wraps nothing: refused before the multiply
      {"shape_overflow",
       file_bytes(json{{"w",
                        {{"dtype", "U8"},
                         {"shape", {uint64_t{1} << 40, uint64_t{1} << 24}},
                         {"data_offsets", {0, 0}}}}}
                      .dump(),
                  0),
       "too many elements"},
      // 100,000 levels parse in linear time, but printing or copying them would recurse
      {"deep_shape",
       file_bytes("{\"w\": {\"dtype\": \"U8\", \"shape\": " + std::string(100000, '[') +
                      std::string(100000, ']') + ", \"data_offsets\": [0, 0]}}",
                  0),
       "nested deeper than"},
  };
  for (const auto& c : cases) {
    const std::string path = tmp.file(std::string(c.label) + ".safetensors");
    write_file(path, c.bytes);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << c.label << ": no error";
    } catch (const InputError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(c.expect), std::string::npos) << c.label << ": " << what;
      EXPECT_NE(what.find(c.label), std::string::npos) << "message must name the file: " << what;
    }
  }
}

TEST(Safetensors, ShardedIndex) {
  TempDir tmp;
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  write_safetensors(tmp.path() / "s1.safetensors",
                    {{"a", {2}, DType::F32, std::as_bytes(std::span(a))}});
  write_safetensors(tmp.path() / "s2.safetensors",
                    {{"b", {3}, DType::F32, std::as_bytes(std::span(b))}});
  write_file(tmp.path() / "model.safetensors.index.json",
             R"({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  Checkpoint ck(tmp.path());
  EXPECT_EQ(ck.at("b").get_f32(2), 5.0f);
  EXPECT_EQ(ck.at("a").get_f32(0), 1.0f);
  EXPECT_THROW(ck.at("zz"), InputError);
  write_file(tmp.path() / "model.safetensors.index.json",
             R"({"weight_map": {"a": "../etc/passwd"}})");
  EXPECT_THROW(Checkpoint{tmp.path()}, InputError);
}

TEST(Weights, ShapeMismatchNamesTensorExpectedAndActual) {
  TempDir tmp;
  auto cfg = load_model_config(test_data_dir() + "/qwen3_moe_tiny");
  cfg.hidden_size = 64;  // the checkpoint says 128
  Checkpoint ck(test_data_dir() + "/qwen3_moe_tiny");
  try {
    load_weights(ck, cfg, {});
    FAIL() << "no error";
  } catch (const InputError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("model.embed_tokens.weight"), std::string::npos) << w;
    EXPECT_NE(w.find("[1024, 128]"), std::string::npos) << w;
    EXPECT_NE(w.find("[1024, 64]"), std::string::npos) << w;
  }
}

TEST(Weights, WrongCheckpointIsRefusedBeforeAllocating) {
  // A config whose embedding alone is 512 GiB of fp32, over the tiny checkpoint: the tensor is
  // named before anything that size is allocated.
  auto cfg = load_model_config(test_data_dir() + "/qwen3_moe_tiny");
  cfg.vocab_size = int64_t{1} << 30;
  Checkpoint ck(test_data_dir() + "/qwen3_moe_tiny");
  try {
    load_weights(ck, cfg, {});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos)
        << e.what();
  }
}

TEST(Weights, MissingTensorIsNamed) {
  TempDir tmp;
  std::vector<float> a = {1, 2};
  write_safetensors(tmp.path() / "model.safetensors",
                    {{"x", {2}, DType::F32, std::as_bytes(std::span(a))}});
  Checkpoint ck(tmp.path());
  auto cfg = load_model_config(test_data_dir() + "/qwen3_moe_tiny");
  try {
    load_weights(ck, cfg, {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos);
  }
}

// Shards reassembled along their split dims must equal the unsharded tensors.
TEST(Weights, ShardsReassembleToFullModel) {
  const std::string dir = test_data_dir() + "/qwen2_moe_tiny";
  auto cfg = load_model_config(dir);
  Checkpoint ck(dir);
  auto full = load_weights(ck, cfg, {});
  const int world = 4;
  std::vector<ModelWeights> shards;
  for (int r = 0; r < world; ++r) shards.push_back(load_weights(ck, cfg, {r, world}));
  const auto& L = full.layers[1];
  const int64_t H = cfg.hidden_size, hd = cfg.head_dim;
  for (int r = 0; r < world; ++r) {
    const auto& S = shards[r].layers[1];
    // q rows lead the fused wqkv matrix: a shard's q heads are its slice of the full q rows
    const int64_t qr = cfg.num_heads / world * hd;
    for (int64_t i = 0; i < qr * H; ++i) ASSERT_EQ(S.wqkv.data[i], L.wqkv.data[r * qr * H + i]);
    for (int64_t i = 0; i < qr; ++i) ASSERT_EQ(S.bqkv.data[i], L.bqkv.data[r * qr + i]);
    const int64_t oc = S.wo.shape[1];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < oc; ++c)
        ASSERT_EQ(S.wo.data[h * oc + c], L.wo.data[h * cfg.num_heads * hd + r * oc + c]);
    const int64_t n = S.w_gate_up.shape[1] / 2, I = cfg.moe_intermediate_size;
    for (int64_t e = 0; e < cfg.num_experts; ++e)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h) {
          ASSERT_EQ(S.w_gate_up.data[(e * 2 * n + i) * H + h],
                    L.w_gate_up.data[(e * 2 * I + r * n + i) * H + h]);
          ASSERT_EQ(S.w_gate_up.data[(e * 2 * n + n + i) * H + h],
                    L.w_gate_up.data[(e * 2 * I + I + r * n + i) * H + h]);
          ASSERT_EQ(S.w_down.data[(e * H + h) * n + i], L.w_down.data[(e * H + h) * I + r * n + i]);
        }
    EXPECT_EQ(S.router.data, L.router.data);
    EXPECT_EQ(shards[r].lm_head.shape[0], cfg.vocab_size / world);
  }
}

TEST(Weights, KvHeadsReplicatedWhenFewerThanRanks) {
  auto cfg = load_model_config(test_data_dir() + "/qwen3_dense_tiny");  // 8 q heads, 2 kv
  for (int r = 0; r < 4; ++r) {
    auto d = shard_dims(cfg, {r, 4});
    EXPECT_EQ(d.num_kv_heads, 1);
    EXPECT_EQ(d.kv_head0, r / 2);
    EXPECT_EQ(d.num_heads, 2);
  }
  EXPECT_THROW(shard_dims(cfg, {0, 3}), InputError);
}

TEST(Weights, Fp8BlockDequantMatchesManual) {
  const std::string dir = test_data_dir() + "/qwen3_moe_tiny_fp8";
  auto cfg = load_model_config(dir);
  Checkpoint ck(dir);
  auto w = load_weights(ck, cfg, {});
  // o_proj is [128, 256] with scale [1, 2]: check both column blocks.
  const auto& q = ck.at("model.layers.2.self_attn.o_proj.weight");
  const auto& s = ck.at("model.layers.2.self_attn.o_proj.weight_scale_inv");
  std::mt19937 rng(std::random_device{}());
  for (int k = 0; k < 200; ++k) {
    int64_t r = rng() % 128, c = rng() % 256;
    float want = q.get_f32(r * 256 + c) * s.get_f32(c / 128);
    ASSERT_EQ(w.layers[2].wo.data[r * 256 + c], want);
  }
}

// NVFP4 decoded by hand from the stored bytes: E2M1 code (low nibble first) × F8_E4M3 group
// scale × weight_scale_2, on fresh random elements of an expert's down_proj.
TEST(Weights, Nvfp4DequantMatchesManual) {
  const std::string dir = test_data_dir() + "/qwen3_moe_tiny_nvfp4";
  auto cfg = load_model_config(dir);
  ASSERT_EQ(cfg.quant, QuantMethod::Nvfp4);
  EXPECT_EQ(cfg.quant_group_size, 16);
  EXPECT_TRUE(quant_excluded(cfg, "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(quant_excluded(cfg, "model.layers.0.mlp.gate"));
  EXPECT_FALSE(quant_excluded(cfg, "model.layers.0.self_attn.q_proj"));
  Checkpoint ck(dir);
  auto w = load_weights(ck, cfg, {});
  const std::string name = "model.layers.1.mlp.experts.5.down_proj.weight";
  const auto& q = ck.at(name);
  const auto& sc = ck.at(name + "_scale");
  const float s2 = ck.at(name + "_scale_2").get_f32(0);
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size;  // down_proj is [H, I]
  static const float kE2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  std::mt19937 rng(std::random_device{}());
  for (int k = 0; k < 300; ++k) {
    const int64_t r = rng() % H, c = rng() % I;
    const auto byte = static_cast<uint8_t>(q.data[r * (I / 2) + c / 2]);
    const uint8_t code = c % 2 ? byte >> 4 : byte & 15;
    const float want =
        (code & 8 ? -1.f : 1.f) * kE2m1[code & 7] * sc.get_f32(r * (I / 16) + c / 16) * s2;
    ASSERT_EQ(w.layers[1].w_down.data[(5 * H + r) * I + c], want) << r << "," << c;
  }
}

// A copy of the NVFP4 fixture whose config.json and/or safetensors header is edited by `edit`;
// loading it must fail with an InputError containing every string of `expect`.
void expect_nvfp4_error(const std::function<void(json& config, json& header)>& edit,
                        const std::vector<std::string>& expect) {
  TempDir tmp;
  const std::string src = test_data_dir() + "/qwen3_moe_tiny_nvfp4";
  json config = json::parse(test::read_file(src + "/config.json"));
  const std::string bytes = test::read_file(src + "/model.safetensors");
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, hlen));
  edit(config, header);
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  const uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  write_file(tmp.file("model.safetensors"), out + h + bytes.substr(8 + hlen));
  write_file(tmp.file("config.json"), config.dump());
  try {
    auto cfg = load_model_config(tmp.path());
    Checkpoint ck(tmp.path());
    load_weights(ck, cfg, {});
    FAIL() << "no error";
  } catch (const InputError& e) {
    for (const auto& want : expect)
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(Weights, Nvfp4BadInputsNameTheTensorOrField) {
  const std::string down = "model.layers.0.mlp.experts.3.down_proj.weight";
  // an unsupported ModelOpt algorithm
  expect_nvfp4_error([](json& c, json&) { c["quantization_config"]["quant_algo"] = "W4A8_AWQ"; },
                     {"quant_algo", "W4A8_AWQ"});
  // a missing group scale
  expect_nvfp4_error(
      [&](json&, json& h) {
        h[down + "_scalX"] = h[down + "_scale"];
        h.erase(down + "_scale");
      },
      {down + "_scale", "missing"});
  // a mis-shaped global scale
  expect_nvfp4_error([&](json&, json& h) { h[down + "_scale_2"]["shape"] = {1}; },
                     {down + "_scale_2", "shape [1]"});
  // the config does not exclude a module the checkpoint stores in BF16
  expect_nvfp4_error(
      [](json& c, json&) {
        c["quantization_config"]["exclude_modules"] = {"lm_head", "model.embed_tokens",
                                                       "model.layers.*.mlp.gate"};
      },
      {"model.layers.2.self_attn.q_proj.weight", "does not exclude"});
  // the config excludes modules the checkpoint stores packed
  expect_nvfp4_error(
      [](json& c, json&) {
        c["quantization_config"]["exclude_modules"].push_back("model.layers.0.self_attn*");
      },
      {"model.layers.0.self_attn.q_proj.weight", "excludes"});
  // packed FP4 without any NVFP4 config
  expect_nvfp4_error([](json& c, json&) { c.erase("quantization_config"); },
                     {"model.layers.0.self_attn.q_proj.weight", "U8"});
}

// ModelOpt may state the quantization only in hf_quant_config.json.
TEST(ModelConfig, Nvfp4FromHfQuantConfig) {
  TempDir tmp;
  const std::string src = test_data_dir() + "/qwen3_moe_tiny_nvfp4";
  json config = json::parse(test::read_file(src + "/config.json"));
  config.erase("quantization_config");
  write_file(tmp.file("config.json"), config.dump());
  write_file(tmp.file("hf_quant_config.json"), test::read_file(src + "/hf_quant_config.json"));
  const ModelConfig cfg = load_model_config(tmp.path());
  EXPECT_EQ(cfg.quant, QuantMethod::Nvfp4);
  EXPECT_EQ(cfg.quant_exclude.size(), 5u);
  write_file(tmp.file("hf_quant_config.json"), R"({"quantization": {"quant_algo": "FP8"}})");
  EXPECT_THROW(load_model_config(tmp.path()), InputError);
}

}  // namespace
}  // namespace moebatch
