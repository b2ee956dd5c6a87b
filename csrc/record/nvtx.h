/* NVTX ranges in and out, and capture ranges (csrc/record/nvtx.c: gpuprof as the NVTX
 * injection library; csrc/record/nvtx_out.c: gpuprof's ranges out to another NVTX
 * tool). Built in every build: no CUDA header needed. Every function: any
 * thread, no GIL needed, never calls Python. */
#ifndef GPUPROF_CSRC_NVTX_H
#define GPUPROF_CSRC_NVTX_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* The name of NVTX name id `id` (from GP_EV_NVTX_PUSH/START) as UTF-8 into
 * name[name_cap], and where it came from into where[where_cap]: "nvtx",
 * "nvtx:DOMAIN", plus "/CATEGORY" (its registered name, or its number) when
 * the range had one. 0, or -1 for an unknown id. Valid until gp_nvtx_clear. */
int gp_nvtx_describe(uint32_t id, char *name, size_t name_cap, char *where, size_t where_cap);

/* A range message in PyTorch's grammar (csrc/record/nvtx.c, "PyTorch's range
 * messages"): its NAME (a slice of the text), GP_NVTXT_* flags (buffer.h) and
 * sequence number. */
typedef struct GpNvtxTorchName {
    const char *name;
    size_t len;
    uint32_t flags;
    uint64_t seq; /* valid with GP_NVTXT_SEQ */
    /* The "sizes = [...]" field's list (record_shapes), a slice of the text;
     * NULL when the message has none or it was cut. */
    const char *sizes;
    size_t sizes_len;
} GpNvtxTorchName;

/* Between an op's NAME and its input sizes in the name of a range that
 * carried them (csrc/record/nvtx.c, torch_name): results.c splits there. */
#define GP_NVTX_SHAPES_SEP '\x1f'

/* For shapes reuse (csrc/aggregate/shapes.c): into *key, a hash of name id
 * `id`'s domain, category and name without its input sizes, the same for a
 * range named with sizes and one named without; 1 when the name carried
 * sizes, 0 when not, -1 for an unknown id (*key unset). */
int gp_nvtx_base_key(uint32_t id, uint64_t *key);

/* Names with an op's input sizes interned since the last gp_nvtx_clear. */
uint32_t gp_nvtx_shaped_names(void);

/* Parse text[0..len) (`truncated`: it was cut at gpuprof's 1023-byte limit,
 * so its last field may be incomplete). 1 and *out filled when it follows
 * PyTorch's grammar, else 0 (*out names the whole text). */
int gp_nvtx_torch_parse(const char *text, size_t len, int truncated, GpNvtxTorchName *out);

/* The name id that a push of `text` on the default domain records, interned
 * as the push does (the test entry point _test_nvtx_name). 0 when out of memory. */
uint32_t gp_nvtx_intern_default(const char *text, size_t len);

/* Forget the NVTX names (session end, after every table was built). Domain
 * and registered-string handles stay valid for the process's life. */
void gp_nvtx_clear(void);

typedef struct GpNvtxInfo {
    int clients; /* NVTX clients attached to gpuprof's injection */
    int emit; /* gpuprof's ranges go out to another NVTX tool */
    const char *emit_reason; /* why (not); static storage */
    uint32_t names; /* distinct NVTX names this session */
    uint32_t domains; /* named domains created */
    uint64_t names_dropped; /* events named "<nvtx: too many ...>" (table full) */
    unsigned probe_hits; /* NVTX marks "gpuprof-nvtx-probe..." that reached us */
} GpNvtxInfo;
void gp_nvtx_info(GpNvtxInfo *out);

/* Out: attach (once, lazily) to the tool NVTX_INJECTION64_PATH names, unless
 * that is gpuprof itself; 1 when gpuprof's ranges can go out. push/pop
 * cost nothing when not attached. */
int gp_nvtx_emit_ready(void);
void gp_nvtx_emit_push(const char *utf8);
void gp_nvtx_emit_pop(void);

/* Why gpuprof's ranges go out or not (static storage; "not attached yet" before
 * the first gp_nvtx_emit_ready). */
const char *gp_nvtx_emit_reason(void);

/* Capture ranges. The profiler registers `fn` (NULL to unregister); the NVTX
 * callbacks and the cudaProfilerStart/Stop callbacks call it through
 * gp_nvtx_capture_notify with 1 (open) or 0 (close), on their own thread,
 * maybe without the GIL. */
typedef void (*GpNvtxCaptureFn)(int open);
void gp_nvtx_capture_handler(GpNvtxCaptureFn fn);
void gp_nvtx_capture_notify(int open);

/* Arm capture by NVTX range name (domain "" = the default domain), or
 * disarm with name NULL. GIL thread, before recording. GP_ERR_VALUE when a
 * name is longer than 255 bytes. */
GpStatus gp_nvtx_capture_set(const char *name, const char *domain);

/* The thread (pthread_self), NVTX name id and domain index of the push that
 * opened the current NVTX capture; 0 when there is none. */
int gp_nvtx_capture_label(uint64_t *thread, uint32_t *name, uint32_t *domain);

/* NVTX ranges ended on another thread than the one that started them, so
 * far this process (aggregation looks for them only when there were any). */
uint64_t gp_nvtx_cross_thread_ends(void);

/* In a forked child: reset the NVTX lock and capture state. */
void gp_nvtx_after_fork_child(void);

#endif /* GPUPROF_CSRC_NVTX_H */
