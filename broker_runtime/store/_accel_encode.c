/* record_codec._encode_run: message units into the log's buffer, queue offsets assigned. */
#include "_accel.h"

#define MESSAGE_MAGIC 0xDAA320A7u

/* One unit to write: every field but the store's, which are the same for the whole run. */
typedef struct {
    const char *body, *tail, *born_ip;
    Py_ssize_t blen, tlen;
    int64_t qo, phys, born_ts, ptx;
    int32_t size, crc, qid, flag, sys_flag, born_port, reconsume;
} Unit;

/* What the DispatchRequest of a unit takes, borrowed; size and tags NULL: made from the
 * unit's size and `tags_code`. */
typedef struct {
    PyObject *topic, *qid, *size, *tags, *uniq, *keys;
    int32_t tags_code;
} Parts;

static int from_prepared(PyObject *p, Unit *u, Parts *r) {
    static const int item[] = {0, 1, 2, 3, 4, 7, 8};
    int32_t *dst[] = {&u->size, &u->crc, &u->qid, &u->flag, &u->sys_flag, &u->born_port,
                      &u->reconsume};
    int64_t x;
    if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != PREPARED_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "encode_run: batch items must be Prepared");
        return -1;
    }
    for (int i = 0; i < 7; i++) {
        if (accel_int(PyTuple_GET_ITEM(p, item[i]), INT32_MIN, INT32_MAX, "header field", &x))
            return -1;
        *dst[i] = (int32_t)x;
    }
    if (accel_int(PyTuple_GET_ITEM(p, 5), INT64_MIN, INT64_MAX, "born timestamp", &u->born_ts) ||
        accel_int(PyTuple_GET_ITEM(p, 9), INT64_MIN, INT64_MAX, "transaction offset", &u->ptx))
        return -1;
    PyObject *ip = PyTuple_GET_ITEM(p, 6), *body = PyTuple_GET_ITEM(p, 10);
    PyObject *tail = PyTuple_GET_ITEM(p, 11);
    if (!PyBytes_Check(ip) || PyBytes_GET_SIZE(ip) != 4 || !PyBytes_Check(body) ||
        !PyBytes_Check(tail) ||
        HEADER_SIZE + PyBytes_GET_SIZE(body) + PyBytes_GET_SIZE(tail) != u->size) {
        PyErr_SetString(PyExc_ValueError, "encode_run: a Prepared's parts do not add up");
        return -1;
    }
    u->born_ip = PyBytes_AS_STRING(ip);
    u->body = PyBytes_AS_STRING(body), u->blen = PyBytes_GET_SIZE(body);
    u->tail = PyBytes_AS_STRING(tail), u->tlen = PyBytes_GET_SIZE(tail);
    *r = (Parts){PyTuple_GET_ITEM(p, 12), PyTuple_GET_ITEM(p, 2), PyTuple_GET_ITEM(p, 0),
                 PyTuple_GET_ITEM(p, 13), PyTuple_GET_ITEM(p, 14), PyTuple_GET_ITEM(p, 15), 0};
    return 0;
}

static int from_batch(PreparedBatch *b, Py_ssize_t i, Unit *u, Parts *r) {
    BatchItem *it = &b->items[i];
    if (it->prepared != NULL) return from_prepared(it->prepared, u, r);
    *u = (Unit){PyBytes_AS_STRING(it->body), b->arena + it->tail_at, it->born_ip,
                PyBytes_GET_SIZE(it->body), it->tail_len, 0, 0, it->born_ts, it->ptx,
                it->size, it->crc, it->qid_v, it->flag, it->sys_flag, it->born_port,
                it->reconsume};
    *r = (Parts){it->topic, it->qid, NULL, NULL, it->uniq ? it->uniq : Py_None,
                 it->keys ? it->keys : Py_None, it->tags_code};
    return 0;
}

static void write_unit(char *w, const Unit *u, int64_t now, const char *store_ip, int32_t port) {
    put_be32(w, (uint32_t)u->size);
    put_be32(w + 4, MESSAGE_MAGIC);
    put_be32(w + 8, (uint32_t)u->crc);
    put_be32(w + 12, (uint32_t)u->qid);
    put_be32(w + 16, (uint32_t)u->flag);
    put_be64(w + 20, (uint64_t)u->qo);
    put_be64(w + 28, (uint64_t)u->phys);
    put_be32(w + 36, (uint32_t)u->sys_flag);
    put_be64(w + 40, (uint64_t)u->born_ts);
    memcpy(w + 48, u->born_ip, 4);
    put_be32(w + 52, (uint32_t)u->born_port);
    put_be64(w + 56, (uint64_t)now);
    memcpy(w + 64, store_ip, 4);
    put_be32(w + 68, (uint32_t)port);
    put_be32(w + 72, (uint32_t)u->reconsume);
    put_be64(w + 76, (uint64_t)u->ptx);
    put_be32(w + 84, (uint32_t)u->blen);
    memcpy(w + HEADER_SIZE, u->body, (size_t)u->blen);
    memcpy(w + HEADER_SIZE + u->blen, u->tail, (size_t)u->tlen);
}

/* Queue offset of `key`: this put's (`taken`), else the log's (`qtable`), else 0. New ref. */
static PyObject *queue_offset(PyObject *taken, PyObject *qtable, PyObject *key) {
    PyObject *qo = PyDict_GetItemWithError(taken, key);
    if (qo == NULL && !PyErr_Occurred()) qo = PyDict_GetItemWithError(qtable, key);
    if (qo == NULL) return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    return Py_NewRef(qo);
}

/* The cached next offsets into `taken`, in first-use order (as the Python loop inserts them). */
static int flush_queues(QueueTable *t, const int *order, PyObject *taken) {
    int failed = 0;
    for (int i = 0; i < t->used && !failed; i++) {
        QueueSlot *s = &t->slots[order[i]];
        PyObject *next = PyLong_FromLongLong(s->next);
        failed = next == NULL || PyDict_SetItem(taken, s->key, next) < 0;
        Py_XDECREF(next);
    }
    accel_queue_clear(t);
    return failed ? -1 : 0;
}

/* The queue offset for (topic, qid), taken from the table or, when it cannot hold the key, from
 * the dicts (after writing the table back). New ref. */
static PyObject *assign(QueueTable *t, int *order, PyObject *taken, PyObject *qtable, Parts *r) {
    int created;
    QueueSlot *s = accel_queue_slot(t, r->topic, r->qid, &created);
    if (s != NULL) {
        if (created) {
            order[t->used - 1] = (int)(s - t->slots);
            PyObject *qo = queue_offset(taken, qtable, s->key);
            int failed =
                qo == NULL || accel_int(qo, INT64_MIN, INT64_MAX - 1, "queue offset", &s->next);
            Py_XDECREF(qo);
            if (failed) return NULL;
        }
        return PyLong_FromLongLong(s->next++);
    }
    if (PyErr_Occurred() || flush_queues(t, order, taken) < 0) return NULL;
    PyObject *key = PyTuple_Pack(2, r->topic, r->qid), *next = NULL, *one = PyLong_FromLong(1);
    PyObject *qo = key && one ? queue_offset(taken, qtable, key) : NULL;
    if (qo != NULL) next = PyNumber_Add(qo, one);
    if (next == NULL || PyDict_SetItem(taken, key, next) < 0) Py_CLEAR(qo);
    Py_XDECREF(key), Py_XDECREF(next), Py_XDECREF(one);
    return qo;
}

static int atomic(PyObject *o) {
    return o == Py_None || PyUnicode_CheckExact(o) || PyLong_CheckExact(o);
}

/* The ints last made for sizes or tag codes: the messages of a batch mostly share a few. */
#define INT_CACHE 8
typedef struct {
    int64_t v[INT_CACHE];
    PyObject *o[INT_CACHE];
    int next;
} IntCache;

static PyObject *cached_int(IntCache *c, int64_t v) {
    for (int i = 0; i < INT_CACHE; i++)
        if (c->o[i] != NULL && c->v[i] == v) return Py_NewRef(c->o[i]);
    PyObject *o = PyLong_FromLongLong(v);
    if (o != NULL) {
        Py_XSETREF(c->o[c->next], Py_NewRef(o));
        c->v[c->next] = v;
        c->next = (c->next + 1) % INT_CACHE;
    }
    return o;
}

static void clear_ints(IntCache *c) {
    for (int i = 0; i < INT_CACHE; i++) Py_CLEAR(c->o[i]);
}

static PyObject *request(PyTypeObject *type, Parts *r, PyObject *qo, int64_t phys, int32_t size,
                         PyObject *now, IntCache *ints) {
    PyObject *items[REQUEST_FIELDS] = {
        Py_NewRef(r->topic), Py_NewRef(r->qid), qo, PyLong_FromLongLong(phys),
        r->size ? Py_NewRef(r->size) : cached_int(&ints[0], size), Py_NewRef(now),
        r->tags ? Py_NewRef(r->tags) : cached_int(&ints[1], r->tags_code), Py_NewRef(r->uniq),
        Py_NewRef(r->keys),
    };
    PyObject *req = type->tp_alloc(type, REQUEST_FIELDS);
    int failed = req == NULL;
    for (int j = 0; j < REQUEST_FIELDS; j++) {
        failed |= items[j] == NULL;
        if (req != NULL)
            PyTuple_SET_ITEM(req, j, items[j]);
        else
            Py_XDECREF(items[j]);
    }
    if (failed) {
        Py_CLEAR(req);
    } else if (atomic(r->topic) && atomic(r->qid) && atomic(now) && atomic(r->uniq) &&
               atomic(r->keys) && (r->size == NULL || atomic(r->size)) &&
               (r->tags == NULL || atomic(r->tags))) {
        PyObject_GC_UnTrack(req); /* nothing in it can be part of a cycle: GC need not visit */
    }
    return req;
}

/* encode_run(DispatchRequest, batch, start, room, base, now, store_ip, store_port, qtable,
 *            taken, results, buf) -> stop
 * First the queue offsets and requests (with the GIL), then the bytes (without, when many). */
PyObject *accel_encode_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("encode_run", nargs, 12) < 0) return NULL;
    PyTypeObject *rtype = (PyTypeObject *)args[0];
    PyObject *now = args[5], *store_ip = args[6], *qtable = args[8], *taken = args[9];
    PyObject *results = args[10], *buf = args[11], *seq = NULL, *out = NULL;
    int64_t start, room, base, now_v, port;
    if (accel_int(args[2], 0, PY_SSIZE_T_MAX, "start", &start) ||
        accel_int(args[3], INT64_MIN, INT64_MAX, "room", &room) ||
        accel_int(args[4], 0, INT64_MAX / 2, "base", &base) ||
        accel_int(now, INT64_MIN, INT64_MAX, "now", &now_v) ||
        accel_int(args[7], INT32_MIN, INT32_MAX, "store port", &port))
        return NULL;
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(rtype, &PyTuple_Type) ||
        !PyBytes_Check(store_ip) || PyBytes_GET_SIZE(store_ip) != 4 || !PyDict_Check(qtable) ||
        !PyDict_Check(taken) || !PyList_Check(results) || !PyByteArray_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "encode_run: bad argument types");
        return NULL;
    }
    PreparedBatch *batch = NULL;
    Py_ssize_t n;
    if (Py_IS_TYPE(args[1], &AccelBatch_Type)) {
        batch = (PreparedBatch *)args[1];
        n = batch->n;
    } else {
        if ((seq = PySequence_Fast(args[1], "batch must be a sequence")) == NULL) return NULL;
        n = PySequence_Fast_GET_SIZE(seq);
    }
    Py_ssize_t used = PyByteArray_GET_SIZE(buf), total = used, stop = start, k = 0;
    Unit *units = PyMem_Malloc(sizeof(Unit) * (size_t)(n > start ? n - start : 1));
    QueueTable table;
    int order[QUEUE_SLOTS];
    IntCache ints[2]; /* sizes, tag codes */
    memset(&table, 0, sizeof(table));
    memset(ints, 0, sizeof(ints));
    if (units == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; stop < n; stop++, k++) {
        Unit *u = &units[k];
        Parts r;
        if (batch ? from_batch(batch, stop, u, &r)
                  : from_prepared(PySequence_Fast_GET_ITEM(seq, stop), u, &r))
            goto done;
        if (u->size > room - total) break;
        u->phys = base + total;
        total += u->size;
        PyObject *qo = assign(&table, order, taken, qtable, &r);
        if (qo == NULL || accel_int(qo, INT64_MIN, INT64_MAX, "queue offset", &u->qo)) {
            Py_XDECREF(qo);
            goto done;
        }
        PyObject *req = request(rtype, &r, qo, u->phys, u->size, now, ints);
        int failed = req == NULL || PyList_Append(results, req) < 0;
        Py_XDECREF(req);
        if (failed) goto done;
    }
    Py_buffer view; /* an export: while we write, nobody can resize `buf` */
    if (flush_queues(&table, order, taken) < 0 || PyByteArray_Resize(buf, total) < 0 ||
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0)
        goto done;
    char *w = (char *)view.buf + used;
    const char *ip = PyBytes_AS_STRING(store_ip);
    /* A PreparedBatch cannot change, and it holds what the units point into: no GIL needed.
     * A list of Prepared could be changed by another thread meanwhile: keep the GIL. */
    int alone = batch != NULL && total - used >= GIL_FREE_BYTES;
    PyThreadState *released = alone ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < k; w += units[i].size, i++)
        write_unit(w, &units[i], now_v, ip, (int32_t)port);
    if (released != NULL) PyEval_RestoreThread(released);
    PyBuffer_Release(&view);
    out = PyLong_FromSsize_t(stop);
done:
    if (out == NULL) { /* `taken` as far as the Python loop would have got */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (flush_queues(&table, order, taken) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    clear_ints(&ints[0]);
    clear_ints(&ints[1]);
    PyMem_Free(units);
    Py_XDECREF(seq);
    return out;
}
