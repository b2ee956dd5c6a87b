/* Op interning: code objects, C functions and range labels -> small op ids.
 *
 * The table owns a strong reference to what identifies each op (the code
 * object, the module or type of a C function, the label string) so ids stay
 * valid, and names can be resolved at aggregation time. Lookups happen on
 * the hot path with the GIL held; the miss path runs once per new op.
 */
#ifndef GPUPROF_CSRC_INTERN_H
#define GPUPROF_CSRC_INTERN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "common.h"
#include "opkinds.h"

typedef struct GpInternSlot {
    const void *a; /* code object, or PyMethodDef* */
    const void *b; /* NULL for code, else the C function's module/type */
    uint32_t op;   /* 0 = empty */
} GpInternSlot;

/* All fields: GIL. */
typedef struct GpIntern {
    GpInternSlot *slots;
    uint32_t mask;      /* capacity - 1, capacity a power of two */
    uint32_t used;
    uint32_t n_ops;     /* op ids are 1..n_ops-1 (0 reserved) */
    uint32_t cap_ops;
    uint8_t *kinds;     /* per op id */
    uint8_t *flags;     /* per op id */
    int32_t *gen_lasti; /* per op id: largest f_lasti of a generator frame's first entry */
    PyObject **refs;    /* per op id, strong: code, module/type, or label str */
    const PyMethodDef **methods; /* per op id (C functions) */
    PyObject **names; /* per op id, strong or NULL: a C function's name, made on first describe */
    PyObject *binding_index; /* dict or NULL: binding module name -> {PyMethodDef address: name} */
    PyObject *labels; /* dict: label str -> op id (int) */
    PyObject *hidden_prefix; /* str, tuple of str or NULL: co_filename prefixes of hidden code */
    PyObject *shown_prefix; /* str or NULL: under hidden_prefix, but shown (bundled workloads) */
    PyObject
        *library_roots; /* tuple of str or NULL: folders of library code (gp_intern_is_library) */
} GpIntern;

extern GpIntern gp_intern;

/* Set up / release the table. init: 0 or -1 with MemoryError set. */
int gp_intern_init(void);
void gp_intern_clear(void);

/* Miss paths; return 0 (and count nothing) when out of memory. They keep the
 * error indicator as they found it. */
uint32_t gp_intern_code_slow(PyCodeObject *code);
uint32_t gp_intern_cfunc_slow(const PyMethodDef *ml, PyObject *owner);

GP_INLINE uint32_t
intern_hash(const void *a, const void *b)
{
    uint64_t h =
        ((uintptr_t)a >> 4) * 0x9E3779B97F4A7C15ull ^ ((uintptr_t)b >> 4) * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(h >> 32);
}

GP_INLINE uint32_t
gp_intern_lookup(const void *a, const void *b)
{
    uint32_t i = intern_hash(a, b) & gp_intern.mask;
    for (;;) {
        const GpInternSlot *s = &gp_intern.slots[i];
        if (s->a == a && s->b == b)
            return s->op;
        if (s->op == 0)
            return 0;
        i = (i + 1) & gp_intern.mask;
    }
}

/* Op id of a code object (borrowed). */
GP_INLINE uint32_t
gp_intern_code(PyCodeObject *code)
{
    uint32_t op = gp_intern_lookup(code, NULL);
    return GP_LIKELY(op) ? op : gp_intern_code_slow(code);
}

/* Op id of a C function identified by its method def and owner (module or
 * type, borrowed). */
GP_INLINE uint32_t
gp_intern_cfunc(const PyMethodDef *ml, PyObject *owner)
{
    uint32_t op = gp_intern_lookup(ml, owner);
    return GP_LIKELY(op) ? op : gp_intern_cfunc_slow(ml, owner);
}

/* Op id of a range label; -1... returns 0 with an exception set on failure. */
uint32_t gp_intern_label(PyObject *label);

/* Code objects whose co_filename starts with `prefix` (a str, or a tuple of
 * str: any of them) are hidden, except those under `shown` (a str, or NULL).
 * Both borrowed (references are taken). 0 / -1 with an exception. */
int gp_intern_set_hidden_prefix(PyObject *prefix, PyObject *shown);

/* Set the folders whose files are library code besides installed packages (the
 * standard library, gpuprof): a tuple of str, each ending in a separator. Set
 * once at import; outlives sessions. 0, or -1 with an exception. */
int gp_intern_set_library_roots(PyObject *roots);

/* Whether `filename` is library code rather than the user's: frozen
 * ("<frozen ...>"), under a site-packages or dist-packages folder, or under a
 * library root. Scripts, notebook cells and other names are the user's. The one
 * definition of the rule: gpuprof._paths.is_library calls it. */
int gp_intern_is_library(PyObject *filename);

/* Describe op `op` for the tables: new references to name and file (str),
 * and the line (0 when none). 0 on success, -1 with an exception. */
int gp_intern_describe(uint32_t op, PyObject **name, PyObject **file, int *line);

#endif /* GPUPROF_CSRC_INTERN_H */
