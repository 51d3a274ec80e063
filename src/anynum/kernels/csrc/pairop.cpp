/* A rounding pair as one torch autograd node: the forward rounds its input with one call of the
 * native library, the backward rounds the incoming gradient with another, and no Python runs
 * in between (anynum/kernels/pairop.py builds, loads and calls it).
 *
 * A side is {address of the library's call structure, refine token, stochastic (0/1)}, or empty
 * for "pass unchanged". The library's entry points come in once, through set_entry_points:
 * anynum_round, anynum_stream_base, and the Python callback that refines exact-SR elements the
 * loop leaves undecided (probability 2**-53 each), so every element is rounded exactly as the
 * eager reference rounds it. The backward draws its seed from the generator as
 * anynum.rounding._seed_from draws it (the same torch op), at the time the Python autograd
 * Function would: the streams stay the same whichever path runs.
 */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>

namespace {

typedef int64_t (*round_fn)(const void *, void *, int64_t, const void *, uint64_t, int32_t, const int64_t *);
typedef uint64_t (*base_fn)(uint64_t, uint64_t);
typedef int64_t (*refine_fn)(int64_t, void *, int64_t, int64_t);

round_fn entry_round = nullptr;
base_fn entry_base = nullptr;
refine_fn entry_refine = nullptr;

void set_entry_points(int64_t round, int64_t base, int64_t refine) {
    entry_round = reinterpret_cast<round_fn>(round);
    entry_base = reinterpret_cast<base_fn>(base);
    entry_refine = reinterpret_cast<refine_fn>(refine);
}

/* x rounded by one side, with the strides native_round gives: a dense layout keeps its strides
 * (walked in memory order, or in logical order through a contiguous copy when bits are drawn),
 * anything else comes back contiguous. */
at::Tensor round_side(const at::Tensor &x, const std::vector<int64_t> &side, int64_t seed) {
    TORCH_CHECK(entry_round != nullptr, "anynum: the native rounding pair was called before set_entry_points");
    TORCH_CHECK(side.size() == 3, "anynum: a side of the native rounding pair is {call, token, stochastic}");
    const bool dense = x.is_non_overlapping_and_dense();
    const bool stochastic = side[2] != 0;
    at::Tensor src = (!dense || (stochastic && !x.is_contiguous())) ? x.contiguous() : x;
    at::Tensor y = at::empty_like(src);
    const uint64_t base = stochastic ? entry_base(static_cast<uint64_t>(seed), 0) : 0;
    const int64_t undecided = entry_round(src.data_ptr(), y.data_ptr(), src.numel(),
                                          reinterpret_cast<const void *>(side[0]), base,
                                          static_cast<int32_t>(at::get_num_threads()), nullptr);
    TORCH_CHECK(undecided >= 0, "anynum: the native library declined a rounding it was chosen for; please report this");
    if (undecided > 0) {
        TORCH_CHECK(entry_refine(side[1], y.data_ptr(), y.numel(), seed) == 0,
                    "anynum: refining the undecided elements of an exact stochastic rounding failed");
    }
    if (dense && stochastic && !x.is_contiguous()) {
        at::Tensor out = at::empty_like(x);  // x's own strides, as native_round's walk keeps them
        out.copy_(y);
        return out;
    }
    return y;
}

class RoundPair : public torch::autograd::Function<RoundPair> {
   public:
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                              std::vector<int64_t> fwd, std::vector<int64_t> bwd, int64_t fwd_seed,
                              std::optional<at::Generator> bwd_generator) {
        ctx->saved_data["bwd"] = bwd;
        ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
        if (bwd_generator.has_value()) ctx->saved_data["generator"] = *bwd_generator;
        at::NoGradGuard no_grad;
        return fwd.empty() ? x.view_as(x) : round_side(x, fwd, fwd_seed);
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grads) {
        at::Tensor g = grads[0];
        std::vector<int64_t> bwd = ctx->saved_data["bwd"].toIntVector();
        if (g.defined() && !bwd.empty()) {
            TORCH_CHECK(static_cast<int64_t>(g.scalar_type()) == ctx->saved_data["dtype"].toInt(),
                        "anynum: a gradient of another dtype than its tensor reached the native rounding pair");
            int64_t seed = 0;
            if (bwd[2] != 0) {
                at::Generator gen = ctx->saved_data["generator"].toGenerator();
                seed = at::randint(0, int64_t(1) << 62, {1}, gen, at::TensorOptions().dtype(at::kLong)).item<int64_t>();
            }
            at::NoGradGuard no_grad;
            g = round_side(g, bwd, seed);
        }
        return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

at::Tensor round_pair(const at::Tensor &x, c10::IntArrayRef fwd, c10::IntArrayRef bwd, int64_t fwd_seed,
                      std::optional<at::Generator> bwd_generator) {
    return RoundPair::apply(x, fwd.vec(), bwd.vec(), fwd_seed, bwd_generator);
}

}  // namespace

TORCH_LIBRARY(anynum_native, m) {
    m.def("set_entry_points(int round, int base, int refine) -> ()", &set_entry_points);
    m.def("round_pair(Tensor x, int[] fwd, int[] bwd, int fwd_seed, Generator? bwd_generator) -> Tensor");
}

TORCH_LIBRARY_IMPL(anynum_native, CompositeImplicitAutograd, m) { m.impl("round_pair", &round_pair); }
