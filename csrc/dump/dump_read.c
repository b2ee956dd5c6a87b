/* Reading this process's memory where it may change or go away (dump_read.h).
 *
 * The dump reads the interpreter's frames while the program's threads run on,
 * so any object may be freed or reused while it is read. Every read goes through
 * process_vm_readv() on this process (or, where a seccomp filter refuses that
 * system call, a write() of the memory into a pipe): the kernel copies it, and an
 * address no longer mapped gives EFAULT instead of a crash. It also keeps such
 * reads out of sight of AddressSanitizer, for which memory freed meanwhile is
 * poisoned. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dump_read.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_CHARS 400 /* of a str written out; longer ones end in "..." */

void
gp_dump_read_open(GpDumpReader *r)
{
    r->mode = 0;
    r->pipe[0] = r->pipe[1] = -1;
    r->pid = getpid();
}

void
gp_dump_read_close(GpDumpReader *r)
{
    if (r->pipe[0] >= 0) {
        close(r->pipe[0]);
        close(r->pipe[1]);
    }
    r->pipe[0] = r->pipe[1] = -1;
}

const char *
gp_dump_read_how(const GpDumpReader *r)
{
    return r->mode == 0 ? "process_vm_readv" : "pipe";
}

static int
read_pipe(GpDumpReader *r, uintptr_t addr, void *dst, size_t n)
{
    char *d = dst;
    while (n > 0) {
        size_t k = n < 4096 ? n : 4096;
        ssize_t put = write(r->pipe[1], (const void *)addr, k);
        if (put != (ssize_t)k) {
            char sink[4096];
            while (put > 0 && read(r->pipe[0], sink, (size_t)put) > 0)
                put = 0; /* drain what did go in */
            return -1;
        }
        if (read(r->pipe[0], d, k) != (ssize_t)k)
            return -1;
        d += k;
        addr += k;
        n -= k;
    }
    return 0;
}

int
gp_dump_read_bytes(GpDumpReader *r, uintptr_t addr, void *dst, size_t n)
{
    if (addr < 4096 || addr + n < addr)
        return -1;
    if (n == 0)
        return 0;
    if (r->mode == 0) {
        struct iovec local = {dst, n}, remote = {(void *)addr, n};
        ssize_t got = process_vm_readv(r->pid, &local, 1, &remote, 1, 0);
        if (got == (ssize_t)n)
            return 0;
        if (got >= 0 || errno == EFAULT || errno == ESRCH)
            return -1;
        /* ENOSYS, EPERM (a seccomp filter): copy through a pipe instead */
        if (pipe2(r->pipe, O_CLOEXEC | O_NONBLOCK) != 0)
            return -1;
        r->mode = 1;
    }
    return read_pipe(r, addr, dst, n);
}

int
gp_dump_read_ptr(GpDumpReader *r, uintptr_t addr, uintptr_t *v)
{
    return gp_dump_read_bytes(r, addr, v, sizeof *v);
}

uintptr_t
gp_dump_read_type(GpDumpReader *r, uintptr_t obj)
{
    uintptr_t t = 0;
    if (gp_dump_read_ptr(r, obj + offsetof(PyObject, ob_type), &t) != 0)
        return 0;
    return t;
}

int
gp_dump_read_cstr(GpDumpReader *r, uintptr_t addr, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        uintptr_t at = addr + n;
        size_t page_left = 4096 - (at & 4095);
        size_t k = cap - 1 - n < page_left ? cap - 1 - n : page_left;
        if (gp_dump_read_bytes(r, at, buf + n, k) != 0)
            return -1;
        void *nul = memchr(buf + n, '\0', k);
        if (nul != NULL)
            return 0;
        n += k;
    }
    buf[cap - 1] = '\0';
    return 0;
}

int
gp_dump_read_str_json(GpDumpReader *r, GpDumpOut *o, uintptr_t addr)
{
    PyASCIIObject a;
    if (addr == 0 || gp_dump_read_bytes(r, addr, &a, sizeof a) != 0 ||
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
    if (gp_dump_read_bytes(r, data, buf, (size_t)len * kind) != 0)
        return -1;
    gp_dump_out_bytes(o, "\"", 1);
    for (Py_ssize_t i = 0; i < len; i++) {
        uint32_t c;
        if (kind == 1)
            c = buf[i];
        else if (kind == 2)
            c = ((uint16_t *)(void *)buf)[i];
        else
            c = ((uint32_t *)(void *)buf)[i];
        gp_dump_out_codepoint(o, c);
    }
    if (a.length > len)
        gp_dump_out_str(o, "...");
    gp_dump_out_bytes(o, "\"", 1);
    return 0;
}

int
gp_dump_read_str_ascii(GpDumpReader *r, uintptr_t addr, char *buf, size_t cap)
{
    PyASCIIObject a;
    if (addr == 0 || gp_dump_read_bytes(r, addr, &a, sizeof a) != 0 ||
        (uintptr_t)a.ob_base.ob_type != (uintptr_t)&PyUnicode_Type || !a.state.compact ||
        a.length < 0 || (size_t)a.length >= cap)
        return -1;
    unsigned kind = a.state.kind;
    if (kind != 1 && kind != 2 && kind != 4)
        return -1;
    uintptr_t data =
        addr + (a.state.ascii ? sizeof(PyASCIIObject) : sizeof(PyCompactUnicodeObject));
    unsigned char raw[256 * 4];
    if ((size_t)a.length > 256 || gp_dump_read_bytes(r, data, raw, (size_t)a.length * kind) != 0)
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

uintptr_t
gp_dump_read_tuple_item(GpDumpReader *r, uintptr_t tuple, uint32_t i)
{
    PyVarObject head;
    if (tuple == 0 || gp_dump_read_bytes(r, tuple, &head, sizeof head) != 0 ||
        (uintptr_t)head.ob_base.ob_type != (uintptr_t)&PyTuple_Type || i >= (uint64_t)head.ob_size)
        return 0;
    uintptr_t item = 0;
    gp_dump_read_ptr(
        r, tuple + offsetof(PyTupleObject, ob_item) + (uintptr_t)i * sizeof(PyObject *), &item);
    return item;
}

int
gp_dump_read_type_name(GpDumpReader *r, uintptr_t type, char *buf, size_t cap)
{
    uintptr_t tp_name = 0;
    buf[0] = '\0';
    if (type == 0 || gp_dump_read_ptr(r, type + offsetof(PyTypeObject, tp_name), &tp_name) != 0 ||
        gp_dump_read_cstr(r, tp_name, buf, cap) != 0) {
        buf[0] = '\0';
        return -1;
    }
    return 0;
}
