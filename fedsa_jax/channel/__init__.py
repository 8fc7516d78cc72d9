"""Finite-rate, lossy uplink (quantizers, biased compressors with error feedback, Bernoulli erasures,
differential privacy) and a compressed downlink."""

from fedsa_jax.channel.downlink import broadcast, downlink_arg, downlink_key
from fedsa_jax.channel.dp import MODES, Privacy, privacy
from fedsa_jax.channel.erasures import (
    AGGREGATIONS,
    ERROR_FEEDBACK,
    Channel,
    Delivery,
    aggregate,
    channel,
    transmit,
)
from fedsa_jax.channel.quantizers import (
    Quantizer,
    identity,
    natural,
    qsgd,
    rand_k,
    scaled_sign,
    stochastic_uniform,
    top_k,
)

__all__ = [
    "AGGREGATIONS",
    "ERROR_FEEDBACK",
    "Channel",
    "Delivery",
    "MODES",
    "Privacy",
    "Quantizer",
    "aggregate",
    "broadcast",
    "channel",
    "downlink_arg",
    "downlink_key",
    "identity",
    "natural",
    "privacy",
    "qsgd",
    "rand_k",
    "scaled_sign",
    "stochastic_uniform",
    "top_k",
    "transmit",
]
