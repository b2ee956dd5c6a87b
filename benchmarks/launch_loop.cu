// Host-side cost of one kernel launch: bench_launch.py loads this with ctypes
// and times batches of empty-kernel launches, with and without a profiler.
// Each batch is followed by an untimed synchronize, so the launch queue never
// fills and the figure is the launching thread's own time per launch.
#include <cuda.h>
#include <cuda_runtime.h>
#include <time.h>

extern "C" __global__ void gp_empty_kernel(int *flag)
{
    if (flag != nullptr)
        *flag = 1;
}

static double now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// Launch `batch` empty kernels `batches` times, through the runtime
// (<<<>>>) or the driver (cuLaunchKernel); write each batch's ns per launch
// into out[batches]. 0 on success, else the CUDA error code.
extern "C" int gp_launch_batches(int batches, int batch, int driver, double *out)
{
    // The driver entry point comes through the runtime, so that nothing
    // links libcuda (absent where this is compiled without a driver).
    typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);
    LaunchFn launch = nullptr;
    CUfunction fn = nullptr;
    if (driver) {
        cudaDriverEntryPointQueryResult found;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuLaunchKernel", (void **)&launch, 12000,
                                                         cudaEnableDefault, &found);
        if (e == cudaSuccess)
            e = cudaGetFuncBySymbol(&fn, (const void *)gp_empty_kernel);
        if (e != cudaSuccess)
            return (int)e;
        if (found != cudaDriverEntryPointSuccess || launch == nullptr)
            return -1;
    }
    int *flag = nullptr;
    void *args[] = {&flag};
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (int i = 0; i < batch; i++) {
            if (driver)
                launch(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr);
            else
                gp_empty_kernel<<<1, 1>>>(flag);
        }
        out[b] = (now_ns() - t0) / batch;
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess)
            return (int)e;
    }
    return 0;
}
