/* Every Python thread's stack, read out of the interpreter's memory without the
 * GIL and without trusting that memory (dump_walk.c), written as one JSON line.
 * Used by the dump server (dump.c), which runs it on a thread of its own that
 * never holds the GIL. */
#ifndef GPUPROF_CSRC_DUMP_WALK_H
#define GPUPROF_CSRC_DUMP_WALK_H

#include "common.h"
#include "dump_call.h"
#include "dump_out.h"

/* Whether this build can walk this interpreter: NULL if it can, else why not
 * (a static string). */
const char *gp_dump_walk_unsupported(void);

/* Append one JSON object (no newline) describing every thread state of the main
 * interpreter: each thread's frames (file, line, function; innermost first), the
 * C call its innermost frame is in (dump_call.h), the GIL's holder, what /proc
 * says of each thread (dump_proc.h), and the native threads that run no Python.
 * `skip_tid` (an OS thread id, or 0) is left out of the native threads: the dump
 * server's own. Needs no GIL and calls no Python API: every read of interpreter
 * memory goes through dump_read.h, so a frame freed or changed meanwhile gives a
 * "problems" entry rather than a crash. Returns GP_OK, or GP_ERR_NOMEM when the
 * output could not be grown (out->full). */
GpStatus gp_dump_walk_threads(const GpDumpTables *tables, long skip_tid, GpDumpOut *out);

#endif /* GPUPROF_CSRC_DUMP_WALK_H */
