/* Demangling via __cxa_demangle, looked up with dlsym so that the extension
 * does not link libstdc++; PyTorch, JAX and CuPy all load it anyway. */
#include "demangle.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);

/* Resolved once; written and read with the GIL held (aggregation). */
static cxa_demangle_fn demangler = NULL;
static int looked_up = 0;

static cxa_demangle_fn
find_demangler(void)
{
    if (!looked_up) {
        looked_up = 1;
        demangler = (cxa_demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
        if (demangler == NULL) {
            /* Never dlclose'd: the function must stay valid. */
            void *lib = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_GLOBAL);
            if (lib)
                demangler = (cxa_demangle_fn)dlsym(lib, "__cxa_demangle");
        }
    }
    return demangler;
}

char *
gp_demangle(const char *name)
{
    if (name == NULL)
        return strdup("<unknown>");
    if (strncmp(name, "_Z", 2) == 0) {
        cxa_demangle_fn fn = find_demangler();
        if (fn) {
            int status = 0;
            char *out = fn(name, NULL, NULL, &status);
            if (status == 0 && out != NULL)
                return out;
            free(out);
        }
    }
    return strdup(name);
}
