/* The C call a thread's innermost frame is in, for the dump (dump_call.c). */
#ifndef GPUPROF_CSRC_DUMP_CALL_H
#define GPUPROF_CSRC_DUMP_CALL_H

#include "dump_out.h"
#include "dump_read.h"

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
extern const char *const gp_dump_call_op_names[GP_DUMP_OP_COUNT];

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

/* Append ,"call":{"kind":"call"|"with","expr":...,"callee":...} when the frame at
 * `frame` (its code object at `code`, read into *c, its current instruction at
 * code unit `lasti`) is in a call into C; nothing when it is not, or its bytecode
 * cannot be decoded. "expr" and "callee" are left out where they are not known.
 * 3.11 to 3.13 only (GP_DUMP_WALKS). */
void gp_dump_call_out(GpDumpReader *r, const GpDumpTables *t, GpDumpOut *out, uintptr_t frame,
                      const PyCodeObject *c, uintptr_t code, int lasti);

#endif /* GPUPROF_CSRC_DUMP_CALL_H */
