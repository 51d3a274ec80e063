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
/* table_entry on 16 uint32 lanes (unsigned clamps and compares, wrapping sums), for the one-pass
   tiles below: the key map of the template's table_keys for float arrays, km = {shift, lowmask,
   klo1, khi1, off, ntot}, and the entry of magnitude bits a with the lanes neg negative. */
typedef struct {
    __m512i lowmask, klo1, khi1, off, ntot;
    __m128i shift;
} table_keyv;

ANY_INLINE table_keyv table_keyv_of(const uint32_t km[6]) {
    table_keyv v;
    v.shift = _mm_cvtsi32_si128((int)km[0]);
    v.lowmask = _mm512_set1_epi32((int)km[1]);
    v.klo1 = _mm512_set1_epi32((int)km[2]);
    v.khi1 = _mm512_set1_epi32((int)km[3]);
    v.off = _mm512_set1_epi32((int)km[4]);
    v.ntot = _mm512_set1_epi32((int)km[5]);
    return v;
}

ANY_INLINE __m512i table_entry16(__m512i a, __mmask16 neg, const table_keyv *v) {
    __m512i k = _mm512_add_epi32(_mm512_srl_epi32(a, v->shift),
                                 _mm512_srl_epi32(_mm512_add_epi32(a, v->lowmask), v->shift));
    k = _mm512_min_epu32(_mm512_max_epu32(k, v->klo1), v->khi1);
    k = _mm512_mask_mov_epi32(k, _mm512_cmpeq_epi32_mask(a, _mm512_setzero_si512()), v->off);
    k = _mm512_sub_epi32(k, v->off);
    return _mm512_mask_add_epi32(k, neg, k, v->ntot);
}

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
    const table_keyv kv = table_keyv_of(km);
    const __m512i nan_key = _mm512_set1_epi32((int)(2 * km[5])), nan_at = _mm512_set1_epi32((int)nan_from);
    const __m512i sentinel = _mm512_set1_epi32(-1), one = _mm512_set1_epi32(1);
    int32_t nf = 0;
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 live = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
        __m512i u = _mm512_maskz_loadu_epi32(live, x + i);
        __m512i a = _mm512_and_si512(u, abs_mask);
        __m512i k = table_entry16(a, _mm512_cmplt_epi32_mask(u, zero), &kv); /* negative x */
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
/* table_key_sr's entries for 16 float32 inputs u (the live lanes): lo's and hi's float32 bits in one
   uint64, lanes 0-7 in e[0] and 8-15 in e[1]; the NaN lanes, keyed as +0, in *nan */
ANY_INLINE void table_sr_entries16(__m512i u, __mmask16 live, const table_keyv *kv, const uint64_t *lut,
                                   __m512i e[2], __mmask16 *nan) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    *nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    __mmask16 neg = _mm512_mask_cmplt_epi32_mask((__mmask16)~*nan, u, zero);
    __m512i k = table_entry16(_mm512_mask_mov_epi32(a, *nan, zero), neg, kv);
    e[0] = _mm512_mask_i32gather_epi64(zero, (__mmask8)live, _mm512_castsi512_si256(k), (const void *)lut, 8);
    e[1] = _mm512_mask_i32gather_epi64(zero, (__mmask8)(live >> 8), _mm512_extracti64x4_epi64(k, 1),
                                       (const void *)lut, 8);
}

static void table_sr_tile_f32(const uint32_t *x, int64_t m, const uint64_t *lut, const uint32_t km[6],
                              uint64_t *e, double *xo, double *xs) {
    const table_keyv kv = table_keyv_of(km);
    const __m512d dzero = _mm512_setzero_pd();
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 live = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
        const __mmask8 live0 = (__mmask8)live, live1 = (__mmask8)(live >> 8);
        __m512i u = _mm512_maskz_loadu_epi32(live, x + i);
        __m512i ent[2];
        __mmask16 nan;
        table_sr_entries16(u, live, &kv, lut, ent, &nan);
        _mm512_mask_storeu_epi64(e + i, live0, ent[0]);
        _mm512_mask_storeu_epi64(e + i + 8, live1, ent[1]);
        __m512d d0 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_castsi512_si256(u)));
        __m512d d1 = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(u, 1)));
        _mm512_mask_storeu_pd(xo + i, live0, d0);
        _mm512_mask_storeu_pd(xo + i + 8, live1, d1);
        _mm512_mask_storeu_pd(xs + i, live0, _mm512_mask_mov_pd(d0, (__mmask8)nan, dzero));
        _mm512_mask_storeu_pd(xs + i + 8, live1, _mm512_mask_mov_pd(d1, (__mmask8)(nan >> 8), dzero));
    }
}

/* The stochastic modes for float arrays and tables whose every spacing is a power of two
   (tablelut.TableLut.pow2) in float32's normal range, in one pass: table_sr_entries16's keys and
   neighbours, then table_sr_choose's choice on 16 float32 lanes, where table_sr_choose takes 8
   double ones.
   - Exact SR (M_SR) needs p = num / den only as far as the draw's top B = 21 bits (the high word
     of the 53-bit draw, dh): with q = p * 2**B, dh < floor(q) decides up and dh > floor(q)
     decides down for any later bits, as sr_exact_up decides them. num is exact in float32 where
     num - a == b and num - b == a for num = a + b (with |a| >= |b|, num - a is exact: Fast2Sum),
     den = hi - lo is then a power of two 2**k, exact in float32 as in float64, and
     q = num * 2**(B - k) is exact: the reference's float64 p times 2**B.
   - SR with r <= 30 random bits (M_SRT) takes floor(p * 2**r) the same way, and SR uniform
     (M_SRU) only the draw.
   Lanes that need more keep x in y, flagged in fl (a mask of 16 lanes per 16 elements) for the
   per-element choice: dh == floor(q) (one draw in 2**21), num inexact, and the searched inputs
   (lo NaN). Lanes with x on the table or lo == hi (the result does not depend on the draw) and
   NaN results are decided here. Which tables and modes qualify (spacings 2**k from 2**(B - 127)
   to 2**127, where 2**(B - k) is normal) is tablelut.TableLut.float_lanes' call. draws:
   counter_draws' bits for the m elements. */
typedef struct {
    table_keyv kv;
    __m512i abs_mask, one, even, odd, draw_word, scale_top, two_b, inf_key, sz_sign;
    __m512 neg_below;
} table_srv;

ANY_INLINE __mmask16 table_sr_fast16(const table_srv *c, const uint32_t *x, uint32_t *y, const uint64_t *lut,
                                     const uint64_t *draws, __mmask16 live, const int M) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512 fzero = _mm512_setzero_ps();
    const __mmask8 live0 = (__mmask8)live, live1 = (__mmask8)(live >> 8);
    __m512i u = _mm512_maskz_loadu_epi32(live, x);
    __m512i ent[2];
    __mmask16 nan;
    table_sr_entries16(u, live, &c->kv, lut, ent, &nan);
    __m512i a = _mm512_and_si512(u, c->abs_mask); /* NaN lanes never match inf_key */
    __m512i xs = _mm512_mask_mov_epi32(u, nan, zero);
    __m512i lo = _mm512_permutex2var_epi32(ent[0], c->even, ent[1]);
    __m512i hi = _mm512_permutex2var_epi32(ent[0], c->odd, ent[1]);
    __m512i dw = _mm512_permutex2var_epi32(_mm512_maskz_loadu_epi64(live0, draws), c->draw_word,
                                           _mm512_maskz_loadu_epi64(live1, draws + 8));
    __m512 xf = _mm512_castsi512_ps(xs), lof = _mm512_castsi512_ps(lo), hif = _mm512_castsi512_ps(hi);
    /* table_nan: NaN x, +-inf under infinity="nan" (inf_key; else all ones, never), x < 0 under
       negative="nan" (neg_below 0; else -inf, never) */
    __mmask16 nan_out = _kor_mask16(_kor_mask16(nan, _mm512_cmpeq_epi32_mask(a, c->inf_key)),
                                    _mm512_cmp_ps_mask(xf, c->neg_below, _CMP_LT_OQ));
    __mmask16 negative = _mm512_cmp_ps_mask(hif, fzero, _CMP_LE_OQ);
    __mmask16 slow = _mm512_cmp_ps_mask(lof, lof, _CMP_UNORD_Q); /* searched */
    __mmask16 sel; /* hi, not lo */
    if (M == M_SRU) { /* x on the table: lo */
        __mmask16 on_lo = _mm512_cmp_ps_mask(xf, lof, _CMP_EQ_OQ);
        sel = _kandn_mask16(on_lo, _kxor_mask16(_mm512_test_epi32_mask(dw, c->one), negative));
        slow = _kandn_mask16(nan_out, slow);
    } else {
        /* num = negative ? hi - xs : xs - lo, as pa + pb. x == lo takes lo without a case of its
           own: p = 0 (never away), or on a negative interval p = 1 exactly (always away). */
        __m512 pa = _mm512_mask_mov_ps(xf, negative, hif);
        __m512 pb = _mm512_sub_ps(fzero, _mm512_mask_mov_ps(lof, negative, xf));
        __m512 num = _mm512_add_ps(pa, pb);
        __mmask16 inexact = _kor_mask16(_mm512_cmp_ps_mask(_mm512_sub_ps(num, pa), pb, _CMP_NEQ_UQ),
                                        _mm512_cmp_ps_mask(_mm512_sub_ps(num, pb), pa, _CMP_NEQ_UQ));
        __m512i e = _mm512_srli_epi32(_mm512_castps_si512(_mm512_sub_ps(hif, lof)), 23);
        /* 2**(B - k) for den = 2**k: exponent field 127 + B - (e - 127) */
        __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(c->scale_top, e), 23));
        __m512i qi = _mm512_cvttps_epu32(_mm512_mul_ps(num, scale)); /* floor(q): q >= 0 */
        __mmask16 away;
        if (M == M_SR) {
            away = _mm512_cmplt_epu32_mask(dw, qi);
            slow = _kor_mask16(slow, _mm512_cmpeq_epi32_mask(dw, qi));
        } else { /* floor(p * 2**r) + draw >= 2**r */
            away = _mm512_cmpge_epu32_mask(_mm512_add_epi32(qi, dw), c->two_b);
        }
        /* lo == hi: the result does not depend on the draw (nor on the garbage of den = 0) */
        __mmask16 same = _mm512_cmp_ps_mask(lof, hif, _CMP_EQ_OQ);
        slow = _kandn_mask16(_kor_mask16(same, nan_out), _kor_mask16(slow, inexact));
        sel = _kxor_mask16(away, negative);
    }
    __m512i r = _mm512_mask_mov_epi32(lo, sel, hi);
    /* a zero result's sign: xs's under signed_zero (sz_sign the sign bit), else its own */
    r = _mm512_mask_ternarylogic_epi32(r, _mm512_testn_epi32_mask(r, c->abs_mask), xs, c->sz_sign, 0xD8);
    r = _mm512_mask_mov_epi32(r, nan_out, _mm512_set1_epi32(0x7FC00000));
    r = _mm512_mask_mov_epi32(r, slow, u);
    _mm512_mask_storeu_epi32(y, live, r);
    return slow & live;
}

ANY_INLINE int table_sr_fast_f32(const uint32_t *x, uint32_t *y, int64_t m, const uint64_t *lut,
                                 const uint32_t km[6], const uint64_t *draws, const int M, int rbits,
                                 const table_srk *k, uint16_t *fl) {
    table_srv c;
    const int B = M == M_SR ? 21 : rbits; /* the draw bits p is compared with */
    c.abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    c.one = _mm512_set1_epi32(1);
    c.kv = table_keyv_of(km);
    c.even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    c.odd = _mm512_add_epi32(c.even, c.one);
    c.draw_word = M == M_SR ? c.odd : c.even;
    c.scale_top = _mm512_set1_epi32(254 + B);
    c.two_b = _mm512_set1_epi32((int)(1u << B));
    c.inf_key = _mm512_set1_epi32(k->inf_is_nan == INFINITY ? 0x7F800000 : -1);
    c.sz_sign = _mm512_set1_epi32(k->signed_zero != 0.0 ? (int)0x80000000u : 0);
    c.neg_below = _mm512_set1_ps(k->neg_nan == 0.0 ? 0.0f : -INFINITY);
    int any = 0;
    int64_t i = 0;
    for (; i + 16 <= m; i += 16) {
        __mmask16 f = table_sr_fast16(&c, x + i, y + i, lut, draws + i, (__mmask16)0xFFFF, M);
        fl[i / 16] = (uint16_t)f;
        any |= f;
    }
    if (i < m) {
        __mmask16 f = table_sr_fast16(&c, x + i, y + i, lut, draws + i, (__mmask16)((1u << (m - i)) - 1), M);
        fl[i / 16] = (uint16_t)f;
        any |= f;
    }
    return any != 0;
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

