/* What /proc says of a thread of this process (dump_proc.h). No Python API and no
 * interpreter memory: it reads /proc/self/task/TID. */
#include "dump_proc.h"

#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const struct {
    long nr;
    const char *name;
} syscall_names[] = {
#define SC(n) {SYS_##n, #n}
#ifdef SYS_futex
    SC(futex),
#endif
#ifdef SYS_futex_waitv
    SC(futex_waitv),
#endif
#ifdef SYS_read
    SC(read),
#endif
#ifdef SYS_write
    SC(write),
#endif
#ifdef SYS_readv
    SC(readv),
#endif
#ifdef SYS_recvfrom
    SC(recvfrom),
#endif
#ifdef SYS_recvmsg
    SC(recvmsg),
#endif
#ifdef SYS_sendto
    SC(sendto),
#endif
#ifdef SYS_sendmsg
    SC(sendmsg),
#endif
#ifdef SYS_poll
    SC(poll),
#endif
#ifdef SYS_ppoll
    SC(ppoll),
#endif
#ifdef SYS_select
    SC(select),
#endif
#ifdef SYS_pselect6
    SC(pselect6),
#endif
#ifdef SYS_epoll_wait
    SC(epoll_wait),
#endif
#ifdef SYS_epoll_pwait
    SC(epoll_pwait),
#endif
#ifdef SYS_epoll_pwait2
    SC(epoll_pwait2),
#endif
#ifdef SYS_nanosleep
    SC(nanosleep),
#endif
#ifdef SYS_clock_nanosleep
    SC(clock_nanosleep),
#endif
#ifdef SYS_accept
    SC(accept),
#endif
#ifdef SYS_accept4
    SC(accept4),
#endif
#ifdef SYS_connect
    SC(connect),
#endif
#ifdef SYS_ioctl
    SC(ioctl),
#endif
#ifdef SYS_sched_yield
    SC(sched_yield),
#endif
#ifdef SYS_pause
    SC(pause),
#endif
#ifdef SYS_wait4
    SC(wait4),
#endif
#ifdef SYS_waitid
    SC(waitid),
#endif
#ifdef SYS_rt_sigsuspend
    SC(rt_sigsuspend),
#endif
#ifdef SYS_rt_sigtimedwait
    SC(rt_sigtimedwait),
#endif
#ifdef SYS_flock
    SC(flock),
#endif
#ifdef SYS_fcntl
    SC(fcntl),
#endif
#ifdef SYS_openat
    SC(openat),
#endif
#ifdef SYS_fsync
    SC(fsync),
#endif
#ifdef SYS_semtimedop
    SC(semtimedop),
#endif
#ifdef SYS_msgrcv
    SC(msgrcv),
#endif
#ifdef SYS_io_uring_enter
    SC(io_uring_enter),
#endif
#ifdef SYS_mmap
    SC(mmap),
#endif
#ifdef SYS_munmap
    SC(munmap),
#endif
#undef SC
};

/* The whole of a small /proc file, NUL-terminated; its length, or -1. */
static ssize_t
read_proc(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return n;
}

void
gp_dump_proc_thread(GpDumpOut *o, long tid, int with_name)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    if (read_proc(path, buf, sizeof buf) > 0) {
        char *close_paren = strrchr(buf, ')');
        if (close_paren != NULL && close_paren[1] == ' ' && close_paren[2] != '\0') {
            char state[2] = {close_paren[2], '\0'};
            gp_dump_out_str(o, ",\"state\":");
            gp_dump_out_json_cstr(o, state);
        }
    }
    if (with_name) {
        snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
        if (read_proc(path, buf, sizeof buf) >= 0) {
            gp_dump_out_str(o, ",\"name\":");
            gp_dump_out_json_cstr(o, buf);
        }
    }
    /* /proc/PID/task/TID/syscall needs ptrace access, which a process always has to
     * itself (and `gpuprof dump`, another process, may lack under Yama). */
    snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
    if (read_proc(path, buf, sizeof buf) > 0) {
        const char *name = NULL;
        char num[32];
        if (strncmp(buf, "running", 7) == 0) {
            name = "running";
        } else {
            long nr = strtol(buf, NULL, 10);
            if (nr >= 0) {
                for (size_t i = 0; i < GP_ARRAY_LEN(syscall_names); i++) {
                    if (syscall_names[i].nr == nr) {
                        name = syscall_names[i].name;
                        break;
                    }
                }
                if (name == NULL) {
                    snprintf(num, sizeof num, "syscall %ld", nr);
                    name = num;
                }
            }
        }
        if (name != NULL) {
            gp_dump_out_str(o, ",\"syscall\":");
            gp_dump_out_json_cstr(o, name);
        }
    }
    snprintf(path, sizeof path, "/proc/self/task/%ld/wchan", tid);
    if (read_proc(path, buf, sizeof buf) > 0 && strcmp(buf, "0") != 0) {
        gp_dump_out_str(o, ",\"wchan\":");
        gp_dump_out_json_cstr(o, buf);
    }
}
