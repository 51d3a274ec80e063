/* Template (see scalar.c): tables through the bucket lookup of anynum.kernels.tablelut, over W
 * arrays (float: float16, bfloat16 and float32 inputs, which widen to float32 exactly; double:
 * float64 inputs), and the table element loops.
 *
 * Each input is keyed on its magnitude's bits a (W's bits, sign cleared): k = 2 * (a >> shift) +
 * (a has a lower bit set), so the first member of each bucket of 2**shift floats has an entry of
 * its own; k is clamped to [klo - 1, khi + 1] (the tiny and the top magnitudes), zero takes entry
 * 0 and negative inputs the second half of ntot entries. For a deterministic mode the entry is the
 * result's bits, for the stochastic ones the search position j; a sentinel marks the entries whose
 * inputs must be searched (table.c), which happens for the few elements concerned in a tile of
 * their own. NaN inputs key as zero (the reference reads them as 0); their result is made NaN
 * afterwards, as that of +-inf under infinity="nan".
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

/* the entry of an input with bits u (NaN: keyed as zero) */
ANY_INLINE WU SFX(table_key)(WU u, const SFX(table_keymap) *km) {
    WU a = u & TL_ABS;
    u = a > W_EXPMASK ? 0 : u;
    a = a > W_EXPMASK ? 0 : a;
    WU k = ((a >> km->shift) << 1) + (((a & km->lowmask) + km->lowmask) >> km->shift);
    k = k < km->klo1 ? km->klo1 : k;
    k = k > km->khi1 ? km->khi1 : k;
    WU key = a == 0 ? 0 : k - km->off;
    return key + ((u >> (sizeof(W) * 8 - 1)) ? km->ntot : 0);
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
    any_pos none = {0, 0, 0};
    int64_t und = 0;
    switch (M) { /* the mode as a constant of table_tile */
    case M_RNE: table_tile(xc, yc, c, t, M_RNE, &none, 0, 0, 1.0, &und); break;
    case M_RNA: table_tile(xc, yc, c, t, M_RNA, &none, 0, 0, 1.0, &und); break;
    case M_RNZ: table_tile(xc, yc, c, t, M_RNZ, &none, 0, 0, 1.0, &und); break;
    case M_RZ: table_tile(xc, yc, c, t, M_RZ, &none, 0, 0, 1.0, &und); break;
    case M_RU: table_tile(xc, yc, c, t, M_RU, &none, 0, 0, 1.0, &und); break;
    case M_RD: table_tile(xc, yc, c, t, M_RD, &none, 0, 0, 1.0, &und); break;
    default: table_tile(xc, yc, c, t, M_RO, &none, 0, 0, 1.0, &und); break;
    }
    for (int64_t k = 0; k < c; k++) y[idx[k]] = (W)yc[k];
}

/* deterministic modes: one gather per element */
ANY_INLINE void SFX(table_lut_det)(const W *xin, W *yout, int64_t n, const any_table *t, const int M) {
    const WU *lut = (const WU *)t->lut;
    const SFX(table_keymap) km = SFX(table_keys)(t);
    const WU nan_from = t->infinity_nan ? W_EXPMASK : W_EXPMASK + 1; /* |x| bits from which y is NaN */
    for (int64_t i0 = 0; i0 < n; i0 += TABLE_TILE) {
        const int64_t m = n - i0 < TABLE_TILE ? n - i0 : TABLE_TILE;
        const W *x = xin + i0;
        W *y = yout + i0;
        WI fl[TABLE_TILE];
        WI nf = 0;
        for (int64_t i = 0; i < m; i++) {
            WU u = SFX(bits)(x[i]);
            WU r = lut[SFX(table_key)(u, &km)];
            WI f = r == TL_SENT;
            r = (u & TL_ABS) >= nan_from ? TL_QNAN : r;
            r = f ? u : r; /* x kept for the search (y may be x) */
            y[i] = SFX(from)(r);
            fl[i] = f;
            nf += f;
        }
        if (nf) SFX(table_fix)(y, m, fl, t, M);
    }
}

/* stochastic modes: the neighbours lo and hi from the lookup, then the choice of table_choose for
   these modes, shortened by what a lookup entry guarantees (x's interval is [lo, hi), clamped at
   the table's ends as the reference clamps it): below and above the table are x < first and
   x >= top, x is a table value iff x == lo, and the result is 0 (where underflow="saturate" moves
   it off zero) iff its index is the zero's. */
ANY_INLINE void SFX(table_lut_sr)(const W *xin, W *yout, int64_t n, const any_table *t, const int M,
                                  const any_pos *at, int rbits, double two_r, int64_t *und) {
    const double *vals = t->values;
    const int64_t size = t->size;
    const SFX(table_keymap) km = SFX(table_keys)(t);
    const double top = vals[size - 1], first = vals[0];
    const int64_t zero_sat = t->underflow_saturate ? t->zero_index : -1;
    const double zs = zero_sat >= 0 ? 1.0 : 0.0;
    const double v_above_zero = zero_sat >= 0 ? vals[zero_sat + 1 < size ? zero_sat + 1 : zero_sat] : 0.0;
    const double v_below_zero = zero_sat >= 0 ? vals[zero_sat >= 1 ? zero_sat - 1 : zero_sat] : 0.0;
    const double inf_is_nan = t->infinity_nan ? INFINITY : NAN; /* |x| == NaN never holds */
    const double neg_nan = t->negative_nan ? 0.0 : -INFINITY;    /* v < -inf never holds */
    const double signed_zero = t->signed_zero ? 1.0 : 0.0;
    const uint64_t base = at->base, step = (uint64_t)at->lstride;
    uint64_t index = at->idx0;
    for (int64_t i0 = 0; i0 < n; i0 += TABLE_TILE) {
        const int64_t m = n - i0 < TABLE_TILE ? n - i0 : TABLE_TILE;
        const W *x = xin + i0;
        double xo[TABLE_TILE], xs_t[TABLE_TILE], lo_t[TABLE_TILE], hi_t[TABLE_TILE];
        int64_t nf = 0;
        if (sizeof(W) == 4) { /* lo's float32 bits and hi's, packed in one uint64 */
            const uint64_t *lut = (const uint64_t *)t->lut;
            for (int64_t i = 0; i < m; i++) {
                uint64_t e = lut[SFX(table_key)(SFX(bits)(x[i]), &km)];
                double lo = (double)f32_from((uint32_t)e), v = (double)x[i];
                xo[i] = v;
                xs_t[i] = v != v ? 0.0 : v;
                lo_t[i] = lo;
                hi_t[i] = (double)f32_from((uint32_t)(e >> 32));
                nf += lo != lo;
            }
        } else { /* lo and hi side by side */
            const double *lut = (const double *)t->lut;
            for (int64_t i = 0; i < m; i++) {
                uint64_t k = 2 * (uint64_t)SFX(table_key)(SFX(bits)(x[i]), &km);
                double lo = lut[k], v = (double)x[i];
                xo[i] = v;
                xs_t[i] = v != v ? 0.0 : v;
                lo_t[i] = lo;
                hi_t[i] = lut[k + 1];
                nf += lo != lo;
            }
        }
        if (nf) { /* the flagged elements' neighbours by the search (NaN lo marks them) */
            int64_t idx[TABLE_TILE], pc[TABLE_TILE];
            double xc[TABLE_TILE];
            int64_t c = 0;
            for (int64_t i = 0; i < m; i++) {
                idx[c] = i;
                c += lo_t[i] != lo_t[i];
            }
            for (int64_t k = 0; k < c; k++) xc[k] = xs_t[idx[k]];
            table_search(xc, pc, c, t);
            for (int64_t k = 0; k < c; k++) {
                int64_t j = pc[k];
                int64_t jj = j < 0 ? 0 : (j > size - 2 ? size - 2 : j);
                lo_t[idx[k]] = vals[jj];
                hi_t[idx[k]] = vals[jj + 1];
            }
        }
        W *y = yout + i0;
        int64_t count = 0;
        for (int64_t i = 0; i < m; i++) {
            int u = 0;
            /* x and xs (NaN read as 0) from arrays: computed here, GCC threads xs's select into
               the compares on xs, which it then cannot vectorise */
            double v = xo[i], xs = xs_t[i];
            double lo = lo_t[i], hi = hi_t[i];
            int64_t nan = table_nan(v, xs, inf_is_nan, neg_nan);
            int64_t negative = hi <= 0.0;
            int64_t away;
            if (M == M_SRU) {
                away = sr_coin(base, index);
            } else {
                /* table_probability on the magnitudes: (-xs) - (-hi) is hi - xs, bit for bit */
                double p;
                if (sizeof(W) == 8) {
                    int64_t big = (fabs(lo) > 0x1p1000) | (fabs(hi) > 0x1p1000);
                    double scale = big ? 0.5 : 1.0;
                    double xsc = xs * scale, losc = lo * scale, hisc = hi * scale;
                    double num = negative ? hisc - xsc : xsc - losc;
                    double den = hisc - losc;
                    p = num / (den > 0.0 ? den : 1.0);
                } else { /* float32 numbers: |lo|, |hi| < 2**128, the scale is 1 */
                    double num = negative ? hi - xs : xs - lo;
                    double den = hi - lo;
                    p = num / (den > 0.0 ? den : 1.0);
                }
                int64_t b = (int64_t)f64_bits(p);
                b = b < 0 ? 0 : b;
                b = b > 0x3FEFFFFFFFFFFFFFll ? 0x3FEFFFFFFFFFFFFFll : b;
                p = f64_from((uint64_t)b);
                if (M == M_SR) away = sr_exact_up(p, base, index, &u);
                else away = sr_trunc_up(p, base, index, rbits, two_r);
            }
            double yv = (away ^ negative) ? hi : lo;
            yv = xs == lo ? lo : yv;         /* x on the table */
            yv = xs < first ? first : yv;    /* below */
            yv = xs >= top ? top : yv;       /* above, or on the top value (j = size - 1) */
            int64_t to_zero = (yv == 0.0) & (zs != 0.0); /* underflow="saturate": off zero */
            yv = (to_zero & (xs > 0.0)) ? v_above_zero : yv;
            yv = (to_zero & (xs < 0.0)) ? v_below_zero : yv;
            yv = table_finish(yv, xs, nan, signed_zero);
            y[i] = (W)(u ? v : yv);
            count += u;
            index += step;
        }
        *und += count;
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
                table_tile(xs + i, ys + i, m, &c->t, M, at, i, c->rand_bits, c->two_r, und);          \
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
