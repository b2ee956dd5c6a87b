/* A C loop for the dump tests: called through ctypes.PyDLL, which keeps the GIL
 * held, it spins until the file at `path` exists, so no other Python thread of
 * the process runs meanwhile (as a C extension stuck in a loop would hold it).
 * Returns how many times it looked. */
#include <unistd.h>

long
gil_spin_until(const char *path)
{
    long n = 0;
    while (access(path, F_OK) != 0)
        n++;
    return n;
}
