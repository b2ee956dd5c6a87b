/* Open libcupti (and libcuda) at run time, resolve the symbol tables of
 * cupti_symbols.h all or none, explain every failure, and answer the static
 * questions about CUDA APIs and devices (names, classes, properties).
 *
 * Threads: any. gp_cuda_load is serialized by load_lock (it runs with the
 * GIL released), the reason by reason_lock, the driver table by pthread_once,
 * the name cache by names_lock; the rest is atomics or read-only data.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NOLOAD */
#endif

#include "cupti_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "dlsym results are stored into function pointers by memcpy");

GpCuptiApi gp_cupti; /* see cupti_internal.h: written once before `loaded` */

/* 1 once gp_cuda_load succeeded; release store after gp_cupti is filled. */
static atomic_int loaded;
/* cuptiGetVersion of the loaded library, else 0. */
static atomic_uint cupti_version;
/* GP_CUPTI_MODE_*; written by cupti_callback.c on the control thread, read anywhere. */
static atomic_int mode;
/* Serializes gp_cuda_load for free-threaded builds, where the GIL does not. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* Why capture is off or degraded; protected by reason_lock. Written by the
 * control calls, some of which run with the GIL released (load, device
 * count, window/session end), and read from other threads through
 * gp_cuda_reason, which hands each thread its own copy (reason_copy) so that
 * a later write cannot change text the caller is still reading. CUPTI
 * threads never write it; they count drops instead. */
#define REASON_BYTES 1024
static pthread_mutex_t reason_lock = PTHREAD_MUTEX_INITIALIZER;
static char reason[REASON_BYTES];
static _Thread_local char reason_copy[REASON_BYTES];

int
gp_cuda_compiled(void)
{
    return 1;
}

GpStatus
gp_cupti_loader_fail(GpStatus status, const char *fmt, ...)
{
    char text[REASON_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&reason_lock);
    memcpy(reason, text, sizeof reason);
    pthread_mutex_unlock(&reason_lock);
    return status;
}

/* The pointer is to this thread's copy: valid for the thread's lifetime,
 * refreshed by its next call. */
const char *
gp_cuda_reason(void)
{
    pthread_mutex_lock(&reason_lock);
    memcpy(reason_copy, reason, sizeof reason_copy);
    pthread_mutex_unlock(&reason_lock);
    return reason_copy;
}

void
gp_cupti_loader_set_mode(int m)
{
    atomic_store(&mode, m);
}

int
gp_cupti_loader_get_mode(void)
{
    return atomic_load(&mode);
}

const char *
gp_cuda_mode(void)
{
    switch (atomic_load(&mode)) {
    case GP_CUPTI_MODE_CALLBACKS:
        return "callbacks";
    case GP_CUPTI_MODE_ACTIVITY_ONLY:
        return "activity-only";
    default:
        return "off";
    }
}

int
gp_cuda_loaded(void)
{
    return atomic_load_explicit(&loaded, memory_order_acquire);
}

uint32_t
gp_cuda_version(void)
{
    return atomic_load(&cupti_version);
}

const char *
gp_cupti_loader_result_text(CUptiResult r)
{
    const char *s = NULL;
    if (gp_cuda_loaded() && gp_cupti.cuptiGetResultString(r, &s) == CUPTI_SUCCESS && s != NULL)
        return s;
    return "unknown CUPTI result";
}

/* dlsym into a function-pointer slot. memcpy, because ISO C has no
 * conversion from void * to a function pointer (POSIX guarantees the bits). */
static int
resolve(void *handle, const char *name, void *slot)
{
    void *p = dlsym(handle, name);
    if (p == NULL)
        return 0;
    memcpy(slot, &p, sizeof p);
    return 1;
}

/* Resolve every libcupti symbol into *api; NULL, or the first missing name. */
static const char *
resolve_cupti(void *handle, GpCuptiApi *api)
{
#define GP_RESOLVE(name, ret, args)                                                                \
    if (!resolve(handle, #name, &api->name))                                                       \
        return #name;
    GP_CUPTI_SYMBOLS(GP_RESOLVE)
#undef GP_RESOLVE
    return NULL;
}

/* The text of a CUPTI result before gp_cupti is published (load failures). */
static const char *
early_result_text(void *handle, CUptiResult r)
{
    CUptiResult (*get)(CUptiResult, const char **) = NULL;
    const char *s = NULL;
    if (resolve(handle, "cuptiGetResultString", &get) && get(r, &s) == CUPTI_SUCCESS && s != NULL)
        return s;
    return "unknown CUPTI result";
}

static GpStatus
load_locked(const char *path)
{
    if (atomic_load_explicit(&loaded, memory_order_acquire))
        return GP_OK;
    if (path == NULL || path[0] == '\0')
        return gp_cupti_loader_fail(GP_ERR_VALUE, "gp_cuda_load: empty libcupti path");

    dlerror();
    void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (handle == NULL) {
        const char *err = dlerror();
        return gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "dlopen(\"%s\") failed: %s", path,
                                    err ? err : "unknown error");
    }

    /* Version first: an older libcupti usually also lacks some newer symbol,
     * and "too old" is the explanation the user can act on. */
    GpCuptiApi api;
    memset(&api, 0, sizeof api);
    uint32_t version = 0;
    GpStatus st = GP_OK;
    if (!resolve(handle, "cuptiGetVersion", &api.cuptiGetVersion)) {
        st = gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL,
                                  "libcupti at %s lacks symbol cuptiGetVersion", path);
        goto fail;
    }
    CUptiResult r = api.cuptiGetVersion(&version);
    if (r != CUPTI_SUCCESS) {
        st =
            gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "cuptiGetVersion (libcupti at %s) failed: %s",
                                 path, early_result_text(handle, r));
        goto fail;
    }
    if (version < CUPTI_API_VERSION) {
        st = gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL,
                                  "libcupti at %s has CUPTI API version %u, older than the "
                                  "headers gpuprof was built with (%u); load a newer libcupti "
                                  "(nvidia-cuda-cupti wheel or CUDA toolkit)",
                                  path, (unsigned)version, (unsigned)CUPTI_API_VERSION);
        goto fail;
    }
    const char *missing = resolve_cupti(handle, &api);
    if (missing != NULL) {
        st = gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "libcupti at %s lacks symbol %s", path,
                                  missing);
        goto fail;
    }

    gp_cupti = api;
    atomic_store(&cupti_version, version);
    gp_cupti_loader_fail(GP_OK, "%s", "");
    atomic_store_explicit(&loaded, 1, memory_order_release);
    return GP_OK;

fail:
    /* Nothing of this library is in use yet (only cuptiGetVersion ran), so
     * dropping our reference keeps a rejected CUPTI from lingering beside the
     * one a later call may load; a copy someone else opened stays loaded. */
    dlclose(handle);
    return st;
}

GpStatus
gp_cuda_load(const char *path)
{
    pthread_mutex_lock(&load_lock);
    GpStatus st = load_locked(path);
    pthread_mutex_unlock(&load_lock);
    return st;
}

/* ---- API names and classes -------------------------------------------- */

#define NAME_CACHE_SLOTS 2048u /* > number of runtime + driver cbids (~1330) */

/* api key -> name, open addressing, entries never change once set (so the
 * returned pointers stay valid forever, as gp_cuda.h promises).
 * Protected by names_lock; the CUPTI call happens outside it. */
static struct {
    uint32_t key; /* 0: empty (a valid key always has a domain bit set) */
    const char *name;
} name_cache[NAME_CACHE_SLOTS];
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *
name_cache_find_locked(uint32_t key, uint32_t *slot)
{
    uint32_t i = (key * 2654435761u) & (NAME_CACHE_SLOTS - 1);
    for (uint32_t n = 0; n < NAME_CACHE_SLOTS; n++, i = (i + 1) & (NAME_CACHE_SLOTS - 1)) {
        if (name_cache[i].key == key) {
            *slot = i;
            return name_cache[i].name;
        }
        if (name_cache[i].key == 0) {
            *slot = i;
            return NULL;
        }
    }
    *slot = UINT32_MAX; /* full */
    return NULL;
}

/* CUPTI names runtime ids after the cbid enum ("cudaLaunchKernel_v7000");
 * users know "cudaLaunchKernel", so drop a trailing _v<digits>. Returns a
 * malloc'ed copy only when something was dropped, else `name` itself. */
static const char *
strip_version(const char *name)
{
    size_t len = strlen(name);
    size_t i = len;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
        i--;
    if (i == len || i < 3 || name[i - 1] != 'v' || name[i - 2] != '_')
        return name;
    size_t keep = i - 2;
    char *copy = malloc(keep + 1);
    if (copy == NULL)
        return name;
    memcpy(copy, name, keep);
    copy[keep] = '\0';
    return copy;
}

const char *
gp_cuda_api_name(uint32_t api_key)
{
    uint32_t domain = GP_API_DOMAIN(api_key);
    if (!gp_cuda_loaded() || (domain != GP_API_RUNTIME && domain != GP_API_DRIVER))
        return "cuda_api";

    uint32_t slot;
    pthread_mutex_lock(&names_lock);
    const char *cached = name_cache_find_locked(api_key, &slot);
    pthread_mutex_unlock(&names_lock);
    if (cached != NULL)
        return cached;

    const char *raw = NULL;
    CUpti_CallbackDomain cdomain =
        domain == GP_API_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
    if (gp_cupti.cuptiGetCallbackName(cdomain, GP_API_CBID(api_key), &raw) != CUPTI_SUCCESS ||
        raw == NULL || raw[0] == '\0')
        return "cuda_api";
    const char *name = strip_version(raw);

    pthread_mutex_lock(&names_lock);
    const char *raced = name_cache_find_locked(api_key, &slot);
    if (raced == NULL && slot != UINT32_MAX) {
        name_cache[slot].key = api_key;
        name_cache[slot].name = name;
        raced = name;
    }
    pthread_mutex_unlock(&names_lock);
    if (raced != name && name != raw)
        free((void *)name); /* another thread cached it first, or the cache is full */
    return raced != NULL ? raced : "cuda_api";
}

int
gp_cuda_api_class(uint32_t api_key)
{
    uint32_t cbid = GP_API_CBID(api_key);
#define GP_CLASS_CASE(id, cls)                                                                     \
    case id:                                                                                       \
        return cls;
    switch (GP_API_DOMAIN(api_key)) {
    case GP_API_RUNTIME:
        switch (cbid) {
            GP_CUPTI_RUNTIME_APIS(GP_CLASS_CASE)
            GP_CUPTI_RUNTIME_CLASS_ONLY(GP_CLASS_CASE)
        default:
            return GP_APICLASS_OTHER;
        }
    case GP_API_DRIVER:
        switch (cbid) {
            GP_CUPTI_DRIVER_APIS(GP_CLASS_CASE)
            GP_CUPTI_DRIVER_CLASS_ONLY(GP_CLASS_CASE)
        default:
            return GP_APICLASS_OTHER;
        }
    default:
        return GP_APICLASS_OTHER;
    }
#undef GP_CLASS_CASE
}

/* ---- CUDA driver ------------------------------------------------------- */

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
/* The next three are written only inside driver_once, read-only after it. */
static GpCudaDriverApi driver;
static int driver_ok;
static char driver_reason[512];

static void
driver_open(void)
{
    /* A driver the CUDA runtime or a framework already loaded is the one to
     * talk to; RTLD_NOLOAD finds it without loading a second copy. */
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) {
        dlerror();
        handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    }
    if (handle == NULL) {
        const char *err = dlerror();
        snprintf(driver_reason, sizeof driver_reason,
                 "dlopen(\"libcuda.so.1\") failed: %s (no NVIDIA driver installed?)",
                 err ? err : "unknown error");
        return;
    }
    GpCudaDriverApi api;
    memset(&api, 0, sizeof api);
#define GP_RESOLVE(name, ret, args)                                                                \
    if (!resolve(handle, #name, &api.name)) {                                                      \
        snprintf(driver_reason, sizeof driver_reason, "libcuda.so.1 lacks symbol %s", #name);      \
        return;                                                                                    \
    }
    GP_CUDA_DRIVER_SYMBOLS(GP_RESOLVE)
#undef GP_RESOLVE
    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        if (api.cuGetErrorString(r, &s) != CUDA_SUCCESS || s == NULL)
            s = "unknown CUDA driver error";
        snprintf(driver_reason, sizeof driver_reason, "cuInit(0) failed: %s (%d)", s, (int)r);
        return;
    }
    /* The handle is never closed: the driver outlives every profiler. */
    driver = api;
    driver_ok = 1;
}

const GpCudaDriverApi *
gp_cupti_loader_driver(const char **why)
{
    pthread_once(&driver_once, driver_open);
    if (driver_ok)
        return &driver;
    if (why != NULL)
        *why = driver_reason;
    return NULL;
}

const char *
gp_cupti_loader_driver_text(CUresult r)
{
    const char *s = NULL;
    const GpCudaDriverApi *d = gp_cupti_loader_driver(NULL);
    if (d != NULL && d->cuGetErrorString(r, &s) == CUDA_SUCCESS && s != NULL)
        return s;
    return "unknown CUDA driver error";
}

int
gp_cuda_device_count(void)
{
    const char *why = NULL;
    const GpCudaDriverApi *d = gp_cupti_loader_driver(&why);
    if (d == NULL) {
        gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "%s", why);
        return 0;
    }
    int n = 0;
    CUresult r = d->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "cuDeviceGetCount failed: %s (%d)",
                             gp_cupti_loader_driver_text(r), (int)r);
        return 0;
    }
    return n;
}

static const struct {
    CUdevice_attribute attr;
    const char *name;
    size_t offset;
} device_attrs[] = {
#define GP_ATTR(a, field) {a, #a, offsetof(GpDeviceProps, field)}
    GP_ATTR(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, compute_major),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, compute_minor),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, max_threads_per_block),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, max_threads_per_sm),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, regs_per_block),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, regs_per_sm),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_WARP_SIZE, warp_size),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, shared_mem_per_block),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, shared_mem_per_block_optin),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, shared_mem_per_sm),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, max_blocks_per_sm),
    GP_ATTR(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, num_sms),
#undef GP_ATTR
};

GpStatus
gp_cuda_device_props(int device, GpDeviceProps *out)
{
    if (out == NULL)
        return gp_cupti_loader_fail(GP_ERR_VALUE, "gp_cuda_device_props: out is NULL");
    memset(out, 0, sizeof *out);
    out->id = device;

    const char *why = NULL;
    const GpCudaDriverApi *d = gp_cupti_loader_driver(&why);
    if (d == NULL)
        return gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL, "%s", why);

    CUdevice dev;
    CUresult r = d->cuDeviceGet(&dev, device);
    if (r != CUDA_SUCCESS)
        return gp_cupti_loader_fail(
            r == CUDA_ERROR_INVALID_DEVICE ? GP_ERR_VALUE : GP_ERR_CUDA_UNAVAIL,
            "cuDeviceGet(%d) failed: %s (%d)", device, gp_cupti_loader_driver_text(r), (int)r);
    r = d->cuDeviceGetName(out->name, (int)sizeof out->name, dev);
    if (r != CUDA_SUCCESS)
        return gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL,
                                    "cuDeviceGetName(device %d) failed: %s (%d)", device,
                                    gp_cupti_loader_driver_text(r), (int)r);
    out->name[sizeof out->name - 1] = '\0';
    size_t bytes = 0;
    r = d->cuDeviceTotalMem_v2(&bytes, dev);
    if (r != CUDA_SUCCESS)
        return gp_cupti_loader_fail(GP_ERR_CUDA_UNAVAIL,
                                    "cuDeviceTotalMem_v2(device %d) failed: %s (%d)", device,
                                    gp_cupti_loader_driver_text(r), (int)r);
    out->total_global_mem = bytes;
    for (size_t i = 0; i < GP_ARRAY_LEN(device_attrs); i++) {
        int value = 0;
        r = d->cuDeviceGetAttribute(&value, device_attrs[i].attr, dev);
        if (r != CUDA_SUCCESS)
            return gp_cupti_loader_fail(
                GP_ERR_CUDA_UNAVAIL, "cuDeviceGetAttribute(%s, device %d) failed: %s (%d)",
                device_attrs[i].name, device, gp_cupti_loader_driver_text(r), (int)r);
        memcpy((char *)out + device_attrs[i].offset, &value, sizeof value);
    }
    return GP_OK;
}
