/* The NVTX injection ABI (nvtx3 nvtxDetail/nvtxTypes.h, NVTX_VERSION 3): the
 * export tables an NVTX client hands an injection library, the slots of its
 * CORE and CORE2 modules, and the event attributes. Shared by csrc/record/nvtx.c (in)
 * and csrc/record/nvtx_out.c (out). */
#ifndef GPUPROF_CSRC_NVTX_ABI_H
#define GPUPROF_CSRC_NVTX_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <wchar.h>

typedef void (*NvFn)(void);   /* slot type; cast to the real signature */
typedef NvFn **NvTable;       /* array of pointers to the client's slots */
typedef const void *(*NvGetExportTable)(uint32_t table_id);

enum { NV_ETID_CALLBACKS = 1, NV_ETID_VERSIONINFO = 3 };
enum { NV_MODULE_CORE = 1, NV_MODULE_CORE2 = 5 };
enum {
    NV_CORE_MarkEx = 1,
    NV_CORE_MarkA = 2,
    NV_CORE_MarkW = 3,
    NV_CORE_RangeStartEx = 4,
    NV_CORE_RangeStartA = 5,
    NV_CORE_RangeStartW = 6,
    NV_CORE_RangeEnd = 7,
    NV_CORE_RangePushEx = 8,
    NV_CORE_RangePushA = 9,
    NV_CORE_RangePushW = 10,
    NV_CORE_RangePop = 11,
    NV_CORE_NameCategoryA = 12,
    NV_CORE_NameCategoryW = 13,
    NV_CORE_SIZE = 16,
};
enum {
    NV_CORE2_DomainMarkEx = 1,
    NV_CORE2_DomainRangeStartEx = 2,
    NV_CORE2_DomainRangeEnd = 3,
    NV_CORE2_DomainRangePushEx = 4,
    NV_CORE2_DomainRangePop = 5,
    NV_CORE2_DomainNameCategoryA = 8,
    NV_CORE2_DomainNameCategoryW = 9,
    NV_CORE2_DomainRegisterStringA = 10,
    NV_CORE2_DomainRegisterStringW = 11,
    NV_CORE2_DomainCreateA = 12,
    NV_CORE2_DomainCreateW = 13,
    NV_CORE2_DomainDestroy = 14,
    NV_CORE2_SIZE = 16,
};
enum { NV_MSG_ASCII = 1, NV_MSG_UNICODE = 2, NV_MSG_REGISTERED = 3 };

typedef struct NvCallbacksTable {
    size_t struct_size;
    int (*get_module_table)(int module, NvTable *out_table, unsigned int *out_size);
} NvCallbacksTable;

typedef struct NvVersionTable {
    size_t struct_size;
    uint32_t version;
    uint32_t reserved0;
    void (*set_injection_version)(uint32_t version);
} NvVersionTable;

/* nvtxEventAttributes_v2. */
typedef struct NvAttr {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    uint64_t payload;
    int32_t message_type;
    union {
        const char *ascii;
        const wchar_t *unicode;
        const void *registered;
    } message;
} NvAttr;

_Static_assert(offsetof(NvAttr, message) == 40 && sizeof(NvAttr) == 48,
               "nvtxEventAttributes_v2 layout");

/* gpuprof's injection entry point (nvtx.c); nvtx_out.c compares a tool's with it. */
int InitializeInjectionNvtx2(NvGetExportTable get_export_table);

#endif /* GPUPROF_CSRC_NVTX_ABI_H */
