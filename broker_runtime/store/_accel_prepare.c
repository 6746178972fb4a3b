/* record_codec.prepare_batch: messages checked and prepared into one PreparedBatch.
 *
 * The batch is a sequence of Prepared tuples to Python (built on access, for tests and tools)
 * but keeps C structs inside, so the write path allocates no tuple per message.
 */
#include "_accel.h"

#include "structmember.h"

#define MAX_PROPERTIES_LENGTH 32767

enum { F_TOPIC, F_BODY, F_PROPS, F_HOST, F_QID, F_FLAG, F_SYSFLAG, F_BORN_TS, F_RECONSUME, F_PTX, N_F };
static const char *const field_names[N_F] = {
    "topic", "body", "properties", "born_host", "queue_id", "flag", "sys_flag",
    "born_timestamp", "reconsume_times", "prepared_transaction_offset",
};
static PyObject *field_str[N_F];
static PyObject *s_TAGS, *s_UNIQ_KEY, *s_KEYS;

typedef struct {
    PyObject *valid_topics, *hosts;
    Py_ssize_t max_size;
    PyObject *host, *host_bytes; /* the last born host looked up, and its bytes (owned) */
} PrepareCtx;

/* Where the fields live in instances of the message class (a slots dataclass), so that they
 * are read without ten attribute lookups per message. Valid while the class is unchanged: any
 * change to it or its bases resets its version tag. */
static PyTypeObject *slots_type;
static unsigned int slots_version;
static Py_ssize_t slots_at[N_F];

static void learn_slots(PyTypeObject *tp) {
    slots_type = NULL;
    if (tp->tp_getattro != PyObject_GenericGetAttr) return;
    for (int i = 0; i < N_F; i++) {
        PyObject *d = _PyType_Lookup(tp, field_str[i]); /* borrowed; gives tp a version tag */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX) return;
        slots_at[i] = m->offset;
    }
    if (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) {
        slots_type = tp;
        slots_version = tp->tp_version_tag;
    }
}

/* The message's fields as new references; 0 when one is missing (unset slot, no attribute). */
static int get_fields(PyObject *msg, PyObject **f) {
    PyTypeObject *tp = Py_TYPE(msg);
    if (tp != slots_type || !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ||
        tp->tp_version_tag != slots_version)
        learn_slots(tp);
    for (int i = 0; i < N_F; i++) {
        if (tp == slots_type)
            f[i] = Py_XNewRef(*(PyObject **)((char *)msg + slots_at[i]));
        else
            f[i] = PyObject_GetAttr(msg, field_str[i]);
        if (f[i] == NULL) return 0;
    }
    return 1;
}

/* An exact int in [lo, hi], else 0: then `prepare` decides (and says what is wrong). */
static int plain_int(PyObject *o, int64_t lo, int64_t hi, int64_t *out) {
    if (!PyLong_CheckExact(o)) return 0;
    if (accel_int(o, lo, hi, "", out) == 0) return 1;
    PyErr_Clear();
    return 0;
}

static int has_separator(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) /* property text is short: a plain loop beats memchr */
        if ((unsigned char)(s[i] - 1) < 2) return 1;
    return 0;
}

/* Whether property name `k` (UTF-8 `ks`, `kl` bytes) is `name` (interned, `text`). */
static inline int is_name(PyObject *k, const char *ks, Py_ssize_t kl, PyObject *name,
                          const char *text, Py_ssize_t len) {
    return k == name || (kl == len && memcmp(ks, text, (size_t)len) == 0);
}

/* The born host's 8 bytes as `prepare` has cached them (borrowed), NULL if not cached. */
static PyObject *host_bytes(PrepareCtx *c, PyObject *host) {
    if (host == c->host) return c->host_bytes;
    PyObject *raw = PyDict_GetItemWithError(c->hosts, host);
    if (raw == NULL || !PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) != 8) return NULL;
    if (PyTuple_CheckExact(host)) { /* held, and a tuple: the identity check stays sound */
        Py_XSETREF(c->host, Py_NewRef(host));
        Py_XSETREF(c->host_bytes, Py_NewRef(raw));
    }
    return raw;
}

static int arena_reserve(PreparedBatch *b, Py_ssize_t more) {
    if (b->arena_len + more <= b->arena_cap) return 0;
    Py_ssize_t cap = Py_MAX(Py_MAX(b->arena_cap * 2, b->arena_len + more), 4096);
    char *arena = PyMem_Realloc(b->arena, (size_t)cap);
    if (arena == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->arena = arena, b->arena_cap = cap;
    return 0;
}

/* Prepare `msg` into `it` when it is the common case: exact types, a topic and born host that
 * `prepare` has already seen, every value within its limits. Returns 1 then; 0 (no exception
 * set) when `prepare` itself must handle the message, refusals included, so both paths accept
 * and refuse the same messages; -1 when out of memory. The CRC is left to the caller. */
static int fast_prepare(PrepareCtx *c, PreparedBatch *b, PyObject *msg, BatchItem *it) {
    PyObject *f[N_F] = {0};
    int64_t v[N_F];
    int ok = 0;
    if (!get_fields(msg, f)) goto done;
    PyObject *topic = f[F_TOPIC], *body = f[F_BODY], *props = f[F_PROPS];
    if (!PyUnicode_CheckExact(topic) || PySet_Contains(c->valid_topics, topic) != 1) goto done;
    if (!PyBytes_CheckExact(body) || !PyDict_CheckExact(props)) goto done;
    if (!plain_int(f[F_QID], 0, INT32_MAX, &v[F_QID]) ||
        !plain_int(f[F_FLAG], INT32_MIN, INT32_MAX, &v[F_FLAG]) ||
        !plain_int(f[F_SYSFLAG], INT32_MIN, INT32_MAX, &v[F_SYSFLAG]) ||
        !plain_int(f[F_BORN_TS], INT64_MIN, INT64_MAX, &v[F_BORN_TS]) ||
        !plain_int(f[F_RECONSUME], INT32_MIN, INT32_MAX, &v[F_RECONSUME]) ||
        !plain_int(f[F_PTX], INT64_MIN, INT64_MAX, &v[F_PTX]))
        goto done;
    Py_ssize_t plen = 0, pos = 0, kl, vl, tlen;
    PyObject *k, *val, *tags = NULL, *uniq = NULL, *keys = NULL;
    while (PyDict_Next(props, &pos, &k, &val)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(val)) goto done;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl), *vs = PyUnicode_AsUTF8AndSize(val, &vl);
        if (ks == NULL || vs == NULL || has_separator(ks, kl) || has_separator(vs, vl)) goto done;
        plen += kl + vl + 2;
        /* The properties TAGS, UNIQ_KEY and KEYS (keys are unique: each matches once at most). */
        if (is_name(k, ks, kl, s_TAGS, "TAGS", 4))
            tags = val;
        else if (is_name(k, ks, kl, s_UNIQ_KEY, "UNIQ_KEY", 8))
            uniq = val;
        else if (is_name(k, ks, kl, s_KEYS, "KEYS", 4))
            keys = val;
    }
    const char *ts = PyUnicode_AsUTF8AndSize(topic, &tlen);
    Py_ssize_t blen = PyBytes_GET_SIZE(body), size = HEADER_SIZE + blen + 1 + tlen + 2 + plen;
    if (ts == NULL || tlen > 255 || plen > MAX_PROPERTIES_LENGTH) goto done;
    if (blen > c->max_size || size > c->max_size || size > INT32_MAX) goto done;
    PyObject *host = host_bytes(c, f[F_HOST]);
    if (host == NULL) goto done;

    ok = -1; /* accepted: from here on a failure is a real error */
    if (arena_reserve(b, 1 + tlen + 2 + plen) < 0) goto done;
    it->tail_at = b->arena_len, it->tail_len = 1 + tlen + 2 + plen;
    char *t = b->arena + b->arena_len;
    b->arena_len += it->tail_len;
    *t++ = (char)tlen;
    memcpy(t, ts, (size_t)tlen);
    t += tlen;
    put_be16(t, (uint16_t)plen);
    t += 2;
    pos = 0;
    while (PyDict_Next(props, &pos, &k, &val)) { /* no Python code ran: the same items */
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl), *vs = PyUnicode_AsUTF8AndSize(val, &vl);
        memcpy(t, ks, (size_t)kl);
        t[kl] = '\x01';
        memcpy(t + kl + 1, vs, (size_t)vl);
        t[kl + 1 + vl] = '\x02';
        t += kl + vl + 2;
    }
    const char *raw_host = PyBytes_AS_STRING(host);
    memcpy(it->born_ip, raw_host, 4);
    it->born_port = get_be32(raw_host + 4);
    it->tags_code = tags != NULL && PyUnicode_GET_LENGTH(tags) > 0
                        ? (int32_t)accel_java_hash(tags, 0, PyUnicode_GET_LENGTH(tags), 0)
                        : 0;
    it->size = (int32_t)size, it->crc = 0, it->qid_v = (int32_t)v[F_QID];
    it->flag = (int32_t)v[F_FLAG], it->sys_flag = (int32_t)v[F_SYSFLAG];
    it->reconsume = (int32_t)v[F_RECONSUME], it->born_ts = v[F_BORN_TS], it->ptx = v[F_PTX];
    it->topic = Py_NewRef(topic), it->qid = Py_NewRef(f[F_QID]), it->body = Py_NewRef(body);
    it->uniq = Py_XNewRef(uniq), it->keys = Py_XNewRef(keys);
    ok = 1;
done:
    if (ok == 0) PyErr_Clear();
    for (int i = 0; i < N_F; i++) Py_XDECREF(f[i]);
    return ok;
}

/* -- PreparedBatch ------------------------------------------------------------------------ */

static int batch_traverse(PreparedBatch *b, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < b->n; i++) {
        BatchItem *it = &b->items[i];
        Py_VISIT(it->prepared);
        Py_VISIT(it->topic);
        Py_VISIT(it->qid);
        Py_VISIT(it->body);
        Py_VISIT(it->uniq);
        Py_VISIT(it->keys);
    }
    Py_VISIT(b->prepared_type);
    return 0;
}

static int batch_clear(PreparedBatch *b) {
    for (Py_ssize_t i = 0; i < b->n; i++) {
        BatchItem *it = &b->items[i];
        Py_CLEAR(it->prepared);
        Py_CLEAR(it->topic);
        Py_CLEAR(it->qid);
        Py_CLEAR(it->body);
        Py_CLEAR(it->uniq);
        Py_CLEAR(it->keys);
    }
    Py_CLEAR(b->prepared_type);
    return 0;
}

static void batch_dealloc(PreparedBatch *b) {
    PyObject_GC_UnTrack(b);
    batch_clear(b);
    PyMem_Free(b->items);
    PyMem_Free(b->arena);
    PyObject_GC_Del(b);
}

static Py_ssize_t batch_len(PreparedBatch *b) { return b->n; }

/* The Prepared tuple of item i, equal to what `prepare` returns for the message. */
static PyObject *batch_item(PreparedBatch *b, Py_ssize_t i) {
    if (i < 0 || i >= b->n) {
        PyErr_SetString(PyExc_IndexError, "PreparedBatch index out of range");
        return NULL;
    }
    BatchItem *it = &b->items[i];
    if (it->prepared != NULL) return Py_NewRef(it->prepared);
    PyObject *p = b->prepared_type->tp_alloc(b->prepared_type, PREPARED_FIELDS);
    if (p == NULL) return NULL;
    PyObject *items[PREPARED_FIELDS] = {
        PyLong_FromLong(it->size), PyLong_FromLong(it->crc), Py_NewRef(it->qid),
        PyLong_FromLong(it->flag), PyLong_FromLong(it->sys_flag), PyLong_FromLongLong(it->born_ts),
        PyBytes_FromStringAndSize(it->born_ip, 4), PyLong_FromLong(it->born_port),
        PyLong_FromLong(it->reconsume), PyLong_FromLongLong(it->ptx), Py_NewRef(it->body),
        PyBytes_FromStringAndSize(b->arena + it->tail_at, it->tail_len), Py_NewRef(it->topic),
        PyLong_FromLong(it->tags_code), Py_NewRef(it->uniq ? it->uniq : Py_None),
        Py_NewRef(it->keys ? it->keys : Py_None),
    };
    int failed = 0;
    for (int j = 0; j < PREPARED_FIELDS; j++) {
        failed |= items[j] == NULL;
        PyTuple_SET_ITEM(p, j, items[j]); /* a NULL item is fine for the tuple's dealloc */
    }
    if (failed) Py_CLEAR(p);
    return p;
}

static PySequenceMethods batch_as_sequence = {
    .sq_length = (lenfunc)batch_len,
    .sq_item = (ssizeargfunc)batch_item,
};

static PyMemberDef batch_members[] = {
    {"largest", T_PYSSIZET, offsetof(PreparedBatch, largest), READONLY, "the biggest unit's size"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject AccelBatch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker_runtime.store._accel.PreparedBatch",
    .tp_basicsize = sizeof(PreparedBatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Prepared messages, in order (a sequence of record_codec.Prepared).",
    .tp_traverse = (traverseproc)batch_traverse,
    .tp_clear = (inquiry)batch_clear,
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_as_sequence = &batch_as_sequence,
    .tp_members = batch_members,
};

int accel_prepare_init(void) {
    for (int i = 0; i < N_F; i++)
        if ((field_str[i] = PyUnicode_InternFromString(field_names[i])) == NULL) return -1;
    if ((s_TAGS = PyUnicode_InternFromString("TAGS")) == NULL ||
        (s_UNIQ_KEY = PyUnicode_InternFromString("UNIQ_KEY")) == NULL ||
        (s_KEYS = PyUnicode_InternFromString("KEYS")) == NULL)
        return -1;
    return PyType_Ready(&AccelBatch_Type);
}

static void compute_crcs(PreparedBatch *b) {
    for (Py_ssize_t i = 0; i < b->n; i++) {
        BatchItem *it = &b->items[i];
        if (it->prepared == NULL) {
            const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(it->body);
            it->crc = (int32_t)(accel_crc32(body, (size_t)PyBytes_GET_SIZE(it->body)) & 0x7FFFFFFF);
        }
    }
}

/* prepare_batch(msgs, max_message_size, valid_topics, hosts, prepare, Prepared) */
PyObject *accel_prepare_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("prepare_batch", nargs, 6) < 0) return NULL;
    PrepareCtx c = {args[2], args[3], PyLong_AsSsize_t(args[1]), NULL, NULL};
    if (c.max_size == -1 && PyErr_Occurred()) return NULL;
    if (!PyAnySet_Check(c.valid_topics) || !PyDict_Check(c.hosts) || !PyType_Check(args[5]) ||
        !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "prepare_batch: bad argument types");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "messages must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), body_bytes = 0;
    PreparedBatch *b = PyObject_GC_New(PreparedBatch, &AccelBatch_Type);
    if (b == NULL) goto error;
    b->n = n, b->arena = NULL, b->arena_len = b->arena_cap = b->largest = 0;
    b->prepared_type = (PyTypeObject *)Py_NewRef(args[5]);
    if ((b->items = PyMem_Calloc((size_t)(n ? n : 1), sizeof(BatchItem))) == NULL) {
        b->n = 0;
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        BatchItem *it = &b->items[i];
        PyObject *msg = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i)); /* `prepare` runs Python */
        int fast = fast_prepare(&c, b, msg, it);
        if (fast == 0) {
            int64_t size;
            PyObject *p = PyObject_CallFunctionObjArgs(args[4], msg, args[1], NULL);
            it->prepared = p;
            if (p != NULL && (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != PREPARED_FIELDS)) {
                PyErr_SetString(PyExc_TypeError, "prepare must return a Prepared");
                fast = -1;
            } else if (p == NULL || accel_int(PyTuple_GET_ITEM(p, 0), 0, INT32_MAX, "size", &size)) {
                fast = -1;
            } else {
                it->size = (int32_t)size;
            }
        } else if (fast == 1) {
            body_bytes += PyBytes_GET_SIZE(it->body);
        }
        Py_DECREF(msg);
        if (fast < 0) goto error;
        b->largest = Py_MAX(b->largest, it->size);
    }
    if (body_bytes >= GIL_FREE_BYTES) { /* the bodies are immutable and ours: let others run */
        Py_BEGIN_ALLOW_THREADS
        compute_crcs(b);
        Py_END_ALLOW_THREADS
    } else {
        compute_crcs(b);
    }
    Py_DECREF(seq);
    Py_XDECREF(c.host), Py_XDECREF(c.host_bytes);
    PyObject_GC_Track(b);
    return (PyObject *)b;
error:
    Py_DECREF(seq);
    Py_XDECREF(c.host), Py_XDECREF(c.host_bytes);
    Py_XDECREF(b);
    return NULL;
}
