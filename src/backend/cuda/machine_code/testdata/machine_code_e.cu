// Fixture for src/backend/cuda/machine_code/ (see machine_code_a.cu): a kernel that calls a
// device function of its own (see d.cu): d.cu with only that function changed.
extern "C" __device__ __noinline__ float helper(float v, int n) {
    return n > 0 ? helper(v, n - 1) * v + 2.f : v;
}
extern "C" __global__ void caller_fn(float* x, int n) {
    x[threadIdx.x] = helper(x[threadIdx.x], n);
}
