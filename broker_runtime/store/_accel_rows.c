/* dispatcher._split_requests: a dispatch batch split by queue, without a list or tuple per row.
 *
 * RequestRows is a read-only sequence over some of the batch's requests (kept in one tuple):
 * a queue's requests, or the index rows (topic, log offset, store time, UNIQ_KEY, KEYS) of
 * those with keys, made on access. The pack_entries and index_keys kernels read the requests
 * behind it directly.
 */
#include "_accel.h"

static int rows_traverse(RequestRows *r, visitproc visit, void *arg) {
    Py_VISIT(r->source);
    return 0;
}

static int rows_clear(RequestRows *r) {
    Py_CLEAR(r->source);
    return 0;
}

static void rows_dealloc(RequestRows *r) {
    PyObject_GC_UnTrack(r);
    rows_clear(r);
    PyMem_Free(r->idx);
    PyObject_GC_Del(r);
}

static Py_ssize_t rows_len(RequestRows *r) { return r->n; }

static PyObject *rows_item(RequestRows *r, Py_ssize_t i) {
    if (i < 0 || i >= r->n) {
        PyErr_SetString(PyExc_IndexError, "RequestRows index out of range");
        return NULL;
    }
    PyObject *req = accel_rows_request(r, i);
    if (!r->index_rows) return Py_NewRef(req);
    PyObject **f = &PyTuple_GET_ITEM(req, 0);
    return PyTuple_Pack(5, f[0], f[3], f[5], f[7], f[8]);
}

static PySequenceMethods rows_as_sequence = {
    .sq_length = (lenfunc)rows_len,
    .sq_item = (ssizeargfunc)rows_item,
};

PyTypeObject AccelRows_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker_runtime.store._accel.RequestRows",
    .tp_basicsize = sizeof(RequestRows),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Some requests of a dispatch batch, in log order (see split_requests).",
    .tp_traverse = (traverseproc)rows_traverse,
    .tp_clear = (inquiry)rows_clear,
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_as_sequence = &rows_as_sequence,
};

/* New rows over `source`, taking `idx` (PyMem, n entries; freed on failure too). */
static PyObject *new_rows(PyObject *source, Py_ssize_t *idx, Py_ssize_t n, int index_rows) {
    RequestRows *r = PyObject_GC_New(RequestRows, &AccelRows_Type);
    if (r == NULL) {
        PyMem_Free(idx);
        return NULL;
    }
    r->source = Py_NewRef(source), r->idx = idx, r->n = n, r->index_rows = index_rows;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

typedef struct {
    PyObject *key;  /* (topic, queue id) */
    Py_ssize_t n;   /* requests so far */
    Py_ssize_t *idx; /* filled in the second pass */
} Queue;

/* The queue number of request f[0], f[1]: the table's, else the dict's (which also decides
 * for keys the table has just taken in). -1 on error. */
static Py_ssize_t queue_number(QueueTable *t, PyObject *numbers, Queue **queues, Py_ssize_t *nq,
                               Py_ssize_t *cap, PyObject **f) {
    int created;
    QueueSlot *slot = accel_queue_slot(t, f[0], f[1], &created);
    if (slot != NULL && !created) return (Py_ssize_t)slot->next;
    if (PyErr_Occurred()) return -1;
    PyObject *key = slot != NULL ? Py_NewRef(slot->key) : PyTuple_Pack(2, f[0], f[1]);
    if (key == NULL) return -1;
    Py_ssize_t q = -1;
    PyObject *known = PyDict_GetItemWithError(numbers, key);
    if (known != NULL) {
        q = PyLong_AsSsize_t(known);
    } else if (!PyErr_Occurred()) {
        if (*nq == *cap) {
            Py_ssize_t grown = *cap ? *cap * 2 : 16;
            Queue *more = PyMem_Realloc(*queues, sizeof(Queue) * (size_t)grown);
            if (more == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            *queues = more, *cap = grown;
        }
        PyObject *num = PyLong_FromSsize_t(*nq);
        if (num == NULL || PyDict_SetItem(numbers, key, num) < 0) {
            Py_XDECREF(num);
            goto done;
        }
        Py_DECREF(num);
        (*queues)[*nq] = (Queue){Py_NewRef(key), 0, NULL};
        q = (*nq)++;
    }
done:
    Py_DECREF(key);
    if (slot != NULL && q >= 0) slot->next = q;
    return q;
}

/* split_requests(requests) -> ({(topic, queue id): RequestRows}, RequestRows of index rows) */
PyObject *accel_split_requests(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("split_requests", nargs, 1) < 0) return NULL;
    PyObject *source = PySequence_Tuple(args[0]); /* a copy nobody can change */
    if (source == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(source), nq = 0, cap = 0, nindex = 0;
    PyObject *numbers = PyDict_New(), *by_queue = PyDict_New(), *index = NULL, *result = NULL;
    Py_ssize_t *qnum = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    Py_ssize_t *index_idx = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    Queue *queues = NULL;
    QueueTable table;
    memset(&table, 0, sizeof(table));
    if (numbers == NULL || by_queue == NULL || qnum == NULL || index_idx == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(source, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < REQUEST_FIELDS) {
            PyErr_Format(PyExc_TypeError, "dispatch requests must be tuples of %d", REQUEST_FIELDS);
            goto done;
        }
        PyObject **f = &PyTuple_GET_ITEM(r, 0);
        if ((qnum[i] = queue_number(&table, numbers, &queues, &nq, &cap, f)) < 0) goto done;
        queues[qnum[i]].n++;
        if (f[7] != Py_None || f[8] != Py_None) index_idx[nindex++] = i;
    }
    for (Py_ssize_t q = 0; q < nq; q++) {
        queues[q].idx = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)queues[q].n);
        if (queues[q].idx == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        queues[q].n = 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) queues[qnum[i]].idx[queues[qnum[i]].n++] = i;
    for (Py_ssize_t q = 0; q < nq; q++) {
        PyObject *rows = new_rows(source, queues[q].idx, queues[q].n, 0);
        queues[q].idx = NULL; /* the rows own it now, or freed it */
        int failed = rows == NULL || PyDict_SetItem(by_queue, queues[q].key, rows) < 0;
        Py_XDECREF(rows);
        if (failed) goto done;
    }
    index = new_rows(source, index_idx, nindex, 1);
    index_idx = NULL;
    if (index != NULL) result = PyTuple_Pack(2, by_queue, index);
done:
    accel_queue_clear(&table);
    for (Py_ssize_t q = 0; q < nq; q++) {
        Py_DECREF(queues[q].key);
        PyMem_Free(queues[q].idx);
    }
    PyMem_Free(queues);
    PyMem_Free(qnum);
    PyMem_Free(index_idx);
    Py_XDECREF(numbers);
    Py_XDECREF(by_queue);
    Py_XDECREF(index);
    Py_DECREF(source);
    return result;
}
