/* Template (see scalar.c): the element loops, one per (family, mode, variant), over W arrays.
 *
 * Every loop has the signature of any_loop (drive.c): n elements from xs to ys (which may be the
 * same array), their logical indices at->idx0 + i * at->lstride, and a count of exact-SR
 * elements left undecided, whose input value is stored unchanged for the caller to refine.
 */

#define ELEM_LOOP(NAME, CONSTS, KTYPE, CALL)                                                         \
    static void SFX(NAME)(const void *xv, void *yv, int64_t n, const any_call *c, const any_pos *at, \
                          int64_t *und) {                                                            \
        const W *xs = (const W *)xv;                                                                 \
        W *ys = (W *)yv;                                                                             \
        const KTYPE k = CONSTS;                                                                      \
        const uint64_t base = at->base, step = (uint64_t)at->lstride;                               \
        uint64_t index = at->idx0; /* an induction variable: no multiply per element */             \
        const int rbits = c->rand_bits;                                                              \
        const double two_r = c->two_r;                                                               \
        int64_t count = 0;                                                                           \
        for (int64_t i = 0; i < n; i++) {                                                            \
            int u = 0;                                                                               \
            W x = xs[i];                                                                             \
            W y = CALL;                                                                              \
            ys[i] = u ? x : y;                                                                       \
            count += u;                                                                              \
            index += step;                                                                           \
        }                                                                                            \
        *und += count;                                                                               \
    }

#define FLOAT_LOOPS(M)                                                                               \
    ELEM_LOOP(float_##M##_any, SFX(float_consts)(&c->f), SFX(float_k),                              \
              SFX(float_round)(x, &k, M, 0, 0, base, index, rbits, two_r, &u))                           \
    ELEM_LOOP(float_##M##_common, SFX(float_consts)(&c->f), SFX(float_k),                           \
              SFX(float_round)(x, &k, M, 1, 0, base, index, rbits, two_r, &u))                           \
    ELEM_LOOP(float_##M##_recip, SFX(float_consts)(&c->f), SFX(float_k),                            \
              SFX(float_round)(x, &k, M, 1, 1, base, index, rbits, two_r, &u))                           \
    ELEM_LOOP(uniform_##M##_clamp, SFX(uniform_consts)(&c->u), SFX(uniform_k),                      \
              SFX(uniform_round)(x, &k, M, 0, base, index, rbits, two_r, &u))                            \
    ELEM_LOOP(uniform_##M##_wrap, SFX(uniform_consts)(&c->u), SFX(uniform_k),                       \
              SFX(uniform_round)(x, &k, M, 1, base, index, rbits, two_r, &u))                            \
    ELEM_LOOP(posit_##M, SFX(posit_consts)(&c->p), SFX(posit_k),                                    \
              SFX(posit_round)(x, &k, M, base, index, rbits, two_r, &u))

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

/* [variant][mode]: float any / common / recip, uniform clamp / wrap, posit */
static const any_loop SFX(elem_loops)[6][M_COUNT] = {
    MODE_ROW(float_, _any),      MODE_ROW(float_, _common), MODE_ROW(float_, _recip),
    MODE_ROW(uniform_, _clamp), MODE_ROW(uniform_, _wrap), MODE_ROW(posit_, ),
};

/* --- blocks: a chunk of whole blocks (or of one long block), each with its scale ---------------- */

#define BLOCK_CHUNK 1024 /* elements per chunk: the working-type staging buffer and per-block arrays */

/* q = x / s (as x * 2**-k where that is exact), the element's rounding, back to x's scale; the
   block's scale, reciprocal and NaN multiplier come per element (one flat loop vectorises best) */
#define BLOCK_BODY(ROUND)                                                                            \
    for (int64_t i = 0; i < n; i++) {                                                                \
        int u = 0;                                                                                   \
        uint64_t index = idx0 + (uint64_t)i;                                                         \
        W x = xs[i], s = scale[i];                                                                   \
        W q = USE_INV ? x * inv[i] : x / s;                                                          \
        q = ((q == (W)0) & (x != (W)0)) ? COPYSIGNW(tiny, x) : q;                                    \
        W r = ROUND;                                                                                 \
        r = r < lo_clip ? lo_clip : r;                                                               \
        r = r > hi_clip ? hi_clip : r;                                                               \
        ys[i] = (r * s) * badmul[i];                                                                 \
        count += u;                                                                                  \
    }

#define BLOCK_LOOP(NAME, CONSTS, KTYPE, ROUND)                                                       \
    static void SFX(NAME)(const W *xs, W *ys, int64_t n, const W *scale, const W *inv,               \
                          const W *badmul, int use_inv, const any_call *c, uint64_t base,           \
                          uint64_t idx0, int64_t *und) {                                             \
        const KTYPE k = CONSTS;                                                                      \
        const int rbits = c->rand_bits;                                                              \
        const double two_r = c->two_r;                                                               \
        /* the flags as constants: x / s underflowing to 0 keeps x's sign and non-zeroness where   \
           the element's rounding could tell; symmetric blocks clamp */                              \
        const W tiny = c->b.fix_tiny ? W_TINY : (W)0;                                                \
        const W hi_clip = c->b.symmetric ? (W)c->b.elem_max : (W)INFINITY;                           \
        const W lo_clip = -hi_clip;                                                                  \
        int64_t count = 0;                                                                           \
        if (use_inv) {                                                                               \
            const int USE_INV = 1;                                                                   \
            BLOCK_BODY(ROUND)                                                                        \
        } else {                                                                                     \
            const int USE_INV = 0;                                                                   \
            BLOCK_BODY(ROUND)                                                                        \
        }                                                                                            \
        *und += count;                                                                               \
    }

#define BLOCK_LOOPS(M)                                                                               \
    BLOCK_LOOP(bfloat_##M##_any, SFX(float_consts)(&c->b.ef), SFX(float_k),                         \
               SFX(float_round)(q, &k, M, 0, 0, base, index, rbits, two_r, &u))                      \
    BLOCK_LOOP(bfloat_##M##_recip, SFX(float_consts)(&c->b.ef), SFX(float_k),                       \
               SFX(float_round)(q, &k, M, 1, 1, base, index, rbits, two_r, &u))                      \
    BLOCK_LOOP(buniform_##M##_clamp, SFX(uniform_consts)(&c->b.eu), SFX(uniform_k),                 \
               SFX(uniform_round)(q, &k, M, 0, base, index, rbits, two_r, &u))                       \
    BLOCK_LOOP(buniform_##M##_wrap, SFX(uniform_consts)(&c->b.eu), SFX(uniform_k),                  \
               SFX(uniform_round)(q, &k, M, 1, base, index, rbits, two_r, &u))

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

typedef void (*SFX(block_loop))(const W *, W *, int64_t, const W *, const W *, const W *, int,
                                 const any_call *, uint64_t, uint64_t, int64_t *);

/* [variant][mode]: float element any / recip, uniform element clamp / wrap */
static const SFX(block_loop) SFX(block_loops)[4][M_COUNT] = {
    MODE_ROW(bfloat_, _any), MODE_ROW(bfloat_, _recip),
    MODE_ROW(buniform_, _clamp), MODE_ROW(buniform_, _wrap),
};

/* A chunk of n <= BLOCK_CHUNK elements of dtype c->tdt at x -> y: blocks of bs elements (the last
   may be short), block b's scale sc[b] (a float64 value the working type holds exactly), its
   reciprocal iv[b] where `use_inv` (exact: x * iv rounds like x / sc), and bad[b] (NaN or inf
   in the block: every value NaN). Random indices idx0 + i. Staged through the working type when
   the dtypes differ. */
static void SFX(block_chunk)(const any_call *c, const char *x, char *y, int64_t n, int64_t bs,
                             const double *sc, const double *iv, const int *bad, int use_inv,
                             uint64_t base, uint64_t idx0, int64_t *und) {
    W scale[BLOCK_CHUNK], inv[BLOCK_CHUNK], badmul[BLOCK_CHUNK], buf[BLOCK_CHUNK];
    for (int64_t b = 0, s = 0; s < n; b++, s += bs) { /* each block's values, element by element */
        const int64_t e = n - s < bs ? n : s + bs;
        const W sw = (W)sc[b], iw = (W)iv[b], bw = bad[b] ? (W)NAN : (W)1;
        for (int64_t i = s; i < e; i++) {
            scale[i] = sw;
            inv[i] = iw;
            badmul[i] = bw;
        }
    }
    const any_block *blk = &c->b;
    int variant = blk->elem_family == F_FLOAT ? (blk->ef.common && blk->ef.recip) : 2 + blk->eu.wrap;
    SFX(block_loop) loop = SFX(block_loops)[variant][c->mode];
    if (c->tdt == (sizeof(W) == 4 ? T_F32 : T_F64)) {
        loop((const W *)x, (W *)y, n, scale, inv, badmul, use_inv, c, base, idx0, und);
        return;
    }
    SFX(load)(x, c->tdt, buf, n);
    loop(buf, buf, n, scale, inv, badmul, use_inv, c, base, idx0, und);
    SFX(store)(buf, y, c->tdt, n);
}

#undef LOOP_ROW
#undef MODE_ROW
#undef FLOAT_LOOPS
#undef ELEM_LOOP
#undef BLOCK_BODY
#undef BLOCK_LOOP
#undef BLOCK_LOOPS
