/* Interned strings: small ids (from 1) for (key, text) pairs.
 *
 * The CUPTI side keeps kernel names in one (key 0), the NVTX side range
 * messages in another (key = domain << 32 | category). Open addressing on a
 * hash of key and text; the table owns a NUL-terminated copy of each text.
 * Not thread-safe: the owner holds its own lock around every call.
 */
#ifndef GPUPROF_CSRC_STRTAB_H
#define GPUPROF_CSRC_STRTAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct GpStr {
    char *text;
    uint64_t hash;
    uint64_t key;
} GpStr;

typedef struct GpStrTab {
    GpStr *items;    /* id = index + 1 */
    uint32_t n, cap; /* items used, allocated */
    uint32_t *slots; /* id, 0 empty; mask + 1 of them, a power of two */
    uint32_t mask;
} GpStrTab; /* all zero: empty */

/* Hash of (key, text[0..len)); never 0. */
uint64_t gp_strtab_hash(uint64_t key, const char *text, size_t len);

/* Id of (key, text[0..len)) with hash h, or 0 when absent. */
uint32_t gp_strtab_find(const GpStrTab *t, uint64_t key, const char *text, size_t len, uint64_t h);

/* Adds (key, text[0..len)) with hash h, known absent; its id, or 0 when out
 * of memory. */
uint32_t gp_strtab_add(GpStrTab *t, uint64_t key, const char *text, size_t len, uint64_t h);

/* The entry of id, or NULL when there is none. */
const GpStr *gp_strtab_get(const GpStrTab *t, uint32_t id);

/* Frees every entry; the table is empty (all zero) again. */
void gp_strtab_clear(GpStrTab *t);

#endif /* GPUPROF_CSRC_STRTAB_H */
