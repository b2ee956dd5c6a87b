/* gp_cuda.h for builds without CUPTI headers (or with GPUPROF_NO_CUDA=1):
 * every call succeeds at doing nothing or reports why GPU capture is off,
 * so the rest of gpuprof needs no #ifdefs and profiles the CPU side.
 * No state, hence nothing to protect.
 */
#include "gp_cuda.h"

#include <stddef.h>

static const char stub_reason[] =
    "gpuprof was built without CUPTI headers (install the nvidia-cuda-cupti wheel or a CUDA "
    "toolkit and rebuild)";

int
gp_cuda_compiled(void)
{
    return 0;
}

GpStatus
gp_cuda_load(const char *path)
{
    (void)path;
    return GP_ERR_CUDA_UNAVAIL;
}

int
gp_cuda_loaded(void)
{
    return 0;
}

const char *
gp_cuda_reason(void)
{
    return stub_reason;
}

const char *
gp_cuda_mode(void)
{
    return "off";
}

uint32_t
gp_cuda_version(void)
{
    return 0;
}

GpStatus
gp_cuda_session_begin(unsigned options)
{
    (void)options;
    return GP_ERR_CUDA_UNAVAIL;
}

GpStatus
gp_cuda_window_begin(int memory)
{
    (void)memory;
    return GP_ERR_CUDA_UNAVAIL;
}

GpStatus
gp_cuda_window_end(void)
{
    return GP_OK; /* nothing was begun, so nothing to end */
}

GpStatus
gp_cuda_session_end(void)
{
    return GP_OK;
}

GpGpuRecord *
gp_cuda_take_records(size_t *n)
{
    if (n != NULL)
        *n = 0;
    return NULL;
}

const char *
gp_cuda_string(uint32_t id)
{
    (void)id;
    return NULL;
}

void
gp_cuda_clear_strings(void)
{
}

uint64_t
gp_cuda_dropped(void)
{
    return 0;
}

const char *
gp_cuda_parts(void)
{
    return "";
}

void
gp_cuda_stats(GpCudaStats *out)
{
    out->decode_ns = out->decoded_records = out->completed_buffers = 0;
}

const char *
gp_cuda_api_name(uint32_t api_key)
{
    (void)api_key;
    return "cuda_api";
}

int
gp_cuda_api_class(uint32_t api_key)
{
    (void)api_key;
    return GP_APICLASS_OTHER;
}

int
gp_cuda_device_count(void)
{
    return 0;
}

GpStatus
gp_cuda_device_props(int device, GpDeviceProps *out)
{
    (void)device;
    (void)out;
    return GP_ERR_CUDA_UNAVAIL;
}

void
gp_cuda_after_fork_child(void)
{
}

GpStatus
gp_cuda_capture_profiler_api(int on)
{
    (void)on;
    return GP_ERR_CUDA_UNAVAIL;
}
