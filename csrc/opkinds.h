/* Op kinds, op flags and reserved op ids: shared by the Python-facing
 * intern table and the pure-C aggregation. */
#ifndef GPUPROF_CSRC_OPKINDS_H
#define GPUPROF_CSRC_OPKINDS_H

/* Op kinds: also the `kind` column of ops(). */
enum {
    GP_OP_NONE = 0,
    GP_OP_PYTHON = 1,   /* Python function (code object) */
    GP_OP_CFUNC = 2,    /* C function or method called from Python */
    GP_OP_USER = 3,     /* record_function / NVTX label */
    GP_OP_STEP = 4,     /* ProfilerStep* */
    GP_OP_CUDA_API = 5, /* CUDA runtime/driver call (made by aggregation) */
    GP_OP_NVTX = 6,     /* aggregation only: NVTX name ids (csrc/record/nvtx.c) are their own id
                           space; their rows are GP_OP_USER with GP_OPF_NVTX */
};

/* Op flags. */
enum {
    GP_OPF_HIDDEN = 1,    /* gpuprof's own frames: time goes to the caller */
    GP_OPF_GENERATOR = 2, /* generator/coroutine code: resumes are not calls */
    GP_OPF_NVTX = 4,      /* GP_OP_USER row whose op is an NVTX name id (gp_nvtx_describe) */
    GP_OPF_LIBRARY = 8,   /* Python code that is not the user's (gp_intern_is_library) */
    GP_OPF_WAIT = 16,     /* C function that blocks its thread: sleep, lock, poll, queue
                             get, recv (gp_intern_cfunc_slow; the list in docs/tables.md) */
    GP_OPF_AUTOGRAD = 32, /* with GP_OPF_NVTX: an autograd node's range (AddmmBackward0),
                             from PyTorch's range messages (csrc/record/nvtx.c) */
};

/* Reserved op ids. */
enum { GP_OPID_NONE = 0, GP_OPID_STEP = 1, GP_OPID_FIRST = 2 };

#endif /* GPUPROF_CSRC_OPKINDS_H */
