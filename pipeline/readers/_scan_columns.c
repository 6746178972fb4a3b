/* The reader kernel's column buffers (see _scan.c): pooled, filled row by row. */
#include "_scan.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

PyTypeObject ScanBuf_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pipeline.readers._scan.Buf",
    .tp_basicsize = sizeof(Buf),
    .tp_dealloc = (destructor)buf_dealloc,
    .tp_as_buffer = &buf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column buffer of one scan (read-only).",
};

static int alloc_col(Columns *c, int i, Py_ssize_t size) {
    Buf *b = PyObject_New(Buf, &ScanBuf_Type);
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

int scan_reserve(Columns *c, int i, Py_ssize_t more) {
    Py_ssize_t have = c->obj[i]->cap;
    if (c->len[i] + more <= have) return 0;
    return resize(c->obj[i], have * 2 > c->len[i] + more ? have * 2 : c->len[i] + more);
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

/* The body: its CRC is taken from the source, which the copy then finds in cache. */
int scan_append_body(Columns *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t n) {
    if (c->len[C_BODY] + n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a text column passed 2 GiB");
        return -1;
    }
    if (scan_reserve(c, C_BODY, n) < 0) return -1;
    stream_copy(col(c, C_BODY) + c->len[C_BODY], s, (size_t)n);
    c->len[C_BODY] += n;
    put_i32(c, C_BODY_OFF, row + 1, (int32_t)c->len[C_BODY]);
    return 0;
}


/* `a.b.c.d:port` of an 8-byte host (IPv4 + i32 port), as decode_host gives it. */
int scan_append_host(Columns *c, int off, int data, Py_ssize_t row, const unsigned char *h,
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


/* Whether a[0:n] == b[0:n], inline for the short names properties have. */
static inline int same(const unsigned char *a, const unsigned char *b, Py_ssize_t n) {
    if (n > 16) return memcmp(a, b, (size_t)n) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

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
                    same(e[i].key, e[j].key, e[j].key_len)) {
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

/* The first byte below 0x03 (a separator, or a NUL) in [p, end), or end. Eight bytes at a
 * time: the lowest byte the test flags is always a true one (a borrow only runs upwards). */
static inline const unsigned char *next_low(const unsigned char *p, const unsigned char *end) {
    for (; end - p >= 8; p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t t = (w - 0x0303030303030303ull) & ~w & 0x8080808080808080ull;
        if (t) return p + (__builtin_ctzll(t) >> 3);
    }
    while (p < end && *p > 2) p++;
    return p;
}

static int add_entry(Props *pr, Py_ssize_t k, const unsigned char *item,
                     const unsigned char *sep, const unsigned char *item_end) {
    if (k >= pr->cap) {
        Py_ssize_t cap = pr->cap ? pr->cap * 2 : 16;
        Entry *grown = PyMem_Realloc(pr->entries, sizeof(Entry) * (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        pr->entries = grown, pr->cap = cap;
    }
    Entry *e = &pr->entries[k];
    e->key = item, e->key_len = sep - item, e->value = sep + 1;
    e->value_len = item_end - sep - 1, e->dropped = 0;
    return 0;
}

/* Parse `k\x01v\x02...` of one unit into the map columns: items end at \x02 (or the end),
 * an item's name ends at its first \x01, an item without one is skipped. One pass finds
 * the separators; the unit's names and values then go out with one room check each. */
int scan_append_props(Columns *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t n, Props *pr) {
    Py_ssize_t k = 0;
    const unsigned char *end = s + n, *p = s, *item = s, *sep = NULL;
    for (;; p++) {
        p = next_low(p, end);
        if (p == end || *p == 2) {
            if (sep != NULL && add_entry(pr, k++, item, sep, p) < 0) return -1;
            if (p == end) break;
            item = p + 1, sep = NULL;
        } else if (*p == 1 && sep == NULL) {
            sep = p;
        }
    }
    if (k > 1 && dedup(pr->entries, k, &pr->scratch, &pr->scratch_cap) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t live = 0, key_bytes = 0, value_bytes = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        const Entry *e = &pr->entries[i];
        if (e->dropped) continue;
        live++, key_bytes += e->key_len, value_bytes += e->value_len;
    }
    if (pr->count + live + 1 > INT32_MAX / 4) {
        PyErr_SetString(PyExc_OverflowError, "too many properties in one batch");
        return -1;
    }
    if (c->len[C_KEY] + key_bytes > INT32_MAX || c->len[C_VALUE] + value_bytes > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a text column passed 2 GiB");
        return -1;
    }
    if (scan_reserve(c, C_KEY_OFF, 4 * live) < 0 || scan_reserve(c, C_VALUE_OFF, 4 * live) < 0 ||
        scan_reserve(c, C_KEY, key_bytes) < 0 || scan_reserve(c, C_VALUE, value_bytes) < 0)
        return -1;
    char *key_off = col(c, C_KEY_OFF), *value_off = col(c, C_VALUE_OFF);
    char *keys = col(c, C_KEY), *values = col(c, C_VALUE);
    Py_ssize_t key_len = c->len[C_KEY], value_len = c->len[C_VALUE], count = pr->count;
    const int picked = pr->picked;
    const Entry *hit[MAX_PICKED];
    for (int j = 0; j < picked; j++) hit[j] = NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        const Entry *e = &pr->entries[i];
        if (e->dropped) continue;
        for (int j = 0; j < picked; j++)
            if (e->key_len == pr->name_len[j] && e->key_len > 0 && e->key[0] == pr->name[j][0] &&
                same(e->key, (const unsigned char *)pr->name[j], e->key_len))
                hit[j] = e;
        copy_short(keys + key_len, e->key, e->key_len);
        copy_short(values + value_len, e->value, e->value_len);
        key_len += e->key_len, value_len += e->value_len, count++;
        int32_t kend = (int32_t)key_len, vend = (int32_t)value_len;
        memcpy(key_off + 4 * count, &kend, 4);
        memcpy(value_off + 4 * count, &vend, 4);
    }
    c->len[C_KEY] = key_len, c->len[C_VALUE] = value_len;
    c->len[C_KEY_OFF] += 4 * live, c->len[C_VALUE_OFF] += 4 * live;
    pr->count = count;
    put_i32(c, C_MAP_OFF, row + 1, (int32_t)count);
    for (int j = 0; j < picked; j++) {
        int at = N_COLUMNS + 3 * j;
        if (hit[j] != NULL) col(c, at)[row / 8] |= (char)(1 << (row % 8));
        if (append_text(c, at + 1, at + 2, row, hit[j] ? hit[j]->value : NULL,
                        hit[j] ? hit[j]->value_len : 0) < 0)
            return -1;
    }
    return 0;
}

/* Columns sized for `cap` units (fixed ones) or `hint` bytes (text, growable). */
int scan_alloc_columns(Columns *c, Py_ssize_t cap, Py_ssize_t hint, int picked) {
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
int scan_trim_columns(Columns *c, Py_ssize_t n) {
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
