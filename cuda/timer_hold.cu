// timer_hold.cu — the runner's timing helpers; not part of the kernel under test.
//
// Every timed block of samples is enqueued as
//     hold  stamp(START)  [flush] event launch×batch event  ...  stamp(STOP)
// and then released by the host (nvbench's blocking kernel and throttle detection).
//
// The mailbox is mapped, page-locked host memory of MAILBOX_WORDS 64-bit words:
//   [0] RELEASE  the host writes the block's number here once the whole block is enqueued
//   [1] STATUS   the hold writes (block << 1) when released, (block << 1) | 1 when it expired
//   [2] [3]      START stamp: %globaltimer (ns) and clock64 (SM cycles) on SM 0
//   [4] [5]      STOP stamp, the same
//
// sdpa_timer_hold: one thread spins until RELEASE holds its block number, so the samples
// behind it run back to back and a short kernel's time does not include the host's launch
// latency. If the host stalls past `timeout_cycles` it gives up and says so in STATUS; the
// runner then retries the block, whose samples may have waited on the host.
// sdpa_timer_stamp: launched with one block per SM; the block on SM 0 writes the stamp. Two
// stamps around a block give the mean SM clock over it: cycles / nanoseconds.

extern "C" __global__ void sdpa_timer_hold(volatile unsigned long long* mailbox,
                                           unsigned long long block, long long timeout_cycles) {
    const long long t0 = clock64();
    while (mailbox[0] != block) {
        if (clock64() - t0 > timeout_cycles) {
            mailbox[1] = (block << 1) | 1ull;
            return;
        }
        __nanosleep(256);
    }
    mailbox[1] = block << 1;
}

extern "C" __global__ void sdpa_timer_stamp(volatile unsigned long long* mailbox, int slot) {
    unsigned int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    if (smid != 0) {
        return;
    }
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    const long long cycles = clock64();
    mailbox[slot] = ns;
    mailbox[slot + 1] = (unsigned long long)cycles;
}
