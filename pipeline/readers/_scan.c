/* CommitLog message units -> Arrow column buffers: the pipeline reader's kernel (module
 * pipeline.readers._scan; its Python side and pure twin are in pipeline/readers/unit_batch.py).
 *
 * scan(buf, file_from, pos, stop, max_units, max_bytes, names) follows the TOTALSIZE chain
 * from the unit boundary `pos` while units are structurally valid (record_codec.check_unit
 * without the CRC, plus PHYSICALOFFSET == its own log offset) and start before `stop`, and
 * copies every field of each once into column buffers in Arrow's layout, in one pass. Body
 * CRCs use the store's CRC-32 kernel (_accel_crc.c, compiled in). Text that is not UTF-8 is
 * decoded with replacement, as bytes.decode(errors="replace") does, and its rows are listed.
 * Properties are parsed as message.string_to_properties does: items without \x01 are
 * skipped, a repeated name keeps its first place and its last value; the values of `names`
 * (a tuple of bytes) also get a column each.
 *
 * Returns (end, full, n, columns, bad_text_rows): `end` is where the walk stopped (the first
 * unit not taken), `full` whether it stopped for max_units/max_bytes; see COLUMNS in
 * unit_batch.py for the order of `columns`, then 3 per name (validity, offsets, text).
 */
#include "_accel.h"

#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MESSAGE_MAGIC ((int32_t)0xDAA320A7)
#define MIN_UNIT (HEADER_SIZE + 3)
#define HOST_MAX 28 /* "255.255.255.255:-2147483648" */
#define ID_LEN 32   /* offset msgId: 16 bytes in upper-case hex */

/* Field positions in a unit (record_codec.HEADER). */
enum {
    F_TOTAL = 0, F_CRC = 8, F_QUEUE_ID = 12, F_FLAG = 16, F_QUEUE_OFFSET = 20, F_PHYS = 28,
    F_SYS_FLAG = 36, F_BORN_TS = 40, F_BORN_HOST = 48, F_STORE_TS = 56, F_STORE_HOST = 64,
    F_RECONSUME = 72, F_PTX = 76, F_BODY_LEN = 84,
};

/* Output columns, in the order Python unpacks them. */
enum {
    C_PHYS, C_MSG_ID, C_TOTAL, C_CRC, C_CRC_OK, C_QUEUE_ID, C_FLAG, C_QUEUE_OFFSET, C_SYS_FLAG,
    C_BORN_TS, C_BORN_HOST_OFF, C_BORN_HOST, C_STORE_TS, C_STORE_HOST_OFF, C_STORE_HOST,
    C_RECONSUME, C_PTX, C_BODY_LEN, C_BODY_OFF, C_BODY, C_TOPIC_OFF, C_TOPIC, C_MAP_OFF,
    C_KEY_OFF, C_KEY, C_VALUE_OFF, C_VALUE, N_COLUMNS
};

static inline int64_t be64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}
static inline int32_t be32(const unsigned char *p) { return get_be32((const char *)p); }
static inline int16_t be16(const unsigned char *p) { return (int16_t)((p[0] << 8) | p[1]); }

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF), as Python decodes. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* ASCII runs 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return 0;
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += len;
    }
    return 1;
}

/* One unit being taken. Text that is not UTF-8 points into replacement bytes objects. */
typedef struct {
    const unsigned char *at, *topic, *props;
    Py_ssize_t topic_len, props_len;
    int32_t total, body_len;
    PyObject *fixed[2]; /* owned replacements of topic and properties, or NULL */
} Unit;

/* The text of s[0:n] decoded with replacement, re-encoded: a new bytes object. */
static PyObject *replaced(const unsigned char *s, Py_ssize_t n) {
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, "replace");
    if (text == NULL) return NULL;
    PyObject *out = PyUnicode_AsUTF8String(text);
    Py_DECREF(text);
    return out;
}

/* Make the unit's topic and properties UTF-8; returns 1 when they were not, -1 on error. */
static int fix_text(Unit *u) {
    int topic_ok = utf8_ok(u->topic, u->topic_len), props_ok = utf8_ok(u->props, u->props_len);
    if (topic_ok && props_ok) return 0;
    if (!topic_ok) {
        if ((u->fixed[0] = replaced(u->topic, u->topic_len)) == NULL) return -1;
        u->topic = (const unsigned char *)PyBytes_AS_STRING(u->fixed[0]);
        u->topic_len = PyBytes_GET_SIZE(u->fixed[0]);
    }
    if (!props_ok) {
        if ((u->fixed[1] = replaced(u->props, u->props_len)) == NULL) return -1;
        u->props = (const unsigned char *)PyBytes_AS_STRING(u->fixed[1]);
        u->props_len = PyBytes_GET_SIZE(u->fixed[1]);
    }
    return 1;
}

/* Whether the unit at `pos` has a valid fixed part: magic, TOTALSIZE within the buffer, BODY's
 * length within the unit, PHYSICALOFFSET its own log offset. */
static int valid_head(Unit *u, const unsigned char *buf, int64_t size, int64_t file_from,
                      int64_t pos) {
    if (size - pos < 8) return 0;
    const unsigned char *p = buf + pos;
    int32_t total = be32(p + F_TOTAL), magic = be32(p + 4);
    if (magic != MESSAGE_MAGIC || total < MIN_UNIT || total > size - pos) return 0;
    int32_t body_len = be32(p + F_BODY_LEN);
    if (body_len < 0 || body_len > total - MIN_UNIT) return 0;
    if (be64(p + F_PHYS) != file_from + pos) return 0;
    u->at = p, u->total = total, u->body_len = body_len;
    u->fixed[0] = u->fixed[1] = NULL;
    return 1;
}

/* Whether the TOPIC and PROPERTIES lengths of a unit with a valid head add up to TOTALSIZE. */
static int valid_tail(Unit *u) {
    const unsigned char *tp = u->at + HEADER_SIZE + u->body_len;
    int64_t topic_len = tp[0], rest = u->total - HEADER_SIZE - u->body_len - 1 - topic_len - 2;
    if (rest < 0 || be16(tp + 1 + topic_len) != rest) return 0;
    u->topic = tp + 1, u->topic_len = topic_len;
    u->props = tp + 3 + topic_len, u->props_len = rest;
    return 1;
}

/* A column buffer: a read-only buffer object for Arrow over memory that goes back to a small
 * pool when Arrow lets go of it, so that the next batch reuses it instead of faulting in
 * fresh pages (which costs as much as the decoding). */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size, cap;
} Buf;

#define POOL_SLOTS 256 /* a batch has about 50 columns; a few batches are alive at once */
#define POOL_MIN 4096
#define POOL_MAX_BYTES ((Py_ssize_t)256 << 20)
static struct {
    char *data;
    Py_ssize_t cap;
} pool[POOL_SLOTS];
static Py_ssize_t pooled;

static char *pool_take(Py_ssize_t need, Py_ssize_t *cap) {
    int best = -1;
    for (int i = 0; i < POOL_SLOTS; i++)
        if (pool[i].data != NULL && pool[i].cap >= need && (best < 0 || pool[i].cap < pool[best].cap))
            best = i;
    if (best < 0) {
        *cap = need;
        return PyMem_RawMalloc((size_t)(need ? need : 1));
    }
    char *data = pool[best].data;
    *cap = pool[best].cap;
    pooled -= pool[best].cap;
    pool[best].data = NULL;
    return data;
}

static void pool_give(char *data, Py_ssize_t cap) {
    if (cap >= POOL_MIN && pooled + cap <= POOL_MAX_BYTES)
        for (int i = 0; i < POOL_SLOTS; i++)
            if (pool[i].data == NULL) {
                pool[i].data = data, pool[i].cap = cap;
                pooled += cap;
                return;
            }
    PyMem_RawFree(data);
}

static void buf_dealloc(Buf *self) {
    if (self->data != NULL) pool_give(self->data, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int buf_getbuffer(Buf *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 1, flags);
}

static PyBufferProcs buf_as_buffer = {(getbufferproc)buf_getbuffer, NULL};

static PyTypeObject Buf_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pipeline.readers._scan.Buf",
    .tp_basicsize = sizeof(Buf),
    .tp_dealloc = (destructor)buf_dealloc,
    .tp_as_buffer = &buf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column buffer of one scan (read-only).",
};

/* After the fixed columns: 3 per picked property (validity bitmap, offsets, text). */
#define MAX_PICKED 16
#define ALL_COLUMNS (N_COLUMNS + 3 * MAX_PICKED)

typedef struct {
    Buf *obj[ALL_COLUMNS];
    Py_ssize_t len[ALL_COLUMNS]; /* bytes used (growable text columns) */
    int count;                    /* columns in use */
} Columns;

static char *col(Columns *c, int i) { return c->obj[i]->data; }

static int alloc_col(Columns *c, int i, Py_ssize_t size) {
    Buf *b = PyObject_New(Buf, &Buf_Type);
    if (b == NULL) return -1;
    b->size = 0;
    if ((b->data = pool_take(size, &b->cap)) == NULL) {
        b->cap = 0;
        Py_DECREF(b);
        PyErr_NoMemory();
        return -1;
    }
    c->obj[i] = b;
    c->len[i] = 0;
    return 0;
}

static int resize(Buf *b, Py_ssize_t cap) {
    char *grown = PyMem_RawRealloc(b->data, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown, b->cap = cap;
    return 0;
}

/* Room for `more` bytes in growable column i. */
static int reserve(Columns *c, int i, Py_ssize_t more) {
    Py_ssize_t have = c->obj[i]->cap;
    if (c->len[i] + more <= have) return 0;
    return resize(c->obj[i], have * 2 > c->len[i] + more ? have * 2 : c->len[i] + more);
}

static inline void put_i32(Columns *c, int i, Py_ssize_t row, int32_t v) {
    memcpy(col(c, i) + 4 * row, &v, 4);
}
static inline void put_i64(Columns *c, int i, Py_ssize_t row, int64_t v) {
    memcpy(col(c, i) + 8 * row, &v, 8);
}

/* memcpy that writes past the cache (the copy is not read again soon); sfence before use. */
static void stream_copy(char *dst, const unsigned char *src, size_t n) {
#if defined(__x86_64__)
    size_t head = (size_t)(-(uintptr_t)dst & 15);
    if (n >= 128) {
        memcpy(dst, src, head);
        dst += head, src += head, n -= head;
        for (; n >= 64; n -= 64, dst += 64, src += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        }
    }
#endif
    memcpy(dst, src, n);
}

/* memcpy for the short fields (names, keys, hosts): no call for up to 32 bytes. */
static inline void copy_short(char *dst, const void *src, Py_ssize_t n) {
    const char *s = src;
    uint64_t a, b, x, y;
    if (n >= 16 && n <= 32) {
        memcpy(&a, s, 8), memcpy(&b, s + 8, 8), memcpy(&x, s + n - 16, 8), memcpy(&y, s + n - 8, 8);
        memcpy(dst, &a, 8), memcpy(dst + 8, &b, 8), memcpy(dst + n - 16, &x, 8);
        memcpy(dst + n - 8, &y, 8);
    } else if (n >= 8 && n < 16) {
        memcpy(&a, s, 8), memcpy(&b, s + n - 8, 8);
        memcpy(dst, &a, 8), memcpy(dst + n - 8, &b, 8);
    } else if (n < 8) {
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = s[i];
    } else {
        memcpy(dst, s, (size_t)n);
    }
}

/* Append s[0:n] to text column `data`, whose int32 offsets column `off` gets its end. */
static inline int append_text(Columns *c, int off, int data, Py_ssize_t row, const void *s,
                              Py_ssize_t n) {
    if (c->len[data] + n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a text column passed 2 GiB");
        return -1;
    }
    if (c->len[data] + n > c->obj[data]->cap && reserve(c, data, n) < 0) return -1;
    copy_short(col(c, data) + c->len[data], s, n);
    c->len[data] += n;
    put_i32(c, off, row + 1, (int32_t)c->len[data]);
    return 0;
}

/* The body: its CRC is taken from the source, which the copy then finds in cache. */
static int append_body(Columns *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t n) {
    if (c->len[C_BODY] + n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a text column passed 2 GiB");
        return -1;
    }
    if (reserve(c, C_BODY, n) < 0) return -1;
    stream_copy(col(c, C_BODY) + c->len[C_BODY], s, (size_t)n);
    c->len[C_BODY] += n;
    put_i32(c, C_BODY_OFF, row + 1, (int32_t)c->len[C_BODY]);
    return 0;
}

typedef struct {
    const unsigned char *host;
    uint64_t last; /* the 8 bytes `text` was made from */
    char text[HOST_MAX];
    int len;
} HostCache;

/* `a.b.c.d:port` of an 8-byte host (IPv4 + i32 port), as decode_host gives it. */
static int append_host(Columns *c, int off, int data, Py_ssize_t row, const unsigned char *h,
                       HostCache *cache) {
    uint64_t host;
    memcpy(&host, h, 8);
    if (cache->host == NULL || host != cache->last) {
        cache->last = host;
        cache->len = snprintf(cache->text, HOST_MAX, "%u.%u.%u.%u:%d", (unsigned)h[0], (unsigned)h[1],
                              (unsigned)h[2], (unsigned)h[3], (int)be32(h + 4));
        cache->host = h;
    }
    return append_text(c, off, data, row, cache->text, cache->len);
}

typedef struct {
    const unsigned char *key, *value;
    Py_ssize_t key_len, value_len;
    int dropped;
} Entry;

static int entry_cmp(const void *a, const void *b) {
    const Entry *x = *(Entry *const *)a, *y = *(Entry *const *)b;
    Py_ssize_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int r = memcmp(x->key, y->key, (size_t)n);
    if (r) return r;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return x < y ? -1 : (x > y); /* the same name: in the order they came */
}

/* A repeated name keeps its first entry with its last value (a dict's assignment). */
static int dedup(Entry *e, Py_ssize_t k, Entry ***scratch, Py_ssize_t *scratch_cap) {
    if (k <= 16) {
        for (Py_ssize_t j = 1; j < k; j++)
            for (Py_ssize_t i = 0; i < j; i++)
                if (!e[i].dropped && e[i].key_len == e[j].key_len &&
                    memcmp(e[i].key, e[j].key, (size_t)e[j].key_len) == 0) {
                    e[i].value = e[j].value, e[i].value_len = e[j].value_len;
                    e[j].dropped = 1;
                    break;
                }
        return 0;
    }
    if (k > *scratch_cap) {
        Entry **grown = PyMem_Realloc(*scratch, sizeof(Entry *) * (size_t)k);
        if (grown == NULL) return -1;
        *scratch = grown, *scratch_cap = k;
    }
    Entry **order = *scratch;
    for (Py_ssize_t i = 0; i < k; i++) order[i] = &e[i];
    qsort(order, (size_t)k, sizeof(Entry *), entry_cmp);
    for (Py_ssize_t i = 0; i < k;) {
        Py_ssize_t j = i + 1;
        while (j < k && order[j]->key_len == order[i]->key_len &&
               memcmp(order[j]->key, order[i]->key, (size_t)order[i]->key_len) == 0)
            order[j++]->dropped = 1;
        order[i]->value = order[j - 1]->value, order[i]->value_len = order[j - 1]->value_len;
        i = j;
    }
    return 0;
}

typedef struct {
    Entry *entries;
    Py_ssize_t cap, scratch_cap;
    Entry **scratch;
    Py_ssize_t count; /* map entries so far */
    int picked;       /* names whose values also get a column of their own */
    const char *name[MAX_PICKED];
    Py_ssize_t name_len[MAX_PICKED];
} Props;

/* Parse `k\x01v\x02...` of one unit into the map columns. */
static int append_props(Columns *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t n, Props *pr) {
    Py_ssize_t k = 0;
    const unsigned char *end = s + n;
    while (s < end) {
        const unsigned char *item_end = memchr(s, '\x02', (size_t)(end - s));
        if (item_end == NULL) item_end = end;
        const unsigned char *sep = memchr(s, '\x01', (size_t)(item_end - s));
        if (sep != NULL) {
            if (k >= pr->cap) {
                Py_ssize_t cap = pr->cap ? pr->cap * 2 : 16;
                Entry *grown = PyMem_Realloc(pr->entries, sizeof(Entry) * (size_t)cap);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                pr->entries = grown, pr->cap = cap;
            }
            Entry *e = &pr->entries[k++];
            e->key = s, e->key_len = sep - s, e->value = sep + 1, e->value_len = item_end - sep - 1;
            e->dropped = 0;
        }
        s = item_end + 1;
    }
    if (k > 1 && dedup(pr->entries, k, &pr->scratch, &pr->scratch_cap) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    const Entry *hit[MAX_PICKED];
    for (int j = 0; j < pr->picked; j++) hit[j] = NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        Entry *e = &pr->entries[i];
        if (e->dropped) continue;
        for (int j = 0; j < pr->picked; j++)
            if (e->key_len == pr->name_len[j] && e->key_len > 0 && e->key[0] == pr->name[j][0] &&
                memcmp(e->key, pr->name[j], (size_t)e->key_len) == 0)
                hit[j] = e;
        if (pr->count + 2 > INT32_MAX / 4) {
            PyErr_SetString(PyExc_OverflowError, "too many properties in one batch");
            return -1;
        }
        if (reserve(c, C_KEY_OFF, 4) < 0 || reserve(c, C_VALUE_OFF, 4) < 0) return -1;
        pr->count++;
        c->len[C_KEY_OFF] += 4, c->len[C_VALUE_OFF] += 4;
        if (append_text(c, C_KEY_OFF, C_KEY, pr->count - 1, e->key, e->key_len) < 0 ||
            append_text(c, C_VALUE_OFF, C_VALUE, pr->count - 1, e->value, e->value_len) < 0)
            return -1;
    }
    put_i32(c, C_MAP_OFF, row + 1, (int32_t)pr->count);
    for (int j = 0; j < pr->picked; j++) {
        int at = N_COLUMNS + 3 * j;
        if (hit[j] != NULL) col(c, at)[row / 8] |= (char)(1 << (row % 8));
        if (append_text(c, at + 1, at + 2, row, hit[j] ? hit[j]->value : NULL,
                        hit[j] ? hit[j]->value_len : 0) < 0)
            return -1;
    }
    return 0;
}

/* Columns sized for `cap` units (fixed ones) or `hint` bytes (text, growable). */
static int alloc_columns(Columns *c, Py_ssize_t cap, Py_ssize_t hint, int picked) {
    static const int i32[] = {C_TOTAL, C_CRC, C_QUEUE_ID, C_FLAG, C_SYS_FLAG, C_RECONSUME,
                              C_BODY_LEN};
    static const int i64[] = {C_PHYS, C_QUEUE_OFFSET, C_BORN_TS, C_STORE_TS, C_PTX};
    static const int offs[] = {C_BORN_HOST_OFF, C_STORE_HOST_OFF, C_BODY_OFF, C_TOPIC_OFF,
                               C_MAP_OFF, C_KEY_OFF, C_VALUE_OFF};
    for (size_t i = 0; i < sizeof(i32) / sizeof(int); i++)
        if (alloc_col(c, i32[i], 4 * cap) < 0) return -1;
    for (size_t i = 0; i < sizeof(i64) / sizeof(int); i++)
        if (alloc_col(c, i64[i], 8 * cap) < 0) return -1;
    for (size_t i = 0; i < sizeof(offs) / sizeof(int); i++) {
        if (alloc_col(c, offs[i], 4 * (cap + 1)) < 0) return -1;
        put_i32(c, offs[i], 0, 0);
    }
    c->len[C_KEY_OFF] = c->len[C_VALUE_OFF] = 4; /* these two grow by entries, not units */
    if (alloc_col(c, C_MSG_ID, ID_LEN * cap) < 0 || alloc_col(c, C_CRC_OK, (cap + 7) / 8) < 0 ||
        alloc_col(c, C_BORN_HOST, 16 * cap) < 0 || alloc_col(c, C_STORE_HOST, 16 * cap) < 0 ||
        alloc_col(c, C_BODY, hint) < 0 || alloc_col(c, C_TOPIC, 32 * cap) < 0 ||
        alloc_col(c, C_KEY, 32 * cap) < 0 || alloc_col(c, C_VALUE, 64 * cap) < 0)
        return -1;
    memset(col(c, C_CRC_OK), 0, (size_t)(cap + 7) / 8);
    for (int j = 0; j < picked; j++) {
        int at = N_COLUMNS + 3 * j;
        if (alloc_col(c, at, (cap + 7) / 8) < 0 || alloc_col(c, at + 1, 4 * (cap + 1)) < 0 ||
            alloc_col(c, at + 2, 16 * cap) < 0)
            return -1;
        memset(col(c, at), 0, (size_t)(cap + 7) / 8);
        put_i32(c, at + 1, 0, 0);
    }
    c->count = N_COLUMNS + 3 * picked;
    return 0;
}

/* Cut every column to what `n` units used. */
static int trim_columns(Columns *c, Py_ssize_t n) {
    for (int i = 0; i < c->count; i++) {
        Py_ssize_t len;
        switch (i < N_COLUMNS ? i : N_COLUMNS + (i - N_COLUMNS) % 3) {
        case C_TOTAL: case C_CRC: case C_QUEUE_ID: case C_FLAG: case C_SYS_FLAG:
        case C_RECONSUME: case C_BODY_LEN:
            len = 4 * n;
            break;
        case C_PHYS: case C_QUEUE_OFFSET: case C_BORN_TS: case C_STORE_TS: case C_PTX:
            len = 8 * n;
            break;
        case C_BORN_HOST_OFF: case C_STORE_HOST_OFF: case C_BODY_OFF: case C_TOPIC_OFF:
        case C_MAP_OFF:
            len = 4 * (n + 1);
            break;
        case C_MSG_ID:
            len = ID_LEN * n;
            break;
        case C_CRC_OK:
        case N_COLUMNS: /* a picked property's validity */
            len = (n + 7) / 8;
            break;
        case N_COLUMNS + 1: /* its offsets */
            len = 4 * (n + 1);
            break;
        default: /* text data, and the entries' offsets */
            len = c->len[i];
        }
        c->obj[i]->size = len;
    }
    return 0;
}

static const char HEX[] = "0123456789ABCDEF";

/* Row r of every column from the unit, whose body is already the body column's last. */
static int emit(Columns *c, Py_ssize_t r, const Unit *u, int64_t phys, HostCache *born,
                HostCache *store, Props *pr) {
    const unsigned char *p = u->at;
    int32_t stored = be32(p + F_CRC);
    uint32_t crc = accel_crc32(p + HEADER_SIZE, (size_t)u->body_len) & 0x7FFFFFFF;
    if ((int32_t)crc == stored) col(c, C_CRC_OK)[r / 8] |= (char)(1 << (r % 8));
    put_i64(c, C_PHYS, r, phys);
    char *id = col(c, C_MSG_ID) + ID_LEN * r;
    for (int k = 0; k < 8; k++) {
        id[2 * k] = HEX[p[F_STORE_HOST + k] >> 4], id[2 * k + 1] = HEX[p[F_STORE_HOST + k] & 15];
        id[16 + 2 * k] = HEX[p[F_PHYS + k] >> 4], id[17 + 2 * k] = HEX[p[F_PHYS + k] & 15];
    }
    put_i32(c, C_TOTAL, r, u->total);
    put_i32(c, C_CRC, r, stored);
    put_i32(c, C_QUEUE_ID, r, be32(p + F_QUEUE_ID));
    put_i32(c, C_FLAG, r, be32(p + F_FLAG));
    put_i64(c, C_QUEUE_OFFSET, r, be64(p + F_QUEUE_OFFSET));
    put_i32(c, C_SYS_FLAG, r, be32(p + F_SYS_FLAG));
    put_i64(c, C_BORN_TS, r, be64(p + F_BORN_TS));
    put_i64(c, C_STORE_TS, r, be64(p + F_STORE_TS));
    put_i32(c, C_RECONSUME, r, be32(p + F_RECONSUME));
    put_i64(c, C_PTX, r, be64(p + F_PTX));
    put_i32(c, C_BODY_LEN, r, u->body_len);
    if (append_host(c, C_BORN_HOST_OFF, C_BORN_HOST, r, p + F_BORN_HOST, born) < 0 ||
        append_host(c, C_STORE_HOST_OFF, C_STORE_HOST, r, p + F_STORE_HOST, store) < 0 ||
        append_text(c, C_TOPIC_OFF, C_TOPIC, r, u->topic, u->topic_len) < 0)
        return -1;
    return append_props(c, r, u->props, u->props_len, pr);
}

/* scan(buf, file_from, pos, stop, max_units, max_bytes): see the top of this file. One pass:
 * each unit is checked, then copied field by field while its bytes are in cache. */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long file_from, pos, stop, max_units, max_bytes;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "y*LLLLLO!:scan", &view, &file_from, &pos, &stop, &max_units,
                          &max_bytes, &PyTuple_Type, &names))
        return NULL;
    if (file_from < 0 || pos < 0 || stop < 0 || max_units < 1 || max_units > (1 << 24) ||
        max_bytes < 1 || max_bytes > INT32_MAX || PyTuple_GET_SIZE(names) > MAX_PICKED) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: an argument is out of range");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    int64_t size = view.len, bytes = 0, hint = stop - pos;
    PyObject *result = NULL, *bad_rows = PyList_New(0);
    Columns c;
    memset(&c, 0, sizeof(c));
    HostCache born = {NULL, 0, {0}, 0}, store = {NULL, 0, {0}, 0};
    Props pr;
    memset(&pr, 0, sizeof(pr));
    Py_ssize_t n = 0;
    int full = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(names); j++) {
        PyObject *name = PyTuple_GET_ITEM(names, j);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "scan: property names must be bytes");
            goto done;
        }
        pr.name[j] = PyBytes_AS_STRING(name), pr.name_len[j] = PyBytes_GET_SIZE(name);
        pr.picked++;
    }
    if (hint > max_bytes || hint < 0) hint = max_bytes;
    if (bad_rows == NULL ||
        alloc_columns(&c, (Py_ssize_t)max_units, (Py_ssize_t)hint, pr.picked) < 0)
        goto done;
    Unit u;
    while (pos < stop && valid_head(&u, buf, size, file_from, pos)) {
        if (n >= max_units || (n > 0 && bytes + u.total > max_bytes)) {
            full = 1;
            break;
        }
        /* The tail is read after the body is copied, which brings it into cache on the way. */
        __builtin_prefetch(u.at + HEADER_SIZE + u.body_len);
        __builtin_prefetch(u.at + u.total);      /* the next unit's header */
        __builtin_prefetch(u.at + u.total + 64); /* and BODY's length */
        if (append_body(&c, n, u.at + HEADER_SIZE, u.body_len) < 0) goto done;
        if (!valid_tail(&u)) {
            c.len[C_BODY] -= u.body_len; /* not a unit after all: the walk stops before it */
            break;
        }
        int bad = fix_text(&u);
        int failed = bad < 0 || emit(&c, n, &u, file_from + pos, &born, &store, &pr) < 0;
        if (!failed && bad > 0) {
            PyObject *row = PyLong_FromSsize_t(n);
            failed = row == NULL || PyList_Append(bad_rows, row) < 0;
            Py_XDECREF(row);
        }
        Py_XDECREF(u.fixed[0]);
        Py_XDECREF(u.fixed[1]);
        if (failed) goto done;
        n++;
        bytes += u.total;
        pos += u.total;
    }
#if defined(__x86_64__)
    _mm_sfence(); /* the streamed copies are visible to whoever reads the columns */
#endif
    if (trim_columns(&c, n) < 0) goto done;
    PyObject *columns = PyTuple_New(c.count);
    if (columns == NULL) goto done;
    for (int i = 0; i < c.count; i++)
        PyTuple_SET_ITEM(columns, i, (PyObject *)c.obj[i]), c.obj[i] = NULL;
    result = Py_BuildValue("(LNnNO)", (long long)pos, PyBool_FromLong(full), n, columns, bad_rows);
done:
    for (int i = 0; i < ALL_COLUMNS; i++) Py_XDECREF(c.obj[i]);
    PyMem_Free(pr.entries);
    PyMem_Free(pr.scratch);
    Py_XDECREF(bad_rows);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Decode a run of units."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan", "CommitLog units -> Arrow column buffers (unit_batch.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan(void) {
    accel_crc_init();
    if (PyType_Ready(&Buf_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "N_COLUMNS", N_COLUMNS) < 0) Py_CLEAR(m);
    return m;
}
