/* Every entry point gpuprof takes from libcupti and libcuda, listed once.
 *
 * libcupti and libcuda are never linked (docs/development.md, "Optional
 * CUDA"): cupti_loader.c dlopens them and resolves these lists all or
 * none, so a missing symbol disables CUDA capture with a reason that names
 * it instead of failing at import. Each entry is X(name, return type, (parameter list)); the users
 * expand it into a table of function pointers (cupti_internal.h) and into
 * the dlsym loop (cupti_loader.c).
 *
 * Only the narrow CUPTI headers are included, not <cupti.h>: cupti.h also
 * pulls in generated_*_meta.h, which the nvidia-cuda-cupti wheel lacks. These
 * build from the wheels alone (cupti wheel + nvidia-cuda-runtime for cuda.h).
 */
#ifndef GPUPROF_CUDA_CUPTI_SYMBOLS_H
#define GPUPROF_CUDA_CUPTI_SYMBOLS_H

#include <cuda.h>
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_result.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>

/* libcupti. cuptiGetVersion comes first: the loader checks the version
 * before resolving the rest, so an old libcupti is refused with both version
 * numbers rather than with the name of the first symbol it lacks. */
#define GP_CUPTI_SYMBOLS(X)                                                                        \
    X(cuptiGetVersion, CUptiResult, (uint32_t *version))                                           \
    X(cuptiGetResultString, CUptiResult, (CUptiResult result, const char **str))                   \
    X(cuptiSubscribe_v2, CUptiResult,                                                              \
      (CUpti_SubscriberHandle * subscriber, CUpti_CallbackFunc callback, void *userdata,           \
       CUpti_SubscriberParams *params))                                                            \
    X(cuptiUnsubscribe, CUptiResult, (CUpti_SubscriberHandle subscriber))                          \
    X(cuptiEnableCallback, CUptiResult,                                                            \
      (uint32_t enable, CUpti_SubscriberHandle subscriber, CUpti_CallbackDomain domain,            \
       CUpti_CallbackId cbid))                                                                     \
    X(cuptiGetCallbackName, CUptiResult,                                                           \
      (CUpti_CallbackDomain domain, uint32_t cbid, const char **name))                             \
    X(cuptiActivityEnable, CUptiResult, (CUpti_ActivityKind kind))                                 \
    X(cuptiActivityDisable, CUptiResult, (CUpti_ActivityKind kind))                                \
    X(cuptiActivityRegisterCallbacks, CUptiResult,                                                 \
      (CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed))   \
    X(cuptiActivityRegisterTimestampCallback, CUptiResult,                                         \
      (CUpti_TimestampCallbackFunc timestamp))                                                     \
    X(cuptiActivityGetNextRecord, CUptiResult,                                                     \
      (uint8_t *buffer, size_t valid_bytes, CUpti_Activity **record))                              \
    X(cuptiActivityGetNumDroppedRecords, CUptiResult,                                              \
      (CUcontext context, uint32_t stream_id, size_t *dropped))                                    \
    X(cuptiActivityFlushAll, CUptiResult, (uint32_t flag))                                         \
    X(cuptiActivitySetAttribute, CUptiResult,                                                      \
      (CUpti_ActivityAttribute attr, size_t *value_size, void *value))                             \
    X(cuptiActivityEnableRuntimeApi, CUptiResult, (CUpti_CallbackId cbid, uint8_t enable))         \
    X(cuptiActivityEnableDriverApi, CUptiResult, (CUpti_CallbackId cbid, uint8_t enable))          \
    X(cuptiSetThreadIdType, CUptiResult, (CUpti_ActivityThreadIdType type))                        \
    X(cuptiGetDeviceId, CUptiResult, (CUcontext context, uint32_t *device_id))                     \
    X(cuptiGetContextId, CUptiResult, (CUcontext context, uint32_t *context_id))                   \
    X(cuptiGetStreamIdEx, CUptiResult,                                                             \
      (CUcontext context, CUstream stream, uint8_t per_thread_stream, uint32_t *stream_id))        \
    X(cuptiFinalize, CUptiResult, (void))

/* libcuda (driver API), for device properties and the end-of-window
 * synchronize. Exported names are spelled out (cuCtxPushCurrent_v2, not the
 * cuda.h macro cuCtxPushCurrent) because dlsym sees the real symbols. */
#define GP_CUDA_DRIVER_SYMBOLS(X)                                                                  \
    X(cuGetErrorString, CUresult, (CUresult error, const char **str))                              \
    X(cuInit, CUresult, (unsigned int flags))                                                      \
    X(cuDeviceGetCount, CUresult, (int *count))                                                    \
    X(cuDeviceGet, CUresult, (CUdevice * device, int ordinal))                                     \
    X(cuDeviceGetName, CUresult, (char *name, int len, CUdevice dev))                              \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *bytes, CUdevice dev))                                \
    X(cuDeviceGetAttribute, CUresult, (int *value, CUdevice_attribute attrib, CUdevice dev))       \
    X(cuDevicePrimaryCtxGetState, CUresult, (CUdevice dev, unsigned int *flags, int *active))      \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext * ctx, CUdevice dev))                         \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice dev))                                      \
    X(cuCtxGetCurrent, CUresult, (CUcontext * ctx))                                                \
    X(cuCtxPushCurrent_v2, CUresult, (CUcontext ctx))                                              \
    X(cuCtxPopCurrent_v2, CUresult, (CUcontext * ctx))                                             \
    X(cuCtxSynchronize, CUresult, (void))

#endif /* GPUPROF_CUDA_CUPTI_SYMBOLS_H */
