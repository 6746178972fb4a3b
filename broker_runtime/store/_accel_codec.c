/* Message units: prepare and encode (record_codec.prepare_batch / _encode_run), module init. */
#include "_accel.h"

#define HEADER_SIZE 88
#define MESSAGE_MAGIC 0xDAA320A7u
#define MAX_PROPERTIES_LENGTH 32767
#define PREPARED_FIELDS 16 /* record_codec.Prepared */
#define REQUEST_FIELDS 9   /* record_codec.DispatchRequest */

enum { F_TOPIC, F_BODY, F_PROPS, F_HOST, F_QID, F_FLAG, F_SYSFLAG, F_BORN_TS, F_RECONSUME, F_PTX, N_F };
static const char *const field_names[N_F] = {
    "topic", "body", "properties", "born_host", "queue_id", "flag", "sys_flag",
    "born_timestamp", "reconsume_times", "prepared_transaction_offset",
};
static PyObject *field_str[N_F];
static PyObject *s_TAGS, *s_UNIQ_KEY, *s_KEYS;

/* -- helpers shared with _accel_dispatch.c ------------------------------------------------- */

uint32_t accel_java_hash(PyObject *s, Py_ssize_t start, Py_ssize_t end, uint32_t h) {
    const void *data = PyUnicode_DATA(s);
    int kind = PyUnicode_KIND(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *d = data;
        for (Py_ssize_t i = start; i < end; i++) h = 31 * h + d[i];
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *d = data;
        for (Py_ssize_t i = start; i < end; i++) h = 31 * h + d[i];
    } else {
        const Py_UCS4 *d = data;
        for (Py_ssize_t i = start; i < end; i++) {
            Py_UCS4 c = d[i];
            if (c > 0xFFFF) {
                c -= 0x10000;
                h = 31 * h + (0xD800 | (c >> 10));
                h = 31 * h + (0xDC00 | (c & 0x3FF));
            } else {
                h = 31 * h + c;
            }
        }
    }
    return h;
}

int accel_int(PyObject *o, int64_t lo, int64_t hi, const char *what, int64_t *out) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_OverflowError, "%s out of range", what);
        return -1;
    }
    *out = v;
    return 0;
}

int accel_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

/* -- prepare ------------------------------------------------------------------------------- */

typedef struct {
    PyObject *valid_topics, *hosts;
    PyTypeObject *prepared_type;
    Py_ssize_t max_size;
} PrepareCtx;

/* An exact int in [lo, hi], else 0: then `prepare` decides (and says what is wrong). */
static int plain_int(PyObject *o, int64_t lo, int64_t hi, int64_t *out) {
    if (!PyLong_CheckExact(o)) return 0;
    if (accel_int(o, lo, hi, "", out) == 0) return 1;
    PyErr_Clear();
    return 0;
}

static int has_separator(const char *s, Py_ssize_t n) {
    return memchr(s, 1, (size_t)n) != NULL || memchr(s, 2, (size_t)n) != NULL;
}

/* The Prepared tuple of `msg` when it is the common case: exact types, a topic and born host
 * `prepare` has already seen, every value within its limits. Anything else returns NULL with
 * no exception set, and `prepare` itself handles the message (refusals included), so both paths
 * accept and refuse the same messages. NULL with an exception: out of memory. */
static PyObject *fast_prepare(PrepareCtx *c, PyObject *msg) {
    PyObject *f[N_F] = {0}, *result = NULL, *made[6] = {0};
    int64_t v[N_F];
    int oom = 0;
    for (int i = 0; i < N_F; i++)
        if ((f[i] = PyObject_GetAttr(msg, field_str[i])) == NULL) goto done;
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
    PyObject *k, *val;
    while (PyDict_Next(props, &pos, &k, &val)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(val)) goto done;
        const char *ks = PyUnicode_AsUTF8AndSize(k, &kl), *vs = PyUnicode_AsUTF8AndSize(val, &vl);
        if (ks == NULL || vs == NULL || has_separator(ks, kl) || has_separator(vs, vl)) goto done;
        plen += kl + vl + 2;
    }
    const char *ts = PyUnicode_AsUTF8AndSize(topic, &tlen);
    Py_ssize_t blen = PyBytes_GET_SIZE(body), size = HEADER_SIZE + blen + 1 + tlen + 2 + plen;
    if (ts == NULL || tlen > 255 || plen > MAX_PROPERTIES_LENGTH) goto done;
    if (blen > c->max_size || size > c->max_size) goto done;
    PyObject *host = PyDict_GetItemWithError(c->hosts, f[F_HOST]);
    if (host == NULL || !PyBytes_CheckExact(host) || PyBytes_GET_SIZE(host) != 8) goto done;
    /* The dict's keys are all exact str: these lookups run no Python code and cannot fail. */
    PyObject *tags = PyDict_GetItemWithError(props, s_TAGS);
    PyObject *uniq = PyDict_GetItemWithError(props, s_UNIQ_KEY);
    PyObject *keys = PyDict_GetItemWithError(props, s_KEYS);
    uint32_t tags_code = 0;
    if (tags != NULL && PyUnicode_GET_LENGTH(tags) > 0)
        tags_code = accel_java_hash(tags, 0, PyUnicode_GET_LENGTH(tags), 0);
    uint32_t crc = accel_crc32((const unsigned char *)PyBytes_AS_STRING(body), (size_t)blen);

    oom = 1; /* from here on, a failure is a real error */
    PyObject *tail = made[0] = PyBytes_FromStringAndSize(NULL, 1 + tlen + 2 + plen);
    if (tail == NULL) goto done;
    char *t = PyBytes_AS_STRING(tail);
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
    made[1] = PyLong_FromSsize_t(size);
    made[2] = PyLong_FromUnsignedLong(crc & 0x7FFFFFFF);
    made[3] = PyBytes_FromStringAndSize(raw_host, 4);
    made[4] = PyLong_FromLong(get_be32(raw_host + 4));
    made[5] = PyLong_FromLong((int32_t)tags_code);
    for (int i = 1; i < 6; i++)
        if (made[i] == NULL) goto done;
    result = c->prepared_type->tp_alloc(c->prepared_type, PREPARED_FIELDS);
    if (result == NULL) goto done;
    PyObject *items[PREPARED_FIELDS] = {
        made[1], made[2], f[F_QID], f[F_FLAG], f[F_SYSFLAG], f[F_BORN_TS], made[3], made[4],
        f[F_RECONSUME], f[F_PTX], body, tail, topic, made[5],
        uniq ? uniq : Py_None, keys ? keys : Py_None,
    };
    for (int i = 0; i < PREPARED_FIELDS; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(result, i, items[i]);
    }
done:
    if (result == NULL && !oom) PyErr_Clear();
    for (int i = 0; i < N_F; i++) Py_XDECREF(f[i]);
    for (int i = 0; i < 6; i++) Py_XDECREF(made[i]);
    return result;
}

/* prepare_batch(msgs, max_message_size, valid_topics, hosts, prepare, Prepared) */
static PyObject *prepare_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("prepare_batch", nargs, 6) < 0) return NULL;
    PrepareCtx c = {args[2], args[3], (PyTypeObject *)args[5], PyLong_AsSsize_t(args[1])};
    if (c.max_size == -1 && PyErr_Occurred()) return NULL;
    if (!PyAnySet_Check(c.valid_topics) || !PyDict_Check(c.hosts) || !PyType_Check(args[5]) ||
        !PyType_IsSubtype(c.prepared_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "prepare_batch: bad argument types");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "messages must be a sequence"), *out = NULL;
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if ((out = PyList_New(n)) == NULL) goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(msg); /* `prepare` runs Python code, which could change the list */
        PyObject *p = fast_prepare(&c, msg);
        if (p == NULL && !PyErr_Occurred())
            p = PyObject_CallFunctionObjArgs(args[4], msg, args[1], NULL);
        Py_DECREF(msg);
        if (p == NULL) goto error;
        PyList_SET_ITEM(out, i, p);
    }
    Py_DECREF(seq);
    return out;
error:
    Py_DECREF(seq);
    Py_XDECREF(out);
    return NULL;
}

/* -- encode -------------------------------------------------------------------------------- */

/* Write the unit of Prepared `p` at `w`. Returns 0, or -1 with an exception. */
static int encode_unit(char *w, PyObject *p, int64_t qo, int64_t phys, int64_t now,
                       const char *store_ip, int32_t store_port) {
    static const int i32_at[] = {0, 8, 12, 16, 36, 52, 72}; /* item order: 0 1 2 3 4 7 8 */
    static const int i32_item[] = {0, 1, 2, 3, 4, 7, 8};
    int64_t x;
    for (int i = 0; i < 7; i++) {
        if (accel_int(PyTuple_GET_ITEM(p, i32_item[i]), INT32_MIN, INT32_MAX, "header field", &x))
            return -1;
        put_be32(w + i32_at[i], (uint32_t)x);
    }
    if (accel_int(PyTuple_GET_ITEM(p, 5), INT64_MIN, INT64_MAX, "born timestamp", &x)) return -1;
    put_be64(w + 40, (uint64_t)x);
    if (accel_int(PyTuple_GET_ITEM(p, 9), INT64_MIN, INT64_MAX, "transaction offset", &x))
        return -1;
    put_be64(w + 76, (uint64_t)x);
    PyObject *born_ip = PyTuple_GET_ITEM(p, 6), *body = PyTuple_GET_ITEM(p, 10);
    if (!PyBytes_Check(born_ip) || PyBytes_GET_SIZE(born_ip) != 4) {
        PyErr_SetString(PyExc_ValueError, "born_ip must be 4 bytes");
        return -1;
    }
    put_be32(w + 4, MESSAGE_MAGIC);
    put_be64(w + 20, (uint64_t)qo);
    put_be64(w + 28, (uint64_t)phys);
    memcpy(w + 48, PyBytes_AS_STRING(born_ip), 4);
    put_be64(w + 56, (uint64_t)now);
    memcpy(w + 64, store_ip, 4);
    put_be32(w + 68, (uint32_t)store_port);
    Py_ssize_t blen = PyBytes_GET_SIZE(body);
    put_be32(w + 84, (uint32_t)blen);
    memcpy(w + HEADER_SIZE, PyBytes_AS_STRING(body), (size_t)blen);
    PyObject *tail = PyTuple_GET_ITEM(p, 11);
    memcpy(w + HEADER_SIZE + blen, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
    return 0;
}

/* Queue offset of `key`: this put's (`taken`), else the log's (`qtable`), else 0. New ref. */
static PyObject *next_queue_offset(PyObject *taken, PyObject *qtable, PyObject *key) {
    PyObject *qo = PyDict_GetItemWithError(taken, key);
    if (qo == NULL && !PyErr_Occurred()) qo = PyDict_GetItemWithError(qtable, key);
    if (qo == NULL) return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    Py_INCREF(qo);
    return qo;
}

/* encode_run(DispatchRequest, batch, start, room, base, now, store_ip, store_port, qtable,
 *            taken, results, buf) -> stop */
static PyObject *encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("encode_run", nargs, 12) < 0) return NULL;
    PyTypeObject *rtype = (PyTypeObject *)args[0];
    PyObject *now = args[5], *store_ip = args[6], *qtable = args[8], *taken = args[9];
    PyObject *results = args[10], *buf = args[11];
    int64_t start, room, base, now_v, port;
    if (accel_int(args[2], 0, PY_SSIZE_T_MAX, "start", &start) ||
        accel_int(args[3], INT64_MIN, INT64_MAX, "room", &room) ||
        accel_int(args[4], 0, INT64_MAX, "base", &base) ||
        accel_int(now, INT64_MIN, INT64_MAX, "now", &now_v) ||
        accel_int(args[7], INT32_MIN, INT32_MAX, "store port", &port))
        return NULL;
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(rtype, &PyTuple_Type) ||
        !PyBytes_Check(store_ip) || PyBytes_GET_SIZE(store_ip) != 4 || !PyDict_Check(qtable) ||
        !PyDict_Check(taken) || !PyList_Check(results) || !PyByteArray_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "encode_run: bad argument types");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "batch must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), used = PyByteArray_GET_SIZE(buf), total = used;
    Py_ssize_t stop = start;
    for (; stop < n; stop++) { /* which units fit; each one's bytes must add up to its size */
        PyObject *p = PySequence_Fast_GET_ITEM(seq, stop);
        int64_t size;
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != PREPARED_FIELDS) {
            PyErr_SetString(PyExc_TypeError, "encode_run: batch items must be Prepared");
            goto error;
        }
        if (accel_int(PyTuple_GET_ITEM(p, 0), 0, INT32_MAX, "size", &size)) goto error;
        if (size > room - total) break;
        PyObject *body = PyTuple_GET_ITEM(p, 10), *tail = PyTuple_GET_ITEM(p, 11);
        if (!PyBytes_Check(body) || !PyBytes_Check(tail) ||
            HEADER_SIZE + PyBytes_GET_SIZE(body) + PyBytes_GET_SIZE(tail) != size) {
            PyErr_SetString(PyExc_ValueError, "encode_run: a Prepared size does not add up");
            goto error;
        }
        total += size;
    }
    if (PyByteArray_Resize(buf, total) < 0) goto error;
    char *out = PyByteArray_AS_STRING(buf), *w = out + used;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(seq, i), *topic = PyTuple_GET_ITEM(p, 12);
        PyObject *qid = PyTuple_GET_ITEM(p, 2), *size = PyTuple_GET_ITEM(p, 0);
        PyObject *key = PyTuple_Pack(2, topic, qid), *qo = NULL, *next = NULL, *phys = NULL;
        int64_t qo_v, phys_v = base + (w - out);
        if (key == NULL || (qo = next_queue_offset(taken, qtable, key)) == NULL ||
            accel_int(qo, INT64_MIN, INT64_MAX - 1, "queue offset", &qo_v) ||
            (next = PyLong_FromLongLong(qo_v + 1)) == NULL || PyDict_SetItem(taken, key, next) ||
            encode_unit(w, p, qo_v, phys_v, now_v, PyBytes_AS_STRING(store_ip), (int32_t)port) ||
            (phys = PyLong_FromLongLong(phys_v)) == NULL) {
            Py_XDECREF(key), Py_XDECREF(qo), Py_XDECREF(next);
            goto error;
        }
        Py_DECREF(key), Py_DECREF(next);
        w += PyLong_AsSsize_t(size);
        PyObject *r = rtype->tp_alloc(rtype, REQUEST_FIELDS);
        if (r == NULL) {
            Py_DECREF(qo), Py_DECREF(phys);
            goto error;
        }
        PyObject *items[REQUEST_FIELDS] = {
            topic, qid, qo, phys, size, now, PyTuple_GET_ITEM(p, 13), PyTuple_GET_ITEM(p, 14),
            PyTuple_GET_ITEM(p, 15),
        };
        for (int j = 0; j < REQUEST_FIELDS; j++) {
            if (j != 2 && j != 3) Py_INCREF(items[j]); /* qo and phys: already ours */
            PyTuple_SET_ITEM(r, j, items[j]);
        }
        int failed = PyList_Append(results, r);
        Py_DECREF(r);
        if (failed) goto error;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(stop);
error:
    Py_DECREF(seq);
    return NULL;
}

/* -- module -------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"prepare_batch", (PyCFunction)(void (*)(void))prepare_batch, METH_FASTCALL,
     "record_codec.prepare_batch"},
    {"encode_run", (PyCFunction)(void (*)(void))encode_run, METH_FASTCALL,
     "record_codec._encode_run, DispatchRequest first"},
    {"body_crc", accel_body_crc, METH_O, "record_codec._body_crc"},
    {"split_requests", (PyCFunction)(void (*)(void))accel_split_requests, METH_FASTCALL,
     "dispatcher._split_requests"},
    {"pack_entries", (PyCFunction)(void (*)(void))accel_pack_entries, METH_FASTCALL,
     "consume_queue._pack_entries"},
    {"index_keys", (PyCFunction)(void (*)(void))accel_index_keys, METH_FASTCALL,
     "index_service._index_keys"},
    {"write_entries", (PyCFunction)(void (*)(void))accel_write_entries, METH_FASTCALL,
     "index_file._write_entries"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_accel", "The store's per-message loops in C (see accel.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__accel(void) {
    accel_crc_init();
    for (int i = 0; i < N_F; i++)
        if ((field_str[i] = PyUnicode_InternFromString(field_names[i])) == NULL) return NULL;
    if ((s_TAGS = PyUnicode_InternFromString("TAGS")) == NULL ||
        (s_UNIQ_KEY = PyUnicode_InternFromString("UNIQ_KEY")) == NULL ||
        (s_KEYS = PyUnicode_InternFromString("KEYS")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", ACCEL_ABI) < 0 ||
                      PyModule_AddIntConstant(m, "CLMUL", accel_crc_clmul()) < 0))
        Py_CLEAR(m);
    return m;
}
