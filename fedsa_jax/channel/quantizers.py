"""Random quantizers and biased compressors ``q(key, x) -> x_hat`` for the uplink.

Each quantizer acts on one message ``x (d,)``, is jit/vmap friendly, and exposes
its variance constant ``zeta(d)`` (``E|q(x) - x|^2 <= zeta |x|^2``, Definition 1
of Dal Fabbro et al. 2023), its cost ``bits(d)`` in bits per message and the flag
``unbiased`` (``E q(x) = x``):

| quantizer | unbiased | zeta(d) | bits(d) |
|---|---|---|---|
| ``stochastic_uniform(b)``, range ``[-|x|_inf, |x|_inf]`` | yes | ``d / (2^b - 1)^2`` | ``32 + d b`` |
| ``stochastic_uniform(b, range=R)`` (*) | **no** if ``|x|_inf > R`` | ``inf`` (*) | ``d b`` |
| ``qsgd(s)`` | yes | ``min(d / s^2, sqrt(d) / s)`` | ``32 + d (1 + ceil(log2(s + 1)))`` |
| ``rand_k(k)`` (scaled by ``d/k``) | yes | ``d / k - 1`` | ``k (32 + ceil(log2 d))`` |
| ``rand_k(k, unbiased=False)`` (**) | **no** | ``1 - k / d`` | ``k (32 + ceil(log2 d))`` |
| ``top_k(k)`` (**) | **no** | ``1 - k / d`` | ``k (32 + ceil(log2 d))`` |
| ``scaled_sign()`` (**) | **no** | ``1 - 1 / d`` | ``32 + d`` |
| ``natural()`` | yes | ``1 / 8`` | ``9 d`` |
| ``identity()`` | yes | ``0`` | ``32 d`` |

(*) clipped to ``[-R, R]``; absolute error ``<= d R^2 / (2^b - 1)^2``.
(**) biased compressors: ``zeta = 1 - delta`` is their contraction,
``E|C(x) - x|^2 <= (1 - delta) |x|^2`` (Stich et al. 2018; Richtárik et al. 2021).
Used as they are, they bias the algorithm (its mean no longer follows the uncompressed
one); error feedback (``error_feedback="ef14"`` or ``"ef21"`` on the channel,
:func:`fedsa_jax.channel.channel`) is what makes them usable. ``top_k`` and ``scaled_sign``
are deterministic; ``top_k`` breaks ties in ``|x_i|`` towards the lower index.

Stochastic rounding of ``y`` between grid points ``lo <= y < lo + delta`` goes up
with probability ``(y - lo) / delta``: unbiased, with variance at most
``delta^2 / 4`` per coordinate.

References: Alistarh et al., "QSGD", NeurIPS 2017; Horváth et al., "Natural
Compression for Distributed Deep Learning", 2019; Stich et al., "Sparsified SGD
with Memory", NeurIPS 2018 (rand-k); Dal Fabbro, Mitra, Pappas, "Federated TD
Learning over Finite-Rate Erasure Channels", IEEE L-CSS 2023 (Definition 1);
Bernstein et al., "signSGD", ICML 2018 and Karimireddy et al., "Error Feedback Fixes
SignSGD", ICML 2019 (scaled sign); Richtárik, Sokolov, Fatkhullin, "EF21", NeurIPS 2021.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _prng, _validate, registry

__all__ = ["Quantizer", "identity", "natural", "qsgd", "rand_k", "scaled_sign", "stochastic_uniform", "top_k"]

KINDS = ("identity", "stochastic_uniform", "qsgd", "rand_k", "natural", "top_k", "scaled_sign")
DETERMINISTIC = ("identity", "top_k", "scaled_sign")  # draw no uniforms


def _stochastic_round(u, y):
    """``floor(y) + Bernoulli(y - floor(y))`` with the uniforms ``u``: unbiased integer rounding."""
    lo = jnp.floor(y)
    return lo + (u < (y - lo))


def _uniform(q, u, x):
    L = 2**q.bits_per_coordinate - 1
    if q.range is None:
        M = jnp.max(jnp.abs(x))
    else:
        M = jnp.asarray(q.range, x.dtype)
        x = jnp.clip(x, -M, M)
    safe = jnp.where(M > 0, M, 1.0)
    k = jnp.clip(_stochastic_round(u, (x / safe + 1.0) * (L / 2)), 0, L)
    return jnp.where(M > 0, (2.0 * k / L - 1.0) * M, 0.0)


def _qsgd(q, u, x):
    s = q.levels
    norm = jnp.sqrt(jnp.sum(x * x))
    safe = jnp.where(norm > 0, norm, 1.0)
    xi = _stochastic_round(u, jnp.abs(x) / safe * s)
    return jnp.where(norm > 0, jnp.sign(x) * norm * xi / s, 0.0)


def _rand_k(q, u, x):
    d = x.shape[-1]
    kept = _first_k(-u, q.k)  # the k smallest uniforms: k coordinates without replacement
    return jnp.where(kept, x if q.unscaled else x * (d / q.k), 0.0)


def _top_k(q, u, x):
    del u
    return jnp.where(_first_k(jnp.abs(x), q.k), x, 0.0)


_ARGMAX_K = 4  # up to this k, k passes of argmax (elementwise, fused) beat a selection kernel on CPU


def _first_k(score: jax.Array, k: int) -> jax.Array:
    """Mask of the k largest entries of ``score`` along its last axis (ties: the lower index): k
    passes of ``argmax`` for small k, else ``lax.top_k`` (one partial selection instead of ranking
    every coordinate with two sorts). ``score`` is never ``-inf`` (``|x|`` or ``-u``)."""
    position = jnp.arange(score.shape[-1])
    if k > _ARGMAX_K:
        chosen = jax.lax.top_k(score, k)[1]
        return jnp.any(position == chosen[..., None], axis=-2)
    keep = jnp.zeros(score.shape, bool)
    for _ in range(k):
        hit = position == jnp.argmax(score, axis=-1)[..., None]  # argmax: the first of equal maxima
        keep = keep | hit
        score = jnp.where(hit, -jnp.inf, score)
    return keep


def _scaled_sign(q, u, x):
    del q, u
    return jnp.sum(jnp.abs(x)) / x.shape[-1] * jnp.sign(x)


def _natural(q, u, x):
    del q
    # |x| = m 2^e, m in [0.5, 1): round between 2^(e-1) and 2^e, up w.p. 2m - 1.
    m, e = jnp.frexp(jnp.abs(x))
    low = jnp.ldexp(jnp.ones_like(x), e - 1)
    up = u < (2.0 * m - 1.0)
    return jnp.sign(x) * jnp.where(up, 2.0 * low, low)


def _identity(q, u, x):
    del q, u
    return x


_APPLY = {
    "identity": _identity,
    "stochastic_uniform": _uniform,
    "qsgd": _qsgd,
    "rand_k": _rand_k,
    "natural": _natural,
    "top_k": _top_k,
    "scaled_sign": _scaled_sign,
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Quantizer:
    """A random quantizer (all fields static: changing one recompiles, as a structural
    option should). Call it as ``q(key, x)`` on one message ``x (d,)``, or as
    ``q.apply(u, x)`` with its uniforms given."""

    kind: str = dataclasses.field(metadata=dict(static=True))
    bits_per_coordinate: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    range: float | None = dataclasses.field(default=None, metadata=dict(static=True))
    levels: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    k: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    unscaled: bool | None = dataclasses.field(default=None, metadata=dict(static=True))  # rand_k: no d/k

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        return self.apply(None if self.deterministic else _prng.uniform(key, x.shape, x.dtype), x)

    @property
    def deterministic(self) -> bool:
        """``q(x)`` does not depend on the key (identity, top-k, scaled sign): no uniforms drawn."""
        return self.kind in DETERMINISTIC

    @property
    def linear(self) -> bool:
        """``q(x) = M x`` with a random matrix ``M`` drawn independently of ``x`` (identity, rand-k
        scaled or not): what exact second moments with error feedback need."""
        return self.kind in ("identity", "rand_k")

    def apply(self, u: jax.Array | None, x: jax.Array) -> jax.Array:
        """The quantizer on ``x`` with its random numbers given: ``u`` holds one uniform in
        ``[0, 1)`` per coordinate (shape of ``x``; ``None`` for the deterministic ones).
        ``q(key, x) == q.apply(jax.random.uniform(key, x.shape, x.dtype), x)``."""
        return _APPLY[self.kind](self, u, x)

    @property
    def unbiased(self) -> bool:
        """``E q(x) = x`` for every ``x``: false for top-k, scaled sign, unscaled rand-k and a
        clipped stochastic-uniform quantizer."""
        if self.kind in ("top_k", "scaled_sign") or self.unscaled:
            return False
        return not (self.kind == "stochastic_uniform" and self.range is not None)

    def zeta(self, d: int) -> float:
        """Variance constant: ``E|q(x) - x|^2 <= zeta(d) |x|^2`` for ``x`` in ``R^d``."""
        if self.kind == "identity":
            return 0.0
        if self.kind == "stochastic_uniform":
            return math.inf if self.range is not None else d / (2**self.bits_per_coordinate - 1) ** 2  # pyright: ignore[reportOperatorIssue]
        if self.kind == "qsgd":
            return min(d / self.levels**2, math.sqrt(d) / self.levels)  # pyright: ignore[reportOperatorIssue, reportOptionalOperand]
        if self.kind == "top_k" or (self.kind == "rand_k" and self.unscaled):
            return 1.0 - self.k / d  # pyright: ignore[reportOptionalOperand]
        if self.kind == "rand_k":
            return d / self.k - 1.0  # pyright: ignore[reportOperatorIssue]
        if self.kind == "scaled_sign":
            return 1.0 - 1.0 / d
        return 1.0 / 8.0  # natural

    def bits(self, d: int) -> int:
        """Bits to send one message of dimension ``d``."""
        if self.kind == "identity":
            return 32 * d
        if self.kind == "stochastic_uniform":
            return d * self.bits_per_coordinate + (0 if self.range is not None else 32)  # pyright: ignore[reportOperatorIssue]
        if self.kind == "qsgd":
            return 32 + d * (1 + math.ceil(math.log2(self.levels + 1)))  # pyright: ignore[reportOptionalOperand]
        if self.kind in ("rand_k", "top_k"):  # k values and their indices
            return self.k * (32 + math.ceil(math.log2(d))) if d > 1 else 32 * self.k  # pyright: ignore[reportOperatorIssue, reportOptionalOperand]
        if self.kind == "scaled_sign":
            return 32 + d  # the scale |x|_1 / d and d signs
        return 9 * d  # natural: sign + 8-bit exponent

    def check_dim(self, d: int) -> None:
        """Raise if the quantizer cannot act on messages of dimension ``d``."""
        if self.kind in ("rand_k", "top_k") and self.k > d:  # pyright: ignore[reportOptionalOperand]
            _validate.fail("k", self.k, f"expected k <= d = {d} (the message dimension)")

    def describe(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


def identity() -> Quantizer:
    """No quantization (full-precision float32 message: ``32 d`` bits)."""
    return Quantizer("identity")


def stochastic_uniform(bits: int, range="maxabs") -> Quantizer:  # noqa: A002
    """Stochastic rounding on ``2^bits`` evenly spaced levels per coordinate.

    Args:
      bits: bits per coordinate, ``>= 1``.
      range: ``"maxabs"`` (levels span ``[-|x|_inf, |x|_inf]``; the scale is sent
        as a 32-bit float; unbiased, ``zeta = d / (2^bits - 1)^2``) or a fixed
        ``R > 0`` (levels span ``[-R, R]``, coordinates are clipped first: this is
        **biased** whenever ``|x|_inf > R``).
    """
    # beyond ~20 bits float32 leaves stochastic rounding no fractional part to round
    b = _validate.integer("bits", bits, maximum=16)
    if isinstance(range, str):
        _validate.choice("range", range, ("maxabs",))
        return Quantizer("stochastic_uniform", bits_per_coordinate=b)
    R = _validate.real("range", range, 0.0, low_open=True)
    return Quantizer("stochastic_uniform", bits_per_coordinate=b, range=R)


def qsgd(levels: int) -> Quantizer:
    """QSGD with ``s = levels`` levels: ``|x|_2 sign(x_i) xi_i / s``, ``xi_i`` the
    stochastic rounding of ``s |x_i| / |x|_2`` (Alistarh et al., 2017)."""
    return Quantizer("qsgd", levels=_validate.integer("levels", levels))


def rand_k(k: int, unbiased: bool = True) -> Quantizer:
    """Keep ``k`` coordinates chosen uniformly without replacement, scaled by ``d/k``
    (unbiased); with ``unbiased=False`` not scaled: ``E C(x) = (k/d) x``, **biased**, a
    contraction ``E|C(x) - x|^2 = (1 - k/d) |x|^2``. Either way ``C(x) = M x`` with a random
    diagonal ``M`` independent of ``x``: the exact theory covers both, with or without error
    feedback."""
    kept = _validate.integer("k", k)
    if not isinstance(unbiased, (bool, np.bool_)):
        _validate.fail("unbiased", unbiased, "expected True or False")
    return Quantizer("rand_k", k=kept) if unbiased else Quantizer("rand_k", k=kept, unscaled=True)


def top_k(k: int) -> Quantizer:
    """Keep the ``k`` coordinates of largest ``|x_i|`` (ties: the lower index), unscaled:
    deterministic and **biased** (``|C(x) - x|^2 <= (1 - k/d) |x|^2``); ``k`` values and their
    indices are sent. Pair it with error feedback (Stich et al. 2018; Mitra et al. 2023)."""
    return Quantizer("top_k", k=_validate.integer("k", k))


def scaled_sign() -> Quantizer:
    """``|x|_1 / d * sign(x)``: d sign bits and one float; deterministic and **biased**
    (``|C(x) - x|^2 = |x|^2 - |x|_1^2 / d``); Karimireddy et al., 2019."""
    return Quantizer("scaled_sign")


def natural() -> Quantizer:
    """Natural compression: stochastic rounding of each coordinate to a signed power of
    two (Horváth et al., 2019), ``zeta = 1/8``."""
    return Quantizer("natural")


BITS = registry.Option(
    ("--bits",),
    "bits",
    "stochastic-uniform: bits per coordinate",
    registry.positive_int,
    4,
    group="channel",
    params=("bits",),
)
RANGE = registry.Option(
    ("--range",),
    "range",
    "stochastic-uniform: 'maxabs' (unbiased) or a fixed R > 0 (clipped, biased)",
    lambda text: registry.name_or_number(text, ("maxabs",), lambda v: v > 0.0, "'maxabs' or a number R > 0"),
    "maxabs",
    group="channel",
    params=("range",),
)
LEVELS = registry.Option(
    ("--levels",),
    "levels",
    "qsgd: number of levels s",
    registry.positive_int,
    4,
    group="channel",
    params=("levels",),
)
K = registry.Option(
    ("--k",), "k", "rand-k, top-k: coordinates kept", registry.positive_int, 1, group="channel", params=("k",)
)


def _qsgd_from_options(args):
    return qsgd(args.levels)


registry.register_quantizer("none", lambda args: None)
registry.register_quantizer(
    "stochastic-uniform",
    lambda args: stochastic_uniform(args.bits, range=args.range),
    options=(BITS, RANGE),
    caption=lambda args: f" {args.bits} bits",
)
registry.register_quantizer("qsgd", _qsgd_from_options, options=(LEVELS,))
registry.register_quantizer("rand-k", lambda args: rand_k(args.k), options=(K,))
registry.register_quantizer("natural", lambda args: natural())
registry.register_quantizer(
    "rand-k-unscaled",
    lambda args: rand_k(args.k, unbiased=False),
    options=(K,),
    caption=lambda a: f" k={a.k}",
)
registry.register_quantizer("top-k", lambda args: top_k(args.k), options=(K,), caption=lambda a: f" k={a.k}")
registry.register_quantizer("scaled-sign", lambda args: scaled_sign())


def quantizer_option(flag: str, help: str, read_by: str) -> registry.Option:
    """A command-line choice among the registered quantizers (``--quantizer``, ``--downlink-quantizer``;
    default none)."""
    return registry.Option(
        (flag,),
        flag[2:].replace("-", "_"),
        help,
        default="none",
        choices=tuple(registry.quantizers()),
        group="channel",
        read_by=read_by,
    )


def options(read_by: str) -> list[registry.Option]:
    """The command line's choice of the uplink's quantizer (``--quantizer``, any registered name)."""
    help = "quantizer of the uplink message (FedLSA/SCAFFLSA: the model difference; QFedTD: the TD direction)"
    return [quantizer_option("--quantizer", help, read_by)]
