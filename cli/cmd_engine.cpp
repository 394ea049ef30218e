// CLI commands of the engine module: logits (teacher-forced logits to a safetensors file) and
// generate (token ids in, token ids out). Used by tests and by people debugging the engine.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/factory.h"
#include "engine/safetensors.h"

namespace moebatch::cli {
namespace {

/// Flags shared by both commands: the engine to build, and the prompt.
struct ModelFlags {
  EngineSpec spec;
  std::string tokens;
  bool expert_parallel = false;
  bool disable_custom_all_reduce = false;
  std::string quantization = "auto";
};

void add_model_flags(CLI::App* cmd, ModelFlags& f) {
  cmd->add_option("--model", f.spec.model,
                  "Checkpoint directory (config.json + *.safetensors), or random:<shape> "
                  "(random weights; cuda)")
      ->required();
  cmd->add_option("--tokens", f.tokens, "Prompt token ids, comma-separated (e.g. 1,2,3)")
      ->required();
  cmd->add_option("--backend", f.spec.backend, "cpu | cuda (default cpu)");
  cmd->add_option("--tensor-parallel-size,--tp", f.spec.tensor_parallel_size,
                  "Tensor-parallel ranks (default 1)");
  cmd->add_flag("--enable-expert-parallel", f.expert_parallel,
                "Whole experts per rank instead of splitting each expert's width");
  cmd->add_flag("--disable-custom-all-reduce", f.disable_custom_all_reduce,
                "cuda, tp > 1: NCCL for every all-reduce (default: small ones peer-to-peer, "
                "fused with the residual add + RMSNorm)");
  cmd->add_option("--threads", f.spec.threads, "CPU compute threads (default: all cores)");
  cmd->add_option("--gpu-memory-utilization", f.spec.gpu_memory_utilization,
                  "cuda: share of GPU memory for weights, activations and KV cache (default 0.90)");
  cmd->add_option("--quantization", f.quantization,
                  "cuda linear weights: auto (a checkpoint's FP8 / NVFP4 stay compressed) | none | "
                  "fp8 | nvfp4 | int4 (also quantize bf16 weights on load; int4 is GGUF Q4_K's "
                  "form) (default auto)");
}

std::unique_ptr<Engine> build(ModelFlags& f) {
  f.spec.expert_split = f.expert_parallel ? ExpertSplit::Expert : ExpertSplit::Intermediate;
  f.spec.custom_all_reduce = !f.disable_custom_all_reduce;
  f.spec.quantization = parse_quantization(f.quantization);
  // One sequence at a time: 64 MiB of host KV holds tens of thousands of tokens of the tiny
  // models (a GPU's KV pool is sized by its memory plan).
  if (f.spec.backend == "cpu") f.spec.kv_cache_bytes = 64 << 20;
  return make_engine(f.spec).engine;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
      throw InputError("--tokens: '" + item + "' is not a token id");
    }
    out.push_back(static_cast<int32_t>(v));
  }
  if (out.empty()) throw InputError("--tokens: no token ids given");
  return out;
}

}  // namespace

void register_engine_commands(CLI::App& app) {
  auto lf = std::make_shared<ModelFlags>();
  auto out = std::make_shared<std::string>();
  auto* logits = app.add_subcommand(
      "logits",
      "Teacher-forced logits of every prompt position → float32 tensor 'logits' [T, vocab]");
  add_model_flags(logits, *lf);
  logits->add_option("--out", *out, "Output .safetensors file")->required();
  logits->callback([lf, out] {
    auto tokens = parse_tokens(lf->tokens);
    auto engine = build(*lf);
    std::vector<float> l = engine->score(tokens);
    write_safetensors(*out, {{"logits",
                              {static_cast<int64_t>(tokens.size()), engine->config().vocab_size},
                              DType::F32,
                              std::as_bytes(std::span(l))}});
  });

  auto gf = std::make_shared<ModelFlags>();
  auto sp = std::make_shared<GenerationParams>();
  auto as_json = std::make_shared<bool>(false);
  auto* gen = app.add_subcommand("generate", "Generate token ids from a prompt (prompt excluded)");
  add_model_flags(gen, *gf);
  gen->add_option("--max-tokens", sp->max_tokens, "Tokens to generate at most")->required();
  gen->add_option("--temperature", sp->temperature,
                  "0 = greedy; default 1.0 (OpenAI's default, as for queued jobs)");
  gen->add_option("--top-k", sp->top_k, "Keep the k most likely tokens (0 = all)");
  gen->add_option("--top-p", sp->top_p, "Nucleus probability mass (default 1)");
  gen->add_option("--seed", sp->seed, "Sampler seed (default 0)");
  gen->add_option("--stop", sp->stop_token_ids, "Stop token ids")->delimiter(',');
  gen->add_flag("--json", *as_json, "Print {\"tokens\": [...]} ");
  gen->callback([gf, sp, as_json] {
    Request r;
    r.prompt = parse_tokens(gf->tokens);
    r.sampling = *sp;
    auto engine = build(*gf);
    engine->add(r);
    auto fin = run_to_completion(*engine);
    MB_CHECK(fin.size() == 1, "one request must finish exactly once");
    if (*as_json) {
      std::cout << nlohmann::json{{"tokens", fin[0].tokens}}.dump() << "\n";
    } else {
      for (size_t i = 0; i < fin[0].tokens.size(); ++i)
        std::cout << (i ? " " : "") << fin[0].tokens[i];
      std::cout << "\n";
    }
  });
}

}  // namespace moebatch::cli
