/* One monotonic nanosecond clock shared by CPU events and (through CUPTI's
 * timestamp callback) GPU activity records.
 *
 * Events in the thread buffers are stamped with the raw clock: the CPU's
 * time-stamp counter where the kernel itself keeps time with it (x86-64,
 * clocksource "tsc": invariant and synchronized across cores), else
 * CLOCK_MONOTONIC. Reading the TSC costs about half of a vDSO
 * clock_gettime, which is a large part of what the profile hook costs per
 * event. Raw readings become profiler-clock nanoseconds when a window is
 * aggregated, through anchors: (raw, ns) pairs read together at the window's
 * start and end, at every step and whenever a thread takes a new event chunk,
 * between which the map is linear. Timestamps therefore agree with
 * CLOCK_MONOTONIC (and CUPTI's records) within the anchors' read error, tens
 * of nanoseconds, also while NTP slews the clock.
 */
#ifndef GPUPROF_CSRC_CLOCK_H
#define GPUPROF_CSRC_CLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#define GP_CLOCK_HAVE_TSC 1
#endif

/* Current time on the profiler clock (CLOCK_MONOTONIC, ns). vDSO, no syscall. */
GP_INLINE uint64_t
gp_clock_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The time `ms` milliseconds from now on `clock`: a deadline for
 * pthread_cond_timedwait (whose condition variable waits on that clock). */
GP_INLINE void
gp_clock_deadline_ms(clockid_t clock, long ms, struct timespec *out)
{
    clock_gettime(clock, out);
    out->tv_sec += ms / 1000;
    out->tv_nsec += (ms % 1000) * 1000000L;
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

/* 1 when the raw clock is the TSC. Set once by gp_clock_init (module exec),
 * before any event is recorded; read-only afterwards. */
extern int gp_clock_tsc;

/* The raw clock, for event timestamps (hot path). Map to ns with GpClockMap. */
GP_INLINE uint64_t
gp_clock_raw(void)
{
#ifdef GP_CLOCK_HAVE_TSC
    if (GP_LIKELY(gp_clock_tsc))
        return __rdtsc();
#endif
    return gp_clock_now();
}

/* Choose the raw clock: the TSC where the kernel keeps time with it, unless
 * GPUPROF_CLOCK=monotonic; GPUPROF_CLOCK=tsc forces it (x86-64 only). Call
 * once, before recording. Never fails (falls back to CLOCK_MONOTONIC). */
void gp_clock_init(void);

/* Name of the raw clock in use: "tsc" or "monotonic". Static string. */
const char *gp_clock_raw_name(void);

/* A raw reading and the profiler-clock ns of the same moment. */
typedef struct GpClockAnchor {
    uint64_t raw;
    uint64_t ns;
} GpClockAnchor;

/* Read an anchor: the tightest of a few bracketed (ns, raw, ns) reads. */
GpClockAnchor gp_clock_anchor(void);

/* Raw -> ns for one window: anchors sorted by raw, thinned to at least
 * ~50 us apart (closer ones would make a noisy slope), and per segment a
 * 32.32 fixed-point ns-per-tick multiplier. `identity` when raw is ns. */
typedef struct GpClockMap {
    GpClockAnchor *a;
    uint64_t *mult; /* mult[i]: segment a[i]..a[i+1]; the last one extends past a[n-1] */
    size_t n;
    int identity;
} GpClockMap;

/* Build a map from `n` anchors (any order; copied). Identity when the raw
 * clock is CLOCK_MONOTONIC or `anchors` is NULL. GP_OK or GP_ERR_NOMEM. */
GpStatus gp_clock_map_init(GpClockMap *m, const GpClockAnchor *anchors, size_t n);
void gp_clock_map_free(GpClockMap *m);

/* A position in a map: the segment of the last reading converted. Readings
 * of one thread come in time order, so nearly every conversion stays in the
 * segment: one compare, one multiply. */
typedef struct GpClockCursor {
    const GpClockMap *map;
    size_t seg;
    uint64_t lo, span; /* the segment covers raw in [lo, lo + span) */
    uint64_t ns0;      /* ns at lo */
    uint64_t mult;     /* 32.32 fixed-point ns per tick */
} GpClockCursor;

/* Start a cursor on `m` (which must outlive it). */
void gp_clock_cursor_init(GpClockCursor *c, const GpClockMap *m);

/* Move the cursor to raw's segment and convert (out-of-line part of gp_clock_ns). */
uint64_t gp_clock_ns_slow(GpClockCursor *c, uint64_t raw);

/* ns of a raw reading (the identity map converts raw to itself). */
GP_INLINE uint64_t
gp_clock_ns(GpClockCursor *c, uint64_t raw)
{
    if (GP_LIKELY(raw - c->lo < c->span))
        return c->ns0 + (uint64_t)(((unsigned __int128)(raw - c->lo) * c->mult) >> 32);
    return gp_clock_ns_slow(c, raw);
}

/* Same clock, as a plain function pointer (CUPTI's timestamp callback). */
uint64_t gp_clock_now_fn(void);

/* Unix-epoch ns minus profiler-clock ns, measured now: add it to a profiler
 * timestamp to get wall-clock time. Bracketed reads keep the error < 1 us. */
int64_t gp_clock_epoch_offset(void);

#endif /* GPUPROF_CSRC_CLOCK_H */
