/* Tables (float64 working type): anynum.kernels.table._round_table.
 *
 * Most inputs are rounded through the bucket lookup of tablelut.c (pasted after this file, once per
 * key type); what is here serves it and searches the rest. The search
 * (torch.searchsorted(values, x, right=True) - 1) runs over a tile of elements one halving step
 * at a time, so each step is a vectorisable loop of gathers; the choice between the two
 * neighbours is then one branch-free pass per deterministic mode (table_choose); the stochastic
 * modes choose behind the lookup (table_sr_choose), which every table of two values or more has. */

#define TABLE_TILE 256
_Static_assert(TABLE_TILE % 32 == 0, "counter_draws writes whole blocks of 32");
#define TABLE_LINEAR 16 /* tables up to this size are searched by counting */

/* Whether a tie between lo < hi goes to hi under tie policy TIES (0 smaller_magnitude, 1 away,
   2 even, 3 down, 4 up; a constant in each loop). int64 flags throughout: the lanes of the
   doubles and indices, so the vectoriser needs no mask conversions. */
ANY_INLINE int64_t table_tie_up(const int TIES, double lo, double hi, double x, int64_t hi_rank_even) {
    if (TIES == 2) return hi_rank_even;
    if (TIES == 3) return 0;
    if (TIES == 4) return 1;
    double alo = fabs(lo), ahi = fabs(hi);
    int64_t positive = (f64_bits(x) >> 63) == 0; /* not signbit(), which does not vectorise */
    /* lo == -hi: x is +-0 and 0 is not in the table: x's sign decides */
    int64_t bigger = TIES == 0 ? (ahi < alo) : (ahi > alo);
    return alo == ahi ? positive : bigger;
}

/* kernels.table._finish: with signed_zero a zero result takes the sign of v (x, NaN read as 0);
   then NaN where due. signed_zero is 0.0 or 1.0 (a double flag: no mask conversions). */
ANY_INLINE double table_finish(double y, double v, int64_t nan, double signed_zero) {
    y = ((y == 0.0) & (signed_zero != 0.0)) ? copysign(y, v) : y;
    return y + (nan ? (double)NAN : -0.0); /* y + -0.0 is y, -0 included (y + +0.0 is not) */
}

/* NaN results: NaN inputs, infinities under infinity="nan", negatives under negative="nan" */
ANY_INLINE int64_t table_nan(double x, double v, double inf_is_nan, double neg_nan) {
    return (x != x) | (fabs(x) == inf_is_nan) | (v < neg_nan);
}

/* The choice between the neighbours, for a tile whose inputs (xo, and xs with NaN as 0), search
   results (pos) and outputs are local arrays: the compiler must see that the gathers from the
   table cannot alias the stores, or it does not vectorise. */
ANY_INLINE void table_choose(const double *xo, const double *xs, const int64_t *pos, const double *lo_t,
                             const double *hi_t, const double *fb_t, const int64_t *be_t, double *yout,
                             int64_t n, const any_table *t, const int M, const int TIES) {
    const double *vals = t->values;
    const int64_t size = t->size;
    const int64_t zero_sat = t->underflow_saturate ? t->zero_index : -1;
    const int64_t above_zero = zero_sat + 1 < size ? zero_sat + 1 : zero_sat;
    const int64_t below_zero = zero_sat >= 1 ? zero_sat - 1 : zero_sat;
    const double top = vals[size - 1], first = vals[0];
    const double v_above_zero = zero_sat >= 0 ? vals[above_zero] : 0.0;
    const double v_below_zero = zero_sat >= 0 ? vals[below_zero] : 0.0;
    const double inf_is_nan = t->infinity_nan ? INFINITY : NAN; /* |x| == NaN never holds */
    const double neg_nan = t->negative_nan ? 0.0 : -INFINITY;    /* v < -inf never holds */
    const double signed_zero = t->signed_zero ? 1.0 : 0.0;
    const int64_t first_nonneg = t->first_nonneg;
    for (int64_t i = 0; i < n; i++) {
        double v = xs[i];
        int64_t nan = table_nan(xo[i], v, inf_is_nan, neg_nan);
        int64_t j = pos[i]; /* vals[j] <= x < vals[j + 1] */
        int64_t below = j < 0;
        int64_t jj = j < 0 ? 0 : (j > size - 2 ? size - 2 : j);
        double lo = lo_t[i], hi = hi_t[i];
        double vj = j == size - 1 ? hi : lo; /* vals[j] without a third gather */
        int64_t exact = !below & (vj == v);
        int64_t above = v > top;
        int64_t hi_rank_even = ((jj + 1 - first_nonneg) & 1) == 0;
        int64_t up;
        if (M == M_RNE || M == M_RNA || M == M_RNZ || M == M_RZ) {
            double fb = fb_t[i];
            int64_t tie = (be_t[i] != 0) & (v == fb);
            int64_t up_nearest = ((v > fb) & !tie) | (tie & table_tie_up(TIES, lo, hi, v, hi_rank_even));
            /* toward zero: the neighbour on zero's side; across a gap that straddles zero (0 not
               in the table) neither is: keep x's sign (monotone, no sign flips) */
            int64_t straddle = (lo < 0.0) & (hi > 0.0);
            int64_t positive = (f64_bits(v) >> 63) == 0;
            up = M == M_RZ ? (straddle ? positive : (int64_t)(v < 0.0)) : up_nearest;
        } else if (M == M_RU) {
            up = 1;
        } else if (M == M_RD) {
            up = 0;
        } else { /* M_RO */
            up = !hi_rank_even;
        }
        /* the index and its value side by side: selects, not one more gather */
        int64_t idx = jj + up;
        double y = up ? hi : lo;
        idx = exact ? j : idx;
        y = exact ? vj : y;
        idx = below ? 0 : idx;
        y = below ? first : y;
        idx = above ? size - 1 : idx;
        y = above ? top : y;
        int64_t to_zero = idx == zero_sat; /* underflow="saturate": nonzero inputs leave zero */
        y = (to_zero & (v > 0.0)) ? v_above_zero : y;
        y = (to_zero & (v < 0.0)) ? v_below_zero : y;
        yout[i] = table_finish(y, v, nan, signed_zero);
    }
}

/* The choice for the stochastic modes, between neighbours lo and hi as the lookup
   gives them (tablelut.neighbour_lut; table_sr_neighbours for searched inputs): x in [lo, hi), except
   where the result does not depend on the draw, which then has lo == hi: below the table (the
   first value), from the top value on (the top value), and next to zero under
   underflow="saturate" (the nonzero neighbour). So x is a table value iff x == lo, and the result
   is lo or hi, NaN where due, with the sign of x if zero and signed_zero. */
typedef struct {
    double inf_is_nan, neg_nan, signed_zero;
    uint64_t base;
    double two_r;
} table_srk;

/* the probability's denominator, as anynum.kernels.table._away_probability has it (scale 0.5
   beyond 2**1000: never for float32 numbers, WIDE = 0) */
ANY_INLINE double table_sr_den(double lo, double hi, const int WIDE) {
    int64_t big = WIDE ? (fabs(lo) > 0x1p1000) | (fabs(hi) > 0x1p1000) : 0;
    double scale = big ? 0.5 : 1.0;
    double den = hi * scale - lo * scale;
    return den > 0.0 ? den : 1.0;
}

ANY_INLINE double table_sr_choose(double v, double xs, double lo, double hi, const int M, const int WIDE,
                                  const int DIV, const table_srk *k, uint64_t draw, int *u) {
    int64_t nan = table_nan(v, xs, k->inf_is_nan, k->neg_nan);
    int64_t negative = hi <= 0.0;
    int64_t away;
    if (M == M_SRU) {
        away = (int64_t)draw;
    } else {
        /* _away_probability on the magnitudes: (-xs) - (-hi) is hi - xs, bit for bit */
        int64_t big = WIDE ? (fabs(lo) > 0x1p1000) | (fabs(hi) > 0x1p1000) : 0;
        double scale = big ? 0.5 : 1.0;
        double xsc = xs * scale, losc = lo * scale, hisc = hi * scale;
        double num = negative ? hisc - xsc : xsc - losc;
        double den = table_sr_den(lo, hi, WIDE);
        /* DIV = 0 where every den is a power of two with a normal reciprocal (tablelut.TableLut.pow2:
           the spacings of tables built from formats): num * (1 / den), 1 / den from den's exponent
           bits, is then num / den bit for bit (both are the exact quotient rounded once), and a
           vector division is the slowest instruction of the loop */
        double p = DIV ? num / den : num * f64_from((2046 - (f64_bits(den) >> 52)) << 52);
        /* clamped to [0, 1) on the bits (negative doubles read as negative integers): as selects on
           doubles, GCC threads the clamp into the random draw and then cannot vectorise */
        int64_t b = (int64_t)f64_bits(p);
        b = b < 0 ? 0 : b;
        b = b > 0x3FEFFFFFFFFFFFFFll ? 0x3FEFFFFFFFFFFFFFll : b;
        p = f64_from((uint64_t)b);
        if (M == M_SR) away = sr_exact_up(p, draw, u);
        else away = sr_trunc_up(p, draw, k->two_r);
    }
    double y = (away ^ negative) ? hi : lo;
    y = xs == lo ? lo : y; /* x on the table: in a negative interval p = 1 - 2**-53 may go either way */
    return table_finish(y, xs, nan, k->signed_zero);
}

/* lo and hi of position j for input xs, as neighbour_lut has them */
ANY_INLINE void table_sr_neighbours(const any_table *t, int64_t j, double xs, double *lo, double *hi) {
    const double *vals = t->values;
    const int64_t size = t->size;
    int64_t jj = j < 0 ? 0 : (j > size - 2 ? size - 2 : j);
    double l = vals[jj], h = vals[jj + 1];
    l = j < 0 ? vals[0] : (j >= size - 1 ? vals[size - 1] : l);
    h = j < 0 ? vals[0] : (j >= size - 1 ? vals[size - 1] : h);
    if (t->underflow_saturate && t->zero_index >= 0) {
        l = (l == 0.0) & (xs > 0.0) ? h : l;
        h = (h == 0.0) & (xs < 0.0) ? l : h;
    }
    *lo = l;
    *hi = h;
}

/* Round to nearest on a small table: the index is the number of boundaries x has passed (a tie
   passes when the policy sends it up, for x's sign), one compare pair per boundary and element,
   no search and one gather. Below, above and on table values come out right by themselves. */
ANY_INLINE void table_nearest_small(const double *xin, double *yout, int64_t n, const any_table *t,
                                    int ties) {
    const double *vals = t->values;
    const int64_t size = t->size;
    int64_t tie_pos[TABLE_LINEAR], tie_neg[TABLE_LINEAR];
    for (int64_t k = 0; k + 1 < size; k++) { /* does a tie at boundary k go up, for x >= 0 / x < 0 */
        int64_t hre = ((k + 1 - t->first_nonneg) & 1) == 0, be = t->bound_exact[k] != 0;
        double lo = vals[k], hi = vals[k + 1];
        int64_t p, q;
        if (ties >= 2) p = q = ties == 2 ? hre : ties == 4;
        else {
            double alo = fabs(lo), ahi = fabs(hi);
            int64_t bigger = ties == 0 ? (ahi < alo) : (ahi > alo);
            p = alo == ahi ? 1 : bigger;
            q = alo == ahi ? 0 : bigger;
        }
        tie_pos[k] = be & p;
        tie_neg[k] = be & q;
    }
    int64_t idx[TABLE_TILE];
    double xs[TABLE_TILE];
    for (int64_t i = 0; i < n; i++) {
        double x = xin[i];
        xs[i] = x != x ? 0.0 : x;
        idx[i] = 0;
    }
    for (int64_t k = 0; k + 1 < size; k++) {
        const double bk = t->bound[k];
        const int64_t tp = tie_pos[k], tn = tie_neg[k];
        for (int64_t i = 0; i < n; i++) {
            double v = xs[i];
            int64_t tie = (f64_bits(v) >> 63) ? tn : tp;
            idx[i] += (v > bk) | ((v == bk) & tie);
        }
    }
    const int64_t zero_sat = t->underflow_saturate ? t->zero_index : -1;
    const int64_t above_zero = zero_sat + 1 < size ? zero_sat + 1 : zero_sat;
    const int64_t below_zero = zero_sat >= 1 ? zero_sat - 1 : zero_sat;
    const double inf_is_nan = t->infinity_nan ? INFINITY : NAN;
    const double neg_nan = t->negative_nan ? 0.0 : -INFINITY;
    const double signed_zero = t->signed_zero ? 1.0 : 0.0;
    double yt[TABLE_TILE];
    for (int64_t i = 0; i < n; i++) {
        double x = xin[i], v = xs[i];
        int64_t j = idx[i];
        int64_t to_zero = j == zero_sat; /* underflow="saturate": nonzero inputs leave zero */
        j = (to_zero & (v > 0.0)) ? above_zero : j;
        j = (to_zero & (v < 0.0)) ? below_zero : j;
        yt[i] = table_finish(vals[j], v, table_nan(x, v, inf_is_nan, neg_nan), signed_zero);
    }
    memcpy(yout, yt, (size_t)n * sizeof(double));
}

/* pos: j with vals[j] <= x < vals[j + 1] (-1 below the table), for n <= TABLE_TILE inputs xs (NaN
   read as 0). x's bucket (sign, clamped exponent, top fraction bits: cparams._table_index) bounds
   it to [bucket_lo, bucket_hi]; the largest j there with vals[j] <= x is then found by steps of
   top_step, top_step / 2, ..., 1 (each a loop of gathers), which reach every offset up to the
   widest bucket's range */
ANY_INLINE void table_search(const double *xs, int64_t *pos, int64_t n, const any_table *t) {
    const double *vals = t->values;
    int64_t phi[TABLE_TILE];
    const int64_t e_lo = t->e_lo, e_hi = t->e_hi, mbits = t->mbits, ncodes = t->ncodes;
    const int64_t tmask = ((int64_t)1 << mbits) - 1;
    const int64_t *blo = t->bucket_lo, *bhi = t->bucket_hi;
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = f64_bits(xs[i]);
        int64_t e = (int64_t)((u >> 52) & 0x7FF), top = (int64_t)(u >> (52 - mbits)) & tmask;
        int64_t code = e < e_lo ? 0 : (e > e_hi ? ncodes - 1 : 1 + (((e - e_lo) << mbits) | top));
        int64_t b = (u >> 63) ? ncodes - 1 - code : ncodes + code;
        pos[i] = blo[b];
        phi[i] = bhi[b];
    }
    for (int64_t step = t->top_step; step > 0; step >>= 1) {
        for (int64_t i = 0; i < n; i++) {
            int64_t j = pos[i] + step, h = phi[i];
            int64_t jj = j < h ? j : h;
            jj = jj < 0 ? 0 : jj;
            pos[i] = ((j <= h) & (vals[jj] <= xs[i])) ? j : pos[i];
        }
    }
}

ANY_INLINE void table_tile(const double *xin, double *yout, int64_t n, const any_table *t, const int M) {
    if ((M == M_RNE || M == M_RNA || M == M_RNZ) && t->size <= TABLE_LINEAR && t->size > 1) {
        table_nearest_small(xin, yout, n, t, M == M_RNE ? t->ties : (M == M_RNA ? 1 : 0));
        return;
    }
    const double *vals = t->values;
    const int64_t size = t->size;
    int64_t pos[TABLE_TILE], be_t[TABLE_TILE];
    double xs[TABLE_TILE], xo[TABLE_TILE], yt[TABLE_TILE], lo_t[TABLE_TILE], hi_t[TABLE_TILE], fb_t[TABLE_TILE];
    for (int64_t i = 0; i < n; i++) {
        double x = xin[i];
        xo[i] = x;
        xs[i] = x != x ? 0.0 : x;
        pos[i] = 0;
    }
    if (size == 1) {
        const double inf_is_nan = t->infinity_nan ? INFINITY : NAN;
        const double neg_nan = t->negative_nan ? 0.0 : -INFINITY;
        const double signed_zero = t->signed_zero ? 1.0 : 0.0;
        for (int64_t i = 0; i < n; i++)
            yout[i] = table_finish(vals[0], xs[i], table_nan(xo[i], xs[i], inf_is_nan, neg_nan), signed_zero);
        return;
    }
    table_search(xs, pos, n, t);
    /* the neighbours (and boundary) of each element, gathered in loops of their own: inside the
       choice GCC turns them into conditional (masked) gathers, which it cannot vectorise */
    for (int64_t i = 0; i < n; i++) {
        int64_t j = pos[i];
        int64_t jj = j < 0 ? 0 : (j > size - 2 ? size - 2 : j);
        lo_t[i] = vals[jj];
        hi_t[i] = vals[jj + 1];
    }
    if (M == M_RNE || M == M_RNA || M == M_RNZ || M == M_RZ) {
        const double *bound = t->bound;
        const int64_t *bound_exact = t->bound_exact;
        for (int64_t i = 0; i < n; i++) {
            int64_t j = pos[i];
            int64_t jj = j < 0 ? 0 : (j > size - 2 ? size - 2 : j);
            fb_t[i] = bound[jj];
            be_t[i] = bound_exact[jj];
        }
    }
    /* the tie policy of "nearest" as a constant of the loop; the other modes have their own */
    int ties = M == M_RNE ? t->ties : (M == M_RNA ? 1 : 0);
    switch (ties) {
    case 1: table_choose(xo, xs, pos, lo_t, hi_t, fb_t, be_t, yt, n, t, M, 1); break;
    case 2: table_choose(xo, xs, pos, lo_t, hi_t, fb_t, be_t, yt, n, t, M, 2); break;
    case 3: table_choose(xo, xs, pos, lo_t, hi_t, fb_t, be_t, yt, n, t, M, 3); break;
    case 4: table_choose(xo, xs, pos, lo_t, hi_t, fb_t, be_t, yt, n, t, M, 4); break;
    default: table_choose(xo, xs, pos, lo_t, hi_t, fb_t, be_t, yt, n, t, M, 0); break;
    }
    memcpy(yout, yt, (size_t)n * sizeof(double));
}
