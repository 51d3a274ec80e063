/* Template (see scalar.c): tables through the bucket lookup of anynum.kernels.tablelut, over W
 * arrays (float: float16, bfloat16 and float32 inputs, which widen to float32 exactly; double:
 * float64 inputs), and the table element loops.
 *
 * Each input is keyed on its magnitude's bits a (W's bits, sign cleared): k = 2 * (a >> shift) +
 * (a has a lower bit set), so the first member of each bucket of 2**shift floats has an entry of
 * its own; k is clamped to [klo - 1, khi + 1] (the tiny and the top magnitudes), zero takes entry
 * 0 and negative inputs the second half of 2 * ntot entries. For a deterministic mode the entry is
 * the result's bits (and NaN inputs, with +-inf under infinity="nan", key one more entry, NaN);
 * for the stochastic ones it is the two neighbours, and NaN inputs key as +0 (the reference reads
 * them as 0 for the draw; table_sr_choose makes the result NaN). A sentinel (all ones; NaN for lo)
 * marks the entries whose inputs differ: those elements are searched (table.c) after the tile's
 * pass, which they leave with their x.
 */

#define TL_ABS (W_EXPMASK | (W_EXPMASK - 1)) /* everything but the sign bit */
#define TL_QNAN (W_EXPMASK | ((WU)1 << (W_MAN - 1)))
#define TL_SENT (~(WU)0)

typedef struct {
    WU shift, lowmask, klo1, khi1, off, ntot;
} SFX(table_keymap);

ANY_INLINE SFX(table_keymap) SFX(table_keys)(const any_table *t) {
    SFX(table_keymap) k;
    k.shift = (WU)t->lut_shift;
    k.lowmask = ((WU)1 << k.shift) - 1;
    k.klo1 = (WU)t->lut_klo - 1;
    k.khi1 = (WU)t->lut_khi + 1;
    k.off = (WU)t->lut_klo - 2;
    k.ntot = (WU)t->lut_ntot;
    return k;
}

/* the entry of magnitude bits a (sign cleared) with sign bit sign (0 or 1) */
ANY_INLINE WU SFX(table_entry)(WU a, WU sign, const SFX(table_keymap) *km) {
    WU k = (a >> km->shift) + ((a + km->lowmask) >> km->shift); /* floor + ceil of a / 2**shift */
    k = k < km->klo1 ? km->klo1 : k;
    k = k > km->khi1 ? km->khi1 : k;
    k = a == 0 ? km->off : k; /* zero: entry 0 */
    return k - km->off + (sign ? km->ntot : 0);
}

/* deterministic modes: NaN inputs (and +-inf under infinity="nan") key the last entry, NaN */
ANY_INLINE WU SFX(table_key_det)(WU u, const SFX(table_keymap) *km, WU nan_from) {
    WU a = u & TL_ABS;
    WU key = SFX(table_entry)(a, u >> (sizeof(W) * 8 - 1), km);
    return a >= nan_from ? 2 * km->ntot : key;
}

/* stochastic modes: NaN inputs key as +0 (the reference reads them as 0) */
ANY_INLINE WU SFX(table_key_sr)(WU u, const SFX(table_keymap) *km) {
    WU a = u & TL_ABS;
    WU sign = a > W_EXPMASK ? 0 : u >> (sizeof(W) * 8 - 1);
    return SFX(table_entry)(a > W_EXPMASK ? 0 : a, sign, km);
}

/* the m elements flagged in fl, whose y holds their x, rounded by the search (deterministic M) */
static void SFX(table_fix)(W *y, int64_t m, const WI *fl, const any_table *t, const int M) {
    int64_t idx[TABLE_TILE];
    double xc[TABLE_TILE], yc[TABLE_TILE];
    int64_t c = 0;
    for (int64_t i = 0; i < m; i++) {
        idx[c] = i;
        c += fl[i] != 0;
    }
    for (int64_t k = 0; k < c; k++) xc[k] = (double)y[idx[k]];
    switch (M) { /* the mode as a constant of table_tile */
    case M_RNE: table_tile(xc, yc, c, t, M_RNE); break;
    case M_RNA: table_tile(xc, yc, c, t, M_RNA); break;
    case M_RNZ: table_tile(xc, yc, c, t, M_RNZ); break;
    case M_RZ: table_tile(xc, yc, c, t, M_RZ); break;
    case M_RU: table_tile(xc, yc, c, t, M_RU); break;
    case M_RD: table_tile(xc, yc, c, t, M_RD); break;
    default: table_tile(xc, yc, c, t, M_RO); break;
    }
    for (int64_t k = 0; k < c; k++) y[idx[k]] = (W)yc[k];
}

/* deterministic modes: the key (a vector loop), the lookup (scalar loads), then the search's
   flags; a flagged element keeps x in y (y may be x) for table_fix */
ANY_INLINE void SFX(table_lut_det)(const W *xin, W *yout, int64_t n, const any_table *t, const int M) {
    const WU *lut = (const WU *)t->lut;
    const SFX(table_keymap) km = SFX(table_keys)(t);
    const WU nan_from = t->infinity_nan ? W_EXPMASK : W_EXPMASK + 1; /* |x| bits from which y is NaN */
#if defined(__AVX512F__)
    const int one_pass = sizeof(W) == 4 && !t->portable && table_gathers_fast(); /* tablegather.c */
    const uint32_t km32[6] = {(uint32_t)km.shift, (uint32_t)km.lowmask, (uint32_t)km.klo1,
                              (uint32_t)km.khi1,  (uint32_t)km.off,     (uint32_t)km.ntot};
#endif
    for (int64_t i0 = 0; i0 < n; i0 += TABLE_TILE) {
        const int64_t m = n - i0 < TABLE_TILE ? n - i0 : TABLE_TILE;
        const W *x = xin + i0;
        W *y = yout + i0;
        WU key[TABLE_TILE], rt[TABLE_TILE];
        WI fl[TABLE_TILE];
        WI nf = 0;
#if defined(__AVX512F__)
        if (one_pass) {
            nf = table_det_tile_f32((const uint32_t *)x, (uint32_t *)y, m, (const uint32_t *)lut, km32,
                                    (uint32_t)nan_from, (int32_t *)fl);
            if (nf) SFX(table_fix)(y, m, fl, t, M);
            continue;
        }
#endif
        for (int64_t i = 0; i < m; i++) key[i] = SFX(table_key_det)(SFX(bits)(x[i]), &km, nan_from);
        if (sizeof(W) == 4) table_gather_32((const uint32_t *)lut, (const uint32_t *)key, (uint32_t *)rt, m);
        else table_gather_64((const uint64_t *)lut, (const uint64_t *)key, (uint64_t *)rt, m);
        for (int64_t i = 0; i < m; i++) {
            WU r = rt[i];
            WI f = r == TL_SENT;
            y[i] = f ? x[i] : SFX(from)(r);
            fl[i] = f;
            nf += f;
        }
        if (nf) SFX(table_fix)(y, m, fl, t, M);
    }
}

#if defined(__AVX512F__)
/* The elements table_sr_fast_f32 flagged in fl (float arrays: y holds their x; a mask of 16
   elements per entry), by the choice of the loops below; returns the undecided count. */
ANY_INLINE int64_t SFX(table_sr_fix)(W *y, int64_t m, const uint16_t *fl, const any_table *t, const int M,
                                     const table_srk *k, const uint64_t *draws, const SFX(table_keymap) *km) {
    int64_t idx[TABLE_TILE], c = 0, count = 0;
    for (int64_t g = 0; g < m; g += 16)
        for (unsigned f = fl[g / 16]; f; f &= f - 1) idx[c++] = g + __builtin_ctz(f);
    for (int64_t q = 0; q < c; q++) {
        const int64_t i = idx[q];
        const double v = (double)y[i], xs = v != v ? 0.0 : v;
        const uint64_t e = ((const uint64_t *)t->lut)[SFX(table_key_sr)(SFX(bits)(y[i]), km)];
        double lo = (double)f32_from((uint32_t)e), hi = (double)f32_from((uint32_t)(e >> 32));
        if (lo != lo) { /* searched */
            int64_t pos;
            table_search(&xs, &pos, 1, t);
            table_sr_neighbours(t, pos, xs, &lo, &hi);
        }
        int u = 0;
        double yv = table_sr_choose(v, xs, lo, hi, M, 0, 1, k, draws[i], &u);
        y[i] = (W)(u ? v : yv);
        count += u;
    }
    return count;
}
#endif

/* stochastic modes: the key (a vector loop), the neighbours (scalar loads), the choice (a vector
   loop); for float arrays where gathers are fast, the first two in one pass (table_sr_tile_f32),
   or all three (table_sr_fast_f32) where the spacings are powers of two. Inputs whose entry is
   searched (lo is NaN there) are redone after it, one by one. */
ANY_INLINE void SFX(table_lut_sr)(const W *xin, W *yout, int64_t n, const any_table *t, const int M,
                                  const any_pos *at, int rbits, double two_r, int64_t *und) {
    const SFX(table_keymap) km = SFX(table_keys)(t);
    table_srk k;
    k.inf_is_nan = t->infinity_nan ? INFINITY : NAN; /* |x| == NaN never holds */
    k.neg_nan = t->negative_nan ? 0.0 : -INFINITY;    /* v < -inf never holds */
    k.signed_zero = t->signed_zero ? 1.0 : 0.0;
    k.base = at->base;
    k.two_r = two_r;
    const uint64_t step = (uint64_t)at->lstride;
    const int WIDE = sizeof(W) == 8; /* float32 numbers never need the probability's scale */
#if defined(__AVX512F__)
    const int one_pass = sizeof(W) == 4 && !t->portable && table_gathers_fast(); /* tablegather.c */
    const uint32_t km32[6] = {(uint32_t)km.shift, (uint32_t)km.lowmask, (uint32_t)km.klo1,
                              (uint32_t)km.khi1,  (uint32_t)km.off,     (uint32_t)km.ntot};
    const int fused = one_pass && t->lut_float_lanes;
#endif
    uint64_t index = at->idx0;
    for (int64_t i0 = 0; i0 < n; i0 += TABLE_TILE) {
        const int64_t m = n - i0 < TABLE_TILE ? n - i0 : TABLE_TILE;
        const W *x = xin + i0;
        W *y = yout + i0;
#if defined(__AVX512F__)
        if (fused) {
            uint64_t fdraws[TABLE_TILE];
            uint16_t fl[TABLE_TILE / 16];
            counter_draws(fdraws, k.base, index, step, m, draw_bits(M, rbits));
            if (table_sr_fast_f32((const uint32_t *)x, (uint32_t *)y, m, (const uint64_t *)t->lut, km32,
                                  fdraws, M, rbits, &k, fl))
                *und += SFX(table_sr_fix)(y, m, fl, t, M, &k, fdraws, &km);
            index += (uint64_t)m * step;
            continue;
        }
#endif
        double xo[TABLE_TILE], xs_t[TABLE_TILE], lo_t[TABLE_TILE], hi_t[TABLE_TILE];
        WU key[TABLE_TILE];
        uint64_t e[TABLE_TILE];
#if defined(__AVX512F__)
        if (one_pass) {
            table_sr_tile_f32((const uint32_t *)x, m, (const uint64_t *)t->lut, km32, e, xo, xs_t);
        } else
#endif
        {
            for (int64_t i = 0; i < m; i++) {
                double v = (double)x[i];
                key[i] = SFX(table_key_sr)(SFX(bits)(x[i]), &km);
                xo[i] = v;
                xs_t[i] = v != v ? 0.0 : v;
            }
            if (sizeof(W) == 4) /* lo's float32 bits and hi's, packed in one uint64 */
                table_gather_64k32((const uint64_t *)t->lut, (const uint32_t *)key, e, m);
            else /* lo and hi side by side */
                table_gather_pair((const double *)t->lut, (const uint64_t *)key, lo_t, hi_t, m);
        }
        int64_t count = 0, nf = 0;
        uint64_t draws[TABLE_TILE];
        counter_draws(draws, k.base, index, step, m, draw_bits(M, rbits));
        /* x and xs (NaN read as 0) from arrays: computed in the loop, GCC threads xs's select into
           the compares on xs, which it then cannot vectorise */
#define TABLE_SR_LOOP(DIV)                                                                          \
        for (int64_t i = 0; i < m; i++) {                                                           \
            int u = 0;                                                                              \
            double v = xo[i], lo, hi;                                                               \
            if (sizeof(W) == 4) {                                                                   \
                lo = (double)f32_from((uint32_t)e[i]);                                              \
                hi = (double)f32_from((uint32_t)(e[i] >> 32));                                      \
            } else {                                                                                \
                lo = lo_t[i];                                                                       \
                hi = hi_t[i];                                                                       \
            }                                                                                       \
            double yv = table_sr_choose(v, xs_t[i], lo, hi, M, WIDE, DIV, &k, draws[i], &u);        \
            y[i] = (W)(u ? v : yv);                                                                 \
            count += u;                                                                             \
            nf += lo != lo;                                                                         \
        }
        if (M == M_SRU || t->lut_pow2) { /* every spacing a power of two: multiply */
            TABLE_SR_LOOP(0)
        } else {
            TABLE_SR_LOOP(1)
        }
#undef TABLE_SR_LOOP
        if (nf) { /* the searched elements, one by one (x is kept in xo: y may be x) */
            int64_t idx[TABLE_TILE], pc[TABLE_TILE];
            double xc[TABLE_TILE];
            int64_t c = 0;
            for (int64_t i = 0; i < m; i++) {
                double lo = sizeof(W) == 4 ? (double)f32_from((uint32_t)e[i]) : lo_t[i];
                idx[c] = i;
                c += lo != lo;
            }
            for (int64_t q = 0; q < c; q++) xc[q] = xs_t[idx[q]];
            table_search(xc, pc, c, t);
            for (int64_t q = 0; q < c; q++) {
                int u = 0;
                int64_t i = idx[q];
                double lo, hi;
                table_sr_neighbours(t, pc[q], xc[q], &lo, &hi);
                double yv = table_sr_choose(xo[i], xc[q], lo, hi, M, WIDE, 1, &k, draws[i], &u);
                y[i] = (W)(u ? xo[i] : yv);
                count += u;
            }
        }
        *und += count;
        index += (uint64_t)m * step;
    }
}

/* the element loops, one per mode; float64 arrays without a lookup (one-value tables) search */
#define TABLE_LOOP(M)                                                                               \
    static void SFX(table_loop_##M)(const void *xv, void *yv, int64_t n, const any_call *c,          \
                                    const any_pos *at, int64_t *und) {                                \
        if (sizeof(W) == 8 && !c->t.lut) {                                                           \
            const double *xs = (const double *)xv;                                                   \
            double *ys = (double *)yv;                                                               \
            for (int64_t i = 0; i < n; i += TABLE_TILE) {                                            \
                int64_t m = n - i < TABLE_TILE ? n - i : TABLE_TILE;                                 \
                table_tile(xs + i, ys + i, m, &c->t, M);                                             \
            }                                                                                        \
        } else if (M == M_SR || M == M_SRT || M == M_SRU) {                                          \
            SFX(table_lut_sr)((const W *)xv, (W *)yv, n, &c->t, M, at, c->rand_bits, c->two_r, und);  \
        } else {                                                                                     \
            SFX(table_lut_det)((const W *)xv, (W *)yv, n, &c->t, M);                                 \
        }                                                                                            \
    }
TABLE_LOOP(0) TABLE_LOOP(1) TABLE_LOOP(2) TABLE_LOOP(3) TABLE_LOOP(4)
TABLE_LOOP(5) TABLE_LOOP(6) TABLE_LOOP(7) TABLE_LOOP(8) TABLE_LOOP(9)
#undef TABLE_LOOP

static const any_loop SFX(table_loops)[M_COUNT] = {
    SFX(table_loop_0), SFX(table_loop_1), SFX(table_loop_2), SFX(table_loop_3), SFX(table_loop_4),
    SFX(table_loop_5), SFX(table_loop_6), SFX(table_loop_7), SFX(table_loop_8), SFX(table_loop_9),
};

#undef TL_ABS
#undef TL_QNAN
#undef TL_SENT
