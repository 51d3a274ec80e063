/* Table lookups: one entry per element, for the bucket lookups of tablelut.c (pasted after this
 * file, once per key type). Scalar gathers everywhere; where the library is built for AVX-512 and
 * this CPU's gathers are fast (table_gathers_fast, measured once per process), one-pass tiles
 * that compute the keys and gather in registers: the deterministic result (table_det_tile_f32)
 * and the stochastic modes' neighbours (table_sr_tile_f32). Either route gives the same values. */

/* Lookups of one entry per element (bucket lookups, tablelut.c) in scalar loops, unrolled: without
   hardware gathers (GCC's generic tuning has none) the vectoriser emulates each gather with
   extracts and inserts, which took 2-3x longer than these loads. */
#if defined(__GNUC__) && !defined(__clang__)
#define TABLE_SCALAR static __attribute__((noinline, optimize("no-tree-vectorize")))
#else
#define TABLE_SCALAR static __attribute__((noinline))
#endif
#define TABLE_GATHER(NAME, T, K)                                                                     \
    TABLE_SCALAR void NAME(const T *restrict lut, const K *restrict key, T *restrict out, int64_t n) { \
        int64_t i = 0;                                                                               \
        for (; i + 4 <= n; i += 4) {                                                                 \
            T a = lut[key[i]], b = lut[key[i + 1]], c = lut[key[i + 2]], d = lut[key[i + 3]];        \
            out[i] = a;                                                                              \
            out[i + 1] = b;                                                                          \
            out[i + 2] = c;                                                                          \
            out[i + 3] = d;                                                                          \
        }                                                                                            \
        for (; i < n; i++) out[i] = lut[key[i]];                                                     \
    }
TABLE_GATHER(table_gather_32, uint32_t, uint32_t)
TABLE_GATHER(table_gather_64, uint64_t, uint64_t)
TABLE_GATHER(table_gather_64k32, uint64_t, uint32_t)
#undef TABLE_GATHER

#if defined(__AVX512F__)
#include <immintrin.h>
#include <x86intrin.h> /* __rdtsc */
/* One tile of tablelut.c's deterministic lookup for float arrays (32-bit keys and entries), in
   one pass with the key, a hardware gather and the choice in registers: 1.7-2x faster than the
   three passes on an Intel Sapphire Rapids. The same key map as table_entry / table_key_det on
   uint32 lanes (unsigned clamps and compares, wrapping sums), the same sentinel rule; returns the
   flagged count, with fl and y as the three passes leave them. km: the template's key map
   (table_keys) for float arrays, {shift, lowmask, klo1, khi1, off, ntot}. Where the library is
   built without AVX-512, or where gathers are slow (table_gathers_fast), those passes run. */
static int32_t table_det_tile_f32(const uint32_t *x, uint32_t *y, int64_t m, const uint32_t *lut,
                                  const uint32_t km[6], uint32_t nan_from, int32_t *fl) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), zero = _mm512_setzero_si512();
    const __m512i lowmask = _mm512_set1_epi32((int)km[1]);
    const __m512i klo1 = _mm512_set1_epi32((int)km[2]), khi1 = _mm512_set1_epi32((int)km[3]);
    const __m512i off = _mm512_set1_epi32((int)km[4]), ntot = _mm512_set1_epi32((int)km[5]);
    const __m512i nan_key = _mm512_set1_epi32((int)(2 * km[5])), nan_at = _mm512_set1_epi32((int)nan_from);
    const __m512i sentinel = _mm512_set1_epi32(-1), one = _mm512_set1_epi32(1);
    const __m128i shift = _mm_cvtsi32_si128((int)km[0]);
    int32_t nf = 0;
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 live = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
        __m512i u = _mm512_maskz_loadu_epi32(live, x + i);
        __m512i a = _mm512_and_si512(u, abs_mask);
        __m512i k = _mm512_add_epi32(_mm512_srl_epi32(a, shift), _mm512_srl_epi32(_mm512_add_epi32(a, lowmask), shift));
        k = _mm512_min_epu32(_mm512_max_epu32(k, klo1), khi1);
        k = _mm512_mask_mov_epi32(k, _mm512_cmpeq_epi32_mask(a, zero), off);
        k = _mm512_sub_epi32(k, off);
        k = _mm512_mask_add_epi32(k, _mm512_cmplt_epi32_mask(u, zero), k, ntot); /* negative x */
        k = _mm512_mask_mov_epi32(k, _mm512_cmpge_epu32_mask(a, nan_at), nan_key);
        __m512i r = _mm512_mask_i32gather_epi32(zero, live, k, (const void *)lut, 4);
        __mmask16 f = _mm512_mask_cmpeq_epi32_mask(live, r, sentinel);
        _mm512_mask_storeu_epi32(y + i, live, _mm512_mask_mov_epi32(r, f, u));
        _mm512_mask_storeu_epi32(fl + i, live, _mm512_maskz_mov_epi32(f, one));
        nf += __builtin_popcount((unsigned)f);
    }
    return nf;
}

/* The key pass of tablelut.c's stochastic lookup for float arrays, with its lookups, in one pass:
   table_key_sr's keys on uint32 lanes (as table_det_tile_f32's), the entries (lo's and hi's float32
   bits in one uint64) by two 8-lane hardware gathers, and x widened to double as it is (xo) and with
   NaN read as 0 (xs); the same arrays as the key loop and table_gather_64k32 leave. */
static void table_sr_tile_f32(const uint32_t *x, int64_t m, const uint64_t *lut, const uint32_t km[6],
                              uint64_t *e, double *xo, double *xs) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), zero = _mm512_setzero_si512();
    const __m512i expmask = _mm512_set1_epi32(0x7F800000);
    const __m512i lowmask = _mm512_set1_epi32((int)km[1]);
    const __m512i klo1 = _mm512_set1_epi32((int)km[2]), khi1 = _mm512_set1_epi32((int)km[3]);
    const __m512i off = _mm512_set1_epi32((int)km[4]), ntot = _mm512_set1_epi32((int)km[5]);
    const __m512d dzero = _mm512_setzero_pd();
    const __m128i shift = _mm_cvtsi32_si128((int)km[0]);
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 live = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
        const __mmask8 live0 = (__mmask8)live, live1 = (__mmask8)(live >> 8);
        __m512i u = _mm512_maskz_loadu_epi32(live, x + i);
        __m512i a = _mm512_and_si512(u, abs_mask);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(a, expmask); /* read as +0 */
        __mmask16 neg = _mm512_mask_cmplt_epi32_mask((__mmask16)~nan, u, zero);
        a = _mm512_mask_mov_epi32(a, nan, zero);
        __m512i k = _mm512_add_epi32(_mm512_srl_epi32(a, shift), _mm512_srl_epi32(_mm512_add_epi32(a, lowmask), shift));
        k = _mm512_min_epu32(_mm512_max_epu32(k, klo1), khi1);
        k = _mm512_mask_mov_epi32(k, _mm512_cmpeq_epi32_mask(a, zero), off);
        k = _mm512_sub_epi32(k, off);
        k = _mm512_mask_add_epi32(k, neg, k, ntot);
        __m512i e0 = _mm512_mask_i32gather_epi64(zero, live0, _mm512_castsi512_si256(k), (const void *)lut, 8);
        __m512i e1 = _mm512_mask_i32gather_epi64(zero, live1, _mm512_extracti64x4_epi64(k, 1), (const void *)lut, 8);
        _mm512_mask_storeu_epi64(e + i, live0, e0);
        _mm512_mask_storeu_epi64(e + i + 8, live1, e1);
        __m512d d0 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_castsi512_si256(u)));
        __m512d d1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(u, 1)));
        _mm512_mask_storeu_pd(xo + i, live0, d0);
        _mm512_mask_storeu_pd(xo + i + 8, live1, d1);
        _mm512_mask_storeu_pd(xs + i, live0, _mm512_mask_mov_pd(d0, (__mmask8)nan, dzero));
        _mm512_mask_storeu_pd(xs + i + 8, live1, _mm512_mask_mov_pd(d1, (__mmask8)(nan >> 8), dzero));
    }
}

/* Whether this CPU's gathers are fast enough for table_det_tile_f32, measured once per process:
   16-lane gathers against table_gather_32's scalar loads over the same 4 KiB table and keys (the
   best of 8 rounds each, in TSC ticks). Some CPUs run gathers in microcode (the mitigation of
   Gather Data Sampling on Intel cores up to Ice Lake makes them several times slower); there the
   scalar loads win and the three passes run. Either choice gives the same values. */
static int table_gathers_fast_state; /* 0 not measured, 1 fast, 2 slow */

__attribute__((noinline)) static void table_gather_zmm(const uint32_t *lut, const uint32_t *key, uint32_t *out, int64_t n) {
    for (int64_t i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_si512(out + i, _mm512_i32gather_epi32(_mm512_loadu_si512(key + i), (const void *)lut, 4));
}

static int table_gathers_fast(void) {
    int state = __atomic_load_n(&table_gathers_fast_state, __ATOMIC_RELAXED);
    if (state) return state == 1;
    uint32_t lut[1024], key[TABLE_TILE], out[TABLE_TILE];
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 1024; i++) lut[i] = (uint32_t)i * 2654435761u;
    for (int i = 0; i < TABLE_TILE; i++) key[i] = (uint32_t)(mix64(z += 0x9E3779B97F4A7C15ull) >> 54);
    uint64_t best_gather = ~0ull, best_loads = ~0ull;
    volatile int64_t count = TABLE_TILE; /* a count the compiler does not fold into the loops */
    const int64_t n = count;
    for (int round = 0; round < 8; round++) {
        uint64_t t0 = __rdtsc();
        table_gather_zmm(lut, key, out, n);
        uint64_t t1 = __rdtsc();
        table_gather_32(lut, key, out, n);
        uint64_t t2 = __rdtsc();
        best_gather = t1 - t0 < best_gather ? t1 - t0 : best_gather;
        best_loads = t2 - t1 < best_loads ? t2 - t1 : best_loads;
    }
    /* the one pass also saves the key and result arrays' stores and loads: it wins with gathers
       up to about 1.25x the scalar loads' time */
    state = 4 * best_gather <= 5 * best_loads ? 1 : 2;
    __atomic_store_n(&table_gathers_fast_state, state, __ATOMIC_RELAXED);
    return state == 1;
}
#endif

/* lo = lut[2k], hi = lut[2k + 1] for each key k (float64 neighbour lookups) */
TABLE_SCALAR void table_gather_pair(const double *restrict lut, const uint64_t *restrict key,
                                    double *restrict lo, double *restrict hi, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const double *e = lut + 2 * key[i];
        lo[i] = e[0];
        hi[i] = e[1];
    }
}

