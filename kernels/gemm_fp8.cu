#include "kernels/gemm_fp8.cuh"

#include <string>

#include "kernels/cuda_check.cuh"

namespace moebatch::kernels {

// A shape's descriptors and the algorithm the heuristic chose for it. Column-major as
// kernels::linear: outᵀ [n, m] = W · xᵀ with the row-major W [n, k] read as A = Wᵀ (op T) and the
// row-major x [m, k] as B = xᵀ (op N), the "TN" form FP8 GEMMs require.
struct Fp8BlockGemm::Plan {
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // the heuristic found an algorithm
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the heuristic's answer (why not, when !ok)
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

namespace {
// Shapes whose plans one rank keeps: decode graphs use a few, prefill one per distinct chunk
// size; past this the cache starts over (a heuristic query costs microseconds of host time).
constexpr size_t kMaxPlans = 256;

// The largest power of two up to 256 that divides every operand's address: what the heuristic
// may assume (its default, 256, would let it pick an algorithm that fails on a 16-byte-aligned
// weight of the arena mid-step).
int common_alignment(const void* out, const void* x, const void* w) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(x) |
                         reinterpret_cast<uintptr_t>(w) | 256;
  return static_cast<int>(bits & (~bits + 1));
}
}  // namespace

bool fp8_block_gemm_available(int device) {
  // the scale modes came with cuBLAS 12.9: the headers built against and the library loaded
  return CUBLAS_VERSION >= 120900 && cublasLtGetVersion() >= 120900 && is_sm90_device(device);
}

Fp8BlockGemm::Fp8BlockGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&lt_));
}

Fp8BlockGemm::~Fp8BlockGemm() {
  plans_.clear();
  cublasLtDestroy(lt_);
}

bool Fp8BlockGemm::takes(int m, int n, int k) {
  return m > 0 && m % 4 == 0 && n > 0 && n % kFp8BlockGemmGroup == 0 && k > 0 &&
         k % kFp8BlockGemmGroup == 0;
}

const Fp8BlockGemm::Plan& Fp8BlockGemm::plan(int m, int n, int k, int alignment) {
  const auto key = std::make_tuple(m, n, k, alignment);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  if (plans_.size() >= kMaxPlans) plans_.clear();
  auto p = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
#if CUBLAS_VERSION >= 120900
  const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                    b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
#else
  throw Error("Fp8BlockGemm: block-scaled FP8 needs cuBLAS 12.9 or newer at build time");
#endif
  // The heuristic wants scale pointers with the scale modes; the workspace stands in for them
  // (device memory, aligned) until run() sets each call's own.
  const void* stand_in = workspace_;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof(stand_in)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof(stand_in)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, k, n, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  const uint32_t align = static_cast<uint32_t>(alignment);
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // A shape cuBLASLt declines (an error status or no algorithm) is remembered as such: the
  // caller takes another path for it.
  if (st == CUBLAS_STATUS_SUCCESS)
    p->status = cublasLtMatmulAlgoGetHeuristic(lt_, p->op, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
  if (st == CUBLAS_STATUS_SUCCESS && p->status == CUBLAS_STATUS_SUCCESS && found > 0) {
    p->algo = result.algo;
    p->ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_CHECK(st);
  return *plans_.emplace(key, std::move(p)).first->second;
}

bool Fp8BlockGemm::supports(int m, int n, int k, const void* out, const void* x, const void* w) {
  return takes(m, n, k) && plan(m, n, k, common_alignment(out, x, w)).ok;
}

void Fp8BlockGemm::run(cudaStream_t stream, bf16* out, const uint8_t* x, const float* x_scales,
                       const uint8_t* w, const float* w_scales, int m, int n, int k) {
  MB_CHECK(takes(m, n, k), "Fp8BlockGemm: m must be a positive multiple of 4, n and k of 128 (m " +
                               std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) + ")");
  MB_CHECK(out && x && x_scales && w && w_scales, "Fp8BlockGemm: null operand");
  const Plan& p = plan(m, n, k, common_alignment(out, x, w));
  MB_CHECK(p.ok, "Fp8BlockGemm: cuBLASLt has no block-scaled FP8 algorithm for m " + std::to_string(m) + " n " +
                     std::to_string(n) + " k " + std::to_string(k) + " (heuristic: " +
                     cublasGetStatusString(p.status) + "; ask supports() first)");
  // The scale pointers belong to this call's operands; the descriptor is the shape's.
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d, &p.algo, workspace_,
                              workspace_bytes_, stream));
}

void compact_block_scales(const float* row_scales, int64_t rows, int groups, float* out, int ld,
                          cudaStream_t stream) {
  MB_CHECK(rows > 0 && groups > 0 && ld >= groups && row_scales && out, "compact_block_scales: bad arguments");
  const int64_t blocks = (rows + kFp8BlockGemmGroup - 1) / kFp8BlockGemmGroup;
  CUDA_CHECK(cudaMemcpy2DAsync(out, ld * sizeof(float), row_scales,
                               kFp8BlockGemmGroup * static_cast<size_t>(groups) * sizeof(float),
                               groups * sizeof(float), blocks, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace moebatch::kernels
