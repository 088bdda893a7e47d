// Fixture for src/backend/cuda/machine_code/ (see machine_code_a.cu): a.cu with reloc_fn
// storing to the other global, declared first, so that its address takes a_sink's slot in
// constant bank 4: the same instructions, a different target.
__device__ float b_sink;
__device__ float a_sink;
extern "C" __global__ void same_fn(float* x) { x[threadIdx.x] *= 2.f; }
extern "C" __global__ void changed_fn(float* x) { x[threadIdx.x] += 1.f; }
extern "C" __global__ void reloc_fn(const float* x) { b_sink = x[threadIdx.x]; }
