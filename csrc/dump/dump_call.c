/* The C call a thread's innermost frame is in, named from its bytecode and value
 * stack (dump_call.h).
 *
 * An armed process runs no profile hook, so nothing records C calls. But when the
 * innermost frame's current instruction is a call (CALL, PRECALL, CALL_KW,
 * CALL_FUNCTION_EX) or a `with` (BEFORE_WITH), the thread is inside C code called
 * from there: a Python callee would have a frame of its own. The instructions
 * before it give the expression as the source spells it ("self.sock.recv"), when
 * the arguments are names, constants, attributes, lists, operations or calls of
 * those; the callable itself is then looked for in the frame's locals or on its
 * value stack (a builtin function, method descriptor or slot wrapper of that
 * name), and its type gives the qualified name ("_socket.socket.recv",
 * "torch._C._cuda_synchronize"). Every read goes through dump_read.h. */
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1 /* the frame's and a module's layouts are internal */
#include <Python.h>

#include "dump_call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const gp_dump_call_op_names[GP_DUMP_OP_COUNT] = {
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

#if GP_DUMP_WALKS
#include "internal/pycore_frame.h"
#include "internal/pycore_moduleobject.h"

#define MAX_CODE_UNITS ((Py_ssize_t)1 << 16)
#define MAX_STACK 4096
#define RING 64 /* instructions kept before the current one */

/* What the analysis reads with and writes to. */
typedef struct Call {
    GpDumpReader *r;
    const GpDumpTables *t;
    GpDumpOut *o;
} Call;

typedef struct Ins {
    int32_t at; /* code unit index */
    int16_t op; /* base opcode */
    uint32_t arg;
} Ins;

static int
is_op(const Call *w, const Ins *in, GpDumpOp which)
{
    return w->t->op[which] >= 0 && in->op == w->t->op[which];
}

/* LOAD_ATTR's method form (3.12+: the low bit of its argument) pushes two values. */
static int
attr_is_method(const Call *w, const Ins *in)
{
#if PY_VERSION_HEX >= 0x030C0000
    return is_op(w, in, GP_DUMP_OP_LOAD_ATTR) && (in->arg & 1);
#else
    return is_op(w, in, GP_DUMP_OP_LOAD_METHOD);
#endif
}

static uint32_t
attr_name_index(const Call *w, const Ins *in)
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
is_local_load(const Call *w, const Ins *in)
{
    return is_op(w, in, GP_DUMP_OP_LOAD_FAST) || is_op(w, in, GP_DUMP_OP_LOAD_FAST_CHECK) ||
           is_op(w, in, GP_DUMP_OP_LOAD_FAST_AND_CLEAR);
}

/* A load that pushes exactly one value. */
static int
is_single_load(const Call *w, const Ins *in)
{
    if (is_op(w, in, GP_DUMP_OP_LOAD_GLOBAL))
        return !(in->arg & 1); /* the low bit also pushes NULL */
    return is_local_load(w, in) || is_op(w, in, GP_DUMP_OP_LOAD_CONST) ||
           is_op(w, in, GP_DUMP_OP_LOAD_DEREF) || is_op(w, in, GP_DUMP_OP_LOAD_CLOSURE) ||
           is_op(w, in, GP_DUMP_OP_LOAD_NAME);
}

static int
is_plain_attr(const Call *w, const Ins *in)
{
    return is_op(w, in, GP_DUMP_OP_LOAD_ATTR) && !attr_is_method(w, in);
}

/* The backward walk over the values a call's arguments are made of: each
 * function takes the position of a value's last instruction and returns the
 * position before its first, or NOPE where the instructions are anything else
 * (a comprehension, a conditional: then the callee is not named). */
#define NOPE (-2)
#define MAX_NESTING 8

static int skip_value(const Call *w, const Ins *ins, int pos, int depth);

static int
skip_values(const Call *w, const Ins *ins, int pos, int count, int depth)
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
is_call_op(const Call *w, const Ins *in)
{
    return is_op(w, in, GP_DUMP_OP_CALL) || is_op(w, in, GP_DUMP_OP_PRECALL) ||
           is_op(w, in, GP_DUMP_OP_CALL_KW) || is_op(w, in, GP_DUMP_OP_CALL_FUNCTION_EX);
}

/* From the call at ins[pos] back over its arguments: the position of the
 * callee's last instruction, or NOPE. *nulled: a NULL pushed after the callee
 * (3.13) was stepped over. */
static int
call_callee_end(const Call *w, const Ins *ins, int pos, int depth, int *nulled)
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
skip_value(const Call *w, const Ins *ins, int pos, int depth)
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
parse_expr(const Call *w, const Ins *ins, int pos, Expr *e, int allow_method)
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
load_name(Call *w, const PyCodeObject *c, const Ins *in, char *buf, size_t cap)
{
    uintptr_t names = (uintptr_t)c->co_names, s = 0;
    if (is_op(w, in, GP_DUMP_OP_LOAD_GLOBAL))
        s = gp_dump_read_tuple_item(w->r, names, in->arg >> 1);
    else if (is_op(w, in, GP_DUMP_OP_LOAD_NAME))
        s = gp_dump_read_tuple_item(w->r, names, in->arg);
    else if (is_op(w, in, GP_DUMP_OP_LOAD_ATTR) || is_op(w, in, GP_DUMP_OP_LOAD_METHOD))
        s = gp_dump_read_tuple_item(w->r, names, attr_name_index(w, in));
    else if (is_op(w, in, GP_DUMP_OP_LOAD_SUPER_ATTR))
        s = gp_dump_read_tuple_item(w->r, names, in->arg >> 2); /* 3.12+: two flag bits */
    else if (is_local_load(w, in) || is_op(w, in, GP_DUMP_OP_LOAD_DEREF) ||
             is_op(w, in, GP_DUMP_OP_LOAD_CLOSURE))
        s = gp_dump_read_tuple_item(w->r, (uintptr_t)c->co_localsplusnames, in->arg);
    if (s == 0)
        return -1;
    return gp_dump_read_str_ascii(w->r, s, buf, cap);
}

/* The type in the MRO of `type` whose method table holds the method `ml`: the
 * class that defines a builtin method bound to an instance of a subclass
 * (super().recv() on a socket.socket subclass is _socket.socket's recv). 0 if none
 * does (a method table made at run time, as pybind11's). */
static uintptr_t
defining_type(Call *w, uintptr_t type, uintptr_t ml)
{
    uintptr_t mro = 0;
    if (gp_dump_read_ptr(w->r, type + offsetof(PyTypeObject, tp_mro), &mro) != 0)
        return 0;
    for (uint32_t i = 0; i < 64; i++) {
        uintptr_t t = gp_dump_read_tuple_item(w->r, mro, i), methods = 0;
        if (t == 0)
            return 0;
        if (gp_dump_read_ptr(w->r, t + offsetof(PyTypeObject, tp_methods), &methods) != 0 ||
            methods == 0)
            continue;
        for (uintptr_t k = 0; k < 1024; k++) {
            uintptr_t entry = methods + k * sizeof(PyMethodDef), name = 0;
            if (gp_dump_read_ptr(w->r, entry + offsetof(PyMethodDef, ml_name), &name) != 0 ||
                name == 0)
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
describe_callable(Call *w, uintptr_t obj, uintptr_t bound_self, char *owner, size_t owner_cap,
                  char *name, size_t cap, int depth)
{
    uintptr_t t = gp_dump_read_type(w->r, obj), ml = 0, owner_type = 0;
    owner[0] = '\0';
    if (t == (uintptr_t)&PyMethod_Type && depth == 0) {
        PyMethodObject m;
        if (gp_dump_read_bytes(w->r, obj, &m, sizeof m) != 0)
            return -1;
        return describe_callable(w, (uintptr_t)m.im_func, (uintptr_t)m.im_self, owner, owner_cap,
                                 name, cap, 1);
    }
    if (t == (uintptr_t)&PyCFunction_Type || t == (uintptr_t)&PyCMethod_Type) {
        PyCFunctionObject f;
        if (gp_dump_read_bytes(w->r, obj, &f, sizeof f) != 0)
            return -1;
        ml = (uintptr_t)f.m_ml;
        uintptr_t self = (uintptr_t)f.m_self;
        uintptr_t self_type = self ? gp_dump_read_type(w->r, self) : 0;
        char self_name[64];
        gp_dump_read_type_name(w->r, self_type, self_name, sizeof self_name);
        if (self == 0 || self_type == (uintptr_t)&PyModule_Type) {
            if (gp_dump_read_str_ascii(w->r, (uintptr_t)f.m_module, owner, owner_cap) != 0 &&
                self != 0) {
                uintptr_t md = 0;
                if (gp_dump_read_ptr(w->r, self + offsetof(PyModuleObject, md_name), &md) == 0)
                    gp_dump_read_str_ascii(w->r, md, owner, owner_cap);
            }
        } else if (strncmp(self_name, "pybind11_", 9) == 0) {
            /* pybind11 binds each function to a record of its own: the class is that
             * of the instance it is called on, else the module is what is known */
            if (bound_self == 0 || gp_dump_read_type_name(w->r, gp_dump_read_type(w->r, bound_self),
                                                          owner, owner_cap) != 0)
                gp_dump_read_str_ascii(w->r, (uintptr_t)f.m_module, owner, owner_cap);
        } else {
            owner_type = defining_type(w, self_type, ml);
            if (owner_type == 0)
                owner_type = self_type;
        }
    } else if (t == (uintptr_t)&PyMethodDescr_Type || t == (uintptr_t)&PyClassMethodDescr_Type) {
        PyMethodDescrObject d;
        if (gp_dump_read_bytes(w->r, obj, &d, sizeof d) != 0)
            return -1;
        ml = (uintptr_t)d.d_method;
        owner_type = (uintptr_t)d.d_common.d_type;
    } else if (t == (uintptr_t)&PyWrapperDescr_Type) {
        PyWrapperDescrObject d;
        uintptr_t base_name = 0;
        if (gp_dump_read_bytes(w->r, obj, &d, sizeof d) != 0 ||
            gp_dump_read_ptr(w->r, (uintptr_t)d.d_base + offsetof(struct wrapperbase, name),
                             &base_name) != 0 ||
            gp_dump_read_cstr(w->r, base_name, name, cap) != 0)
            return -1;
        owner_type = (uintptr_t)d.d_common.d_type;
    } else {
        return -1;
    }
    if (ml != 0) {
        uintptr_t ml_name = 0;
        if (gp_dump_read_ptr(w->r, ml + offsetof(PyMethodDef, ml_name), &ml_name) != 0 ||
            gp_dump_read_cstr(w->r, ml_name, name, cap) != 0)
            return -1;
    }
    if (owner_type != 0)
        gp_dump_read_type_name(w->r, owner_type, owner, owner_cap);
    return name[0] ? 0 : -1;
}

static void
out_qualified(GpDumpOut *o, const char *owner, const char *name)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s%s", owner, owner[0] ? "." : "", name);
    gp_dump_out_json_cstr(o, buf);
}

void
gp_dump_call_out(GpDumpReader *r, const GpDumpTables *t, GpDumpOut *out, uintptr_t frame,
                 const PyCodeObject *c, uintptr_t code, int lasti)
{
    Call ctx = {r, t, out};
    Call *w = &ctx;
    Py_ssize_t units = c->ob_base.ob_size;
    if (!w->t->ready || units <= 0 || units > MAX_CODE_UNITS || lasti < 0 || lasti >= units)
        return;
    uint8_t *bc = malloc((size_t)units * 2);
    if (bc == NULL)
        return;
    Ins ins[RING];
    int nins = 0, found = -1;
    if (gp_dump_read_bytes(w->r, code + offsetof(PyCodeObject, co_code_adaptive), bc,
                           (size_t)units * 2) != 0)
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
    gp_dump_out_str(o, ",\"call\":{\"kind\":");
    gp_dump_out_str(o, is_call ? "\"call\"" : "\"with\"");

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
            gp_dump_out_str(o, ",\"expr\":");
            gp_dump_out_json_cstr(o, text);
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
        gp_dump_out_str(o, ",\"expr\":");
        gp_dump_out_json_cstr(o, text);
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
    if (gp_dump_read_bytes(w->r, base_addr, slots, sizeof slots[0] * (size_t)(nlocals + nstack)) !=
        0)
        goto close;
    char owner[256], name[128];
    uintptr_t direct = 0;
    const Ins *root = ok ? &ins[e.root] : NULL;
    if (root != NULL && e.nattrs == 0 && root->arg < (uint32_t)nlocals) {
        if (is_local_load(w, root)) {
            direct = slots[root->arg];
        } else if (is_op(w, root, GP_DUMP_OP_LOAD_DEREF) &&
                   gp_dump_read_type(w->r, slots[root->arg]) == (uintptr_t)&PyCell_Type) {
            gp_dump_read_ptr(w->r, slots[root->arg] + offsetof(PyCellObject, ob_ref), &direct);
        }
    }
    if (is_with) {
        if (direct != 0) {
            if (gp_dump_read_type_name(w->r, gp_dump_read_type(w->r, direct), owner,
                                       sizeof owner) == 0) {
                gp_dump_out_str(o, ",\"callee\":");
                out_qualified(o, owner, "__enter__");
            }
        }
        goto close;
    }
    if (direct != 0 &&
        describe_callable(w, direct, 0, owner, sizeof owner, name, sizeof name, 0) == 0) {
        gp_dump_out_str(o, ",\"callee\":");
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
            gp_dump_out_str(o, ",\"callee\":");
            out_qualified(o, owner, name);
            break;
        }
    }
close:
    gp_dump_out_str(o, "}");
done:
    free(bc);
}

#endif /* GP_DUMP_WALKS */
