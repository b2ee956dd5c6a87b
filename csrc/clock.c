/* Profiler clock helpers: a callable form of the clock and its epoch offset. */
#include "clock.h"

uint64_t
gp_clock_now_fn(void)
{
    return gp_clock_now();
}

int64_t
gp_clock_epoch_offset(void)
{
    /* Take the tightest of a few bracketed (mono, real, mono) reads so that a
     * preemption between the reads does not skew the offset. */
    int64_t best_offset = 0;
    uint64_t best_width = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t m0 = gp_clock_now();
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        uint64_t m1 = gp_clock_now();
        uint64_t real = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
        if (m1 - m0 < best_width) {
            best_width = m1 - m0;
            best_offset = (int64_t)(real - (m0 + (m1 - m0) / 2));
        }
    }
    return best_offset;
}
