/* anynum native rounding kernels: shared pieces (bits, dtype conversions, random bits, parameters).
 *
 * The library is assembled by anynum.kernels.clib from the files of this directory, in the
 * order common.c, pool.c, table.c, tablegather.c, the per-family templates (scalar.c, posit.c, loops.c,
 * tablelut.c, each pasted once for float and once for double working types), blockscan.c, blockthr.c,
 * block.c, drive.c, and built by anynum.kernels.nativelib.
 *
 * Rules every kernel keeps (they are what makes the results equal the eager reference bit for
 * bit, `anynum.kernels.round_to_format` in the working dtype):
 *   - IEEE arithmetic only, in the reference's working type, operation for operation; no
 *     fast-math, no contraction into FMAs (-ffp-contract=off);
 *   - one loop per rounding mode, branch-free selects inside, so GCC and Clang vectorise;
 *   - random bits are the counter bits of anynum.rounding.counter_bits (SplitMix64 of
 *     index ^ stream base) at each element's row-major logical index.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ANY_INLINE static inline __attribute__((always_inline))
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

/* rounding modes, as numbered by anynum.kernels.cparams */
enum { M_RNE, M_RNA, M_RNZ, M_RZ, M_RU, M_RD, M_RO, M_SR, M_SRT, M_SRU, M_COUNT };
/* the loops' own mode: exact SR where every fraction f of the run is a multiple of 2**-31, decided
   on the draw's top 31 bits (round_scaled); never a call's mode */
enum { M_SR31 = M_COUNT };
/* dtypes of inputs and outputs */
enum { T_F16, T_BF16, T_F32, T_F64 };

ANY_INLINE uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
ANY_INLINE float f32_from(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
ANY_INLINE uint64_t f64_bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
ANY_INLINE double f64_from(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }

/* --- dtype conversions (exactly torch's: RNE, NaN kept as a NaN) ------------------------------ */

ANY_INLINE float half_to_float(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7FFFu);
    /* exponent and fraction moved into float position, then rebased by 2**112: exact for
       normals and subnormals alike */
    float v = f32_from(em << 13) * 0x1p112f;
    uint32_t special = 0x7F800000u | ((em & 0x3FFu) << 13);
    uint32_t u = em >= 0x7C00u ? special : f32_bits(v);
    return f32_from(u | ((uint32_t)(h & 0x8000u) << 16));
}

ANY_INLINE uint16_t float_to_half(float f) {
    /* c10's fp16_ieee_from_fp32_value: round to nearest even through float arithmetic */
    float base = (fabsf(f) * 0x1p112f) * 0x1p-110f;
    uint32_t w = f32_bits(f);
    uint32_t shl1 = w + w;
    uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1 & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = f32_from((bias >> 1) + 0x07800000u) + base;
    uint32_t b = f32_bits(base);
    uint32_t nonsign = ((b >> 13) & 0x00007C00u) + (b & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1 > 0xFF000000u ? 0x7E00u : nonsign));
}

ANY_INLINE float bf16_to_float(uint16_t h) { return f32_from((uint32_t)h << 16); }

/* the value of a dtype's bits (T_F16 .. T_F64), exact in float64 */
static double bits_value(uint64_t bits, int tdt) {
    if (tdt == T_F16) return (double)half_to_float((uint16_t)bits);
    if (tdt == T_BF16) return (double)bf16_to_float((uint16_t)bits);
    if (tdt == T_F32) return (double)f32_from((uint32_t)bits);
    return f64_from(bits);
}

ANY_INLINE uint16_t float_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t r = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
    return (uint16_t)(f != f ? 0x7FC0u : r);
}

/* --- counter-based random bits: anynum.rounding.counter_bits ------------------------------- */

/* SplitMix64's finaliser in three steps, each in place on a uint64_t or a vector of them */
#define MIX_A_MUL 0xBF58476D1CE4E5B9ull
#define MIX_A(z) z = (z ^ (z >> 30)) * MIX_A_MUL
#define MIX_B(z) z = (z ^ (z >> 27)) * 0x94D049BB133111EBull
#define MIX_C(z) z = z ^ (z >> 31)
#define MIX_G(z) z ^= 0x9E3779B97F4A7C15ull
/* counter_bits' steps in order (two finaliser rounds of index ^ base, the constant between
   them), each applied by EACH to every chain of bits at once; COUNTER_MID is all but the first
   and the last */
#define COUNTER_MID(EACH) EACH(MIX_B) EACH(MIX_C) EACH(MIX_G) EACH(MIX_A) EACH(MIX_B)
#define COUNTER_STEPS(EACH) EACH(MIX_A) COUNTER_MID(EACH) EACH(MIX_C)

ANY_INLINE uint64_t mix64(uint64_t z) {
    MIX_A(z);
    MIX_B(z);
    MIX_C(z);
    return z;
}

/* uniform in [0, 2**nbits): two SplitMix64 finaliser rounds of (index ^ base), top bits */
ANY_INLINE uint64_t counter_bits(uint64_t base, uint64_t index, int nbits) {
    uint64_t z = index ^ base;
#define ONE_CHAIN(STEP) STEP(z);
    COUNTER_STEPS(ONE_CHAIN)
#undef ONE_CHAIN
    return z >> (64 - nbits);
}

/* counter_bits(base, index0 + j * step, nbits) for j < m, 32 at a time (out must hold m rounded up
   to a multiple of 32: whole blocks are written; the callers' runs are multiples of 32),
   in four vectors of eight lanes, step by step across the four. The compiler's loop over
   counter_bits keeps about one vector's chain in flight and waits on the multiplies' latency (15
   cycles for vpmullq); four chains side by side keep the multiplier busy: 2.5 against 2.8 cycles
   an element on an Emerald Rapids core, and 2.45 against 2.95 with a decision after them
   (docs/speed.md). GCC and Clang split the vectors to the machine's width. */
typedef uint64_t any_u64x8 __attribute__((vector_size(64)));
#if defined(__AVX512F__)
#define DRAWS_OPAQUE(v) __asm__("" : "+v"(v))
#else
#define DRAWS_OPAQUE(v) (void)0
#endif
#define FOUR_CHAINS(STEP) STEP(a); STEP(b); STEP(c); STEP(d);
/* the last step and the top 64 - drop bits: z ^ (z >> 31) has z's top 31 bits, so a draw of at
   most 31 bits (drop >= 33) skips the last step */
#define FOUR_STORES(out, drop)                                                                        \
    if ((drop) < 33) { FOUR_CHAINS(MIX_C) }                                                           \
    any_u64x8 dropv = (any_u64x8){0} + (uint64_t)(drop);                                             \
    DRAWS_OPAQUE(dropv); /* a vector count (vpsrlvq, one uop), not an xmm count (two uops) */          \
    a >>= dropv, b >>= dropv, c >>= dropv, d >>= dropv;                                               \
    memcpy((out), &a, sizeof a), memcpy((out) + 8, &b, sizeof b);                                     \
    memcpy((out) + 16, &c, sizeof c), memcpy((out) + 24, &d, sizeof d)

/* one block of 32: indices i0 + (lane + 8 v) * step for the vectors v = a, b, c, d */
ANY_INLINE void draws_block(uint64_t *out, uint64_t base, uint64_t i0, uint64_t step, int drop) {
    const any_u64x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const any_u64x8 offs = lane * step;
    any_u64x8 a = (offs + i0) ^ base, b = (offs + (i0 + 8 * step)) ^ base;
    any_u64x8 c = (offs + (i0 + 16 * step)) ^ base, d = (offs + (i0 + 24 * step)) ^ base;
    FOUR_CHAINS(MIX_A) COUNTER_MID(FOUR_CHAINS)
    FOUR_STORES(out, drop);
}

/* Consecutive indices (step 1), the first round from a table. Within an aligned block of 32
   indices i = 32 q + r, the first round's input is (i ^ base) ^ ((i ^ base) >> 30) = i ^ x with
   x = (i >> 30) ^ base ^ (base >> 30), the same for the whole block (32 divides 2**30). Its bits
   above the fifth and below it are disjoint sums, i ^ x = (32 q ^ (x & ~31)) + (r ^ (x & 31)), so
   the first multiply is p_q + t_r (mod 2**64): one scalar product per block and a table of 32,
   which holds while x & 31 does (it changes at multiples of 2**30 alone). That takes the first
   round's shift, two xors and vpmullq off each vector: the hash alone in 0.79-0.92 of the
   general chains' time (benchmarks/bench_sr_floor.py --cycles, docs/speed.md). A run that
   starts inside a block (r0 > 0) straddles two: its lanes from 32 - r0 on take the next block's
   product (straddle, a select per vector); a block whose two halves see different x & 31 is
   drawn as in draws_block. */
ANY_INLINE void draws_consecutive(uint64_t *out, uint64_t base, uint64_t index0, int64_t m, int drop,
                                  const int straddle) {
    const any_u64x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const uint64_t xb = base ^ (base >> 30), r0 = index0 & 31;
    const any_u64x8 ka = lane + r0, kb = lane + (r0 + 8), kc = lane + (r0 + 16), kd = lane + (r0 + 24);
    /* lanes of the next block: all ones where lane + 8 v + r0 >= 32 */
    const any_u64x8 na = (any_u64x8)(ka > 31), nb = (any_u64x8)(kb > 31);
    const any_u64x8 nc = (any_u64x8)(kc > 31), nd = (any_u64x8)(kd > 31);
    uint64_t lo = ~0ull;
    any_u64x8 ta = {0}, tb = {0}, tc = {0}, td = {0};
    for (int64_t j = 0; j < m; j += 32) {
        const uint64_t q0 = (index0 + (uint64_t)j) & ~31ull, q1 = q0 + 32;
        const uint64_t x0 = (q0 >> 30) ^ xb, x1 = (q1 >> 30) ^ xb;
        if (__builtin_expect((x0 & 31) != lo || (straddle && (x1 & 31) != lo), 0)) {
            if (straddle && (x1 & 31) != (x0 & 31)) {
                draws_block(out + j, base, index0 + (uint64_t)j, 1, drop);
                continue;
            }
            lo = x0 & 31;
            ta = ((ka & 31) ^ lo) * MIX_A_MUL, tb = ((kb & 31) ^ lo) * MIX_A_MUL;
            tc = ((kc & 31) ^ lo) * MIX_A_MUL, td = ((kd & 31) ^ lo) * MIX_A_MUL;
        }
        const uint64_t p0 = (q0 ^ (x0 & ~31ull)) * MIX_A_MUL;
        any_u64x8 a, b, c, d;
        if (straddle) {
            const uint64_t p1 = (q1 ^ (x1 & ~31ull)) * MIX_A_MUL;
            a = ta + ((na & p1) | (~na & p0)), b = tb + ((nb & p1) | (~nb & p0));
            c = tc + ((nc & p1) | (~nc & p0)), d = td + ((nd & p1) | (~nd & p0));
        } else {
            a = ta + p0, b = tb + p0, c = tc + p0, d = td + p0;
        }
        COUNTER_MID(FOUR_CHAINS)
        FOUR_STORES(out + j, drop);
    }
}

static void counter_draws(uint64_t *out, uint64_t base, uint64_t index0, uint64_t step, int64_t m,
                          int nbits) {
    const int drop = 64 - nbits;
    if (step == 1 && (index0 & 31) == 0)
        draws_consecutive(out, base, index0, m, drop, 0);
    else if (step == 1)
        draws_consecutive(out, base, index0, m, drop, 1);
    else
        for (int64_t j = 0; j < m; j += 32)
            draws_block(out + j, base, index0 + (uint64_t)j * step, step, drop);
}

/* counter_draws for tests (tests/kernels/test_counter_draws.py): out holds m rounded up to 32 */
void anynum_counter_draws(uint64_t *out, uint64_t base, uint64_t index0, uint64_t step, int64_t m,
                          int32_t nbits) {
    counter_draws(out, base, index0, step, m, nbits);
}

/* Whether any of the 16 values at x is nonzero with a magnitude below sn (NaN is not): the test of
   a group in the float loops on the bits. One vector compare where the library is built for
   AVX-512; written as a loop in C, GCC left this short reduction scalar, and the group bodies
   around it with it. */
#if defined(__AVX512F__)
#include <immintrin.h>
ANY_INLINE int tiny16_f32(const float *x, float sn) {
    const __m512 v = _mm512_loadu_ps(x);
    const __mmask16 below = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(sn), _CMP_LT_OQ);
    return (below & _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ)) != 0;
}
ANY_INLINE int tiny16_f64(const double *x, double sn) {
    const __m512d s = _mm512_set1_pd(sn), z = _mm512_setzero_pd();
    const __m512d a = _mm512_loadu_pd(x), b = _mm512_loadu_pd(x + 8);
    const __mmask8 ta = _mm512_cmp_pd_mask(_mm512_abs_pd(a), s, _CMP_LT_OQ);
    const __mmask8 tb = _mm512_cmp_pd_mask(_mm512_abs_pd(b), s, _CMP_LT_OQ);
    return ((ta & _mm512_cmp_pd_mask(a, z, _CMP_NEQ_UQ)) | (tb & _mm512_cmp_pd_mask(b, z, _CMP_NEQ_UQ))) != 0;
}
#define ANY_GROUP_TINY 1
#else
#define ANY_GROUP_TINY 0
#endif

/* How many counter bits mode M draws per element: 53 for exact SR, rand_bits for SR with them,
   one for sr_uniform's coin, none for the deterministic modes. */
ANY_INLINE int draw_bits(int M, int rbits) {
    return M == M_SR ? 53 : (M == M_SRT ? rbits : (M == M_SRU ? 1 : 0));
}

/* Exact stochastic rounding, first round (anynum.rounding.stochastic_first_round): up with
   probability f for dyadic f in [0, 1), deciding on the first 53 random bits, draw. *undecided is
   set where those bits equal f's first 53 and f has more: the caller hands these back. */
ANY_INLINE int sr_exact_up(double f, uint64_t draw, int *undecided) {
    /* k < floor(t) and k == floor(t) < t for the integer draw k, without the floor: k + 1 <= t,
       and k < t < k + 1 (k + 1 <= 2**53 is exact; a NaN t is neither) */
    double t = f * 0x1p53;
    double k = (double)(int64_t)draw;
    double k1 = k + 1.0;
    *undecided = (k < t) & (t < k1);
    return k1 <= t;
}

/* Hardware stochastic rounding with r random bits, draw (anynum.rounding._stochastic_truncating):
   floor(f * 2**r) + R >= 2**r, R uniform in [0, 2**r). two_r = 2**r. */
ANY_INLINE int sr_trunc_up(double f, uint64_t draw, double two_r) {
    double scaled = floor(f * two_r);
    double bits = (double)(int64_t)draw;
    return scaled + bits >= two_r;
}

/* --- parameters (mirrored by ctypes structures in anynum.kernels.cparams) -------------------- */

typedef struct { /* FloatFormat in one working type (see cparams.float_params) */
    double step_scale, step_min, smallest_normal, limit;
    int32_t lift_tiny, flush, zero, negative_zero, is_signed, overflow, recip, common;
    int32_t on_bits, pad; /* the loops on bits apply (scalar.c float_bits) */
} any_float;

typedef struct { /* FixedPoint / IntFormat */
    double inv_step, step, tiny, code_min, code_max, modulus, inv_modulus, span; /* span: modulus * step */
    int32_t step_pos, wrap;
} any_uniform;

typedef struct { /* Posit (cparams / positparams.posit_params) */
    double maxpos, minpos;
    int32_t n, es, scale_exp, lift, underflow_zero, one;
    int32_t fast, pad; /* the fast path (posit.c) applies; its constants, as bits of W: */
    int64_t zoff, zmask, min_bits, max_bits, tie_bits;
} any_posit;

typedef struct { /* Table: the arrays of Table.lookup(cpu), and a bucket index (cparams) */
    const double *values, *bound;
    const int64_t *bound_exact; /* 0 or 1 (int64: gathers of bytes do not vectorise) */
    const int64_t *bucket_lo, *bucket_hi; /* the range of positions of the inputs of each bucket */
    int64_t size, first_nonneg, zero_index;
    int64_t e_lo, e_hi, mbits, ncodes, top_step; /* the bucket map (cparams._table_index) */
    const void *lut; /* the bucket lookup of this mode and key type (kernels.tablelut), or NULL */
    int64_t lut_shift, lut_klo, lut_khi, lut_ntot; /* its key map */
    int32_t ties, underflow_saturate, infinity_nan, signed_zero, negative_nan;
    int32_t lut_pow2; /* every spacing in a stochastic lookup is a power of two (kernels.tablelut) */
    int32_t lut_float_lanes; /* SR's choice may run on float32 lanes (tablelut.TableLut.float_lanes) */
    int32_t portable; /* 1: the portable loops even where table_det_tile_f32 is built (tests) */
} any_table;

typedef struct { /* Block: scale rule, then the element format's own rounding */
    any_float ef, scale_fmt, tensor_fmt;
    any_uniform eu;
    double ceil_sig, elem_max, scale_min, tensor_min, tensor_den;
    int64_t block_size;
    int32_t elem_family, rule, pow2, kmin, kmax, elem_emax, symmetric, fix_tiny, tensor_scale;
    int32_t sat_dtype; /* results may pass the dtype's max (kernels.block.saturate_to_dtype_needed) */
    int32_t rcp; /* non-power-of-two scales may form x / scale as BK_RCP (loops.c; cparams._rcp_ok) */
    /* the threshold path (blockthr.c; cparams._thresholds): nthr > 0 decision points
       thr[i] between the element magnitudes grid[i] and grid[i + 1], which round up where bit i of
       thr_incl is set; thr_lo: the thresholds are the grid points, for the directed and stochastic
       modes of non-power-of-two scales (thrq_elements) */
    int32_t nthr, thr_incl, thr_lo;
    double grid[16], thr[16]; /* at most 8 and 7 used */
} any_block;

enum { F_FLOAT, F_UNIFORM, F_POSIT, F_TABLE, F_BLOCK };
enum { R_FLOOR, R_CEIL, R_EVEN, R_AMAX };
/* how a block loop forms x / scale (loops.c) */
enum { BK_INV, BK_INV_FIX, BK_DIV, BK_RCP };

typedef struct {
    int32_t family, mode, wdt, tdt, rand_bits, pad;
    int64_t grain; /* fewest elements worth a thread of their own */
    double two_r;  /* 2**rand_bits */
    any_float f;
    any_uniform u;
    any_posit p;
    any_table t;
    any_block b;
} any_call;

/* what every element loop sees besides its arrays */
typedef struct {
    uint64_t base;  /* stream base of counter_bits (0 for deterministic modes) */
    uint64_t idx0;  /* logical index of the first element */
    int64_t lstride; /* logical index step from one element to the next */
} any_pos;

/* the scale of one block (block.c): 2**k (pow2) or `total`, from its amax (float64) */
static void block_scale(const any_call *c, double amax, int bad, double tscale, int *pow2, int *k,
                        double *total);

/* an element loop: n elements of W arrays xs -> ys (see loops.c) */
typedef void (*any_loop)(const void *xs, void *ys, int64_t n, const any_call *c, const any_pos *at,
                         int64_t *und);

static const size_t any_tsize[4] = {2, 2, 4, 8};

/* widen n elements of dtype tdt into the working type (exact) */
static void load_f32(const void *x, int tdt, float *w, int64_t n) {
    if (tdt == T_F16) {
        const uint16_t *h = (const uint16_t *)x;
        for (int64_t i = 0; i < n; i++) w[i] = half_to_float(h[i]);
    } else if (tdt == T_BF16) {
        const uint16_t *h = (const uint16_t *)x;
        for (int64_t i = 0; i < n; i++) w[i] = bf16_to_float(h[i]);
    } else {
        memcpy(w, x, (size_t)n * 4);
    }
}

static void load_f64(const void *x, int tdt, double *w, int64_t n) {
    if (tdt == T_F16) {
        const uint16_t *h = (const uint16_t *)x;
        for (int64_t i = 0; i < n; i++) w[i] = (double)half_to_float(h[i]);
    } else if (tdt == T_BF16) {
        const uint16_t *h = (const uint16_t *)x;
        for (int64_t i = 0; i < n; i++) w[i] = (double)bf16_to_float(h[i]);
    } else if (tdt == T_F32) {
        const float *f = (const float *)x;
        for (int64_t i = 0; i < n; i++) w[i] = (double)f[i];
    } else {
        memcpy(w, x, (size_t)n * 8);
    }
}

/* narrow working-type results to dtype tdt as torch's .to() does (float64 through float32) */
static void store_f32(const float *w, void *y, int tdt, int64_t n) {
    if (tdt == T_F16) {
        uint16_t *h = (uint16_t *)y;
        for (int64_t i = 0; i < n; i++) h[i] = float_to_half(w[i]);
    } else if (tdt == T_BF16) {
        uint16_t *h = (uint16_t *)y;
        for (int64_t i = 0; i < n; i++) h[i] = float_to_bf16(w[i]);
    } else {
        memcpy(y, w, (size_t)n * 4);
    }
}

static void store_f64(const double *w, void *y, int tdt, int64_t n) {
    if (tdt == T_F16) {
        uint16_t *h = (uint16_t *)y;
        for (int64_t i = 0; i < n; i++) h[i] = float_to_half((float)w[i]);
    } else if (tdt == T_BF16) {
        uint16_t *h = (uint16_t *)y;
        for (int64_t i = 0; i < n; i++) h[i] = float_to_bf16((float)w[i]);
    } else if (tdt == T_F32) {
        float *f = (float *)y;
        for (int64_t i = 0; i < n; i++) f[i] = (float)w[i];
    } else {
        memcpy(y, w, (size_t)n * 8);
    }
}
