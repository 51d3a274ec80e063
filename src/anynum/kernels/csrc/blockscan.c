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

/* amax_bits of each block of bs elements in x[0, n) (the last may be short), one call per chunk.
   Whole blocks first with BS a constant where it is one (16, 32): GCC then reduces each block in
   one vector without a remainder test (0.094 against 0.16 ns per element in L1). */
#define BLOCKS_AMAX(T, MASK, BS)                                                                     \
    {                                                                                                \
        const T *h = (const T *)x;                                                                   \
        const int64_t full = n / (BS);                                                               \
        for (int64_t b = 0; b < full; b++) {                                                         \
            T m = 0;                                                                                 \
            for (int64_t i = 0; i < (BS); i++) {                                                     \
                T a = h[b * (BS) + i] & (T)(MASK);                                                   \
                m = a > m ? a : m;                                                                   \
            }                                                                                        \
            out[b] = m;                                                                              \
        }                                                                                            \
        if (full * (BS) < n) {                                                                       \
            T m = 0;                                                                                 \
            for (int64_t i = full * (BS); i < n; i++) {                                              \
                T a = h[i] & (T)(MASK);                                                              \
                m = a > m ? a : m;                                                                   \
            }                                                                                        \
            out[full] = m;                                                                           \
        }                                                                                            \
    }

ANY_INLINE void blocks_amax_bs(const char *x, int tdt, int64_t n, const int64_t bs, uint64_t *out) {
    if (tdt <= T_BF16) BLOCKS_AMAX(uint16_t, 0x7FFFu, bs)
    else if (tdt == T_F32) BLOCKS_AMAX(uint32_t, 0x7FFFFFFFu, bs)
    else BLOCKS_AMAX(uint64_t, 0x7FFFFFFFFFFFFFFFull, bs)
}

static void blocks_amax(const char *x, int tdt, int64_t n, int64_t bs, uint64_t *out) {
    if (bs == 32) blocks_amax_bs(x, tdt, n, 32, out);
    else if (bs == 16) blocks_amax_bs(x, tdt, n, 16, out);
    else blocks_amax_bs(x, tdt, n, bs, out);
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
