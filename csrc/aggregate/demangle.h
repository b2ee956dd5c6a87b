/* C++ symbol demangling through the C++ runtime, found at run time. */
#ifndef GPUPROF_CSRC_DEMANGLE_H
#define GPUPROF_CSRC_DEMANGLE_H

/* A malloc'ed demangled copy of `name`, or a malloc'ed plain copy when it is
 * not a mangled name or no demangler is available; NULL when out of memory. */
char *gp_demangle(const char *name);

#endif /* GPUPROF_CSRC_DEMANGLE_H */
