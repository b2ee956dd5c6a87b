/* Bounded per-thread event storage: the hot path's only write target.
 *
 * Each thread that records gets one GpThreadBuf, found through a thread-local
 * pointer. Events go into fixed-size chunks taken from a global budget of
 * `max_events`; when the budget is spent the thread drops events, counts
 * them, and remembers when dropping began so aggregation can close the
 * thread's open frames there. No Python API here (docs/development.md,
 * "C headers").
 *
 * Chunks come from a process-wide pool of 2 MiB slabs that is never
 * returned to the system: windows,
 * sessions and schedule cycles reuse the same memory, so recording a window
 * touches no fresh pages once a window of its size was seen. Windows whose
 * results are still alive keep their chunks (gp_buffer_take_window) until
 * those results let go of them.
 *
 * Concurrency: a thread writes only its own buffer. Python-hook writes happen
 * with the GIL held; CUDA-API and NVTX writes (cuda/, nvtx.c) may happen
 * without it, so they go through gp_buffer_write_begin/_end, which count them
 * in `writing` (see gp_buffer_quiesce). Readers (the aggregator, reset) run
 * with the GIL held, after the phase has been set to non-recording and every
 * buffer has been quiesced.
 *
 * A GpThreadBuf is never freed: a session's end puts it on a spare list and a
 * later registration reuses it. A callback thread may have read its cached
 * pointer just before the session ended; what it then touches (`writing`)
 * is still a GpThreadBuf, and its re-check of the session sends it away.
 */
#ifndef GPUPROF_CSRC_BUFFER_H
#define GPUPROF_CSRC_BUFFER_H

#include <stdatomic.h>
#include <stdint.h>

#include "clock.h"
#include "common.h"

/* Event kinds (low 8 bits of GpEvent.kind). */
enum {
    GP_EV_CALL = 1,     /* Python frame entered: arg = op id, payload = call site or 0 */
    GP_EV_RESUME,       /* generator/coroutine resumed: arg = op id (not a new call),
                           payload = call site or 0 */
    GP_EV_RETURN,       /* Python frame left (return, yield or exception) */
    GP_EV_CCALL,        /* C function called: arg = op id, payload = caller's f_lasti + 1
                           (its call site; 0 = unknown; Python frames: hook.c) */
    GP_EV_CRETURN,      /* C function returned or raised */
    GP_EV_RANGE_PUSH,   /* user range opened: arg = op id */
    GP_EV_RANGE_POP,    /* user range closed: arg = op id */
    GP_EV_STEP_BEGIN,   /* ProfilerStep#arg opened */
    GP_EV_STEP_END,     /* ProfilerStep#arg closed */
    GP_EV_API_ENTER,    /* CUDA API entered: arg = correlation id, kind >> 8 = api key */
    GP_EV_API_EXIT,     /* CUDA API left: arg = correlation id */
    GP_EV_FRAME,        /* initial-stack frame (window start snapshot): arg = op id,
                           payload = its caller's f_lasti + 1 then, or 0 */
    /* NVTX ranges (csrc/record/nvtx.c), written from any thread like API events. */
    GP_EV_NVTX_PUSH,    /* nvtx*RangePush*: arg = NVTX name id, payload = domain index */
    GP_EV_NVTX_POP,     /* nvtx*RangePop: payload = domain index */
    GP_EV_NVTX_START,   /* nvtx*RangeStart*: arg = NVTX name id, payload = range tag */
    GP_EV_NVTX_END,     /* nvtx*RangeEnd: arg = index (GpThreadBuf.index) of the thread
                           that started it, payload = range tag */
    GP_EV_NVTX_TORCH,   /* right after the GP_EV_NVTX_PUSH/START of a range whose message
                           follows PyTorch's grammar ("AddmmBackward0, seq = 7, op_id = 9";
                           csrc/record/nvtx.c): arg = its seq mod 2^31 (GP_NVTXT_SEQ), payload =
                           GP_NVTXT_* */
    GP_EV_SEQ,          /* PyTorch's autograd sequence counter on this thread moved, seen
                           before the event that follows: arg = its new value mod 2^31,
                           payload = by how much (capped at 0xffffff; 0: first reading in
                           this window, a baseline). The nodes numbered
                           [arg - payload, arg) were made in the innermost open frame (hook.c,
                           "autograd sequence numbers") */
    GP_EV_MODULE,       /* right after the GP_EV_CALL of torch.nn.Module's __call__: arg =
                           the instance it was called on (hook.c, "module instances") */
};

/* Payload of GP_EV_NVTX_TORCH. */
enum {
    GP_NVTXT_SEQ = 1,      /* the message carried a sequence number (arg) */
    GP_NVTXT_AUTOGRAD = 2, /* its name is an autograd node's (AddmmBackward0, AccumulateGrad) */
    GP_NVTXT_ENGINE = 4,   /* the engine's "autograd::engine::evaluate_function: X" wrapper */
};

#define GP_EV_KIND(k) ((k) & 0xffu)
#define GP_EV_PAYLOAD(k) ((k) >> 8)
#define GP_EV_MAKE(kind, payload) ((uint32_t)(kind) | ((uint32_t)(payload) << 8))

/* API key packed in the payload of GP_EV_API_ENTER: domain in bits 20..23, cbid below. */
#define GP_API_KEY(domain, cbid)                                                                   \
    ((((uint32_t)(domain) & 0xfu) << 20) | ((uint32_t)(cbid) & 0xfffffu))
#define GP_API_DOMAIN(key) (((key) >> 20) & 0xfu)
#define GP_API_CBID(key) ((key) & 0xfffffu)

/* One recorded event: 16 bytes. */
typedef struct GpEvent {
    uint64_t ts;   /* raw clock (clock.h): TSC ticks or CLOCK_MONOTONIC ns */
    uint32_t arg;  /* op id, correlation id or step number, by kind */
    uint32_t kind; /* GP_EV_* in the low byte, payload above */
} GpEvent;

/* 16 header bytes + 16383 events = 256 KiB: eight chunks to a 2 MiB slab. */
#define GP_CHUNK_EVENTS 16383u

typedef struct GpChunk {
    struct GpChunk *next; /* owner thread until the window is taken */
    uint32_t n;           /* events written; set when the chunk is full or taken */
    uint32_t lazy;        /* its pages are marked MADV_FREE (pool: registry lock) */
    GpEvent ev[GP_CHUNK_EVENTS];
} GpChunk;

/* Depth up to which the hook remembers whose code each open Python frame is. */
#define GP_SHADOW_DEPTH 1024

typedef struct GpThreadBuf {
    struct GpThreadBuf *next_thread; /* registry list; registry mutex */
    /* Write cursor of the tail chunk: the next free slot and the chunk's end
     * (both NULL before the first chunk, equal when full or dropping). */
    GpEvent *cur, *end;              /* owner thread */
    GpChunk *head, *tail;            /* owner thread writes; readers after quiesce */
    uint64_t ident;                  /* pthread_self(), matches threading.get_ident() */
    uint64_t os_tid;                 /* gettid(): trace lanes, CUPTI's threadId */
    uint32_t index;                  /* registration order in this session */
    int has_python;                  /* set once the Python hook wrote here */
    int ignored;                     /* gpuprof's own helper thread: left out of the results */
    int claimed;                     /* a live thread owns it (registry lock); a buffer made
                                        by the snapshot waits unclaimed for its thread */
    uint64_t dropped;                /* owner thread */
    uint64_t drop_ts;                /* first dropped event's ts (raw clock), 0 if none */
    atomic_int writing;              /* non-GIL writers inside a write (gp_buffer_write_begin);
                                        kept across reuse: a late writer's -1 follows its +1 */
    /* The hook's view of the thread's open Python frames (owner thread, GIL): how
     * many, and per depth whether the frame is the user's code (GP_OPF_LIBRARY
     * clear) and whether it is in a C call. Set from the stack at each window's start
     * (gp_hook_snapshot); it decides which calls have their caller's line recorded (hook.c). */
    uint32_t py_depth;
    /* The open step (owner thread, GIL; hook.c, gp_hook_marker): its begin event in
     * this window's chunks (NULL: none), py_depth there, and the fewest frames open
     * since (0 while no step is open). Its end writes into the begin event how many
     * frames below it returned, for the replay to place the step (replay.c). */
    GpEvent *step_begin;
    uint32_t step_depth;
    uint32_t step_min;
    /* The write cursor right after this window's start snapshot of another thread's
     * stack, and the snapshot's time (owner thread, GIL; hook.c): while nothing was
     * written since, the thread's first C return closes a C call that was in flight at
     * the snapshot (a wait in lock.acquire, a sleep), and opens it at snap_ts. NULL:
     * none pending. */
    GpEvent *snap_cur;
    uint64_t snap_ts;
    /* PyTorch's autograd sequence counter at this thread's last event (owner
     * thread, GIL; hook.c), GP_SEQ_UNSET before the window's first reading. */
    uint64_t seq_last;
    uint8_t py_frames[GP_SHADOW_DEPTH]; /* per depth: 1 the user's code, | 2 in a C call */
} GpThreadBuf;

#define GP_SEQ_UNSET UINT64_MAX

/* Recording phase, read on every hook call (relaxed). */
enum { GP_PHASE_OFF = 0, GP_PHASE_WAIT = 1, GP_PHASE_WARMUP = 2, GP_PHASE_ACTIVE = 3 };
extern atomic_int gp_buffer_phase;

/* This thread's buffer for the current session, or NULL. Validity is tied
 * to gp_buffer_session: a pointer from an older session is never
 * dereferenced. One struct, so that the hook makes one __tls_get_addr call
 * per event rather than one per field. Not in the initial-exec TLS model:
 * that takes from the few hundred bytes of static TLS that glibc keeps for
 * libraries opened later (glibc.rtld.optional_static_tls, 512 by default),
 * and with 24 of them gone, `import gpuprof` before `import torch` made
 * torch's libgomp fail to load ("cannot allocate memory in static TLS
 * block", glibc 2.36, torch 2.13). */
typedef struct GpTls {
    GpThreadBuf *buf;
    uint64_t session; /* gp_buffer_session when buf was set */
    int ignore;       /* gpuprof's own helper threads (the memory sampler): they
                         never get a buffer, so nothing they run is recorded */
} GpTls;
extern _Thread_local GpTls gp_buffer_tls;
extern atomic_uint_fast64_t gp_buffer_session;

/* Begin a recording session with a budget of max_events events in total
 * across threads and windows in flight. Returns GP_ERR_STATE if one is open. */
GpStatus gp_buffer_session_begin(uint64_t max_events);
/* End the session: every thread buffer goes to the spare list and its chunks
 * back to the pool, which outlives sessions (the next one reuses the memory
 * instead of touching fresh pages). Non-GIL writers may still be running:
 * the session number moves first, and the end waits for those inside a write. */
void gp_buffer_session_end(void);

/* This thread's buffer, registering one on first use. NULL when out of
 * memory (the caller counts a drop in gp_buffer_orphan_drops). */
GpThreadBuf *gp_buffer_thread_slow(void);

GP_INLINE GpThreadBuf *
gp_buffer_thread(void)
{
    GpThreadBuf *tb = gp_buffer_tls.buf;
    if (GP_LIKELY(tb != NULL && gp_buffer_tls.session ==
                                    atomic_load_explicit(&gp_buffer_session, memory_order_relaxed)))
        return tb;
    return gp_buffer_thread_slow();
}

/* A write from a thread that may not hold the GIL (CUDA and NVTX callbacks):
 * this thread's buffer, held until gp_buffer_write_end, or NULL when nothing
 * is being recorded. Dekker-style against gp_buffer_quiesce and
 * gp_buffer_session_end: the writer counts itself in, then re-reads the phase
 * and the session; they move the phase or the session, then wait for the
 * count to fall to 0. (All seq_cst.) */
GP_INLINE GpThreadBuf *
gp_buffer_write_begin(void)
{
    GpThreadBuf *tb = gp_buffer_thread();
    if (tb == NULL)
        return NULL;
    atomic_fetch_add(&tb->writing, 1);
    if (GP_UNLIKELY(atomic_load(&gp_buffer_phase) < GP_PHASE_WARMUP ||
                    gp_buffer_tls.session != atomic_load(&gp_buffer_session))) {
        atomic_fetch_sub(&tb->writing, 1);
        return NULL;
    }
    return tb;
}

GP_INLINE void
gp_buffer_write_end(GpThreadBuf *tb)
{
    atomic_fetch_sub(&tb->writing, 1);
}

/* Find (or create) the buffer of thread `ident` for the window-start
 * snapshot; NULL for a thread marked with gp_buffer_ignore_current (or when
 * out of memory). */
GpThreadBuf *gp_buffer_thread_for(uint64_t ident);

/* Never record the calling thread in this session (gpuprof's own helper
 * threads): no buffer now, none from the snapshot later. */
void gp_buffer_ignore_current(void);

/* Leave thread `ident` (a pthread_self() value) out of the results of this
 * session, or of the next one when none is open: its events go to a buffer
 * that aggregation skips, and the window-start snapshot skips its frames
 * (a notebook kernel's own threads). At most 16 threads per session. */
void gp_buffer_ignore_thread(uint64_t ident);

/* Slow path of gp_buffer_push: a new chunk from the budget, or NULL (drop).
 * Returns the chunk's first slot; `ts` is the raw time of the event that
 * needs it (kept as drop_ts when it is dropped). */
GpEvent *gp_buffer_grow(GpThreadBuf *tb, uint64_t ts);

/* Append one event; `ts` on the raw clock (clock.h). Owner thread only. */
GP_INLINE void
gp_buffer_push(GpThreadBuf *tb, uint64_t ts, uint32_t arg, uint32_t kind)
{
    GpEvent *e = tb->cur;
    if (GP_UNLIKELY(e == tb->end)) {
        e = gp_buffer_grow(tb, ts);
        if (e == NULL)
            return;
    }
    /* Ask for the line 1 KiB ahead now, so the store that gets there does
     * not wait for it (2-3 ns per event on the parser workload, measured). */
    __builtin_prefetch(e + 64, 1);
    e->ts = ts;
    e->arg = arg;
    e->kind = kind;
    tb->cur = e + 1;
}

/* Record a CUDA API enter/exit from any thread, GIL or not (cuda/ calls it);
 * `ts` on the raw clock (gp_clock_raw). */
void gp_buffer_record_api(uint64_t ts, uint32_t correlation, uint32_t api_key, int enter);

/* Wait until no non-GIL writer is inside a write. Call after the phase left
 * WARMUP/ACTIVE. */
void gp_buffer_quiesce(void);

/* Read a clock anchor now, keep it for the current window's raw -> ns map
 * (window start and end, steps; chunk changes add their own) and return it. */
GpClockAnchor gp_buffer_anchor(void);

/* One thread's events of a taken window. */
typedef struct GpWindowThread {
    uint64_t ident;
    uint64_t os_tid;
    uint32_t index;    /* GpThreadBuf.index (NVTX range ends name it) */
    int ignored;
    GpChunk *head;     /* owned by the GpWindowEvents; each chunk's n is set */
    uint64_t n_events;
    uint64_t dropped;
    uint64_t drop_ts;  /* raw clock, 0 if none */
} GpWindowThread;

/* A closed window's events, taken out of the thread buffers: they no longer
 * count against the session's budget and stay valid after the session ends,
 * until gp_buffer_release_window gives the chunks back for reuse. */
typedef struct GpWindowEvents {
    GpWindowThread *threads; /* registration order */
    uint32_t n_threads;
    GpClockAnchor *anchors;  /* the window's clock anchors (raw -> ns) */
    size_t n_anchors;
    uint64_t chunks;         /* chunks held */
} GpWindowEvents;

/* Move every thread's events (and the window's anchors) into *w and start
 * an empty window. Writers must be quiesced. GP_OK, or GP_ERR_NOMEM with
 * the events dropped (given back) and *w empty. */
GpStatus gp_buffer_take_window(GpWindowEvents *w);

/* Give a taken window's chunks back for reuse, free its arrays, zero *w.
 * Any thread, any time (also after the session ended); takes the lock. */
void gp_buffer_release_window(GpWindowEvents *w);

/* Drop every recorded event (chunks back for reuse) but keep the thread
 * buffers. Writers must be quiesced. */
void gp_buffer_reset(void);

/* In a child process right after fork(): drop the parent's session (the
 * child has one thread; the other threads' buffers are just memory). */
void gp_buffer_after_fork_child(void);

/* Registry access for readers (quiesced): first thread, or NULL. */
GpThreadBuf *gp_buffer_threads(void);
uint32_t gp_buffer_thread_count(void);

/* Totals for the results and the footer. */
uint64_t gp_buffer_dropped(void);
uint64_t gp_buffer_events(void);
uint64_t gp_buffer_capacity_events(void);
/* Bytes of event memory gpuprof holds (chunks recorded into, free for
 * reuse, or kept by closed windows) plus the thread buffers: flat across
 * windows, sessions and schedule cycles once the largest window was seen. */
uint64_t gp_buffer_bytes_held(void);

#endif /* GPUPROF_CSRC_BUFFER_H */
