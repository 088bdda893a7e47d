// Fixture for src/backend/cuda/machine_code/, built to machine_code_a.cubin by NVRTC 13.0 with
// --gpu-architecture=sm_90 (program name a.cu; b and c the same way; d and e also with
// --relocatable-device-code=true): three kernels.
__device__ float a_sink;
__device__ float b_sink;
extern "C" __global__ void same_fn(float* x) { x[threadIdx.x] *= 2.f; }
extern "C" __global__ void changed_fn(float* x) { x[threadIdx.x] += 1.f; }
extern "C" __global__ void reloc_fn(const float* x) { a_sink = x[threadIdx.x]; }
