#include "engine/factory.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include "common/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/device_query.h"
#include "engine/model_shapes.h"
#ifdef MOEBATCH_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace moebatch {
namespace {

constexpr const char* kRandomPrefix = "random:";
// The CPU backend's KV pool when the spec names none: tens of thousands of tokens of the tiny
// models, enough for tests and the demo.
constexpr int64_t kCpuDefaultKvBytes = 256 << 20;

bool is_random(const std::string& model) { return model.rfind(kRandomPrefix, 0) == 0; }

std::string describe_model(const ModelConfig& mc) {
  return fmt::format("{}, {} layers, {} experts, hidden {}, vocab {}", arch_name(mc.arch),
                     mc.num_layers, mc.num_experts, mc.hidden_size, mc.vocab_size);
}

std::unique_ptr<Backend> make_cpu(const EngineSpec& s) {
  if (is_random(s.model))
    throw InputError("model '" + s.model + "': random weights need --backend cuda");
  if (s.quantization == Quantization::Fp8 || s.quantization == Quantization::Nvfp4) {
    throw InputError(std::string("quantization ") + quantization_name(s.quantization) +
                     ": the cpu backend computes in fp32 from the checkpoint's values; "
                     "quantizing on load needs --backend cuda");
  }
  CpuBackendOptions o;
  o.tp = s.tensor_parallel_size;
  o.threads = s.threads;
  o.expert_split = s.expert_split;
  o.kv_cache_bytes = s.kv_cache_bytes > 0 ? s.kv_cache_bytes : kCpuDefaultKvBytes;
  o.state_slots = s.scheduler.max_num_seqs;  // one recurrent-state slot per scheduler slot
  return std::make_unique<CpuBackend>(s.model, o);
}

// Fails before any model byte is read when the CUDA engine cannot run here, so a wrong
// `--backend cuda` is a configuration error (exit 2), not an engine death.
void require_cuda(int devices_needed) {
  if (!cuda_backend_built()) {
    throw InputError(
        "backend cuda: not available: this build has no CUDA backend (built without nvcc); use "
        "--backend cpu");
  }
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0)
    throw InputError("backend cuda: not available: no CUDA device is visible (" + why + ")");
  if (n < devices_needed) {
    throw InputError(fmt::format("backend cuda: tensor_parallel_size {} needs {} GPUs, {} visible",
                                 devices_needed, devices_needed, n));
  }
}

std::unique_ptr<Backend> make_cuda(const EngineSpec& s) {
  require_cuda(s.tensor_parallel_size);
#ifdef MOEBATCH_HAVE_CUDA
  CudaBackendOptions o;
  o.tensor_parallel_size = s.tensor_parallel_size;
  o.expert_split = s.expert_split;
  o.gpu_memory_utilization = s.gpu_memory_utilization;
  o.max_model_len = s.max_model_len;
  o.max_kv_cache_bytes = s.kv_cache_bytes;
  o.cuda_graphs = s.cuda_graphs;
  o.collective_timeout_s = s.collective_timeout_s;
  if (!s.custom_all_reduce) o.custom_all_reduce_max_bytes = 0;
  o.quantization = s.quantization;
  // The backend's buffers follow the scheduler: every slot samples a row each step, and a step
  // never holds more tokens than the scheduler's budget.
  o.max_num_seqs = s.scheduler.max_num_seqs;
  o.max_num_batched_tokens = std::max(s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs);
  if (is_random(s.model)) {
    const ModelConfig cfg = named_model_shape(s.model.substr(std::string(kRandomPrefix).size()));
    return std::make_unique<CudaBackend>(cfg, s.random_seed, o);
  }
  return std::make_unique<CudaBackend>(s.model, o);
#else
  return nullptr;  // unreachable: require_cuda threw
#endif
}

}  // namespace

std::string EngineInfo::describe() const {
  std::string out = model + "; " + backend.description;
  for (const DeviceUsage& d : backend.devices) {
    out += fmt::format("; {}: weights {:.2f} GiB, KV {:.2f} GiB", d.device,
                       d.weight_bytes / 1073741824.0, d.kv_bytes / 1073741824.0);
  }
  return out;
}

BuiltEngine make_engine(const EngineSpec& spec) {
  if (spec.model.empty())
    throw InputError("model: no checkpoint directory or random:<shape> given");
  if (spec.tensor_parallel_size < 1 || spec.tensor_parallel_size > 64) {
    throw InputError("tensor_parallel_size must be in [1, 64], got " +
                     std::to_string(spec.tensor_parallel_size));
  }
  std::unique_ptr<Backend> backend;
  if (spec.backend == "cpu") {
    backend = make_cpu(spec);
  } else if (spec.backend == "cuda") {
    backend = make_cuda(spec);
  } else {
    throw InputError("backend: expected cpu or cuda, got '" + spec.backend + "'");
  }
  BuiltEngine out;
  const ModelConfig& mc = backend->config();
  out.info.model = describe_model(mc);
  out.info.backend = backend->info();
  out.info.vocab_size = mc.vocab_size;
  out.info.max_context = std::min(mc.max_position_embeddings, backend->info().max_model_len);
  if (spec.max_model_len > 0)
    out.info.max_context = std::min(out.info.max_context, spec.max_model_len);
  out.info.slots = spec.scheduler.max_num_seqs;
  out.engine = std::make_unique<Engine>(std::move(backend), spec.scheduler);
  return out;
}

}  // namespace moebatch
