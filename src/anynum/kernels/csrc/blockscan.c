/* The block kernels' scans of the data (block.c): the largest magnitude of a range (NVFP4's tensor
 * amax) and of each block of a chunk, as bits, and the count of results that passed the dtype's max.
 */

static const uint64_t any_abs_mask[4] = {0x7FFFu, 0x7FFFu, 0x7FFFFFFFu, 0x7FFFFFFFFFFFFFFFull};
static const uint64_t any_inf_bits[4] = {0x7C00u, 0x7F80u, 0x7F800000u, 0x7FF0000000000000ull};

/* the largest |x| as bits (ordered like the magnitudes; NaN above inf); finite_only: ignore
   inf and NaN (the NVFP4 tensor amax). The exclusion is an arithmetic mask: GCC 12 does not
   vectorise a max reduction fed by a select. */
#define AMAX_LOOP(T, MASK, INF)                                                                      \
    {                                                                                                \
        const T *h = (const T *)x;                                                                   \
        const T lim = finite_only ? (T)(INF) : (T)~(T)0;                                             \
        T m = 0;                                                                                     \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T a = h[i] & (T)(MASK);                                                                  \
            a &= (T)0 - (T)(a < lim);                                                                \
            m = a > m ? a : m;                                                                       \
        }                                                                                            \
        return m;                                                                                    \
    }

static uint64_t amax_bits(const char *x, int tdt, int64_t n, int finite_only) {
    if (tdt == T_F16) AMAX_LOOP(uint16_t, 0x7FFFu, 0x7C00u)
    if (tdt == T_BF16) AMAX_LOOP(uint16_t, 0x7FFFu, 0x7F80u)
    if (tdt == T_F32) AMAX_LOOP(uint32_t, 0x7FFFFFFFu, 0x7F800000u)
    AMAX_LOOP(uint64_t, 0x7FFFFFFFFFFFFFFFull, 0x7FF0000000000000ull)
}

/* amax_bits of each block of bs elements in x[0, n) (the last may be short), one call per chunk,
   and where least is not NULL each block's least nonzero magnitude as bits (0 for a block of
   zeros): the minimum of a - 1, which wraps for a = 0 past every magnitude. Whole blocks first
   with BS a constant where it is one (16, 32): GCC then reduces each block in one vector without
   a remainder test (0.094 against 0.16 ns per element in L1). */
#define BLOCKS_AMAX(T, MASK, BS, LEAST)                                                              \
    {                                                                                                \
        const T *h = (const T *)x;                                                                   \
        const int64_t full = n / (BS);                                                               \
        for (int64_t b = 0; b < full; b++) {                                                         \
            T m = 0, l = (T)~(T)0;                                                                   \
            for (int64_t i = 0; i < (BS); i++) {                                                     \
                T a = h[b * (BS) + i] & (T)(MASK);                                                   \
                m = a > m ? a : m;                                                                   \
                if (LEAST) l = (T)(a - 1) < l ? (T)(a - 1) : l;                                      \
            }                                                                                        \
            out[b] = m;                                                                              \
            if (LEAST) least[b] = (T)(l + 1);                                                        \
        }                                                                                            \
        if (full * (BS) < n) {                                                                       \
            T m = 0, l = (T)~(T)0;                                                                   \
            for (int64_t i = full * (BS); i < n; i++) {                                              \
                T a = h[i] & (T)(MASK);                                                              \
                m = a > m ? a : m;                                                                   \
                if (LEAST) l = (T)(a - 1) < l ? (T)(a - 1) : l;                                      \
            }                                                                                        \
            out[full] = m;                                                                           \
            if (LEAST) least[full] = (T)(l + 1);                                                     \
        }                                                                                            \
    }

ANY_INLINE void blocks_amax_bs(const char *x, int tdt, int64_t n, const int64_t bs, uint64_t *out,
                               uint64_t *least, const int LEAST) {
    if (tdt <= T_BF16) BLOCKS_AMAX(uint16_t, 0x7FFFu, bs, LEAST)
    else if (tdt == T_F32) BLOCKS_AMAX(uint32_t, 0x7FFFFFFFu, bs, LEAST)
    else BLOCKS_AMAX(uint64_t, 0x7FFFFFFFFFFFFFFFull, bs, LEAST)
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define SCAN_OP(MAX, a, b) ((MAX) ? _mm512_max_epu32((a), (b)) : _mm512_min_epu32((a), (b)))
/* the levels of lanes_reduce16: each pair halves, two shuffles and one max (or min) */
#define SCAN_L1(MAX, a, b) SCAN_OP(MAX, _mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xEE))
#define SCAN_L2(MAX, a, b) SCAN_OP(MAX, _mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD))
#define SCAN_L3(MAX, a, b) SCAN_OP(MAX, _mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))

/* A block's vector of largest magnitudes (mx) and of least nonzero ones (ln, as a - 1, wrapping,
   so that zero is past every magnitude), lane by lane: its 16 magnitudes (BS = 16), or the larger
   and the smaller of each pair (BS = 32). Where ln is not stored, the compiler drops it. */
typedef struct {
    __m512i mx, ln;
} scan_lanes;

ANY_INLINE scan_lanes block_lanes(const uint32_t *p, const int BS) {
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), ones = _mm512_set1_epi32(-1);
    scan_lanes r;
    r.mx = _mm512_and_si512(_mm512_loadu_si512(p), absm);
    r.ln = _mm512_add_epi32(r.mx, ones);
    if (BS == 32) {
        const __m512i b = _mm512_and_si512(_mm512_loadu_si512(p + 16), absm);
        r.ln = _mm512_min_epu32(r.ln, _mm512_add_epi32(b, ones));
        r.mx = _mm512_max_epu32(r.mx, b);
    }
    return r;
}

/* one level of lanes_reduce16 on both halves */
#define SCAN_PAIR(LEVEL, a, b) ((scan_lanes){LEVEL(1, (a).mx, (b).mx), LEVEL(0, (a).ln, (b).ln)})

/* Lane j: the largest magnitude of block j (of the 16 at p), and its least nonzero one (0 for a
   block of zeros). The 16 vectors reduce together, halving their count at each level:
   48 operations for each, where one vector at a time takes 8 for each. Written out, so that the
   vectors stay in registers. */
ANY_INLINE scan_lanes lanes_reduce16(const uint32_t *p, const int BS) {
#define V(j) block_lanes(p + (j) * BS, BS)
#define Q(j) SCAN_PAIR(SCAN_L2, SCAN_PAIR(SCAN_L1, V(j), V(j + 1)), SCAN_PAIR(SCAN_L1, V(j + 2), V(j + 3)))
    /* quarter q of u_i: block 4i + q in 4 lanes */
    const scan_lanes u0 = Q(0), u1 = Q(4), u2 = Q(8), u3 = Q(12);
#undef Q
#undef V
    /* quarter q of t_i: block 8i + q in lanes 0-1, block 8i + 4 + q in lanes 2-3 */
    const scan_lanes t0 = SCAN_PAIR(SCAN_L3, u0, u1), t1 = SCAN_PAIR(SCAN_L3, u2, u3);
    /* quarter q: blocks q, 8 + q, 4 + q, 12 + q; then in order */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 13, 9, 5, 1, 14, 10, 6, 2, 12, 8, 4, 0);
    scan_lanes r;
#define LAST(MAX, part)                                                                              \
    _mm512_permutexvar_epi32(                                                                        \
        order, _mm512_mask_blend_epi32((__mmask16)0xAAAA,                                            \
                                       SCAN_OP(MAX, t0.part, _mm512_shuffle_epi32(t0.part, _MM_PERM_CDAB)), \
                                       SCAN_OP(MAX, t1.part, _mm512_shuffle_epi32(t1.part, _MM_PERM_CDAB))))
    r.mx = LAST(1, mx);
    r.ln = _mm512_sub_epi32(LAST(0, ln), _mm512_set1_epi32(-1));
#undef LAST
    return r;
}

ANY_INLINE void store16_u64(uint64_t *out, __m512i r) {
    _mm512_storeu_si512(out, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(r)));
    _mm512_storeu_si512(out + 8, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(r, 1)));
}

/* blocks_amax_bs for float32 blocks of BS = 16 or 32 elements, 16 whole blocks at a time (of the
   nb at h); returns how many blocks it did. */
ANY_INLINE int64_t blocks_amax16_f32(const uint32_t *h, int64_t nb, const int BS, uint64_t *out, uint64_t *least,
                                     const int LEAST) {
    int64_t b0 = 0;
    for (; b0 + 16 <= nb; b0 += 16) {
        const scan_lanes r = lanes_reduce16(h + b0 * BS, BS);
        store16_u64(out + b0, r.mx);
        if (LEAST) store16_u64(least + b0, r.ln);
    }
    return b0;
}
#undef SCAN_PAIR
#undef SCAN_L1
#undef SCAN_L2
#undef SCAN_L3
#undef SCAN_OP
#endif

ANY_INLINE void blocks_amax_of(const char *x, int tdt, int64_t n, int64_t bs, uint64_t *out, uint64_t *least,
                               const int LEAST) {
#if defined(__AVX512F__)
    if (tdt == T_F32 && (bs == 32 || bs == 16)) {
        const int64_t done = bs == 32 ? blocks_amax16_f32((const uint32_t *)x, n / 32, 32, out, least, LEAST)
                                      : blocks_amax16_f32((const uint32_t *)x, n / 16, 16, out, least, LEAST);
        x += done * bs * 4;
        n -= done * bs;
        out += done;
        least = LEAST ? least + done : least;
    }
#endif
    if (bs == 32) blocks_amax_bs(x, tdt, n, 32, out, least, LEAST);
    else if (bs == 16) blocks_amax_bs(x, tdt, n, 16, out, least, LEAST);
    else blocks_amax_bs(x, tdt, n, bs, out, least, LEAST);
}

static void blocks_amax(const char *x, int tdt, int64_t n, int64_t bs, uint64_t *out, uint64_t *least) {
    if (least) blocks_amax_of(x, tdt, n, bs, out, least, 1);
    else blocks_amax_of(x, tdt, n, bs, out, least, 0);
}

/* Results that came out infinite in the dtype from finite inputs (x near the dtype's max, a scale
   rounded up): the reference then saturates within the dtype (kernels.block._saturate_to_dtype),
   which this library leaves to it. Counted on the bits; y may be x (in place), so the caller keeps
   x elsewhere when this can happen. */
static int64_t count_overflow(const char *x, const char *y, int tdt, int64_t n) {
    const uint64_t mask = any_abs_mask[tdt], inf = any_inf_bits[tdt];
    int64_t k = 0;
    if (tdt <= T_BF16) {
        const uint16_t *a = (const uint16_t *)x, *b = (const uint16_t *)y;
        for (int64_t i = 0; i < n; i++) k += ((b[i] & mask) == inf) & ((a[i] & mask) < inf);
    } else if (tdt == T_F32) {
        const uint32_t *a = (const uint32_t *)x, *b = (const uint32_t *)y;
        for (int64_t i = 0; i < n; i++) k += ((b[i] & mask) == inf) & ((a[i] & mask) < inf);
    } else {
        const uint64_t *a = (const uint64_t *)x, *b = (const uint64_t *)y;
        for (int64_t i = 0; i < n; i++) k += ((b[i] & mask) == inf) & ((a[i] & mask) < inf);
    }
    return k;
}

static const double any_dtype_max[4] = {65504.0, 0x1.FEp127, 0x1.FFFFFEp127, 0x1.FFFFFFFFFFFFFp1023};

/* Whether no result of the chunk can pass the dtype's max: every element value (saturated, so at
   most the element's largest magnitude) times its block's scale stays at or below it, exactly in
   float64 (Block's width rule). Blocks holding NaN/inf give NaN, not inf. Then count_overflow
   would find nothing, and the pass over the chunk is skipped. */
static int below_dtype_max(const any_call *c, int64_t n, int64_t bs, const double *sc, const int *bad) {
    const any_block *b = &c->b;
    /* the largest scale of a block without NaN/inf, as bits (positive doubles order like their
       bits): an integer max with an arithmetic mask vectorises, a double max behind a select ran
       as a scalar chain of dependent maxsd (a quarter of NVFP4's block work) */
    uint64_t topb = 0;
    for (int64_t i = 0, nb = (n + bs - 1) / bs; i < nb; i++) {
        uint64_t u = f64_bits(sc[i]) & ((uint64_t)0 - (uint64_t)(bad[i] == 0));
        topb = u > topb ? u : topb;
    }
    const double top = f64_from(topb);
    double emag = b->elem_max;
    if (b->elem_family == F_UNIFORM) {
        double lo = fabs(b->eu.code_min * b->eu.step), hi = fabs(b->eu.code_max * b->eu.step);
        emag = lo > hi ? lo : hi;
    }
    return emag * top <= any_dtype_max[c->tdt];
}
