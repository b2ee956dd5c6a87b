/* What /proc says of a thread of this process, for the dump (dump_proc.c). */
#ifndef GPUPROF_CSRC_DUMP_PROC_H
#define GPUPROF_CSRC_DUMP_PROC_H

#include "dump_out.h"

/* Append ,"state":"S","syscall":"futex","wchan":"..." (and ,"name":"..." with
 * with_name) for the thread `tid` of this process, each field only where /proc
 * has it. The system call comes from /proc/self/task/TID/syscall, which needs
 * ptrace access: a process always has it to itself, another process (gpuprof
 * dump) may not, under Yama. */
void gp_dump_proc_thread(GpDumpOut *o, long tid, int with_name);

#endif /* GPUPROF_CSRC_DUMP_PROC_H */
