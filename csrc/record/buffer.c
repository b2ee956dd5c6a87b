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
_Thread_local GpTls gp_buffer_tls;
/* Incremented by every session begin; 0 means "never", so a fresh thread's
 * zeroed gp_buffer_tls.session never matches. */
atomic_uint_fast64_t gp_buffer_session = 0;

/* Registry, chunk pool and anchors: guarded by registry_lock. The counters
 * read by the footer are atomics so they can be read without the lock. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static GpThreadBuf *registry_head = NULL;    /* registry_lock */
static uint32_t registry_count = 0;          /* registry_lock */
static uint64_t chunks_in_use = 0;           /* registry_lock: held by this session's writers */
static uint64_t budget_chunks = 0;           /* registry_lock; fixed per session */
static int session_open = 0;                 /* begin/end (GIL); cleared under registry_lock */
static GpThreadBuf *spare_bufs = NULL;       /* registry_lock: ended sessions' buffers */

/* The pool: slabs live for the whole process (see buffer.h); free chunks
 * are handed out most recently freed first, so the memory they bring is
 * likely still in the caches and certainly already faulted in. */
#define SLAB_BYTES (2u << 20)
#define CHUNKS_PER_SLAB (SLAB_BYTES / sizeof(GpChunk))
static GpChunk *free_chunks = NULL;          /* registry_lock */
static uint64_t slab_count = 0;              /* registry_lock */
static char *slab_cursor = NULL;             /* registry_lock: next chunk to carve */
static uint32_t slab_left = 0;               /* registry_lock: chunks left in the slab */

/* The current window's clock anchors (clock.h): start, steps, chunk changes.
 * Full: later anchors are skipped (the map stays correct, only coarser). */
static GpClockAnchor *anchors = NULL;        /* registry_lock */
static size_t n_anchors = 0, cap_anchors = 0; /* registry_lock */

/* A slab from mmap. Its pages are faulted in as chunks are first written
 * and stay for the process: later windows and sessions write into memory
 * that is already there. (Huge pages were measured against this on the
 * 2-vCPU VM of docs/benchmarks.md: they cut the faults of a 166 MiB first
 * session from 42,000 to 82 but not its time, 16-300 ms of kernel time
 * against 40-56 ms, the long tail being the kernel compacting memory for
 * them; MADV_POPULATE_WRITE did not help either.) */
static char *
map_slab(void)
{
    void *p = mmap(NULL, SLAB_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static GpChunk *
take_chunk_locked(void)
{
    if (free_chunks) {
        GpChunk *c = free_chunks;
        free_chunks = c->next;
        c->lazy = 0;
        return c;
    }
    if (slab_left == 0) {
        char *mem = map_slab();
        if (mem == NULL)
            return NULL;
        slab_count++;
        slab_cursor = mem;
        slab_left = CHUNKS_PER_SLAB;
    }
    GpChunk *c = (GpChunk *)slab_cursor;
    slab_cursor += sizeof(GpChunk);
    slab_left--;
    c->lazy = 0;
    return c;
}

/* Give a chain of chunks back to the pool; returns how many. */
static uint64_t
free_chain_locked(GpChunk *head)
{
    uint64_t n = 0;
    while (head) {
        GpChunk *next = head->next;
        head->next = free_chunks;
        free_chunks = head;
        head = next;
        n++;
    }
    return n;
}

/* Outside a session, free chunks are only memory kept for the next one:
 * let the kernel take their pages back under memory pressure (MADV_FREE,
 * Linux 4.5+; elsewhere this does nothing). Pages it has not taken back
 * are reused without a fault; the first page of each chunk, which holds
 * the free list's link, is kept. */
static void
lazyfree(GpChunk *c)
{
    for (; c; c = c->next) {
        if (c->lazy)
            continue; /* not written since: marking it again would only cost time */
#ifdef MADV_FREE
        madvise((char *)c + 4096, sizeof(GpChunk) - 4096, MADV_FREE);
#endif
        c->lazy = 1;
    }
}

static void
add_anchor_locked(GpClockAnchor a)
{
    if (n_anchors < cap_anchors)
        anchors[n_anchors++] = a;
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
    uint64_t budget = (max_events + GP_CHUNK_EVENTS - 1) / GP_CHUNK_EVENTS;
    /* One anchor per chunk change, plus the window's start, end and steps
     * (those beyond the room are skipped). */
    size_t cap = (size_t)budget + 4096;
    GpClockAnchor *a = malloc(cap * sizeof(GpClockAnchor));
    if (a == NULL)
        return GP_ERR_NOMEM;
    pthread_mutex_lock(&registry_lock);
    budget_chunks = budget;
    chunks_in_use = 0;
    free(anchors);
    anchors = a;
    cap_anchors = cap;
    n_anchors = 0;
    pthread_mutex_unlock(&registry_lock);
    atomic_store(&orphan_drops, 0);
    atomic_fetch_add(&gp_buffer_session, 1);
    session_open = 1;
    return GP_OK;
}

/* Wait until no buffer has a writer inside a write (gp_buffer_write_begin).
 * registry_lock is held on entry and exit and let go while waiting: a writer
 * may need it to grow its buffer. Buffers are never freed and only session
 * end takes them off the list, so the walk survives the gaps. */
static void
wait_writers_locked(void)
{
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread) {
        while (atomic_load(&tb->writing)) {
            pthread_mutex_unlock(&registry_lock);
            sched_yield();
            pthread_mutex_lock(&registry_lock);
        }
    }
}

void
gp_buffer_session_end(void)
{
    pthread_mutex_lock(&registry_lock);
    /* First the session: from here no thread registers, and no writer starts
     * a write with a buffer of this session (gp_buffer_write_begin re-reads
     * the number); then the writes that began before it. */
    session_open = 0;
    atomic_fetch_add(&gp_buffer_session, 1);
    wait_writers_locked();
    GpThreadBuf *tb = registry_head;
    while (tb) {
        GpThreadBuf *next = tb->next_thread;
        free_chain_locked(tb->head);
        tb->next_thread = spare_bufs;
        spare_bufs = tb;
        tb = next;
    }
    registry_head = NULL;
    registry_count = 0;
    chunks_in_use = 0;
    n_ignored = 0;
    free(anchors);
    anchors = NULL;
    n_anchors = cap_anchors = 0;
    lazyfree(free_chunks);
    pthread_mutex_unlock(&registry_lock);
}

static uint64_t
current_os_tid(void)
{
    return (uint64_t)syscall(SYS_gettid);
}

static GpThreadBuf *
register_locked(uint64_t ident, uint64_t os_tid)
{
    GpThreadBuf *tb = spare_bufs;
    if (tb != NULL) {
        /* Cleared but for `writing`, which a late writer of its last session
         * may still move (buffer.h). */
        spare_bufs = tb->next_thread;
        size_t at = offsetof(GpThreadBuf, writing), past = at + sizeof(tb->writing);
        memset(tb, 0, at);
        memset((char *)tb + past, 0, sizeof(*tb) - past);
    } else {
        tb = calloc(1, sizeof(*tb));
        if (tb == NULL)
            return NULL;
        atomic_init(&tb->writing, 0);
    }
    tb->ident = ident;
    tb->os_tid = os_tid;
    tb->index = registry_count++;
    tb->seq_last = GP_SEQ_UNSET;
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

static int is_ignored_locked(uint64_t ident);

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
    if (!session_open) { /* it ended since the look above */
        pthread_mutex_unlock(&registry_lock);
        atomic_fetch_add(&orphan_drops, 1);
        return NULL;
    }
    /* pthread ids are reused once a thread exits: only a buffer that the
     * window-start snapshot made for this thread, and that no thread has
     * claimed yet, is this thread's. Otherwise it gets a fresh one. */
    GpThreadBuf *tb = find_locked(ident);
    if (tb == NULL || tb->claimed)
        tb = register_locked(ident, current_os_tid());
    if (tb != NULL) {
        tb->claimed = 1;
        if (is_ignored_locked(ident)) /* gp_buffer_ignore_thread: recorded, left out */
            tb->ignored = 1;
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

/* A thread that left itself out (gp_buffer_ignore_current) takes its ident
 * off the list when it ends: pthread idents are reused, and a thread started
 * later with the same ident is the user's (the on-demand thread of an armed
 * process, which ends at disarm(), left the next profiles' new threads out). */
static pthread_key_t ignore_key;
static pthread_once_t ignore_key_once = PTHREAD_ONCE_INIT;

static void
unignore_at_exit(void *unused)
{
    (void)unused;
    uint64_t ident = (uint64_t)pthread_self();
    pthread_mutex_lock(&registry_lock);
    for (uint32_t i = 0; i < n_ignored; i++) {
        if (ignored_idents[i] == ident) {
            ignored_idents[i] = ignored_idents[--n_ignored];
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

static void
make_ignore_key(void)
{
    (void)pthread_key_create(&ignore_key, unignore_at_exit);
}

void
gp_buffer_ignore_current(void)
{
    uint64_t ident = (uint64_t)pthread_self();
    gp_buffer_tls.ignore = 1;
    pthread_once(&ignore_key_once, make_ignore_key);
    (void)pthread_setspecific(ignore_key, (void *)1); /* non-NULL: the destructor runs */
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

void
gp_buffer_ignore_thread(uint64_t ident)
{
    pthread_mutex_lock(&registry_lock);
    GpThreadBuf *tb = find_locked(ident);
    if (tb != NULL)
        tb->ignored = 1;
    if (n_ignored < MAX_IGNORED && !is_ignored_locked(ident))
        ignored_idents[n_ignored++] = ident;
    pthread_mutex_unlock(&registry_lock);
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

GpEvent *
gp_buffer_grow(GpThreadBuf *tb, uint64_t ts)
{
    if (tb->dropped) {
        /* Sticky: once a thread drops, it drops until the window is reset, so
         * its event stream is a clean prefix of what happened. */
        tb->dropped++;
        return NULL;
    }
    if (tb->tail)
        tb->tail->n = GP_CHUNK_EVENTS; /* full: the cursor reached its end */
    /* The anchor is read outside the lock: another thread may be waiting. */
    GpClockAnchor anchor = gp_clock_anchor();
    GpChunk *c = NULL;
    pthread_mutex_lock(&registry_lock);
    if (chunks_in_use < budget_chunks) {
        c = take_chunk_locked();
        if (c) {
            chunks_in_use++;
            add_anchor_locked(anchor);
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (c == NULL) {
        tb->dropped = 1;
        tb->drop_ts = ts;
        tb->cur = tb->end; /* every later push comes here and counts a drop */
        return NULL;
    }
    c->next = NULL;
    c->n = 0;
    if (tb->tail)
        tb->tail->next = c;
    else
        tb->head = c;
    tb->tail = c;
    tb->cur = c->ev;
    tb->end = c->ev + GP_CHUNK_EVENTS;
    return c->ev;
}

void
gp_buffer_record_api(uint64_t ts, uint32_t correlation, uint32_t api_key, int enter)
{
    GpThreadBuf *tb = gp_buffer_write_begin();
    if (tb == NULL)
        return;
    uint32_t kind = enter ? GP_EV_MAKE(GP_EV_API_ENTER, api_key) : GP_EV_MAKE(GP_EV_API_EXIT, 0);
    gp_buffer_push(tb, ts, correlation, kind);
    gp_buffer_write_end(tb);
}

void
gp_buffer_quiesce(void)
{
    pthread_mutex_lock(&registry_lock);
    wait_writers_locked();
    pthread_mutex_unlock(&registry_lock);
}

GpClockAnchor
gp_buffer_anchor(void)
{
    GpClockAnchor a = gp_clock_anchor();
    pthread_mutex_lock(&registry_lock);
    add_anchor_locked(a);
    pthread_mutex_unlock(&registry_lock);
    return a;
}

/* Events written into a thread's tail chunk (the cursor is past the last). */
static uint32_t
tail_count(const GpThreadBuf *tb)
{
    if (tb->tail == NULL)
        return 0;
    if (tb->cur == NULL || tb->cur < tb->tail->ev || tb->cur > tb->tail->ev + GP_CHUNK_EVENTS)
        return tb->tail->n;
    return (uint32_t)(tb->cur - tb->tail->ev);
}

/* Empty a thread's buffer for the next window (its chunks moved or freed). */
static void
clear_thread_locked(GpThreadBuf *tb)
{
    tb->head = tb->tail = NULL;
    tb->cur = tb->end = NULL;
    tb->step_begin = NULL; /* its chunk has gone with the window */
    tb->step_min = 0;
    tb->snap_cur = NULL;
    tb->seq_last = GP_SEQ_UNSET; /* the next window reads it afresh */
    tb->dropped = 0;
    tb->drop_ts = 0;
}

GpStatus
gp_buffer_take_window(GpWindowEvents *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_lock(&registry_lock);
    GpWindowThread *threads = calloc(registry_count + 1, sizeof(GpWindowThread));
    GpClockAnchor *a = malloc((n_anchors + 1) * sizeof(GpClockAnchor));
    if (threads == NULL || a == NULL) {
        free(threads);
        free(a);
        for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread) {
            chunks_in_use -= free_chain_locked(tb->head);
            clear_thread_locked(tb);
        }
        n_anchors = 0;
        pthread_mutex_unlock(&registry_lock);
        return GP_ERR_NOMEM;
    }
    uint32_t i = 0;
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread, i++) {
        GpWindowThread *t = &threads[i];
        if (tb->tail)
            tb->tail->n = tail_count(tb);
        t->ident = tb->ident;
        t->os_tid = tb->os_tid;
        t->index = tb->index;
        t->ignored = tb->ignored;
        t->head = tb->head;
        t->dropped = tb->dropped;
        t->drop_ts = tb->drop_ts;
        for (const GpChunk *c = tb->head; c; c = c->next) {
            t->n_events += c->n;
            w->chunks++;
        }
        clear_thread_locked(tb);
    }
    chunks_in_use -= w->chunks < chunks_in_use ? w->chunks : chunks_in_use;
    memcpy(a, anchors, n_anchors * sizeof(GpClockAnchor));
    w->threads = threads;
    w->n_threads = i;
    w->anchors = a;
    w->n_anchors = n_anchors;
    n_anchors = 0;
    pthread_mutex_unlock(&registry_lock);
    atomic_store(&orphan_drops, 0);
    return GP_OK;
}

void
gp_buffer_release_window(GpWindowEvents *w)
{
    if (w->threads) {
        if (!session_open) /* GIL: kept windows are released from Python */
            for (uint32_t i = 0; i < w->n_threads; i++)
                lazyfree(w->threads[i].head);
        pthread_mutex_lock(&registry_lock);
        for (uint32_t i = 0; i < w->n_threads; i++)
            free_chain_locked(w->threads[i].head);
        pthread_mutex_unlock(&registry_lock);
    }
    free(w->threads);
    free(w->anchors);
    memset(w, 0, sizeof(*w));
}

void
gp_buffer_reset(void)
{
    pthread_mutex_lock(&registry_lock);
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread) {
        chunks_in_use -= free_chain_locked(tb->head);
        clear_thread_locked(tb);
    }
    n_anchors = 0;
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
        for (const GpChunk *c = tb->head; c; c = c->next)
            total += c == tb->tail ? tail_count(tb) : c->n;
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
    /* The writers fork() caught inside a write did not come along. */
    for (GpThreadBuf *tb = registry_head; tb; tb = tb->next_thread)
        atomic_store(&tb->writing, 0);
    for (GpThreadBuf *tb = spare_bufs; tb; tb = tb->next_thread)
        atomic_store(&tb->writing, 0);
    if (session_open)
        gp_buffer_session_end();
}
