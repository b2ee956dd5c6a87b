/* A tiny NVTX client for the NVTX tests: compiled at test time against the
 * real nvtx3 headers (header-only: this library carries its own NVTX
 * globals and attaches to NVTX_INJECTION64_PATH at its first call, exactly
 * as PyTorch's or CuPy's copy of nvtx3 does). Called through ctypes, which
 * releases the GIL: every NVTX callback here runs without it. */
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <wchar.h>

int c_push_a(const char *m) { return nvtxRangePushA(m); }
int c_push_w(const wchar_t *m) { return nvtxRangePushW(m); }
int c_pop(void) { return nvtxRangePop(); }
uint64_t c_start_a(const char *m) { return nvtxRangeStartA(m); }
uint64_t c_start_w(const wchar_t *m) { return nvtxRangeStartW(m); }
void c_end(uint64_t id) { nvtxRangeEnd(id); }
void c_mark(const char *m) { nvtxMarkA(m); }
void c_name_category(uint32_t id, const char *name) { nvtxNameCategoryA(id, name); }
void *c_domain(const char *name) { return nvtxDomainCreateA(name); }
void *c_domain_w(const wchar_t *name) { return nvtxDomainCreateW(name); }
void c_domain_category(void *d, uint32_t id, const char *name)
{
    nvtxDomainNameCategoryA((nvtxDomainHandle_t)d, id, name);
}
void *c_register(void *d, const char *s)
{
    return nvtxDomainRegisterStringA((nvtxDomainHandle_t)d, s);
}

static void
attrs(nvtxEventAttributes_t *a, uint32_t category, int type, const void *msg)
{
    memset(a, 0, sizeof(*a));
    a->version = NVTX_VERSION;
    a->size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a->category = category;
    a->messageType = type;
    if (type == NVTX_MESSAGE_TYPE_ASCII)
        a->message.ascii = msg;
    else if (type == NVTX_MESSAGE_TYPE_UNICODE)
        a->message.unicode = msg;
    else if (type == NVTX_MESSAGE_TYPE_REGISTERED)
        a->message.registered = (nvtxStringHandle_t)msg;
}

/* type: 1 ASCII, 2 Unicode, 3 registered handle (from c_register). */
int c_push_ex(uint32_t category, int type, const void *msg)
{
    nvtxEventAttributes_t a;
    attrs(&a, category, type, msg);
    return nvtxRangePushEx(&a);
}
int c_dpush(void *d, uint32_t category, int type, const void *msg)
{
    nvtxEventAttributes_t a;
    attrs(&a, category, type, msg);
    return nvtxDomainRangePushEx((nvtxDomainHandle_t)d, &a);
}
int c_dpop(void *d) { return nvtxDomainRangePop((nvtxDomainHandle_t)d); }
uint64_t c_dstart(void *d, uint32_t category, int type, const void *msg)
{
    nvtxEventAttributes_t a;
    attrs(&a, category, type, msg);
    return nvtxDomainRangeStartEx((nvtxDomainHandle_t)d, &a);
}
void c_dend(void *d, uint64_t id) { nvtxDomainRangeEnd((nvtxDomainHandle_t)d, id); }

/* Busy work inside a range, so ranges have a measurable length. */
static volatile uint64_t sink;
void c_spin(uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        sink += i;
}

/* End a start/end range on a new thread (NVTX allows any thread). */
static void *end_thread(void *arg) { nvtxRangeEnd(*(uint64_t *)arg); return NULL; }
void c_end_on_other_thread(uint64_t id)
{
    pthread_t t;
    pthread_create(&t, NULL, end_thread, &id);
    pthread_join(t, NULL);
}

/* n threads (not Python threads), each pushing and popping `name` k times. */
typedef struct Job { const char *name; int k; } Job;
static void *
job(void *arg)
{
    const Job *j = arg;
    for (int i = 0; i < j->k; i++) {
        nvtxRangePushA(j->name);
        c_spin(1000);
        nvtxRangePop();
    }
    return NULL;
}
int c_threads(int n, int k, const char *name)
{
    pthread_t t[64];
    Job j = {name, k};
    if (n > 64)
        n = 64;
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, job, &j);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    return n;
}

/* n threads (not Python threads) pushing and popping "storm" without pause
 * until c_storm_stop(), as CUDA callbacks fire on a job's threads while a
 * profile starts and stops; c_storm_pushes and c_storm_stop return the pushes
 * made (each counted once popped). */
static atomic_int storm_on;
static atomic_ullong storm_pushes;
static pthread_t storm_threads[64];
static int storm_n;
static void *
storm(void *arg)
{
    (void)arg;
    while (atomic_load(&storm_on)) {
        nvtxRangePushA("storm");
        nvtxRangePop();
        atomic_fetch_add(&storm_pushes, 1);
    }
    return NULL;
}
void
c_storm_start(int n)
{
    storm_n = n > 64 ? 64 : n;
    atomic_store(&storm_on, 1);
    atomic_store(&storm_pushes, 0);
    for (int i = 0; i < storm_n; i++)
        pthread_create(&storm_threads[i], NULL, storm, NULL);
}
uint64_t
c_storm_pushes(void)
{
    return atomic_load(&storm_pushes);
}
uint64_t
c_storm_stop(void)
{
    atomic_store(&storm_on, 0);
    for (int i = 0; i < storm_n; i++)
        pthread_join(storm_threads[i], NULL);
    return atomic_load(&storm_pushes);
}

/* On a new thread (no Python there, as autograd's device threads), run a
 * script: each entry "+MESSAGE" pushes MESSAGE, "-" pops, "~N" spins N. */
typedef struct Script { const char *const *ops; int n; } Script;
static void *
script_thread(void *arg)
{
    const Script *s = arg;
    for (int i = 0; i < s->n; i++) {
        const char *op = s->ops[i];
        if (op[0] == '+')
            nvtxRangePushA(op + 1);
        else if (op[0] == '-')
            nvtxRangePop();
        else if (op[0] == '~') {
            uint64_t k = 0;
            for (const char *c = op + 1; *c >= '0' && *c <= '9'; c++)
                k = k * 10 + (uint64_t)(*c - '0');
            c_spin(k);
        }
    }
    return NULL;
}
void c_script_on_thread(const char *const *ops, int n)
{
    pthread_t t;
    Script s = {ops, n};
    pthread_create(&t, NULL, script_thread, &s);
    pthread_join(t, NULL);
}

/* Decimal digits of v at p; returns the end. */
static char *
put_u64(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* ns per push + pop over k rounds on this thread (benchmarks/bench_nvtx_parse.py).
 * n == 0: the fixed message names[0]. Else each push is a fresh message in
 * PyTorch's form, as autograd writes it: names[i % n] ", seq = S, op_id = H",
 * seq falling and op_id rising (a name starting "torch::" has no seq, as
 * AccumulateGrad). */
#include <time.h>
double c_push_pop_ns(const char *const *names, int n, int k)
{
    struct timespec a, b;
    char buf[256];
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < k; i++) {
        const char *m = names[0];
        if (n > 0) {
            const char *name = names[i % n];
            size_t len = strlen(name);
            char *p = buf;
            memcpy(p, name, len);
            p += len;
            if (strncmp(name, "torch::", 7) != 0) {
                memcpy(p, ", seq = ", 8);
                p = put_u64(p + 8, 1000000u - (uint64_t)i);
            }
            memcpy(p, ", op_id = ", 10);
            p = put_u64(p + 10, 5000u + (uint64_t)i);
            *p = 0;
            m = buf;
        }
        nvtxRangePushA(m);
        nvtxRangePop();
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / k;
}
