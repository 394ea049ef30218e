// Warp-level tensor-core MMA and fragment loads shared by the expert GEMM, attention and
// delta-rule kernels.
#pragma once

namespace moebatch::kernels {

// The shared-space address of a pointer into shared memory (what ldmatrix and cp.async take).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ldmatrix: four 8×8 bf16 matrices from shared memory (addr: a shared-space address); lanes
// 8i..8i+7 address the rows of matrix i, and lane 4g + t gets (row g, cols 2t, 2t + 1) of each
// in r[i] — or with .trans (rows 2t, 2t + 1, col g).
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A·B + D, m16n8k16, bf16 operands, fp32 accumulators (register fragments as in the PTX ISA).
__device__ __forceinline__ void mma_bf16_16816(float c[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D = A·B + D, m16n8k32, e4m3 operands, fp32 accumulators (sm_89 and later; the fragments hold
// four bytes per register: a0/a2 row g at k 4t.. and 16 + 4t.., a1/a3 the same of row g + 8,
// b0/b1 column g at k 4t.. and 16 + 4t..). Earlier architectures trap.
__device__ __forceinline__ void mma_e4m3_16832(float c[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  (void)c, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();
#endif
}

}  // namespace moebatch::kernels
