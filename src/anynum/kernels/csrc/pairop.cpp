/* A rounding pair as one torch autograd node: the forward rounds its input with one call of the
 * native library, the backward rounds the incoming gradient with another, and no Python runs
 * in between (anynum/kernels/pairop.py builds, loads and calls it).
 *
 * A side is {address of the library's call structure, refine token, stochastic (0/1)}, or empty
 * for "pass unchanged". The library's entry points come in once, through set_entry_points:
 * anynum_round, anynum_round_each, anynum_stream_base, and the Python callback that refines
 * exact-SR elements the loop leaves undecided (probability 2**-53 each), so every element is
 * rounded exactly as the eager reference rounds it. The backward draws its seed from the
 * generator as anynum.rounding._seed_from draws it (the same torch op), at the time the Python
 * autograd Function would: the streams stay the same whichever path runs.
 *
 * round_each is the optimizer's group rounding (anynum_round_each: the tensors rounded in place
 * as their concatenation) with its checks here rather than in Python, where eight tensors'
 * attributes cost more than the rounding itself.
 */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>

namespace {

typedef int64_t (*round_fn)(const void *, void *, int64_t, const void *, uint64_t, int32_t, const int64_t *);
typedef int64_t (*round_each_fn)(const void *const *, void *const *, const int64_t *, int32_t, const void *,
                                 uint64_t, int32_t);
typedef uint64_t (*base_fn)(uint64_t, uint64_t);
typedef int64_t (*refine_fn)(int64_t, void *, int64_t, int64_t);

round_fn entry_round = nullptr;
round_each_fn entry_round_each = nullptr;
base_fn entry_base = nullptr;
refine_fn entry_refine = nullptr;

void set_entry_points(int64_t round, int64_t round_each, int64_t base, int64_t refine) {
    entry_round = reinterpret_cast<round_fn>(round);
    entry_round_each = reinterpret_cast<round_each_fn>(round_each);
    entry_base = reinterpret_cast<base_fn>(base);
    entry_refine = reinterpret_cast<refine_fn>(refine);
}

/* The next seed of `gen`, drawn as anynum.rounding._seed_from draws it. */
int64_t draw_seed(const at::Generator &gen) {
    return at::randint(0, int64_t(1) << 62, {1}, gen, at::TensorOptions().dtype(at::kLong)).item<int64_t>();
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
                seed = draw_seed(ctx->saved_data["generator"].toGenerator());
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

/* xs rounded in place by `side` as their concatenation, the seed (stochastic sides) drawn from
 * `generator`; -1, with nothing written and nothing drawn, unless every tensor is a contiguous CPU
 * tensor of xs[0]'s dtype; else the count of undecided elements, refined already. */
int64_t round_each(at::TensorList xs, c10::IntArrayRef side, std::optional<at::Generator> generator) {
    TORCH_CHECK(entry_round_each != nullptr, "anynum: the native group rounding was called before set_entry_points");
    TORCH_CHECK(side.size() == 3, "anynum: a side of the native rounding is {call, token, stochastic}");
    const int64_t count = static_cast<int64_t>(xs.size());
    if (count == 0) return 0;
    const auto dtype = xs[0].scalar_type();
    std::vector<void *> ptrs(count);
    std::vector<int64_t> offs(count + 1, 0);
    for (int64_t k = 0; k < count; k++) {
        const at::Tensor &x = xs[k];
        if (!x.is_cpu() || x.layout() != at::kStrided || x.scalar_type() != dtype || !x.is_contiguous()) return -1;
        ptrs[k] = x.data_ptr();
        offs[k + 1] = offs[k] + x.numel();
    }
    if (offs[count] == 0) return 0;  // nothing to round: nothing drawn, as for an empty group
    const bool stochastic = side[2] != 0;
    TORCH_CHECK(!stochastic || generator.has_value(), "anynum: a stochastic group rounding needs its generator");
    const int64_t seed = stochastic ? draw_seed(*generator) : 0;
    const uint64_t base = stochastic ? entry_base(static_cast<uint64_t>(seed), 0) : 0;
    const int64_t undecided = entry_round_each(ptrs.data(), ptrs.data(), offs.data(), static_cast<int32_t>(count),
                                               reinterpret_cast<const void *>(side[0]), base,
                                               static_cast<int32_t>(at::get_num_threads()));
    TORCH_CHECK(undecided >= 0, "anynum: the native library declined a rounding it was chosen for; please report this");
    if (undecided > 0) {  // refined over the concatenation, where each element's index is its stream position
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> flat_parts;
        for (const at::Tensor &x : xs) flat_parts.push_back(x.reshape(-1));
        at::Tensor flat = at::cat(flat_parts);
        TORCH_CHECK(entry_refine(side[1], flat.data_ptr(), flat.numel(), seed) == 0,
                    "anynum: refining the undecided elements of an exact stochastic rounding failed");
        for (int64_t k = 0; k < count; k++) xs[k].view(-1).copy_(flat.slice(0, offs[k], offs[k + 1]));
    }
    return undecided;
}

}  // namespace

TORCH_LIBRARY(anynum_native, m) {
    m.def("set_entry_points(int round, int round_each, int base, int refine) -> ()", &set_entry_points);
    m.def("round_pair(Tensor x, int[] fwd, int[] bwd, int fwd_seed, Generator? bwd_generator) -> Tensor");
    m.def("round_each(Tensor(a!)[] xs, int[] side, Generator? generator) -> int", &round_each);
}

TORCH_LIBRARY_IMPL(anynum_native, CompositeImplicitAutograd, m) { m.impl("round_pair", &round_pair); }
