/* Template (see scalar.c): the element loops, one per (family, mode, variant), over W arrays.
 *
 * Every loop has the signature of any_loop (drive.c): n elements from xs to ys (which may be the
 * same array), their logical indices at->idx0 + i * at->lstride, and a count of exact-SR
 * elements left undecided, whose input value is stored unchanged for the caller to refine.
 */

#define ELEM_RUN 256 /* elements a run: the stochastic modes draw a run's bits first (counter_draws) */
_Static_assert(ELEM_RUN % 32 == 0, "counter_draws writes whole blocks of 32");
#define ELEM_LOOP(NAME, M, CONSTS, KTYPE, CALL)                                                      \
    static void SFX(NAME)(const void *xv, void *yv, int64_t n, const any_call *c, const any_pos *at, \
                          int64_t *und) {                                                            \
        const W *xs = (const W *)xv;                                                                 \
        W *ys = (W *)yv;                                                                             \
        const KTYPE k = CONSTS;                                                                      \
        const uint64_t base = at->base, step = (uint64_t)at->lstride;                               \
        const int rbits = c->rand_bits;                                                              \
        const double two_r = c->two_r;                                                               \
        int64_t count = 0;                                                                           \
        for (int64_t i0 = 0; i0 < n; i0 += ELEM_RUN) {                                               \
            const int64_t m = n - i0 < ELEM_RUN ? n - i0 : ELEM_RUN;                                 \
            uint64_t draws[ELEM_RUN]; /* read by the stochastic modes alone */                      \
            if (M >= M_SR)                                                                           \
                counter_draws(draws, base, at->idx0 + (uint64_t)i0 * step, step, m, draw_bits(M, rbits)); \
            for (int64_t i = 0; i < m; i++) {                                                        \
                int u = 0;                                                                           \
                W x = xs[i0 + i];                                                                    \
                uint64_t draw = M >= M_SR ? draws[i] : 0;                                            \
                W y = CALL;                                                                          \
                ys[i0 + i] = u ? x : y;                                                              \
                count += u;                                                                          \
            }                                                                                        \
        }                                                                                            \
        *und += count;                                                                               \
    }

#define FLOAT_LOOPS(M)                                                                               \
    ELEM_LOOP(float_##M##_any, M, SFX(float_consts)(&c->f), SFX(float_k),                           \
              SFX(float_round)(x, &k, M, 0, 0, draw, two_r, &u))                                     \
    ELEM_LOOP(float_##M##_common, M, SFX(float_consts)(&c->f), SFX(float_k),                        \
              SFX(float_round)(x, &k, M, 1, 0, draw, two_r, &u))                                     \
    ELEM_LOOP(float_##M##_recip, M, SFX(float_consts)(&c->f), SFX(float_k),                         \
              SFX(float_round)(x, &k, M, 1, 1, draw, two_r, &u))                                     \
    ELEM_LOOP(uniform_##M##_clamp, M, SFX(uniform_consts)(&c->u), SFX(uniform_k),                   \
              SFX(uniform_round)(x, &k, M, 0, draw, two_r, &u))                                      \
    ELEM_LOOP(uniform_##M##_wrap, M, SFX(uniform_consts)(&c->u), SFX(uniform_k),                    \
              SFX(uniform_round)(x, &k, M, 1, draw, two_r, &u))                                      \
    ELEM_LOOP(posit_##M, M, SFX(posit_consts)(&c->p), SFX(posit_k),                                 \
              SFX(posit_round)(x, &k, M, draw, rbits, two_r, &u))                                    \
    ELEM_LOOP(positfast_##M, M, SFX(positfast_consts)(&c->p), SFX(positfast_k),                     \
              SFX(positfast_round)(x, &k, M, 1, draw, rbits, two_r, &u, 0))

/* tiny16_f32 / tiny16_f64 (common.c) in the working type; only called where ANY_GROUP_TINY */
ANY_INLINE int SFX(group_tiny)(const W *x, W sn) {
#if ANY_GROUP_TINY
    if (sizeof(W) == 4) return tiny16_f32((const float *)x, (float)sn);
    return tiny16_f64((const double *)x, (double)sn);
#else
    (void)x, (void)sn;
    return 1;
#endif
}

/* float_bits by runs: a run with no nonzero input below the format's smallest normal (the common
   case) skips the subnormal branch; others take both branches and hand back undecided elements.
   A zero keeps its run on the normal branch, which rounds it to itself in every mode: zeros are
   common (ReLU outputs, the gradients of dead units), and counting them as tiny sent a third of a
   gradient's runs down the slow branch (bf16 rounding of 4k elements with a third zeros took
   1.9x as long as of 4k without). The SR modes draw a run's bits first (counter_draws). */
#define BITS_RUN 256
_Static_assert(BITS_RUN % 32 == 0, "counter_draws writes whole blocks of 32");
#define BITS_LOOP(M)                                                                                 \
    static void SFX(float_bits_##M)(const void *xv, void *yv, int64_t n, const any_call *c,          \
                                    const any_pos *at, int64_t *und) {                               \
        const W *xs = (const W *)xv;                                                                 \
        W *ys = (W *)yv;                                                                             \
        const SFX(bits_k) k = SFX(bits_consts)(&c->f);                                               \
        const uint64_t base = at->base, step = (uint64_t)at->lstride;                               \
        const int rbits = c->rand_bits;                                                              \
        const double two_r = c->two_r;                                                               \
        int64_t count = 0;                                                                           \
        for (int64_t i0 = 0; i0 < n; i0 += BITS_RUN) {                                               \
            const int64_t m = n - i0 < BITS_RUN ? n - i0 : BITS_RUN;                                 \
            const W *xr = xs + i0;                                                                   \
            W *yr = ys + i0;                                                                         \
            int tiny = 0; /* how many: the groups below pay where few groups hold one */             \
            for (int64_t i = 0; i < m; i++) tiny += (FABSW(xr[i]) < k.smallest_normal) & (xr[i] != 0); \
            const int sr = M >= M_SR; /* the modes that draw */                                     \
            uint64_t draw[BITS_RUN]; /* read by the SR modes alone */                                \
            /* a run of normal inputs decides exact SR on the draw's top k.drop bits (float_bits) */ \
            const int nbits = M == M_SR && !tiny ? (k.drop > 0 ? k.drop : 1) : draw_bits(M, rbits);   \
            if (sr) counter_draws(draw, base, at->idx0 + (uint64_t)i0 * step, step, m, nbits);     \
            if (!tiny) {                                                                             \
                for (int64_t i = 0; i < m; i++) {                                                    \
                    int u = 0;                                                                       \
                    yr[i] = SFX(float_bits)(xr[i], &k, M, 1, sr ? draw[i] : 0, rbits, two_r, &u);   \
                }                                                                                    \
            } else {                                                                                 \
                /* SR, in runs with few tiny inputs, by groups of 16 where a group's test is one     \
                   vector compare (ANY_GROUP_TINY): a group without a tiny input takes the normal    \
                   branch, exact SR on the top k.drop bits of its 53; the others, and the run's      \
                   last part, take both. The deterministic modes, and runs where most groups         \
                   hold a tiny input (E2M1 below 1), ran slower by groups. */                        \
                const int64_t mg = ANY_GROUP_TINY && M >= M_SR && tiny <= 4 ? m / 16 * 16 : 0;       \
                const int shift = M == M_SR ? 53 - k.drop : 0;                                       \
                for (int64_t g = 0; g < mg; g += 16) {                                               \
                    W xg[16], yg[16];                                                                \
                    memcpy(xg, xr + g, sizeof xg);                                                   \
                    if (!SFX(group_tiny)(xg, k.smallest_normal)) {                                   \
                        for (int j = 0; j < 16; j++) {                                               \
                            int u = 0;                                                               \
                            const uint64_t d = sr ? draw[g + j] >> shift : 0;                        \
                            yg[j] = SFX(float_bits)(xg[j], &k, M, 1, d, rbits, two_r, &u);           \
                        }                                                                            \
                    } else {                                                                         \
                        for (int j = 0; j < 16; j++) {                                               \
                            int u = 0;                                                               \
                            W y = SFX(float_bits)(xg[j], &k, M, 0, sr ? draw[g + j] : 0, rbits, two_r, &u); \
                            yg[j] = u ? xg[j] : y;                                                   \
                            count += u;                                                              \
                        }                                                                            \
                    }                                                                                \
                    memcpy(yr + g, yg, sizeof yg);                                                   \
                }                                                                                    \
                for (int64_t i = mg; i < m; i++) {                                                   \
                    int u = 0;                                                                       \
                    W x = xr[i];                                                                     \
                    W y = SFX(float_bits)(x, &k, M, 0, sr ? draw[i] : 0, rbits, two_r, &u);          \
                    yr[i] = u ? x : y;                                                               \
                    count += u;                                                                      \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        *und += count;                                                                               \
    }
BITS_LOOP(0)
BITS_LOOP(1)
BITS_LOOP(2)
BITS_LOOP(3)
BITS_LOOP(4)
BITS_LOOP(5)
BITS_LOOP(6)
BITS_LOOP(7)
BITS_LOOP(8)
BITS_LOOP(9)
/* [mode]: every mode on bits (float_on_bits) */
static const any_loop SFX(bits_loops)[M_COUNT] = {
    SFX(float_bits_0), SFX(float_bits_1), SFX(float_bits_2), SFX(float_bits_3), SFX(float_bits_4),
    SFX(float_bits_5), SFX(float_bits_6), SFX(float_bits_7), SFX(float_bits_8), SFX(float_bits_9)};

FLOAT_LOOPS(0)
FLOAT_LOOPS(1)
FLOAT_LOOPS(2)
FLOAT_LOOPS(3)
FLOAT_LOOPS(4)
FLOAT_LOOPS(5)
FLOAT_LOOPS(6)
FLOAT_LOOPS(7)
FLOAT_LOOPS(8)
FLOAT_LOOPS(9)

#define LOOP_ROW(NAME)                                                                               \
    {SFX(NAME##_0), SFX(NAME##_1), SFX(NAME##_2), SFX(NAME##_3), SFX(NAME##_4),                      \
     SFX(NAME##_5), SFX(NAME##_6), SFX(NAME##_7), SFX(NAME##_8), SFX(NAME##_9)}

#define MODE_ROW(PRE, POST)                                                                          \
    {SFX(PRE##0##POST), SFX(PRE##1##POST), SFX(PRE##2##POST), SFX(PRE##3##POST), SFX(PRE##4##POST),  \
     SFX(PRE##5##POST), SFX(PRE##6##POST), SFX(PRE##7##POST), SFX(PRE##8##POST), SFX(PRE##9##POST)}

/* Exact SR onto fixed point and integers (clamped), by runs: where every nonzero input of a run
   scales to at least 2**-8 steps, each fraction f (a multiple of ulp(|s|): at least 2**-23 from
   one step up, 2**-31 below it) is a multiple of 2**-31 for float arrays, so the run draws 31 bits
   and decides on integers (M_SR31: never undecided); other runs, and float64 arrays (fractions
   down to 2**-52), take uniform_7_clamp. */
_Static_assert(M_SR == 7, "uniform_7_clamp is the exact SR loop");
static void SFX(uniform_sr_clamp)(const void *xv, void *yv, int64_t n, const any_call *c, const any_pos *at,
                                  int64_t *und) {
    const W *xs = (const W *)xv;
    W *ys = (W *)yv;
    const SFX(uniform_k) k = SFX(uniform_consts)(&c->u);
    const double t8 = c->u.step * 0x1p-8; /* a power of two: exact as a float where normal */
    if (sizeof(W) == 8 || t8 < 0x1p-126) { /* no run could draw 31 bits: no scan */
        SFX(uniform_7_clamp)(xv, yv, n, c, at, und);
        return;
    }
    const W thr = (W)t8;
    for (int64_t i0 = 0; i0 < n; i0 += ELEM_RUN) {
        const int64_t m = n - i0 < ELEM_RUN ? n - i0 : ELEM_RUN;
        const W *xr = xs + i0;
        W *yr = ys + i0;
        const any_pos run = {at->base, at->idx0 + (uint64_t)i0 * (uint64_t)at->lstride, at->lstride};
        int wide = 0;
        for (int64_t i = 0; i < m; i++) wide |= (FABSW(xr[i]) < thr) & (xr[i] != 0);
        if (wide) {
            SFX(uniform_7_clamp)(xr, yr, m, c, &run, und);
            continue;
        }
        uint64_t draws[ELEM_RUN];
        counter_draws(draws, run.base, run.idx0, (uint64_t)run.lstride, m, 31);
        for (int64_t i = 0; i < m; i++) {
            int u = 0;
            yr[i] = SFX(uniform_round)(xr[i], &k, M_SR31, 0, draws[i], 0.0, &u);
        }
    }
}

/* [variant][mode]: float any / common / recip, uniform clamp / wrap, posit, posit fast path */
static const any_loop SFX(elem_loops)[7][M_COUNT] = {
    MODE_ROW(float_, _any),      MODE_ROW(float_, _common), MODE_ROW(float_, _recip),
    {SFX(uniform_0_clamp), SFX(uniform_1_clamp), SFX(uniform_2_clamp), SFX(uniform_3_clamp),
     SFX(uniform_4_clamp), SFX(uniform_5_clamp), SFX(uniform_6_clamp), SFX(uniform_sr_clamp),
     SFX(uniform_8_clamp), SFX(uniform_9_clamp)},
    MODE_ROW(uniform_, _wrap), MODE_ROW(posit_, ), MODE_ROW(positfast_, ),
};

/* Exact SR on the posit fast path, by runs of PSR_RUN elements: the position as the exact dyadic
   dropped / 2**pc, decided on the draw's first W_MAN bits (positfast_round), and the reference's
   ratio (a divide per element) on all 53 only for the runs holding an input that needs it (a
   binade where exponent bits are dropped, or below minpos with underflow="zero"), drawn again and
   redone whole; results go through a local array, as y may be x. */
#define PSR_RUN 256
_Static_assert(PSR_RUN % 32 == 0, "counter_draws writes whole blocks of 32");
static void SFX(positfast_sr)(const void *xv, void *yv, int64_t n, const any_call *c, const any_pos *at,
                              int64_t *und) {
    const W *xs = (const W *)xv;
    W *ys = (W *)yv;
    const SFX(positfast_k) k = SFX(positfast_consts)(&c->p);
    const uint64_t base = at->base, step = (uint64_t)at->lstride;
    int64_t count = 0;
    for (int64_t i0 = 0; i0 < n; i0 += PSR_RUN) {
        const int64_t m = n - i0 < PSR_RUN ? n - i0 : PSR_RUN;
        W yb[PSR_RUN];
        uint64_t draws[PSR_RUN];
        const uint64_t idx = at->idx0 + (uint64_t)i0 * step;
        counter_draws(draws, base, idx, step, m, W_MAN);
        int need = 0, cnt = 0;
        for (int64_t j = 0; j < m; j++) {
            int u = 0, nd = 0;
            W x = xs[i0 + j];
            W y = SFX(positfast_round)(x, &k, M_SR, 0, draws[j], 0, 0.0, &u, &nd);
            yb[j] = u ? x : y;
            cnt += u;
            need |= nd;
        }
        if (need) {
            counter_draws(draws, base, idx, step, m, 53);
            cnt = 0;
            for (int64_t j = 0; j < m; j++) {
                int u = 0;
                W x = xs[i0 + j];
                W y = SFX(positfast_round)(x, &k, M_SR, 1, draws[j], 0, 0.0, &u, 0);
                yb[j] = u ? x : y;
                cnt += u;
            }
        }
        if (m == PSR_RUN) /* a constant size: copied with vector moves */
            memcpy(ys + i0, yb, sizeof yb);
        else
            memcpy(ys + i0, yb, (size_t)m * sizeof(W));
        count += cnt;
    }
    *und += count;
}
#undef PSR_RUN

/* --- blocks: a chunk of whole blocks (or of one long block), each with its scale ---------------- */

#define BLOCK_CHUNK 1024 /* elements per chunk: the working-type staging buffer and per-block arrays */
_Static_assert(BLOCK_CHUNK % 256 == 0, "the block loops draw whole runs of 256");
#define BLOCK_G 16       /* elements per group: the unit of the element loop over blocks of 16k elements */

/* How a group forms q = x / s (the driver's choice, block.c's block_kind):
 *   BK_INV     x * 2**-k: exact, so the same bits as the divide (power-of-two scales);
 *   BK_INV_FIX the same, then q underflowing to 0 keeps x's sign and non-zeroness (the reference's
 *              repair, where the element's rounding could tell);
 *   BK_DIV     x / s, with that repair where c->b.fix_tiny says so;
 *   BK_RCP     fl(x / s) from the reciprocal (float64, non-power-of-two scales of at most 48
 *              significant bits): see rcp_div. */

/* fl(x / s) for float64 x, s > 0 of at most 48 significant bits, and iv = fl(1 / s), without a
   divide. q0 = fl(x * iv) is within 2**-51.9 (relative) of x / s, so the remainder x - q0 * s is a
   multiple of the finer of the two operands' quanta and below 2**(bits(s) + 2) of them: the FMA
   computes it exactly. q0 + fl(r * iv) is then within 2**-103 of x / s, while x / s lies at least
   2**-(54 + bits(s)) (relative) from every midpoint between neighbouring doubles (x and m * s, for a
   midpoint m of 54 bits, are multiples of a common quantum) and never on one (x = m * s would give x
   54 significant bits), so the last FMA rounds to fl(x / s). Over- and underflow cannot arise for
   the block scales' ranges (cparams._rcp_ok). The quotient's sign is x's (x = -0 included). */
ANY_INLINE W SFX(rcp_div)(W x, W s, W iv) {
    W q0 = x * iv;
    W r = fma(-q0, s, x);
    return COPYSIGNW(fma(r, iv, q0), x); /* x = -0: r = +0 and the sum +0 */
}

/* one element: q from x (QEXPR), the repair (FIXQ), the element's rounding (on the random bits DRAW
   in the stochastic modes), the symmetric clamp, back to x's scale (times 1, or NaN for blocks holding
   NaN/inf); undecided exact-SR elements are counted in CNT */
#define BLOCK_ELEM(ROUND, QEXPR, FIXQ, XV, YV, DRAW, SW, BW, CNT)                                    \
    {                                                                                                \
        int u = 0;                                                                                   \
        const uint64_t draw = stochastic ? (DRAW) : 0;                                               \
        const W x = XV;                                                                              \
        W q = QEXPR;                                                                                 \
        FIXQ                                                                                         \
        W r = ROUND; /* (0 in the normal-chunk bodies of loops without one: never run) */            \
        (void)q, (void)draw;                                                                         \
        r = r < lo_clip ? lo_clip : r;                                                               \
        r = r > hi_clip ? hi_clip : r;                                                               \
        YV = (r * (SW)) * (BW);                                                                      \
        CNT += u;                                                                                    \
    }

#define BLOCK_FIX q = ((q == (W)0) & (x != (W)0)) ? COPYSIGNW(tiny, x) : q;

/* Whole groups of BLOCK_G elements, ng of them, gpb per block: the block's scale, reciprocal and NaN
   multiplier as scalars, the group through local arrays (no aliasing checks, no epilogue), the
   undecided count per lane (summed once: a sum per group costs a horizontal reduction each). */
#define BLOCK_GROUPS(ROUND, QEXPR, FIXQ)                                                             \
    {                                                                                                \
        int64_t cv[BLOCK_G] = {0};                                                                   \
        for (int64_t g = 0, b = 0, left = gpb; g < ng; g++) {                                        \
            const W sw = scale[b], iw = inv[b], bw = badmul[b];                                      \
            W xv[BLOCK_G], yv[BLOCK_G];                                                              \
            memcpy(xv, xs + g * BLOCK_G, sizeof xv);                                                 \
            for (int j = 0; j < BLOCK_G; j++)                                                        \
                BLOCK_ELEM(ROUND, QEXPR, FIXQ, xv[j], yv[j], draws[g * BLOCK_G + j], sw, bw, cv[j])  \
            memcpy(ys + g * BLOCK_G, yv, sizeof yv);                                                 \
            if (--left == 0) {                                                                       \
                b++;                                                                                 \
                left = gpb;                                                                          \
            }                                                                                        \
        }                                                                                            \
        for (int j = 0; j < BLOCK_G; j++) count += cv[j];                                            \
    }

/* A chunk: blocks of bs elements (the last may be short), block b's values scale[b], inv[b] (exact
   2**-k for BK_INV*, fl(1/s) for BK_RCP) and badmul[b]. Blocks of a multiple of BLOCK_G elements,
   or a chunk of one block, go by groups; the rest (other block sizes, a short last group) element by
   element with per-element copies of the block values (eb, from `first` on), dividing. */
#define BLOCK_LOOP(NAME, M, CONSTS, KTYPE, ROUND, NROUND, SHORT, NORMAL_MIN)                         \
    static void SFX(NAME)(const W *xs, W *ys, int64_t n, int64_t bs, const W *scale, const W *inv,   \
                          const W *badmul, const W *least, int kind, const any_call *c,              \
                          uint64_t base, uint64_t idx0, int64_t *und) {                              \
        const KTYPE k = CONSTS;                                                                      \
        const int rbits = c->rand_bits;                                                              \
        const double two_r = c->two_r;                                                               \
        const W tiny = c->b.fix_tiny ? W_TINY : (W)0;                                                \
        const W hi_clip = c->b.symmetric ? (W)c->b.elem_max : (W)INFINITY; /* symmetric blocks */    \
        const W lo_clip = -hi_clip;                                                                  \
        const int stochastic = M >= M_SR;                                                            \
        int64_t count = 0;                                                                           \
        /* the kinds with a group body; BK_DIV (rare: scales without an exact reciprocal, float64  \
           inputs with non-power-of-two scales) goes element by element */                            \
        const int bodied = (M <= M_RZ && kind == BK_INV) || kind == BK_INV_FIX                      \
                           || (sizeof(W) == 8 && kind == BK_RCP);                                    \
        const int grouped = (bs % BLOCK_G == 0 || n <= bs) && bodied;                                \
        const int64_t gpb = bs / BLOCK_G, ng = grouped ? n / BLOCK_G : 0, first = ng * BLOCK_G;      \
        /* float elements on the bits (SHORT, the bits dropped, nonzero): a chunk of groups whose    \
           quotients are all zero or at least the element's smallest normal rounds them all on       \
           float_bits' normal branch (NROUND), where exact SR decides on the draw's top SHORT bits.  \
           The repair only makes a zero q of a nonzero x nonzero, so a nonzero x with q below the     \
           smallest normal is tiny. Given each block's least nonzero magnitude (least, 0 for none),  \
           its quotient decides for the block (x -> x * 2**-k is monotone in |x|); every block of    \
           the chunk counts, which can only send it to the general branch (the same bits). Else the \
           elements are tested, flags gathered by lane (GCC leaves a short reduction scalar). */     \
        int normal = 0;                                                                              \
        if (SHORT && grouped && (kind == BK_INV || kind == BK_INV_FIX)) {                            \
            const WU sign_bit = (WU)1 << (8 * sizeof(W) - 1);                                        \
            const WU normal_bits = SFX(bits)(NORMAL_MIN);                                            \
            WU any = 0;                                                                              \
            if (least) {                                                                             \
                for (int64_t b = 0, nb = (n + bs - 1) / bs; b < nb; b++) {                           \
                    const WU aq = SFX(bits)(least[b] * inv[b]) & ~sign_bit;                          \
                    any |= (WU)((aq < normal_bits) & (least[b] != 0));                               \
                }                                                                                    \
            } else {                                                                                 \
                WU tf[BLOCK_G] = {0};                                                                \
                for (int64_t g = 0, b = 0, left = gpb; g < ng; g++) {                                \
                    const W iw = inv[b];                                                             \
                    for (int j = 0; j < BLOCK_G; j++) {                                              \
                        const W x = xs[g * BLOCK_G + j], q = x * iw;                                 \
                        const WU aq = SFX(bits)(q) & ~sign_bit, ax = SFX(bits)(x) & ~sign_bit;       \
                        tf[j] |= (WU)((aq < normal_bits) & (ax != 0));                               \
                    }                                                                                \
                    if (--left == 0) {                                                               \
                        b++;                                                                         \
                        left = gpb;                                                                  \
                    }                                                                                \
                }                                                                                    \
                for (int j = 0; j < BLOCK_G; j++) any |= tf[j];                                      \
            }                                                                                        \
            normal = any == 0;                                                                       \
        }                                                                                            \
        /* the chunk's bits, drawn first in the stochastic modes (SHORT of them for NROUND's SR) */  \
        const int short_draws = SHORT && M == M_SR && normal;                                        \
        uint64_t draws[BLOCK_CHUNK];                                                                 \
        for (int64_t j = 0; stochastic && j < n; j += 256)                                           \
            counter_draws(draws + j, base, idx0 + (uint64_t)j, 1, n - j < 256 ? n - j : 256,         \
                          short_draws ? SHORT : draw_bits(M, rbits));                                \
        if (normal && kind == BK_INV) {                                                              \
            BLOCK_GROUPS(NROUND, x * iw, )                                                           \
        } else if (normal) {                                                                         \
            BLOCK_GROUPS(NROUND, x * iw, BLOCK_FIX)                                                  \
        } else if (M <= M_RZ && kind == BK_INV) { /* the repair is off only in modes sending tiny to 0 */ \
            BLOCK_GROUPS(ROUND, x * iw, )                                                            \
        } else if (kind == BK_INV_FIX) {                                                             \
            BLOCK_GROUPS(ROUND, x * iw, BLOCK_FIX)                                                   \
        } else if (sizeof(W) == 8 && kind == BK_RCP) { /* non-power-of-two: no repair */             \
            BLOCK_GROUPS(ROUND, SFX(rcp_div)(x, sw, iw), )                                           \
        }                                                                                            \
        if (first < n) {                                                                             \
            W es[BLOCK_CHUNK], eb[BLOCK_CHUNK];                                                      \
            for (int64_t b = first / bs, s = b * bs; s < n; b++, s += bs) {                          \
                const int64_t e = n - s < bs ? n : s + bs;                                           \
                for (int64_t i = s > first ? s : first; i < e; i++) {                                \
                    es[i] = scale[b];                                                                \
                    eb[i] = badmul[b];                                                               \
                }                                                                                    \
            }                                                                                        \
            for (int64_t i = first; i < n; i++)                                                      \
                BLOCK_ELEM(ROUND, x / es[i], BLOCK_FIX, xs[i], ys[i],                                \
                           short_draws ? counter_bits(base, idx0 + (uint64_t)i, 53) : draws[i],      \
                           es[i], eb[i], count)                                                      \
        }                                                                                            \
        *und += count;                                                                               \
    }

#define BLOCK_LOOPS(M)                                                                               \
    BLOCK_LOOP(bfloat_##M##_any, M, SFX(float_consts)(&c->b.ef), SFX(float_k),                       \
               SFX(float_round)(q, &k, M, 0, 0, draw, two_r, &u), 0, 0, 0)                            \
    BLOCK_LOOP(bfloat_##M##_recip, M, SFX(float_consts)(&c->b.ef), SFX(float_k),                     \
               SFX(float_round)(q, &k, M, 1, 1, draw, two_r, &u), 0, 0, 0)                            \
    BLOCK_LOOP(buniform_##M##_clamp, M, SFX(uniform_consts)(&c->b.eu), SFX(uniform_k),               \
               SFX(uniform_round)(q, &k, M, 0, draw, two_r, &u), 0, 0, 0)                             \
    BLOCK_LOOP(buniform_##M##_wrap, M, SFX(uniform_consts)(&c->b.eu), SFX(uniform_k),                \
               SFX(uniform_round)(q, &k, M, 1, draw, two_r, &u), 0, 0, 0)                             \
    BLOCK_LOOP(bfloat_##M##_bits, M, SFX(bits_consts)(&c->b.ef), SFX(bits_k),                        \
               SFX(float_bits)(q, &k, M, 0, draw, rbits, two_r, &u),                                 \
               SFX(float_bits)(q, &k, M, 1, draw, rbits, two_r, &u), k.drop, k.smallest_normal)

BLOCK_LOOPS(0)
BLOCK_LOOPS(1)
BLOCK_LOOPS(2)
BLOCK_LOOPS(3)
BLOCK_LOOPS(4)
BLOCK_LOOPS(5)
BLOCK_LOOPS(6)
BLOCK_LOOPS(7)
BLOCK_LOOPS(8)
BLOCK_LOOPS(9)

typedef void (*SFX(block_loop))(const W *, W *, int64_t, int64_t, const W *, const W *, const W *, const W *,
                                 int, const any_call *, uint64_t, uint64_t, int64_t *);

/* [variant][mode]: float element any / recip, uniform element clamp / wrap, float element on the bits */
static const SFX(block_loop) SFX(block_loops)[5][M_COUNT] = {
    MODE_ROW(bfloat_, _any), MODE_ROW(bfloat_, _recip),
    MODE_ROW(buniform_, _clamp), MODE_ROW(buniform_, _wrap), MODE_ROW(bfloat_, _bits),
};

/* A chunk of n <= BLOCK_CHUNK elements of dtype c->tdt at x -> y: blocks of bs elements (the last
   may be short), block b's scale sc[b] (a float64 value the working type holds exactly), its
   reciprocal iv[b] (see `kind`), and bad[b] (NaN or inf in the block: every value NaN). Random
   indices idx0 + i. Staged through the working type when the dtypes differ. */
static void SFX(block_chunk)(const any_call *c, const char *x, char *y, int64_t n, int64_t bs,
                             const double *sc, const double *iv, const int *bad, int kind,
                             uint64_t base, uint64_t idx0, const uint64_t *least, int64_t *und) {
    W scale[BLOCK_CHUNK], inv[BLOCK_CHUNK], badmul[BLOCK_CHUNK], buf[BLOCK_CHUNK], lq[BLOCK_CHUNK];
    const int64_t nb = (n + bs - 1) / bs;
    for (int64_t b = 0; b < nb; b++) {
        scale[b] = (W)sc[b];
        inv[b] = (W)iv[b];
        badmul[b] = bad[b] ? (W)NAN : (W)1;
    }
    if (least) /* magnitudes of c->tdt as bits: W holds each exactly */
        for (int64_t b = 0; b < nb; b++) lq[b] = (W)bits_value(least[b], c->tdt);
    const any_block *blk = &c->b;
    int variant = blk->elem_family != F_FLOAT ? 2 + blk->eu.wrap
                  : blk->ef.on_bits          ? 4
                                             : blk->ef.common && blk->ef.recip;
    SFX(block_loop) loop = SFX(block_loops)[variant][c->mode];
    if (c->tdt == (sizeof(W) == 4 ? T_F32 : T_F64)) {
        loop((const W *)x, (W *)y, n, bs, scale, inv, badmul, least ? lq : NULL, kind, c, base, idx0, und);
        return;
    }
    SFX(load)(x, c->tdt, buf, n);
    loop(buf, buf, n, bs, scale, inv, badmul, least ? lq : NULL, kind, c, base, idx0, und);
    SFX(store)(buf, y, c->tdt, n);
}

#undef LOOP_ROW
#undef MODE_ROW
#undef FLOAT_LOOPS
#undef ELEM_LOOP
#undef BLOCK_ELEM
#undef BLOCK_GROUPS
#undef BLOCK_FIX
#undef BLOCK_LOOP
#undef BLOCK_LOOPS
