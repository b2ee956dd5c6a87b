/* One monotonic nanosecond clock shared by CPU events and (through CUPTI's
 * timestamp callback) GPU activity records. */
#ifndef GPUPROF_CSRC_CLOCK_H
#define GPUPROF_CSRC_CLOCK_H

#include <stdint.h>
#include <time.h>

#include "common.h"

/* Current time on the profiler clock (CLOCK_MONOTONIC, ns). Hot path: vDSO, no syscall. */
GP_INLINE uint64_t
gp_clock_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Same clock, as a plain function pointer (CUPTI's timestamp callback). */
uint64_t gp_clock_now_fn(void);

/* Unix-epoch ns minus profiler-clock ns, measured now: add it to a profiler
 * timestamp to get wall-clock time. Bracketed reads keep the error < 1 us. */
int64_t gp_clock_epoch_offset(void);

#endif /* GPUPROF_CSRC_CLOCK_H */
