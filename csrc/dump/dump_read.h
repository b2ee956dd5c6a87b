/* Reading this process's memory where it may change or go away, for the dump
 * (dump_read.c): raw bytes, pointers, C strings, and the few objects the dump
 * reads (str, tuple, a type's name), each checked before it is trusted. No GIL
 * needed, no Python API called: objects are only read. */
#ifndef GPUPROF_CSRC_DUMP_READ_H
#define GPUPROF_CSRC_DUMP_READ_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dump_out.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The versions whose frame layout the dump knows (dump_walk.c, dump_call.c). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define GP_DUMP_WALKS 1
#else
#define GP_DUMP_WALKS 0
#endif

/* One reader, owned by the thread that reads (the walk's, on its stack). */
typedef struct GpDumpReader {
    int mode;    /* 0 process_vm_readv, 1 a pipe (process_vm_readv refused) */
    int pipe[2]; /* mode 1 */
    pid_t pid;   /* this process */
} GpDumpReader;

void gp_dump_read_open(GpDumpReader *r);
void gp_dump_read_close(GpDumpReader *r);

/* "process_vm_readv" or "pipe": how it has been reading. */
const char *gp_dump_read_how(const GpDumpReader *r);

/* Copy n bytes at addr of this process into dst: 0, or -1 if any of it is not
 * mapped (or the copy was refused). */
int gp_dump_read_bytes(GpDumpReader *r, uintptr_t addr, void *dst, size_t n);

int gp_dump_read_ptr(GpDumpReader *r, uintptr_t addr, uintptr_t *v);

/* The type pointer of the object at obj, or 0. */
uintptr_t gp_dump_read_type(GpDumpReader *r, uintptr_t obj);

/* A NUL-terminated C string at addr, at most cap-1 bytes, read in pieces that
 * never cross into a page the string does not reach. 0, or -1. */
int gp_dump_read_cstr(GpDumpReader *r, uintptr_t addr, char *buf, size_t cap);

/* The str object at addr written to o as a JSON string. 0, or -1 with nothing
 * written (not an exact str, not compact, or unreadable). */
int gp_dump_read_str_json(GpDumpReader *r, GpDumpOut *o, uintptr_t addr);

/* The str at addr into buf (ASCII; other characters become '?'), for names that
 * are compared or joined. 0, or -1. */
int gp_dump_read_str_ascii(GpDumpReader *r, uintptr_t addr, char *buf, size_t cap);

/* Item i of the tuple at addr (a pointer read out of it, not a reference), or 0. */
uintptr_t gp_dump_read_tuple_item(GpDumpReader *r, uintptr_t tuple, uint32_t i);

/* The tp_name of the type at `type` into buf. 0, or -1 (buf is then ""). */
int gp_dump_read_type_name(GpDumpReader *r, uintptr_t type, char *buf, size_t cap);

#endif /* GPUPROF_CSRC_DUMP_READ_H */
