// Fixture for src/backend/cuda/machine_code/ (see machine_code_a.cu): a.cu with changed_fn
// adding 3 instead of 1 and reloc_fn storing to b_sink: two kernels' instructions change.
__device__ float a_sink;
__device__ float b_sink;
extern "C" __global__ void same_fn(float* x) { x[threadIdx.x] *= 2.f; }
extern "C" __global__ void changed_fn(float* x) { x[threadIdx.x] += 3.f; }
extern "C" __global__ void reloc_fn(const float* x) { b_sink = x[threadIdx.x]; }
