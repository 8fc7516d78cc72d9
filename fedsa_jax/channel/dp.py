"""Differential privacy on the uplink: per-agent L2 clipping and the Gaussian mechanism.

Each agent's message ``m_c`` (its model update for FedLSA, SCAFFLSA and FedBuff-free algorithms'
rounds; its TD direction for QFedTD; its local iterate's difference at a communication for
Scaffnew: whatever :func:`fedsa_jax.channel.transmit` carries) is clipped to L2 norm ``C``,

    clip_C(m) = m min(1, C / |m|),

and Gaussian noise of standard deviation ``sigma C`` per coordinate (``sigma`` the noise multiplier)
is added, in one of two places:

* ``mode="local"`` (local DP, no trusted server): on each agent's clipped message before it leaves
  the agent, ``m~_c = clip_C(m_c) + sigma C z_c``; the quantizer, error feedback and the erasures then
  act on ``m~_c`` (post-processing: they cannot weaken the guarantee, and the bits sent stay the
  quantizer's);
* ``mode="central"`` (central DP, a trusted server): the quantizer (with EF14's memory) acts first,
  then each quantized message is clipped to C (so that what enters the sum is bounded, whatever the
  quantizer did to its norm), the server sums the delivered ones and adds ``sigma C z`` to the sum
  once, then divides as the aggregation says (``1/n`` or ``1/|R|``): ``(sum_{c in R} clip_C(q(m_c))
  + sigma C z) / n``. No noise is added in a round where nothing arrives (nothing is released).
  EF21 is refused: its aggregate is the sum of every agent's accumulated ``g_c``, whose norm no
  per-round clipping bounds.

``clip=False`` keeps the noise ``sigma C`` and skips the clipping: no privacy guarantee (the
sensitivity is unbounded, the accountant refuses it), but the round stays linear, so that
:func:`fedsa_jax.theory.exact_mse` gives the exact curve of the noise alone, the reference against
which clipping's bias shows (FedLSA and QFedTD, ``"divide_by_n"``).

**What is protected.** The clipping bounds each agent's whole message, which depends on all its
data: the guarantee is **client-level** (neighbouring datasets differ in one agent's entire data),
not record-level (that would need per-observation clipping, not built). The accountant
(:mod:`fedsa_jax.channel.accounting`) states the neighbouring relation it uses for each option.

The noise is drawn from the round's channel key folded with a tag of its own, so the quantizer's
and the erasures' numbers are those of the same run without privacy.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from fedsa_jax import _prng, _validate
from fedsa_jax.registry import Option, nonnegative_real, positive_real

__all__ = ["MODES", "Privacy", "clip", "privacy", "refuse_privacy"]

MODES = ("local", "central")
PRIVACY_STREAM = 0x647021  # fold_in tag of the round's privacy noise ("dp!")


@dataclasses.dataclass(frozen=True)
class Privacy:
    """The uplink's privacy mechanism (static: hashable, compared by value)."""

    noise_multiplier: float  # sigma: the noise's standard deviation is sigma C per coordinate
    clip_norm: float  # C
    mode: str = "central"  # "local" or "central"
    clip: bool = True  # False: the noise without the clipping (no guarantee; exact theory's reference)
    delta: float = 1e-5  # the delta at which the run's epsilon is reported (fedsa_jax.channel.accounting)
    target_quantile: float | None = None  # adaptive clipping: gamma, the quantile of the norms C tracks
    clip_lr: float = 0.2  # adaptive clipping: eta_C, C <- C exp(-eta_C (b~ - gamma))
    count_noise: float = 0.0  # adaptive clipping: sigma_b, the noise on the count of unclipped messages

    @property
    def adaptive(self) -> bool:
        """Whether the clipping norm adapts (Andrew et al. 2021); ``clip_norm`` is then its start."""
        return self.target_quantile is not None

    @property
    def sum_noise_multiplier(self) -> float:
        """The noise multiplier of the sum: ``sigma`` for a fixed norm; with adaptive clipping
        ``sigma_Delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)``, so that the sum and the count together
        are the Gaussian mechanism of multiplier ``sigma`` (Andrew et al. 2021, Theorem 1)."""
        if not self.adaptive or self.noise_multiplier == 0.0:
            return self.noise_multiplier
        return (self.noise_multiplier**-2 - (2 * self.count_noise) ** -2) ** -0.5

    @property
    def noise_std(self) -> float:
        """``sigma C``: the Gaussian noise's standard deviation per coordinate (with adaptive clipping,
        ``sigma_Delta C_0`` at the start)."""
        return self.sum_noise_multiplier * self.clip_norm

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm,
            "mode": self.mode,
            "delta": self.delta,
        }
        if not self.clip:
            out["clip"] = False
        if self.adaptive:
            out.update(
                target_quantile=self.target_quantile, clip_lr=self.clip_lr, count_noise=self.count_noise
            )
        return out


def privacy(
    noise_multiplier: float,
    clip_norm: float,
    mode: str = "central",
    clip: bool = True,
    delta: float = 1e-5,
    target_quantile: float | None = None,
    clip_lr: float = 0.2,
    count_noise: float | None = None,
) -> Privacy | None:
    """The Gaussian mechanism with L2 clipping on the uplink (module docstring): noise multiplier
    ``sigma >= 0``, clipping norm ``C > 0`` (the noise's scale too), ``mode`` ``"local"`` or
    ``"central"``; ``clip=False``: the noise only (no guarantee; the exact theory's reference);
    ``delta`` in (0, 1): where ``result.privacy`` reports the run's epsilon
    (:mod:`fedsa_jax.channel.accounting`).
    No noise and no bound (``sigma = 0``, ``C = inf``) is no mechanism: None, today's channel.

    Adaptive clipping (``target_quantile = gamma`` in (0, 1), central mode; Andrew, Thakkar, McMahan,
    Ramaswamy, "Differentially private learning with adaptive clipping", NeurIPS 2021, Algorithm 1):
    ``clip_norm`` is the first round's ``C_0``; each round the server also sums the agents' bits
    ``b_c = 1{|q(m_c)| <= C_t}``, centred, with noise ``N(0, sigma_b^2)`` (``count_noise``, more than
    ``sigma / 2``): ``b~ = (sum_{c in R} (b_c - 1/2) + sigma_b z) / n + 1/2`` over the delivered
    messages R, n the agents asked (a fixed offset, as in their reference implementation), and moves
    ``C_{t+1} = C_t exp(-clip_lr (b~ - gamma))``. One agent moves the centred sum by at most 1/2 and
    the clipped sum by at most ``C_t``; with the sum's noise multiplier
    ``sigma_Delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)`` the pair is the Gaussian mechanism of
    multiplier ``sigma`` and the accountant composes ``sigma`` (their Theorem 1). ``C_t`` is carried
    in the channel's memory, per seed."""
    sigma = _validate.real("noise_multiplier", noise_multiplier, 0.0, math.inf)
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, numbers.Real) or not clip_norm > 0:
        _validate.fail("clip_norm", clip_norm, "expected a real number > 0 (the L2 bound of a message)")
    if not math.isfinite(clip_norm) and sigma > 0:
        _validate.fail("clip_norm", clip_norm, "expected a finite bound: the noise's scale is sigma C")
    _validate.choice("mode", mode, MODES)
    if not isinstance(clip, bool):
        _validate.fail("clip", clip, "expected True or False")
    d = _validate.real("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    if sigma == 0.0 and math.isinf(clip_norm):
        return None
    if target_quantile is None:
        return Privacy(float(sigma), float(clip_norm), mode, clip, d)
    gamma = _validate.real("target_quantile", target_quantile, 0.0, 1.0, low_open=True, high_open=True)
    lr = _validate.real("clip_lr", clip_lr, 0.0, math.inf, low_open=True)
    if mode != "central" or not clip or math.isinf(clip_norm):
        _validate.fail(
            "target_quantile",
            gamma,
            "adaptive clipping needs mode='central', clip=True and a finite starting clip_norm (the count "
            "of unclipped messages is noised once, at a trusted server)",
        )
    sigma_b = _validate.real("count_noise", 0.0 if count_noise is None else count_noise, 0.0, math.inf)
    if sigma > 0 and not 2 * sigma_b > sigma:
        _validate.fail(
            "count_noise",
            count_noise,
            f"expected sigma_b > sigma / 2 = {sigma / 2:g}: the sum's noise multiplier "
            "(sigma^-2 - (2 sigma_b)^-2)^(-1/2) must be real (Andrew et al. 2021 suggest sigma_b = m / 20)",
        )
    return Privacy(float(sigma), float(clip_norm), mode, clip, d, gamma, lr, sigma_b)


def clip(messages: jax.Array, clip_norm: float) -> jax.Array:
    """Each row ``m_c`` of ``messages (N, d)`` scaled to L2 norm at most ``C``: ``m min(1, C/|m|)``."""
    norms = jnp.sqrt(jnp.sum(messages * messages, axis=-1, keepdims=True))
    scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norms, jnp.finfo(messages.dtype).tiny))
    return messages * scale


def shortened(messages: jax.Array, privacy_: Privacy | None, mode: str, clip_norm=None) -> jax.Array | None:
    """``(N,) bool``: the messages that :func:`clip` shortens (norm above ``C``, or the round's adaptive
    ``C_t``) where the mechanism clips in ``mode``; None where it does not clip there."""
    if privacy_ is None or privacy_.mode != mode or not privacy_.clip:
        return None
    bound = privacy_.clip_norm if clip_norm is None else clip_norm
    return jnp.sqrt(jnp.sum(messages * messages, axis=-1)) > bound


def noise(key: jax.Array, shape, privacy_: Privacy, dtype, clip_norm=None) -> jax.Array:
    """Gaussian noise of standard deviation ``sigma C`` (the round's privacy stream; ``clip_norm``: the
    round's adaptive ``C_t``, with the sum's multiplier ``sigma_Delta``)."""
    z = _prng.normal(jax.random.fold_in(key, PRIVACY_STREAM), shape, dtype)
    if clip_norm is None:
        return jnp.asarray(privacy_.noise_std, dtype) * z
    return jnp.asarray(privacy_.sum_noise_multiplier, dtype) * clip_norm * z


def privatize_local(key: jax.Array, messages: jax.Array, privacy_: Privacy | None) -> jax.Array:
    """Local mode: each agent's message clipped (unless ``clip=False``) and noised; as it is
    otherwise."""
    if privacy_ is None or privacy_.mode != "local":
        return messages
    sent = clip(messages, privacy_.clip_norm) if privacy_.clip else messages
    return sent + noise(key, messages.shape, privacy_, messages.dtype)


def clip_central(quantized: jax.Array, privacy_: Privacy | None, clip_norm=None) -> jax.Array:
    """Central mode: each quantized message clipped before the sum (unless ``clip=False``), at the
    round's adaptive ``clip_norm`` where given."""
    if privacy_ is None or privacy_.mode != "central" or not privacy_.clip:
        return quantized
    return clip(quantized, privacy_.clip_norm if clip_norm is None else clip_norm)


def central_noise(key: jax.Array, dim: int, privacy_: Privacy | None, dtype, clip_norm=None) -> Any:
    """Central mode: the noise ``sigma C z`` the server adds to the sum of the delivered messages;
    ``0.0`` otherwise."""
    if privacy_ is None or privacy_.mode != "central":
        return 0.0
    return noise(key, (dim,), privacy_, dtype, clip_norm)


def split_memory(memory: Any, privacy_: Privacy | None) -> tuple[Any, Any]:
    """``(error-feedback memory, C_t)``: adaptive clipping carries its norm beside the senders' memory
    (``(memory, C_t)``); ``(memory, None)`` otherwise."""
    if privacy_ is None or not privacy_.adaptive:
        return memory, None
    return memory


def init_clip(memory: Any, privacy_: Privacy | None, dtype) -> Any:
    """The channel's memory at start: with adaptive clipping ``(memory, C_0)``; ``memory`` otherwise."""
    if privacy_ is None or not privacy_.adaptive:
        return memory
    return memory, jnp.asarray(privacy_.clip_norm, dtype)


def next_clip(key: jax.Array, quantized: jax.Array, delivered: jax.Array, senders, clip_norm, privacy_):
    """Andrew et al.'s geometric step: ``C_t exp(-eta_C (b~ - gamma))`` with ``b~ = (sum_{c in R}
    (1{|q(m_c)| <= C_t} - 1/2) + sigma_b z) / n + 1/2``, n the agents asked (a fixed offset, as in their
    reference implementation): one agent's data moves the noised sum by at most 1/2, the sensitivity
    their Theorem 1 composes (an uncentred count would move by 1). ``z`` is a stream of its own,
    independent of the sum's noise."""
    dtype = clip_norm.dtype
    norms = jnp.sqrt(jnp.sum(quantized * quantized, axis=-1))
    centred = jnp.where(norms <= clip_norm, 0.5, -0.5).astype(dtype)  # b_c - 1/2
    below = jnp.sum(jnp.where(delivered, centred, 0.0))
    z = _prng.normal(jax.random.fold_in(key, PRIVACY_STREAM + 1), (), dtype)
    noised = below + jnp.asarray(privacy_.count_noise, dtype) * z
    fraction = noised / jnp.asarray(senders, dtype) + 0.5
    return clip_norm * jnp.exp(
        -jnp.asarray(privacy_.clip_lr, clip_norm.dtype) * (fraction - privacy_.target_quantile)
    )


def refuse_privacy(algorithm, wrapper: str, why: str) -> None:
    """A one-line error when ``algorithm`` has a privacy mechanism on its uplink that ``wrapper``
    cannot keep (``why``)."""
    privacy_ = getattr(algorithm.channel, "privacy", None)
    if privacy_ is not None:
        _validate.fail("algorithm", algorithm.name, f"{wrapper} with a privacy mechanism is refused: {why}")


def refuse_central_privacy(config, name: str) -> None:
    """Refuses central privacy noise for an algorithm whose server sends each agent a control variate
    computed from the exact mean of the others' messages (the guarantee would not cover it)."""
    p = config.channel.privacy
    if p is not None and p.mode == "central":
        _validate.fail(
            "privacy",
            p.describe(),
            f"{name}'s control variates, sent back to each agent, carry the server's exact mean of the "
            "other agents' messages, which central noise does not cover: use mode='local'",
        )


def options(read_by: str) -> list[Option]:
    """The command line's privacy options: the mechanism, its accountant's target, the noise alone
    (``--no-clip``) and adaptive clipping (Andrew et al. 2021)."""
    return [
        Option(
            ("--clip-norm",),
            "clip_norm",
            "differential privacy: clip each agent's message to L2 norm C (and the noise's scale); "
            "default none: no privacy mechanism",
            positive_real,
            None,
            metavar="C",
            group="channel",
            params=("clip_norm",),
            read_by=read_by,
        ),
        Option(
            ("--noise-multiplier",),
            "noise_multiplier",
            "Gaussian noise of standard deviation SIGMA * C per coordinate (needs --clip-norm)",
            nonnegative_real,
            0.0,
            metavar="SIGMA",
            group="channel",
            params=("noise_multiplier",),
            read_by=read_by,
        ),
        Option(
            ("--target-epsilon",),
            "target_epsilon",
            "pick SIGMA so that --rounds releases cost this epsilon at --delta (dp-accounting's RDP)",
            positive_real,
            None,
            metavar="EPS",
            group="channel",
            params=("target_epsilon",),
            read_by=read_by,
        ),
        Option(
            ("--dp-mode",),
            "dp_mode",
            "where the noise goes: central (once on the sum, a trusted server) or local (on each message)",
            default="central",
            choices=("central", "local"),
            group="channel",
            params=("mode",),
            read_by=read_by,
        ),
        Option(
            ("--delta",),
            "delta",
            "the delta at which epsilon is reported, in (0, 1)",
            positive_real,
            1e-5,
            group="channel",
            params=("delta",),
            read_by=read_by,
        ),
        Option(
            ("--no-clip",),
            "no_clip",
            "the noise without the clipping: no privacy guarantee, but exact curves (--exact) apply",
            action="store_true",
            default=False,
            group="channel",
            params=("clip",),
            read_by=read_by,
        ),
        *_adaptive_clipping_options(read_by),
    ]


def _adaptive_clipping_options(read_by: str) -> list[Option]:
    """Adaptive clipping's options (central mode; Andrew et al. 2021)."""
    return [
        Option(
            ("--target-quantile",),
            "target_quantile",
            "adaptive clipping (central): the clipping norm follows this quantile of the messages' norms, "
            "starting from --clip-norm (Andrew et al. 2021)",
            positive_real,
            None,
            metavar="GAMMA",
            group="channel",
            params=("target_quantile",),
            read_by=read_by,
        ),
        Option(
            ("--clip-lr",),
            "clip_lr",
            "adaptive clipping: the geometric step of the norm, C <- C exp(-LR (fraction unclipped - GAMMA))",
            positive_real,
            0.2,
            metavar="LR",
            group="channel",
            params=("clip_lr",),
            read_by=read_by,
        ),
        Option(
            ("--count-noise",),
            "count_noise",
            "adaptive clipping: the noise on the count of unclipped messages (more than SIGMA / 2)",
            nonnegative_real,
            None,
            metavar="SIGMA_B",
            group="channel",
            params=("count_noise",),
            read_by=read_by,
        ),
    ]
