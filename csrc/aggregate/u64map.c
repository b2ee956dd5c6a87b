/* The uint64 -> uint32 map (u64map.h). */
#include "u64map.h"

#include <stdlib.h>
#include <string.h>

int
gp_u64map_init(GpU64Map *m, size_t cap)
{
    size_t c = 64;
    while (c < cap * 2)
        c *= 2;
    m->keys = malloc(c * sizeof(uint64_t));
    m->vals = malloc(c * sizeof(uint32_t));
    if (!m->keys || !m->vals)
        return -1;
    memset(m->vals, 0xff, c * sizeof(uint32_t));
    m->mask = c - 1;
    m->used = 0;
    return 0;
}

void
gp_u64map_free(GpU64Map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

int
gp_u64map_put(GpU64Map *m, uint64_t key, uint32_t val)
{
    if ((m->used + 1) * 2 > m->mask + 1) {
        GpU64Map bigger;
        if (gp_u64map_init(&bigger, (m->mask + 1)) < 0) {
            gp_u64map_free(&bigger);
            return -1;
        }
        for (size_t i = 0; i <= m->mask; i++)
            if (m->vals[i] != UINT32_MAX)
                gp_u64map_put(&bigger, m->keys[i], m->vals[i]);
        gp_u64map_free(m);
        *m = bigger;
    }
    size_t i = mix64(key) & m->mask;
    while (m->vals[i] != UINT32_MAX) {
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->used++;
    return 0;
}
