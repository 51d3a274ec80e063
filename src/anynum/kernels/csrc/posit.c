/* Template (see scalar.c): posits, anynum.formats.posit.Posit.locate and the eager kernel
 * anynum.kernels.posit._round_posit, operation for operation, in W with WI integers. */

#define SHLW(v, s) ((WI)((WU)(v) << (s)))

typedef struct {
    W maxpos, minpos;
    W lift_below; /* 2**emin of W where subnormal inputs must be lifted (Posit.locate), else 0 */
    W floor_mag;  /* minpos (nothing nonzero rounds to 0), or 0 with underflow="zero" */
    WI n, es, scale_exp;
    WU one; /* 1, read from the parameters: GCC 12 does not vectorise 64-bit `1 << v`, but `one << v` */
} SFX(posit_k);

ANY_INLINE SFX(posit_k) SFX(posit_consts)(const any_posit *p) {
    SFX(posit_k) k;
    k.maxpos = (W)p->maxpos;
    k.minpos = (W)p->minpos;
    k.n = p->n;
    k.es = p->es;
    k.scale_exp = p->scale_exp;
    k.lift_below = p->lift ? W_EMIN_VAL : (W)0;
    k.floor_mag = p->underflow_zero ? (W)0 : k.minpos;
    k.one = (WU)p->one;
    return k;
}

ANY_INLINE W SFX(posit_round)(W x, const SFX(posit_k) *k, const int M, uint64_t draw, int rbits,
                               double two_r, int *und) {
    const WI n = k->n, es = k->es;
    W a = FABSW(x);
    int finite = a < (W)INFINITY;
    W as = (finite & (a > (W)0)) ? a : (W)1;

    /* locate: the posit bit string of `as` after the regime is z = e << MAN | mantissa */
    int tiny = as < k->lift_below; /* lift subnormals so their exponent reads right */
    W al = tiny ? as * W_LIFT : as;
    WI b = (WI)SFX(bits)(al);
    WI big_e = (b >> W_MAN) - W_BIAS - (tiny ? (WI)W_LIFT_BITS : (WI)0);
    WI mant = b & (WI)W_MANMASK;
    big_e = big_e + k->scale_exp;
    WI kk = big_e >> es; /* floor division by 2**es */
    WI z = SHLW(big_e & (SHLW(1, es) - 1), W_MAN) | mant;
    int over = kk >= n - 2;
    int under = kk <= -(n - 1);
    WI kc = kk < -(n - 2) ? -(n - 2) : kk;
    kc = kc > n - 3 ? n - 3 : kc;
    WI m = kc >= 0 ? n - 3 - kc : n - 2 + kc;  /* bits kept after the regime */
    WI p = es + W_MAN - m;                      /* dropped bits of z */
    WI pc = p < 0 ? 0 : p;
    WI kept = z >> pc;
    WI step = SHLW(k->one, pc);
    WI dropped = z - SHLW(kept, pc);
    /* the last kept bit: of z, a padding zero (p < 0), or the regime's final bit (1 for k < 0);
       integer arithmetic, not booleans, which GCC does not vectorise here */
    const int top_bit = 8 * (int)sizeof(WI) - 1;
    WI parity = m == 0 ? (WI)((WU)kc >> top_bit) : ((kept & 1) & ~(p >> top_bit));
    WI basebits = SHLW(kc * SHLW(1, es) + (W_BIAS - k->scale_exp), W_MAN);
    WI lo_bits = basebits + SHLW(kept, pc);
    W lo = SFX(from)((WU)lo_bits);
    lo = under ? (W)0 : lo;
    lo = over ? k->maxpos : lo;
    W hi = SFX(from)((WU)(lo_bits + step));
    hi = under ? k->minpos : hi;
    hi = over ? k->maxpos : hi;
    WI depth = -kk - (n - 2);
    dropped = over ? (WI)0 : dropped;
    dropped = under ? SHLW(1, es + W_MAN) + z : dropped;
    WI dlen = under ? es + W_MAN + depth : pc;
    int uniform = (p <= W_MAN) & !under & !over;
    parity = under ? 0 : parity;

    int neg = x < (W)0;
    int up;
    if (M == M_SR || M == M_SRT) {
        if (M == M_SR) { /* value_position: linear in the value */
            double a64 = (double)as, lo64 = (double)lo, hi64 = (double)hi;
            double gap = hi64 - lo64;
            double ratio = (a64 - lo64) / (gap > 0.0 ? gap : 1.0);
            int64_t len = dlen > 62 ? 62 : (int64_t)dlen;
            double exact = (double)dropped * f64_from((uint64_t)(1023 - len) << 52);
            double pr = (uniform & !under) ? exact : ratio;
            /* clamp(pr, 0, 1 - 2**-53); pr >= 0 already (lo <= a), and the upper clamp is taken on
               the bits: as a select on doubles GCC threads it into the random draw and gives up */
            uint64_t pbits = f64_bits(pr);
            pbits = pbits > 0x3FEFFFFFFFFFFFFFull ? 0x3FEFFFFFFFFFFFFFull : pbits;
            pr = f64_from(pbits);
            up = sr_exact_up(pr, draw, und);
        } else { /* frac_truncated: the first rbits dropped bits */
            int64_t d = (int64_t)dropped, len = (int64_t)dlen;
            int64_t ush = rbits - len, dsh = len - rbits;
            ush = ush < 0 ? 0 : (ush > 62 ? 62 : ush);
            dsh = dsh < 0 ? 0 : (dsh > 62 ? 62 : dsh);
            int64_t kept_r = (int64_t)((uint64_t)d << ush) >> dsh;
            double pr = (double)kept_r * (1.0 / two_r);
            up = sr_trunc_up(pr, draw, two_r);
        }
    } else {
        /* frac_class: 0, 1/4, 1/2, 3/4 as the dropped bits are zero, below, at, above the tie */
        const WI top = (WI)(8 * sizeof(WI) - 2);
        WI shift = dlen - 1 < 0 ? 0 : dlen - 1;
        shift = shift > top ? top : shift;
        WI half = dlen > 0 ? SHLW(k->one, shift) : 0;
        /* counted, not selected: chains of selects here get jump-threaded into branches */
        WI nonzero = dropped != 0;
        W cls = (W)(nonzero + (nonzero & (dropped >= half)) + (dropped > half)) * (W)0.25;
        if (M == M_SRU) {
            up = (cls > (W)0) & (int)draw;
        } else if (M == M_RU || M == M_RD) {
            up = (cls > (W)0) & (M == M_RU ? !neg : neg);
        } else { /* nearest (three tie rules), toward zero, odd: on the magnitude's code */
            W par = (W)(WI)parity;
            W r = SFX(round_scaled)(par + cls, M, draw, two_r, und);
            up = (r - par) > (W)0;
        }
    }
    W mag = up ? hi : lo;
    mag = mag < k->floor_mag ? k->floor_mag : mag;
    W y = ((a == (W)0) | (mag == (W)0)) ? (W)0 : (neg ? -mag : mag);
    return finite ? y : (W)NAN;
}

/* The fast path (anynum.kernels.positparams): where every posit value is a normal W, the bits
 * dropped at a binade of W depend on its exponent alone, and the neighbours and the tie follow from
 * the input's bits without the regime's clamps and selects. Every mode but SR with rand_bits under
 * underflow="zero", which reads the dropped bits below minpos (the general loop). Integers in WI
 * lanes: mixing int flags into them stops the vectoriser. */
typedef struct {
    WI zoff, zmask, min_bits, max_bits, tie_bits, floor_bits, eoff, kmin, pc0, pcmax, under_pc;
    W minpos, maxpos;
    int es;
    WU one;
} SFX(positfast_k);

ANY_INLINE SFX(positfast_k) SFX(positfast_consts)(const any_posit *p) {
    SFX(positfast_k) k;
    k.zoff = (WI)p->zoff;
    k.zmask = (WI)p->zmask;
    k.min_bits = (WI)p->min_bits;
    k.max_bits = (WI)p->max_bits;
    k.tie_bits = (WI)p->tie_bits;
    k.floor_bits = p->underflow_zero ? (WI)0 : k.min_bits;
    k.under_pc = p->underflow_zero ? W_MAN + 1 : 0; /* below minpos, the ratio is needed */
    k.eoff = (WI)p->scale_exp - W_BIAS;
    k.kmin = -(WI)(p->n - 2);
    k.pc0 = (WI)p->es + W_MAN - (WI)(p->n - 3); /* dropped bits at k = 0 */
    k.pcmax = (WI)p->es + W_MAN;
    k.minpos = (W)p->minpos;
    k.maxpos = (W)p->maxpos;
    k.es = p->es;
    k.one = (WU)p->one;
    return k;
}

/* GEOM = 0 (exact SR only): the position is the exact dropped / 2**pc everywhere, and *need is
   set where that is wrong, so the caller redoes those inputs with GEOM = 1 (loops.c) */
ANY_INLINE W SFX(positfast_round)(W x, const SFX(positfast_k) *k, const int M, const int GEOM,
                                   uint64_t draw, int rbits, double two_r, int *und, int *need) {
    const int top_bit = 8 * (int)sizeof(WI) - 1;
    const WI absmask = (WI)(~(WU)0 >> 1), inf_bits = (WI)SFX(bits)((W)INFINITY);
    WI xb = (WI)SFX(bits)(x);
    WI b = xb & absmask;
    WI neg = x < (W)0; /* -0 and NaN are not negative */
    /* bits kept after the regime of k: n - 3 - k (k >= 0), n - 3 - (-k - 1) (k < 0); none left
       (pc > es + M) is beyond maxpos or below minpos, where nothing is dropped: the comparisons
       with maxpos and minpos below settle those, and inf, NaN and subnormals with them */
    WI kr = ((b >> W_MAN) + k->eoff) >> k->es;
    WI pc = k->pc0 + (kr ^ (kr >> top_bit));
    pc = pc < 0 ? 0 : pc;
    pc = pc > k->pcmax ? 0 : pc;
    /* the bit string after the regime (the sum wraps for NaN patterns: in unsigned arithmetic,
       where wrapping is defined; those inputs become NaN below) */
    WI z = (WI)(((WU)b + (WU)k->zoff) & (WU)k->zmask);
    WI step = SHLW(k->one, pc);
    WI dropped = z & (step - 1);
    WI lo = b - dropped;
    /* the lower neighbour's last bit: of z, or the regime's final 1 in minpos's regime, where
       nothing follows it (a padding zero, p < 0, drops nothing and never decides) */
    WI parity = ((z >> pc) | (kr == k->kmin)) & 1;
    WI under = b < k->min_bits;
    WI inexact = under | (dropped != 0);
    /* nearest: twice the dropped bits against the step, so nothing dropped never rounds up */
    WI up;
    if (M == M_RNE) up = under ? (b > k->tie_bits) : (dropped + dropped + parity > step);
    else if (M == M_RNA) up = under ? (b >= k->tie_bits) : (dropped + dropped >= step);
    else if (M == M_RNZ) up = under ? (b > k->tie_bits) : (dropped + dropped > step);
    else if (M == M_RZ) up = 0;
    else if (M == M_RU) up = inexact & (neg ^ 1);
    else if (M == M_RD) up = inexact & neg;
    else if (M == M_RO) up = under | (inexact & (parity ^ 1));
    else if (M == M_SRU) up = inexact & (WI)draw;
    else if (M == M_SR && !GEOM) {
        /* sr_exact_up of dropped / 2**pc on integers, draw holding the first W_MAN of its 53 bits:
           for pc <= W_MAN, t = dropped * 2**(53 - pc) is an integer and a multiple of 2**(53 -
           W_MAN), so the draw is never undecided, and draw53 < t iff draw < dropped * 2**(W_MAN -
           pc), in W's integer lanes (pc > W_MAN sets *need: those runs are redrawn on 53 bits and
           redone; the shift's clamp only keeps it defined) */
        WI sh = W_MAN - pc;
        sh = sh < 0 ? 0 : sh;
        up = (WU)draw < ((WU)dropped << sh);
        /* one comparison: with two GCC finds no vector type */
        *need = (int)((under ? k->under_pc : pc) > W_MAN);
    } else if (M == M_SR) { /* value_position, as posit_round computes it */
        WI over = b >= k->max_bits;
        W lo_w = SFX(from)((WU)lo), hi_w = SFX(from)((WU)(lo + step));
        lo_w = under ? (W)0 : (over ? k->maxpos : lo_w);
        hi_w = under ? k->minpos : (over ? k->maxpos : hi_w);
        double a64 = (double)SFX(from)((WU)b), lo64 = (double)lo_w, hi64 = (double)hi_w;
        double gap = hi64 - lo64;
        double ratio = (a64 - lo64) / (gap > 0.0 ? gap : 1.0);
        double exact = (double)dropped * f64_from((uint64_t)(1023 - (int64_t)pc) << 52);
        /* two selects: one on the combined flag leaves GCC without a vector type */
        double pr = pc <= W_MAN ? exact : ratio;
        pr = (under | over) ? ratio : pr;
        uint64_t pbits = f64_bits(pr);
        pbits = pbits > 0x3FEFFFFFFFFFFFFFull ? 0x3FEFFFFFFFFFFFFFull : pbits;
        up = sr_exact_up(f64_from(pbits), draw, und);
    } else { /* frac_truncated; below minpos the result is minpos whatever the draw (drive.c) */
        int64_t d = (int64_t)dropped, len = (int64_t)pc;
        int64_t ush = rbits - len, dsh = len - rbits;
        ush = ush < 0 ? 0 : (ush > 62 ? 62 : ush);
        dsh = dsh < 0 ? 0 : (dsh > 62 ? 62 : dsh);
        uint64_t kept_r = ((uint64_t)d << ush) >> dsh; /* the first rbits dropped bits */
        /* sr_trunc_up in integers: kept_r and the draw are below 2**rbits <= 2**52, so the
           float64 floor, scaling and sum there are exact */
        up = kept_r + draw >= (uint64_t)two_r;
    }
    /* up as a lane mask: with selects on the flag GCC moved the masks through scalar registers */
    const WI upm = -(WI)(up != 0);
    WI mag = under ? (upm & k->min_bits) : lo + (upm & step);
    mag = mag < k->floor_bits ? k->floor_bits : mag;
    mag = mag > k->max_bits ? k->max_bits : mag;
    WI y = ((b == 0) | (mag == 0)) ? 0 : (mag | (xb & ~absmask));
    return b >= inf_bits ? (W)NAN : SFX(from)((WU)y);
}

#undef SHLW
