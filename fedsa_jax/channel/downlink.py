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

from fedsa_jax import _validate
from fedsa_jax.channel.erasures import Channel, transmit

__all__ = ["broadcast", "downlink_arg", "downlink_key"]


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
