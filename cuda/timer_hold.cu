// timer_hold.cu — holds the GPU while the runner enqueues a block of timed samples.
//
// Launched (1 thread) just before each block, outside the timed events: while it spins, the
// host enqueues every sample's events and launches, so the samples then run back to back and
// per-launch times measure the kernel, not the host's launch latency (nvbench's technique).
extern "C" __global__ void sdpa_timer_hold(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
