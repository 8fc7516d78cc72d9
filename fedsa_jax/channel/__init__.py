"""Finite-rate, lossy uplink: unbiased random quantizers and Bernoulli erasures."""

from fedsa_jax.channel.erasures import AGGREGATIONS, Channel, Delivery, aggregate, channel, transmit
from fedsa_jax.channel.quantizers import (
    Quantizer,
    identity,
    natural,
    qsgd,
    rand_k,
    stochastic_uniform,
)

__all__ = [
    "AGGREGATIONS",
    "Channel",
    "Delivery",
    "Quantizer",
    "aggregate",
    "channel",
    "identity",
    "natural",
    "qsgd",
    "rand_k",
    "stochastic_uniform",
    "transmit",
]
