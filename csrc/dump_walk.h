/* Every Python thread's stack, read out of the interpreter's memory without the
 * GIL and without trusting that memory (dump_walk.c), written as one JSON line.
 * Used by the dump server (dump.c), which runs it on a thread of its own that
 * never holds the GIL. */
#ifndef GPUPROF_CSRC_DUMP_WALK_H
#define GPUPROF_CSRC_DUMP_WALK_H

#include "common.h"

#include <stddef.h>
#include <stdint.h>

/* The base opcodes the call analysis looks at. Their numbers differ between
 * Python versions and come from Python's own opcode module at arming
 * (gp_dump_walk_op_names names them for that); -1 where a version has none. */
typedef enum GpDumpOp {
    GP_DUMP_OP_CALL,
    GP_DUMP_OP_PRECALL,
    GP_DUMP_OP_CALL_KW,
    GP_DUMP_OP_CALL_FUNCTION_EX,
    GP_DUMP_OP_BEFORE_WITH,
    GP_DUMP_OP_BEFORE_ASYNC_WITH,
    GP_DUMP_OP_LOAD_ATTR,
    GP_DUMP_OP_LOAD_METHOD,
    GP_DUMP_OP_LOAD_SUPER_ATTR,
    GP_DUMP_OP_LOAD_GLOBAL,
    GP_DUMP_OP_LOAD_NAME,
    GP_DUMP_OP_LOAD_FAST,
    GP_DUMP_OP_LOAD_FAST_CHECK,
    GP_DUMP_OP_LOAD_FAST_AND_CLEAR,
    GP_DUMP_OP_LOAD_FAST_LOAD_FAST,
    GP_DUMP_OP_LOAD_DEREF,
    GP_DUMP_OP_LOAD_CLOSURE,
    GP_DUMP_OP_LOAD_CONST,
    GP_DUMP_OP_PUSH_NULL,
    GP_DUMP_OP_KW_NAMES,
    GP_DUMP_OP_EXTENDED_ARG,
    GP_DUMP_OP_BUILD_LIST, /* the rest: values that arguments are made of */
    GP_DUMP_OP_BUILD_TUPLE,
    GP_DUMP_OP_BUILD_SET,
    GP_DUMP_OP_BUILD_STRING,
    GP_DUMP_OP_BUILD_MAP,
    GP_DUMP_OP_BINARY_OP,
    GP_DUMP_OP_BINARY_SUBSCR,
    GP_DUMP_OP_COMPARE_OP,
    GP_DUMP_OP_CONTAINS_OP,
    GP_DUMP_OP_IS_OP,
    GP_DUMP_OP_UNARY_NEGATIVE,
    GP_DUMP_OP_UNARY_NOT,
    GP_DUMP_OP_UNARY_INVERT,
    GP_DUMP_OP_TO_BOOL,
    GP_DUMP_OP_COUNT
} GpDumpOp;

/* GpDumpOp's names as Python's opcode module spells them, in enum order. */
extern const char *const gp_dump_walk_op_names[GP_DUMP_OP_COUNT];

/* What the call analysis needs to decode this interpreter's bytecode.
 * Written once before the server thread starts, read-only afterwards. */
typedef struct GpDumpTables {
    uint8_t deopt[256];  /* opcode as stored (specialised) -> its base opcode */
    uint8_t caches[256]; /* opcode as stored -> inline cache units after it;
                            GP_DUMP_NO_DECODE: the real opcode is stored elsewhere */
    int16_t op[GP_DUMP_OP_COUNT];
    int ready; /* 0: no tables given, calls are not analysed */
} GpDumpTables;

#define GP_DUMP_NO_DECODE 0xFF

/* A growing output buffer (malloc'ed); `full` once an allocation failed or
 * the cap was reached, after which nothing more is added. Owned by one caller. */
typedef struct GpDumpOut {
    char *p;
    size_t n, cap;
    int full;
} GpDumpOut;

/* Append a C string as it is (nothing once o->full). */
void gp_dump_walk_out_str(GpDumpOut *o, const char *s);

/* Free the buffer; o is empty (and not full) again. */
void gp_dump_walk_out_free(GpDumpOut *o);

/* Whether this build can walk this interpreter: NULL if it can, else why not
 * (a static string). */
const char *gp_dump_walk_unsupported(void);

/* Append one JSON object (no newline) describing every thread state of the main
 * interpreter: each thread's frames (file, line, function; innermost first),
 * the C call its innermost frame is in where the bytecode says so, the GIL's
 * holder, what /proc says of each thread, and the native threads that run no
 * Python. `skip_tid` (an OS thread id, or 0) is left out of the native threads:
 * the dump server's own. Needs no GIL and calls no Python API: every read of
 * interpreter memory goes through process_vm_readv (or a pipe), so a frame freed
 * or changed meanwhile gives a "problems" entry rather than a crash. Returns
 * GP_OK, or GP_ERR_NOMEM when the output could not be grown (out->full). */
GpStatus gp_dump_walk_threads(const GpDumpTables *tables, long skip_tid, GpDumpOut *out);

#endif /* GPUPROF_CSRC_DUMP_WALK_H */
