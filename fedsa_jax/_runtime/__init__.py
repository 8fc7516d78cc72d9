"""The run machinery (private): :func:`fedsa_jax.simulate`'s driver (seed batches, round chunks,
devices), the compiled kernel, run validation, checkpoints, sweeps, paired comparisons and the option
groups. The public names come from :mod:`fedsa_jax` (``fj.simulate``, ``fj.sweep``, ``fj.compare``,
``fj.Execution``, ...)."""
