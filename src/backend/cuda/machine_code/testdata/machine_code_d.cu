// Fixture for src/backend/cuda/machine_code/ (see machine_code_a.cu): a kernel that calls a
// device function of its own: built with --relocatable-device-code=true, where it keeps its own
// .text section and the kernel calls it through a relocation; e.cu changes only that function.
extern "C" __device__ __noinline__ float helper(float v, int n) {
    return n > 0 ? helper(v, n - 1) * v + 1.f : v;
}
extern "C" __global__ void caller_fn(float* x, int n) {
    x[threadIdx.x] = helper(x[threadIdx.x], n);
}
