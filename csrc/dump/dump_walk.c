/* Every Python thread's stack, read out of the interpreter's memory without the
 * GIL (dump_walk.h).
 *
 * Why it is done this way: `gpuprof dump` must answer while a thread holds the
 * GIL forever (a C loop, a blocked call that never releases it), so nothing here
 * may wait for the GIL, and the program's threads go on meanwhile, so any frame
 * or code object may be freed or changed while it is read. Every read goes
 * through dump_read.h, and nothing read is trusted: type pointers are compared
 * with the known type objects before an object is read as one, every count is
 * capped, every loop is bounded. A value changed meanwhile gives a wrong line at
 * worst, and the "problems" list says what could not be read.
 *
 * The layouts are CPython's internal ones (the _PyInterpreterFrame chain that
 * faulthandler walks, Include/internal/pycore_frame.h) for 3.11, 3.12 and 3.13,
 * taken from the headers of the Python this is built for. Other versions build a
 * stub that says so (gp_dump_walk_unsupported). */
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1 /* the frame, interpreter and GIL layouts are internal */
#include <Python.h>

#include "dump_walk.h"

#include "dump_proc.h"
#include "dump_read.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if GP_DUMP_WALKS
#include "internal/pycore_frame.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"

#define MAX_THREADS 1024
#define MAX_FRAMES 256
#define MAX_LINETABLE ((Py_ssize_t)1 << 20)
#define MAX_PROBLEMS 16

/* One walk's state: on the stack of the thread that walks, owned by it. */
typedef struct Walk {
    GpDumpReader r;
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

const char *
gp_dump_walk_unsupported(void)
{
    return NULL;
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
    if (gp_dump_read_bytes(&w->r, lt, &head, sizeof head) != 0 ||
        (uintptr_t)head.ob_base.ob_type != (uintptr_t)&PyBytes_Type || head.ob_size < 0 ||
        head.ob_size > MAX_LINETABLE)
        return -1;
    uint8_t *t = malloc((size_t)head.ob_size + 1);
    if (t == NULL)
        return -1;
    int line = -1;
    if (gp_dump_read_bytes(&w->r, lt + offsetof(PyBytesObject, ob_sval), t, (size_t)head.ob_size) ==
        0)
        line = line_at(t, (size_t)head.ob_size, c->co_firstlineno, unit);
    free(t);
    return line;
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
    if (ts->cframe == NULL || gp_dump_read_bytes(&w->r, (uintptr_t)ts->cframe, &cf, sizeof cf) != 0)
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
    gp_dump_out_str(o, ",\"frames\":[");
    uintptr_t innermost = 0, innermost_code = 0;
    PyCodeObject innermost_c;
    int innermost_lasti = -1;
    while (addr != 0 && visited < 4 * MAX_FRAMES) {
        visited++;
        _PyInterpreterFrame f;
        if (gp_dump_read_bytes(&w->r, addr, &f, offsetof(_PyInterpreterFrame, localsplus)) != 0) {
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
        if (gp_dump_read_bytes(&w->r, code, &c, sizeof c) != 0 ||
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
            gp_dump_out_str(o, "],\"frames_cut\":true");
            goto innermost_call;
        }
        gp_dump_out_str(o, first ? "{\"file\":" : ",{\"file\":");
        first = 0;
        if (gp_dump_read_str_json(&w->r, w->o, (uintptr_t)c.co_filename) != 0)
            gp_dump_out_str(o, "null");
        gp_dump_out_str(o, ",\"line\":");
        gp_dump_out_i64(o, code_line(w, &c, (int)lasti));
        gp_dump_out_str(o, ",\"func\":");
        if (gp_dump_read_str_json(&w->r, w->o, (uintptr_t)c.co_qualname) != 0 &&
            gp_dump_read_str_json(&w->r, w->o, (uintptr_t)c.co_name) != 0)
            gp_dump_out_str(o, "null");
        gp_dump_out_str(o, "}");
        if (n == 0) {
            innermost = addr;
            innermost_code = code;
            innermost_c = c;
            innermost_lasti = (int)lasti;
        }
        n++;
        addr = next;
    }
    gp_dump_out_str(o, "]");
innermost_call:
    if (innermost != 0)
        gp_dump_call_out(&w->r, w->t, w->o, innermost, &innermost_c, innermost_code,
                         innermost_lasti);
}

static uintptr_t
gil_address(Walk *w, uintptr_t interp)
{
#if PY_VERSION_HEX >= 0x030C0000
    uintptr_t gil = 0;
    if (gp_dump_read_ptr(&w->r, interp + offsetof(PyInterpreterState, ceval.gil), &gil) != 0)
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
    gp_dump_out_str(o, ",\"native\":[");
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
            gp_dump_out_str(o, first ? "{\"tid\":" : ",{\"tid\":");
            first = 0;
            gp_dump_out_i64(o, tid);
            gp_dump_proc_thread(o, tid, 1);
            gp_dump_out_str(o, "}");
            count++;
        }
        closedir(d);
    }
    gp_dump_out_str(o, "]");
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
        if (gp_dump_read_ptr(&w->r, interp + offsetof(PyInterpreterState, threads.head), &addr) !=
            0) {
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
            if (seen || gp_dump_read_bytes(&w->r, addr, &ts, sizeof ts) != 0 ||
                (uintptr_t)ts.interp != interp) {
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
    gp_dump_read_open(&w.r);
    w.t = tables;
    w.o = out;

    gp_dump_out_str(out, "{\"kind\":\"walk\",\"pid\":");
    gp_dump_out_i64(out, w.r.pid);
    gp_dump_out_str(out, ",\"python\":\"" PY_VERSION "\",\"time\":");
    char when[48];
    snprintf(when, sizeof when, "%lld.%03ld", (long long)now.tv_sec, now.tv_nsec / 1000000);
    gp_dump_out_str(out, when);

    /* PyInterpreterState_Main() only reads _PyRuntime: safe without the GIL */
    uintptr_t interp = (uintptr_t)PyInterpreterState_Main();
    uintptr_t gil = gil_address(&w, interp), holder = 0;
    int locked = -1;
    if (gil != 0) {
        uintptr_t h = 0;
        int l = 0;
        if (gp_dump_read_bytes(&w.r, gil + offsetof(struct _gil_runtime_state, last_holder), &h,
                               sizeof h) == 0 &&
            gp_dump_read_bytes(&w.r, gil + offsetof(struct _gil_runtime_state, locked), &l,
                               sizeof l) == 0) {
            locked = l != 0;
            holder = locked ? h : 0;
        }
    }
    gp_dump_out_str(out, ",\"gil_locked\":");
    gp_dump_out_str(out, locked < 0 ? "null" : locked ? "true" : "false");

    uintptr_t next_interp = 0;
    if (gp_dump_read_ptr(&w.r, interp + offsetof(PyInterpreterState, next), &next_interp) == 0 &&
        next_interp != 0)
        problem(&w, "this process has subinterpreters; only the main one is shown");
    int nthreads = 0, more = 0;
    uintptr_t *states = collect_threads(&w, interp, &nthreads, &more);
    if (more)
        problem(&w, "more than %d threads: the rest are not shown", MAX_THREADS);
    gp_dump_out_str(out, ",\"threads\":[");
    int shown = 0;
    for (int i = 0; i < nthreads; i++) {
        PyThreadState ts;
        if (gp_dump_read_bytes(&w.r, states[i], &ts, sizeof ts) != 0 ||
            (uintptr_t)ts.interp != interp) {
            problem(&w,
                    "a thread ended while the dump was made (its thread state at 0x%llx is gone)",
                    (unsigned long long)states[i]);
            continue;
        }
        unsigned long long ident = ts.thread_id;
        gp_dump_out_str(out, shown ? ",{\"ident\":" : "{\"ident\":");
        gp_dump_out_u64(out, ident);
        gp_dump_out_str(out, ",\"native_id\":");
        gp_dump_out_u64(out, ts.native_thread_id);
        gp_dump_out_str(out, ",\"holds_gil\":");
        gp_dump_out_str(out, holder != 0 && holder == states[i] ? "true" : "false");
        if (w.ntids < MAX_THREADS)
            w.tids[w.ntids++] = (long)ts.native_thread_id;
        out_frames(&w, &ts, ident);
        if (ts.native_thread_id != 0)
            gp_dump_proc_thread(out, (long)ts.native_thread_id, 0);
        gp_dump_out_str(out, "}");
        shown++;
    }
    gp_dump_out_str(out, "]");
    free(states);
    out_native(&w, skip_tid);

    gp_dump_out_str(out, ",\"problems\":[");
    for (int i = 0; i < w.nproblems && i < MAX_PROBLEMS; i++) {
        if (i)
            gp_dump_out_str(out, ",");
        gp_dump_out_json_cstr(out, w.problems[i]);
    }
    gp_dump_out_str(out, "]");
    if (w.nproblems > MAX_PROBLEMS) {
        gp_dump_out_str(out, ",\"problems_more\":");
        gp_dump_out_i64(out, w.nproblems - MAX_PROBLEMS);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gp_dump_out_str(out, ",\"elapsed_us\":");
    gp_dump_out_i64(out, (t1.tv_sec - t0.tv_sec) * 1000000LL + (t1.tv_nsec - t0.tv_nsec) / 1000);
    gp_dump_out_str(out, ",\"read_by\":");
    gp_dump_out_json_cstr(out, gp_dump_read_how(&w.r));
    gp_dump_out_str(out, "}");
    gp_dump_read_close(&w.r);
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
    gp_dump_out_str(out, "{\"kind\":\"walk\",\"unsupported\":");
    gp_dump_out_json_cstr(out, gp_dump_walk_unsupported());
    gp_dump_out_str(out, "}");
    return out->full ? GP_ERR_NOMEM : GP_OK;
}

#endif
