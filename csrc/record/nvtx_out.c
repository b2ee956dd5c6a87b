/* Out: gpuprof's record_function labels and ProfilerStep#N ranges to another
 * NVTX tool. When NVTX_INJECTION64_PATH names one (Nsight Systems), gpuprof
 * attaches to it like any NVTX client; when it names gpuprof itself nothing is
 * emitted, so gpuprof's own ranges never come back in as NVTX input (nvtx.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "nvtx.h"

#include "nvtx_abi.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Written once inside out_attach (pthread_once), read-only afterwards. */
static pthread_once_t out_once = PTHREAD_ONCE_INIT;
static NvFn out_core[NV_CORE_SIZE];
static NvFn out_core2[NV_CORE2_SIZE];
static NvFn *out_core_table[NV_CORE_SIZE];
static NvFn *out_core2_table[NV_CORE2_SIZE];
static int (*out_push)(const char *);
static int (*out_pop)(void);
static char out_reason[512] = "not attached yet";

static int
out_module_table(int module, NvTable *out_table, unsigned int *out_size)
{
    switch (module) {
    case NV_MODULE_CORE:
        *out_table = out_core_table;
        *out_size = NV_CORE_SIZE - 1;
        return 1;
    case NV_MODULE_CORE2:
        *out_table = out_core2_table;
        *out_size = NV_CORE2_SIZE - 1;
        return 1;
    default:
        return 0;
    }
}

static void
out_set_version(uint32_t version)
{
    (void)version;
}

static const NvCallbacksTable out_callbacks = {sizeof(NvCallbacksTable), out_module_table};
static const NvVersionTable out_version = {sizeof(NvVersionTable), 3, 0, out_set_version};

static const void *
out_export_table(uint32_t table_id)
{
    switch (table_id) {
    case NV_ETID_CALLBACKS:
        return &out_callbacks;
    case NV_ETID_VERSIONINFO:
        return &out_version;
    default:
        return NULL;
    }
}

static void
out_attach(void)
{
    for (unsigned i = 1; i < NV_CORE_SIZE; i++)
        out_core_table[i] = &out_core[i];
    for (unsigned i = 1; i < NV_CORE2_SIZE; i++)
        out_core2_table[i] = &out_core2[i];
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (path == NULL || path[0] == '\0') {
        snprintf(out_reason, sizeof out_reason,
                 "no NVTX tool attached (NVTX_INJECTION64_PATH is unset)");
        return;
    }
    void *h = dlopen(path, RTLD_LAZY);
    if (h == NULL) {
        const char *err = dlerror();
        snprintf(out_reason, sizeof out_reason, "dlopen(%s) failed: %s", path, err ? err : "?");
        return;
    }
    void *sym = dlsym(h, "InitializeInjectionNvtx2");
    int (*init)(NvGetExportTable) = NULL;
    memcpy(&init, &sym, sizeof init);
    if (init == NULL) {
        snprintf(out_reason, sizeof out_reason, "%s has no InitializeInjectionNvtx2", path);
        return;
    }
    if (init == InitializeInjectionNvtx2) {
        /* The tool is gpuprof: emitting would feed our ranges back in. */
        snprintf(out_reason, sizeof out_reason,
                 "NVTX_INJECTION64_PATH is gpuprof itself (NVTX input); no other tool to emit to");
        return;
    }
    if (!init(out_export_table)) {
        snprintf(out_reason, sizeof out_reason, "%s: InitializeInjectionNvtx2 returned 0", path);
        return;
    }
    int (*p)(const char *) = (int (*)(const char *))out_core[NV_CORE_RangePushA];
    int (*q)(void) = (int (*)(void))out_core[NV_CORE_RangePop];
    if (p == NULL || q == NULL) {
        snprintf(out_reason, sizeof out_reason, "%s did not take nvtxRangePushA/nvtxRangePop",
                 path);
        return;
    }
    out_push = p;
    out_pop = q;
    snprintf(out_reason, sizeof out_reason, "emitting to %s", path);
}

int
gp_nvtx_emit_ready(void)
{
    pthread_once(&out_once, out_attach);
    return out_push != NULL;
}

void
gp_nvtx_emit_push(const char *utf8)
{
    if (out_push != NULL)
        out_push(utf8);
}

void
gp_nvtx_emit_pop(void)
{
    if (out_pop != NULL)
        out_pop();
}

const char *
gp_nvtx_emit_reason(void)
{
    return out_reason;
}
