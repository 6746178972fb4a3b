/* Module init and the helpers the kernels share (see _accel.h). */
#include "_accel.h"

#include <errno.h>
#include <unistd.h>

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

QueueSlot *accel_queue_slot(QueueTable *t, PyObject *topic, PyObject *qid, int *created) {
    *created = 0;
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(qid)) return NULL;
    int overflow;
    long long q = PyLong_AsLongLongAndOverflow(qid, &overflow);
    Py_hash_t h = PyObject_Hash(topic); /* cached in the str */
    if (overflow || h == -1) {
        PyErr_Clear();
        return NULL;
    }
    uint64_t at = (uint64_t)h ^ ((uint64_t)q * 0x9E3779B97F4A7C15ull);
    for (int probe = 0; probe < QUEUE_SLOTS; probe++) {
        QueueSlot *s = &t->slots[(at + (uint64_t)probe) & (QUEUE_SLOTS - 1)];
        if (s->key == NULL) {
            if (t->used >= QUEUE_SLOTS * 3 / 4 || (s->key = PyTuple_Pack(2, topic, qid)) == NULL)
                return NULL; /* full: the caller uses its dicts; or out of memory */
            s->hash = h, s->qid = q, s->next = 0, s->value = NULL;
            t->used++;
            *created = 1;
            return s;
        }
        PyObject *cached = PyTuple_GET_ITEM(s->key, 0);
        if (s->qid == q && s->hash == h && (cached == topic || PyUnicode_Compare(cached, topic) == 0))
            return s;
    }
    return NULL;
}

void accel_queue_clear(QueueTable *t) {
    for (int i = 0; i < QUEUE_SLOTS; i++) Py_CLEAR(t->slots[i].key);
    t->used = 0;
}

/* pwrite_all(fd, data, pos) -> None: mapped_file._pwrite_all. A write this small takes about
 * as long as handing the GIL to another thread and back: it keeps the GIL; a big one lets
 * others run. */
static PyObject *accel_pwrite_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("pwrite_all", nargs, 3) < 0) return NULL;
    int64_t fd, pos;
    if (accel_int(args[0], 0, INT32_MAX, "fd", &fd) ||
        accel_int(args[2], 0, INT64_MAX, "position", &pos))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *p = view.buf;
    Py_ssize_t left = view.len;
    int release = left >= GIL_FREE_BYTES;
    while (left > 0) {
        ssize_t n;
        if (release) {
            Py_BEGIN_ALLOW_THREADS
            n = pwrite((int)fd, p, (size_t)left, (off_t)pos);
            Py_END_ALLOW_THREADS
        } else {
            n = pwrite((int)fd, p, (size_t)left, (off_t)pos);
        }
        if (n < 0 && errno == EINTR) {
            if (PyErr_CheckSignals() < 0) break;
            continue;
        }
        if (n <= 0) {
            if (n == 0) errno = EIO; /* a regular file writes something or fails */
            PyErr_SetFromErrno(PyExc_OSError);
            break;
        }
        p += n, pos += n, left -= n;
    }
    PyBuffer_Release(&view);
    return left > 0 ? NULL : Py_NewRef(Py_None);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef methods[] = {
    {"prepare_batch", FASTCALL(accel_prepare_batch), "record_codec.prepare_batch"},
    {"encode_run", FASTCALL(accel_encode_run), "record_codec._encode_run, DispatchRequest first"},
    {"body_crc", accel_body_crc, METH_O, "record_codec._body_crc"},
    {"pwrite_all", FASTCALL(accel_pwrite_all), "mapped_file._pwrite_all"},
    {"split_requests", FASTCALL(accel_split_requests), "dispatcher._split_requests"},
    {"pack_entries", FASTCALL(accel_pack_entries), "consume_queue._pack_entries"},
    {"index_keys", FASTCALL(accel_index_keys), "index_service._index_keys"},
    {"write_entries", FASTCALL(accel_write_entries), "index_file._write_entries"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_accel", "The store's per-message loops in C (see accel.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__accel(void) {
    accel_crc_init();
    if (accel_prepare_init() < 0 || PyType_Ready(&AccelRows_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", ACCEL_ABI) < 0 ||
        PyModule_AddIntConstant(m, "CLMUL", accel_crc_clmul()) < 0 || /* 0 zlib, 1, 2: wide */
        PyModule_AddObjectRef(m, "PreparedBatch", (PyObject *)&AccelBatch_Type) < 0 ||
        PyModule_AddObjectRef(m, "RequestRows", (PyObject *)&AccelRows_Type) < 0)
        Py_CLEAR(m);
    return m;
}
