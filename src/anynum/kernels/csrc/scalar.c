/* Template, pasted once per working type W (float: SFX _f32, double: SFX _f64) with
 *   W, WI (signed int of W's width), WU (unsigned), W_MAN (fraction bits), W_BIAS,
 *   W_EXPMASK, W_MANMASK, W_EMIN_VAL (2**emin), W_TINY (smallest subnormal), W_LIFT (2**(man+2)),
 *   W_LIFT_BITS (man+2), W_RECIP_MAGIC, FLOORW, CEILW, TRUNCW, RINTW, FABSW, COPYSIGNW.
 *
 * round_scaled: anynum.rounding.round_scaled, the one rule per mode on scaled values.
 * float_round / uniform_round: the eager kernels _round_float and _round_uniform.
 */

ANY_INLINE WU SFX(bits)(W v) { WU u; memcpy(&u, &v, sizeof u); return u; }
ANY_INLINE W SFX(from)(WU u) { W v; memcpy(&v, &u, sizeof v); return v; }

/* Round scaled values to integers (in W) under mode M; NaN and +-inf pass through. */
ANY_INLINE W SFX(round_scaled)(W s, const int M, uint64_t draw, double two_r, int *und) {
    if (M == M_RNE) return RINTW(s);
    if (M == M_RZ) return TRUNCW(s);
    if (M == M_RU) return CEILW(s);
    if (M == M_RD) return FLOORW(s);
    /* the other modes decide on the magnitude, where a - floor(a) is exact */
    W a = FABSW(s);
    W lo = FLOORW(a);
    W f = a - lo;
    int away;
    if (M == M_RNA) away = f >= (W)0.5;
    else if (M == M_RNZ) away = f > (W)0.5;
    else if (M == M_RO) away = (f > (W)0) & (lo * (W)0.5 == FLOORW(lo * (W)0.5));
    else if (M == M_SR) away = sr_exact_up((double)f, draw, und);
    else if (M == M_SR31) { /* t = f * 2**31 an integer: draw53 < t * 2**22 is draw53 >> 22 < t */
        W t = f * (W)0x1p31;
        away = (int32_t)(uint32_t)draw < (int32_t)(t < (W)0x1p31 ? t : (W)0); /* (NaN f: 0) */
    }
    else if (M == M_SRT) away = sr_trunc_up((double)f, draw, two_r);
    else away = (f > (W)0) & (int)draw;
    return COPYSIGNW(lo + (away ? (W)1 : (W)0), s);
}

/* --- FloatFormat ----------------------------------------------------------------------------- */

/* The format's flags as working-type constants, so that the element code is selects and
   arithmetic on W only (mixing int flags into the selects stops GCC's vectoriser). */
typedef struct {
    W step_scale, step_min, smallest_normal, limit, far;
    W lift_below; /* 2**emin of W when the format's binades continue below W's normal range, else 0 */
    W flush_below; /* the smallest normal when subnormals flush, else 0 */
    W zero_fill;   /* what a zero result becomes (with x's sign): 0, or the smallest normal (no zero) */
    W zero_add;    /* -0.0 keeps -0, +0.0 turns it into +0 (formats without -0) */
    W neg_mul;     /* 1, or NaN for unsigned formats (negative inputs have no value) */
    WU sign_keep;  /* all ones, or everything but the sign bit for unsigned formats */
} SFX(float_k);

ANY_INLINE SFX(float_k) SFX(float_consts)(const any_float *p) {
    SFX(float_k) k;
    k.step_scale = (W)p->step_scale;
    k.step_min = (W)p->step_min;
    k.smallest_normal = (W)p->smallest_normal;
    k.limit = (W)p->limit;
    /* where an overflowing result goes when it goes past max: inf, or NaN standing for it */
    k.far = p->overflow == 0 ? k.limit : (p->overflow == 2 ? (W)NAN : (W)INFINITY);
    k.lift_below = p->lift_tiny ? W_EMIN_VAL : (W)0;
    k.flush_below = p->flush ? k.smallest_normal : (W)0;
    k.zero_fill = p->zero ? (W)0 : k.smallest_normal;
    k.zero_add = p->negative_zero ? (W)-0.0 : (W)0.0;
    k.neg_mul = p->is_signed ? (W)1 : (W)NAN;
    k.sign_keep = p->is_signed ? ~(WU)0 : ~((WU)1 << (8 * sizeof(W) - 1));
    return k;
}

/* 2**floor(log2 a) for normal a (a with its fraction bits cleared); 0 for zero and subnormals */
ANY_INLINE W SFX(binade)(W a) { return SFX(from)(SFX(bits)(a) & W_EXPMASK); }

/* 1/step from the bits of a normal power of two whose reciprocal is normal: exact, and a
   multiply by it rounds like the division (both round the same exact quotient) */
ANY_INLINE W SFX(reciprocal)(W step) { return SFX(from)(W_RECIP_MAGIC - SFX(bits)(step)); }

/* anynum.kernels.eager.float_grid_step */
ANY_INLINE W SFX(grid_step)(W a, const SFX(float_k) *k) {
    W binade = SFX(binade)(a);
    W tiny_binade = SFX(binade)(a * W_LIFT) / W_LIFT;
    binade = a < k->lift_below ? tiny_binade : binade;
    W step = binade * k->step_scale;
    step = step < k->step_min ? k->step_min : step;
    return a < k->flush_below ? k->smallest_normal : step;
}

/* COMMON: the format is signed and has a zero (fewer selects: GCC vectorises that loop);
   RECIP: every step's reciprocal is an exact normal number. */
ANY_INLINE W SFX(float_round)(W x, const SFX(float_k) *k, const int M, const int COMMON,
                               const int RECIP, uint64_t draw, double two_r, int *und) {
    W ax = FABSW(x);
    W step = SFX(grid_step)(ax, k);
    W s = RECIP ? x * SFX(reciprocal)(step) : x / step;
    W r = SFX(round_scaled)(s, M, draw, two_r, und);
    int x_inf = ax == (W)INFINITY;
    /* apply_overflow: where an overflowing result goes past max (inf, or NaN standing for it) */
    int beyond = (M == M_RZ || M == M_RO) ? x_inf
                 : M == M_RU              ? (x_inf | (x > (W)0))
                 : M == M_RD              ? (x_inf | (x < (W)0))
                                          : 1;
    W y = x_inf ? x : r * step;
    y = COPYSIGNW(y, x); /* keeps -0 for negatives rounded to zero */
    if (!COMMON) y = y == (W)0 ? COPYSIGNW(k->zero_fill, x) : y;
    W a = FABSW(y);
    a = a > k->limit ? (beyond ? k->far : k->limit) : a;
    y = COPYSIGNW(a, y);
    y = y + k->zero_add;
    if (!COMMON) y = x < (W)0 ? y * k->neg_mul : SFX(from)(SFX(bits)(y) & k->sign_keep);
    return y;
}

/* Every mode (the deterministic ones, SR with and without rand_bits, sr_uniform's coin: up where
   anything is dropped and the draw's bit is set) where cparams.float_on_bits holds. A normal
   input is rounded on its bits: its magnitude, read as an integer, gets the mode's increment
   (nearest-even: half a unit less one plus the kept lowest bit; nearest-away: half a unit; ties
   toward zero: half a unit less one; away from zero for ru on positives and rd on negatives: a
   unit less one; else nothing) and loses the dropped bits, a carry running into the exponent as
   the value does; round-to-odd truncates and sets the lowest kept bit where a dropped one was
   set. Below the format's smallest normal the step is fixed: x / step in the working type (two
   exact multiplies by powers of two), the mode's rule, times the step; round-to-odd and SR work
   on the magnitude, and SR compares the draw with t = f * 2**53 itself (undecided where
   draw < t < draw + 1) or f * 2**r with 2**r - draw, no floors. (That branch on the bits too, the
   significand shifted per lane by its own count of dropped bits, vectorised but took some 44
   vector instructions per 16 float32 elements against 25 and ran slower in every mode: the float
   rule stays; docs/speed.md.) Then float_round's overflow rule; NaN stays NaN. */
typedef struct {
    W limit, far, smallest_normal, inv_a, inv_b, step, zero_add; /* 1/step = inv_a * inv_b */
    WU half, low;
    int drop;
} SFX(bits_k);

ANY_INLINE SFX(bits_k) SFX(bits_consts)(const any_float *p) {
    SFX(bits_k) k;
    SFX(float_k) f = SFX(float_consts)(p);
    int e;
    frexp(p->step_scale, &e); /* step_scale = 2**-man = 0.5 * 2**(1 - man) */
    k.drop = W_MAN - (1 - e);
    k.half = (WU)1 << (k.drop - 1);
    k.low = ((WU)1 << k.drop) - 1;
    k.limit = f.limit;
    k.far = f.far;
    k.smallest_normal = f.smallest_normal;
    k.step = (W)p->step_min; /* the subnormal step 2**(emin - man), unclamped (float_on_bits) */
    frexp(p->step_min, &e);
    int up = 1 - e; /* 1 / step = 2**up, in two factors: bf16's 2**133 is beyond float32 */
    k.inv_a = (W)ldexp(1.0, up / 2);
    k.inv_b = (W)ldexp(1.0, up - up / 2);
    k.zero_add = f.zero_add;
    return k;
}

/* the SR modes' draw: counter_bits(base, index, 53) for exact SR, rand_bits of them for SRT */
ANY_INLINE W SFX(float_bits)(W x, const SFX(bits_k) *k, const int M, const int NORMAL, uint64_t draw,
                              int rbits, double two_r, int *und) {
    WU b = SFX(bits)(x);
    WU neg = b >> (8 * sizeof(W) - 1);
    WU dropped = b & k->low;
    WU add = M == M_RNE  ? k->half - 1 + ((b >> k->drop) & 1)
             : M == M_RNA ? k->half
             : M == M_RNZ ? k->half - 1
             : M == M_RU  ? (neg ? 0 : k->low)
             : M == M_RD  ? (neg ? k->low : 0)
                          : 0;
    WU r = (b + add) & ~k->low;
    if (M == M_RO) r |= (dropped != 0 ? k->low + 1 : 0);
    if (M == M_SR || M == M_SRT) {
        /* a normal input's fraction is dropped / 2**drop, so exact SR's comparison with 53
           random bits is on integers and never undecided: draw < dropped * 2**(53 - drop). That
           is draw >> (53 - drop) < dropped, and the draw's top drop bits are counter_bits(..,
           drop): the loops hand a run of normal inputs (NORMAL) those alone, a run holding a
           subnormal one the 53 both branches use. */
        uint64_t d = (uint64_t)dropped;
        int up;
        /* a normal draw has drop bits: compared in W's lanes, not widened to 64 */
        if (M == M_SR) up = NORMAL ? (WU)draw < dropped : draw < (d << (53 - k->drop));
        else up = (rbits <= k->drop ? d >> (k->drop - rbits) : d << (rbits - k->drop)) + draw >= (uint64_t)two_r;
        r = (b & ~k->low) + (up ? k->low + 1 : 0);
    }
    if (M == M_SRU) r = (b & ~k->low) + (((dropped != 0) & (int)draw) ? k->low + 1 : 0); /* the coin */
    W ax = FABSW(x);
    W y = SFX(from)(r);
    if (!NORMAL) { /* the format's subnormal binade: one step, x / step scaled exactly */
        W sub;
        if (M == M_SR || M == M_SRT) { /* on the magnitude: the common tail gives x's sign */
            W a = ax * k->inv_a * k->inv_b;
            W lo = FLOORW(a);
            W fw = a - lo; /* the fraction f, exact, and so are its scalings by powers of two */
            double kd = (double)(int64_t)draw;
            int away;
            if (M == M_SR) {
                /* sr_exact_up: up where draw < floor(t), t = f * 2**53, and undecided where
                   draw = floor(t) < t; so up where draw < t but for those, which are the
                   draw < t < draw + 1 (exact in float64) */
                double t = (double)(fw * (W)0x1p53);
                away = kd < t;
                *und = (ax < k->smallest_normal) & away & (t < kd + 1.0);
            } else { /* sr_trunc_up: floor(f * 2**r) + draw >= 2**r, 2**r - draw an integer */
                away = (double)(fw * (W)two_r) >= two_r - kd;
            }
            sub = (lo + (away ? (W)1 : (W)0)) * k->step;
        } else if (M == M_RO) { /* round_scaled's rule on the magnitude */
            W a = ax * k->inv_a * k->inv_b;
            W lo = FLOORW(a);
            W h = lo * (W)0.5;
            sub = (lo + ((a != lo) & (h == FLOORW(h)) ? (W)1 : (W)0)) * k->step;
        } else {
            W s = x * k->inv_a * k->inv_b;
            int u = 0;
            sub = SFX(round_scaled)(s, M, draw, 0.0, &u) * k->step; /* sr_uniform's coin; else 0 */
        }
        y = ax < k->smallest_normal ? sub : y;
    }
    int x_inf = ax == (W)INFINITY;
    int beyond = (M == M_RZ || M == M_RO) ? x_inf
                 : M == M_RU              ? (x_inf | (x > (W)0))
                 : M == M_RD              ? (x_inf | (x < (W)0))
                                          : 1;
    y = COPYSIGNW(y, x);
    W a = FABSW(y);
    a = a > k->limit ? (beyond ? k->far : k->limit) : a;
    y = COPYSIGNW(a, y);
    y = x != x ? x : y;
    return y + k->zero_add;
}

/* --- FixedPoint and IntFormat ---------------------------------------------------------------- */

typedef struct {
    W inv_step, step, tiny, code_min, code_max, modulus, inv_modulus, span, inv_span;
} SFX(uniform_k);

ANY_INLINE SFX(uniform_k) SFX(uniform_consts)(const any_uniform *p) {
    SFX(uniform_k) k;
    k.inv_step = (W)p->inv_step;
    k.step = (W)p->step;
    k.tiny = p->step_pos ? (W)p->tiny : (W)0; /* only steps above 1 can make x * 2**-step_exp vanish */
    k.code_min = (W)p->code_min;
    k.code_max = (W)p->code_max;
    k.modulus = (W)p->modulus;
    k.inv_modulus = (W)p->inv_modulus;
    k.span = (W)p->span; /* as torch converts the scalar of torch.fmod(x, span): may be inf */
    k.inv_span = (W)(1.0 / p->span);
    return k;
}

ANY_INLINE W SFX(uniform_round)(W x, const SFX(uniform_k) *k, const int M, const int WRAP,
                                 uint64_t draw, double two_r, int *und) {
    if (WRAP) {
        /* torch.fmod(x, span) first (exact; span a power of two): x - trunc(x / span) * span is
           exact too (x / span is exact from 1 up and truncates to 0 below), and the sign of a zero
           does not reach the result; an infinite span leaves x as it is */
        W xr = x - TRUNCW(x * k->inv_span) * k->span;
        x = k->span < (W)INFINITY ? xr : x;
    }
    W s = x * k->inv_step; /* exact unless it underflows (steps above 1 only) */
    /* keep inputs that vanished nonzero, so directed modes still see their side; M_SR31 runs
       where every nonzero input scales to at least 2**-8 (uniform_sr_clamp's scan): none vanishes */
    if (M != M_SR31) s = ((s == (W)0) & (x != (W)0)) ? COPYSIGNW(k->tiny, x) : s;
    W r = SFX(round_scaled)(s, M, draw, two_r, und);
    if (WRAP) {
        /* torch.fmod(r, modulus), exact for integer-valued |r| <= modulus (as above), then one
           shift by the modulus into [code_min, code_max]; NaN stays NaN */
        W w = r - TRUNCW(r * k->inv_modulus) * k->modulus;
        w = w > k->code_max ? w - k->modulus : w;
        r = w < k->code_min ? w + k->modulus : w;
    } else { /* torch.clamp: NaN stays NaN */
        r = r < k->code_min ? k->code_min : r;
        r = r > k->code_max ? k->code_max : r;
    }
    /* two's complement has no -0: -0 + +0 is +0, and every other y is itself (one add, where a
       compare and a select take two) */
    return r * k->step + (W)0.0;
}
