/* How much one read of the profiler clock costs here (CLOCK_MONOTONIC via
 * the vDSO, or a system call on some virtual machines), next to rdtsc.
 * cc -O2 -o /tmp/clock_cost benchmarks/clock_cost.c && /tmp/clock_cost */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static uint64_t
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int
main(void)
{
    const int n = 5000000;
    volatile uint64_t sink = 0;
    uint64_t t0 = now();
    for (int i = 0; i < n; i++)
        sink += now();
    uint64_t t1 = now();
    for (int i = 0; i < n; i++)
        sink += __rdtsc();
    uint64_t t2 = now();
    printf("clock_gettime(CLOCK_MONOTONIC): %.1f ns/call\nrdtsc: %.1f ns/call\n",
           (double)(t1 - t0) / n, (double)(t2 - t1) / n);
    return (int)(sink & 0);
}
