/* Homomorphic bin sums in C: products of ciphertexts, per bin, modulo an odd modulus; and,
 * with the same Montgomery products, fixed-base window powers (the key holder's obfuscators
 * under both schemes and OU's g^m).
 *
 * A passive party's encrypted histogram (SecureBoost Alg. 1 lines 4-9) multiplies each row's
 * ciphertext into one accumulator per feature: one modular product per row and feature, the
 * bulk of a vertical tree's work. In Python over gmpy2 each product pays for two new numbers
 * and a division (``a * c % m``); here accumulators stay in place and each product is a
 * Montgomery product (GMP's mpn_mul_n, then a word-by-word reduction with mpn_addmul_1, as
 * GMP's own redc_1), with the interpreter's lock released.
 *
 * Montgomery products are taken on ciphertexts as they are (not converted to Montgomery
 * form): after k products a bin holds P * R^-(k-1) (R = 2^(64 limbs)), which a few more products,
 * per bin, by powers of R from a small table (one per base-16 digit of k - 1) turn into P. The result equals the Python loop's number for number
 * (tests/crypto/test_bin_products.py).
 *
 * The ciphertexts are gmpy2 ``mpz`` objects read in place (gmpy2's public header, gmpy2.h,
 * gives the object's layout: the Python header, then GMP's mpz_t); only exact mpz instances
 * are read, and each must be positive and below the modulus.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <gmp.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    mpz_t z;
    Py_hash_t hash_cache;
} GmpyMPZ; /* gmpy2.h's MPZ_Object */

static PyTypeObject *mpz_type = NULL;

#define MAX_LIMBS 128 /* 8192-bit moduli: twice the largest key a job may configure */

typedef struct {
    const mp_limb_t *m;
    mp_size_t n;
    mp_limb_t minv; /* -m^-1 mod 2^64 */
    mp_limb_t *scratch; /* 2n limbs */
} Modulus;

/* r = a * b * R^-1 mod m; r may alias a or b; a, b < m */
static void mont_mul(mp_limb_t *r, const mp_limb_t *a, const mp_limb_t *b, const Modulus *mod) {
    mp_size_t n = mod->n;
    mp_limb_t *t = mod->scratch;
    if (a == b)
        mpn_sqr(t, a, n);
    else
        mpn_mul_n(t, a, b, n);
    /* each round clears the lowest limb; its carry is kept in that limb and added at the end */
    mp_limb_t *up = t;
    for (mp_size_t j = 0; j < n; j++, up++) {
        mp_limb_t q = up[0] * mod->minv;
        up[0] = mpn_addmul_1(up, mod->m, n, q);
    }
    mp_limb_t carry = mpn_add_n(r, t + n, t, n);
    if (carry || mpn_cmp(r, mod->m, n) >= 0)
        mpn_sub_n(r, r, mod->m, n);
}

/* x mod m for x of xn limbs, into n limbs */
static void reduce(mp_limb_t *r, const mp_limb_t *x, mp_size_t xn, const Modulus *mod) {
    mp_limb_t q[2 * MAX_LIMBS + 2];
    mpn_tdiv_qr(q, r, 0, x, xn, mod->m, mod->n);
}

#define WINDOW_BITS 4
#define WINDOW (1 << WINDOW_BITS)

/* Correction factors: table[i * WINDOW + d] = R^(d * 16^i + 1) mod m for d in [1, 16), so that
 * one Montgomery product by table[i * WINDOW + d] multiplies by R^(d * 16^i); a bin of k rows
 * takes one product per nonzero base-16 digit of k - 1. ``r2`` is R^2 mod m (= R^(1 + 1)). */
static void correction_table(mp_limb_t *table, int windows, const mp_limb_t *r2,
                             const Modulus *mod) {
    mp_size_t n = mod->n;
    const mp_limb_t *step = r2; /* R^(16^i + 1) */
    for (int i = 0; i < windows; i++) {
        mp_limb_t *row = table + (size_t)i * WINDOW * n;
        memcpy(row + n, step, n * sizeof(mp_limb_t));
        for (int d = 2; d < WINDOW; d++)
            mont_mul(row + d * n, row + (d - 1) * n, row + n, mod);
        if (i + 1 < windows) { /* R^(16^(i+1) + 1) = R^(15 * 16^i + 1) R^(16^i + 1) R^-1 */
            mp_limb_t *next = table + (size_t)(i + 1) * WINDOW * n + n;
            mont_mul(next, row + (WINDOW - 1) * n, row + n, mod);
            step = next;
        }
    }
}

static int read_mpz(PyObject *obj, const mp_limb_t **limbs, mp_size_t *size) {
    if (Py_TYPE(obj) != mpz_type) {
        PyErr_Format(PyExc_TypeError, "numbers must be gmpy2.mpz, not %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const __mpz_struct *z = ((GmpyMPZ *)obj)->z;
    *limbs = z->_mp_d;
    *size = z->_mp_size;
    return 0;
}

/* The modulus of a call: read, checked odd, above 1 and at most MAX_LIMBS limbs, copied into
 * ``m`` (MAX_LIMBS limbs) and set up in ``mod`` with its Montgomery constant (``scratch``:
 * 2 * MAX_LIMBS limbs). -1 with the exception set if it is not a usable modulus. */
static int open_modulus(PyObject *obj, mp_limb_t *m, mp_limb_t *scratch, Modulus *mod) {
    const mp_limb_t *limbs;
    mp_size_t n;
    if (read_mpz(obj, &limbs, &n) < 0)
        return -1;
    if (n < 1 || n > MAX_LIMBS || !(limbs[0] & 1) || (n == 1 && limbs[0] == 1)) {
        PyErr_SetString(PyExc_ValueError, "the modulus must be odd, above 1 and at most 8192 bits");
        return -1;
    }
    memcpy(m, limbs, n * sizeof(mp_limb_t));
    mp_limb_t inv = m[0]; /* Newton: m^-1 mod 2^64, each step doubles the good bits */
    for (int s = 0; s < 6; s++)
        inv *= 2 - m[0] * inv;
    *mod = (Modulus){m, n, -inv, scratch};
    return 0;
}

/* R^e mod m for e in {1, 2} (R = 2^(64 n)), standard form */
static void power_of_r(mp_limb_t *out, int e, const Modulus *mod) {
    mp_limb_t power[2 * MAX_LIMBS + 1];
    memset(power, 0, (e * mod->n + 1) * sizeof(mp_limb_t));
    power[e * mod->n] = 1;
    reduce(out, power, e * mod->n + 1, mod);
}

PyDoc_STRVAR(bin_products_doc,
"bin_products(ciphertexts, rows, codes, n_bins, modulus) -> bytes\n\n"
"Products modulo ``modulus`` (odd) of ``ciphertexts[rows[i]]`` per (feature, bin), in the\n"
"order feature-major: ``codes`` is len(rows) x n_features uint8, C-contiguous, bin codes below\n"
"n_bins; ``rows`` int64. Each product is returned as the modulus's width of little-endian\n"
"64-bit limbs; a bin no row fell in holds 1 (the trivial encryption of 0).");

static PyObject *bin_products(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ciphertexts, *rows_obj, *codes_obj, *modulus_obj;
    Py_ssize_t n_bins;
    if (!PyArg_ParseTuple(args, "O!OOnO", &PyList_Type, &ciphertexts, &rows_obj, &codes_obj,
                          &n_bins, &modulus_obj))
        return NULL;
    mp_limb_t m[MAX_LIMBS], scratch[2 * MAX_LIMBS];
    Modulus mod;
    if (open_modulus(modulus_obj, m, scratch, &mod) < 0)
        return NULL;
    mp_size_t n = mod.n;
    if (n_bins < 1 || n_bins > 256) {
        PyErr_SetString(PyExc_ValueError, "n_bins must be in [1, 256]");
        return NULL;
    }
    Py_buffer rows = {0}, codes = {0};
    PyObject *result = NULL;
    const PyObject **cts = NULL;
    mp_limb_t *acc = NULL;
    uint64_t *counts = NULL;
    mp_limb_t *table = NULL;
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    if (PyObject_GetBuffer(codes_obj, &codes, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    if (rows.itemsize != 8 || !rows.format || (strcmp(rows.format, "l") && strcmp(rows.format, "q")
                                               && strcmp(rows.format, "<q"))) {
        PyErr_SetString(PyExc_TypeError, "rows must be a contiguous int64 array");
        goto done;
    }
    if (codes.itemsize != 1 || (codes.format && strcmp(codes.format, "B"))) {
        PyErr_SetString(PyExc_TypeError, "codes must be a contiguous uint8 array");
        goto done;
    }
    Py_ssize_t n_rows = rows.len / 8;
    if (codes.ndim != 2 || codes.shape[0] != n_rows) {
        PyErr_SetString(PyExc_ValueError, "codes must be rows x features");
        goto done;
    }
    Py_ssize_t n_features = codes.shape[1];
    Py_ssize_t n_slots = n_features * n_bins;
    const int64_t *row_index = (const int64_t *)rows.buf;
    const uint8_t *code = (const uint8_t *)codes.buf;
    Py_ssize_t n_cts = PyList_GET_SIZE(ciphertexts);

    /* with the lock held: check every input and hold a reference to each row's ciphertext */
    cts = PyMem_Calloc(n_rows ? n_rows : 1, sizeof(PyObject *));
    acc = PyMem_Malloc((size_t)(n_slots ? n_slots : 1) * n * sizeof(mp_limb_t));
    counts = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(uint64_t));
    table = PyMem_Malloc((size_t)16 * WINDOW * n * sizeof(mp_limb_t)); /* k < 2^64: 16 windows */
    if (!cts || !acc || !counts || !table) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_rows; i++) {
        int64_t at = row_index[i];
        if (at < 0 || at >= n_cts) {
            PyErr_Format(PyExc_IndexError, "row %lld is not one of the %zd ciphertexts",
                         (long long)at, n_cts);
            goto done;
        }
        PyObject *c = PyList_GET_ITEM(ciphertexts, at);
        const mp_limb_t *limbs;
        mp_size_t size;
        if (read_mpz(c, &limbs, &size) < 0)
            goto done;
        if (size <= 0 || size > n || (size == n && mpn_cmp(limbs, m, n) >= 0)) {
            PyErr_Format(PyExc_ValueError, "ciphertext of row %lld is not in (0, modulus)",
                         (long long)at);
            goto done;
        }
        Py_INCREF(c);
        cts[i] = c;
    }
    for (Py_ssize_t k = 0; k < n_rows * n_features; k++) {
        if (code[k] >= n_bins) {
            PyErr_Format(PyExc_ValueError, "bin code %d is not below %zd", code[k], n_bins);
            goto done;
        }
    }

    mp_limb_t c_limbs[MAX_LIMBS], r2[MAX_LIMBS];

    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_rows; i++) {
        const __mpz_struct *z = ((GmpyMPZ *)cts[i])->z;
        mp_size_t size = z->_mp_size;
        memcpy(c_limbs, z->_mp_d, size * sizeof(mp_limb_t));
        memset(c_limbs + size, 0, (n - size) * sizeof(mp_limb_t));
        const uint8_t *row_codes = code + i * n_features;
        for (Py_ssize_t f = 0; f < n_features; f++) {
            Py_ssize_t slot = f * n_bins + row_codes[f];
            mp_limb_t *a = acc + slot * n;
            if (counts[slot]++)
                mont_mul(a, a, c_limbs, &mod);
            else
                memcpy(a, c_limbs, n * sizeof(mp_limb_t));
        }
    }
    /* R^2 mod m, the correction factors, then each bin of k > 1 rows times R^(k-1) (the top) */
    uint64_t most = 0;
    for (Py_ssize_t slot = 0; slot < n_slots; slot++)
        most = counts[slot] > most ? counts[slot] : most;
    int windows = 0;
    while (windows < 16 && (most - (most > 0)) >> (WINDOW_BITS * windows))
        windows++;
    power_of_r(r2, 2, &mod);
    if (windows)
        correction_table(table, windows, r2, &mod);
    for (Py_ssize_t slot = 0; slot < n_slots; slot++) {
        mp_limb_t *a = acc + slot * n;
        if (counts[slot] == 0) {
            memset(a, 0, n * sizeof(mp_limb_t));
            a[0] = 1;
            continue;
        }
        uint64_t k = counts[slot] - 1;
        for (int i = 0; k; i++, k >>= WINDOW_BITS)
            if (k & (WINDOW - 1))
                mont_mul(a, a, table + ((size_t)i * WINDOW + (k & (WINDOW - 1))) * n, &mod);
    }
    Py_END_ALLOW_THREADS

    result = PyBytes_FromStringAndSize((const char *)acc,
                                       (Py_ssize_t)n_slots * n * sizeof(mp_limb_t));
done:
    if (cts) {
        for (Py_ssize_t i = 0; i < rows.len / 8; i++)
            Py_XDECREF(cts[i]);
        PyMem_Free(cts);
    }
    PyMem_Free(acc);
    PyMem_Free(counts);
    PyMem_Free(table);
    if (rows.obj)
        PyBuffer_Release(&rows);
    if (codes.obj)
        PyBuffer_Release(&codes);
    return result;
}


/* ask the memory for a number's limbs before they are needed (a hint: never faults) */
static inline void prefetch_limbs(const mp_limb_t *x, mp_size_t size) {
    for (mp_size_t i = 0; i < size; i += 64 / sizeof(mp_limb_t))
        __builtin_prefetch(x + i);
}

#define PREFETCH_AHEAD 2
/* window_powers asks for table entries this many products ahead: each is a random place in a
   table of megabytes (measured: two ahead beat one, most for the smaller moduli) */

PyDoc_STRVAR(window_powers_doc,
"window_powers(rows, exponents, width, window_bits, modulus) -> bytes\n\n"
"base^e mod ``modulus`` (odd) for each exponent e, from a fixed-base window table:\n"
"``rows[i][d]`` = base^(d * 2^(window_bits * i)) mod modulus, every entry a gmpy2.mpz in\n"
"(0, modulus). ``exponents`` holds them as ``width`` little-endian bytes each. One product per\n"
"nonzero window; results as the modulus's width of little-endian 64-bit limbs.");

static PyObject *window_powers(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rows_obj, *modulus_obj;
    Py_buffer exps = {0};
    Py_ssize_t width;
    int window_bits;
    if (!PyArg_ParseTuple(args, "O!y*niO", &PyList_Type, &rows_obj, &exps, &width,
                          &window_bits, &modulus_obj))
        return NULL;
    PyObject *result = NULL;
    mp_limb_t *out = NULL, *rpow = NULL;
    const mp_limb_t **picked = NULL;
    mp_size_t *sizes = NULL;
    Py_ssize_t *first = NULL;
    mp_limb_t m[MAX_LIMBS], scratch[2 * MAX_LIMBS];
    Modulus mod;
    Py_ssize_t n_rows = PyList_GET_SIZE(rows_obj);
    if (open_modulus(modulus_obj, m, scratch, &mod) < 0)
        goto done;
    mp_size_t n = mod.n;
    if (window_bits < 1 || window_bits > 16 || width < 1 || exps.len % width) {
        PyErr_SetString(PyExc_ValueError, "window_bits in [1, 16]; exponents a whole number of widths");
        goto done;
    }
    Py_ssize_t count = exps.len / width;
    Py_ssize_t windows = (width * 8 + window_bits - 1) / window_bits;
    if (windows > 255) {
        PyErr_SetString(PyExc_ValueError, "exponents too wide");
        goto done;
    }
    out = PyMem_Malloc((size_t)(count ? count : 1) * n * sizeof(mp_limb_t));
    rpow = PyMem_Malloc((size_t)(windows + 1) * n * sizeof(mp_limb_t));
    picked = PyMem_Malloc((size_t)(count ? count : 1) * windows * sizeof(mp_limb_t *));
    sizes = PyMem_Malloc((size_t)(count ? count : 1) * windows * sizeof(mp_size_t));
    first = PyMem_Malloc((size_t)(count + 1) * sizeof(Py_ssize_t));
    if (!out || !rpow || !picked || !sizes || !first) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *bytes = (const uint8_t *)exps.buf;
    Py_ssize_t entries = (Py_ssize_t)1 << window_bits;
    /* with the lock held: each exponent's table entries, checked, in the order the products
       use them (exponent e's are picked[first[e]] to picked[first[e + 1] - 1]); the table (its
       rows and their numbers) belongs to the caller's key, which outlives the call */
    Py_ssize_t used = 0;
    for (Py_ssize_t e = 0; e < count; e++) {
        first[e] = used;
        const uint8_t *x = bytes + e * width;
        for (Py_ssize_t i = 0; i < windows; i++) {
            Py_ssize_t bit = i * window_bits, digit = 0;
            for (int b = 0; b < window_bits && bit + b < width * 8; b++)
                digit |= (Py_ssize_t)((x[(bit + b) >> 3] >> ((bit + b) & 7)) & 1) << b;
            if (!digit)
                continue;
            PyObject *row = i < n_rows ? PyList_GET_ITEM(rows_obj, i) : NULL;
            if (!row || !PyList_Check(row) || PyList_GET_SIZE(row) != entries) {
                PyErr_Format(PyExc_ValueError, "the table has no full row %zd of %zd entries",
                             i, entries);
                goto done;
            }
            const mp_limb_t *limbs;
            mp_size_t size;
            if (read_mpz(PyList_GET_ITEM(row, digit), &limbs, &size) < 0)
                goto done;
            if (size <= 0 || size > n || (size == n && mpn_cmp(limbs, m, n) >= 0)) {
                PyErr_SetString(PyExc_ValueError, "a table entry is not in (0, modulus)");
                goto done;
            }
            sizes[used] = size;
            picked[used++] = limbs;
        }
    }
    first[count] = used;
    mp_limb_t r2[MAX_LIMBS];

    Py_BEGIN_ALLOW_THREADS
    /* rpow[j] = R^j mod m (j >= 1): a product of k entries carries R^-(k-1), and one more
       Montgomery product by R^k takes it away */
    power_of_r(rpow + n, 1, &mod);
    power_of_r(r2, 2, &mod);
    for (Py_ssize_t j = 2; j <= windows; j++)
        mont_mul(rpow + j * n, rpow + (j - 1) * n, r2, &mod); /* R^(j-1) R^2 R^-1 */
    for (Py_ssize_t j = 0; j < PREFETCH_AHEAD && j < used; j++)
        prefetch_limbs(picked[j], sizes[j]);
    mp_limb_t entry[MAX_LIMBS];
    for (Py_ssize_t e = 0; e < count; e++) {
        mp_limb_t *a = out + e * n;
        Py_ssize_t k = first[e + 1] - first[e];
        if (k == 0) {
            memset(a, 0, n * sizeof(mp_limb_t));
            a[0] = 1;
            continue;
        }
        for (Py_ssize_t j = first[e]; j < first[e + 1]; j++) {
            if (j + PREFETCH_AHEAD < used)
                prefetch_limbs(picked[j + PREFETCH_AHEAD], sizes[j + PREFETCH_AHEAD]);
            const mp_limb_t *x = picked[j];
            if (sizes[j] < n) { /* a number below the modulus's top limb: padded */
                memcpy(entry, x, sizes[j] * sizeof(mp_limb_t));
                memset(entry + sizes[j], 0, (n - sizes[j]) * sizeof(mp_limb_t));
                x = entry;
            }
            if (j == first[e])
                memcpy(a, x, n * sizeof(mp_limb_t));
            else
                mont_mul(a, a, x, &mod);
        }
        if (k > 1)
            mont_mul(a, a, rpow + (size_t)k * n, &mod);
    }
    Py_END_ALLOW_THREADS

    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)count * n * sizeof(mp_limb_t));
done:
    PyBuffer_Release(&exps);
    PyMem_Free(out);
    PyMem_Free(rpow);
    PyMem_Free(picked);
    PyMem_Free(sizes);
    PyMem_Free(first);
    return result;
}

static PyMethodDef methods[] = {
    {"bin_products", bin_products, METH_VARARGS, bin_products_doc},
    {"window_powers", window_powers, METH_VARARGS, window_powers_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "crypto._bin_products",
    "Homomorphic bin sums (products of ciphertexts per bin) in C, on GMP's mpn layer.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__bin_products(void) {
    PyObject *gmpy2 = PyImport_ImportModule("gmpy2");
    if (!gmpy2)
        return NULL;
    PyObject *type = PyObject_GetAttrString(gmpy2, "mpz");
    Py_DECREF(gmpy2);
    if (!type)
        return NULL;
    if (!PyType_Check(type)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_ImportError, "gmpy2.mpz is not a type");
        return NULL;
    }
    mpz_type = (PyTypeObject *)type; /* kept for the module's lifetime */
    return PyModule_Create(&module);
}
