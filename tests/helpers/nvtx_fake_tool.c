/* A stand-in NVTX tool (as Nsight Systems' injection library is): exports
 * InitializeInjectionNvtx2, takes nvtxRangePushA/nvtxRangePop from every
 * client that attaches, and logs them for the test to read (fake_tool_log).
 * The ABI is written out here (nvtx3 nvtxDetail/nvtxTypes.h, NVTX_VERSION 3)
 * so that this builds without the NVTX headers. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*NvFn)(void);
typedef NvFn **NvTable;
typedef struct {
    size_t struct_size;
    int (*get_module_table)(int module, NvTable *out_table, unsigned int *out_size);
} Callbacks;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];
static size_t log_len;
static int clients;

static void
append(const char *what, const char *msg)
{
    pthread_mutex_lock(&lock);
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s %s\n", what, msg);
    if (n > 0 && log_len + (size_t)n < sizeof log_text)
        log_len += (size_t)n;
    pthread_mutex_unlock(&lock);
}

static int push_a(const char *m) { append("push", m ? m : "(null)"); return 0; }
static int pop(void) { append("pop", "-"); return 0; }

const char *fake_tool_log(void) { return log_text; }
int fake_tool_clients(void) { return clients; }

int
InitializeInjectionNvtx2(const void *(*get_export_table)(uint32_t))
{
    const Callbacks *cb = get_export_table(1);
    NvTable t;
    unsigned int n;
    if (cb == NULL || !cb->get_module_table(1, &t, &n) || n < 11)
        return 0;
    *t[9] = (NvFn)push_a; /* NVTX_CBID_CORE_RangePushA */
    *t[11] = (NvFn)pop;   /* NVTX_CBID_CORE_RangePop */
    pthread_mutex_lock(&lock);
    clients++;
    pthread_mutex_unlock(&lock);
    return 1;
}
