/* A tiny NVTX client for the NVTX tests: compiled at test time against the
 * real nvtx3 headers (header-only: this library carries its own NVTX
 * globals and attaches to NVTX_INJECTION64_PATH at its first call, exactly
 * as PyTorch's or CuPy's copy of nvtx3 does). Called through ctypes, which
 * releases the GIL: every NVTX callback here runs without it. */
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
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
