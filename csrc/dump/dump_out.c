/* The dump's output: a growing buffer and JSON text (dump_out.h). No Python API:
 * the dump thread writes with it without the GIL. */
#include "dump_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_CAP ((size_t)16 << 20) /* one dump never needs more; past it, output stops */

void
gp_dump_out_bytes(GpDumpOut *o, const char *s, size_t n)
{
    if (o->full)
        return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->n + n + 1)
            cap *= 2;
        char *p = cap <= OUT_CAP ? realloc(o->p, cap) : NULL;
        if (p == NULL) {
            o->full = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = '\0';
}

void
gp_dump_out_str(GpDumpOut *o, const char *s)
{
    gp_dump_out_bytes(o, s, strlen(s));
}

void
gp_dump_out_codepoint(GpDumpOut *o, uint32_t c)
{
    char buf[16];
    if (c == '"' || c == '\\') {
        buf[0] = '\\';
        buf[1] = (char)c;
        gp_dump_out_bytes(o, buf, 2);
    } else if (c >= 0x20 && c < 0x7f) {
        buf[0] = (char)c;
        gp_dump_out_bytes(o, buf, 1);
    } else if (c > 0xffff && c <= 0x10ffff) {
        c -= 0x10000;
        int k =
            snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
        gp_dump_out_bytes(o, buf, (size_t)k);
    } else {
        int k = snprintf(buf, sizeof buf, "\\u%04x", c > 0x10ffff ? 0xfffd : c);
        gp_dump_out_bytes(o, buf, (size_t)k);
    }
}

/* UTF-8 bytes (possibly invalid: each bad byte becomes U+FFFD) as a JSON string. */
static void
json_utf8(GpDumpOut *o, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    gp_dump_out_bytes(o, "\"", 1);
    size_t i = 0;
    while (i < n) {
        uint32_t c = p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) {
            gp_dump_out_codepoint(o, 0xfffd);
            i++;
            continue;
        }
        if (len > 1) {
            c &= 0xff >> (len + 1);
            for (size_t k = 1; k < len; k++) {
                if ((p[i + k] & 0xc0) != 0x80) {
                    len = 0;
                    break;
                }
                c = (c << 6) | (p[i + k] & 0x3f);
            }
            if (len == 0) {
                gp_dump_out_codepoint(o, 0xfffd);
                i++;
                continue;
            }
        }
        gp_dump_out_codepoint(o, c);
        i += len;
    }
    gp_dump_out_bytes(o, "\"", 1);
}

void
gp_dump_out_json_cstr(GpDumpOut *o, const char *s)
{
    if (s == NULL)
        gp_dump_out_str(o, "null");
    else
        json_utf8(o, s, strlen(s));
}

void
gp_dump_out_free(GpDumpOut *o)
{
    free(o->p);
    o->p = NULL;
    o->n = o->cap = 0;
    o->full = 0;
}

void
gp_dump_out_u64(GpDumpOut *o, uint64_t v)
{
    char buf[24];
    int k = snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    gp_dump_out_bytes(o, buf, (size_t)k);
}

void
gp_dump_out_i64(GpDumpOut *o, int64_t v)
{
    char buf[24];
    int k = snprintf(buf, sizeof buf, "%lld", (long long)v);
    gp_dump_out_bytes(o, buf, (size_t)k);
}
