/* The remoting JSON header in C (module broker_runtime.remoting._header).
 *
 * Twins of RemotingCommand.encode_header and RemotingCommand.decode_header (command.py),
 * which are the reference: tests compare both on generated headers. Each function handles
 * the common case and returns None for anything else (a non-string field, non-ASCII bytes,
 * whitespace, floats, ...): the Python code then does the whole job, errors included.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ABI 1 /* command.py's _HEADER_ABI */

/* ------------------------------------------------------------------------------------------
 * encode: json.encoder.encode_basestring_ascii for every string, as command.py writes it */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    int on_stack;
} Buf;

static int grow(Buf *b, Py_ssize_t need) {
    if (b->len + need <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2 > b->len + need ? b->cap * 2 : b->len + need + 256;
    char *p = b->on_stack ? PyMem_Malloc((size_t)cap) : PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->on_stack) memcpy(p, b->p, (size_t)b->len);
    b->p = p, b->cap = cap, b->on_stack = 0;
    return 0;
}

static int put(Buf *b, const char *s, Py_ssize_t n) {
    if (grow(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

static void put_u(char *o, Py_UCS4 c) {
    o[0] = '\\', o[1] = 'u';
    o[2] = HEX[(c >> 12) & 15], o[3] = HEX[(c >> 8) & 15], o[4] = HEX[(c >> 4) & 15];
    o[5] = HEX[c & 15];
}

/* A JSON string, quoted; -1 with an exception set, or 1 when `s` is not a str. */
static int put_str(Buf *b, PyObject *s) {
    if (!PyUnicode_CheckExact(s)) return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (grow(b, n * 12 + 2) < 0) return -1; /* worst case: a surrogate pair per char */
    char *o = b->p + b->len;
    *o++ = '"';
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '\\': *o++ = '\\'; break;
        case '"': *o++ = '"'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        default:
            o--;
            if (c >= 0x10000) { /* a surrogate pair */
                Py_UCS4 v = c - 0x10000;
                put_u(o, 0xd800 | ((v >> 10) & 0x3ff)), o += 6;
                put_u(o, 0xdc00 | (v & 0x3ff)), o += 6;
            } else {
                put_u(o, c), o += 6;
            }
        }
    }
    *o++ = '"';
    b->len = o - b->p;
    return 0;
}

/* An exact int as %d; 1 when it is not one (or does not fit 64 bits). */
static int put_int(Buf *b, const char *key, PyObject *v) {
    if (!PyLong_Check(v) || PyBool_Check(v)) return 1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return 1;
    if (x == -1 && PyErr_Occurred()) return -1;
    char digits[24], *d = digits + sizeof digits;
    unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    do *--d = (char)('0' + u % 10); while (u /= 10);
    if (x < 0) *--d = '-';
    if (put(b, key, (Py_ssize_t)strlen(key)) < 0) return -1;
    return put(b, d, digits + sizeof digits - d);
}

/* encode(code, language, version, opaque, flag, remark, ext_fields) -> bytes | None */
static PyObject *encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "encode takes 7 arguments");
        return NULL;
    }
    PyObject *remark = args[5], *ext = args[6];
    if (!PyDict_CheckExact(ext)) Py_RETURN_NONE;
    char stack[1024]; /* most headers fit; a longer one moves to the heap */
    Buf b = {stack, 0, sizeof stack, 1};
    int r;
#define STEP(call)                                                                          \
    if ((r = (call)) != 0) goto out;
    STEP(put_int(&b, "{\"code\":", args[0]));
    STEP(put(&b, ",\"language\":", 12));
    STEP(put_str(&b, args[1]));
    STEP(put_int(&b, ",\"version\":", args[2]));
    STEP(put_int(&b, ",\"opaque\":", args[3]));
    STEP(put_int(&b, ",\"flag\":", args[4]));
    STEP(put(&b, ",\"serializeTypeCurrentRPC\":\"JSON\"", 33));
    if (remark != Py_None) {
        STEP(put(&b, ",\"remark\":", 10));
        STEP(put_str(&b, remark));
    }
    if (PyDict_GET_SIZE(ext) > 0) {
        STEP(put(&b, ",\"extFields\":{", 14));
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(ext, &pos, &k, &v)) {
            if (i++) STEP(put(&b, ",", 1));
            STEP(put_str(&b, k));
            STEP(put(&b, ":", 1));
            STEP(put_str(&b, v));
        }
        STEP(put(&b, "}", 1));
    }
    STEP(put(&b, "}", 1));
#undef STEP
out:;
    PyObject *res = r < 0 ? NULL : r > 0 ? Py_NewRef(Py_None)
                                         : PyBytes_FromStringAndSize(b.p, b.len);
    if (!b.on_stack) PyMem_Free(b.p);
    return res;
}

/* ------------------------------------------------------------------------------------------
 * decode: an ASCII header without whitespace whose values are ints, strings, true, false or
 * null, and extFields an object of strings. Anything else: None (Python decides). */
typedef struct {
    const unsigned char *p, *end;
} Scan;

enum { FAIL = -1, OTHER = -2 }; /* OTHER: not the fast subset (no exception set) */

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_u(Scan *s, Py_UCS4 *out) { /* after the backslash and 'u' */
    if (s->end - s->p < 4) return OTHER;
    Py_UCS4 c = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(s->p[i]);
        if (h < 0) return OTHER;
        c = (c << 4) | (Py_UCS4)h;
    }
    s->p += 4;
    *out = c;
    return 0;
}

/* A string at s->p (on its opening quote): a new str, or NULL with *err FAIL / OTHER. */
static PyObject *read_str(Scan *s, int *err) {
    const unsigned char *start = ++s->p, *q = start;
    while (q < s->end && *q != '"' && *q != '\\' && *q >= 0x20) q++;
    if (q == s->end || *q < 0x20) {
        *err = OTHER;
        return NULL;
    }
    if (*q == '"') { /* no escapes: ASCII already checked by the caller */
        s->p = q + 1;
        PyObject *str = PyUnicode_New(q - start, 127);
        if (str == NULL) {
            *err = FAIL;
            return NULL;
        }
        memcpy(PyUnicode_1BYTE_DATA(str), start, (size_t)(q - start));
        return str;
    }
    /* escapes: code points into a buffer, at most one per input byte */
    Py_UCS4 *buf = PyMem_Malloc(sizeof(Py_UCS4) * (size_t)(s->end - start));
    if (buf == NULL) {
        PyErr_NoMemory();
        *err = FAIL;
        return NULL;
    }
    Py_ssize_t n = 0;
    s->p = start;
    while (1) {
        if (s->p == s->end) goto other;
        unsigned char c = *s->p;
        if (c == '"') break;
        if (c < 0x20) goto other;
        if (c != '\\') {
            buf[n++] = c, s->p++;
            continue;
        }
        if (s->end - s->p < 2) goto other;
        c = s->p[1];
        s->p += 2;
        switch (c) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            Py_UCS4 u, lo;
            if (read_u(s, &u) < 0) goto other;
            /* a high surrogate and an escaped low one make one code point, as json does */
            if (u >= 0xd800 && u <= 0xdbff && s->end - s->p >= 6 && s->p[0] == '\\' &&
                s->p[1] == 'u') {
                Scan look = {s->p + 2, s->end};
                if (read_u(&look, &lo) == 0 && lo >= 0xdc00 && lo <= 0xdfff) {
                    u = 0x10000 + (((u - 0xd800) << 10) | (lo - 0xdc00));
                    s->p = look.p;
                }
            }
            buf[n++] = u;
            break;
        }
        default: goto other;
        }
    }
    s->p++;
    PyObject *str = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, buf, n);
    PyMem_Free(buf);
    if (str == NULL) *err = FAIL;
    return str;
other:
    PyMem_Free(buf);
    *err = OTHER;
    return NULL;
}

static int read_lit(Scan *s, const char *lit, Py_ssize_t n) {
    if (s->end - s->p < n || memcmp(s->p, lit, (size_t)n) != 0) return OTHER;
    s->p += n;
    return 0;
}

/* A value: a new reference, or NULL with *err. Ints: -?(0|[1-9][0-9]{0,17}), nothing after. */
static PyObject *read_value(Scan *s, int *err) {
    if (s->p == s->end) goto other;
    unsigned char c = *s->p;
    if (c == '"') return read_str(s, err);
    if (c == '-' || (c >= '0' && c <= '9')) {
        const unsigned char *q = s->p + (c == '-');
        const unsigned char *digits = q;
        long long v = 0;
        while (q < s->end && *q >= '0' && *q <= '9' && q - digits < 18) v = v * 10 + (*q++ - '0');
        Py_ssize_t nd = q - digits;
        if (nd == 0 || (nd > 1 && *digits == '0')) goto other;
        if (q < s->end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E'))
            goto other;
        s->p = q;
        PyObject *r = PyLong_FromLongLong(c == '-' ? -v : v);
        if (r == NULL) *err = FAIL;
        return r;
    }
    if (c == 't' && read_lit(s, "true", 4) == 0) Py_RETURN_TRUE;
    if (c == 'f' && read_lit(s, "false", 5) == 0) Py_RETURN_FALSE;
    if (c == 'n' && read_lit(s, "null", 4) == 0) Py_RETURN_NONE;
other:
    *err = OTHER;
    return NULL;
}

static int is_key(PyObject *k, const char *name) {
    return PyUnicode_CompareWithASCIIString(k, name) == 0;
}

/* extFields: {"k":"v",...} with string values, into a new dict (NULL and *err otherwise). */
static PyObject *read_ext(Scan *s, int *err) {
    if (s->p == s->end || *s->p != '{') {
        *err = OTHER;
        return NULL;
    }
    s->p++;
    PyObject *d = PyDict_New();
    if (d == NULL) {
        *err = FAIL;
        return NULL;
    }
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return d;
    }
    while (1) {
        if (s->p == s->end || *s->p != '"') goto other;
        PyObject *k = read_str(s, err);
        if (k == NULL) goto bad;
        if (s->p == s->end || *s->p != ':' || s->p + 1 == s->end || s->p[1] != '"') {
            Py_DECREF(k);
            goto other;
        }
        s->p++;
        PyObject *v = read_str(s, err);
        if (v == NULL) {
            Py_DECREF(k);
            goto bad;
        }
        int r = PyDict_SetItem(d, k, v);
        Py_DECREF(k), Py_DECREF(v);
        if (r < 0) {
            *err = FAIL;
            goto bad;
        }
        if (s->p == s->end) goto other;
        if (*s->p == '}') {
            s->p++;
            return d;
        }
        if (*s->p++ != ',') goto other;
    }
other:
    *err = OTHER;
bad:
    Py_DECREF(d);
    return NULL;
}

/* decode(data) -> (code, opaque, flag, remark, ext_fields, version, language) | None */
static PyObject *decode(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = view.buf;
    Scan s = {p, p + view.len};
    for (Py_ssize_t i = 0; i < view.len; i++) {
        if (p[i] >= 0x80) { /* non-ASCII: UTF-8 decoding and its errors are Python's */
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
    }
    PyObject *code = NULL, *opaque = NULL, *flag = NULL, *remark = NULL, *ext = NULL;
    PyObject *version = NULL, *language = NULL, *res = NULL;
    int err = OTHER;
    if (s.p == s.end || *s.p++ != '{') goto done;
    if (s.p < s.end && *s.p == '}') {
        s.p++;
    } else {
        while (1) {
            if (s.p == s.end || *s.p != '"') goto done;
            PyObject *k = read_str(&s, &err);
            if (k == NULL) goto done;
            if (s.p == s.end || *s.p++ != ':') {
                Py_DECREF(k);
                err = OTHER;
                goto done;
            }
            PyObject **slot = is_key(k, "extFields") ? &ext
                              : is_key(k, "code")    ? &code
                              : is_key(k, "opaque")  ? &opaque
                              : is_key(k, "flag")    ? &flag
                              : is_key(k, "remark")  ? &remark
                              : is_key(k, "version") ? &version
                              : is_key(k, "language") ? &language
                                                      : NULL;
            Py_DECREF(k);
            PyObject *v;
            if (slot == &ext && s.p < s.end && *s.p == '{')
                v = read_ext(&s, &err);
            else
                v = read_value(&s, &err);
            if (v == NULL) goto done;
            if (slot == NULL)
                Py_DECREF(v);
            else
                Py_XSETREF(*slot, v);
            if (s.p == s.end) {
                err = OTHER;
                goto done;
            }
            if (*s.p == '}') {
                s.p++;
                break;
            }
            if (*s.p++ != ',') {
                err = OTHER;
                goto done;
            }
        }
    }
    err = OTHER;
    if (s.p != s.end) goto done;
    /* command.py's checks; what they would refuse or convert is left to it */
#define EXACT_INT(o) ((o) != NULL && PyLong_CheckExact(o))
    if (!EXACT_INT(code) || (opaque != NULL && !EXACT_INT(opaque)) ||
        (flag != NULL && !EXACT_INT(flag)))
        goto done;
    if (ext != NULL && ext != Py_None && !PyDict_CheckExact(ext)) goto done;
    if (language != NULL && !PyUnicode_CheckExact(language)) goto done;
    if (ext == NULL || ext == Py_None) {
        Py_XSETREF(ext, PyDict_New());
        if (ext == NULL) {
            err = FAIL;
            goto done;
        }
    }
    PyObject *zero = PyLong_FromLong(0); /* small ints are cached: no allocation */
    res = Py_BuildValue(
        "(OOOOOON)", code, opaque ? opaque : zero, flag ? flag : zero,
        remark && PyUnicode_CheckExact(remark) ? remark : Py_None, ext,
        EXACT_INT(version) ? version : zero,
        language ? Py_NewRef(language) : PyUnicode_FromString("JAVA"));
    Py_DECREF(zero);
    if (res == NULL) err = FAIL;
#undef EXACT_INT
done:
    Py_XDECREF(code), Py_XDECREF(opaque), Py_XDECREF(flag), Py_XDECREF(remark);
    Py_XDECREF(ext), Py_XDECREF(version), Py_XDECREF(language);
    PyBuffer_Release(&view);
    if (res != NULL) return res;
    if (err == FAIL) return NULL;
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "RemotingCommand.encode_header; None when it must do it"},
    {"decode", decode, METH_O, "RemotingCommand.decode_header's parse; None when it must"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_header", "The remoting JSON header in C (see command.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__header(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", ABI) < 0) Py_CLEAR(m);
    return m;
}
