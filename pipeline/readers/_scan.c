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
 *
 * With a Reader (the optional last argument), the units' bytes come from the segment file
 * through pread into a window that stays in cache, not through `buf`'s mapped pages: mapping
 * a range's pages in and out costs the kernel more than copying its bytes (2.4 GB from the
 * page cache: 0.20 CPU s to map, populate and unmap, 0.15 s to read in 1 MiB pieces), and
 * the decode then reads the window from cache. `buf` still gives the segment's size and the
 * bytes of units too big for the window.
 */
#include "_scan.h"

#include <errno.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

/* A segment file read through a window: file bytes [at, at + len) are in win. */
typedef struct {
    PyObject_HEAD
    int fd;                    /* a dup of the caller's, closed with the reader */
    unsigned char *win;
    Py_ssize_t cap, chunk, big; /* bytes per read; units past `big` are read from the map */
    int64_t at, len;
    int busy;                   /* in a scan, which lets go of the GIL while it reads */
} Reader;

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"fd", "chunk", "big", NULL};
    int fd;
    Py_ssize_t chunk = (Py_ssize_t)1 << 20, big = (Py_ssize_t)16 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|nn:Reader", kw, &fd, &chunk, &big))
        return NULL;
    if (chunk < 1 || big < chunk) {
        PyErr_SetString(PyExc_ValueError, "Reader: needs 0 < chunk <= big");
        return NULL;
    }
    Reader *r = (Reader *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    r->fd = dup(fd);
    if (r->fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(r);
        return NULL;
    }
    r->chunk = chunk, r->big = big;
    return (PyObject *)r;
}

static void reader_dealloc(Reader *r) {
    if (r->fd >= 0) close(r->fd);
    PyMem_RawFree(r->win);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject Reader_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pipeline.readers._scan.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_new = reader_new,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(fd, chunk=1 MiB, big=16 MiB): a segment file read by scan through a "
              "window of `chunk`-byte preads (fd is duplicated).",
};

/* Where one scan's units come from: `buf` (the segment, mapped), or its file through `r`. */
typedef struct {
    const unsigned char *buf;
    int64_t size;
    Reader *r;
} Source;

/* Points *out at `need` bytes of the segment from `pos`: 1, or 0 when the segment (or the
 * file, if it was cut since it was mapped) ends first, -1 on a read error (exception set). */
static int src_at(Source *s, int64_t pos, int64_t need, const unsigned char **out) {
    if (need > s->size - pos) return 0;
    Reader *r = s->r;
    if (r == NULL || need > r->big) {
        *out = s->buf + pos;
        return 1;
    }
    if (pos >= r->at && pos + need <= r->at + r->len) {
        *out = r->win + (pos - r->at);
        return 1;
    }
    int64_t kept = pos >= r->at && pos < r->at + r->len ? r->at + r->len - pos : 0;
    if (kept) memmove(r->win, r->win + (pos - r->at), (size_t)kept); /* a unit's first part */
    r->at = pos, r->len = kept;
    Py_ssize_t want = need > r->chunk ? (Py_ssize_t)need : r->chunk;
    if (want > r->cap) {
        unsigned char *grown = PyMem_RawRealloc(r->win, (size_t)want);
        if (grown == NULL) {
            r->len = 0;
            PyErr_NoMemory();
            return -1;
        }
        r->win = grown, r->cap = want;
    }
    while (r->len < need) {
        int64_t room = r->cap - r->len, left = s->size - (pos + r->len);
        ssize_t k;
        Py_BEGIN_ALLOW_THREADS
        k = pread(r->fd, r->win + r->len, (size_t)(room < left ? room : left), (off_t)(pos + r->len));
        Py_END_ALLOW_THREADS
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            r->len = 0;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (k == 0) return 0;
        r->len += k;
    }
    *out = r->win;
    return 1;
}

/* Whether the unit at `pos` has a valid fixed part: magic, TOTALSIZE within the segment,
 * BODY's length within the unit, PHYSICALOFFSET its own log offset (1; 0: no; -1: error).
 * Its bytes are at u->at until the source is asked for other bytes. */
static int valid_head(Unit *u, Source *s, int64_t file_from, int64_t pos) {
    const unsigned char *p;
    int got = src_at(s, pos, 8, &p);
    if (got <= 0) return got;
    int32_t total = be32(p + F_TOTAL), magic = be32(p + 4);
    if (magic != MESSAGE_MAGIC || total < MIN_UNIT || total > s->size - pos) return 0;
    if ((got = src_at(s, pos, total, &p)) <= 0) return got;
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
    if (scan_append_host(c, C_BORN_HOST_OFF, C_BORN_HOST, r, p + F_BORN_HOST, born) < 0 ||
        scan_append_host(c, C_STORE_HOST_OFF, C_STORE_HOST, r, p + F_STORE_HOST, store) < 0 ||
        append_text(c, C_TOPIC_OFF, C_TOPIC, r, u->topic, u->topic_len) < 0)
        return -1;
    return scan_append_props(c, r, u->props, u->props_len, pr);
}

/* scan(buf, file_from, pos, stop, max_units, max_bytes, names[, reader]): see the top of this
 * file. One pass:
 * each unit is checked, then copied field by field while its bytes are in cache. */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long file_from, pos, stop, max_units, max_bytes;
    PyObject *names, *reader = Py_None;
    if (!PyArg_ParseTuple(args, "y*LLLLLO!|O:scan", &view, &file_from, &pos, &stop, &max_units,
                          &max_bytes, &PyTuple_Type, &names, &reader))
        return NULL;
    if (file_from < 0 || pos < 0 || stop < 0 || max_units < 1 || max_units > (1 << 24) ||
        max_bytes < 1 || max_bytes > INT32_MAX || PyTuple_GET_SIZE(names) > MAX_PICKED ||
        (reader != Py_None && !PyObject_TypeCheck(reader, &Reader_Type))) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: an argument is out of range");
        return NULL;
    }
    Source src = {view.buf, view.len, reader == Py_None ? NULL : (Reader *)reader};
    if (src.r != NULL && src.r->busy) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "scan: the Reader is in use by another scan");
        return NULL;
    }
    if (src.r != NULL) src.r->busy = 1;
    int64_t bytes = 0, hint = stop - pos;
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
        scan_alloc_columns(&c, (Py_ssize_t)max_units, (Py_ssize_t)hint, pr.picked) < 0)
        goto done;
    Unit u;
    int head = 0;
    while (pos < stop && (head = valid_head(&u, &src, file_from, pos)) > 0) {
        if (n >= max_units || (n > 0 && bytes + u.total > max_bytes)) {
            full = 1;
            break;
        }
        /* The tail is read after the body is copied, which brings it into cache on the way. */
        __builtin_prefetch(u.at + HEADER_SIZE + u.body_len);
        __builtin_prefetch(u.at + u.total);      /* the next unit's header */
        __builtin_prefetch(u.at + u.total + 64); /* and BODY's length */
        if (scan_append_body(&c, n, u.at + HEADER_SIZE, u.body_len) < 0) goto done;
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
    if (head < 0) goto done;
#if defined(__x86_64__)
    _mm_sfence(); /* the streamed copies are visible to whoever reads the columns */
#endif
    if (scan_trim_columns(&c, n) < 0) goto done;
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
    if (src.r != NULL) src.r->busy = 0;
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
    if (PyType_Ready(&ScanBuf_Type) < 0 || PyType_Ready(&Reader_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "N_COLUMNS", N_COLUMNS) < 0 ||
                      PyModule_AddType(m, &Reader_Type) < 0))
        Py_CLEAR(m);
    return m;
}
