/* Profiler clock: the raw event clock, anchors, raw -> ns maps, the
 * callable form of the clock and its epoch offset. */
#include "clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gp_clock_tsc = 0;

/* Ticks per ns measured at init (only to thin anchors before a window's own
 * slope is known); 0 when the raw clock is ns. Written once by gp_clock_init. */
static double init_ticks_per_ns = 0.0;

#ifdef GP_CLOCK_HAVE_TSC
/* Whether the kernel keeps time with the TSC: then it found the TSC
 * invariant and synchronized across CPUs (else it would have switched to
 * another clocksource), so raw readings from any thread are comparable. */
static int
kernel_uses_tsc(void)
{
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL)
        return 0;
    char name[32] = {0};
    int ok = fgets(name, sizeof name, f) != NULL && strncmp(name, "tsc", 3) == 0 &&
             (name[3] == '\n' || name[3] == '\0');
    fclose(f);
    return ok;
}
#endif

void
gp_clock_init(void)
{
    gp_clock_tsc = 0;
#ifdef GP_CLOCK_HAVE_TSC
    const char *env = getenv("GPUPROF_CLOCK");
    if (env != NULL && strcmp(env, "monotonic") == 0)
        return;
    if ((env != NULL && strcmp(env, "tsc") == 0) || kernel_uses_tsc()) {
        /* A rough rate over ~0.2 ms, only for thinning anchors. */
        GpClockAnchor a = {__rdtsc(), gp_clock_now()}, b;
        do {
            b.raw = __rdtsc();
            b.ns = gp_clock_now();
        } while (b.ns - a.ns < 200000);
        if (b.raw > a.raw) {
            init_ticks_per_ns = (double)(b.raw - a.raw) / (double)(b.ns - a.ns);
            gp_clock_tsc = 1;
        }
    }
#endif
}

const char *
gp_clock_raw_name(void)
{
    return gp_clock_tsc ? "tsc" : "monotonic";
}

GpClockAnchor
gp_clock_anchor(void)
{
    GpClockAnchor best = {0, 0};
    uint64_t best_width = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t n0 = gp_clock_now();
        uint64_t raw = gp_clock_raw();
        uint64_t n1 = gp_clock_now();
        if (n1 - n0 < best_width) {
            best_width = n1 - n0;
            best.raw = raw;
            best.ns = n0 + (n1 - n0) / 2;
        }
    }
    if (!gp_clock_tsc)
        best.ns = best.raw; /* raw is ns: the map is the identity */
    return best;
}

static int
cmp_anchor(const void *x, const void *y)
{
    const GpClockAnchor *a = x, *b = y;
    return (a->raw > b->raw) - (a->raw < b->raw);
}

GpStatus
gp_clock_map_init(GpClockMap *m, const GpClockAnchor *anchors, size_t n)
{
    memset(m, 0, sizeof(*m));
    if (!gp_clock_tsc || anchors == NULL || n == 0) {
        m->identity = 1;
        return GP_OK;
    }
    m->a = malloc((n + 1) * sizeof(GpClockAnchor));
    m->mult = malloc((n + 1) * sizeof(uint64_t));
    if (m->a == NULL || m->mult == NULL) {
        gp_clock_map_free(m);
        return GP_ERR_NOMEM;
    }
    memcpy(m->a, anchors, n * sizeof(GpClockAnchor));
    qsort(m->a, n, sizeof(GpClockAnchor), cmp_anchor);
    /* Keep anchors >= 50 us apart (and the last one), with ns never going
     * back: over shorter segments the read error (tens of ns) would make a
     * noisy slope, and a negative one would reorder events. */
    uint64_t min_gap = (uint64_t)(init_ticks_per_ns * 50000.0);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        const GpClockAnchor *x = &m->a[i];
        int last = i == n - 1;
        if (x->ns <= m->a[k].ns || (x->raw - m->a[k].raw < min_gap && !last))
            continue;
        if (last && k > 0 && x->raw - m->a[k].raw < min_gap)
            k--; /* the window's end replaces a close interior anchor */
        m->a[++k] = *x;
    }
    m->n = k + 1;
    for (size_t i = 0; i + 1 < m->n; i++) {
        uint64_t draw = m->a[i + 1].raw - m->a[i].raw;
        uint64_t dns = m->a[i + 1].ns - m->a[i].ns;
        m->mult[i] = draw ? (uint64_t)(((unsigned __int128)dns << 32) / draw) : 0;
    }
    /* Past the last anchor (and for a single one): the overall slope, else
     * the rate measured at init. */
    if (m->n >= 2) {
        m->mult[m->n - 1] = m->mult[m->n - 2];
    } else {
        m->mult[0] = (uint64_t)(4294967296.0 / init_ticks_per_ns);
    }
    return GP_OK;
}

/* Point the cursor at segment i: [a[i].raw, a[i+1].raw), the first one
 * open to the left and the last one to the right (extrapolated). */
static void
cursor_at(GpClockCursor *c, size_t i)
{
    const GpClockMap *m = c->map;
    c->seg = i;
    c->lo = m->a[i].raw;
    c->ns0 = m->a[i].ns;
    c->mult = m->mult[i];
    c->span = i + 1 < m->n ? m->a[i + 1].raw - c->lo : UINT64_MAX - c->lo;
}

void
gp_clock_cursor_init(GpClockCursor *c, const GpClockMap *m)
{
    memset(c, 0, sizeof(*c));
    c->map = m;
    if (m->identity) {
        c->span = UINT64_MAX;
        c->mult = 1ull << 32;
        return;
    }
    cursor_at(c, 0);
}

uint64_t
gp_clock_ns_slow(GpClockCursor *c, uint64_t raw)
{
    const GpClockMap *m = c->map;
    if (m->identity)
        return raw; /* raw == UINT64_MAX, the one value outside the span */
    size_t i = c->seg;
    while (i + 1 < m->n && raw >= m->a[i + 1].raw)
        i++;
    while (i > 0 && raw < m->a[i].raw)
        i--;
    cursor_at(c, i);
    if (raw >= c->lo)
        return c->ns0 + (uint64_t)(((unsigned __int128)(raw - c->lo) * c->mult) >> 32);
    /* Before the first anchor: extrapolate back with the first slope. */
    uint64_t back = (uint64_t)(((unsigned __int128)(c->lo - raw) * c->mult) >> 32);
    return back < c->ns0 ? c->ns0 - back : 0;
}

void
gp_clock_map_free(GpClockMap *m)
{
    free(m->a);
    free(m->mult);
    memset(m, 0, sizeof(*m));
}

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
