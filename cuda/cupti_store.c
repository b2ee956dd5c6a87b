/* The session's GPU records: what the decoder and the API callbacks append,
 * the event and context maps that fill in what a record lacks, the kernel
 * name strings, and the hand-over to the aggregator (gp_cuda_take_records).
 * Kernel names are copied into a string table we own, since CUPTI's name
 * pointers die with the buffer.
 *
 * Appends come on CUPTI's threads (buffer completion) and from the API
 * callbacks; take, strings and session calls on the control thread. All of
 * it is under cuda_lock, which is never held while CUPTI is called
 * (docs/development.md, "Threads, locks and CUPTI").
 */
#include "cupti_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "strtab.h"

#define MAX_RECORDS ((size_t)1 << 23) /* ~1 GiB of records between takes; beyond: dropped */
#define MAX_STRINGS ((uint32_t)1 << 20)
#define EVENT_MAP_MAX ((size_t)1 << 16) /* event-record entries kept; then the map restarts */
#define CTX_MAP_MAX 64

/* Protects every variable below up to `dropped`. Taken on CUPTI's threads
 * (buffer callbacks, API callbacks) and on the control thread (take,
 * strings, session). */
static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;

/* Records delivered since the last take. */
static GpGpuRecord *records;
static size_t n_records, cap_records;

/* Stream-wait-event records whose wait_stream is looked up in the event map
 * at take time: the CUDA_EVENT record of the cudaEventRecord may arrive in a
 * later buffer than the wait that refers to it. */
typedef struct PendingWait {
    size_t index;     /* into records */
    uint64_t sync_id; /* cudaEventSyncId */
} PendingWait;
static PendingWait *pending;
static size_t n_pending, cap_pending;

/* cudaEventSyncId + 1 (0 = empty slot) -> stream that recorded the event.
 * Open addressing; cleared when it reaches EVENT_MAP_MAX entries. */
static uint64_t *ev_keys;
static uint32_t *ev_streams;
static size_t ev_cap, ev_n;

/* CUPTI context id -> device, learnt from device records, used to give
 * synchronization records (which carry no device id) their device. */
static uint32_t ctx_ids[CTX_MAP_MAX];
static int16_t ctx_devs[CTX_MAP_MAX];
static int n_ctx;

/* Kernel names (key 0). */
static GpStrTab strings;

/* Records lost this session: CUPTI's dropped counts plus records we could
 * not decode or store. Atomic: added on CUPTI threads, read anywhere. */
static atomic_uint_fast64_t dropped;

/* 1 between session begin and end. A buffer completed outside a session (in
 * activity-only mode CUPTI keeps our callbacks after we leave) is discarded. */
static atomic_int accepting;

/* ---- String table (cuda_lock) ------------------------------------------ */

/* Id of `name`, adding a copy when new; 0 when it cannot be stored. */
static uint32_t
intern_locked(const char *name)
{
    if (name == NULL)
        return 0;
    size_t len = strlen(name);
    uint64_t h = gp_strtab_hash(0, name, len);
    uint32_t id = gp_strtab_find(&strings, 0, name, len, h);
    if (id == 0 && strings.n < MAX_STRINGS)
        id = gp_strtab_add(&strings, 0, name, len, h);
    return id;
}

const char *
gp_cuda_string(uint32_t id)
{
    pthread_mutex_lock(&cuda_lock);
    const GpStr *s = gp_strtab_get(&strings, id);
    pthread_mutex_unlock(&cuda_lock);
    return s != NULL ? s->text : NULL;
}

void
gp_cuda_clear_strings(void)
{
    pthread_mutex_lock(&cuda_lock);
    gp_strtab_clear(&strings);
    pthread_mutex_unlock(&cuda_lock);
}

/* ---- Event and context maps (cuda_lock) -------------------------------- */

static void
ev_clear_locked(void)
{
    free(ev_keys);
    free(ev_streams);
    ev_keys = NULL;
    ev_streams = NULL;
    ev_cap = ev_n = 0;
}

static void
ev_put_locked(uint64_t sync_id, uint32_t stream)
{
    if (ev_n >= EVENT_MAP_MAX)
        ev_clear_locked(); /* bounded: waits on much older events lose wait_stream */
    if ((ev_n + 1) * 2 > ev_cap) {
        size_t cap = ev_cap ? ev_cap * 2 : 1024;
        uint64_t *keys = calloc(cap, sizeof *keys);
        uint32_t *streams = calloc(cap, sizeof *streams);
        if (keys == NULL || streams == NULL) {
            free(keys);
            free(streams);
            return;
        }
        for (size_t j = 0; j < ev_cap; j++) {
            if (ev_keys[j] == 0)
                continue;
            size_t i = (size_t)(ev_keys[j] * 0x9E3779B97F4A7C15ull) & (cap - 1);
            while (keys[i] != 0)
                i = (i + 1) & (cap - 1);
            keys[i] = ev_keys[j];
            streams[i] = ev_streams[j];
        }
        free(ev_keys);
        free(ev_streams);
        ev_keys = keys;
        ev_streams = streams;
        ev_cap = cap;
    }
    uint64_t key = sync_id + 1;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull) & (ev_cap - 1);
    while (ev_keys[i] != 0 && ev_keys[i] != key)
        i = (i + 1) & (ev_cap - 1);
    if (ev_keys[i] == 0)
        ev_n++;
    ev_keys[i] = key;
    ev_streams[i] = stream;
}

static uint32_t
ev_get_locked(uint64_t sync_id)
{
    if (ev_cap == 0)
        return 0;
    uint64_t key = sync_id + 1;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull) & (ev_cap - 1);
    for (; ev_keys[i] != 0; i = (i + 1) & (ev_cap - 1)) {
        if (ev_keys[i] == key)
            return ev_streams[i];
    }
    return 0;
}

static void
ctx_learn_locked(uint32_t ctx, int16_t dev)
{
    if (ctx == 0 || dev < 0)
        return;
    for (int i = 0; i < n_ctx; i++) {
        if (ctx_ids[i] == ctx) {
            ctx_devs[i] = dev;
            return;
        }
    }
    if (n_ctx < CTX_MAP_MAX) {
        ctx_ids[n_ctx] = ctx;
        ctx_devs[n_ctx] = dev;
        n_ctx++;
    }
}

static int16_t
ctx_device_locked(uint32_t ctx)
{
    for (int i = 0; i < n_ctx; i++) {
        if (ctx_ids[i] == ctx)
            return ctx_devs[i];
    }
    return -1;
}

/* Fill wait_stream and missing devices from the maps; done at take time
 * (and at session end, before the maps go) when every buffer is in. */
static void
resolve_locked(void)
{
    for (size_t i = 0; i < n_pending; i++) {
        if (pending[i].index < n_records)
            records[pending[i].index].wait_stream = ev_get_locked(pending[i].sync_id);
    }
    n_pending = 0;
    for (size_t i = 0; i < n_records; i++) {
        GpGpuRecord *r = &records[i];
        if (r->device < 0 && r->context != 0 && r->kind != GP_GPU_API)
            r->device = ctx_device_locked(r->context);
    }
}

/* ---- Appending (cuda_lock) ---------------------------------------------- */

/* Append one record; 0, or -1 when the array is at MAX_RECORDS or cannot
 * grow (the caller counts the loss). */
static int
append_locked(const GpGpuRecord *rec, const char *name, uint64_t wait_sync)
{
    if (n_records == cap_records) {
        size_t cap = cap_records ? cap_records * 2 : 65536;
        if (cap > MAX_RECORDS)
            cap = MAX_RECORDS;
        GpGpuRecord *grown = cap > cap_records ? realloc(records, cap * sizeof *grown) : NULL;
        if (grown == NULL)
            return -1;
        records = grown;
        cap_records = cap;
    }
    GpGpuRecord *r = &records[n_records];
    *r = *rec;
    if (name != NULL)
        r->name_id = intern_locked(name);
    if (wait_sync != GP_CUPTI_NO_SYNC_ID) {
        if (n_pending == cap_pending) {
            size_t cap = cap_pending ? cap_pending * 2 : 256;
            PendingWait *grown = realloc(pending, cap * sizeof *grown);
            if (grown != NULL) {
                pending = grown;
                cap_pending = cap;
            }
        }
        if (n_pending < cap_pending)
            pending[n_pending++] = (PendingWait){n_records, wait_sync};
    }
    ctx_learn_locked(r->context, r->device);
    n_records++;
    return 0;
}

void
gp_cupti_store_append(const GpGpuRecord *rec, const char *const *name, const uint64_t *wait_sync,
                      size_t n, const uint64_t *ev_sync, const uint32_t *ev_stream, size_t n_ev)
{
    uint64_t lost = 0;
    pthread_mutex_lock(&cuda_lock);
    for (size_t j = 0; j < n_ev; j++)
        ev_put_locked(ev_sync[j], ev_stream[j]);
    for (size_t j = 0; j < n; j++) {
        if (append_locked(&rec[j], name[j], wait_sync[j]) < 0) {
            lost += n - j;
            break;
        }
    }
    pthread_mutex_unlock(&cuda_lock);
    if (lost)
        atomic_fetch_add(&dropped, lost);
}

void
gp_cupti_store_add(const GpGpuRecord *r)
{
    if (!atomic_load(&accepting))
        return;
    pthread_mutex_lock(&cuda_lock);
    int rc = append_locked(r, NULL, GP_CUPTI_NO_SYNC_ID);
    pthread_mutex_unlock(&cuda_lock);
    if (rc < 0)
        atomic_fetch_add(&dropped, 1);
}

void
gp_cupti_store_drop(uint64_t n)
{
    atomic_fetch_add(&dropped, n);
}

int
gp_cupti_store_accepting(void)
{
    return atomic_load(&accepting);
}

/* ---- Session and hand-over ---------------------------------------------- */

static void
forget_records_locked(void)
{
    free(records);
    records = NULL;
    n_records = cap_records = 0;
    free(pending);
    pending = NULL;
    n_pending = cap_pending = 0;
}

void
gp_cupti_store_session_begin(void)
{
    pthread_mutex_lock(&cuda_lock);
    forget_records_locked();
    ev_clear_locked();
    n_ctx = 0;
    pthread_mutex_unlock(&cuda_lock);
    atomic_store(&dropped, 0);
    atomic_store(&accepting, 1);
}

void
gp_cupti_store_after_fork_child(void)
{
    pthread_mutex_init(&cuda_lock, NULL);
    atomic_store(&accepting, 0);
}

void
gp_cupti_store_session_end(void)
{
    atomic_store(&accepting, 0);
    pthread_mutex_lock(&cuda_lock);
    resolve_locked(); /* the event map goes now; untaken records keep their answers */
    free(pending);
    pending = NULL;
    n_pending = cap_pending = 0;
    ev_clear_locked();
    n_ctx = 0;
    pthread_mutex_unlock(&cuda_lock);
}

GpGpuRecord *
gp_cuda_take_records(size_t *n)
{
    pthread_mutex_lock(&cuda_lock);
    resolve_locked();
    GpGpuRecord *out = records;
    size_t count = n_records;
    records = NULL;
    n_records = cap_records = 0;
    pthread_mutex_unlock(&cuda_lock);
    if (count == 0) {
        free(out);
        out = NULL;
    }
    if (n != NULL)
        *n = count;
    return out;
}

uint64_t
gp_cuda_dropped(void)
{
    return atomic_load(&dropped);
}
