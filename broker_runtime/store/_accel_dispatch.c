/* Dispatch: ConsumeQueue rows and entries, index keys and entries (see _accel.h). */
#include "_accel.h"

#define ENTRY_SIZE 20       /* ConsumeQueue entry: phys i64, size i32, tags code i64 */
#define INDEX_HEADER 40     /* IndexFile header */
#define INDEX_SIZE 20       /* IndexFile entry: key hash i32, phys i64, time diff i32, prev i32 */
#define BLANK_SIZE INT32_MAX /* the size of RocketMQ's fillPreBlank entry */
#define PREFETCH 8           /* write_index: hash slots fetched this many entries ahead */

static int check_row(PyObject *row, Py_ssize_t n, const char *what) {
    if (PyTuple_Check(row) && PyTuple_GET_SIZE(row) >= n) return 0;
    PyErr_Format(PyExc_TypeError, "%s must be tuples of %zd", what, n);
    return -1;
}

typedef struct {
    int64_t qo, phys, size, tags;
} CqRow;

/* The queue logic of pack_entries over decoded rows; writes only when `out` is not NULL.
 * Returns the number of bytes (written or needed). */
static Py_ssize_t cq_run(const CqRow *rows, Py_ssize_t n, int64_t *expected, int64_t *max_end,
                         int64_t *added, int64_t *blanks, char *out) {
    Py_ssize_t len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const CqRow *r = &rows[i];
        if (r->phys + r->size <= *max_end || r->qo < *expected) continue;
        if (r->qo > *expected) {
            int64_t gap = r->qo - *expected;
            if (gap > (PY_SSIZE_T_MAX - len) / ENTRY_SIZE - 1) return -1; /* no such memory */
            for (int64_t g = 0; out != NULL && g < gap; g++) {
                char *e = out + len + g * ENTRY_SIZE;
                put_be64(e, 0), put_be32(e + 8, BLANK_SIZE), put_be64(e + 12, 0);
            }
            len += gap * ENTRY_SIZE;
            *blanks += gap;
            *expected = r->qo;
        }
        if (out != NULL) {
            char *e = out + len;
            put_be64(e, (uint64_t)r->phys), put_be32(e + 8, (uint32_t)r->size);
            put_be64(e + 12, (uint64_t)r->tags);
        }
        len += ENTRY_SIZE;
        *expected += 1;
        *max_end = r->phys + r->size;
        *added += 1;
    }
    return len;
}

/* pack_entries(requests, expected, max_phys_end) -> (bytearray, expected, max_phys_end, added,
 * blanks): consume_queue._pack_entries. */
PyObject *accel_pack_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("pack_entries", nargs, 3) < 0) return NULL;
    int64_t expected, max_end, added = 0, blanks = 0;
    if (accel_int(args[1], INT64_MIN, INT64_MAX, "expected", &expected) ||
        accel_int(args[2], INT64_MIN, INT64_MAX, "max_phys_end", &max_end))
        return NULL;
    RequestRows *view = NULL; /* a queue's rows from split_requests: read the requests */
    PyObject *seq, *buf = NULL;
    if (Py_IS_TYPE(args[0], &AccelRows_Type) && !((RequestRows *)args[0])->index_rows) {
        view = (RequestRows *)args[0];
        seq = Py_NewRef(args[0]);
    } else if ((seq = PySequence_Fast(args[0], "requests must be a sequence")) == NULL) {
        return NULL;
    }
    Py_ssize_t n = view != NULL ? view->n : PySequence_Fast_GET_SIZE(seq);
    CqRow *rows = PyMem_Malloc(sizeof(CqRow) * (size_t)(n ? n : 1));
    if (rows == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* DispatchRequest: queue offset, phys, size, tags */
        PyObject *row = view != NULL ? accel_rows_request(view, i) : PySequence_Fast_GET_ITEM(seq, i);
        if (check_row(row, REQUEST_FIELDS, "dispatch requests") < 0 ||
            accel_int(PyTuple_GET_ITEM(row, 2), INT64_MIN, INT64_MAX, "queue offset", &rows[i].qo) ||
            accel_int(PyTuple_GET_ITEM(row, 3), INT64_MIN, INT64_MAX - INT32_MAX, "log offset",
                      &rows[i].phys) ||
            accel_int(PyTuple_GET_ITEM(row, 4), INT32_MIN, INT32_MAX, "size", &rows[i].size) ||
            accel_int(PyTuple_GET_ITEM(row, 6), INT64_MIN, INT64_MAX, "tag code", &rows[i].tags))
            goto done;
    }
    int64_t e = expected, m = max_end, a = 0, b = 0;
    Py_ssize_t len = cq_run(rows, n, &e, &m, &a, &b, NULL);
    if (len < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if ((buf = PyByteArray_FromStringAndSize(NULL, len)) == NULL) goto done;
    cq_run(rows, n, &expected, &max_end, &added, &blanks, PyByteArray_AS_STRING(buf));
done:
    PyMem_Free(rows);
    Py_DECREF(seq);
    if (buf == NULL) return NULL;
    return Py_BuildValue("(NLLLL)", buf, (long long)expected, (long long)max_end,
                         (long long)added, (long long)blanks);
}

/* A growable array of int64 (the index_keys columns until they become arrays). */
typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} I64s;

static int push(I64s *a, int64_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 256;
        int64_t *v = PyMem_Realloc(a->v, sizeof(int64_t) * (size_t)cap);
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static int push_hash(I64s *a, uint32_t h) {
    int32_t s = (int32_t)h; /* index_key_hash: |hashCode|, 0 for Integer.MIN_VALUE */
    return push(a, s == INT32_MIN ? 0 : (s < 0 ? -(int64_t)s : s));
}

/* array('q') holding a copy of `a`. */
static PyObject *to_array(const I64s *a) {
    static PyObject *array_type;
    if (array_type == NULL) {
        PyObject *mod = PyImport_ImportModule("array");
        if (mod == NULL) return NULL;
        array_type = PyObject_GetAttrString(mod, "array");
        Py_DECREF(mod);
        if (array_type == NULL) return NULL;
    }
    /* y# of NULL would pass None */
    return PyObject_CallFunction(array_type, "sy#", "q", a->v ? (const char *)a->v : "",
                                 (Py_ssize_t)(a->n * (Py_ssize_t)sizeof(int64_t)));
}

static int is_str_or_none(PyObject *o) {
    if (o == Py_None || (PyUnicode_Check(o) && PyUnicode_READY(o) == 0)) return 1;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "index keys must be str or None");
    return 0;
}

/* The keys of one entry (topic, phys, time, uniq, keys) into the columns. */
static int entry_keys(PyObject *const *e, int64_t end, PyObject *tail_count, I64s *cols) {
    int64_t phy, ts;
    PyObject *topic = e[0], *uniq = e[3], *keys = e[4];
    if (accel_int(e[1], INT64_MIN, INT64_MAX, "log offset", &phy)) return -1;
    if (phy < end) return 0;
    if (accel_int(e[2], INT64_MIN, INT64_MAX, "store time", &ts)) return -1;
    if (topic == Py_None || !is_str_or_none(topic) || !is_str_or_none(uniq) ||
        !is_str_or_none(keys)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "topic must be str");
        return -1;
    }
    Py_ssize_t first = cols[0].n;
    uint32_t prefix = 31 * accel_java_hash(topic, 0, PyUnicode_GET_LENGTH(topic), 0) + '#';
    if (uniq != Py_None &&
        push_hash(&cols[0], accel_java_hash(uniq, 0, PyUnicode_GET_LENGTH(uniq), prefix)))
        return -1;
    if (keys != Py_None) { /* keys.split(" "), empty parts skipped */
        Py_ssize_t n = PyUnicode_GET_LENGTH(keys), a = 0;
        int kind = PyUnicode_KIND(keys);
        const void *data = PyUnicode_DATA(keys);
        for (Py_ssize_t b = 0; b <= n; b++) {
            if (b < n && PyUnicode_READ(kind, data, b) != ' ') continue;
            if (b > a && push_hash(&cols[0], accel_java_hash(keys, a, b, prefix))) return -1;
            a = b + 1;
        }
    }
    if (phy == end) { /* the file already holds this message's first keys */
        PyObject *count = PyObject_CallOneArg(tail_count, e[1]);
        Py_ssize_t skip = count == NULL ? -1 : PyLong_AsSsize_t(count);
        Py_XDECREF(count);
        if (skip == -1 && PyErr_Occurred()) return -1;
        if (skip > 0) { /* del keys[first : first + skip] */
            Py_ssize_t keep = cols[0].n - first - skip;
            if (keep < 0) keep = 0;
            memmove(cols[0].v + first, cols[0].v + cols[0].n - keep, sizeof(int64_t) * (size_t)keep);
            cols[0].n = first + keep;
        }
    }
    for (Py_ssize_t k = first; k < cols[0].n; k++)
        if (push(&cols[1], phy) || push(&cols[2], ts)) return -1;
    return 0;
}

/* index_keys(entries, end, tail_count) -> (hashes, phys, times) as array('q'):
 * index_service._index_keys. `entries` may be the index rows of split_requests.
 * Hashes `topic#key` without building the string: Java's hash continues over appended text. */
PyObject *accel_index_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("index_keys", nargs, 3) < 0) return NULL;
    int64_t end;
    if (accel_int(args[1], INT64_MIN, INT64_MAX, "end", &end)) return NULL;
    RequestRows *view = NULL;
    PyObject *seq, *result = NULL, *out[3] = {NULL, NULL, NULL};
    if (Py_IS_TYPE(args[0], &AccelRows_Type) && ((RequestRows *)args[0])->index_rows) {
        view = (RequestRows *)args[0];
        seq = Py_NewRef(args[0]);
    } else if ((seq = PySequence_Fast(args[0], "entries must be a sequence")) == NULL) {
        return NULL;
    }
    I64s cols[3] = {{NULL, 0, 0}, {NULL, 0, 0}, {NULL, 0, 0}};
    Py_ssize_t n = view != NULL ? view->n : PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (view != NULL) { /* a DispatchRequest: topic, log offset, store time, uniq, keys */
            PyObject **f = &PyTuple_GET_ITEM(accel_rows_request(view, i), 0);
            PyObject *e[5] = {f[0], f[3], f[5], f[7], f[8]};
            if (entry_keys(e, end, args[2], cols) < 0) goto done;
        } else {
            PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
            if (check_row(row, 5, "index entries") < 0 ||
                entry_keys(&PyTuple_GET_ITEM(row, 0), end, args[2], cols) < 0)
                goto done;
        }
    }
    for (int j = 0; j < 3; j++)
        if ((out[j] = to_array(&cols[j])) == NULL) goto done;
    result = PyTuple_Pack(3, out[0], out[1], out[2]);
done:
    for (int j = 0; j < 3; j++) {
        PyMem_Free(cols[j].v);
        Py_XDECREF(out[j]);
    }
    Py_DECREF(seq);
    return result;
}

static void write_index(char *mm, const int64_t *cols, Py_ssize_t n, int64_t count, int64_t slots,
                        int64_t entries_at, int64_t base) {
    int64_t pos = entries_at + count * INDEX_SIZE;
    for (Py_ssize_t i = 0; i < n; i++, count++, pos += INDEX_SIZE) {
        int64_t kh = cols[3 * i], phy = cols[3 * i + 1], ts = cols[3 * i + 2];
        int64_t slot_at = INDEX_HEADER + ((kh % slots + slots) % slots) * 4;
        if (i + PREFETCH < n) { /* slots are spread over megabytes: fetch a few entries ahead */
            int64_t ahead = cols[3 * (i + PREFETCH)];
            __builtin_prefetch(mm + INDEX_HEADER + ((ahead % slots + slots) % slots) * 4, 1);
        }
        int32_t prev = get_be32(mm + slot_at);
        if (prev <= 0 || prev >= count) prev = 0;
        /* whole seconds since base, clamped to [0, INT_MAX]; unsigned: ts - base may overflow */
        uint64_t diff = ts < base ? 0 : ((uint64_t)ts - (uint64_t)base) / 1000;
        put_be32(mm + pos, (uint32_t)kh);
        put_be64(mm + pos + 4, (uint64_t)phy);
        put_be32(mm + pos + 12, (uint32_t)(diff > INT32_MAX ? INT32_MAX : diff));
        put_be32(mm + pos + 16, (uint32_t)prev);
        put_be32(mm + slot_at, (uint32_t)count);
    }
}

/* write_entries(mm, key_hashes, phy_offsets, timestamps, start, stop, count, slots, entries_at,
 * base): index_file._write_entries. */
PyObject *accel_write_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (accel_nargs("write_entries", nargs, 10) < 0) return NULL;
    int64_t start, stop, count, slots, entries_at, base;
    if (accel_int(args[4], 0, PY_SSIZE_T_MAX, "start", &start) ||
        accel_int(args[5], 0, PY_SSIZE_T_MAX, "stop", &stop) ||
        accel_int(args[6], 0, INT32_MAX, "count", &count) ||
        accel_int(args[7], 1, INT32_MAX, "slots", &slots) ||
        accel_int(args[8], 0, INT32_MAX, "entries_at", &entries_at) ||
        accel_int(args[9], INT64_MIN, INT64_MAX, "base", &base))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    PyObject *seqs[3] = {NULL, NULL, NULL}, *result = NULL;
    Py_buffer bufs[3];
    int have[3] = {0, 0, 0};
    for (int j = 0; j < 3; j++) { /* int64 buffers (index_keys' arrays) are read as they are */
        if (PyObject_GetBuffer(args[1 + j], &bufs[j], PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
            have[j] = 1;
            const char *fmt = bufs[j].format;
            if (bufs[j].itemsize == 8 && fmt != NULL && (!strcmp(fmt, "q") || !strcmp(fmt, "l"))) {
                if (stop > start && bufs[j].len / 8 < stop) {
                    PyErr_SetString(PyExc_ValueError, "write_entries: columns are shorter than stop");
                    goto done;
                }
                continue;
            }
            PyBuffer_Release(&bufs[j]);
            have[j] = 0;
        }
        PyErr_Clear();
        if ((seqs[j] = PySequence_Fast(args[1 + j], "index columns must be sequences")) == NULL)
            goto done;
        if (stop > start && PySequence_Fast_GET_SIZE(seqs[j]) < stop) {
            PyErr_SetString(PyExc_ValueError, "write_entries: columns are shorter than stop");
            goto done;
        }
    }
    Py_ssize_t n = stop > start ? stop - start : 0;
    int64_t *cols = PyMem_Malloc(sizeof(int64_t) * 3 * (size_t)(n ? n : 1));
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    static const int64_t lo[3] = {INT32_MIN, INT64_MIN, INT64_MIN};
    static const int64_t hi[3] = {INT32_MAX, INT64_MAX, INT64_MAX};
    static const char *const what[3] = {"key hash", "offset", "time"};
    for (int j = 0; j < 3; j++) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t *e = &cols[3 * i + j];
            if (have[j]) {
                *e = ((const int64_t *)bufs[j].buf)[start + i];
                if (*e >= lo[j] && *e <= hi[j]) continue;
                PyErr_Format(PyExc_OverflowError, "%s out of range", what[j]);
            } else if (!accel_int(PySequence_Fast_GET_ITEM(seqs[j], start + i), lo[j], hi[j],
                                  what[j], e)) {
                continue;
            }
            PyMem_Free(cols);
            goto done;
        }
    }
    /* Past the end only if the caller's sizes are wrong: checked up front, nothing written. */
    int64_t last = entries_at + (count + n) * INDEX_SIZE;
    if (last > view.len || INDEX_HEADER + slots * 4 > entries_at) {
        PyErr_SetString(PyExc_ValueError, "write_entries: past the end of the file");
        PyMem_Free(cols);
        goto done;
    }
    /* The buffer export keeps the mapping open; first touches of pages fault: let others run. */
    PyThreadState *released = n >= 1024 ? PyEval_SaveThread() : NULL;
    write_index(view.buf, cols, n, count, slots, entries_at, base);
    if (released != NULL) PyEval_RestoreThread(released);
    PyMem_Free(cols);
    result = Py_NewRef(Py_None);
done:
    for (int j = 0; j < 3; j++) {
        Py_XDECREF(seqs[j]);
        if (have[j]) PyBuffer_Release(&bufs[j]);
    }
    PyBuffer_Release(&view);
    return result;
}
