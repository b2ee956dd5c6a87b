/* An open-addressing hash map from uint64 keys to uint32 values (UINT32_MAX
 * is "absent"), kept at most half full (u64map.c). Pure C, no Python. */
#ifndef GPUPROF_CSRC_U64MAP_H
#define GPUPROF_CSRC_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct GpU64Map {
    uint64_t *keys;
    uint32_t *vals; /* UINT32_MAX = empty */
    size_t mask;
    size_t used;
} GpU64Map;

/* An empty map with room for about cap keys. 0, or -1 when out of memory (then
 * gp_u64map_free it). */
int gp_u64map_init(GpU64Map *m, size_t cap);

/* Release the map's memory and zero it. */
void gp_u64map_free(GpU64Map *m);

/* Set key to val (val != UINT32_MAX), growing the map. 0, or -1 when out of memory. */
int gp_u64map_put(GpU64Map *m, uint64_t key, uint32_t val);

static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static inline uint32_t
gp_u64map_get(const GpU64Map *m, uint64_t key)
{
    size_t i = mix64(key) & m->mask;
    while (m->vals[i] != UINT32_MAX) {
        if (m->keys[i] == key)
            return m->vals[i];
        i = (i + 1) & m->mask;
    }
    return UINT32_MAX;
}

#endif /* GPUPROF_CSRC_U64MAP_H */
