/* The CUPTI session: subscribe to runtime/driver API callbacks (correlation
 * ids for the launching Python call), switch activity kinds on and off per
 * window, and make sure every record of a window has arrived before it is
 * read (synchronize, then flush).
 *
 * Threads: gp_cuda_session_* and gp_cuda_window_* run on the thread of the
 * profiler that owns the session, serialized by it; window_end and
 * session_end block and are called with the GIL released. on_api runs on
 * whatever thread calls CUDA, possibly while another thread holds the GIL:
 * it never calls Python, never takes the GIL, never locks, and allocates
 * only through gp_buffer_record_api's first use on a thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime in csrc/record/clock.h, should a build omit -D_GNU_SOURCE */
#endif

#include "cupti_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "clock.h"

/* ---- Session state -------------------------------------------------------- */

/* 1 from a successful claim in gp_cuda_session_begin to the very end of
 * gp_cuda_session_end. Atomic because two profilers may race: one ending
 * its session with the GIL released while another begins; the loser of the
 * claim gets GP_ERR_STATE. Everything else in this section belongs to the
 * session's owner, whose calls the profiler serializes. */
static atomic_int session_open;

/* Our callback subscription, NULL when none (activity-only mode, after
 * unsubscribe, and after cuptiFinalize, which invalidates the handle). */
static CUpti_SubscriberHandle subscriber;
static int window_open;

/* Activity kinds enabled for the current window, to disable exactly those. */
static CUpti_ActivityKind kinds_on[16];
static int n_kinds_on;

/* Whether CUPTI holds state we created in this process (a subscription,
 * registered callbacks, enabled kinds) that cuptiFinalize would tear down.
 * Set at session begin, cleared by cuptiFinalize. cuptiFinalize forgets the
 * subscriber, the buffer and timestamp callbacks and the thread-id type, so
 * the next session_begin must redo all of them; that is why session_begin
 * always registers everything afresh and never reuses `subscriber`. */
static atomic_int cupti_attached;

/* Activity-only mode chosen by GPUPROF_CUPTI_MODE rather than forced by
 * another subscriber: we are CUPTI's only client and may detach it.
 * Interpreter thread (session begin/end). */
static int forced_activity;

/* The CUPTI parts a window switches on, fixed at session begin: the default
 * (GP_PARTS_DEFAULT) is what the default results need, the decision table in
 * docs/benchmarks.md says what each part costs; GPUPROF_CUPTI_PARTS
 * (benchmarks only) names other sets. Session owner's thread. */
enum {
    PART_RT_CALLBACKS = 1u << 0,  /* runtime-API callbacks on the traced ids */
    PART_DRV_CALLBACKS = 1u << 1, /* driver-API callbacks on the traced ids */
    PART_KERNELS = 1u << 2,       /* CONCURRENT_KERNEL records */
    PART_SERIAL = 1u << 3,        /* KERNEL records instead (serializes kernels) */
    PART_MEMCPY = 1u << 4,        /* MEMCPY and MEMCPY2 (peer) records */
    PART_MEMSET = 1u << 5,        /* MEMSET records */
    PART_SYNC = 1u << 6,          /* SYNCHRONIZATION records */
    PART_EVENTS = 1u << 7,        /* CUDA_EVENT records (stream-wait-event sources) */
};
#define GP_PARTS_CALLBACKS (PART_RT_CALLBACKS | PART_DRV_CALLBACKS)
#define GP_PARTS_DEFAULT (GP_PARTS_CALLBACKS | PART_KERNELS | PART_MEMCPY | PART_MEMSET)
static unsigned parts;

/* GPUPROF_CUPTI_PARTS: parts separated by ',' or '.', each switched on, or
 * off with a "no" prefix (applied last): callbacks (= rtcb + drvcb), rtcb,
 * drvcb, kernels, serial, copies (= memcpy + memset), memcpy, memset, sync,
 * events, default. Unknown names are ignored: benchmarks only. */
static unsigned
parse_parts(const char *spec)
{
    static const struct {
        const char *name;
        unsigned bits;
    } names[] = {
        {"callbacks", GP_PARTS_CALLBACKS},
        {"rtcb", PART_RT_CALLBACKS},
        {"drvcb", PART_DRV_CALLBACKS},
        {"kernels", PART_KERNELS},
        {"serial", PART_SERIAL},
        {"copies", PART_MEMCPY | PART_MEMSET},
        {"memcpy", PART_MEMCPY},
        {"memset", PART_MEMSET},
        {"sync", PART_SYNC},
        {"events", PART_EVENTS},
        {"default", GP_PARTS_DEFAULT},
    };
    if (spec == NULL || spec[0] == '\0')
        return GP_PARTS_DEFAULT;
    unsigned on = 0, off = 0;
    while (*spec) {
        size_t len = strcspn(spec, ",.");
        int neg = len > 2 && strncmp(spec, "no", 2) == 0;
        const char *word = neg ? spec + 2 : spec;
        size_t wlen = neg ? len - 2 : len;
        for (size_t i = 0; i < GP_ARRAY_LEN(names); i++) {
            if (strlen(names[i].name) == wlen && strncmp(names[i].name, word, wlen) == 0)
                *(neg ? &off : &on) |= names[i].bits;
        }
        spec += len + (spec[len] != '\0');
    }
    if (on == 0)
        on = GP_PARTS_DEFAULT; /* only "no..." words: remove from the default */
    return on & ~off;
}

/* ---- Callback state ---------------------------------------------------- */

/* Bumped at every window begin; a thread whose tls_window differs drops its
 * nesting depth, so a call that was in flight when callbacks were switched
 * off (enter seen, exit never) cannot mute that thread in later windows. */
static atomic_uint_fast64_t window_gen;
static _Thread_local uint64_t tls_window;
static _Thread_local uint32_t tls_depth; /* traced API calls open on this thread */

/* Without SYNCHRONIZATION records (the default: they cost ~1.5 us on every
 * launch, docs/benchmarks.md), each outermost synchronizing call becomes a
 * GP_GPU_SYNC record made here from its enter and exit, which are the
 * record's host-side start and end. `tls_sync` holds the open one; only its
 * `kind` is read on other calls. */
static _Thread_local GpGpuRecord tls_sync;
static atomic_int sync_from_callbacks; /* set for a session without PART_SYNC */

static const uint32_t runtime_cbids[] = {
#define GP_CBID(id, cls) id,
    GP_CUPTI_RUNTIME_APIS(GP_CBID)};
static const uint32_t driver_cbids[] = {GP_CUPTI_DRIVER_APIS(GP_CBID)
#undef GP_CBID
};

/* Runtime/driver API enter and exit. One enter/exit pair per outermost
 * traced call: a runtime call that goes through a traced driver call on the
 * same thread is recorded once, under the runtime call's correlation id,
 * which is the id CUPTI puts on the kernel or copy it launched. */
/* capture="cudaProfilerApi": the profiler-API callbacks are on (see
 * gp_cuda_capture_profiler_api). Written on the interpreter thread. */
static atomic_int capture_api_on;

static int
is_profiler_api(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, int *start)
{
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API &&
        (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 ||
         cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000)) {
        *start = cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000;
        return 1;
    }
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API && (cbid == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart ||
                                                 cbid == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop)) {
        *start = cbid == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart;
        return 1;
    }
    return 0;
}

/* The GP_SYNC_* kind of a synchronizing API, 0 for any other; *ptsz for the
 * per-thread-default-stream variants, *stream_arg when the call's first
 * parameter is the stream it waits for or on. */
static uint8_t
sync_api_kind(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, int *ptsz, int *stream_arg)
{
    *ptsz = 0;
    *stream_arg = 1;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        switch (cbid) {
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000:
            *ptsz = 1;
            /* fall through */
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
            return GP_SYNC_STREAM;
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_ptsz_v7000:
            *ptsz = 1;
            /* fall through */
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020:
            return GP_SYNC_STREAM_WAIT_EVENT;
        case CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020:
            *stream_arg = 0;
            return GP_SYNC_EVENT;
        case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020:
            *stream_arg = 0;
            return GP_SYNC_CONTEXT;
        default:
            return 0;
        }
    }
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz:
        *ptsz = 1;
        /* fall through */
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize:
        return GP_SYNC_STREAM;
    case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz:
        *ptsz = 1;
        /* fall through */
    case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent:
        return GP_SYNC_STREAM_WAIT_EVENT;
    case CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize:
        *stream_arg = 0;
        return GP_SYNC_EVENT;
    case CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize:
    case CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2:
        *stream_arg = 0;
        return GP_SYNC_CONTEXT;
    default:
        return 0;
    }
}

/* At the outermost enter of a synchronizing call: what its record needs
 * besides the exit time. The stream is the call's first parameter in every
 * params struct of sync_api_kind's stream calls (cudaStreamSynchronize_v3020
 * _params, cuStreamWaitEvent_params...), read without their generated
 * headers, which the CUPTI wheel lacks. CUPTI calls are allowed here. */
static void
sync_open(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const CUpti_CallbackData *cb,
          uint64_t now)
{
    int ptsz, stream_arg;
    uint8_t kind = sync_api_kind(domain, cbid, &ptsz, &stream_arg);
    memset(&tls_sync, 0, sizeof tls_sync);
    if (kind == 0)
        return;
    GpGpuRecord *r = &tls_sync;
    r->kind = GP_GPU_SYNC;
    r->subkind = kind;
    r->start_ns = now;
    r->correlation = cb->correlationId;
    r->device = r->src_device = r->dst_device = -1;
    uint32_t id = 0;
    if (cb->context != NULL) {
        if (gp_cupti.cuptiGetDeviceId(cb->context, &id) == CUPTI_SUCCESS && id <= INT16_MAX)
            r->device = (int16_t)id;
        if (gp_cupti.cuptiGetContextId(cb->context, &id) == CUPTI_SUCCESS)
            r->context = id;
    }
    if (stream_arg && cb->functionParams != NULL && cb->context != NULL) {
        CUstream stream = *(CUstream const *)cb->functionParams;
        if (gp_cupti.cuptiGetStreamIdEx(cb->context, stream, (uint8_t)ptsz, &id) == CUPTI_SUCCESS)
            r->stream = id;
    }
}

static void CUPTIAPI
on_api(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
    (void)userdata;
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API)
        return;
    const CUpti_CallbackData *cb = data;
    int start;
    if (GP_UNLIKELY(atomic_load_explicit(&capture_api_on, memory_order_relaxed)) &&
        is_profiler_api(domain, cbid, &start)) {
        /* Open once cudaProfilerStart has returned, close as cudaProfilerStop
         * is entered: neither call lands in the window. The runtime call
         * goes through the driver call; the second notice changes nothing. */
        if ((cb->callbackSite == CUPTI_API_EXIT) == start)
            gp_nvtx_capture_notify(start);
        return;
    }
    uint64_t gen = atomic_load_explicit(&window_gen, memory_order_relaxed);
    if (tls_window != gen) {
        tls_window = gen;
        tls_depth = 0;
    }
    uint32_t key =
        GP_API_KEY(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? GP_API_RUNTIME : GP_API_DRIVER, cbid);
    if (cb->callbackSite == CUPTI_API_ENTER) {
        if (tls_depth++ == 0) {
            gp_buffer_record_api(gp_clock_raw(), cb->correlationId, key, 1);
            tls_sync.kind = 0;
            /* A sync record is a GPU record: on the profiler clock, as
             * CUPTI's timestamps are (the timestamp callback). */
            if (atomic_load_explicit(&sync_from_callbacks, memory_order_relaxed) &&
                gp_cuda_api_class(key) == GP_APICLASS_SYNC)
                sync_open(domain, cbid, cb, gp_clock_now());
        }
    } else if (tls_depth > 0) {
        /* An exit at depth 0 belongs to a call entered before the window. */
        if (--tls_depth == 0) {
            gp_buffer_record_api(gp_clock_raw(), cb->correlationId, key, 0);
            if (GP_UNLIKELY(tls_sync.kind == GP_GPU_SYNC)) {
                tls_sync.end_ns = gp_clock_now();
                gp_cupti_store_add(&tls_sync);
                tls_sync.kind = 0;
            }
        }
    }
}

/* ---- Helpers ------------------------------------------------------------ */

static GpStatus
cupti_fail(GpStatus st, const char *call, CUptiResult r)
{
    return gp_cupti_loader_fail(st, "%s failed: %s (%d)", call, gp_cupti_loader_result_text(r),
                                (int)r);
}

const char *
gp_cuda_parts(void)
{
    static const char *names[] = {"rtcb",   "drvcb",  "kernels", "serial",
                                  "memcpy", "memset", "sync",    "events"};
    static char text[96];
    unsigned p = atomic_load(&session_open) ? parts : parse_parts(getenv("GPUPROF_CUPTI_PARTS"));
    size_t len = 0;
    text[0] = '\0';
    for (unsigned i = 0; i < GP_ARRAY_LEN(names); i++) {
        if (p & (1u << i))
            len +=
                (size_t)snprintf(text + len, sizeof text - len, "%s%s", len ? "," : "", names[i]);
    }
    return text;
}

/* Switch the traced callbacks of the domains in `which` on or off. Ids that
 * this libcupti does not know (INVALID_PARAMETER) are skipped: they cannot
 * fire either. */
static GpStatus
set_callbacks(uint32_t enable, unsigned which)
{
    static const struct {
        CUpti_CallbackDomain domain;
        unsigned part;
        const uint32_t *ids;
        size_t n;
    } lists[] = {
        {CUPTI_CB_DOMAIN_RUNTIME_API, PART_RT_CALLBACKS, runtime_cbids,
         GP_ARRAY_LEN(runtime_cbids)},
        {CUPTI_CB_DOMAIN_DRIVER_API, PART_DRV_CALLBACKS, driver_cbids, GP_ARRAY_LEN(driver_cbids)},
    };
    GpStatus st = GP_OK;
    for (size_t l = 0; l < GP_ARRAY_LEN(lists); l++) {
        if (!(which & lists[l].part))
            continue;
        for (size_t i = 0; i < lists[l].n; i++) {
            CUptiResult r =
                gp_cupti.cuptiEnableCallback(enable, subscriber, lists[l].domain, lists[l].ids[i]);
            if (r == CUPTI_SUCCESS || r == CUPTI_ERROR_INVALID_PARAMETER)
                continue;
            if (st == GP_OK)
                st = cupti_fail(GP_ERR_CUPTI, "cuptiEnableCallback", r);
            if (enable)
                return st; /* the caller switches off what was switched on */
        }
    }
    return st;
}

static GpStatus enable_kind(CUpti_ActivityKind kind, const char *name);

/* Activity-only mode: API records (RUNTIME and DRIVER kinds) for the traced
 * ids only. The kinds record every API a framework calls (cudaGetDevice,
 * cudaEventQuery...), most of which we drop when decoding; CUPTI 12.x and
 * later can switch single ids off after the kind is on (not before: the
 * kind resets them), which saves recording those. Tried the other way
 * round on CUPTI 13.0 (H200): ids switched on without their kind gave no
 * records. A failure to switch an id off only costs records. */
static GpStatus
enable_api_records(void)
{
    GpStatus st = enable_kind(CUPTI_ACTIVITY_KIND_RUNTIME, "CUPTI_ACTIVITY_KIND_RUNTIME");
    if (st == GP_OK)
        st = enable_kind(CUPTI_ACTIVITY_KIND_DRIVER, "CUPTI_ACTIVITY_KIND_DRIVER");
    if (st != GP_OK)
        return st;
    for (uint32_t cbid = 1; cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE; cbid++)
        if (!gp_cupti_decode_traced(CUPTI_CB_DOMAIN_RUNTIME_API, cbid))
            gp_cupti.cuptiActivityEnableRuntimeApi(cbid, 0);
    for (uint32_t cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE; cbid++)
        if (!gp_cupti_decode_traced(CUPTI_CB_DOMAIN_DRIVER_API, cbid))
            gp_cupti.cuptiActivityEnableDriverApi(cbid, 0);
    return GP_OK;
}

static GpStatus
enable_kind(CUpti_ActivityKind kind, const char *name)
{
    CUptiResult r = gp_cupti.cuptiActivityEnable(kind);
    if (r != CUPTI_SUCCESS)
        return gp_cupti_loader_fail(GP_ERR_CUPTI, "cuptiActivityEnable(%s) failed: %s (%d)", name,
                                    gp_cupti_loader_result_text(r), (int)r);
    kinds_on[n_kinds_on++] = kind;
    return GP_OK;
}

/* Disable the enabled kinds for which `pick` says so; keep the first error. */
static GpStatus
disable_kinds(int (*pick)(CUpti_ActivityKind))
{
    GpStatus st = GP_OK;
    int kept = 0;
    for (int i = 0; i < n_kinds_on; i++) {
        CUpti_ActivityKind kind = kinds_on[i];
        if (pick != NULL && !pick(kind)) {
            kinds_on[kept++] = kind;
            continue;
        }
        CUptiResult r = gp_cupti.cuptiActivityDisable(kind);
        if (r != CUPTI_SUCCESS && st == GP_OK)
            st = gp_cupti_loader_fail(GP_ERR_CUPTI, "cuptiActivityDisable(kind %d) failed: %s (%d)",
                                      (int)kind, gp_cupti_loader_result_text(r), (int)r);
    }
    n_kinds_on = kept;
    return st;
}

/* Kinds recorded on the host when an API is called: off before our own
 * synchronize so that it leaves no sync or API records in the window. */
static int
is_host_kind(CUpti_ActivityKind kind)
{
    return kind == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION || kind == CUPTI_ACTIVITY_KIND_RUNTIME ||
           kind == CUPTI_ACTIVITY_KIND_DRIVER;
}

/* Wait for all work queued on the devices this process uses, so that the
 * forced flush finds complete records (an incomplete one is lost).
 *
 * The device ids in records are not all known yet (most records are still in
 * CUPTI's buffers until the flush), so every device whose primary context is
 * active is synchronized: that is the set of devices the runtime (PyTorch,
 * JAX, CuPy...) uses. Inactive primary contexts are skipped, since retaining
 * one would create a context and allocate device memory. A non-primary
 * context current on this thread (driver-API programs) is synchronized too. */
static GpStatus
sync_devices(void)
{
    const GpCudaDriverApi *d = gp_cupti_loader_driver(NULL);
    if (d == NULL)
        return GP_OK; /* no driver, so no device work to wait for */
    GpStatus st = GP_OK;
    int count = 0;
    CUresult r = d->cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS)
        return gp_cupti_loader_fail(GP_ERR_CUPTI, "cuDeviceGetCount failed: %s (%d)",
                                    gp_cupti_loader_driver_text(r), (int)r);
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        unsigned int flags = 0;
        int active = 0;
        if (d->cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
            d->cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active)
            continue;
        CUcontext ctx = NULL;
        if (d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
            continue;
        r = d->cuCtxPushCurrent_v2(ctx);
        if (r == CUDA_SUCCESS) {
            r = d->cuCtxSynchronize();
            CUcontext popped;
            d->cuCtxPopCurrent_v2(&popped);
        }
        d->cuDevicePrimaryCtxRelease_v2(dev);
        /* A sticky error (a kernel that faulted) shows here first; say so,
         * and still flush what was recorded. */
        if (r != CUDA_SUCCESS && st == GP_OK)
            st = gp_cupti_loader_fail(GP_ERR_CUPTI, "cuCtxSynchronize (device %d) failed: %s (%d)",
                                      i, gp_cupti_loader_driver_text(r), (int)r);
    }
    CUcontext cur = NULL;
    if (d->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
        r = d->cuCtxSynchronize();
        if (r != CUDA_SUCCESS && st == GP_OK)
            st = gp_cupti_loader_fail(GP_ERR_CUPTI,
                                      "cuCtxSynchronize (current context) failed: %s (%d)",
                                      gp_cupti_loader_driver_text(r), (int)r);
    }
    return st;
}

/* ---- Session ------------------------------------------------------------- */

GpStatus
gp_cuda_session_begin(unsigned options)
{
    if (!gp_cuda_loaded()) {
        if (gp_cuda_reason()[0] == '\0')
            gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "libcupti is not loaded (gp_cuda_load)");
        return GP_ERR_CUDA_UNAVAIL;
    }
    int closed = 0;
    if (!atomic_compare_exchange_strong(&session_open, &closed, 1))
        return gp_cupti_loader_fail(GP_ERR_STATE, "a CUDA profiling session is already open");

    gp_cupti_activity_session_begin();
    gp_cupti_loader_fail(GP_OK, "%s", "");
    atomic_store(&cupti_attached, 1); /* from here on CUPTI may hold our state */

    /* Subscribe first: CUPTI's docs ask every client to, so that a second
     * tool (Nsight Systems, torch.profiler's kineto) is detected here. */
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1];
    memset(holder, 0, sizeof holder);
    CUpti_SubscriberParams params;
    memset(&params, 0, sizeof params);
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "gpuprof";
    params.oldSubscriberName = holder;
    params.oldSubscriberSize = sizeof holder - 1;
    subscriber = NULL;
    GpStatus st = GP_OK;
    int mode = GP_CUPTI_MODE_CALLBACKS;
    const char *forced = getenv("GPUPROF_CUPTI_MODE");
    CUptiResult r;
    if (forced != NULL && strcmp(forced, "activity") == 0) {
        /* Asked for (GPUPROF_CUPTI_MODE=activity): no callbacks at all; API
         * calls come from activity records, as with another subscriber. */
        subscriber = NULL;
        mode = GP_CUPTI_MODE_ACTIVITY_ONLY;
        forced_activity = 1;
        gp_cupti_loader_fail(GP_OK, "activity-only mode requested by GPUPROF_CUPTI_MODE=activity");
        r = CUPTI_SUCCESS;
    } else if ((r = gp_cupti.cuptiSubscribe_v2(&subscriber, on_api, NULL, &params)) ==
               CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        subscriber = NULL;
        mode = GP_CUPTI_MODE_ACTIVITY_ONLY;
        gp_cupti_loader_fail(GP_OK,
                             "another CUPTI client (%s) holds the callback API, so CUDA API calls "
                             "are taken from activity records (activity-only mode): "
                             "cuptiSubscribe_v2 returned %s",
                             holder[0] ? holder : "unnamed", gp_cupti_loader_result_text(r));
    } else if (r != CUPTI_SUCCESS) {
        subscriber = NULL;
        /* Without a driver CUPTI 13.0 answers CUPTI_ERROR_UNKNOWN, which
         * explains nothing; the driver's own failure does. */
        const char *why = NULL;
        if (gp_cupti_loader_driver(&why) == NULL)
            st = gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "cuptiSubscribe_v2 failed: %s (%d); %s",
                                      gp_cupti_loader_result_text(r), (int)r, why);
        else
            st = cupti_fail(GP_ERR_CUDA_UNAVAIL, "cuptiSubscribe_v2", r);
        goto fail;
    }

    /* Before any kind is enabled, so that every record is on our clock.
     * GPUPROF_CUPTI_CLOCK=cupti (benchmarks only) leaves CUPTI on its own
     * clock, to measure what the callback costs; records are then off ours. */
    const char *clock_env = getenv("GPUPROF_CUPTI_CLOCK");
    if (clock_env != NULL && strcmp(clock_env, "cupti") == 0)
        r = CUPTI_SUCCESS;
    else
        r = gp_cupti.cuptiActivityRegisterTimestampCallback(gp_clock_now_fn);
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED && subscriber == NULL) {
        /* Seen under compute-sanitizer and Nsight Compute: every CUPTI
         * entry point answers this, the activity API included. */
        st = gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL,
                                  "another tool (%s) holds all of CUPTI, its activity API "
                                  "included, as compute-sanitizer and Nsight Compute do; "
                                  "CPU profiling goes on without GPU capture",
                                  holder[0] ? holder : "unnamed");
        goto fail;
    }
    if (r != CUPTI_SUCCESS) {
        st = cupti_fail(GP_ERR_CUDA_UNAVAIL, "cuptiActivityRegisterTimestampCallback", r);
        goto fail;
    }
    r = gp_cupti_activity_register();
    if (r != CUPTI_SUCCESS) {
        st = cupti_fail(GP_ERR_CUDA_UNAVAIL, "cuptiActivityRegisterCallbacks", r);
        goto fail;
    }
    if (mode == GP_CUPTI_MODE_ACTIVITY_ONLY) {
        /* API records are joined to our threads by gettid (GpThreadBuf.os_tid);
         * CUPTI's default id is pthread_self. */
        r = gp_cupti.cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
        if (r != CUPTI_SUCCESS) {
            st = cupti_fail(GP_ERR_CUDA_UNAVAIL, "cuptiSetThreadIdType(SYSTEM)", r);
            goto fail;
        }
    }
    gp_cupti_loader_set_mode(mode);
    parts = parse_parts(getenv("GPUPROF_CUPTI_PARTS"));
    if (options & GP_CUDA_SYNC_RECORDS)
        parts |= PART_SYNC | PART_EVENTS;
    atomic_store(&sync_from_callbacks, !(parts & PART_SYNC));
    window_open = 0;
    n_kinds_on = 0;
    return GP_OK;

fail:
    if (subscriber != NULL) {
        gp_cupti.cuptiUnsubscribe(subscriber);
        subscriber = NULL;
    }
    gp_cupti_activity_session_end();
    gp_cupti_loader_set_mode(GP_CUPTI_MODE_OFF);
    atomic_store(&session_open, 0);
    return st;
}

GpStatus
gp_cuda_window_begin(int memory)
{
    if (!atomic_load(&session_open))
        return gp_cupti_loader_fail(GP_ERR_STATE, "no CUDA profiling session is open");
    if (window_open)
        return gp_cupti_loader_fail(GP_ERR_STATE, "a CUDA profiling window is already open");
    atomic_fetch_add(&window_gen, 1);
    n_kinds_on = 0;

    GpStatus st = GP_OK;
    if (subscriber != NULL && (st = set_callbacks(1, parts)) != GP_OK)
        goto fail;

#define GP_ENABLE(kind)                                                                            \
    if ((st = enable_kind(kind, #kind)) != GP_OK)                                                  \
        goto fail;
    if (parts & PART_SERIAL) {
        GP_ENABLE(CUPTI_ACTIVITY_KIND_KERNEL)
    } else if (parts & PART_KERNELS) {
        GP_ENABLE(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
    }
    if (parts & PART_MEMCPY) {
        GP_ENABLE(CUPTI_ACTIVITY_KIND_MEMCPY)
        GP_ENABLE(CUPTI_ACTIVITY_KIND_MEMCPY2)
    }
    if (parts & PART_MEMSET) {
        GP_ENABLE(CUPTI_ACTIVITY_KIND_MEMSET)
    }
    if (parts & PART_SYNC) {
        GP_ENABLE(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)
    }
    if (memory) {
        GP_ENABLE(CUPTI_ACTIVITY_KIND_MEMORY2)
    }
#undef GP_ENABLE
    /* Activity-only: the traced API calls come as records. Never in
     * callback mode, where the callbacks already see them. */
    if (subscriber == NULL && (st = enable_api_records()) != GP_OK)
        goto fail;
    /* Event records only name the stream a stream-wait-event waits for
     * (wait_stream); the window works without them, so a refusal is not
     * an error. Measured on an H200 (PyTorch, launch-bound MLP): they add
     * ~20% to each step, as much as the kernel records themselves, so they
     * are opt-in (GPUPROF_CUPTI_PARTS=default,events). */
    if ((parts & PART_EVENTS) &&
        gp_cupti.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CUDA_EVENT) == CUPTI_SUCCESS)
        kinds_on[n_kinds_on++] = CUPTI_ACTIVITY_KIND_CUDA_EVENT;

    window_open = 1;
    return GP_OK;

fail:
    disable_kinds(NULL);
    if (subscriber != NULL)
        set_callbacks(0, GP_PARTS_CALLBACKS);
    return st;
}

GpStatus
gp_cuda_window_end(void)
{
    if (!window_open)
        return GP_OK;
    window_open = 0;
    /* Order: callbacks off (our own calls below must not be recorded), then
     * the host-side kinds, then wait for the device, then the device kinds,
     * then the forced flush that delivers every buffer before we return. */
    GpStatus st = GP_OK;
    if (subscriber != NULL)
        st = set_callbacks(0, GP_PARTS_CALLBACKS);
    GpStatus s2 = disable_kinds(is_host_kind);
    if (st == GP_OK)
        st = s2;
    s2 = sync_devices();
    if (st == GP_OK)
        st = s2;
    s2 = disable_kinds(NULL);
    if (st == GP_OK)
        st = s2;
    CUptiResult r = gp_cupti.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS && st == GP_OK)
        st = cupti_fail(GP_ERR_CUPTI, "cuptiActivityFlushAll(FLUSH_FORCED)", r);
    return st;
}

GpStatus
gp_cuda_session_end(void)
{
    if (!atomic_load(&session_open))
        return GP_OK;
    GpStatus st = gp_cuda_window_end();
    /* Detach so that the program runs at native speed afterwards. Only
     * when we were CUPTI's sole client: in activity-only mode forced on us
     * by another subscriber, that tool is using CUPTI and cuptiFinalize
     * would tear its state down. Called here, not from an API-exit callback
     * as CUPTI's docs suggest, because window_end has already synchronized
     * the devices and flushed every buffer, which the docs give as the
     * alternative. */
    int sole_client = forced_activity;
    if (subscriber != NULL) {
        CUptiResult r = gp_cupti.cuptiUnsubscribe(subscriber);
        subscriber = NULL;
        if (r != CUPTI_SUCCESS && st == GP_OK)
            st = cupti_fail(GP_ERR_CUPTI, "cuptiUnsubscribe", r);
        sole_client = gp_cupti_loader_get_mode() == GP_CUPTI_MODE_CALLBACKS;
    }
    if (sole_client && atomic_load(&cupti_attached)) {
        CUptiResult r = gp_cupti.cuptiFinalize();
        if (r == CUPTI_SUCCESS)
            atomic_store(&cupti_attached, 0);
        else if (st == GP_OK)
            st = cupti_fail(GP_ERR_CUPTI, "cuptiFinalize", r);
    }
    forced_activity = 0;
    gp_cupti_activity_session_end();
    gp_cupti_loader_set_mode(GP_CUPTI_MODE_OFF);
    atomic_store(&session_open, 0); /* last: the next owner sees a clean state */
    return st;
}

GpStatus
gp_cuda_capture_profiler_api(int on)
{
    if (on && (!atomic_load(&session_open) || subscriber == NULL))
        return gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL,
                                    "capture='cudaProfilerApi' needs CUPTI's API callbacks, %s",
                                    subscriber == NULL && atomic_load(&session_open)
                                        ? "which another CUPTI client holds (activity-only mode)"
                                        : "and no CUDA profiling session is open");
    static const struct {
        CUpti_CallbackDomain domain;
        CUpti_CallbackId cbid;
    } ids[] = {
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000},
        {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000},
        {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart},
        {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop},
    };
    atomic_store(&capture_api_on, on);
    if (subscriber == NULL)
        return GP_OK; /* off: the unsubscribe already dropped them */
    for (size_t i = 0; i < GP_ARRAY_LEN(ids); i++) {
        CUptiResult r =
            gp_cupti.cuptiEnableCallback((uint32_t)on, subscriber, ids[i].domain, ids[i].cbid);
        if (r != CUPTI_SUCCESS && r != CUPTI_ERROR_INVALID_PARAMETER && on) {
            atomic_store(&capture_api_on, 0);
            return cupti_fail(GP_ERR_CUPTI, "cuptiEnableCallback(cudaProfilerStart/Stop)", r);
        }
    }
    return GP_OK;
}

void
gp_cuda_after_fork_child(void)
{
    /* The parent's subscription, buffers and enabled kinds belong to the
     * parent's CUDA context, which the child cannot use: drop our view of
     * them (the child's copy of the buffers is leaked, by design). */
    gp_cupti_activity_after_fork_child();
    subscriber = NULL;
    window_open = 0;
    forced_activity = 0;
    atomic_store(&capture_api_on, 0);
    gp_cupti_loader_set_mode(GP_CUPTI_MODE_OFF);
    atomic_store(&session_open, 0);
}
