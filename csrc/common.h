/* Shared macros, status codes and compiler attributes for the gpuprof C core. */
#ifndef GPUPROF_CSRC_COMMON_H
#define GPUPROF_CSRC_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define GP_LIKELY(x) __builtin_expect(!!(x), 1)
#define GP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GP_INLINE static inline __attribute__((always_inline))
#define GP_UNUSED __attribute__((unused))
#else
#define GP_LIKELY(x) (x)
#define GP_UNLIKELY(x) (x)
#define GP_INLINE static inline
#define GP_UNUSED
#endif

#define GP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Status codes of the pure-C layers. profiler.c turns them into exceptions
 * (one table, gp_status_raise); nothing below it touches the error indicator. */
typedef enum GpStatus {
    GP_OK = 0,
    GP_ERR_NOMEM,         /* malloc failed */
    GP_ERR_STATE,         /* call not valid in the current lifecycle state */
    GP_ERR_VALUE,         /* bad argument that Python did not catch */
    GP_ERR_CUDA_UNAVAIL,  /* CUPTI not compiled in, not loadable, or refused */
    GP_ERR_CUPTI,         /* a CUPTI call failed; gp_cuda_last_error() has the text */
    GP_ERR_IO,            /* a file operation failed; errno is kept */
    GP_ERR_OVERFLOW,      /* a fixed-size table is full */
} GpStatus;

#ifdef GPUPROF_DEBUG
#include <stdio.h>
#define GP_DEBUG(...) fprintf(stderr, "gpuprof: " __VA_ARGS__)
#else
#define GP_DEBUG(...) ((void)0)
#endif

#endif /* GPUPROF_CSRC_COMMON_H */
