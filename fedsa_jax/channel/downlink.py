"""Compressed downlink: the server broadcasts a compressed difference to the agents' copy of the model.

Both sides keep the reconstruction ``theta_hat`` (one copy: the broadcast is one message that every
agent receives), ``theta_hat_0 = theta_0``. After the server's step to ``theta_{t+1}`` it sends
``C(theta_{t+1} - theta_hat_t)`` and both sides set

    theta_hat_{t+1} = theta_hat_t + C(theta_{t+1} - theta_hat_t),

and the agents start their next local steps from ``theta_hat_{t+1}``; the server keeps its own model
``theta_{t+1}`` (it is what the MSE scores). The downlink's channel is a :class:`Channel` (its
quantizer; one sender, the server). Since the difference is taken to the reconstruction, a
broadcast's error is sent again with the next one: this already is error feedback (EF14 with the
server's memory ``e = theta - theta_hat``, EF21 with ``g = theta_hat``), so ``error_feedback`` on
the downlink is refused. Written as the uplink's EF14 on top of it (``C(theta_{t+1} - theta_hat_t +
e)``), the error would be counted twice: ``theta - theta_hat`` after a broadcast is ``e_{t+1} -
e_t``, and with unscaled rand-2 of d = 10 on the QFedTD MDP the iterates diverged. A compressor
should be contractive (``E|C(x) - x|^2 < |x|^2``: top-k, unscaled rand-k, scaled sign, qsgd or
rand-k with variance constant below 1): with an unbiased one of variance constant ``zeta >= 1``
(rand-k scaled by ``d/k`` with ``k <= d/2``) the copy's error grows by ``zeta`` at each broadcast.
Erasures on the downlink are refused (``success_prob`` must be 1). The identity quantizer sends
``theta_{t+1}`` itself: ``theta_hat = theta`` exactly (the code of an uncompressed round), counted
at 32 bits a coordinate.

This is the memory form of bidirectional compression in Artemis (Philippenko and Dieuleveut,
"Bidirectional compression in heterogeneous settings for distributed or federated learning with
partial participation: tight convergence guarantees", arXiv:2006.14591): the downlink compresses a
difference against a state both sides hold (a memory), here the model itself, the variant in which
the server keeps its uncompressed model and the agents a compressed copy (the agents need the model
to run their local steps), rather than the aggregated update of their gradient-descent setting.

Accounting: a broadcast counts once per receiving agent (``N`` messages of ``quantizer.bits(d)``
bits), as the uplink counts one message per sending agent, so that uplink and downlink bits add up
to what the links carry (Artemis counts per worker too). ``downlink=None`` (the default) is the
algorithm as before: the model goes down uncompressed and uncounted.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate
from fedsa_jax.channel.erasures import Channel, transmit
from fedsa_jax.channel.quantizers import quantizer_option
from fedsa_jax.moments.aggregation import _channel_key
from fedsa_jax.moments.phases import shift
from fedsa_jax.moments.state import START, Affine, Augmented
from fedsa_jax.registry import Option

__all__ = ["broadcast", "downlink_arg", "downlink_key", "downlink", "downlink_blocks"]


def downlink_arg(downlink: Any) -> Channel | None:
    """``downlink`` checked: None or a :class:`Channel` without erasures nor error feedback."""
    if downlink is None:
        return None
    if not isinstance(downlink, Channel):
        _validate.fail(
            "downlink", downlink, "expected None or fj.channel.channel(quantizer=..., error_feedback=...)"
        )
    if downlink.privacy is not None:
        _validate.fail(
            "downlink.privacy",
            downlink.privacy.describe(),
            "expected None (the privacy mechanism belongs to the uplink: fj.fedlsa(..., privacy=...))",
        )
    if downlink.erasures:
        _validate.fail(
            "downlink.success_prob",
            float(downlink.success_prob),
            "expected 1 (erasures on the downlink are not modelled)",
        )
    if downlink.error_feedback is not None:
        _validate.fail(
            "downlink.error_feedback",
            downlink.error_feedback,
            "expected None (the difference to the agents' copy already is error feedback)",
        )
    return downlink


def downlink_key(key: jax.Array) -> jax.Array:
    """The downlink's key, from the round's channel key (``fold_in(key, 1)``: the uplink's streams,
    split from ``key``, are left as they are)."""
    return jax.random.fold_in(key, 1)


def broadcast(key: jax.Array, target: jax.Array, reconstruction: jax.Array, ch: Channel) -> jax.Array:
    """``theta_hat_{t+1}``: the reconstruction moved by ``C(target - reconstruction)`` (``target``: the
    server's new model ``(d,)``), the quantizer drawing with ``key`` as the uplink's agent 0 would
    (:func:`~fedsa_jax.channel.transmit`)."""
    if ch.trivial:
        return target
    return reconstruction + transmit(key, (target - reconstruction)[None], ch).messages[0]


def downlink_init(config, error: jax.Array) -> Any:
    """The agents' copy of the model at start: ``()`` without a downlink, else ``error`` (error
    coordinates)."""
    return () if getattr(config, "downlink", None) is None else error


def downlink_step(key: jax.Array, config, error: jax.Array, hat: Any) -> Any:
    """The round's broadcast of the server's new model ``error`` to the agents' copy ``hat``
    (:func:`fedsa_jax.channel.broadcast`, with the round's downlink key); ``()`` without one."""
    dl = getattr(config, "downlink", None)
    return hat if dl is None else broadcast(downlink_key(key), error, hat, dl)


def from_reference(theta: jax.Array, reference: jax.Array, aggregate: jax.Array, config) -> jax.Array:
    """The server's model moved by an aggregate computed from the agents' ``reference`` (their copy of
    the model, :func:`server_update` on messages ``theta^c - reference``): ``theta + (aggregate -
    reference)``; ``aggregate`` itself without a compressed downlink (``reference`` is ``theta``)."""
    dl = getattr(config, "downlink", None)
    return aggregate if dl is None or dl.trivial else theta + (aggregate - reference)


def downlink_theory(y, config, into: str, target: str = "theta"):
    """A compressed downlink in an exact recursion (:mod:`fedsa_jax.moments`), after the other blocks:
    ``(reference, sent, shift, down)``, the agents' reference block (``target`` without a downlink;
    else ``hat``, its block added), where the uplink's aggregate goes (``into``; else a scratch block
    ``sent``), the phase moving ``into`` from ``target`` by ``sent - hat`` and the broadcast (None,
    None without a downlink)."""
    dl = getattr(config, "downlink", None)
    if dl is None:
        return target, into, None, None
    downlink_blocks(y, dl)
    y.add("sent")
    return "hat", "sent", shift(y, into, "sent", base=target), downlink(y, dl, target=target)


def downlink_bits(config, num_agents: int, dim: int, broadcasts: Any = 1) -> Any:
    """Downlink bits sent (= delivered) for ``broadcasts`` broadcasts to ``num_agents`` agents: 0
    without a compressed downlink."""
    dl = getattr(config, "downlink", None)
    if dl is None:
        return jnp.int32(0)
    return jnp.asarray(broadcasts, jnp.int32) * jnp.int32(num_agents * dl.quantizer.bits(dim))


class Downlink(Affine):
    """The server's broadcast to the agents' copy (:func:`downlink`): ``hat <- hat + M x`` with
    ``x = target - hat``, ``M`` the compressor's random
    diagonal (rand-k, scaled or not; ``E[M] = mu I``, ``E[M_ii M_jj] = W_ij``), independent of
    everything else. ``Y' = A Y + U M P Y`` (``x = P Y``): mean map ``A + mu U P``, noise
    ``U (W (.) X - mu^2 X) U^T`` with ``X = P S P^T``. The identity is ``hat <- target``, no noise."""

    def __init__(self, y: Augmented, channel, target: str, hat: str):
        q = channel.quantizer
        if q.kind != "identity" and not q.linear:
            _validate.fail(
                "downlink",
                channel.describe(),
                "exact recursions need a downlink compressor that is a random linear map of the "
                "difference (identity() or rand_k(k), scaled or not): "
                f"{q.kind} is not",
            )
        q.check_dim(y.d)
        self.channel, self.target, self.hat = channel, target, hat
        d = y.d
        if q.kind == "identity":
            self.mu, self.W = 1.0, np.ones((d, d))
        else:
            scale = 1.0 if q.unscaled else d / q.k
            self.mu = scale * q.k / d
            off = scale * scale * q.k * (q.k - 1) / (d * (d - 1)) if d > 1 else 0.0
            self.W = np.full((d, d), off)
            np.fill_diagonal(self.W, scale * scale * q.k / d)
        self.noiseless = q.kind == "identity"
        super().__init__(y, self._build, ("downlink", target, hat, _channel_key(channel)))

    def _operators(self):
        """``(A, P, U)``: ``x = P Y`` (d, D), ``Y' = A Y + U r`` with ``r = M x``."""
        y, I = self.y, np.eye(self.y.d)
        P = np.zeros((y.d, y.D))
        P[:, y[self.target]] += I
        P[:, y[self.hat]] -= I
        A, U = np.eye(y.D), np.zeros((y.D, y.d))
        U[y[self.hat]] = I
        return A, P, U

    def _build(self) -> np.ndarray:
        A, P, U = self._operators()
        return A + self.mu * U @ P

    def second(self, S: np.ndarray, conjugate) -> np.ndarray:
        out = conjugate(self.mean(), S)
        if self.noiseless:
            return out
        _, P, U = self.y.memo(("downlink ops", self.key), self._operators)
        X = P @ S @ P.T
        return out + U @ (self.W * X - self.mu**2 * X) @ U.T


def downlink_blocks(y: Augmented, channel, hat: str = "hat") -> None:
    """The downlink's block (``channel`` not None): the agents' copy of the model ``hat`` (carried,
    starting at ``theta_0``)."""
    y.add(hat, initial=START, carried=True)


def downlink(y: Augmented, channel, target: str = "theta", hat: str = "hat") -> Affine:
    """The server's broadcast of ``target`` through a compressed downlink
    (:func:`fedsa_jax.channel.broadcast`): ``hat <- hat + C(target - hat)``. Exact for the identity
    (``hat <- target``) and a compressor that is a random linear map (rand-k, scaled or not); others
    are refused (:class:`Downlink`). Agents then start from ``hat``: :func:`broadcast` with
    ``source=hat``."""
    return Downlink(y, channel, target, hat)


def check(config, dim: int) -> None:
    """Refuses a downlink compressor that cannot compress vectors of the problem's dimension."""
    dl = getattr(config, "downlink", None)
    if dl is not None:
        dl.quantizer.check_dim(dim)


def options(read_by: str) -> list[Option]:
    """The command line's compressed downlink (``--downlink-quantizer``, any registered quantizer)."""
    help = (
        "compressed downlink: the server broadcasts C(theta - theta_hat) to the agents' copy "
        "theta_hat with this quantizer (names as --quantizer, its parameters --k, --levels, --bits "
        "shared with the uplink; a contractive one: top-k, rand-k-unscaled, scaled-sign; none: the "
        "model goes down exact and uncounted)"
    )
    return [quantizer_option("--downlink-quantizer", help, read_by)]
