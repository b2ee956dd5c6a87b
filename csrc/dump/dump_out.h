/* The dump's output: a growing malloc'ed buffer of JSON text, written without the
 * GIL (dump_out.c). Used by the dump's files (dump.c, dump_walk.c, dump_call.c,
 * dump_proc.c, dump_read.c). */
#ifndef GPUPROF_CSRC_DUMP_OUT_H
#define GPUPROF_CSRC_DUMP_OUT_H

#include <stddef.h>
#include <stdint.h>

/* `full` once an allocation failed or the cap (16 MiB) was reached, after which
 * nothing more is added. Owned by the one thread that writes it. */
typedef struct GpDumpOut {
    char *p; /* NUL-terminated text, or NULL */
    size_t n, cap;
    int full;
} GpDumpOut;

void gp_dump_out_bytes(GpDumpOut *o, const char *s, size_t n);

/* A C string as it is. */
void gp_dump_out_str(GpDumpOut *o, const char *s);

/* One code point inside a JSON string: printable ASCII as itself, the rest as
 * \uXXXX escapes (surrogate pairs above U+FFFF), so the output is pure ASCII. */
void gp_dump_out_codepoint(GpDumpOut *o, uint32_t c);

/* A C string (UTF-8; invalid bytes become U+FFFD) as a JSON string; NULL: null. */
void gp_dump_out_json_cstr(GpDumpOut *o, const char *s);

void gp_dump_out_u64(GpDumpOut *o, uint64_t v);
void gp_dump_out_i64(GpDumpOut *o, int64_t v);

/* Free the text; o is empty (and not full) again. */
void gp_dump_out_free(GpDumpOut *o);

#endif /* GPUPROF_CSRC_DUMP_OUT_H */
