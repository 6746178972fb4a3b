/* Shared by the files of the pipeline reader's kernel (_scan.c: the walk and a unit's fields;
 * _scan_columns.c: the column buffers they go to). */
#ifndef MQAUDIT_SCAN_H
#define MQAUDIT_SCAN_H

#include "_accel.h"

#include <stdio.h>
#include <stdlib.h>

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

/* A column buffer: a read-only buffer object for Arrow over memory that goes back to a small
 * pool when Arrow lets go of it, so that the next batch reuses it instead of faulting in
 * fresh pages (which costs as much as the decoding). */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size, cap;
} Buf;

/* After the fixed columns: 3 per picked property (validity bitmap, offsets, text). */
#define MAX_PICKED 16
#define ALL_COLUMNS (N_COLUMNS + 3 * MAX_PICKED)

typedef struct {
    Buf *obj[ALL_COLUMNS];
    Py_ssize_t len[ALL_COLUMNS]; /* bytes used (growable text columns) */
    int count;                    /* columns in use */
} Columns;

extern PyTypeObject ScanBuf_Type;

static inline char *col(Columns *c, int i) { return c->obj[i]->data; }

static inline void put_i32(Columns *c, int i, Py_ssize_t row, int32_t v) {
    memcpy(col(c, i) + 4 * row, &v, 4);
}
static inline void put_i64(Columns *c, int i, Py_ssize_t row, int64_t v) {
    memcpy(col(c, i) + 8 * row, &v, 8);
}

/* Room for `more` bytes in growable column i. */
int scan_reserve(Columns *c, int i, Py_ssize_t more);

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
    if (c->len[data] + n > c->obj[data]->cap && scan_reserve(c, data, n) < 0) return -1;
    copy_short(col(c, data) + c->len[data], s, n);
    c->len[data] += n;
    put_i32(c, off, row + 1, (int32_t)c->len[data]);
    return 0;
}

typedef struct {
    const unsigned char *host;
    uint64_t last; /* the 8 bytes `text` was made from */
    char text[HOST_MAX];
    int len;
} HostCache;

typedef struct {
    const unsigned char *key, *value;
    Py_ssize_t key_len, value_len;
    int dropped;
} Entry;

typedef struct {
    Entry *entries;
    Py_ssize_t cap, scratch_cap;
    Entry **scratch;
    Py_ssize_t count; /* map entries so far */
    int picked;       /* names whose values also get a column of their own */
    const char *name[MAX_PICKED];
    Py_ssize_t name_len[MAX_PICKED];
} Props;

/* Columns sized for `cap` units (fixed ones) or `hint` bytes (text, growable), and `picked`
 * property columns; cut to what `n` units used. */
int scan_alloc_columns(Columns *c, Py_ssize_t cap, Py_ssize_t hint, int picked);
int scan_trim_columns(Columns *c, Py_ssize_t n);

/* Row `row`'s body, hosts and properties (the map, and the picked ones' columns). */
int scan_append_body(Columns *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t n);
int scan_append_host(Columns *c, int off, int data, Py_ssize_t row, const unsigned char *h,
                HostCache *cache);
int scan_append_props(Columns *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t n, Props *pr);

#endif
