/* Interned strings (strtab.h). */
#include "strtab.h"

#include <stdlib.h>
#include <string.h>

uint64_t
gp_strtab_hash(uint64_t key, const char *text, size_t len)
{
    uint64_t h = 1469598103934665603ull ^ key; /* FNV-1a, seeded with the key */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)text[i];
        h *= 1099511628211ull;
    }
    return h ? h : 1;
}

uint32_t
gp_strtab_find(const GpStrTab *t, uint64_t key, const char *text, size_t len, uint64_t h)
{
    if (t->slots == NULL)
        return 0;
    for (uint32_t i = (uint32_t)h & t->mask; t->slots[i]; i = (i + 1) & t->mask) {
        const GpStr *s = &t->items[t->slots[i] - 1];
        if (s->hash == h && s->key == key && strncmp(s->text, text, len) == 0 &&
            s->text[len] == '\0')
            return t->slots[i];
    }
    return 0;
}

static int
grow_slots(GpStrTab *t)
{
    uint32_t cap = t->slots ? (t->mask + 1) * 2 : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (uint32_t id = 1; id <= t->n; id++) {
        uint32_t i = (uint32_t)t->items[id - 1].hash & (cap - 1);
        while (slots[i])
            i = (i + 1) & (cap - 1);
        slots[i] = id;
    }
    free(t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return 0;
}

uint32_t
gp_strtab_add(GpStrTab *t, uint64_t key, const char *text, size_t len, uint64_t h)
{
    if ((t->slots == NULL || ((size_t)t->n + 1) * 2 > (size_t)t->mask + 1) && grow_slots(t) < 0)
        return 0;
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 256;
        GpStr *items = realloc(t->items, (size_t)cap * sizeof *items);
        if (items == NULL)
            return 0;
        t->items = items;
        t->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, text, len);
    copy[len] = '\0';
    t->items[t->n] = (GpStr){copy, h, key};
    uint32_t id = ++t->n;
    uint32_t i = (uint32_t)h & t->mask;
    while (t->slots[i])
        i = (i + 1) & t->mask;
    t->slots[i] = id;
    return id;
}

const GpStr *
gp_strtab_get(const GpStrTab *t, uint32_t id)
{
    return id >= 1 && id <= t->n ? &t->items[id - 1] : NULL;
}

void
gp_strtab_clear(GpStrTab *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free(t->items[i].text);
    free(t->items);
    free(t->slots);
    memset(t, 0, sizeof *t);
}
