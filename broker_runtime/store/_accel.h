/* The store's C kernels (module broker_runtime.store._accel): shared helpers and declarations.
 *
 * Every kernel is the twin of a pure-Python function named in its comment; that function is the
 * reference (tests compare both byte for byte) and runs when this extension is not built.
 */
#ifndef MQAUDIT_ACCEL_H
#define MQAUDIT_ACCEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ACCEL_ABI 3 /* broker_runtime.store.accel.ABI */

#define HEADER_SIZE 88      /* a message unit's fixed fields, BODY's length included */
#define PREPARED_FIELDS 16  /* record_codec.Prepared */
#define REQUEST_FIELDS 9    /* record_codec.DispatchRequest */
#define GIL_FREE_BYTES 65536 /* byte work at least this big runs with the GIL released */

/* Big-endian stores, as Java's ByteBuffer writes them. */
static inline void put_be16(char *p, uint16_t v) {
    v = __builtin_bswap16(v);
    memcpy(p, &v, 2);
}
static inline void put_be32(char *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}
static inline void put_be64(char *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}
static inline int32_t get_be32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)__builtin_bswap32(v);
}

/* -- _accel_module.c ---------------------------------------------------------------------- */

/* Java's String.hashCode over s[start:end] (UTF-16 units: astral code points count as their
 * surrogate pair), continuing from `h`. `s` must be a ready str. */
uint32_t accel_java_hash(PyObject *s, Py_ssize_t start, Py_ssize_t end, uint32_t h);

/* An int in [lo, hi] (any object with __index__); -1 with OverflowError/TypeError otherwise. */
int accel_int(PyObject *o, int64_t lo, int64_t hi, const char *what, int64_t *out);

int accel_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want);

/* (topic, queue id) -> slot, for the keys of one call: saves a tuple and dict operations per
 * message. Only exact str topics and exact int ids are cached (equal keys are then equal
 * values); accel_queue_slot returns NULL for others, or when the table is full. */
#define QUEUE_SLOTS 64
typedef struct {
    PyObject *key; /* (topic, queue id), owned; NULL: free */
    Py_hash_t hash;
    int64_t qid;
    int64_t next;    /* encode_run: the next queue offset */
    PyObject *value; /* split_requests: the queue's list (borrowed from the result dict) */
} QueueSlot;
typedef struct {
    QueueSlot slots[QUEUE_SLOTS];
    int used;
} QueueTable;
QueueSlot *accel_queue_slot(QueueTable *t, PyObject *topic, PyObject *qid, int *created);
void accel_queue_clear(QueueTable *t);

/* -- _accel_crc.c ------------------------------------------------------------------------- */

/* zlib's crc32(0, buf, len), faster; accel_crc_init once before use. */
void accel_crc_init(void);
int accel_crc_clmul(void);
uint32_t accel_crc32(const unsigned char *buf, size_t len);
PyObject *accel_body_crc(PyObject *self, PyObject *arg);

/* -- _accel_prepare.c: record_codec.prepare_batch ----------------------------------------- */

/* One prepared message: either `prepared` (a Prepared tuple from the Python path) or the
 * fields below (the C path, which keeps no tuple per message). */
typedef struct {
    PyObject *prepared;
    PyObject *topic, *qid, *body, *uniq, *keys; /* owned; uniq/keys NULL for None */
    int64_t born_ts, ptx;
    int32_t size, crc, qid_v, flag, sys_flag, reconsume, tags_code, born_port;
    char born_ip[4];
    Py_ssize_t tail_at, tail_len; /* TOPIC and PROPERTIES, in the batch's arena */
} BatchItem;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    BatchItem *items;
    char *arena;
    Py_ssize_t arena_len, arena_cap, largest;
    PyTypeObject *prepared_type;
} PreparedBatch;

extern PyTypeObject AccelBatch_Type;
PyObject *accel_prepare_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
int accel_prepare_init(void);

/* -- _accel_encode.c: record_codec._encode_run -------------------------------------------- */

PyObject *accel_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* -- _accel_rows.c: dispatcher._split_requests ------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *source; /* tuple of DispatchRequests (each checked: a tuple of REQUEST_FIELDS+) */
    Py_ssize_t n;
    Py_ssize_t *idx;  /* the rows' positions in `source` */
    int index_rows;   /* items are index rows (topic, phys, time, uniq, keys), not requests */
} RequestRows;

extern PyTypeObject AccelRows_Type;
PyObject *accel_split_requests(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* The DispatchRequest behind row i (borrowed). */
static inline PyObject *accel_rows_request(RequestRows *r, Py_ssize_t i) {
    return PyTuple_GET_ITEM(r->source, r->idx[i]);
}

/* -- _accel_dispatch.c -------------------------------------------------------------------- */

PyObject *accel_pack_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *accel_index_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *accel_write_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
