/* The threshold path of block formats (block.c's chunks): float32 in and out, an element with at
 * most 8 magnitudes, a mode whose rounding of |q| is the same for both signs (cparams._thresholds).
 *
 * For a block of scale S the element index of |x| / S is the number of decision points t_i with |x|
 * beyond t_i * S (at or beyond where ties go up), compared exactly: t_i * S is exact in float64
 * (Block's width rule), and for float32 |x| and a real T, |x| >= T iff |x| >= RU32(T), |x| > T iff
 * |x| >= the next float32 above T. The value is the float32 rounding of grid[index] * S (as the
 * reference's float64 product converts to float32), with x's sign (plus 0 or -0, as the element
 * keeps -0 or not); blocks holding NaN/inf get NaN. The reference rounds fl(x / S), which its
 * exactness argument (kernels.block) puts on the same side of every t_i as the exact quotient: the
 * same element, so the same bits.
 *
 * A block's seven thresholds and eight values depend on S alone. Where S = s * tscale with s from a
 * scale format of few values (NVFP4: UE4M3, 143 keys; MXFP4: E8M0, 255) and the call has many more
 * blocks than that, they are made once per call for every s (thr_table) and each block only looks
 * up its row: that work was a third of NVFP4's cost per element. Otherwise each chunk makes them
 * for its own blocks (thr_rows). */

#define THR_MAX 7
#define THR_KEYS 256 /* the most rows of a call's table (scale values), plus one for NaN blocks */

/* The thresholds (rows[i * st + b], i < THR_MAX) and values (rows[(8 + i) * st + b], i <= THR_MAX)
   of blocks b < nb of scale S[b] (bad[b]: NaN or inf in the block, every value NaN), in loops over
   the blocks that vectorise. Missing thresholds are +inf. */
static void thr_rows(const any_block *B, const double *S, const int *bad, int64_t nb, float *rows, int64_t st) {
    const int K = B->nthr;
    for (int i = 0; i <= THR_MAX; i++) {
        const double g = B->grid[i <= K ? i : K];
        float *v = rows + (8 + i) * st;
        for (int64_t b = 0; b < nb; b++) v[b] = bad[b] ? NAN : (float)(g * S[b]);
    }
    for (int i = 0; i < THR_MAX; i++) {
        const double t = i < K ? B->thr[i] : INFINITY;
        const uint32_t strict = !((B->thr_incl >> i) & 1);
        float *e = rows + i * st;
        for (int64_t b = 0; b < nb; b++) {
            const double T = t * S[b];
            const float f = (float)T; /* T > 0: f is 0, positive, or inf */
            const double fd = (double)f;
            /* RU32(T) (ties up), or the next float32 above T: one up from f where f falls short */
            const uint32_t up = (uint32_t)(fd < T) | (strict & (uint32_t)(fd == T));
            e[b] = f32_from(f32_bits(f) + up);
        }
    }
}

/* the key of scale-format values (as float64 bits): the value's exponent and top `mb` fraction bits,
   less those of the smallest value; keys [0, n) cover the format's positive values, n <= THR_KEYS */
typedef struct {
    int shift;
    uint64_t key0;
    int64_t n;
} thr_keys;

static int thr_key_map(const any_block *B, thr_keys *m) {
    const int mb = 1023 - (int)((f64_bits(B->scale_fmt.step_scale) >> 52) & 0x7FF); /* step_scale = 2**-mb */
    if (mb < 0 || mb > 8 || !(B->scale_min > 0.0) || !(B->scale_fmt.limit >= B->scale_min)) return 0;
    m->shift = 52 - mb;
    m->key0 = f64_bits(B->scale_min) >> m->shift;
    m->n = (int64_t)((f64_bits(B->scale_fmt.limit) >> m->shift) - m->key0) + 1;
    if (m->n > THR_KEYS) return 0;
    if (!B->pow2) return 1; /* scales are values of the scale format: keys in [0, n) */
    /* power-of-two scales 2**k, k in [kmin, kmax] (the rule's clamp): keys in [0, n) too? */
    if (B->kmin < -1022 || B->kmax > 1023 || B->kmin > B->kmax) return 0;
    const uint64_t lo = ((uint64_t)(B->kmin + 1023) << 52) >> m->shift;
    const uint64_t hi = ((uint64_t)(B->kmax + 1023) << 52) >> m->shift;
    return lo >= m->key0 && hi - m->key0 < (uint64_t)m->n;
}

/* rows for every key (scale value (key0 + key) << shift, times tscale; keys between the format's
   values make rows never looked up), and row n for NaN blocks; st = THR_KEYS + 1 */
static void thr_table(const any_block *B, const thr_keys *m, double tscale, float *tab) {
    double S[THR_KEYS + 1];
    int bad[THR_KEYS + 1];
    for (int64_t k = 0; k <= m->n; k++) {
        S[k] = f64_from((m->key0 + (uint64_t)k) << m->shift) * tscale;
        bad[k] = k == m->n;
    }
    thr_rows(B, S, bad, m->n + 1, tab, THR_KEYS + 1);
}

/* n elements in blocks of bs (whole groups of BLOCK_G, or the chunk is one block; a short last group
   is padded): block b's thresholds and values at rows + off[b] with stride st. The seven comparisons
   are written out: a loop over them around the lane loop makes GCC unroll the lanes into scalar
   code. Full groups store straight to y: the lanes read x first, and x may be y only in place.
   st is one of the two strides rows come in (thr_elements): a constant here, so the fifteen loads
   of a group take fixed offsets from one address. */
ANY_INLINE void thr_elements_st(const any_block *B, const float *x, float *y, int64_t n, int64_t bs,
                                const float *rows, const int64_t *off, const int64_t st) {
    enum { NB = BLOCK_CHUNK / BLOCK_G };
    const float zadd = B->ef.negative_zero ? -0.0f : 0.0f;
    const int64_t gpb = n <= bs ? NB + 1 : bs / BLOCK_G;
    for (int64_t i = 0, b = 0, left = gpb; i < n; i += BLOCK_G) {
        const int64_t m = n - i < BLOCK_G ? n - i : BLOCK_G;
        float xv[BLOCK_G], yv[BLOCK_G];
        if (m == BLOCK_G) memcpy(xv, x + i, sizeof xv);
        else for (int j = 0; j < BLOCK_G; j++) xv[j] = j < m ? x[i + j] : 0.0f;
        const float *p = rows + off[b];
        const float e0 = p[0], e1 = p[st], e2 = p[2 * st], e3 = p[3 * st], e4 = p[4 * st],
                    e5 = p[5 * st], e6 = p[6 * st];
        const float v0 = p[8 * st], v1 = p[9 * st], v2 = p[10 * st], v3 = p[11 * st],
                    v4 = p[12 * st], v5 = p[13 * st], v6 = p[14 * st], v7 = p[15 * st];
        for (int j = 0; j < BLOCK_G; j++) { /* the thresholds rise: the last one passed wins */
            const float a = fabsf(xv[j]);
            float v = a >= e0 ? v1 : v0;
            v = a >= e1 ? v2 : v;
            v = a >= e2 ? v3 : v;
            v = a >= e3 ? v4 : v;
            v = a >= e4 ? v5 : v;
            v = a >= e5 ? v6 : v;
            v = a >= e6 ? v7 : v;
            yv[j] = copysignf(v, xv[j]) + zadd;
        }
        if (m == BLOCK_G) memcpy(y + i, yv, sizeof yv);
        else for (int j = 0; j < m; j++) y[i + j] = yv[j];
        if (--left == 0) {
            b++;
            left = gpb;
        }
    }
}

enum { CHUNK_BLOCKS = BLOCK_CHUNK / BLOCK_G };

/* thr_elements_st for rows of the call's table (stride THR_KEYS + 1) or of the chunk's own
   (CHUNK_BLOCKS) */
static void thr_elements(const any_block *B, const float *x, float *y, int64_t n, int64_t bs,
                         const float *rows, const int64_t *off, int64_t st) {
    if (st == THR_KEYS + 1) thr_elements_st(B, x, y, n, bs, rows, off, THR_KEYS + 1);
    else thr_elements_st(B, x, y, n, bs, rows, off, CHUNK_BLOCKS);
}

/* The rows a chunk of nb blocks reads: block b's row key[b] of the call's table tab, or (tab NULL)
   rows made here into `rows` from the blocks' scales sc[b] and bad[b]. Sets off[b] and *st. */
static const float *chunk_rows(const any_block *B, int64_t nb, const double *sc, const int *bad,
                               const float *tab, const int32_t *key, float *rows, int64_t *off, int64_t *st) {
    if (tab) {
        for (int64_t b = 0; b < nb; b++) off[b] = key[b];
        *st = THR_KEYS + 1;
        return tab;
    }
    thr_rows(B, sc, bad, nb, rows, CHUNK_BLOCKS);
    for (int64_t b = 0; b < nb; b++) off[b] = b;
    *st = CHUNK_BLOCKS;
    return rows;
}

/* A chunk on the threshold path: block b's scale sc[b] and bad[b]; key[b] its row of the call's
   table tab (NULL: the chunk makes its own rows). */
static void thresh_chunk(const any_call *c, const float *x, float *y, int64_t n, int64_t bs, const double *sc,
                         const int *bad, const float *tab, const int32_t *key) {
    int64_t off[CHUNK_BLOCKS], st;
    float rows[16 * CHUNK_BLOCKS];
    const float *r = chunk_rows(&c->b, (n + bs - 1) / bs, sc, bad, tab, key, rows, off, &st);
    thr_elements(&c->b, x, y, n, bs, r, off, st);
}

/* The threshold path's directed and stochastic modes (up, down, sr with and without rand_bits,
 * sr_uniform) for non-power-of-two scales (NVFP4; cparams sets thr_lo), where the reference rounds
 * q = fl(x / S) in float64. The thresholds are the element's grid points g_1..g_7 (toward zero's):
 * |x| >= g * S iff |q| >= g (kernels.block's exactness argument), so they give, in float32 lanes,
 * the grid neighbours lo <= |q| < hi (hi = lo = max past it: the reference saturates there whichever
 * way it rounds). Only the fraction f = (|q| - lo) / (hi - lo) is formed in float64, from q of
 * rcp_div: the reference's step is hi - lo, a power of two, so f is exact and equals the reference's
 * |q| / step - floor(|q| / step). The mode then picks lo or hi on f (and x's sign, and the random
 * bits), and the value is fl32(+-(lo or hi) * S) as in thr_elements. */
#define THRQ_GROUPS(AWAY)                                                                            \
    for (int64_t i = 0, b = 0, left = gpb; i < n; i += BLOCK_G) {                                    \
        const int64_t m = n - i < BLOCK_G ? n - i : BLOCK_G;                                         \
        float xv[BLOCK_G], yv[BLOCK_G];                                                              \
        if (m == BLOCK_G) memcpy(xv, x + i, sizeof xv);                                              \
        else for (int j = 0; j < BLOCK_G; j++) xv[j] = j < m ? x[i + j] : 0.0f;                      \
        const float *p = rows + off[b];                                                              \
        const float e0 = p[0], e1 = p[st], e2 = p[2 * st], e3 = p[3 * st], e4 = p[4 * st],          \
                    e5 = p[5 * st], e6 = p[6 * st];                                                  \
        const double S = sc[b], I = iv[b], Sm = bad[b] ? (double)NAN : sc[b];                       \
        for (int j = 0; j < BLOCK_G; j++) {                                                          \
            const float xf = xv[j], a = fabsf(xf);                                                   \
            float lo = a >= e0 ? g1 : g0, hi = a >= e0 ? g2 : g1;                                    \
            lo = a >= e1 ? g2 : lo;                                                                  \
            hi = a >= e1 ? g3 : hi;                                                                  \
            lo = a >= e2 ? g3 : lo;                                                                  \
            hi = a >= e2 ? g4 : hi;                                                                  \
            lo = a >= e3 ? g4 : lo;                                                                  \
            hi = a >= e3 ? g5 : hi;                                                                  \
            lo = a >= e4 ? g5 : lo;                                                                  \
            hi = a >= e4 ? g6 : hi;                                                                  \
            lo = a >= e5 ? g6 : lo;                                                                  \
            hi = a >= e5 ? g7 : hi;                                                                  \
            lo = a >= e6 ? g7 : lo;                                                                  \
            hi = a >= e6 ? g7 : hi;                                                                  \
            /* 1 / (hi - lo) from the bits of the power of two (2**127 where hi = lo: f is then 0 or \
               huge, and either choice is lo) */                                                     \
            const float inv = f32_from(0x7F000000u - f32_bits(hi - lo));                             \
            const double q = rcp_div_f64((double)xf, S, I);                                          \
            const double f = (fabs(q) - (double)lo) * (double)inv;                                   \
            (void)f;                                                                                 \
            int u = 0;                                                                               \
            const int away = AWAY;                                                                   \
            const float r = copysignf(away ? hi : lo, xf) + zadd;                                    \
            yv[j] = (float)((double)r * Sm);                                                         \
            cv[j] += u;                                                                              \
        }                                                                                            \
        if (m == BLOCK_G) memcpy(y + i, yv, sizeof yv);                                              \
        else for (int j = 0; j < m; j++) y[i + j] = yv[j];                                           \
        if (--left == 0) {                                                                           \
            b++;                                                                                     \
            left = gpb;                                                                              \
        }                                                                                            \
    }

static void thrq_elements(const any_call *c, const float *x, float *y, int64_t n, int64_t bs, const float *rows,
                          const int64_t *off, int64_t st, const double *sc, const double *iv, const int *bad,
                          uint64_t base, uint64_t idx0, int64_t *und) {
    enum { NB = BLOCK_CHUNK / BLOCK_G };
    const any_block *B = &c->b;
    const float zadd = B->ef.negative_zero ? -0.0f : 0.0f;
    const int64_t gpb = n <= bs ? NB + 1 : bs / BLOCK_G;
    const int K = B->nthr;
    const float g0 = (float)B->grid[0], g1 = (float)B->grid[1 <= K ? 1 : K], g2 = (float)B->grid[2 <= K ? 2 : K],
                g3 = (float)B->grid[3 <= K ? 3 : K], g4 = (float)B->grid[4 <= K ? 4 : K],
                g5 = (float)B->grid[5 <= K ? 5 : K], g6 = (float)B->grid[6 <= K ? 6 : K],
                g7 = (float)B->grid[7 <= K ? 7 : K];
    const int rbits = c->rand_bits;
    const double two_r = c->two_r;
    int64_t cv[BLOCK_G] = {0};
    /* the chunk's bits, drawn first in the stochastic modes (as the element loops draw them) */
    uint64_t draws[BLOCK_CHUNK];
    const int nbits = draw_bits(c->mode, rbits);
    for (int64_t j = 0; c->mode >= M_SR && j < n; j += 256)
        counter_draws(draws + j, base, idx0 + (uint64_t)j, 1, n - j < 256 ? n - j : 256, nbits);
    /* up and down need only whether q is off the grid: |q| > lo iff |x| != lo * S (both exact
       doubles, and x / S off lo by more than half an ulp of lo when they differ), so no quotient */
    if (c->mode == M_RU) THRQ_GROUPS((fabs((double)xf) != (double)lo * S) & (xf > 0.0f))
    else if (c->mode == M_RD) THRQ_GROUPS((fabs((double)xf) != (double)lo * S) & (xf < 0.0f))
    else if (c->mode == M_SR) THRQ_GROUPS(sr_exact_up(f, draws[i + j], &u))
    else if (c->mode == M_SRT) THRQ_GROUPS(sr_trunc_up(f, draws[i + j], two_r))
    else THRQ_GROUPS((f > 0.0) & (int)draws[i + j])
    int64_t count = 0;
    for (int j = 0; j < BLOCK_G; j++) count += cv[j];
    *und += count;
}

/* thresh_chunk for the modes of thrq_elements; iv[b] = fl(1 / sc[b]) */
static void thrq_chunk(const any_call *c, const float *x, float *y, int64_t n, int64_t bs, const double *sc,
                       const double *iv, const int *bad, const float *tab, const int32_t *key, uint64_t base,
                       uint64_t idx0, int64_t *und) {
    int64_t off[CHUNK_BLOCKS], st;
    float rows[16 * CHUNK_BLOCKS];
    const float *r = chunk_rows(&c->b, (n + bs - 1) / bs, sc, bad, tab, key, rows, off, &st);
    thrq_elements(c, x, y, n, bs, r, off, st, sc, iv, bad, base, idx0, und);
}
