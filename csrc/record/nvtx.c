/* NVTX ranges in and out, and the switch for capture ranges.
 *
 * In: this extension is itself an NVTX injection library. NVTX (the
 * header-only nvtx3 that PyTorch, CuPy and the `nvtx` package compile in, and
 * the older libnvToolsExt) reads NVTX_INJECTION64_PATH at its first call,
 * dlopens that file and calls its InitializeInjectionNvtx2 with a getter for
 * the client's export tables; the injection writes its own functions into
 * the client's function-pointer slots. python/gpuprof/_nvtx.py points the
 * variable at this extension when it is unset. Each NVTX client (every
 * library that compiled nvtx3 in) attaches separately, so the initializer
 * runs once per client. Chosen over CUPTI's NVTX callback domain because it
 * works without CUPTI and without a GPU, keeps working in activity-only mode
 * (another CUPTI subscriber), and is testable on any machine.
 *
 * Pushes, pops, starts and ends become GP_EV_NVTX_* events in the calling
 * thread's buffer while a window records; messages (ASCII, Unicode,
 * registered) are interned here, in C, under nv_lock, because NVTX calls
 * come on any thread, with or without the GIL.
 *
 * Out (nvtx_out.c): a minimal NVTX client. When NVTX_INJECTION64_PATH names another tool
 * (Nsight Systems), gpuprof attaches to it like any NVTX client and pushes
 * its record_function labels and ProfilerStep#N there. When the injection is
 * gpuprof itself nothing is emitted, so gpuprof's own ranges never come back
 * in as NVTX input.
 *
 * Capture: profile(capture="nvtx:NAME") opens the window at the push (or
 * start) of a range named NAME and closes it at its pop (or end), through a
 * handler the profiler registers (gp_nvtx_capture_handler); the CUPTI side
 * calls the same notifier for cudaProfilerStart/Stop.
 *
 * No Python API here (docs/development.md, "C headers"). Every build
 * compiles this file: it needs no CUDA header.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NOLOAD, clock_gettime */
#endif

#include "nvtx.h"

#include "nvtx_abi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "buffer.h"
#include "clock.h"
#include "strtab.h"

/* ---- Domains, registered strings, names ---------------------------------- */

#define DOMAIN_MAGIC 0x6770444du /* "gpDM" */
#define STRING_MAGIC 0x67705354u /* "gpST" */
#define MAX_NAMES 65536u         /* distinct (domain, category, message) per session */
#define MAX_DOMAINS 4096u
#define TEXT_MAX 1024            /* bytes kept of one message */

typedef struct Category {
    uint32_t id;
    char *name;
    struct Category *next;
} Category;

/* A domain handle handed to the program. Never freed (handles may be used
 * after nvtxDomainDestroy by buggy programs, and there are few). Fields:
 * written once under nv_lock before the handle is published, except `cats`
 * (nv_lock). */
typedef struct GpNvtxDomain {
    uint32_t magic;
    uint32_t index; /* 0: the default domain */
    char *name;     /* "" for the default domain */
    Category *cats;
} GpNvtxDomain;

/* A registered string handle. Never freed, like domains. `cache` holds
 * (names generation << 32 | name id) of its category-0 name. */
typedef struct GpNvtxString {
    uint32_t magic;
    GpNvtxDomain *domain;
    char *text;
    atomic_uint_fast64_t cache;
} GpNvtxString;

/* Everything below up to the next section: nv_lock. */
static pthread_mutex_t nv_lock = PTHREAD_MUTEX_INITIALIZER;
static GpNvtxDomain default_domain = {DOMAIN_MAGIC, 0, "", NULL};
static GpNvtxDomain **domains;  /* by index; [0] = &default_domain */
static uint32_t n_domains, cap_domains;
static GpStrTab names;          /* key: domain << 32 | category */
static uint64_t names_dropped;  /* messages past MAX_NAMES (named by overflow_id) */
static uint32_t overflow_id;
static uint32_t shaped_names;   /* names with an op's input sizes (GP_NVTX_SHAPES_SEP) */
/* Bumped by gp_nvtx_clear; read without the lock by registered strings. */
static atomic_uint names_gen = 1;

/* Clients attached to us (InitializeInjectionNvtx2 calls that succeeded). */
static atomic_int clients;
/* Ends recorded on another thread than their start (aggregation). */
static atomic_uint_fast64_t cross_ends;
/* Range ids handed out by nvtxRangeStart* (low 24 bits: the tag in events). */
static atomic_uint_fast64_t next_range = 1;

/* Name id of (domain, category, text[0..len)), added on first sight; 0 when
 * out of memory. Any thread. */
static uint32_t
intern(uint32_t domain, uint32_t category, const char *text, size_t len)
{
    uint64_t key = (uint64_t)domain << 32 | category;
    uint64_t h = gp_strtab_hash(key, text, len);
    pthread_mutex_lock(&nv_lock);
    uint32_t id = gp_strtab_find(&names, key, text, len, h);
    if (id != 0)
        goto done;
    if (names.n >= MAX_NAMES) {
        names_dropped++;
        if (overflow_id == 0) {
            static const char full[] = "<nvtx: too many distinct range names>";
            /* hash 0, which no lookup computes: never found, only named */
            overflow_id = gp_strtab_add(&names, 0, full, sizeof full - 1, 0);
        }
        id = overflow_id;
        goto done;
    }
    id = gp_strtab_add(&names, key, text, len, h);
    if (id != 0 && memchr(text, GP_NVTX_SHAPES_SEP, len) != NULL)
        shaped_names++;
done:
    pthread_mutex_unlock(&nv_lock);
    return id;
}

/* UTF-8 of a wide (UTF-32 on Linux) string into buf; returns its length. */
static size_t
wide_to_utf8(const wchar_t *w, char *buf, size_t cap)
{
    size_t n = 0;
    for (; w != NULL && *w; w++) {
        uint32_t c = (uint32_t)*w;
        char tmp[4];
        size_t k;
        if (c < 0x80) {
            tmp[0] = (char)c;
            k = 1;
        } else if (c < 0x800) {
            tmp[0] = (char)(0xc0 | (c >> 6));
            tmp[1] = (char)(0x80 | (c & 0x3f));
            k = 2;
        } else if (c < 0x10000) {
            if (c >= 0xd800 && c < 0xe000)
                c = 0xfffd; /* a lone surrogate is not a character */
            tmp[0] = (char)(0xe0 | (c >> 12));
            tmp[1] = (char)(0x80 | ((c >> 6) & 0x3f));
            tmp[2] = (char)(0x80 | (c & 0x3f));
            k = 3;
        } else if (c < 0x110000) {
            tmp[0] = (char)(0xf0 | (c >> 18));
            tmp[1] = (char)(0x80 | ((c >> 12) & 0x3f));
            tmp[2] = (char)(0x80 | ((c >> 6) & 0x3f));
            tmp[3] = (char)(0x80 | (c & 0x3f));
            k = 4;
        } else {
            tmp[0] = '?';
            k = 1;
        }
        if (n + k >= cap)
            break;
        memcpy(buf + n, tmp, k);
        n += k;
    }
    buf[n] = '\0';
    return n;
}

static char *
dup_utf8(const char *s, const wchar_t *w)
{
    if (w != NULL) {
        char buf[TEXT_MAX];
        size_t n = wide_to_utf8(w, buf, sizeof buf);
        return strndup(buf, n);
    }
    return strdup(s ? s : "");
}

static GpNvtxDomain *
as_domain(const void *handle)
{
    const GpNvtxDomain *d = handle;
    if (d == NULL || d->magic != DOMAIN_MAGIC)
        return &default_domain;
    return (GpNvtxDomain *)d;
}

static GpNvtxDomain *
domain_create(const char *name, const wchar_t *wname)
{
    char *utf8 = dup_utf8(name, wname);
    if (utf8 == NULL)
        return NULL;
    GpNvtxDomain *d = NULL;
    pthread_mutex_lock(&nv_lock);
    /* The same name gives the same handle, as NVTX tools do. */
    for (uint32_t i = 1; i < n_domains; i++) {
        if (strcmp(domains[i]->name, utf8) == 0) {
            d = domains[i];
            goto done;
        }
    }
    if (n_domains == 0) {
        if ((domains = malloc(16 * sizeof(*domains))) == NULL)
            goto done;
        cap_domains = 16;
        domains[n_domains++] = &default_domain;
    }
    if (n_domains >= MAX_DOMAINS)
        goto done;
    if (n_domains == cap_domains) {
        GpNvtxDomain **p = realloc(domains, cap_domains * 2 * sizeof(*domains));
        if (p == NULL)
            goto done;
        domains = p;
        cap_domains *= 2;
    }
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        goto done;
    d->magic = DOMAIN_MAGIC;
    d->index = n_domains;
    d->name = utf8;
    utf8 = NULL;
    domains[n_domains++] = d;
done:
    pthread_mutex_unlock(&nv_lock);
    free(utf8);
    return d;
}

static void
name_category(GpNvtxDomain *d, uint32_t id, const char *name, const wchar_t *wname)
{
    char *utf8 = dup_utf8(name, wname);
    if (utf8 == NULL)
        return;
    pthread_mutex_lock(&nv_lock);
    Category *c = d->cats;
    while (c != NULL && c->id != id)
        c = c->next;
    if (c == NULL && (c = calloc(1, sizeof(*c))) != NULL) {
        c->id = id;
        c->next = d->cats;
        d->cats = c;
    }
    if (c != NULL) {
        free(c->name);
        c->name = utf8;
        utf8 = NULL;
    }
    pthread_mutex_unlock(&nv_lock);
    free(utf8);
}

static const void *
register_string(GpNvtxDomain *d, const char *s, const wchar_t *w)
{
    GpNvtxString *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->text = dup_utf8(s, w);
    if (r->text == NULL) {
        free(r);
        return NULL;
    }
    r->magic = STRING_MAGIC;
    r->domain = d;
    return r;
}

/* ---- Recording ------------------------------------------------------------- */

/* Whether a window records now (WARMUP or ACTIVE). */
GP_INLINE int
recording(void)
{
    return atomic_load_explicit(&gp_buffer_phase, memory_order_relaxed) >= GP_PHASE_WARMUP;
}

/* One event into the calling thread's buffer (gp_buffer_write_begin). */
static void
record(uint32_t arg, uint32_t kind)
{
    GpThreadBuf *tb = gp_buffer_write_begin();
    if (tb == NULL)
        return;
    gp_buffer_push(tb, gp_clock_raw(), arg, kind);
    gp_buffer_write_end(tb);
}

/* Two events in a row under one write, so that a window opening between them
 * cannot keep the second without the first. */
static void
record2(uint32_t arg, uint32_t kind, uint32_t arg2, uint32_t kind2)
{
    GpThreadBuf *tb = gp_buffer_write_begin();
    if (tb == NULL)
        return;
    uint64_t ts = gp_clock_raw();
    gp_buffer_push(tb, ts, arg, kind);
    gp_buffer_push(tb, ts, arg2, kind2);
    gp_buffer_write_end(tb);
}

/* The message of an event: UTF-8 text and length (buf holds converted
 * Unicode), or the registered string behind it (*reg). */
typedef struct Message {
    const char *text;
    size_t len;
    const GpNvtxString *reg;
    uint32_t category;
    int truncated; /* text was cut at TEXT_MAX */
} Message;

static void
message_of(const NvAttr *a, const char *ascii, const wchar_t *wide, char *buf, Message *m)
{
    m->reg = NULL;
    m->category = 0;
    m->truncated = 0;
    if (a != NULL) {
        ascii = NULL;
        wide = NULL;
        /* Older clients pass a shorter struct: read only what it has. */
        if (a->size >= offsetof(NvAttr, category) + sizeof(a->category))
            m->category = a->category;
        if (a->size >= sizeof(NvAttr)) {
            switch (a->message_type) {
            case NV_MSG_ASCII:
                ascii = a->message.ascii;
                break;
            case NV_MSG_UNICODE:
                wide = a->message.unicode;
                break;
            case NV_MSG_REGISTERED: {
                const GpNvtxString *r = a->message.registered;
                if (r != NULL && r->magic == STRING_MAGIC) {
                    m->reg = r;
                    ascii = r->text;
                }
                break;
            }
            default:
                break;
            }
        }
    }
    if (wide != NULL) {
        m->len = wide_to_utf8(wide, buf, TEXT_MAX);
        m->text = buf;
        m->truncated = m->len + 4 >= TEXT_MAX; /* may have been cut */
    } else {
        m->text = ascii ? ascii : "";
        m->len = strnlen(m->text, TEXT_MAX - 1);
        m->truncated = m->len == TEXT_MAX - 1 && m->text[m->len] != '\0';
    }
}

/* ---- PyTorch's range messages ----------------------------------------------
 *
 * PyTorch's RecordFunction callbacks for NVTX (emit_nvtx(), and the autograd
 * node ranges python/gpuprof/_autograd.py switches on) write each range as
 *   NAME[, seq = N][, op_id = H][, sizes = [...]][, input_op_ids = [...]]
 * (torch/csrc/profiler/util.cpp getNvtxStr; its docs spell backward ranges
 * "stashed seq", so both are taken). op_id is unique per call: interned
 * whole, every range would be a one-call row and a long run would fill the
 * name table. So NAME alone is the range's name, and its seq travels in a
 * GP_EV_NVTX_TORCH event right after the push. The engine's wrapper around
 * each node, "autograd::engine::evaluate_function: NAME, op_id = M" (all
 * scopes only), is named NAME too and flagged, so the replay merges the
 * node's own range into it (replay.c). This runs on autograd's thread for
 * every node: one memchr per comma and a scan of the fields, no allocation. */

#define ENGINE_PREFIX "autograd::engine::evaluate_function: "

/* Skip the literal s at *p; 1 when it was there. */
static int
lit(const char **p, const char *end, const char *s, size_t n)
{
    if ((size_t)(end - *p) < n || memcmp(*p, s, n) != 0)
        return 0;
    *p += n;
    return 1;
}

/* " = " with any spaces around the '=' ("seq=" in the docs, "seq = " in the code). */
static int
equals(const char **p, const char *end)
{
    while (*p < end && **p == ' ')
        (*p)++;
    if (*p == end || **p != '=')
        return 0;
    (*p)++;
    while (*p < end && **p == ' ')
        (*p)++;
    return 1;
}

static int
number(const char **p, const char *end, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    while (*p < end && **p >= '0' && **p <= '9')
        x = x * 10 + (uint64_t)(*(*p)++ - '0');
    *v = x;
    return *p > s;
}

/* A bracketed list ("[[64, 256], []]", "[(12,0), (13,0)]") up to its closing
 * bracket. A message cut at TEXT_MAX may end inside it. */
static int
bracketed(const char **p, const char *end, int truncated)
{
    if (*p == end || **p != '[')
        return 0;
    int depth = 0;
    for (; *p < end; (*p)++) {
        char c = **p;
        if (c == '[' || c == '(')
            depth++;
        else if ((c == ']' || c == ')') && --depth == 0) {
            (*p)++;
            return 1;
        }
    }
    return truncated;
}

/* Whether [p, end) is a run of PyTorch's fields, each ", KEY = VALUE", in
 * their order, at least one; the seq, if any, into *seq. In a message cut at
 * TEXT_MAX the fields after the first may stop anywhere. */
static int
torch_fields(const char *p, const char *end, int truncated, int *has_seq, uint64_t *seq,
             const char **sizes, size_t *sizes_len)
{
    int stage = 0, fields = 0, ok = 1;
    uint64_t v;
    *sizes = NULL;
    while (ok && p < end) {
        if (!lit(&p, end, ", ", 2)) {
            ok = 0;
        } else if (stage == 0 && (lit(&p, end, "seq", 3) || lit(&p, end, "stashed seq", 11))) {
            ok = equals(&p, end) && number(&p, end, seq);
            *has_seq = ok;
            stage = 1;
        } else if (stage <= 1 && lit(&p, end, "op_id", 5)) {
            ok = equals(&p, end) && number(&p, end, &v);
            stage = 2;
        } else if (stage <= 2 && lit(&p, end, "sizes", 5)) {
            ok = equals(&p, end);
            const char *list = p;
            if (ok && bracketed(&p, end, 0)) {
                *sizes = list;
                *sizes_len = (size_t)(p - list);
            } else if (ok) {
                p = list; /* cut at TEXT_MAX: no sizes */
                ok = bracketed(&p, end, truncated);
            }
            stage = 3;
        } else if (stage <= 3 && lit(&p, end, "input_op_ids", 12)) {
            ok = equals(&p, end) && bracketed(&p, end, truncated);
            stage = 4;
        } else {
            ok = 0;
        }
        fields += ok;
    }
    return ok ? fields > 0 : truncated && fields > 0;
}

/* Whether a name is an autograd node's: generated nodes end in Backward<N>,
 * custom Functions in Backward, torch.compile's is CompiledFunctionBackward,
 * and the C++ ones live in torch::autograd:: (AccumulateGrad, CopySlices,
 * CppNode<T>, GraphRoot). ATen ops (aten::addmm, aten::convolution_backward)
 * are not. */
static int
autograd_name(const char *s, size_t n)
{
    static const char ns[] = "torch::autograd::", acc[] = "AccumulateGrad";
    if (n >= sizeof ns - 1 && memcmp(s, ns, sizeof ns - 1) == 0)
        return 1;
    if (n == sizeof acc - 1 && memcmp(s, acc, n) == 0)
        return 1; /* as some PyTorch versions and docs spell it */
    for (const char *b = s, *end = s + n; (b = memchr(b, 'B', (size_t)(end - b))) != NULL; b++)
        if ((size_t)(end - b) >= 8 && memcmp(b, "Backward", 8) == 0)
            return 1;
    return 0;
}

int
gp_nvtx_torch_parse(const char *text, size_t len, int truncated, GpNvtxTorchName *out)
{
    const char *end = text + len, *c = text;
    int has_seq = 0;
    uint64_t seq = 0;
    out->name = text;
    out->len = len;
    out->flags = 0;
    out->seq = 0;
    out->sizes = NULL;
    out->sizes_len = 0;
    const char *sizes = NULL;
    size_t sizes_len = 0;
    /* NAME ends at the first comma that starts the fields (a C++ node's name
     * may hold commas: CppNode<F<A, B>>) */
    for (;; c++) {
        if ((c = memchr(c, ',', (size_t)(end - c))) == NULL)
            return 0;
        has_seq = 0;
        if (c > text && torch_fields(c, end, truncated, &has_seq, &seq, &sizes, &sizes_len))
            break;
    }
    const char *name = text;
    size_t n = (size_t)(c - text);
    uint32_t flags = has_seq ? GP_NVTXT_SEQ : 0;
    if (n > sizeof ENGINE_PREFIX - 1 &&
        memcmp(name, ENGINE_PREFIX, sizeof ENGINE_PREFIX - 1) == 0) {
        name += sizeof ENGINE_PREFIX - 1;
        n -= sizeof ENGINE_PREFIX - 1;
        flags |= GP_NVTXT_ENGINE | GP_NVTXT_AUTOGRAD;
    } else if (autograd_name(name, n)) {
        flags |= GP_NVTXT_AUTOGRAD;
    }
    out->name = name;
    out->len = n;
    out->flags = flags;
    out->seq = has_seq ? seq : 0;
    out->sizes = sizes;
    out->sizes_len = sizes ? sizes_len : 0;
    return 1;
}

/* NAME, the separator and the sizes of a message with input sizes. */
static _Thread_local char tls_shaped[TEXT_MAX];

/* The message's name as tables show it: PyTorch's NAME (m->text and m->len
 * then point into the text), or the whole text. An op's input sizes
 * (record_shapes) stay in the name after GP_NVTX_SHAPES_SEP: an op called
 * with other shapes is another name, so its calls are their own rows, and a
 * training loop's shapes are a few per op (a name table that fills up names
 * the rest "<nvtx: too many ...>", counted in cuda_status()). *arg and *kind get the
 * GP_EV_NVTX_TORCH event to write right after the range's own (*kind 0: none). */
static void
torch_name(Message *m, uint32_t *arg, uint32_t *kind)
{
    GpNvtxTorchName t;
    *kind = 0;
    if (m->len < 8 || !gp_nvtx_torch_parse(m->text, m->len, m->truncated, &t))
        return;
    /* A registered string keeps its id cache: the same text always parses
     * to the same name. */
    m->text = t.name;
    m->len = t.len;
    /* (not an autograd node's: the engine's wrapper and the node's own range
     * must keep one name to merge) */
    if (t.sizes != NULL && t.sizes_len > 2 && !(t.flags & GP_NVTXT_AUTOGRAD) &&
        t.len + 1 + t.sizes_len < TEXT_MAX) {
        memcpy(tls_shaped, t.name, t.len);
        tls_shaped[t.len] = GP_NVTX_SHAPES_SEP;
        memcpy(tls_shaped + t.len + 1, t.sizes, t.sizes_len);
        m->text = tls_shaped;
        m->len = t.len + 1 + t.sizes_len;
    }
    if (t.flags != 0) {
        *arg = (uint32_t)(t.seq & 0x7fffffffu);
        *kind = GP_EV_MAKE(GP_EV_NVTX_TORCH, t.flags);
    }
}

/* Per-thread cache of recent names, so that a loop pushing the same few
 * messages skips nv_lock: (generation, domain, category, text) -> id. Two
 * ways per set, 16 sets picked by the length and the ends of the text: an
 * autograd backward cycles through a dozen or more node names, which a
 * round-robin list of 4 missed on every push. */
#define CACHE_TEXT 48
#define CACHE_SETS 16
typedef struct CacheEntry {
    uint32_t gen, domain, category, id;
    uint32_t len;
    char text[CACHE_TEXT];
} CacheEntry;
static _Thread_local CacheEntry tls_cache[CACHE_SETS][2];
static _Thread_local uint8_t tls_cache_older[CACHE_SETS]; /* the way to replace next */

static uint32_t
intern_cached(uint32_t domain, uint32_t category, const char *text, size_t len)
{
    uint32_t gen = atomic_load_explicit(&names_gen, memory_order_relaxed);
    if (len == 0 || len >= CACHE_TEXT)
        return intern(domain, category, text, len);
    unsigned set = ((unsigned)len * 7u + (unsigned char)text[0] +
                    (unsigned char)text[len - 1] * 3u + (unsigned char)text[len / 2]) %
                   CACHE_SETS;
    CacheEntry *ways = tls_cache[set];
    for (unsigned w = 0; w < 2; w++) {
        const CacheEntry *c = &ways[w];
        if (c->id != 0 && c->gen == gen && c->len == len && c->domain == domain &&
            c->category == category && memcmp(c->text, text, len) == 0) {
            tls_cache_older[set] = (uint8_t)(w ^ 1u);
            return c->id;
        }
    }
    uint32_t id = intern(domain, category, text, len);
    if (id != 0) {
        unsigned w = tls_cache_older[set];
        CacheEntry *c = &ways[w];
        *c = (CacheEntry){gen, domain, category, id, (uint32_t)len, {0}};
        memcpy(c->text, text, len);
        tls_cache_older[set] = (uint8_t)(w ^ 1u);
    }
    return id;
}

static uint32_t
name_id(const GpNvtxDomain *d, const Message *m)
{
    if (m->reg != NULL && m->category == 0) {
        GpNvtxString *r = (GpNvtxString *)m->reg;
        uint64_t c = atomic_load_explicit(&r->cache, memory_order_relaxed);
        uint32_t gen = atomic_load_explicit(&names_gen, memory_order_relaxed);
        if ((uint32_t)(c >> 32) == gen && (uint32_t)c != 0)
            return (uint32_t)c;
        uint32_t id = intern(d->index, 0, m->text, m->len);
        if (id != 0)
            atomic_store_explicit(&r->cache, (uint64_t)gen << 32 | id, memory_order_relaxed);
        return id;
    }
    return intern_cached(d->index, m->category, m->text, m->len);
}

uint32_t
gp_nvtx_intern_default(const char *text, size_t len)
{
    Message m = {text, len, NULL, 0, 0};
    uint32_t arg = 0, kind;
    torch_name(&m, &arg, &kind);
    return name_id(&default_domain, &m);
}

/* ---- Per-thread push depth (NVTX return values, capture pops) ------------- */

typedef struct DepthSlot {
    const GpNvtxDomain *domain;
    int32_t depth;
} DepthSlot;

static _Thread_local DepthSlot tls_depth[8];
static _Thread_local int32_t tls_depth_spill; /* domains past the 8 slots share one */

static int32_t *
depth_of(const GpNvtxDomain *d)
{
    for (size_t i = 0; i < GP_ARRAY_LEN(tls_depth); i++) {
        if (tls_depth[i].domain == d)
            return &tls_depth[i].depth;
        if (tls_depth[i].domain == NULL) {
            tls_depth[i].domain = d;
            return &tls_depth[i].depth;
        }
    }
    return &tls_depth_spill;
}

/* ---- Capture by NVTX range name ---------------------------------------------- */

/* The handler the profiler registered (any thread calls it, no GIL). */
static _Atomic(GpNvtxCaptureFn) capture_fn;
/* Armed by gp_nvtx_capture_set (GIL, before the hook goes on); the name and
 * domain are written only while disarmed. */
static atomic_int cap_armed;
static char cap_name[256];
static char cap_domain[256];
static atomic_uint cap_gen;            /* bumped at every arming */
static atomic_int cap_open;            /* a capture range is open */
static atomic_uint_fast64_t cap_range; /* nvtxRangeStart id of the open capture range, 0 none */
static atomic_uint_fast64_t cap_thread;   /* pthread_self() of the capture push */
static atomic_uint cap_label;             /* name id of the capture range, 0 unknown */
static atomic_uint cap_label_domain;
static _Thread_local const GpNvtxDomain *tls_cap_domain;
static _Thread_local int32_t tls_cap_level; /* depth + 1 of this thread's capture push */
static _Thread_local unsigned tls_cap_gen;

void
gp_nvtx_capture_handler(GpNvtxCaptureFn fn)
{
    atomic_store(&capture_fn, fn);
}

void
gp_nvtx_capture_notify(int open)
{
    GpNvtxCaptureFn fn = atomic_load(&capture_fn);
    if (fn != NULL)
        fn(open);
}

GpStatus
gp_nvtx_capture_set(const char *name, const char *domain)
{
    atomic_store(&cap_armed, 0);
    atomic_store(&cap_open, 0);
    atomic_store(&cap_range, 0);
    atomic_store(&cap_label, 0);
    if (name == NULL)
        return GP_OK;
    if (strlen(name) >= sizeof cap_name || (domain && strlen(domain) >= sizeof cap_domain))
        return GP_ERR_VALUE;
    strcpy(cap_name, name);
    strcpy(cap_domain, domain ? domain : "");
    atomic_fetch_add(&cap_gen, 1);
    atomic_store(&cap_armed, 1);
    return GP_OK;
}

int
gp_nvtx_capture_label(uint64_t *thread, uint32_t *name, uint32_t *domain)
{
    *name = atomic_load(&cap_label);
    *thread = atomic_load(&cap_thread);
    *domain = atomic_load(&cap_label_domain);
    return *name != 0;
}

static int
cap_match(const GpNvtxDomain *d, const Message *m)
{
    return strcmp(d->name, cap_domain) == 0 && m->len == strlen(cap_name) &&
           memcmp(m->text, cap_name, m->len) == 0;
}

/* Called with the capture range's message at its push/start. */
static int
cap_try_open(const GpNvtxDomain *d, const Message *m)
{
    if (!cap_match(d, m))
        return 0;
    int closed = 0;
    if (!atomic_compare_exchange_strong(&cap_open, &closed, 1))
        return 0;
    atomic_store(&cap_thread, (uint64_t)pthread_self());
    atomic_store(&cap_label_domain, d->index);
    atomic_store(&cap_label, intern(d->index, m->category, m->text, m->len));
    gp_nvtx_capture_notify(1);
    return 1;
}

static void
cap_close(void)
{
    int open = 1;
    if (atomic_compare_exchange_strong(&cap_open, &open, 0))
        gp_nvtx_capture_notify(0);
}

/* ---- The callbacks NVTX clients call ---------------------------------------- */

static int
push(const GpNvtxDomain *d, const NvAttr *a, const char *ascii, const wchar_t *wide)
{
    int32_t *dp = depth_of(d);
    int32_t level = (*dp)++;
    int armed = atomic_load_explicit(&cap_armed, memory_order_relaxed);
    if (!armed && !recording())
        return level;
    char buf[TEXT_MAX];
    Message m;
    uint32_t targ = 0, tkind;
    message_of(a, ascii, wide, buf, &m);
    torch_name(&m, &targ, &tkind);
    if (recording()) {
        uint32_t id = name_id(d, &m);
        if (id != 0 && tkind != 0)
            record2(id, GP_EV_MAKE(GP_EV_NVTX_PUSH, d->index), targ, tkind);
        else if (id != 0)
            record(id, GP_EV_MAKE(GP_EV_NVTX_PUSH, d->index));
    }
    if (armed && tls_cap_level == 0 && cap_try_open(d, &m)) {
        tls_cap_level = level + 1;
        tls_cap_domain = d;
        tls_cap_gen = atomic_load(&cap_gen);
    }
    return level;
}

static int
pop(const GpNvtxDomain *d)
{
    int32_t *dp = depth_of(d);
    if (*dp <= 0)
        return -1; /* a pop with nothing pushed (since this thread first called NVTX) */
    int32_t level = --(*dp);
    if (recording())
        record(0, GP_EV_MAKE(GP_EV_NVTX_POP, d->index));
    if (tls_cap_level != 0 && tls_cap_domain == d && tls_cap_level == level + 1) {
        tls_cap_level = 0;
        if (tls_cap_gen == atomic_load(&cap_gen))
            cap_close();
    }
    return level;
}

/* Range ids: [63..48] session, [47..24] recording thread's index + 1 (0 when
 * not recorded), [23..0] tag carried by the START and END events. */
static uint64_t
start(const GpNvtxDomain *d, const NvAttr *a, const char *ascii, const wchar_t *wide)
{
    uint64_t tag = atomic_fetch_add(&next_range, 1) & 0xffffffu;
    if (tag == 0)
        tag = atomic_fetch_add(&next_range, 1) & 0xffffffu;
    uint64_t id = tag;
    int armed = atomic_load_explicit(&cap_armed, memory_order_relaxed);
    if (!armed && !recording())
        return id;
    char buf[TEXT_MAX];
    Message m;
    uint32_t targ = 0, tkind;
    message_of(a, ascii, wide, buf, &m);
    torch_name(&m, &targ, &tkind);
    if (recording()) {
        GpThreadBuf *tb = gp_buffer_thread();
        uint32_t nid = name_id(d, &m);
        if (tb != NULL && nid != 0) {
            uint64_t session = atomic_load(&gp_buffer_session) & 0xffffu;
            id |= session << 48 | (uint64_t)((tb->index + 1) & 0xffffffu) << 24;
            if (tkind != 0)
                record2(nid, GP_EV_MAKE(GP_EV_NVTX_START, tag), targ, tkind);
            else
                record(nid, GP_EV_MAKE(GP_EV_NVTX_START, tag));
        }
    }
    if (armed && cap_try_open(d, &m))
        atomic_store(&cap_range, id);
    return id;
}

static void
end(uint64_t id)
{
    uint64_t want = id;
    if (id != 0 && atomic_load(&cap_range) == id &&
        atomic_compare_exchange_strong(&cap_range, &want, 0)) {
        if (recording())
            record(0, GP_EV_MAKE(GP_EV_NVTX_END, (uint32_t)(id & 0xffffffu)));
        cap_close();
        return;
    }
    uint32_t thread = (uint32_t)(id >> 24) & 0xffffffu;
    if (thread == 0 || !recording())
        return;
    if ((id >> 48) != (atomic_load(&gp_buffer_session) & 0xffffu))
        return; /* started in an earlier session */
    /* An end on another thread than the start is recorded here too, and
     * aggregation closes the range where it was started (see
     * GP_EV_NVTX_END in buffer.h). */
    GpThreadBuf *tb = gp_buffer_thread();
    if (tb != NULL && ((tb->index + 1) & 0xffffffu) != thread)
        atomic_fetch_add(&cross_ends, 1);
    record(thread - 1, GP_EV_MAKE(GP_EV_NVTX_END, (uint32_t)(id & 0xffffffu)));
}

uint64_t
gp_nvtx_cross_thread_ends(void)
{
    return atomic_load(&cross_ends);
}

/* Marks are not recorded; one carrying PROBE_TEXT counts as a probe that
 * reached us (python/gpuprof/_nvtx.py: did a library's NVTX attach?). */
#define PROBE_TEXT "gpuprof-nvtx-probe"
static atomic_uint probe_hits;

static void
mark(const NvAttr *a, const char *ascii, const wchar_t *wide)
{
    char buf[TEXT_MAX];
    Message m;
    message_of(a, ascii, wide, buf, &m);
    if (m.len >= sizeof PROBE_TEXT - 1 && memcmp(m.text, PROBE_TEXT, sizeof PROBE_TEXT - 1) == 0)
        atomic_fetch_add(&probe_hits, 1);
}

/* The entry points NVTX calls, one a line (clang-format would spread them out). */
/* clang-format off */
static void cb_mark_ex(const NvAttr *a) { if (a) mark(a, NULL, NULL); }
static void cb_mark_a(const char *s) { mark(NULL, s, NULL); }
static void cb_mark_w(const wchar_t *s) { mark(NULL, NULL, s); }
static void cb_dmark_ex(const void *d, const NvAttr *a) { (void)d; if (a) mark(a, NULL, NULL); }
static int cb_push_a(const char *s) { return push(&default_domain, NULL, s, NULL); }
static int cb_push_w(const wchar_t *s) { return push(&default_domain, NULL, NULL, s); }
static int cb_push_ex(const NvAttr *a) { return a ? push(&default_domain, a, NULL, NULL) : -1; }
static int cb_pop(void) { return pop(&default_domain); }
static uint64_t cb_start_a(const char *s) { return start(&default_domain, NULL, s, NULL); }
static uint64_t cb_start_w(const wchar_t *s) { return start(&default_domain, NULL, NULL, s); }
static uint64_t cb_start_ex(const NvAttr *a) { return a ? start(&default_domain, a, NULL, NULL) : 0; }
static void cb_end(uint64_t id) { end(id); }
static void cb_category_a(uint32_t c, const char *n) { name_category(&default_domain, c, n, NULL); }
static void cb_category_w(uint32_t c, const wchar_t *n) { name_category(&default_domain, c, NULL, n); }

static int cb_dpush_ex(const void *d, const NvAttr *a) { return a ? push(as_domain(d), a, NULL, NULL) : -1; }
static int cb_dpop(const void *d) { return pop(as_domain(d)); }
static uint64_t cb_dstart_ex(const void *d, const NvAttr *a) { return a ? start(as_domain(d), a, NULL, NULL) : 0; }
static void cb_dend(const void *d, uint64_t id) { (void)d; end(id); }
static void cb_dcategory_a(const void *d, uint32_t c, const char *n) { name_category(as_domain(d), c, n, NULL); }
static void cb_dcategory_w(const void *d, uint32_t c, const wchar_t *n) { name_category(as_domain(d), c, NULL, n); }
static const void *cb_dregister_a(const void *d, const char *s) { return register_string(as_domain(d), s, NULL); }
static const void *cb_dregister_w(const void *d, const wchar_t *s) { return register_string(as_domain(d), NULL, s); }
static const void *cb_dcreate_a(const char *n) { return domain_create(n, NULL); }
static const void *cb_dcreate_w(const wchar_t *n) { return domain_create(NULL, n); }
static void cb_ddestroy(const void *d) { (void)d; /* handles stay valid: see GpNvtxDomain */ }
/* clang-format on */

static void
set_slot(NvTable t, unsigned int size, unsigned int id, NvFn fn)
{
    if (id <= size && t[id] != NULL)
        *t[id] = fn;
}

/* The entry point NVTX looks up in the library NVTX_INJECTION64_PATH names.
 * Default visibility: the extension is built with -fvisibility=hidden. Runs
 * on whatever thread made that client's first NVTX call; returns 1 when
 * attached, 0 to tell the client to turn itself into no-ops. */
__attribute__((visibility("default"))) int
InitializeInjectionNvtx2(NvGetExportTable get_export_table)
{
    if (get_export_table == NULL)
        return 0;
    const NvCallbacksTable *cb = get_export_table(NV_ETID_CALLBACKS);
    if (cb == NULL || cb->struct_size < sizeof(NvCallbacksTable) || cb->get_module_table == NULL)
        return 0;
    NvTable t = NULL;
    unsigned int n = 0;
    if (!cb->get_module_table(NV_MODULE_CORE, &t, &n) || t == NULL)
        return 0;
    set_slot(t, n, NV_CORE_MarkEx, (NvFn)cb_mark_ex);
    set_slot(t, n, NV_CORE_MarkA, (NvFn)cb_mark_a);
    set_slot(t, n, NV_CORE_MarkW, (NvFn)cb_mark_w);
    set_slot(t, n, NV_CORE_RangeStartEx, (NvFn)cb_start_ex);
    set_slot(t, n, NV_CORE_RangeStartA, (NvFn)cb_start_a);
    set_slot(t, n, NV_CORE_RangeStartW, (NvFn)cb_start_w);
    set_slot(t, n, NV_CORE_RangeEnd, (NvFn)cb_end);
    set_slot(t, n, NV_CORE_RangePushEx, (NvFn)cb_push_ex);
    set_slot(t, n, NV_CORE_RangePushA, (NvFn)cb_push_a);
    set_slot(t, n, NV_CORE_RangePushW, (NvFn)cb_push_w);
    set_slot(t, n, NV_CORE_RangePop, (NvFn)cb_pop);
    set_slot(t, n, NV_CORE_NameCategoryA, (NvFn)cb_category_a);
    set_slot(t, n, NV_CORE_NameCategoryW, (NvFn)cb_category_w);
    if (cb->get_module_table(NV_MODULE_CORE2, &t, &n) && t != NULL) {
        set_slot(t, n, NV_CORE2_DomainMarkEx, (NvFn)cb_dmark_ex);
        set_slot(t, n, NV_CORE2_DomainRangeStartEx, (NvFn)cb_dstart_ex);
        set_slot(t, n, NV_CORE2_DomainRangeEnd, (NvFn)cb_dend);
        set_slot(t, n, NV_CORE2_DomainRangePushEx, (NvFn)cb_dpush_ex);
        set_slot(t, n, NV_CORE2_DomainRangePop, (NvFn)cb_dpop);
        set_slot(t, n, NV_CORE2_DomainNameCategoryA, (NvFn)cb_dcategory_a);
        set_slot(t, n, NV_CORE2_DomainNameCategoryW, (NvFn)cb_dcategory_w);
        set_slot(t, n, NV_CORE2_DomainRegisterStringA, (NvFn)cb_dregister_a);
        set_slot(t, n, NV_CORE2_DomainRegisterStringW, (NvFn)cb_dregister_w);
        set_slot(t, n, NV_CORE2_DomainCreateA, (NvFn)cb_dcreate_a);
        set_slot(t, n, NV_CORE2_DomainCreateW, (NvFn)cb_dcreate_w);
        set_slot(t, n, NV_CORE2_DomainDestroy, (NvFn)cb_ddestroy);
    }
    const NvVersionTable *v = get_export_table(NV_ETID_VERSIONINFO);
    if (v != NULL && v->struct_size >= sizeof(NvVersionTable) && v->set_injection_version != NULL)
        v->set_injection_version(3);
    atomic_fetch_add(&clients, 1);
    return 1;
}

/* ---- Names for the tables ---------------------------------------------------- */

int
gp_nvtx_describe(uint32_t id, char *name, size_t name_cap, char *where, size_t where_cap)
{
    int rc = -1;
    pthread_mutex_lock(&nv_lock);
    const GpStr *n = gp_strtab_get(&names, id);
    if (n != NULL) {
        uint32_t domain = (uint32_t)(n->key >> 32), category = (uint32_t)n->key;
        const GpNvtxDomain *d = domain < n_domains ? domains[domain] : &default_domain;
        const char *cat = NULL;
        for (const Category *c = d->cats; c != NULL && category != 0; c = c->next)
            if (c->id == category)
                cat = c->name;
        snprintf(name, name_cap, "%s", n->text);
        int k = snprintf(where, where_cap, "nvtx%s%s", d->name[0] ? ":" : "", d->name);
        if (category != 0 && k >= 0 && (size_t)k < where_cap) {
            if (cat != NULL)
                snprintf(where + k, where_cap - (size_t)k, "/%s", cat);
            else
                snprintf(where + k, where_cap - (size_t)k, "/%u", category);
        }
        rc = 0;
    }
    pthread_mutex_unlock(&nv_lock);
    return rc;
}

int
gp_nvtx_base_key(uint32_t id, uint64_t *key)
{
    int rc = -1;
    pthread_mutex_lock(&nv_lock);
    const GpStr *n = gp_strtab_get(&names, id);
    if (n != NULL) {
        size_t len = strlen(n->text);
        const char *sep = memchr(n->text, GP_NVTX_SHAPES_SEP, len);
        rc = sep != NULL;
        *key = gp_strtab_hash(n->key, n->text, sep ? (size_t)(sep - n->text) : len);
    }
    pthread_mutex_unlock(&nv_lock);
    return rc;
}

uint32_t
gp_nvtx_shaped_names(void)
{
    pthread_mutex_lock(&nv_lock);
    uint32_t n = shaped_names;
    pthread_mutex_unlock(&nv_lock);
    return n;
}

void
gp_nvtx_clear(void)
{
    pthread_mutex_lock(&nv_lock);
    gp_strtab_clear(&names);
    overflow_id = 0;
    names_dropped = 0;
    shaped_names = 0;
    atomic_fetch_add(&names_gen, 1);
    pthread_mutex_unlock(&nv_lock);
}

/* ---- Status ----------------------------------------------------------------------- */

void
gp_nvtx_info(GpNvtxInfo *out)
{
    memset(out, 0, sizeof(*out));
    out->clients = atomic_load(&clients);
    out->probe_hits = atomic_load(&probe_hits);
    pthread_mutex_lock(&nv_lock);
    out->names = names.n;
    out->names_dropped = names_dropped;
    out->domains = n_domains ? n_domains - 1 : 0;
    pthread_mutex_unlock(&nv_lock);
    out->emit = gp_nvtx_emit_ready();
    out->emit_reason = gp_nvtx_emit_reason();
}

void
gp_nvtx_after_fork_child(void)
{
    /* Another thread may have held the lock at fork: the child has one thread. */
    pthread_mutex_init(&nv_lock, NULL);
    atomic_store(&cap_armed, 0);
    atomic_store(&cap_open, 0);
    atomic_store(&capture_fn, NULL);
}
