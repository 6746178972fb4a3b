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

#define ACCEL_ABI 1 /* broker_runtime.store.accel.ABI */

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

/* Java's String.hashCode over s[start:end] (UTF-16 units: astral code points count as their
 * surrogate pair), continuing from `h`. `s` must be a ready str. */
uint32_t accel_java_hash(PyObject *s, Py_ssize_t start, Py_ssize_t end, uint32_t h);

/* An int in [lo, hi] (any object with __index__); -1 with OverflowError/TypeError otherwise. */
int accel_int(PyObject *o, int64_t lo, int64_t hi, const char *what, int64_t *out);

int accel_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want);

/* zlib's crc32(0, buf, len), faster (_accel_crc.c); accel_crc_init once before use. */
void accel_crc_init(void);
int accel_crc_clmul(void);
uint32_t accel_crc32(const unsigned char *buf, size_t len);

PyObject *accel_body_crc(PyObject *self, PyObject *arg);

PyObject *accel_split_requests(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *accel_pack_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *accel_index_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *accel_write_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
