"""Linear features of a continuous observation, jittable: tile coding, a Fourier basis, radial basis
functions, and state-action blocks of any of them.

Each feature map is a frozen dataclass registered as a pytree (its box is a leaf, its sizes static)
and maps one observation ``x (k,)`` to a vector ``phi(x) (dim,)``; ``vmap`` it over a batch. The
observation is first scaled to the unit box, ``u = clip((x - low) / (high - low), 0, 1)``: a
coordinate outside ``[low, high]`` counts as the nearest face (CartPole's velocities have no bound;
choose the box that holds most of the visited states).

* :func:`tile_coding`: ``n`` tilings of a grid of ``tiles[j]`` tiles per coordinate, each tiling
  displaced by ``((t (2 j + 1)) mod n) / n`` of a tile in coordinate j (the asymmetric offsets of
  Sutton & Barto, Sec. 9.5.4, after Miller & Glanz), with one extra tile per coordinate so that every
  displaced tiling covers the box; no hashing: tiling t's tile of ``u`` is
  ``i_j = floor(u_j tiles[j] + offset_tj)`` and its index ``t prod(tiles + 1) + sum_j i_j
  prod_{l > j}(tiles[l] + 1)``. Each of the n active tiles has the value ``1 / sqrt(n)``, so that
  ``|phi(x)| = 1`` (step sizes then mean the same for every feature map). ``dim = n prod(tiles + 1)``.
* :func:`fourier_basis`: ``phi_i(x) = cos(pi c_i^T u)`` for every ``c_i`` in ``{0, ..., order}^k``
  (Konidaris, Osentoski, Thomas 2011, the full basis); ``dim = (order + 1)^k``.
* :func:`radial_basis`: Gaussian bumps ``exp(-|u - m_i|^2 / (2 width^2))`` at the centres ``m_i`` of
  a grid of ``centres`` points per coordinate (``0, 1/(centres - 1), ..., 1``);
  ``dim = centres^k``.
* :func:`state_action`: ``phi(x, a) = e_a (x) phi(x)``, one block of a state feature map per
  action (SARSA and Q-learning with linear features); ``dim = num_actions * phi.dim``.

Every map also gives its non-zero entries, :meth:`sparse` ``(indices, values)``: tile coding has n
of them, which is how the reference systems of :mod:`fedsa_jax.problems.classic_control` accumulate
``phi phi^T`` without forming it.

References: Sutton & Barto, "Reinforcement Learning: An Introduction", 2nd ed. (2018), Sec. 9.5;
Konidaris, Osentoski, Thomas, "Value function approximation in reinforcement learning using the
Fourier basis", AAAI 2011.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax import _validate

__all__ = [
    "FourierBasis",
    "RadialBasis",
    "StateAction",
    "TileCoding",
    "fourier_basis",
    "parse",
    "radial_basis",
    "state_action",
    "tile_coding",
]


def _static(default: Any = None):
    return dataclasses.field(default=default, metadata=dict(static=True))


def _box(low, high) -> tuple[np.ndarray, np.ndarray]:
    low = np.asarray(low, np.float64).reshape(-1)
    high = np.asarray(high, np.float64).reshape(-1)
    if low.shape != high.shape or low.size == 0:
        _validate.fail(
            "high", high.tolist(), f"expected as many bounds as low has ({low.size}), at least one"
        )
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        _validate.fail("high", high.tolist(), f"expected finite bounds with high > low = {low.tolist()}")
    return low, high


class _Scaled:
    """The unit-box scaling every map shares."""

    low: jax.Array
    high: jax.Array

    @property
    def num_inputs(self) -> int:
        return self.low.shape[0]

    def unit(self, x: jax.Array) -> jax.Array:
        """``clip((x - low) / (high - low), 0, 1)`` in the box's dtype."""
        x = jnp.asarray(x, self.low.dtype)
        return jnp.clip((x - self.low) / (self.high - self.low), 0.0, 1.0)

    def box(self) -> dict[str, list[float]]:
        return {"low": np.asarray(self.low).tolist(), "high": np.asarray(self.high).tolist()}


class _Dense(_Scaled):
    """A map whose every entry may be non-zero: its sparse form is all of them."""

    dim: int

    def __call__(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError

    def sparse(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.arange(self.dim, dtype=jnp.int32), self(x)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TileCoding(_Scaled):
    """Tile coding without hashing (module docstring); build with :func:`tile_coding`."""

    low: jax.Array  # (k,)
    high: jax.Array  # (k,)
    tiles: tuple[int, ...] = _static()
    tilings: int = _static(1)

    @property
    def dim(self) -> int:
        return self.tilings * math.prod(t + 1 for t in self.tiles)

    def offsets(self) -> np.ndarray:
        """``(n, k)`` displacement of each tiling, in tiles: ``((t (2 j + 1)) mod n) / n``."""
        t = np.arange(self.tilings)[:, None]
        j = np.arange(len(self.tiles))[None, :]
        return ((t * (2 * j + 1)) % self.tilings) / self.tilings

    def active(self, x: jax.Array) -> jax.Array:
        """``(n,)`` int32: the index of the tile of ``x`` in each tiling."""
        tiles = np.asarray(self.tiles)
        cell = jnp.floor(self.unit(x) * tiles + self.offsets()).astype(jnp.int32)  # (n, k), 0..tiles[j]
        cell = jnp.minimum(cell, jnp.asarray(tiles, jnp.int32))
        strides = np.cumprod((tiles + 1)[::-1])[::-1]
        strides = np.append(strides[1:], 1).astype(np.int32)  # prod_{l > j}(tiles[l] + 1)
        per_tiling = int(np.prod(tiles + 1))
        return cell @ jnp.asarray(strides) + jnp.arange(self.tilings, dtype=jnp.int32) * per_tiling

    def sparse(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        indices = self.active(x)
        return indices, jnp.full(indices.shape, 1.0 / math.sqrt(self.tilings), self.low.dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        indices, values = self.sparse(x)
        return jnp.zeros(self.dim, self.low.dtype).at[indices].add(values)

    def describe(self) -> dict[str, Any]:
        return {"features": "tiles", "tiles": list(self.tiles), "tilings": self.tilings, **self.box()}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FourierBasis(_Dense):
    """The full Fourier basis of a given order (module docstring); build with :func:`fourier_basis`."""

    low: jax.Array
    high: jax.Array
    order: int = _static(1)

    @property
    def dim(self) -> int:
        return (self.order + 1) ** self.num_inputs

    def frequencies(self) -> np.ndarray:
        """``(dim, k)``: every ``c`` in ``{0, ..., order}^k``, in lexicographic order."""
        return np.array(list(itertools.product(range(self.order + 1), repeat=self.num_inputs)), np.float64)

    def __call__(self, x: jax.Array) -> jax.Array:
        c = jnp.asarray(self.frequencies(), self.low.dtype)
        return jnp.cos(jnp.pi * (c @ self.unit(x)))

    def describe(self) -> dict[str, Any]:
        return {"features": "fourier", "order": self.order, **self.box()}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RadialBasis(_Dense):
    """Gaussian radial basis functions on a grid (module docstring); build with :func:`radial_basis`."""

    low: jax.Array
    high: jax.Array
    centres: int = _static(2)
    width: float = _static(0.5)

    @property
    def dim(self) -> int:
        return self.centres**self.num_inputs

    def grid(self) -> np.ndarray:
        """``(dim, k)`` centres in the unit box, in lexicographic order."""
        axis = np.linspace(0.0, 1.0, self.centres)
        return np.array(list(itertools.product(axis, repeat=self.num_inputs)), np.float64)

    def __call__(self, x: jax.Array) -> jax.Array:
        m = jnp.asarray(self.grid(), self.low.dtype)
        return jnp.exp(-jnp.sum((self.unit(x) - m) ** 2, axis=-1) / (2.0 * self.width**2))

    def describe(self) -> dict[str, Any]:
        return {"features": "rbf", "centres": self.centres, "width": self.width, **self.box()}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StateAction:
    """``phi(x, a) = e_a (x) phi(x)``: block a of ``num_actions`` holds the state features."""

    state: Any  # a state feature map (TileCoding, FourierBasis, RadialBasis)
    num_actions: int = _static(2)

    @property
    def dim(self) -> int:
        return self.num_actions * self.state.dim

    def sparse(self, x: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        indices, values = self.state.sparse(x)
        return indices + jnp.asarray(action, jnp.int32) * self.state.dim, values

    def __call__(self, x: jax.Array, action: jax.Array) -> jax.Array:
        indices, values = self.sparse(x, action)
        return jnp.zeros(self.dim, values.dtype).at[indices].add(values)

    def describe(self) -> dict[str, Any]:
        return {**self.state.describe(), "actions": self.num_actions}


def _sizes(name: str, value, count: int) -> tuple[int, ...]:
    """``value`` (an int, or one per coordinate) as ``count`` ints >= 1."""
    values = [value] * count if not isinstance(value, (tuple, list, np.ndarray)) else list(value)
    if len(values) != count:
        _validate.fail(name, value, f"expected an integer >= 1 or {count} of them (one per coordinate)")
    return tuple(_validate.integer(name, v, 1) for v in values)


def tile_coding(low, high, tiles, tilings: int = 8, dtype=None) -> TileCoding:
    """Tile coding of the box ``[low, high]`` (module docstring).

    Args:
      low, high: ``(k,)`` the box's corners (finite, ``high > low``).
      tiles: tiles per coordinate, an int or ``k`` ints (>= 1).
      tilings: the number n of offset tilings (>= 1).
      dtype: the features' dtype (default: JAX's default float).

    Example:
      >>> import fedsa_jax as fj
      >>> phi = fj.problems.tile_coding([-1.0, -1.0], [1.0, 1.0], tiles=4, tilings=2)
      >>> phi.dim, phi.active([0.0, 0.0]).tolist()
      (50, [12, 37])
    """
    low, high = _box(low, high)
    tiles = _sizes("tiles", tiles, low.size)
    tilings = _validate.integer("tilings", tilings, 1)
    return TileCoding(_as(low, dtype), _as(high, dtype), tiles, int(tilings))


def fourier_basis(low, high, order: int = 3, dtype=None) -> FourierBasis:
    """The full Fourier basis of ``order`` on the box ``[low, high]`` (module docstring)."""
    low, high = _box(low, high)
    order = _validate.integer("order", order, 0, 32)
    return FourierBasis(_as(low, dtype), _as(high, dtype), int(order))


def radial_basis(low, high, centres: int = 5, width: float | None = None, dtype=None) -> RadialBasis:
    """Gaussian radial basis functions at a grid of ``centres`` points per coordinate of the box
    (module docstring); ``width`` in units of the box (default: the grid's spacing)."""
    low, high = _box(low, high)
    centres = _validate.integer("centres", centres, 2)
    width = 1.0 / (centres - 1) if width is None else width
    width = _validate.real("width", width, 0.0, low_open=True)
    return RadialBasis(_as(low, dtype), _as(high, dtype), int(centres), float(width))


def state_action(features, num_actions: int) -> StateAction:
    """One block of the state feature map ``features`` per action (module docstring)."""
    num_actions = _validate.integer("num_actions", num_actions, 1)
    return StateAction(features, int(num_actions))


FORMS = "tiles:T:N (T tiles per coordinate, or T1xT2x..., N tilings), fourier:ORDER or rbf:CENTRES"


def parse(text: str, low, high, dtype=None):
    """The feature map a text names, over the box ``[low, high]``: ``"tiles:8x8x8x8:4"`` (tiles per
    coordinate, or one number for all, then the tilings), ``"fourier:3"`` (the order),
    ``"rbf:5"`` (centres per coordinate). A bad text is one ``ValueError`` naming it.

    Example:
      >>> import fedsa_jax as fj
      >>> fj.problems.features.parse("tiles:3x4:2", [0, 0], [1, 1]).dim
      40
    """
    kind, _, rest = str(text).partition(":")
    parts = rest.split(":") if rest else []
    try:
        if kind == "tiles" and len(parts) in (1, 2):
            tiles = [int(t) for t in parts[0].split("x")]
            tilings = int(parts[1]) if len(parts) == 2 else 1
            return tile_coding(low, high, tiles[0] if len(tiles) == 1 else tiles, tilings, dtype)
        if kind == "fourier" and len(parts) == 1:
            return fourier_basis(low, high, int(parts[0]), dtype)
        if kind == "rbf" and len(parts) == 1:
            return radial_basis(low, high, int(parts[0]), dtype=dtype)
    except ValueError as error:
        _validate.fail("features", text, f"{error}; expected {FORMS}")
    _validate.fail("features", text, f"expected {FORMS}")


def _as(x: np.ndarray, dtype) -> jax.Array:
    return jnp.asarray(x, _validate.float_dtype("dtype", dtype))
