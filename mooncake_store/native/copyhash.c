/*
 * mooncake_store._copyhash: copy a buffer and hash the bytes written, in one pass over memory.
 *
 * copy_digest(dest, src) copies src into dest (two buffers of one length) and returns
 * xxh3_64(seed 0) of the bytes it wrote: exactly xxhash.xxh3_64_intdigest(dest) afterwards, so
 * it yields one chunk digest of the store's checksum (docs/CHECKSUM.md) for any chunk.
 *
 * Why: a same-host put or get is a copy between a node's pool and a caller's buffer plus the
 * checksum of the bytes copied.  Copying, then hashing the copy, moves each byte through the
 * core twice; memcpy also reads every destination line before writing it.  Here each 64-byte
 * stripe is loaded once into vector registers, stored to dest, and folded into the XXH3
 * accumulators from those same registers, so the digest is of the bytes stored (not of a
 * second read of the source, which a concurrent writer could have changed meanwhile).  From
 * NT_MIN_BYTES on, with dest aligned, the stores are non-temporal: they skip the read of the
 * destination line and leave the caches to the master and node processes on the same cores.
 *
 * The accumulate and scramble steps are XXH3's long-input loop (xxhash.h, vendored beside this
 * file, BSD 2-Clause), written again here only to add the stores; the tests check every digest
 * against the xxhash package.  x86-64 runs AVX2 where the CPU has it, else SSE2; other
 * machines copy with memcpy and hash with XXH3_64bits.  The GIL is released while it runs.
 * Overlapping buffers are moved as memmove moves them (as numpy does), then hashed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

#define STRIPE 64
#define LONG_MIN_BYTES 241 /* XXH3's long-input path starts above 240 bytes */
#define NT_MIN_BYTES (128 * 1024)
#define GIL_MIN_BYTES (32 * 1024)

/* The kernel in use: one pointer to a constant, read once per call (use_kernel may switch it
 * while another thread copies without the GIL). */
struct kern {
    const char *name;
    void *stripes;     /* stripes_fn on x86-64 */
    size_t nt_align;
    int fused;
};
static const struct kern kern_portable = {"portable", NULL, 0, 0};
static const struct kern *active = &kern_portable;

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MC_X86 1

typedef void (*stripes_fn)(xxh_u64 *acc, const uint8_t *in, uint8_t *out,
                           const uint8_t *secret, size_t stripes, int nt);

/* One 64-byte stripe per step: load, store (streaming or not), accumulate as XXH3 does. */
__attribute__((target("sse2"))) static void
stripes_sse2(xxh_u64 *acc, const uint8_t *in, uint8_t *out, const uint8_t *secret,
             size_t stripes, int nt)
{
    __m128i *xacc = (__m128i *)acc;
    for (size_t s = 0; s < stripes; s++) {
        const __m128i *src = (const __m128i *)(in + s * STRIPE);
        __m128i *dst = (__m128i *)(out + s * STRIPE);
        const __m128i *key = (const __m128i *)(secret + s * XXH_SECRET_CONSUME_RATE);
        _mm_prefetch((const char *)(in + s * STRIPE + 512), _MM_HINT_T0);
        for (int i = 0; i < 4; i++) {
            __m128i data = _mm_loadu_si128(src + i);
            if (nt)
                _mm_stream_si128(dst + i, data);
            else
                _mm_storeu_si128(dst + i, data);
            __m128i data_key = _mm_xor_si128(data, _mm_loadu_si128(key + i));
            __m128i data_key_lo = _mm_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
            __m128i product = _mm_mul_epu32(data_key, data_key_lo);
            __m128i swapped = _mm_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
            xacc[i] = _mm_add_epi64(product, _mm_add_epi64(xacc[i], swapped));
        }
    }
}

__attribute__((target("avx2"))) static void
stripes_avx2(xxh_u64 *acc, const uint8_t *in, uint8_t *out, const uint8_t *secret,
             size_t stripes, int nt)
{
    __m256i *xacc = (__m256i *)acc;
    for (size_t s = 0; s < stripes; s++) {
        const __m256i *src = (const __m256i *)(in + s * STRIPE);
        __m256i *dst = (__m256i *)(out + s * STRIPE);
        const __m256i *key = (const __m256i *)(secret + s * XXH_SECRET_CONSUME_RATE);
        _mm_prefetch((const char *)(in + s * STRIPE + 512), _MM_HINT_T0);
        for (int i = 0; i < 2; i++) {
            __m256i data = _mm256_loadu_si256(src + i);
            if (nt)
                _mm256_stream_si256(dst + i, data);
            else
                _mm256_storeu_si256(dst + i, data);
            __m256i data_key = _mm256_xor_si256(data, _mm256_loadu_si256(key + i));
            __m256i product = _mm256_mul_epu32(data_key, _mm256_srli_epi64(data_key, 32));
            __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
            xacc[i] = _mm256_add_epi64(product, _mm256_add_epi64(xacc[i], swapped));
        }
    }
}

static const struct kern kern_sse2 = {"sse2", (void *)stripes_sse2, 16, 1};
static const struct kern kern_avx2 = {"avx2", (void *)stripes_avx2, 32, 1};

/* One side of a copy cut into pieces (a value's parts); the other side is one region. */
struct piece {
    uint8_t *buf;
    size_t len;
};

/* Copy `len` bytes between the pieces' bytes [at, at + len) and `buf`: out of the pieces
 * (to_pieces 0) or into them (1).  `*pi`, `*pstart`: a piece index and its first byte's offset
 * at or before `at`, moved forward as it goes. */
static void
span_copy(struct piece *pieces, size_t *pi, size_t *pstart, size_t at, uint8_t *buf, size_t len,
          int to_pieces)
{
    while (len > 0) {
        while (at >= *pstart + pieces[*pi].len) {
            *pstart += pieces[*pi].len;
            (*pi)++;
        }
        size_t off = at - *pstart;
        size_t take = pieces[*pi].len - off;
        if (take > len)
            take = len;
        if (to_pieces)
            memcpy(pieces[*pi].buf + off, buf, take);
        else
            memcpy(buf, pieces[*pi].buf + off, take);
        buf += take, at += take, len -= take;
    }
}

/* XXH3_hashLong_64b of n bytes (n > 240) copied between `region` and `pieces` (their lengths
 * add up to n): region -> pieces when `into_pieces`, else pieces -> region.  Every stripe is
 * hashed from the registers it is stored from; a stripe that straddles two pieces goes
 * through a 64-byte bounce buffer, and the last stripe is read back from what was written. */
static xxh_u64
copy_xxh3_long(const struct kern *k, uint8_t *region, struct piece *pieces, size_t n,
               int into_pieces)
{
    const stripes_fn stripes = (stripes_fn)k->stripes;
    const size_t nt_align = k->nt_align;
    XXH_ALIGN(64) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;
    const uint8_t *secret = XXH3_kSecret;
    const size_t secret_size = sizeof(XXH3_kSecret);
    const size_t per_block = (secret_size - STRIPE) / XXH_SECRET_CONSUME_RATE;
    const size_t full_blocks = (n - 1) / (STRIPE * per_block);
    const size_t total = (n - 1) / STRIPE; /* stripes before the last (overlapping) one */
    const int big = n >= NT_MIN_BYTES;
    int streamed = 0;
    size_t pi = 0, pstart = 0, s = 0;
    XXH_ALIGN(64) uint8_t bounce[STRIPE];

    while (s < total) {
        size_t in_block = s % per_block;
        size_t run = per_block - in_block;
        if (run > total - s)
            run = total - s;
        size_t at = s * STRIPE;
        while (at >= pstart + pieces[pi].len) {
            pstart += pieces[pi].len;
            pi++;
        }
        size_t fit = (pstart + pieces[pi].len - at) / STRIPE;
        if (fit > 0) {
            if (run > fit)
                run = fit;
            uint8_t *part = pieces[pi].buf + (at - pstart);
            const uint8_t *in = into_pieces ? region + at : part;
            uint8_t *out = into_pieces ? part : region + at;
            int nt = big && ((uintptr_t)out % nt_align) == 0;
            streamed |= nt;
            stripes(acc, in, out, secret + in_block * XXH_SECRET_CONSUME_RATE, run, nt);
        } else { /* the stripe straddles two pieces */
            run = 1;
            if (into_pieces) {
                memcpy(bounce, region + at, STRIPE);
                span_copy(pieces, &pi, &pstart, at, bounce, STRIPE, 1);
            } else {
                span_copy(pieces, &pi, &pstart, at, bounce, STRIPE, 0);
                memcpy(region + at, bounce, STRIPE);
            }
            XXH3_accumulate_512_scalar(acc, bounce, secret + in_block * XXH_SECRET_CONSUME_RATE);
        }
        s += run;
        if (s % per_block == 0 && s / per_block <= full_blocks)
            XXH3_scrambleAcc_scalar(acc, secret + secret_size - STRIPE);
    }
    if (streamed)
        _mm_sfence(); /* the streamed stores are visible before anything that follows */
    size_t done = total * STRIPE; /* then 1 to 64 bytes */
    if (into_pieces)
        span_copy(pieces, &pi, &pstart, done, region + done, n - done, 1);
    else
        span_copy(pieces, &pi, &pstart, done, region + done, n - done, 0);
    /* The last stripe (it overlaps the one before), read back from what was written. */
    if (into_pieces) {
        pi = 0, pstart = 0;
        span_copy(pieces, &pi, &pstart, n - STRIPE, bounce, STRIPE, 0);
    } else {
        memcpy(bounce, region + n - STRIPE, STRIPE);
    }
    XXH3_accumulate_512_scalar(acc, bounce,
                               secret + secret_size - STRIPE - XXH_SECRET_LASTACC_START);
    return XXH3_finalizeLong_64b(acc, secret, (xxh_u64)n);
}
#endif /* x86-64 */

#ifndef MC_X86
struct piece {
    uint8_t *buf;
    size_t len;
};
#endif

static int
overlaps(const uint8_t *a, size_t a_len, const uint8_t *b, size_t b_len)
{
    return a_len && b_len && a < b + b_len && b < a + a_len;
}

/* Copy n bytes between `region` and `pieces` (see copy_xxh3_long) and return xxh3_64 of the
 * bytes written.  A piece that overlaps the region is moved as memmove moves it (as the numpy
 * fallback does), then the bytes written are hashed. */
static xxh_u64
copy_pieces_raw(uint8_t *region, struct piece *pieces, size_t count, size_t n, int into_pieces)
{
    const struct kern *k = __atomic_load_n(&active, __ATOMIC_ACQUIRE);
    int overlap = 0;
    for (size_t i = 0; i < count && !overlap; i++)
        overlap = overlaps(region, n, pieces[i].buf, pieces[i].len);
#ifdef MC_X86
    if (k->fused && !overlap && n >= LONG_MIN_BYTES)
        return copy_xxh3_long(k, region, pieces, n, into_pieces);
#endif
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        if (into_pieces)
            memmove(pieces[i].buf, region + at, pieces[i].len);
        else
            memmove(region + at, pieces[i].buf, pieces[i].len);
        at += pieces[i].len;
    }
    if (!into_pieces || count == 1)
        return XXH3_64bits(into_pieces ? pieces[0].buf : region, n);
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    for (size_t i = 0; i < count; i++)
        XXH3_64bits_update(&state, pieces[i].buf, pieces[i].len);
    return XXH3_64bits_digest(&state);
}

/* copy_pieces_raw, without the GIL from GIL_MIN_BYTES on (the caller holds the buffers). */
static xxh_u64
copy_pieces(uint8_t *region, struct piece *pieces, size_t count, size_t n, int into_pieces)
{
    xxh_u64 digest;
    if (n < GIL_MIN_BYTES)
        return copy_pieces_raw(region, pieces, count, n, into_pieces);
    Py_BEGIN_ALLOW_THREADS
    digest = copy_pieces_raw(region, pieces, count, n, into_pieces);
    Py_END_ALLOW_THREADS
    return digest;
}

static PyObject *
copy_digest(PyObject *self, PyObject *args)
{
    Py_buffer dest, src;
    if (!PyArg_ParseTuple(args, "w*y*:copy_digest", &dest, &src))
        return NULL;
    if (dest.len != src.len) {
        PyErr_Format(PyExc_ValueError, "copy of %zd bytes into a buffer of %zd", src.len,
                     dest.len);
        PyBuffer_Release(&dest);
        PyBuffer_Release(&src);
        return NULL;
    }
    size_t n = (size_t)src.len;
    struct piece piece = {(uint8_t *)dest.buf, n};
    xxh_u64 digest = copy_pieces((uint8_t *)src.buf, &piece, 1, n, 1);
    PyBuffer_Release(&dest);
    PyBuffer_Release(&src);
    return PyLong_FromUnsignedLongLong((unsigned long long)digest);
}

static int
get_contiguous(PyObject *obj, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "buffers must be C-contiguous");
        return -1;
    }
    return 0;
}

static PyObject *
copy_digest_parts(PyObject *self, PyObject *args)
{
    PyObject *region_obj, *parts_obj, *seq = NULL, *result = NULL;
    int into_parts;
    Py_buffer region, *views = NULL;
    struct piece *pieces = NULL;
    Py_ssize_t count = 0, held = 0;
    if (!PyArg_ParseTuple(args, "OOp:copy_digest_parts", &region_obj, &parts_obj, &into_parts))
        return NULL;
    if (get_contiguous(region_obj, &region, !into_parts) < 0)
        return NULL;
    seq = PySequence_Fast(parts_obj, "parts must be a sequence of buffers");
    if (seq == NULL)
        goto done;
    if (PyList_CheckExact(seq)) {
        /* Own the items: the list itself could change while the buffers are taken (a
         * __buffer__ method from Python 3.12 can run any code), its items borrowed. */
        Py_SETREF(seq, PyList_AsTuple(seq));
        if (seq == NULL)
            goto done;
    }
    count = PySequence_Fast_GET_SIZE(seq);
    views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    pieces = PyMem_Calloc(count ? count : 1, sizeof(struct piece));
    if (views == NULL || pieces == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (; held < count; held++) {
        if (get_contiguous(PySequence_Fast_GET_ITEM(seq, held), &views[held], into_parts) < 0)
            goto done;
        pieces[held].buf = (uint8_t *)views[held].buf;
        pieces[held].len = (size_t)views[held].len;
        /* Saturate: lengths that wrap around size_t must not pass for the region's length. */
        total = pieces[held].len > SIZE_MAX - total ? SIZE_MAX : total + pieces[held].len;
    }
    if (total != (size_t)region.len || count == 0) {
        PyErr_Format(PyExc_ValueError, "parts of %zu bytes for a region of %zd", total,
                     region.len);
        goto done;
    }
    xxh_u64 digest =
        copy_pieces((uint8_t *)region.buf, pieces, (size_t)count, (size_t)region.len, into_parts);
    result = PyLong_FromUnsignedLongLong((unsigned long long)digest);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(pieces);
    Py_XDECREF(seq);
    PyBuffer_Release(&region);
    return result;
}

static PyObject *
kernel(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(__atomic_load_n(&active, __ATOMIC_ACQUIRE)->name);
}

/* Select a kernel by name; the machine's best at import.  For tests; a copy running meanwhile
 * finishes with the kernel it started with. */
static PyObject *
use_kernel(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
#ifdef MC_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        __atomic_store_n(&active, &kern_avx2, __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
    if (strcmp(name, "sse2") == 0) {
        __atomic_store_n(&active, &kern_sse2, __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
    if (strcmp(name, "portable") == 0) {
        __atomic_store_n(&active, &kern_portable, __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
#else
    if (strcmp(name, "portable") == 0)
        Py_RETURN_NONE;
#endif
    PyErr_Format(PyExc_ValueError, "kernel %R is not available on this machine", arg);
    return NULL;
}

static PyMethodDef methods[] = {
    {"copy_digest", copy_digest, METH_VARARGS,
     "copy_digest(dest, src) -> int: copy src into dest (same length) and return xxh3_64 "
     "(seed 0) of the bytes written."},
    {"copy_digest_parts", copy_digest_parts, METH_VARARGS,
     "copy_digest_parts(region, parts, into_parts) -> int: copy region -> parts (into_parts) "
     "or parts -> region (their lengths add up to the region's) and return xxh3_64 (seed 0) "
     "of the bytes written, one after the other."},
    {"kernel", kernel, METH_NOARGS, "kernel() -> str: 'avx2', 'sse2' or 'portable'."},
    {"use_kernel", use_kernel, METH_O,
     "use_kernel(name): run 'avx2', 'sse2' or 'portable' from now on (ValueError: not here)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_copyhash",
    "Copy a buffer and hash the bytes written in one pass (mooncake_store/native/copyhash.c).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__copyhash(void)
{
#ifdef MC_X86
    __builtin_cpu_init();
    active = __builtin_cpu_supports("avx2") ? &kern_avx2 : &kern_sse2;
#endif
    return PyModule_Create(&module);
}
