/* Per-thread event chunks, the thread registry and the event budget. */
#include "buffer.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

atomic_int gp_buffer_phase = GP_PHASE_OFF;
_Thread_local GpTls gp_buffer_tls __attribute__((tls_model("initial-exec")));
/* Incremented by every session begin; 0 means "never", so a fresh thread's
 * zeroed gp_buffer_tls.session never matches. */
atomic_uint_fast64_t gp_buffer_session = 0;

/* Registry and chunk pool: guarded by registry_lock. The counters read by
 * the footer are atomics so they can be read without the lock. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static GpThreadBuf *registry_head = NULL;    /* registry_lock */
static uint32_t registry_count = 0;          /* registry_lock */
static GpChunk *free_chunks = NULL;          /* registry_lock */
static uint64_t chunks_allocated = 0;        /* registry_lock */
static uint64_t budget_chunks = 0;           /* registry_lock; fixed per session */
static int session_open = 0;                 /* GIL (begin/end run on the interpreter thread) */

/* Chunks are carved from 2 MiB slabs advised as huge pages: recording ten
 * million events then costs a few hundred page faults instead of ~40,000,
 * which on a virtual machine is most of the recording overhead. */
#define SLAB_BYTES (2u << 20)
#define CHUNKS_PER_SLAB (SLAB_BYTES / sizeof(GpChunk))
typedef struct Slab {
    struct Slab *next;
    void *mem;
} Slab;
static Slab *slabs = NULL;                   /* registry_lock */
static char *slab_cursor = NULL;             /* registry_lock: next chunk to carve */
static uint32_t slab_left = 0;               /* registry_lock: chunks left in the slab */

static GpChunk *
carve_chunk_locked(void)
{
    if (slab_left == 0) {
        Slab *s = malloc(sizeof(Slab));
        void *mem = s ? aligned_alloc(SLAB_BYTES, SLAB_BYTES) : NULL;
        if (mem == NULL) {
            free(s);
            return NULL;
        }
#ifdef MADV_HUGEPAGE
        madvise(mem, SLAB_BYTES, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
        s->mem = mem;
        s->next = slabs;
        slabs = s;
        slab_cursor = mem;
        slab_left = CHUNKS_PER_SLAB;
    }
    GpChunk *c = (GpChunk *)slab_cursor;
    slab_cursor += sizeof(GpChunk);
    slab_left--;
    return c;
}

static void
free_slabs_locked(void)
{
    while (slabs) {
        Slab *next = slabs->next;
        free(slabs->mem);
        free(slabs);
        slabs = next;
    }
    slab_cursor = NULL;
    slab_left = 0;
}
static atomic_uint_fast64_t orphan_drops = 0; /* events lost for want of a thread buffer */
#define MAX_IGNORED 16
static uint64_t ignored_idents[MAX_IGNORED]; /* registry_lock; cleared at session end */
static uint32_t n_ignored = 0;               /* registry_lock */

GpStatus
gp_buffer_session_begin(uint64_t max_events)
{
    if (session_open)
        return GP_ERR_STATE;
    if (max_events < GP_CHUNK_EVENTS)
        max_events = GP_CHUNK_EVENTS;
    pthread_mutex_lock(&registry_lock);
    budget_chunks = (max_events + GP_CHUNK_EVENTS - 1) / GP_CHUNK_EVENTS;
    pthread_mutex_unlock(&registry_lock);
    atomic_store(&orphan_drops, 0);
    atomic_fetch_add(&gp_buffer_session, 1);
    session_open = 1;
    return GP_OK;
}

void
gp_buffer_session_end(void)
{
    pthread_mutex_lock(&registry_lock);
    GpThreadBuf *tb = registry_head;
    while (tb) {
        GpThreadBuf *next = tb->next_thread;
        free(tb);
        tb = next;
    }
    registry_head = NULL;
    registry_count = 0;
    free_chunks = NULL; /* chunks live in the slabs */
    free_slabs_locked();
    chunks_allocated = 0;
    n_ignored = 0;
    pthread_mutex_unlock(&registry_lock);
    /* Invalidate every thread's cached pointer without touching their TLS. */
    atomic_fetch_add(&gp_buffer_session, 1);
    session_open = 0;
}

static uint64_t
current_os_tid(void)
{
    return (uint64_t)syscall(SYS_gettid);
}

static GpThreadBuf *
register_locked(uint64_t ident, uint64_t os_tid)
{
    GpThreadBuf *tb = calloc(1, sizeof(*tb));
    if (tb == NULL)
        return NULL;
    tb->ident = ident;
    tb->os_tid = os_tid;
    tb->index = registry_count++;
    atomic_init(&tb->writing, 0);
    /* Append, so registration order is iteration order. */
    GpThreadBuf **link = &registry_head;
    while (*link)
        link = &(*link)->next_thread;
    *link = tb;
    return tb;
}

/* The most recently registered buffer of thread `ident`, or NULL. */
static GpThreadBuf *
find_locked(uint64_t ident)
{
    GpThreadBuf *found = NULL;
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread)
        if (tb->ident == ident)
            found = tb;
    return found;
}

GpThreadBuf *
gp_buffer_thread_slow(void)
{
    uint64_t session = atomic_load(&gp_buffer_session);
    if (gp_buffer_tls.ignore)
        return NULL;
    if (!session_open) {
        atomic_fetch_add(&orphan_drops, 1);
        return NULL;
    }
    uint64_t ident = (uint64_t)pthread_self();
    pthread_mutex_lock(&registry_lock);
    /* pthread ids are reused once a thread exits: only a buffer that the
     * window-start snapshot made for this thread, and that no thread has
     * claimed yet, is this thread's. Otherwise it gets a fresh one. */
    GpThreadBuf *tb = find_locked(ident);
    if (tb == NULL || tb->claimed)
        tb = register_locked(ident, current_os_tid());
    if (tb != NULL) {
        tb->claimed = 1;
        if (tb->os_tid == 0)
            tb->os_tid = current_os_tid();
    }
    pthread_mutex_unlock(&registry_lock);
    if (tb == NULL) {
        atomic_fetch_add(&orphan_drops, 1);
        return NULL;
    }
    gp_buffer_tls.buf = tb;
    gp_buffer_tls.session = session;
    return tb;
}

static int
is_ignored_locked(uint64_t ident)
{
    for (uint32_t i = 0; i < n_ignored; i++)
        if (ignored_idents[i] == ident)
            return 1;
    return 0;
}

void
gp_buffer_ignore_current(void)
{
    uint64_t ident = (uint64_t)pthread_self();
    gp_buffer_tls.ignore = 1;
    pthread_mutex_lock(&registry_lock);
    /* sys.monitoring may have registered this thread already, at the very
     * call that got here: leave that buffer out of the results. */
    GpThreadBuf *tb = find_locked(ident);
    if (tb != NULL && tb->claimed)
        tb->ignored = 1;
    if (n_ignored < MAX_IGNORED && !is_ignored_locked(ident))
        ignored_idents[n_ignored++] = ident;
    pthread_mutex_unlock(&registry_lock);
    gp_buffer_tls.buf = NULL;
}

GpThreadBuf *
gp_buffer_thread_for(uint64_t ident)
{
    pthread_mutex_lock(&registry_lock);
    if (is_ignored_locked(ident)) {
        pthread_mutex_unlock(&registry_lock);
        return NULL;
    }
    /* The snapshot runs with the GIL: `ident` is a live thread, so its
     * newest buffer (claimed or not) is the right one. */
    GpThreadBuf *tb = find_locked(ident);
    if (tb == NULL)
        tb = register_locked(ident, 0); /* os_tid filled in by the thread itself */
    pthread_mutex_unlock(&registry_lock);
    return tb;
}

GpChunk *
gp_buffer_grow(GpThreadBuf *tb, uint64_t ts)
{
    if (tb->dropped) {
        /* Sticky: once a thread drops, it drops until the window is reset, so
         * its event stream is a clean prefix of what happened. */
        tb->dropped++;
        return NULL;
    }
    GpChunk *c = NULL;
    pthread_mutex_lock(&registry_lock);
    if (free_chunks) {
        c = free_chunks;
        free_chunks = c->next;
    } else if (chunks_allocated < budget_chunks) {
        c = carve_chunk_locked();
        if (c)
            chunks_allocated++;
    }
    pthread_mutex_unlock(&registry_lock);
    if (c == NULL) {
        tb->dropped = 1;
        tb->drop_ts = ts;
        return NULL;
    }
    c->next = NULL;
    c->n = 0;
    if (tb->tail)
        tb->tail->next = c;
    else
        tb->head = c;
    tb->tail = c;
    return c;
}

void
gp_buffer_record_api(uint64_t ts, uint32_t correlation, uint32_t api_key, int enter)
{
    GpThreadBuf *tb = gp_buffer_thread();
    if (tb == NULL)
        return;
    /* Dekker-style handshake with gp_buffer_quiesce: publish `writing`, then
     * re-check the phase; the reader sets the phase, then waits for 0. */
    atomic_store(&tb->writing, 1);
    if (atomic_load(&gp_buffer_phase) >= GP_PHASE_WARMUP) {
        uint32_t kind = enter ? GP_EV_MAKE(GP_EV_API_ENTER, api_key) : GP_EV_MAKE(GP_EV_API_EXIT, 0);
        gp_buffer_push(tb, ts, correlation, kind);
    }
    atomic_store(&tb->writing, 0);
}

void
gp_buffer_quiesce(void)
{
    pthread_mutex_lock(&registry_lock);
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread) {
        while (atomic_load(&tb->writing))
            sched_yield();
    }
    pthread_mutex_unlock(&registry_lock);
}

void
gp_buffer_reset(void)
{
    pthread_mutex_lock(&registry_lock);
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread) {
        if (tb->tail) {
            tb->tail->next = free_chunks;
            free_chunks = tb->head;
        }
        tb->head = tb->tail = NULL;
        tb->n_events = 0;
        tb->dropped = 0;
        tb->drop_ts = 0;
    }
    pthread_mutex_unlock(&registry_lock);
    atomic_store(&orphan_drops, 0);
}

GpThreadBuf *
gp_buffer_threads(void)
{
    return registry_head;
}

uint32_t
gp_buffer_thread_count(void)
{
    return registry_count;
}

uint64_t
gp_buffer_dropped(void)
{
    uint64_t total = atomic_load(&orphan_drops);
    pthread_mutex_lock(&registry_lock);
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread)
        total += tb->dropped;
    pthread_mutex_unlock(&registry_lock);
    return total;
}

uint64_t
gp_buffer_events(void)
{
    uint64_t total = 0;
    pthread_mutex_lock(&registry_lock);
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread)
        total += tb->n_events;
    pthread_mutex_unlock(&registry_lock);
    return total;
}

uint64_t
gp_buffer_capacity_events(void)
{
    return budget_chunks * GP_CHUNK_EVENTS;
}

uint64_t
gp_buffer_bytes_held(void)
{
    pthread_mutex_lock(&registry_lock);
    uint64_t slab_count = 0;
    for (Slab *sl = slabs; sl; sl = sl->next)
        slab_count++;
    uint64_t bytes = slab_count * SLAB_BYTES + registry_count * sizeof(GpThreadBuf);
    pthread_mutex_unlock(&registry_lock);
    return bytes;
}

void
gp_buffer_after_fork_child(void)
{
    /* fork() copied the lock in whatever state a parent thread held it. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    registry_lock = fresh;
    atomic_store(&gp_buffer_phase, GP_PHASE_OFF);
    if (session_open)
        gp_buffer_session_end();
}
