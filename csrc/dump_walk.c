/* Every Python thread's stack, read out of the interpreter's memory without the
 * GIL (dump_walk.h).
 *
 * Why it is done this way: `gpuprof dump` must answer while a thread holds the
 * GIL forever (a C loop, a blocked call that never releases it), so nothing here
 * may wait for the GIL, and the program's threads go on meanwhile, so any frame
 * or code object may be freed or changed while it is read. Every read of
 * interpreter memory therefore goes through process_vm_readv() on this process
 * (or, where that system call is refused, a write() of the memory into a pipe):
 * the kernel copies it, and an address that is no longer mapped gives EFAULT
 * instead of a crash. Nothing read is trusted: type pointers are compared with
 * the known type objects before an object is read as one, every count is capped,
 * every loop is bounded. A value changed meanwhile gives a wrong line at worst,
 * and the "problems" list says what could not be read.
 *
 * The layouts are CPython's internal ones (the _PyInterpreterFrame chain that
 * faulthandler walks, Include/internal/pycore_frame.h) for 3.11, 3.12 and 3.13,
 * taken from the headers of the Python this is built for. Other versions build a
 * stub that says so (gp_dump_walk_unsupported).
 *
 * The C call a thread is in: an armed process runs no profile hook, so nothing
 * records C calls. Instead, when the innermost frame's current instruction is a
 * call (CALL, PRECALL, CALL_KW, CALL_FUNCTION_EX) or a `with` (BEFORE_WITH), the
 * thread is inside C code called from there: a Python callee would have a frame
 * of its own. The bytecode before that instruction says what was called as the
 * source spells it ("self.sock.recv"), when the arguments are plain names,
 * constants or attributes; the callable itself is then looked for on the frame's
 * value stack (a builtin function or method descriptor of that name), which gives
 * its qualified name ("_socket.socket.recv", "torch._C._cuda_synchronize"). */
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1 /* the frame, interpreter and GIL layouts are internal */
#include <Python.h>

#include "dump_walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define GP_DUMP_WALKS 1
#include "internal/pycore_frame.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_moduleobject.h"
#include "internal/pycore_runtime.h"
#else
#define GP_DUMP_WALKS 0
#endif

const char *const gp_dump_walk_op_names[GP_DUMP_OP_COUNT] = {
    "CALL",
    "PRECALL",
    "CALL_KW",
    "CALL_FUNCTION_EX",
    "BEFORE_WITH",
    "BEFORE_ASYNC_WITH",
    "LOAD_ATTR",
    "LOAD_METHOD",
    "LOAD_SUPER_ATTR",
    "LOAD_GLOBAL",
    "LOAD_NAME",
    "LOAD_FAST",
    "LOAD_FAST_CHECK",
    "LOAD_FAST_AND_CLEAR",
    "LOAD_FAST_LOAD_FAST",
    "LOAD_DEREF",
    "LOAD_CLOSURE",
    "LOAD_CONST",
    "PUSH_NULL",
    "KW_NAMES",
    "EXTENDED_ARG",
    "BUILD_LIST",
    "BUILD_TUPLE",
    "BUILD_SET",
    "BUILD_STRING",
    "BUILD_MAP",
    "BINARY_OP",
    "BINARY_SUBSCR",
    "COMPARE_OP",
    "CONTAINS_OP",
    "IS_OP",
    "UNARY_NEGATIVE",
    "UNARY_NOT",
    "UNARY_INVERT",
    "TO_BOOL",
};

/* -- output ------------------------------------------------------------------------------ */
#define OUT_CAP ((size_t)16 << 20) /* one dump never needs more; past it, output stops */

static void
out_bytes(GpDumpOut *o, const char *s, size_t n)
{
    if (o->full)
        return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->n + n + 1)
            cap *= 2;
        char *p = cap <= OUT_CAP ? realloc(o->p, cap) : NULL;
        if (p == NULL) {
            o->full = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = '\0';
}

void
gp_dump_walk_out_str(GpDumpOut *o, const char *s)
{
    out_bytes(o, s, strlen(s));
}

/* One code point of a JSON string body: printable ASCII as itself, the rest as
 * \uXXXX escapes (surrogate pairs above U+FFFF), so the output is pure ASCII. */
static void
out_codepoint(GpDumpOut *o, uint32_t c)
{
    char buf[16];
    if (c == '"' || c == '\\') {
        buf[0] = '\\';
        buf[1] = (char)c;
        out_bytes(o, buf, 2);
    } else if (c >= 0x20 && c < 0x7f) {
        buf[0] = (char)c;
        out_bytes(o, buf, 1);
    } else if (c > 0xffff && c <= 0x10ffff) {
        c -= 0x10000;
        int k =
            snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
        out_bytes(o, buf, (size_t)k);
    } else {
        int k = snprintf(buf, sizeof buf, "\\u%04x", c > 0x10ffff ? 0xfffd : c);
        out_bytes(o, buf, (size_t)k);
    }
}

/* UTF-8 bytes (possibly invalid: each bad byte becomes U+FFFD) as a JSON string. */
static void
out_json_utf8(GpDumpOut *o, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    out_bytes(o, "\"", 1);
    size_t i = 0;
    while (i < n) {
        uint32_t c = p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) {
            out_codepoint(o, 0xfffd);
            i++;
            continue;
        }
        if (len > 1) {
            c &= 0xff >> (len + 1);
            for (size_t k = 1; k < len; k++) {
                if ((p[i + k] & 0xc0) != 0x80) {
                    len = 0;
                    break;
                }
                c = (c << 6) | (p[i + k] & 0x3f);
            }
            if (len == 0) {
                out_codepoint(o, 0xfffd);
                i++;
                continue;
            }
        }
        out_codepoint(o, c);
        i += len;
    }
    out_bytes(o, "\"", 1);
}

static void
out_json_cstr(GpDumpOut *o, const char *s)
{
    if (s == NULL)
        gp_dump_walk_out_str(o, "null");
    else
        out_json_utf8(o, s, strlen(s));
}

void
gp_dump_walk_out_free(GpDumpOut *o)
{
    free(o->p);
    o->p = NULL;
    o->n = o->cap = 0;
    o->full = 0;
}

#if GP_DUMP_WALKS

static void
out_u64(GpDumpOut *o, uint64_t v)
{
    char buf[24];
    int k = snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    out_bytes(o, buf, (size_t)k);
}

static void
out_i64(GpDumpOut *o, int64_t v)
{
    char buf[24];
    int k = snprintf(buf, sizeof buf, "%lld", (long long)v);
    out_bytes(o, buf, (size_t)k);
}

/* -- what /proc says of a thread (needs no interpreter memory) -------------------------------- */
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

/* ,"state":"S","syscall":"futex","wchan":"..." for one thread of this process. */
static void
out_os_state(GpDumpOut *o, long tid, int with_name)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    if (read_proc(path, buf, sizeof buf) > 0) {
        char *close_paren = strrchr(buf, ')');
        if (close_paren != NULL && close_paren[1] == ' ' && close_paren[2] != '\0') {
            char state[2] = {close_paren[2], '\0'};
            gp_dump_walk_out_str(o, ",\"state\":");
            out_json_cstr(o, state);
        }
    }
    if (with_name) {
        snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
        if (read_proc(path, buf, sizeof buf) >= 0) {
            gp_dump_walk_out_str(o, ",\"name\":");
            out_json_cstr(o, buf);
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
            gp_dump_walk_out_str(o, ",\"syscall\":");
            out_json_cstr(o, name);
        }
    }
    snprintf(path, sizeof path, "/proc/self/task/%ld/wchan", tid);
    if (read_proc(path, buf, sizeof buf) > 0 && strcmp(buf, "0") != 0) {
        gp_dump_walk_out_str(o, ",\"wchan\":");
        out_json_cstr(o, buf);
    }
}

const char *
gp_dump_walk_unsupported(void)
{
    return NULL;
}

/* -- reading memory that may change or go away ---------------------------------------------- */
#define MAX_THREADS 1024
#define MAX_FRAMES 256
#define MAX_CHARS 400
#define MAX_CODE_UNITS ((Py_ssize_t)1 << 16)
#define MAX_LINETABLE ((Py_ssize_t)1 << 20)
#define MAX_STACK 4096
#define RING 64
#define MAX_PROBLEMS 16

/* One walk's state: on the stack of the thread that walks, owned by it. */
typedef struct Walk {
    int mode;    /* 0 process_vm_readv, 1 pipe (process_vm_readv refused) */
    int pipe[2]; /* mode 1 */
    pid_t pid;
    const GpDumpTables *t;
    GpDumpOut *o;
    char problems[MAX_PROBLEMS][160];
    int nproblems;
    long tids[MAX_THREADS]; /* native ids of the Python threads, for the native list */
    int ntids;
} Walk;

static void problem(Walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
problem(Walk *w, const char *fmt, ...)
{
    if (w->nproblems < MAX_PROBLEMS) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->problems[w->nproblems], sizeof w->problems[0], fmt, ap);
        va_end(ap);
    }
    w->nproblems++;
}

static int
read_pipe(Walk *w, uintptr_t addr, void *dst, size_t n)
{
    char *d = dst;
    while (n > 0) {
        size_t k = n < 4096 ? n : 4096;
        ssize_t put = write(w->pipe[1], (const void *)addr, k);
        if (put != (ssize_t)k) {
            char sink[4096];
            while (put > 0 && read(w->pipe[0], sink, (size_t)put) > 0)
                put = 0; /* drain what did go in */
            return -1;
        }
        if (read(w->pipe[0], d, k) != (ssize_t)k)
            return -1;
        d += k;
        addr += k;
        n -= k;
    }
    return 0;
}

/* Copy n bytes at addr of this process into dst: 0, or -1 if any of it is not
 * mapped (or the copy was refused). */
static int
rd(Walk *w, uintptr_t addr, void *dst, size_t n)
{
    if (addr < 4096 || addr + n < addr)
        return -1;
    if (n == 0)
        return 0;
    if (w->mode == 0) {
        struct iovec local = {dst, n}, remote = {(void *)addr, n};
        ssize_t got = process_vm_readv(w->pid, &local, 1, &remote, 1, 0);
        if (got == (ssize_t)n)
            return 0;
        if (got >= 0 || errno == EFAULT || errno == ESRCH)
            return -1;
        /* ENOSYS, EPERM (a seccomp filter): copy through a pipe instead */
        if (pipe2(w->pipe, O_CLOEXEC | O_NONBLOCK) != 0)
            return -1;
        w->mode = 1;
    }
    return read_pipe(w, addr, dst, n);
}

static int
rd_ptr(Walk *w, uintptr_t addr, uintptr_t *v)
{
    return rd(w, addr, v, sizeof *v);
}

static uintptr_t
type_of(Walk *w, uintptr_t obj)
{
    uintptr_t t = 0;
    if (rd_ptr(w, obj + offsetof(PyObject, ob_type), &t) != 0)
        return 0;
    return t;
}

/* A NUL-terminated C string at addr, at most cap-1 bytes, read in pieces that
 * never cross a page that the string does not reach. 0, or -1. */
static int
rd_cstr(Walk *w, uintptr_t addr, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        uintptr_t at = addr + n;
        size_t page_left = 4096 - (at & 4095);
        size_t k = cap - 1 - n < page_left ? cap - 1 - n : page_left;
        if (rd(w, at, buf + n, k) != 0)
            return -1;
        void *nul = memchr(buf + n, '\0', k);
        if (nul != NULL)
            return 0;
        n += k;
    }
    buf[cap - 1] = '\0';
    return 0;
}

/* The str object at addr as a JSON string. 0, or -1 with nothing written (not a
 * str, not compact, or unreadable). */
static int
out_str_obj(Walk *w, uintptr_t addr)
{
    PyASCIIObject a;
    if (addr == 0 || rd(w, addr, &a, sizeof a) != 0 ||
        (uintptr_t)a.ob_base.ob_type != (uintptr_t)&PyUnicode_Type || !a.state.compact ||
        a.length < 0)
        return -1;
    unsigned kind = a.state.kind;
    if (kind != 1 && kind != 2 && kind != 4)
        return -1;
    Py_ssize_t len = a.length < MAX_CHARS ? a.length : MAX_CHARS;
    uintptr_t data =
        addr + (a.state.ascii ? sizeof(PyASCIIObject) : sizeof(PyCompactUnicodeObject));
    unsigned char buf[MAX_CHARS * 4];
    if (rd(w, data, buf, (size_t)len * kind) != 0)
        return -1;
    out_bytes(w->o, "\"", 1);
    for (Py_ssize_t i = 0; i < len; i++) {
        uint32_t c;
        if (kind == 1)
            c = buf[i];
        else if (kind == 2)
            c = ((uint16_t *)(void *)buf)[i];
        else
            c = ((uint32_t *)(void *)buf)[i];
        out_codepoint(w->o, c);
    }
    if (a.length > len)
        gp_dump_walk_out_str(w->o, "...");
    out_bytes(w->o, "\"", 1);
    return 0;
}

/* The str at addr into buf as UTF-8 (ASCII only: others become '?'), for names
 * that are compared or joined. 0, or -1. */
static int
str_obj_ascii(Walk *w, uintptr_t addr, char *buf, size_t cap)
{
    PyASCIIObject a;
    if (addr == 0 || rd(w, addr, &a, sizeof a) != 0 ||
        (uintptr_t)a.ob_base.ob_type != (uintptr_t)&PyUnicode_Type || !a.state.compact ||
        a.length < 0 || (size_t)a.length >= cap)
        return -1;
    unsigned kind = a.state.kind;
    if (kind != 1 && kind != 2 && kind != 4)
        return -1;
    uintptr_t data =
        addr + (a.state.ascii ? sizeof(PyASCIIObject) : sizeof(PyCompactUnicodeObject));
    unsigned char raw[256 * 4];
    if ((size_t)a.length > 256 || rd(w, data, raw, (size_t)a.length * kind) != 0)
        return -1;
    for (Py_ssize_t i = 0; i < a.length; i++) {
        uint32_t c = kind == 1   ? raw[i]
                     : kind == 2 ? ((uint16_t *)(void *)raw)[i]
                                 : ((uint32_t *)(void *)raw)[i];
        buf[i] = c < 0x80 ? (char)c : '?';
    }
    buf[a.length] = '\0';
    return 0;
}

/* Item i of the tuple at addr (a borrowed pointer read out of it), or 0. */
static uintptr_t
tuple_item(Walk *w, uintptr_t tuple, uint32_t i)
{
    PyVarObject head;
    if (tuple == 0 || rd(w, tuple, &head, sizeof head) != 0 ||
        (uintptr_t)head.ob_base.ob_type != (uintptr_t)&PyTuple_Type || i >= (uint64_t)head.ob_size)
        return 0;
    uintptr_t item = 0;
    rd_ptr(w, tuple + offsetof(PyTupleObject, ob_item) + (uintptr_t)i * sizeof(PyObject *), &item);
    return item;
}

/* -- line numbers (the location table of 3.11+, Objects/locations.md) --------------------- */
static unsigned
lt_varint(const uint8_t *t, size_t n, size_t *j)
{
    unsigned v = 0, shift = 0;
    uint8_t b;
    do {
        if (*j >= n)
            return v;
        b = t[(*j)++];
        v |= (unsigned)(b & 63) << shift;
        shift += 6;
    } while ((b & 64) && shift < 30);
    return v;
}

/* The line of code unit `unit`, or -1 (no line, or a malformed table). Each entry
 * starts with a byte whose top bit is set: 4 bits of kind, 3 of length - 1 in
 * code units; the kind says how the line changes (15: no line; 14 and 13: a
 * signed varint follows; 10-12: by kind - 10; below 10: not). */
static int
line_at(const uint8_t *t, size_t n, int first_line, int unit)
{
    int line = first_line, addr = 0;
    size_t i = 0;
    while (i < n) {
        uint8_t b = t[i];
        if (!(b & 0x80))
            return -1;
        int kind = (b >> 3) & 15, len = (b & 7) + 1, delta = 0;
        size_t j = i + 1;
        if (kind == 14 || kind == 13) {
            unsigned u = lt_varint(t, n, &j);
            delta = (u & 1) ? -(int)(u >> 1) : (int)(u >> 1);
        } else if (kind >= 10 && kind <= 12) {
            delta = kind - 10;
        }
        line += delta;
        if (unit < addr + len)
            return kind == 15 ? -1 : line;
        addr += len;
        i = j;
        while (i < n && !(t[i] & 0x80))
            i++;
    }
    return -1;
}

static int
code_line(Walk *w, const PyCodeObject *c, int unit)
{
    PyVarObject head;
    uintptr_t lt = (uintptr_t)c->co_linetable;
    if (rd(w, lt, &head, sizeof head) != 0 ||
        (uintptr_t)head.ob_base.ob_type != (uintptr_t)&PyBytes_Type || head.ob_size < 0 ||
        head.ob_size > MAX_LINETABLE)
        return -1;
    uint8_t *t = malloc((size_t)head.ob_size + 1);
    if (t == NULL)
        return -1;
    int line = -1;
    if (rd(w, lt + offsetof(PyBytesObject, ob_sval), t, (size_t)head.ob_size) == 0)
        line = line_at(t, (size_t)head.ob_size, c->co_firstlineno, unit);
    free(t);
    return line;
}

/* -- the C call of the innermost frame ------------------------------------------------------ */
typedef struct Ins {
    int32_t at; /* code unit index */
    int16_t op; /* base opcode */
    uint32_t arg;
} Ins;

static int
is_op(const Walk *w, const Ins *in, GpDumpOp which)
{
    return w->t->op[which] >= 0 && in->op == w->t->op[which];
}

/* LOAD_ATTR's method form (3.12+: the low bit of its argument) pushes two values. */
static int
attr_is_method(const Walk *w, const Ins *in)
{
#if PY_VERSION_HEX >= 0x030C0000
    return is_op(w, in, GP_DUMP_OP_LOAD_ATTR) && (in->arg & 1);
#else
    return is_op(w, in, GP_DUMP_OP_LOAD_METHOD);
#endif
}

static uint32_t
attr_name_index(const Walk *w, const Ins *in)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (is_op(w, in, GP_DUMP_OP_LOAD_ATTR))
        return in->arg >> 1;
#else
    (void)w;
#endif
    return in->arg;
}

static int
is_local_load(const Walk *w, const Ins *in)
{
    return is_op(w, in, GP_DUMP_OP_LOAD_FAST) || is_op(w, in, GP_DUMP_OP_LOAD_FAST_CHECK) ||
           is_op(w, in, GP_DUMP_OP_LOAD_FAST_AND_CLEAR);
}

/* A load that pushes exactly one value. */
static int
is_single_load(const Walk *w, const Ins *in)
{
    if (is_op(w, in, GP_DUMP_OP_LOAD_GLOBAL))
        return !(in->arg & 1); /* the low bit also pushes NULL */
    return is_local_load(w, in) || is_op(w, in, GP_DUMP_OP_LOAD_CONST) ||
           is_op(w, in, GP_DUMP_OP_LOAD_DEREF) || is_op(w, in, GP_DUMP_OP_LOAD_CLOSURE) ||
           is_op(w, in, GP_DUMP_OP_LOAD_NAME);
}

static int
is_plain_attr(const Walk *w, const Ins *in)
{
    return is_op(w, in, GP_DUMP_OP_LOAD_ATTR) && !attr_is_method(w, in);
}

/* The backward walk over the values a call's arguments are made of: each
 * function takes the position of a value's last instruction and returns the
 * position before its first, or NOPE where the instructions are anything else
 * (a comprehension, a conditional: then the callee is not named). */
#define NOPE (-2)
#define MAX_NESTING 8

static int skip_value(const Walk *w, const Ins *ins, int pos, int depth);

static int
skip_values(const Walk *w, const Ins *ins, int pos, int count, int depth)
{
    while (count > 0) {
        if (pos < 0)
            return NOPE;
        if (is_op(w, &ins[pos], GP_DUMP_OP_LOAD_FAST_LOAD_FAST) && count >= 2) {
            pos--; /* 3.13: two locals in one instruction */
            count -= 2;
            continue;
        }
        pos = skip_value(w, ins, pos, depth);
        if (pos == NOPE)
            return NOPE;
        count--;
    }
    return pos;
}

static int
is_call_op(const Walk *w, const Ins *in)
{
    return is_op(w, in, GP_DUMP_OP_CALL) || is_op(w, in, GP_DUMP_OP_PRECALL) ||
           is_op(w, in, GP_DUMP_OP_CALL_KW) || is_op(w, in, GP_DUMP_OP_CALL_FUNCTION_EX);
}

/* From the call at ins[pos] back over its arguments: the position of the
 * callee's last instruction, or NOPE. *nulled: a NULL pushed after the callee
 * (3.13) was stepped over. */
static int
call_callee_end(const Walk *w, const Ins *ins, int pos, int depth, int *nulled)
{
    const Ins *at = &ins[pos];
    int nargs = (int)at->arg;
    pos--;
    if (is_op(w, at, GP_DUMP_OP_CALL) && pos >= 0 && is_op(w, &ins[pos], GP_DUMP_OP_PRECALL))
        pos--; /* 3.11: PRECALL n; CALL n */
    if (pos >= 0 && is_op(w, &ins[pos], GP_DUMP_OP_KW_NAMES))
        pos--; /* 3.11, 3.12: keyword names, no value */
    if (is_op(w, at, GP_DUMP_OP_CALL_KW))
        nargs += 1; /* 3.13: the keyword names tuple on top */
    if (is_op(w, at, GP_DUMP_OP_CALL_FUNCTION_EX))
        nargs = 1 + (int)(at->arg & 1); /* the *args tuple, and **kwargs */
    pos = skip_values(w, ins, pos, nargs, depth);
    *nulled = 0;
    if (pos >= 0 && is_op(w, &ins[pos], GP_DUMP_OP_PUSH_NULL)) {
        pos--;
        *nulled = 1;
    }
    return pos >= 0 ? pos : NOPE;
}

static int
skip_value(const Walk *w, const Ins *ins, int pos, int depth)
{
    if (pos < 0 || depth > MAX_NESTING)
        return NOPE;
    const Ins *in = &ins[pos];
    if (is_single_load(w, in))
        return pos - 1;
    if (is_plain_attr(w, in) || is_op(w, in, GP_DUMP_OP_UNARY_NEGATIVE) ||
        is_op(w, in, GP_DUMP_OP_UNARY_NOT) || is_op(w, in, GP_DUMP_OP_UNARY_INVERT) ||
        is_op(w, in, GP_DUMP_OP_TO_BOOL))
        return skip_value(w, ins, pos - 1, depth + 1);
    if (is_op(w, in, GP_DUMP_OP_BUILD_LIST) || is_op(w, in, GP_DUMP_OP_BUILD_TUPLE) ||
        is_op(w, in, GP_DUMP_OP_BUILD_SET) || is_op(w, in, GP_DUMP_OP_BUILD_STRING))
        return in->arg > 64 ? NOPE : skip_values(w, ins, pos - 1, (int)in->arg, depth + 1);
    if (is_op(w, in, GP_DUMP_OP_BUILD_MAP))
        return in->arg > 32 ? NOPE : skip_values(w, ins, pos - 1, 2 * (int)in->arg, depth + 1);
    if (is_op(w, in, GP_DUMP_OP_BINARY_OP) || is_op(w, in, GP_DUMP_OP_BINARY_SUBSCR) ||
        is_op(w, in, GP_DUMP_OP_COMPARE_OP) || is_op(w, in, GP_DUMP_OP_CONTAINS_OP) ||
        is_op(w, in, GP_DUMP_OP_IS_OP))
        return skip_values(w, ins, pos - 1, 2, depth + 1);
    if (is_call_op(w, in)) { /* a call's result as an argument */
        int nulled;
        int p = call_callee_end(w, ins, pos, depth + 1, &nulled);
        if (p == NOPE)
            return NOPE;
        if (attr_is_method(w, &ins[p]))
            return skip_value(w, ins, p - 1, depth + 1);
        if (is_op(w, &ins[p], GP_DUMP_OP_LOAD_GLOBAL) && (ins[p].arg & 1))
            return p - 1;
        p = skip_value(w, ins, p, depth + 1);
        if (p >= 0 && !nulled && is_op(w, &ins[p], GP_DUMP_OP_PUSH_NULL))
            p--; /* 3.11, 3.12 push the NULL before the callee */
        return p;
    }
    return NOPE;
}

/* What an expression ending at ins[end] loads: root (the first instruction)
 * and the attribute names after it. */
typedef struct Expr {
    int root;     /* index into ins, or -1 */
    int nattrs;
    int attrs[8]; /* indexes into ins, in source order */
} Expr;

/* The callee's expression, ending at ins[pos]: attribute loads (the last one may
 * be a method load) back to a root load. 0, or -1. */
static int
parse_expr(const Walk *w, const Ins *ins, int pos, Expr *e, int allow_method)
{
    int idx[8], n = 0;
    while (pos >= 0 && (is_plain_attr(w, &ins[pos]) ||
                        (allow_method && n == 0 && attr_is_method(w, &ins[pos])))) {
        if (n == 8)
            return -1;
        idx[n++] = pos--;
    }
    if (pos < 0)
        return -1;
    const Ins *r = &ins[pos];
    if (!(is_single_load(w, r) || is_op(w, r, GP_DUMP_OP_LOAD_GLOBAL)))
        return -1;
    e->root = pos;
    e->nattrs = n;
    for (int k = 0; k < n; k++)
        e->attrs[k] = idx[n - 1 - k];
    return 0;
}

/* The name of what ins[i] loads, into buf: a global, local or attribute name.
 * 0, or -1 (a constant, or unreadable). */
static int
load_name(Walk *w, const PyCodeObject *c, const Ins *in, char *buf, size_t cap)
{
    uintptr_t names = (uintptr_t)c->co_names, s = 0;
    if (is_op(w, in, GP_DUMP_OP_LOAD_GLOBAL))
        s = tuple_item(w, names, in->arg >> 1);
    else if (is_op(w, in, GP_DUMP_OP_LOAD_NAME))
        s = tuple_item(w, names, in->arg);
    else if (is_op(w, in, GP_DUMP_OP_LOAD_ATTR) || is_op(w, in, GP_DUMP_OP_LOAD_METHOD))
        s = tuple_item(w, names, attr_name_index(w, in));
    else if (is_op(w, in, GP_DUMP_OP_LOAD_SUPER_ATTR))
        s = tuple_item(w, names, in->arg >> 2); /* 3.12+: two flag bits */
    else if (is_local_load(w, in) || is_op(w, in, GP_DUMP_OP_LOAD_DEREF) ||
             is_op(w, in, GP_DUMP_OP_LOAD_CLOSURE))
        s = tuple_item(w, (uintptr_t)c->co_localsplusnames, in->arg);
    if (s == 0)
        return -1;
    return str_obj_ascii(w, s, buf, cap);
}

static int
type_name(Walk *w, uintptr_t type, char *buf, size_t cap)
{
    uintptr_t tp_name = 0;
    buf[0] = '\0';
    if (type == 0 || rd_ptr(w, type + offsetof(PyTypeObject, tp_name), &tp_name) != 0 ||
        rd_cstr(w, tp_name, buf, cap) != 0) {
        buf[0] = '\0';
        return -1;
    }
    return 0;
}

/* The type in the MRO of `type` whose method table holds the method `ml`: the
 * class that defines a builtin method bound to an instance of a subclass
 * (super().recv() on a socket.socket subclass is _socket.socket's recv). 0 if none
 * does (a method table made at run time, as pybind11's). */
static uintptr_t
defining_type(Walk *w, uintptr_t type, uintptr_t ml)
{
    uintptr_t mro = 0;
    if (rd_ptr(w, type + offsetof(PyTypeObject, tp_mro), &mro) != 0)
        return 0;
    for (uint32_t i = 0; i < 64; i++) {
        uintptr_t t = tuple_item(w, mro, i), methods = 0;
        if (t == 0)
            return 0;
        if (rd_ptr(w, t + offsetof(PyTypeObject, tp_methods), &methods) != 0 || methods == 0)
            continue;
        for (uintptr_t k = 0; k < 1024; k++) {
            uintptr_t entry = methods + k * sizeof(PyMethodDef), name = 0;
            if (rd_ptr(w, entry + offsetof(PyMethodDef, ml_name), &name) != 0 || name == 0)
                break;
            if (entry == ml)
                return t;
        }
    }
    return 0;
}

/* A C callable's name and what it belongs to ("_thread.lock" + "acquire"), when
 * obj is a builtin function, a method descriptor, a slot wrapper or a bound
 * method of one. bound_self: the value after it on the stack (the instance, for a
 * method the interpreter has unpacked), or 0. 0, or -1. */
static int
describe_callable(Walk *w, uintptr_t obj, uintptr_t bound_self, char *owner, size_t owner_cap,
                  char *name, size_t cap, int depth)
{
    uintptr_t t = type_of(w, obj), ml = 0, owner_type = 0;
    owner[0] = '\0';
    if (t == (uintptr_t)&PyMethod_Type && depth == 0) {
        PyMethodObject m;
        if (rd(w, obj, &m, sizeof m) != 0)
            return -1;
        return describe_callable(w, (uintptr_t)m.im_func, (uintptr_t)m.im_self, owner, owner_cap,
                                 name, cap, 1);
    }
    if (t == (uintptr_t)&PyCFunction_Type || t == (uintptr_t)&PyCMethod_Type) {
        PyCFunctionObject f;
        if (rd(w, obj, &f, sizeof f) != 0)
            return -1;
        ml = (uintptr_t)f.m_ml;
        uintptr_t self = (uintptr_t)f.m_self;
        uintptr_t self_type = self ? type_of(w, self) : 0;
        char self_name[64];
        type_name(w, self_type, self_name, sizeof self_name);
        if (self == 0 || self_type == (uintptr_t)&PyModule_Type) {
            if (str_obj_ascii(w, (uintptr_t)f.m_module, owner, owner_cap) != 0 && self != 0) {
                uintptr_t md = 0;
                if (rd_ptr(w, self + offsetof(PyModuleObject, md_name), &md) == 0)
                    str_obj_ascii(w, md, owner, owner_cap);
            }
        } else if (strncmp(self_name, "pybind11_", 9) == 0) {
            /* pybind11 binds each function to a record of its own: the class is that
             * of the instance it is called on, else the module is what is known */
            if (bound_self == 0 || type_name(w, type_of(w, bound_self), owner, owner_cap) != 0)
                str_obj_ascii(w, (uintptr_t)f.m_module, owner, owner_cap);
        } else {
            owner_type = defining_type(w, self_type, ml);
            if (owner_type == 0)
                owner_type = self_type;
        }
    } else if (t == (uintptr_t)&PyMethodDescr_Type || t == (uintptr_t)&PyClassMethodDescr_Type) {
        PyMethodDescrObject d;
        if (rd(w, obj, &d, sizeof d) != 0)
            return -1;
        ml = (uintptr_t)d.d_method;
        owner_type = (uintptr_t)d.d_common.d_type;
    } else if (t == (uintptr_t)&PyWrapperDescr_Type) {
        PyWrapperDescrObject d;
        uintptr_t base_name = 0;
        if (rd(w, obj, &d, sizeof d) != 0 ||
            rd_ptr(w, (uintptr_t)d.d_base + offsetof(struct wrapperbase, name), &base_name) != 0 ||
            rd_cstr(w, base_name, name, cap) != 0)
            return -1;
        owner_type = (uintptr_t)d.d_common.d_type;
    } else {
        return -1;
    }
    if (ml != 0) {
        uintptr_t ml_name = 0;
        if (rd_ptr(w, ml + offsetof(PyMethodDef, ml_name), &ml_name) != 0 ||
            rd_cstr(w, ml_name, name, cap) != 0)
            return -1;
    }
    if (owner_type != 0)
        type_name(w, owner_type, owner, owner_cap);
    return name[0] ? 0 : -1;
}

static void
out_qualified(GpDumpOut *o, const char *owner, const char *name)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s%s", owner, owner[0] ? "." : "", name);
    out_json_cstr(o, buf);
}

/* ,"call":{...} for the innermost frame when its current instruction calls into
 * C; nothing when it does not (or its bytecode cannot be decoded). */
static void
out_call(Walk *w, uintptr_t frame, const PyCodeObject *c, uintptr_t code, int lasti)
{
    Py_ssize_t units = c->ob_base.ob_size;
    if (!w->t->ready || units <= 0 || units > MAX_CODE_UNITS || lasti < 0 || lasti >= units)
        return;
    uint8_t *bc = malloc((size_t)units * 2);
    if (bc == NULL)
        return;
    Ins ins[RING];
    int nins = 0, found = -1;
    if (rd(w, code + offsetof(PyCodeObject, co_code_adaptive), bc, (size_t)units * 2) != 0)
        goto done;
    /* Forward from the start: the inline caches after an instruction hold data
     * that could read as opcodes, so only a forward walk finds where each
     * instruction starts. The last RING instructions are kept. */
    uint32_t ext = 0;
    for (int32_t i = 0; i < units;) {
        uint8_t raw = bc[2 * i], arg = bc[2 * i + 1];
        uint8_t caches = w->t->caches[raw];
        if (caches == GP_DUMP_NO_DECODE)
            goto done; /* INSTRUMENTED_LINE and the like: the opcode is stored elsewhere */
        int16_t base = w->t->deopt[raw];
        uint32_t full = ext | arg;
        int32_t len = 1 + caches;
        if (base == w->t->op[GP_DUMP_OP_EXTENDED_ARG]) {
            ext = full << 8;
        } else {
            ext = 0;
            if (nins == RING) {
                memmove(ins, ins + 1, sizeof ins[0] * (RING - 1));
                nins--;
            }
            ins[nins++] = (Ins){i, base, full};
            if (lasti < i + len) {
                found = nins - 1;
                break;
            }
        }
        i += len;
    }
    if (found < 0)
        goto done;
    const Ins *at = &ins[found];
    int is_call = is_call_op(w, at);
    int is_with =
        is_op(w, at, GP_DUMP_OP_BEFORE_WITH) || is_op(w, at, GP_DUMP_OP_BEFORE_ASYNC_WITH);
    if (!is_call && !is_with)
        goto done;
    GpDumpOut *o = w->o;
    gp_dump_walk_out_str(o, ",\"call\":{\"kind\":");
    gp_dump_walk_out_str(o, is_call ? "\"call\"" : "\"with\"");

    /* the expression that gave the callable (or the context manager) */
    int pos = found - 1, ok = 1, nulled = 0;
    if (is_call) {
        pos = call_callee_end(w, ins, found, 0, &nulled);
        ok = pos >= 0;
    }
    Expr e = {-1, 0, {0}};
    char text[512] = "", part[128], want[128] = "";
    if (ok && parse_expr(w, ins, pos, &e, is_call) != 0) {
        ok = 0;
        /* What the attribute was loaded from is no plain name (super(), a call's
         * result): the attribute's name alone still finds the callable. */
        const Ins *last = &ins[pos];
        if (is_call &&
            (is_op(w, last, GP_DUMP_OP_LOAD_ATTR) || is_op(w, last, GP_DUMP_OP_LOAD_METHOD) ||
             is_op(w, last, GP_DUMP_OP_LOAD_SUPER_ATTR)) &&
            load_name(w, c, last, want, sizeof want) == 0) {
            snprintf(text, sizeof text, "%s.%s",
                     is_op(w, last, GP_DUMP_OP_LOAD_SUPER_ATTR) ? "super()" : "(...)", want);
            gp_dump_walk_out_str(o, ",\"expr\":");
            out_json_cstr(o, text);
        }
    }
    if (ok) {
        size_t n = 0;
        if (load_name(w, c, &ins[e.root], part, sizeof part) == 0) {
            n += (size_t)snprintf(text, sizeof text, "%s", part);
        } else {
            n += (size_t)snprintf(text, sizeof text, "%s", "<constant>");
            part[0] = '\0';
        }
        snprintf(want, sizeof want, "%s", part);
        for (int k = 0; k < e.nattrs && n < sizeof text; k++) {
            if (load_name(w, c, &ins[e.attrs[k]], part, sizeof part) != 0)
                snprintf(part, sizeof part, "%s", "?");
            if (n >= sizeof text)
                break;
            n += (size_t)snprintf(text + n, sizeof text - n, ".%s", part);
            snprintf(want, sizeof want, "%s", part);
        }
        if (is_with && n < sizeof text)
            snprintf(text + n, sizeof text - n, "%s", ".__enter__");
        gp_dump_walk_out_str(o, ",\"expr\":");
        out_json_cstr(o, text);
    }

    /* The object itself: a local named directly is read out of the frame; else
     * the value stack is searched, from the top, for a C callable of that name.
     * Slots above the live top may hold stale pointers: a stale one that is a C
     * callable of the same name is, in practice, the same callable. */
    int nlocals = c->co_nlocalsplus, nstack = c->co_stacksize;
    if ((!ok && want[0] == '\0') || nlocals < 0 || nstack < 0 || nlocals + nstack > MAX_STACK)
        goto close;
    uintptr_t slots[MAX_STACK];
    uintptr_t base_addr = frame + offsetof(_PyInterpreterFrame, localsplus);
    if (rd(w, base_addr, slots, sizeof slots[0] * (size_t)(nlocals + nstack)) != 0)
        goto close;
    char owner[256], name[128];
    uintptr_t direct = 0;
    const Ins *root = ok ? &ins[e.root] : NULL;
    if (root != NULL && e.nattrs == 0 && root->arg < (uint32_t)nlocals) {
        if (is_local_load(w, root)) {
            direct = slots[root->arg];
        } else if (is_op(w, root, GP_DUMP_OP_LOAD_DEREF) &&
                   type_of(w, slots[root->arg]) == (uintptr_t)&PyCell_Type) {
            rd_ptr(w, slots[root->arg] + offsetof(PyCellObject, ob_ref), &direct);
        }
    }
    if (is_with) {
        if (direct != 0) {
            if (type_name(w, type_of(w, direct), owner, sizeof owner) == 0) {
                gp_dump_walk_out_str(o, ",\"callee\":");
                out_qualified(o, owner, "__enter__");
            }
        }
        goto close;
    }
    if (direct != 0 &&
        describe_callable(w, direct, 0, owner, sizeof owner, name, sizeof name, 0) == 0) {
        gp_dump_walk_out_str(o, ",\"callee\":");
        out_qualified(o, owner, name);
        goto close;
    }
    if (want[0] == '\0')
        goto close;
    for (int k = nlocals + nstack - 1; k >= nlocals; k--) {
        if (slots[k] == 0)
            continue;
        uintptr_t after = k + 1 < nlocals + nstack ? slots[k + 1] : 0;
        if (describe_callable(w, slots[k], after, owner, sizeof owner, name, sizeof name, 0) == 0 &&
            strcmp(name, want) == 0) {
            gp_dump_walk_out_str(o, ",\"callee\":");
            out_qualified(o, owner, name);
            break;
        }
    }
close:
    gp_dump_walk_out_str(o, "}");
done:
    free(bc);
}

/* -- frames and threads --------------------------------------------------------------------- */
static uintptr_t
frame_code(const _PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)f->f_executable;
#else
    return (uintptr_t)f->f_code;
#endif
}

static uintptr_t
frame_instr(const _PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)f->instr_ptr;
#else
    return (uintptr_t)f->prev_instr;
#endif
}

static int
frame_is_shim(const _PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030C0000
    return f->owner == FRAME_OWNED_BY_CSTACK; /* the C stack's entry frames (3.12+) */
#else
    (void)f;
    return 0;
#endif
}

static uintptr_t
thread_frame(Walk *w, const PyThreadState *ts)
{
#if PY_VERSION_HEX >= 0x030D0000
    (void)w;
    return (uintptr_t)ts->current_frame;
#else
    _PyCFrame cf;
    if (ts->cframe == NULL || rd(w, (uintptr_t)ts->cframe, &cf, sizeof cf) != 0)
        return 0;
    return (uintptr_t)cf.current_frame;
#endif
}

static void
out_frames(Walk *w, const PyThreadState *ts, unsigned long long ident)
{
    GpDumpOut *o = w->o;
    uintptr_t addr = thread_frame(w, ts);
    int n = 0, first = 1, visited = 0;
    gp_dump_walk_out_str(o, ",\"frames\":[");
    uintptr_t innermost = 0, innermost_code = 0;
    PyCodeObject innermost_c;
    int innermost_lasti = -1;
    while (addr != 0 && visited < 4 * MAX_FRAMES) {
        visited++;
        _PyInterpreterFrame f;
        if (rd(w, addr, &f, offsetof(_PyInterpreterFrame, localsplus)) != 0) {
            problem(w, "thread %llu: a frame at 0x%llx could not be read (it returned meanwhile)",
                    ident, (unsigned long long)addr);
            break;
        }
        uintptr_t next = (uintptr_t)f.previous;
        if (frame_is_shim(&f)) {
            addr = next;
            continue;
        }
        uintptr_t code = frame_code(&f);
        PyCodeObject c;
        if (rd(w, code, &c, sizeof c) != 0 ||
            (uintptr_t)c.ob_base.ob_base.ob_type != (uintptr_t)&PyCode_Type) {
            addr = next; /* 3.13 frames of no code object, or one freed meanwhile */
            continue;
        }
        uintptr_t start = code + offsetof(PyCodeObject, co_code_adaptive);
        intptr_t lasti =
            ((intptr_t)frame_instr(&f) - (intptr_t)start) / (intptr_t)sizeof(_Py_CODEUNIT);
        if (f.owner != FRAME_OWNED_BY_GENERATOR && lasti < c._co_firsttraceable) {
            addr = next; /* still being set up: the caller is where the thread is */
            continue;
        }
        if (n == MAX_FRAMES) {
            gp_dump_walk_out_str(o, "],\"frames_cut\":true");
            goto innermost_call;
        }
        gp_dump_walk_out_str(o, first ? "{\"file\":" : ",{\"file\":");
        first = 0;
        if (out_str_obj(w, (uintptr_t)c.co_filename) != 0)
            gp_dump_walk_out_str(o, "null");
        gp_dump_walk_out_str(o, ",\"line\":");
        out_i64(o, code_line(w, &c, (int)lasti));
        gp_dump_walk_out_str(o, ",\"func\":");
        if (out_str_obj(w, (uintptr_t)c.co_qualname) != 0 &&
            out_str_obj(w, (uintptr_t)c.co_name) != 0)
            gp_dump_walk_out_str(o, "null");
        gp_dump_walk_out_str(o, "}");
        if (n == 0) {
            innermost = addr;
            innermost_code = code;
            innermost_c = c;
            innermost_lasti = (int)lasti;
        }
        n++;
        addr = next;
    }
    gp_dump_walk_out_str(o, "]");
innermost_call:
    if (innermost != 0)
        out_call(w, innermost, &innermost_c, innermost_code, innermost_lasti);
}

static uintptr_t
gil_address(Walk *w, uintptr_t interp)
{
#if PY_VERSION_HEX >= 0x030C0000
    uintptr_t gil = 0;
    if (rd_ptr(w, interp + offsetof(PyInterpreterState, ceval.gil), &gil) != 0)
        return 0;
    return gil;
#else
    (void)w;
    (void)interp;
    return (uintptr_t)&_PyRuntime.ceval.gil;
#endif
}

static void
out_native(Walk *w, long skip_tid)
{
    GpDumpOut *o = w->o;
    gp_dump_walk_out_str(o, ",\"native\":[");
    DIR *d = opendir("/proc/self/task");
    int first = 1, count = 0;
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL && count < 4096) {
            char *end;
            long tid = strtol(e->d_name, &end, 10);
            if (e->d_name[0] == '.' || *end != '\0' || tid == skip_tid)
                continue;
            int python = 0;
            for (int i = 0; i < w->ntids && !python; i++)
                python = w->tids[i] == tid;
            if (python)
                continue;
            gp_dump_walk_out_str(o, first ? "{\"tid\":" : ",{\"tid\":");
            first = 0;
            out_i64(o, tid);
            out_os_state(o, tid, 1);
            gp_dump_walk_out_str(o, "}");
            count++;
        }
        closedir(d);
    }
    gp_dump_walk_out_str(o, "]");
}

/* The interpreter's thread states, newest first (malloc'ed; *n of them). A thread
 * that ends while the list is followed can leave a link to freed memory: a state
 * that cannot be read, that belongs to no interpreter of ours, or that comes round
 * again means the list changed, and it is followed again from its head (three
 * tries; then what was found, and a problem that says so). */
static uintptr_t *
collect_threads(Walk *w, uintptr_t interp, int *n, int *more)
{
    uintptr_t *states = malloc(sizeof(uintptr_t) * MAX_THREADS);
    *n = *more = 0;
    if (states == NULL) {
        problem(w, "out of memory for the thread list");
        return NULL;
    }
    int broken = 1;
    for (int attempt = 0; attempt < 3 && broken; attempt++) {
        uintptr_t addr = 0;
        broken = 0;
        *n = *more = 0;
        if (rd_ptr(w, interp + offsetof(PyInterpreterState, threads.head), &addr) != 0) {
            problem(w, "the interpreter's thread list could not be read");
            return states;
        }
        while (addr != 0) {
            PyThreadState ts;
            if (*n == MAX_THREADS) {
                *more = 1;
                break;
            }
            int seen = 0;
            for (int i = 0; i < *n && !seen; i++)
                seen = states[i] == addr;
            if (seen || rd(w, addr, &ts, sizeof ts) != 0 || (uintptr_t)ts.interp != interp) {
                broken = 1;
                break;
            }
            states[(*n)++] = addr;
            addr = (uintptr_t)ts.next;
        }
    }
    if (broken)
        problem(w, "threads started or ended while the dump was made: some may be missing");
    return states;
}

GpStatus
gp_dump_walk_threads(const GpDumpTables *tables, long skip_tid, GpDumpOut *out)
{
    Walk w;
    struct timespec t0, t1, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    clock_gettime(CLOCK_REALTIME, &now);
    memset(&w, 0, sizeof w);
    w.pipe[0] = w.pipe[1] = -1;
    w.pid = getpid();
    w.t = tables;
    w.o = out;

    gp_dump_walk_out_str(out, "{\"kind\":\"walk\",\"pid\":");
    out_i64(out, w.pid);
    gp_dump_walk_out_str(out, ",\"python\":\"" PY_VERSION "\",\"time\":");
    char when[48];
    snprintf(when, sizeof when, "%lld.%03ld", (long long)now.tv_sec, now.tv_nsec / 1000000);
    gp_dump_walk_out_str(out, when);

    /* PyInterpreterState_Main() only reads _PyRuntime: safe without the GIL */
    uintptr_t interp = (uintptr_t)PyInterpreterState_Main();
    uintptr_t gil = gil_address(&w, interp), holder = 0;
    int locked = -1;
    if (gil != 0) {
        uintptr_t h = 0;
        int l = 0;
        if (rd(&w, gil + offsetof(struct _gil_runtime_state, last_holder), &h, sizeof h) == 0 &&
            rd(&w, gil + offsetof(struct _gil_runtime_state, locked), &l, sizeof l) == 0) {
            locked = l != 0;
            holder = locked ? h : 0;
        }
    }
    gp_dump_walk_out_str(out, ",\"gil_locked\":");
    gp_dump_walk_out_str(out, locked < 0 ? "null" : locked ? "true" : "false");

    uintptr_t next_interp = 0;
    if (rd_ptr(&w, interp + offsetof(PyInterpreterState, next), &next_interp) == 0 &&
        next_interp != 0)
        problem(&w, "this process has subinterpreters; only the main one is shown");
    int nthreads = 0, more = 0;
    uintptr_t *states = collect_threads(&w, interp, &nthreads, &more);
    if (more)
        problem(&w, "more than %d threads: the rest are not shown", MAX_THREADS);
    gp_dump_walk_out_str(out, ",\"threads\":[");
    int shown = 0;
    for (int i = 0; i < nthreads; i++) {
        PyThreadState ts;
        if (rd(&w, states[i], &ts, sizeof ts) != 0 || (uintptr_t)ts.interp != interp) {
            problem(&w,
                    "a thread ended while the dump was made (its thread state at 0x%llx is gone)",
                    (unsigned long long)states[i]);
            continue;
        }
        unsigned long long ident = ts.thread_id;
        gp_dump_walk_out_str(out, shown ? ",{\"ident\":" : "{\"ident\":");
        out_u64(out, ident);
        gp_dump_walk_out_str(out, ",\"native_id\":");
        out_u64(out, ts.native_thread_id);
        gp_dump_walk_out_str(out, ",\"holds_gil\":");
        gp_dump_walk_out_str(out, holder != 0 && holder == states[i] ? "true" : "false");
        if (w.ntids < MAX_THREADS)
            w.tids[w.ntids++] = (long)ts.native_thread_id;
        out_frames(&w, &ts, ident);
        if (ts.native_thread_id != 0)
            out_os_state(out, (long)ts.native_thread_id, 0);
        gp_dump_walk_out_str(out, "}");
        shown++;
    }
    gp_dump_walk_out_str(out, "]");
    free(states);
    out_native(&w, skip_tid);

    gp_dump_walk_out_str(out, ",\"problems\":[");
    for (int i = 0; i < w.nproblems && i < MAX_PROBLEMS; i++) {
        if (i)
            gp_dump_walk_out_str(out, ",");
        out_json_cstr(out, w.problems[i]);
    }
    gp_dump_walk_out_str(out, "]");
    if (w.nproblems > MAX_PROBLEMS) {
        gp_dump_walk_out_str(out, ",\"problems_more\":");
        out_i64(out, w.nproblems - MAX_PROBLEMS);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gp_dump_walk_out_str(out, ",\"elapsed_us\":");
    out_i64(out, (t1.tv_sec - t0.tv_sec) * 1000000LL + (t1.tv_nsec - t0.tv_nsec) / 1000);
    gp_dump_walk_out_str(out, ",\"read_by\":");
    gp_dump_walk_out_str(out, w.mode == 0 ? "\"process_vm_readv\"" : "\"pipe\"");
    gp_dump_walk_out_str(out, "}");
    if (w.pipe[0] >= 0) {
        close(w.pipe[0]);
        close(w.pipe[1]);
    }
    return out->full ? GP_ERR_NOMEM : GP_OK;
}

#else /* not 3.11 to 3.13 with a GIL */

const char *
gp_dump_walk_unsupported(void)
{
    return "gpuprof dump reads the interpreter's frames as CPython 3.11, 3.12 and 3.13 "
           "(with the GIL) lay them out; this is CPython " PY_VERSION;
}

GpStatus
gp_dump_walk_threads(const GpDumpTables *tables, long skip_tid, GpDumpOut *out)
{
    (void)tables;
    (void)skip_tid;
    gp_dump_walk_out_str(out, "{\"kind\":\"walk\",\"unsupported\":");
    out_json_cstr(out, gp_dump_walk_unsupported());
    gp_dump_walk_out_str(out, "}");
    return out->full ? GP_ERR_NOMEM : GP_OK;
}

#endif
