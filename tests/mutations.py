"""Curated mutation check: does each small deliberate bug in the core make a fast test fail?

Run before a release (not part of CI, and not collected by pytest: its name does not
start with ``test_``)::

    python tests/mutations.py              # every mutation; prints a table, exits 1 if one survives
    python tests/mutations.py --list       # ids, files and the tests expected to catch them
    python tests/mutations.py --only qsgd-extra-level --only cli-bias-not-squared

Each mutation is data: an id, a file, an exact snippet of that file, its replacement,
and the fast tests expected to catch it. The script copies the repository (without
``.git``) to a temporary folder, checks that every snippet occurs exactly once (the
code moves on: a snippet that no longer matches is reported and the script exits 2
before running anything), runs the expected tests once on the unmutated copy (they
must pass, or "caught" means nothing), then applies one mutation at a time and runs
``python -m pytest -x -q`` on those tests with ``PYTHONPATH`` pointing at the copy.
A mutation is caught when a test fails; the table names the failing test(s).

Standard library only: a general tool (mutmut, cosmic-ray) generates thousands of
mutants and runs the suite for each, hours on two cores; a curated list targets the
features that matter, each with the few tests that should notice, in minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Mutation(NamedTuple):
    id: str
    file: str  # relative to the repository root
    old: str  # exact snippet, present exactly once
    new: str
    tests: tuple[str, ...]  # pytest node ids expected to catch it
    why: str = ""


CP = "tests/test_channel_paths.py"
GAPS = "tests/test_gaps.py"
CLI = "tests/test_cli_records.py"
ALG = "tests/test_algorithms.py"
BR = "tests/test_batches_and_resume.py"
NEW = "tests/test_newer_features.py"
UNTESTED = "tests/test_untested_behaviours.py"
FU = "tests/test_fused.py::test_fused_local_steps_equal_the_scan"
FU_BLOCKS = "tests/test_fused.py::test_fused_local_steps_equal_the_scan[garnet-True-16-columns]"

MUTATIONS = [
    # --- newer features: seed batches, checkpoints, sweeps, CPU devices ----------------------------
    Mutation(
        "kept-seeds-from-last-batch",
        "fedsa_jax/stats.py",
        "kept=np.asarray(parts[0].kept, np.float64)",
        "kept=np.asarray(parts[-1].kept, np.float64)",
        (f"{BR}::test_kept_seeds_extremes_and_quantiles_across_batches",),
        "keep_seeds keeps the first seeds of the last batch, not the first seeds overall",
    ),
    Mutation(
        "merged-min-of-first-batch",
        "fedsa_jax/stats.py",
        "val_min=np.min([np.asarray(p.val_min, np.float64) for p in parts], axis=0)",
        "val_min=np.asarray(parts[0].val_min, np.float64)",
        (f"{BR}::test_kept_seeds_extremes_and_quantiles_across_batches",),
        "the minimum that clips the quantiles is the first batch's",
    ),
    Mutation(
        "merged-max-of-last-batch",
        "fedsa_jax/stats.py",
        "val_max=np.max([np.asarray(p.val_max, np.float64) for p in parts], axis=0)",
        "val_max=np.asarray(parts[-1].val_max, np.float64)",
        (f"{BR}::test_kept_seeds_extremes_and_quantiles_across_batches",),
        "the maximum that clips the quantiles is the last batch's",
    ),
    Mutation(
        "quantile-bin-lower-edge",
        "fedsa_jax/stats.py",
        "below = np.take_along_axis(cum, k, -1) - np.take_along_axis(hist, k, -1)",
        "below = np.take_along_axis(cum, k, -1)",
        (f"{BR}::test_kept_seeds_extremes_and_quantiles_across_batches",),
        "quantiles not interpolated: the lower edge of their bin (within the documented 15 %)",
    ),
    Mutation(
        "quantile-linear-in-bin",
        "fedsa_jax/stats.py",
        "log_q = HIST_LOW + (k + frac) / HIST_PER_DECADE",
        "log_q = HIST_LOW + k / HIST_PER_DECADE + np.log10(1 + frac * (10 ** (1 / HIST_PER_DECADE) - 1))",
        (f"{BR}::test_kept_seeds_extremes_and_quantiles_across_batches",),
        "quantiles interpolated linearly inside their log bin (0.3 % off at most)",
    ),
    Mutation(
        "stable-shift-from-seed-0",
        "fedsa_jax/stats.py",
        "first = jnp.argmax(ok)",
        "first = 0",
        (f"{BR}::test_seed_0_diverged_and_on_record_counts_valid_seeds_only",),
        "the mean is taken as deviations from seed 0's value even when seed 0 diverged",
    ),
    Mutation(
        "on-record-counts-padded-seeds",
        "fedsa_jax/_runtime/driver.py",
        "seeds = plan.seeds_done(batch, run.num_seeds)",
        "seeds = (batch + 1) * plan.batch_size",
        (f"{BR}::test_seed_0_diverged_and_on_record_counts_valid_seeds_only",),
        "on_record counts the padding seeds of the last batch",
    ),
    Mutation(
        "on-record-batch-only",
        "fedsa_jax/_runtime/driver.py",
        "        if done is not None:\n            mine = merge(",
        "        if False:\n            mine = merge(",
        (f"{BR}::test_seed_0_diverged_and_on_record_counts_valid_seeds_only",),
        "on_record's statistics cover the current seed batch only, not every seed run so far",
    ),
    Mutation(
        "checkpoint-ignores-theta0",
        "fedsa_jax/_runtime/session.py",
        "        setup.stacked,\n        jax.random.key_data(run.key),\n        run.theta0,\n",
        "        setup.stacked,\n        jax.random.key_data(run.key),\n",
        (f"{BR}::test_checkpoint_does_not_resume_another_theta0_or_problem[theta0]",),
        "a checkpoint resumes a run started from another theta0",
    ),
    Mutation(
        "checkpoint-ignores-problem-values",
        "fedsa_jax/_runtime/session.py",
        "        problem,\n        setup.stacked,\n        jax.random.key_data(run.key),\n",
        "        setup.stacked,\n        jax.random.key_data(run.key),\n",
        (f"{BR}::test_checkpoint_does_not_resume_another_theta0_or_problem[problem]",),
        "a checkpoint resumes a run of a problem with the same structure and other values",
    ),
    Mutation(
        "sweep-reuses-other-theta0",
        "fedsa_jax/_runtime/sweep.py",
        '        and c.get("theta0") == [float(x) for x in run.theta0]\n',
        "",
        (f"{BR}::test_sweep_does_not_reuse_a_result_with_another_theta0",),
        "a sweep loads a finished result computed from another theta0",
    ),
    Mutation(
        "sweep-groups-record-every",
        "fedsa_jax/_runtime/sweep.py",
        "run.num_rounds, run.record_every)",
        "run.num_rounds)",
        (f"{BR}::test_sweep_groups_only_configurations_with_the_same_record_every",),
        "configurations with different record_every share one kernel call (the first one's)",
    ),
    Mutation(
        "cpu-count-ignores-affinity",
        "fedsa_jax/cpu.py",
        "return max(1, len(os.sched_getaffinity(0)))",
        "return max(1, os.cpu_count() or 1)",
        (f"{BR}::test_default_device_count_follows_the_cpu_affinity",),
        "one CPU device per core of the machine, not per core the process may use",
    ),
    Mutation(
        "cpu-xla-flag-over-jax-config",
        "fedsa_jax/cpu.py",
        "    if configured >= 0 and configured != _ours:\n"
        '        return f"jax_num_cpu_devices={configured}", configured\n'
        '    found = _XLA_FLAG_RE.findall(os.environ.get("XLA_FLAGS", ""))\n'
        "    if found and found[-1].isdigit():  # the last occurrence is the one XLA keeps\n"
        '        return f"XLA_FLAGS=--{XLA_FLAG}={found[-1]}", int(found[-1])\n',
        '    found = _XLA_FLAG_RE.findall(os.environ.get("XLA_FLAGS", ""))\n'
        "    if found and found[-1].isdigit():  # the last occurrence is the one XLA keeps\n"
        '        return f"XLA_FLAGS=--{XLA_FLAG}={found[-1]}", int(found[-1])\n'
        "    if configured >= 0 and configured != _ours:\n"
        '        return f"jax_num_cpu_devices={configured}", configured\n',
        (f"{BR}::test_explicit_count_precedence[JAX_NUM_CPU_DEVICES-over-XLA_FLAGS]",),
        "XLA_FLAGS read before JAX_NUM_CPU_DEVICES, which JAX obeys",
    ),
    Mutation(
        "cpu-xla-flag-first-occurrence",
        "fedsa_jax/cpu.py",
        'return f"XLA_FLAGS=--{XLA_FLAG}={found[-1]}", int(found[-1])',
        'return f"XLA_FLAGS=--{XLA_FLAG}={found[0]}", int(found[0])',
        (f"{BR}::test_explicit_count_precedence[last-XLA_FLAGS-occurrence]",),
        "the first occurrence of the flag in XLA_FLAGS is read; XLA keeps the last",
    ),
    # --- local steps --------------------------------------------------------------------------
    Mutation(
        "local-step-dropped",
        "fedsa_jax/algorithms/_base.py",
        "theta, _ = jax.lax.scan(body, theta, (obs, etas), ",
        "theta, _ = jax.lax.scan(body, theta, (jax.tree.map(lambda o: o[1:], obs), None if etas is None else etas[1:]), ",
        (f"{ALG}::test_td_matches_numpy_loop[generative-1-fedlsa]",),
        "each agent runs H - 1 local steps",
    ),
    Mutation(
        "control-variate-sign",
        "fedsa_jax/algorithms/_base.py",
        "g = g - control",
        "g = g + control",
        (f"{ALG}::test_td_matches_numpy_loop[generative-1-scafflsa]",),
        "local steps add the control variate instead of subtracting it",
    ),
    # --- control variates ---------------------------------------------------------------------
    Mutation(
        "scafflsa-channel-cv-frozen",
        "fedsa_jax/algorithms/_base.py",
        "    increment = increment - jnp.where(delivered, jnp.sum(increment, axis=0) / n_delivered, 0.0)\n    return xi + increment",
        "    increment = increment - jnp.where(delivered, jnp.sum(increment, axis=0) / n_delivered, 0.0)\n    return xi + (increment if ch.trivial else 0.0 * increment)",
        (f"{CP}::test_channel_trajectories_match_numpy_loop[scafflsa-qsgd-erasures]",),
        "over a lossy/quantized uplink SCAFFLSA never moves its control variates (runs FedLSA)",
    ),
    Mutation(
        "scafflsa-channel-cv-half-gain",
        "fedsa_jax/algorithms/_base.py",
        "(mean_delivered - messages) / denominator, 0.0)",
        "(mean_delivered - messages) / (2 * denominator), 0.0)",
        (f"{CP}::test_channel_trajectories_match_numpy_loop[scafflsa-qsgd-erasures]",),
        "control-variate gain halved on the channel path",
    ),
    Mutation(
        "scafflsa-cv-from-unquantized",
        "fedsa_jax/algorithms/_base.py",
        "increment = jnp.where(delivered, (mean_delivered - messages) / denominator, 0.0)",
        "increment = jnp.where(delivered, (mean_delivered - (local - theta)) / denominator, 0.0)",
        (f"{CP}::test_channel_trajectories_match_numpy_loop[scafflsa-qsgd-erasures]",),
        "control variates move with the agents' unquantized model differences, not what the server received",
    ),
    Mutation(
        "scafflsa-lost-agents-move",
        "fedsa_jax/algorithms/_base.py",
        "increment = jnp.where(delivered, (mean_delivered - messages) / denominator, 0.0)",
        "increment = (mean_delivered - messages) / denominator",
        (f"{CP}::test_channel_trajectories_match_numpy_loop[scafflsa-qsgd-erasures]",),
        "agents whose message was lost update their control variate anyway",
    ),
    Mutation(
        "scafflsa-exact-cv-gain",
        "fedsa_jax/algorithms/_base.py",
        "increment = (theta - local) / denominator",
        "increment = (theta - local) / (1.25 * denominator)",
        (f"{ALG}::test_td_matches_numpy_loop[generative-1-scafflsa]",),
        "control-variate step 1/(eta (H+1)) on the exact channel",
    ),
    # --- quantizers ---------------------------------------------------------------------------
    Mutation(
        "qsgd-extra-level",
        "fedsa_jax/channel/quantizers.py",
        "xi = _stochastic_round(u, jnp.abs(x) / safe * s)\n"
        "    return jnp.where(norm > 0, jnp.sign(x) * norm * xi / s, 0.0)",
        "xi = _stochastic_round(u, jnp.abs(x) / safe * (s + 1))\n"
        "    return jnp.where(norm > 0, jnp.sign(x) * norm * xi / (s + 1), 0.0)",
        (
            f"{CP}::test_quantizer_outputs_lie_on_the_grid_its_bits_describe[qsgd-3]",
            f"{CP}::test_quantizer_exact_variance[qsgd-3]",
        ),
        "QSGD rounds on s + 1 levels: unbiased, more precise than the bits it reports",
    ),
    Mutation(
        "uniform-extra-level",
        "fedsa_jax/channel/quantizers.py",
        "L = 2**q.bits_per_coordinate - 1",
        "L = 2**q.bits_per_coordinate",
        (f"{CP}::test_quantizer_outputs_lie_on_the_grid_its_bits_describe[uniform-3bit]",),
        "stochastic uniform quantizer uses 2^b + 1 levels",
    ),
    Mutation(
        "natural-wide-grid",
        "fedsa_jax/channel/quantizers.py",
        "low = jnp.ldexp(jnp.ones_like(x), e - 1)\n"
        "    up = u < (2.0 * m - 1.0)\n"
        "    return jnp.sign(x) * jnp.where(up, 2.0 * low, low)",
        "low = jnp.ldexp(jnp.ones_like(x), e - 2)\n"
        "    up = u < (jnp.abs(x) - low) / (3.0 * low)\n"
        "    return jnp.sign(x) * jnp.where(up, 4.0 * low, low)",
        (f"{CP}::test_quantizer_exact_variance[natural]",),
        "natural compression rounds between 2^(e-2) and 2^e: unbiased powers of two, too much variance",
    ),
    Mutation(
        "quantizer-key-shared-by-agents",
        "fedsa_jax/channel/erasures.py",
        "u = jax.vmap(lambda k: _prng.uniform(k, (d,), dtype))(_prng.split(k_q, N))",
        "u = jnp.broadcast_to(_prng.uniform(k_q, (d,), dtype), (N, d))",
        (f"{CP}::test_channel_trajectories_match_numpy_loop[qfedtd-randk-erasures-markov]",),
        "every agent's quantizer draws the same random numbers (rand-k keeps the same coordinates)",
    ),
    Mutation(
        "rand-k-with-replacement",
        "fedsa_jax/channel/quantizers.py",
        "kept = _first_k(-u, q.k)  # the k smallest uniforms: k coordinates without replacement\n"
        "    return jnp.where(kept, x if q.unscaled else x * (d / q.k), 0.0)",
        "picks = jnp.minimum((u[: q.k] * d).astype(jnp.int32), d - 1)\n"
        "    return x * jnp.zeros(d, x.dtype).at[picks].add(1.0) * (1.0 if q.unscaled else d / q.k)",
        (f"{CP}::test_quantizer_exact_variance[rand-3]",),
        "rand-k draws k coordinates with replacement: unbiased, wrong variance and covariance",
    ),
    # --- erasures and aggregation weights ------------------------------------------------------
    Mutation(
        "received-weights-not-uniform",
        "fedsa_jax/channel/erasures.py",
        "weights = delivered / jnp.maximum(count, 1).astype(messages.dtype)",
        "weights = delivered * jnp.arange(1.0, N + 1) / jnp.maximum(jnp.sum(delivered * jnp.arange(1.0, N + 1)), 1)",
        (f"{CP}::test_divide_by_received_weights_are_one_over_received",),
        "divide_by_received weights sum to 1 but are not 1/|R|",
    ),
    Mutation(
        "erasures-all-or-nothing",
        "fedsa_jax/channel/erasures.py",
        "delivered = _prng.uniform(k_e, (N,), dtype) < p",
        "delivered = jnp.broadcast_to(_prng.uniform(k_e, (), dtype) < p, (N,))",
        (f"{CP}::test_channel_trajectories_match_numpy_loop[scafflsa-qsgd-erasures]",),
        "one erasure draw for all agents: each message still arrives with probability p, never independently",
    ),
    Mutation(
        "theory-received-server-weight",
        "fedsa_jax/moments/aggregation.py",
        'return p / N if channel.aggregation == "divide_by_n" else (1.0 - (1.0 - p) ** N) / N',
        "return p / N",
        ("tests/test_channel.py::test_qfedtd_mean_matches_exact_recursion[divide_by_received]",),
        "exact recursions use p/N for the server weight when dividing by |R|",
    ),
    # --- samplers -----------------------------------------------------------------------------
    Mutation(
        "qfedtd-chain-not-carried",
        "fedsa_jax/algorithms/qfedtd.py",
        "problem.theta_star + error, error, sampler, state.count + 1,",
        "problem.theta_star + error, error, state.sampler, state.count + 1,",
        (f"{CP}::test_qfedtd_markov_reduces_to_fedtd",),
        "QFedTD restarts each agent's Markov chain from the same state every round",
    ),
    Mutation(
        "markov-skip-pairs",
        "fedsa_jax/problems/td.py",
        "s, s_next = path[:-1:skip], path[1::skip]",
        "s, s_next = path[:-1:skip], path[skip::skip]",
        (f"{ALG}::test_td_matches_numpy_loop[markov-3-fedlsa]",),
        "with skip > 1 an observation pairs s_k with s_{k+skip} instead of s_{k+1}",
    ),
    Mutation(
        "generative-kernel-of-agent-0",
        "fedsa_jax/problems/td.py",
        "return alias_draw(self.P_prob, self.P_alias, (c * S + state) * S, u_t, S)",
        "return alias_draw(self.P_prob, self.P_alias, state * S, u_t, S)",
        (f"{ALG}::test_td_matches_numpy_loop[markov-1-fedlsa]",),
        "every agent moves with agent 0's transition kernel",
    ),
    Mutation(
        "generative-pairs-of-agent-0",
        "fedsa_jax/problems/td.py",
        "pair = pair_draw(self.pair_threshold, self.pair_alias, c * (S * S), u, S * S)",
        "pair = pair_draw(self.pair_threshold, self.pair_alias, 0 * (S * S), u, S * S)",
        (f"{ALG}::test_td_matches_numpy_loop[generative-1-fedlsa]",),
        "every agent draws its pairs (s, s') from agent 0's law",
    ),
    Mutation(
        "pair-rewards-of-agent-0",
        "fedsa_jax/problems/td.py",
        "self.pair_const[c * (S * S) + pair]",
        "self.pair_const[pair]",
        (f"{ALG}::test_td_matches_numpy_loop[generative-1-fedlsa]",),
        "every agent's TD error uses agent 0's rewards",
    ),
    Mutation(
        "gaussian-noise-unscaled",
        "fedsa_jax/problems/gaussian.py",
        "var = sA**2 * jnp.sum(theta * theta, axis=1, keepdims=True) + sb**2",
        "var = sA**2 + sb**2",
        (f"{ALG}::test_gaussian_matches_numpy_loop[fedlsa]",),
        "G theta drawn as z instead of |theta| z (the laid-out local steps)",
    ),
    Mutation(
        "gaussian-direction-noise-unscaled",
        "fedsa_jax/problems/gaussian.py",
        "var = params.noise_A**2 * jnp.sum(theta * theta) + params.noise_b**2",
        "var = params.noise_A**2 + params.noise_b**2",
        ("tests/test_problems.py::test_gaussian_laid_out_steps_equal_the_scan[fedlsa]",),
        "the same in error_direction (QFedTD, subclasses, the scan the layout is tested against)",
    ),
    Mutation(
        "gaussian-laid-out-control-dropped",
        "fedsa_jax/problems/gaussian.py",
        "return x - eta_h * (g - ctrl), None",
        "return x - eta_h * g, None",
        (f"{ALG}::test_gaussian_matches_numpy_loop[scafflsa]",),
        "SCAFFLSA's control variates ignored by the Gaussian laid-out local steps",
    ),
    # --- statistics and merges ----------------------------------------------------------------
    Mutation(
        "theta-sem-biased",
        "fedsa_jax/stats.py",
        "theta_mean, theta_sem = with_sem(m.theta_mean, m.theta_m2)",
        "theta_mean, theta_sem = with_sem(m.theta_mean, 0.9 * m.theta_m2)",
        (f"{GAPS}::test_seed_statistics_against_the_seeds_across_batches",),
        "theta_sem from the biased variance (the denominator of every mean z-test)",
    ),
    Mutation(
        "merge-drops-between-batch-term",
        "fedsa_jax/stats.py",
        "np.asarray(getattr(p, m2_name), np.float64) + k * (m - mean) ** 2",
        "np.asarray(getattr(p, m2_name), np.float64) + 0 * k * (m - mean) ** 2",
        (f"{GAPS}::test_seed_statistics_against_the_seeds_across_batches",),
        "merged seed batches lose the spread between batch means",
    ),
    Mutation(
        "theta-mean-keeps-diverged",
        "fedsa_jax/stats.py",
        "theta_mean, theta_m2 = mean_m2(theta)",
        "theta_mean, theta_m2 = jnp.sum(jnp.where(valid[:, None] & jnp.isfinite(theta), theta, 0.0), 0) / n_f, "
        "mean_m2(theta)[1]",
        (f"{GAPS}::test_seed_statistics_against_the_seeds_across_batches",),
        "finite diverged seeds enter theta_mean",
    ),
    # --- theory coefficients ------------------------------------------------------------------
    Mutation(
        "rand-k-offdiagonal",
        "fedsa_jax/moments/aggregation.py",
        "off = (d * (k - 1) / (k * (d - 1)) - 1.0) if d > 1 else 0.0",
        "off = ((k - 1) / (d - 1) - 1.0) if d > 1 else 0.0",
        (f"{GAPS}::test_rand_k_exact_mse_with_d3_k2_matches_enumeration[fedlsa]",),
        "rand-k's off-diagonal error covariance without its k-dependence (same value for k = 1)",
    ),
    Mutation(
        "gaussian-trace-over-d",
        "fedsa_jax/problems/gaussian.py",
        "scale = sA**2 * np.trace(X, axis1=1, axis2=2) + sb**2",
        "scale = sA**2 * np.trace(X, axis1=1, axis2=2) / X.shape[-1] + sb**2",
        (f"{GAPS}::test_gaussian_exact_mse_matches_enumeration[fedlsa]",),
        "multiplicative Gaussian noise variance tr(X)/d instead of tr(X) (same for d = 1)",
    ),
    Mutation(
        "received-pair-weight",
        "fedsa_jax/moments/aggregation.py",
        "other = p * p * _binomial_inverse_mean(N - 2, p, 2) if N > 1 else 0.0",
        "other = p * p * _binomial_inverse_mean(N - 2, p, 1) if N > 1 else 0.0",
        (f"{GAPS}::test_channel_weight_moments_match_enumeration[divide_by_received]",),
        "E[1{c,j in R}/|R|] with |R| = 1 + X instead of 2 + X",
    ),
    Mutation(
        "quantizer-term-ignores-weight-variance",
        "fedsa_jax/moments/aggregation.py",
        "return c_same, c_other, c_same + _server_weight(ch, y.N, self.m) ** 2, quant",
        "return c_same, c_other, _server_weight(ch, y.N, self.m) ** 2, quant",
        ("tests/test_theory.py::test_exact_mse_matches_enumeration[qfedtd_randk_erasures]",),
        "quantizer error weighted by E[w]^2 instead of E[w^2]",
    ),
    Mutation(
        "fedlsa-bias-limit",
        "fedsa_jax/theory/references.py",
        "return np.linalg.solve(np.eye(d) - gamma_bar, rho)",
        "return rho / (1.0 - np.trace(gamma_bar) / d)",
        (f"{ALG}::test_fedlsa_bias_closed_form",),
        "FedLSA's limit bias with a scalar instead of a matrix inverse",
    ),
    # --- CLI reporting ------------------------------------------------------------------------
    Mutation(
        "cli-bias-not-squared",
        "fedsa_jax/cli/run.py",
        "level = float(np.sum(bias**2))",
        "level = float(np.sqrt(np.sum(bias**2)))",
        (f"{CLI}::test_squared_bias_and_exact_curve_are_reported",),
        "the printed, saved and drawn FedLSA bias is |bias| instead of |bias|^2",
    ),
    Mutation(
        "cli-exact-not-drawn",
        "fedsa_jax/cli/run.py",
        "band=args.band, theory=exact)",
        "band=args.band, theory={})",
        (f"{CLI}::test_squared_bias_and_exact_curve_are_reported",),
        "--exact computes the curve but the figure does not draw it",
    ),
    Mutation(
        "cli-qsgd-levels-from-bits",
        "fedsa_jax/channel/quantizers.py",
        "return qsgd(args.levels)",
        "return qsgd(args.bits)",
        (f"{CLI}::test_quantizer_options_build_the_named_quantizer",),
        "--levels ignored: QSGD takes --bits levels",
    ),
    Mutation(
        "cli-garnet-level-ignored",
        "fedsa_jax/problems/generators.py",
        "    het = args.heterogeneity\n",
        "    het = args.heterogeneity\n    het = het if isinstance(het, str) else float(round(het))\n",
        (f"{CLI}::test_problem_options_build_the_named_problem",),
        "a Garnet heterogeneity level between 0 and 1 is rounded to 0 or 1",
    ),
    # --- problems and plots -------------------------------------------------------------------
    Mutation(
        "garnet-kernel-level-rounded",
        "fedsa_jax/problems/generators.py",
        "K = (1 - h) * bases[0] + h * bases[c % 2]",
        "K = bases[c % 2] if h >= 0.5 else bases[0]",
        (f"{GAPS}::test_garnet_intermediate_heterogeneity_interpolates",),
        "intermediate heterogeneity levels pick one base kernel",
    ),
    Mutation(
        "garnet-reward-level-ignored",
        "fedsa_jax/problems/generators.py",
        "R[c] = (1.0 - 2.0 * h * (c % 2)) * r",
        "R[c] = (1.0 - 2.0 * (h > 0) * (c % 2)) * r",
        (f"{GAPS}::test_garnet_intermediate_heterogeneity_interpolates",),
        "any positive heterogeneity flips the odd agents' rewards completely",
    ),
    Mutation(
        "plot-reference-level",
        "fedsa_jax/plotting.py",
        'ax.axhline(level, color=f"C{len(results) + j}"',
        'ax.axhline(np.sqrt(level), color=f"C{len(results) + j}"',
        (f"{GAPS}::test_plot_mse_draws_the_curves_and_levels_it_is_given",),
        "reference lines drawn at the square root of their level",
    ),
    Mutation(
        "plot-theory-markers",
        "fedsa_jax/plotting.py",
        'ax.plot(ks, [exact[k] for k in ks], "s"',
        'ax.plot(ks, [exact[k] for k in reversed(ks)], "s"',
        (f"{GAPS}::test_plot_final_mse_vs_agents_draws_its_data_theory_and_reference",),
        "exact markers drawn at the wrong N",
    ),
    Mutation(
        "plot-sweep-identical-lines-drawn-twice",
        "fedsa_jax/plotting.py",
        'merged = {n: "\\n= ".join(names) for names in same.values() for n in names}',
        "merged = {n: n for names in same.values() for n in names}",
        ("tests/test_sweep.py::test_plot_sweep_merges_identical_lines_and_keeps_near_ones_apart",),
        "identical configurations of a sweep drawn over each other, one legend entry each",
    ),
    Mutation(
        "cli-title-no-cohort",
        "fedsa_jax/cli/titles.py",
        'title += f", {cohort_caption(args, problem)}"',
        "pass",
        ("tests/test_labels.py::test_a_cohort_run_says_so_in_its_title_and_console_line",),
        "a run with --clients-per-round titled like a full round",
    ),
    # --- newer features: algorithms, schedules, optimizers, wrappers, metrics ---
    Mutation(
        "scafflsa-schedule-cv-last-step",
        "fedsa_jax/channel/local_work.py",
        "        return optim.round_step_sum(etas, H)\n",
        "        return H * (etas[-1] if etas.ndim else etas)\n",
        (f"{NEW}::test_scafflsa_control_variates_divide_by_the_rounds_step_sum",),
        "with a schedule SCAFFLSA's control variates divide by H eta_last instead of the round's step sum",
    ),
    Mutation(
        "scafflsa-schedule-cv-first-step",
        "fedsa_jax/optim/schedules.py",
        "return etas * num_local_steps if etas.ndim == 0 else jnp.sum(etas)",
        "return etas * num_local_steps if etas.ndim == 0 else etas[0] * num_local_steps",
        (f"{NEW}::test_scafflsa_control_variates_divide_by_the_rounds_step_sum",),
        "the round's step sum of a schedule taken as H eta_first",
    ),
    Mutation(
        "schedule-rescale-drops-own-scale",
        "fedsa_jax/optim/schedules.py",
        "return dataclasses.replace(self, scale=self.scale * factor)",
        "return dataclasses.replace(self, scale=factor)",
        (
            f"{NEW}::test_a_scaled_schedule_keeps_its_own_scale",
            f"{NEW}::test_richardson_runs_the_doubled_schedule_at_every_step",
        ),
        "scaling a schedule replaces its own scale (Richardson turns scale=s into 2, not 2 s)",
    ),
    Mutation(
        "richardson-schedule-not-doubled",
        "fedsa_jax/algorithms/averaged.py",
        'lambda eta: eta.scaled(factor) if hasattr(eta, "scaled") else eta * factor\n',
        'lambda eta: eta if hasattr(eta, "scaled") else eta * factor\n',
        (f"{NEW}::test_richardson_runs_the_doubled_schedule_at_every_step",),
        "Richardson's second run keeps a schedule as it is (extrapolates nothing)",
    ),
    Mutation(
        "server-optimizer-params-zero",
        "fedsa_jax/optim/schedules.py",
        "update(error - aggregate, opt_state, theta_star + error)",
        "update(error - aggregate, opt_state, jnp.zeros_like(error))",
        (f"{NEW}::test_server_optimizer_sees_theta_in_the_kernel_and_the_mean",),
        "the server optimizer gets zeros as params: weight decay does nothing",
    ),
    Mutation(
        "server-optimizer-params-error",
        "fedsa_jax/optim/schedules.py",
        "update(error - aggregate, opt_state, theta_star + error)",
        "update(error - aggregate, opt_state, error)",
        (f"{NEW}::test_server_optimizer_sees_theta_in_the_kernel_and_the_mean",),
        "the server optimizer gets theta - theta_star (the error coordinates) as params",
    ),
    Mutation(
        "server-optimizer-params-update",
        "fedsa_jax/optim/schedules.py",
        "update(error - aggregate, opt_state, theta_star + error)",
        "update(error - aggregate, opt_state, error - aggregate)",
        (f"{NEW}::test_server_optimizer_sees_theta_in_the_kernel_and_the_mean",),
        "the server optimizer gets the pseudo-gradient as params",
    ),
    Mutation(
        "theory-optimizer-params-zero",
        "fedsa_jax/moments/phases.py",
        "    shift = c + Mp @ y.theta_star  # the constant in error coordinates\n"
        "    rows = {}  # [u; s'] = (Mg + Mp) ref - Mg agg + Ms s + shift; reference <- reference + u\n"
        '    for block, part, plus in ((reference, slice(0, d), np.eye(d)), ("s", slice(d, d + n_s), 0.0)):\n'
        "        if part.stop > part.start:\n"
        "            rows[block] = {reference: plus + (Mg + Mp)[part],",
        "    shift = c  # the constant in error coordinates\n"
        "    rows = {}  # [u; s'] = (Mg + Mp) ref - Mg agg + Ms s + shift; reference <- reference + u\n"
        '    for block, part, plus in ((reference, slice(0, d), np.eye(d)), ("s", slice(d, d + n_s), 0.0)):\n'
        "        if part.stop > part.start:\n"
        "            rows[block] = {reference: plus + Mg[part],",
        (
            f"{NEW}::test_server_optimizer_sees_theta_in_the_kernel_and_the_mean",
            f"{NEW}::test_exact_mse_with_weight_decay_matches_its_second_moment_recursion",
        ),
        "exact recursions give the server optimizer zeros as params",
    ),
    Mutation(
        "theory-optimizer-params-error",
        "fedsa_jax/moments/phases.py",
        "shift = c + Mp @ y.theta_star  # the constant in error coordinates",
        "shift = c  # the constant in error coordinates",
        (f"{NEW}::test_exact_mse_with_weight_decay_matches_its_second_moment_recursion",),
        "exact recursions give the server optimizer theta - theta_star as params",
    ),
    Mutation(
        "last-iterate-one-level",
        "fedsa_jax/metrics.py",
        'while hasattr(state, "inner"):',
        'if hasattr(state, "inner"):',
        (f"{NEW}::test_last_iterate_mse_reads_through_nested_wrappers",),
        "last_iterate_mse unwraps one wrapper: under richardson(averaged(...)) it scores the average",
    ),
    Mutation(
        "drift-against-previous-iterate",
        "fedsa_jax/algorithms/fedlsa.py",
        "    state = FedLSAState(\n"
        "        problem.theta_star + error, error, sampler, state.count + 1, opt_state, delivery.memory, hat, past\n"
        "    )\n"
        "    return state, round_info(local, error, delivery, config, problem, cohort, state.count - 1, counts)",
        "    info = round_info(local, state.error, delivery, config, problem, cohort, state.count, counts)\n"
        "    state = FedLSAState(\n"
        "        problem.theta_star + error, error, sampler, state.count + 1, opt_state, delivery.memory, hat, past\n"
        "    )\n"
        "    return state, info",
        (f"{NEW}::test_client_drift_is_the_documented_mean_over_agents[fedlsa]",),
        "FedLSA's client drift measured against theta_t instead of theta_{t+1}",
    ),
    Mutation(
        "drift-mean-over-coordinates",
        "fedsa_jax/algorithms/_base.py",
        "drift = jnp.mean(jnp.sum((local - theta) ** 2, axis=-1))",
        "drift = jnp.mean((local - theta) ** 2)",
        (f"{NEW}::test_client_drift_is_the_documented_mean_over_agents[scafflsa]",),
        "client drift averaged over coordinates too (|.|^2 / d)",
    ),
    Mutation(
        "scaffnew-drift-against-sync",
        "fedsa_jax/algorithms/scaffnew.py",
        "drift = jnp.mean(jnp.sum((x - error) ** 2, axis=-1))",
        "drift = jnp.mean(jnp.sum((x - x_sync) ** 2, axis=-1))",
        (f"{NEW}::test_client_drift_is_the_documented_mean_over_agents[scaffnew]",),
        "Scaffnew's drift against the last synchronised iterate, not the round's server iterate",
    ),
    Mutation(
        "driver-ignores-error-field",
        "fedsa_jax/_runtime/kernel.py",
        "diff = jnp.where(agrees, error, diff)",
        "diff = jnp.where(agrees, diff, diff)",
        (f"{NEW}::test_float32_mse_is_the_accurate_error_at_a_tiny_step_near_theta_star",),
        "the driver scores theta - theta_star in float32, not the state's accurate error",
    ),
    Mutation(
        "driver-error-agreement-without-theta-star",
        "fedsa_jax/_runtime/kernel.py",
        "tol = 4 * eps * (jnp.abs(problem.theta_star) + jnp.abs(error)) + jnp.finfo(theta.dtype).tiny",
        "tol = 4 * eps * jnp.abs(error) + jnp.finfo(theta.dtype).tiny",
        (f"{NEW}::test_float32_mse_is_the_accurate_error_at_a_tiny_step_near_theta_star",),
        "the error field is used only when it agrees with theta - theta_star to its own precision",
    ),
    Mutation(
        "gaussian-fast-path-regardless",
        "fedsa_jax/problems/gaussian.py",
        "if cls.error_direction is not GaussianLSA.error_direction or cls._noise is not GaussianLSA._noise:",
        "if False:",
        (f"{NEW}::test_a_subclass_with_its_own_noise_runs_its_own_noise[fedlsa]",),
        "a Gaussian subclass with its own directions or noise takes the laid-out steps of the family's noise",
    ),
    Mutation(
        "gaussian-fast-path-ignores-noise",
        "fedsa_jax/problems/gaussian.py",
        "if cls.error_direction is not GaussianLSA.error_direction or cls._noise is not GaussianLSA._noise:",
        "if cls.error_direction is not GaussianLSA.error_direction:",
        (f"{NEW}::test_a_subclass_with_its_own_noise_runs_its_own_noise[scafflsa]",),
        "a Gaussian subclass that changes only its noise takes the laid-out steps",
    ),
    Mutation(
        "t-interval-all-seeds",
        "fedsa_jax/result.py",
        "return t_interval(self.mse_mean, self.mse_sem, self.num_seeds - self.num_diverged, level)",
        "return t_interval(self.mse_mean, self.mse_sem, self.num_seeds, level)",
        ("tests/test_growth.py::test_t_interval_counts_the_seeds_that_did_not_diverge",),
        "the t interval's degrees of freedom from every seed, the diverged ones included",
    ),
    Mutation(
        "growth-warning-off",
        "fedsa_jax/_runtime/driver.py",
        "        if growth is not None:\n            warnings.warn(",
        "        if False:\n            warnings.warn(",
        (
            "tests/test_growth.py::test_blow_up_warns_naming_algorithm_rounds_and_factor",
            "tests/test_growth.py::test_cli_blow_up_prints_the_warning_and_the_console_line_says_it",
        ),
        "a run whose MSE grows 1000x with no seed non-finite reports '0 diverged' without a word",
    ),
    Mutation(
        "growth-from-the-start-only",
        "fedsa_jax/_runtime/growth.py",
        "if end > factor * floor and end > math.sqrt(factor) * mid:  # False on NaN",
        "if end > factor * floor:  # False on NaN",
        ("tests/test_growth.py::test_growth_rule",),
        "growth measured from round 0 alone: a run started at theta_star warns as it reaches its floor",
    ),
    # --- untested behaviours: cohort drift, top-k, until, BCa, --clients-per-round ----------------
    Mutation(
        "cohort-drift-over-all-agents",
        "fedsa_jax/algorithms/_base.py",
        "drift = jnp.sum(jnp.where(cohort, jnp.sum((local - theta) ** 2, axis=-1), 0.0)) / m",
        "drift = jnp.sum(jnp.where(cohort, jnp.sum((local - theta) ** 2, axis=-1), 0.0)) / local.shape[0]",
        (f"{UNTESTED}::test_cohort_client_drift_is_the_cohorts_mean_squared_norm[fedlsa]",),
        "a cohort's client drift divided by N, not by the m agents that ran",
    ),
    Mutation(
        "cohort-drift-mean-over-coordinates",
        "fedsa_jax/algorithms/_base.py",
        "drift = jnp.sum(jnp.where(cohort, jnp.sum((local - theta) ** 2, axis=-1), 0.0)) / m",
        "drift = jnp.sum(jnp.where(cohort, jnp.mean((local - theta) ** 2, axis=-1), 0.0)) / m",
        (f"{UNTESTED}::test_cohort_client_drift_is_the_cohorts_mean_squared_norm[scafflsa]",),
        "a cohort's client drift averaged over coordinates too (|.|^2 / d)",
    ),
    Mutation(
        "scaffnew-cohort-drift-over-all-agents",
        "fedsa_jax/algorithms/scaffnew.py",
        "drift = jnp.sum(jnp.where(inside, (x - error) ** 2, 0.0)) / m",
        "drift = jnp.sum(jnp.where(inside, (x - error) ** 2, 0.0)) / N",
        (f"{UNTESTED}::test_scaffnew_cohort_client_drift_is_the_cohorts_mean_squared_norm",),
        "Scaffnew's cohort drift divided by N, not by the cohort's m agents",
    ),
    Mutation(
        "top-k-branch-smallest",
        "fedsa_jax/channel/quantizers.py",
        "chosen = jax.lax.top_k(score, k)[1]",
        "chosen = jax.lax.top_k(-score, k)[1]",
        (f"{UNTESTED}::test_top_k_above_the_argmax_passes_keeps_the_largest[5]",),
        "top-k with k > 4 (lax.top_k) keeps the k smallest coordinates",
    ),
    Mutation(
        "until-ignores-min-seeds",
        "fedsa_jax/_runtime/driver.py",
        "return seeds >= until.min_seeds and until.met(",
        "return until.met(",
        (f"{UNTESTED}::test_until_runs_min_seeds_even_when_the_target_is_met_earlier",),
        "fj.until stops below min_seeds when the target is met early",
    ),
    Mutation(
        "until-checks-every-round",
        "fedsa_jax/_runtime/options.py",
        "checked = np.ones(len(rounds), bool) if self.rounds is None else np.isin(rounds, self.rounds)",
        "checked = np.ones(len(rounds), bool)",
        (f"{UNTESTED}::test_until_checks_only_the_named_rounds",),
        "fj.until(rounds=...) checks every recorded round",
    ),
    Mutation(
        "until-rounds-by-position",
        "fedsa_jax/_runtime/options.py",
        "checked = np.ones(len(rounds), bool) if self.rounds is None else np.isin(rounds, self.rounds)",
        "checked = np.ones(len(rounds), bool) if self.rounds is None else np.isin(np.arange(len(rounds)), self.rounds)",
        (f"{UNTESTED}::test_until_checks_only_the_named_rounds",),
        "fj.until(rounds=...) reads the rounds as positions among the recorded rows",
    ),
    Mutation(
        "bca-no-acceleration",
        "fedsa_jax/stats.py",
        "a = np.sum(dev**3) / (6 * ss**1.5)",
        "a = 0.0 * np.sum(dev**3) / (6 * ss**1.5)",
        (f"{UNTESTED}::test_bca_interval_uses_the_jackknife_acceleration",),
        "the BCa interval without its acceleration (the bias-corrected percentile interval)",
    ),
    Mutation(
        "cli-cohort-dropped-fedlsa",
        "fedsa_jax/algorithms/fedlsa.py",
        "        skip=args.skip,\n        clients_per_round=args.clients_per_round,\n",
        "        skip=args.skip,\n",
        (f"{UNTESTED}::test_clients_per_round_reaches_every_factory_from_the_command_line_and_a_grid",),
        "--clients-per-round does not reach FedLSA's factory",
    ),
    Mutation(
        "cli-cohort-dropped-scafflsa",
        "fedsa_jax/algorithms/scafflsa.py",
        "        skip=args.skip,\n        clients_per_round=args.clients_per_round,\n",
        "        skip=args.skip,\n",
        (f"{UNTESTED}::test_clients_per_round_reaches_every_factory_from_the_command_line_and_a_grid",),
        "--clients-per-round does not reach SCAFFLSA's factory",
    ),
    Mutation(
        "cli-cohort-dropped-qfedtd",
        "fedsa_jax/algorithms/qfedtd.py",
        "return qfedtd(step_size, clients_per_round=args.clients_per_round, **channel)",
        "return qfedtd(step_size, **channel)",
        (f"{UNTESTED}::test_clients_per_round_reaches_every_factory_from_the_command_line_and_a_grid",),
        "--clients-per-round does not reach QFedTD's factory",
    ),
    Mutation(
        "cli-cohort-dropped-scaffnew",
        "fedsa_jax/algorithms/scaffnew.py",
        "        clients_per_round=args.clients_per_round,\n",
        "",
        (f"{UNTESTED}::test_clients_per_round_reaches_every_factory_from_the_command_line_and_a_grid",),
        "--clients-per-round does not reach Scaffnew's factory",
    ),
    # --- untested behaviours: factored noise, stability certificate, on_record, compare's ratio -----
    Mutation(
        "factored-cv-own-noise-dropped",
        "fedsa_jax/theory/_agents.py",
        "        blocks[idx, :, idx, :] += own\n",
        "",
        (
            f"{UNTESTED}::test_factored_control_variates_keep_the_noise_in_their_rows[scafflsa]",
            f"{UNTESTED}::test_factored_control_variates_keep_the_noise_in_their_rows[scaffnew]",
        ),
        "the factored recursion drops each agent's fresh noise Q R Q^T from the control variates' blocks",
    ),
    Mutation(
        "factored-cv-noise-cross-term-dropped",
        "fedsa_jax/theory/_agents.py",
        "np.concatenate([P, Cf, QRG + Cf @ Nz], axis=1)",
        "np.concatenate([P, Cf, Cf @ Nz], axis=1)",
        (f"{UNTESTED}::test_factored_control_variates_keep_the_noise_in_their_rows[scafflsa]",),
        "the factored recursion drops the noise's cross term Q R G^T C^T between the control variates",
    ),
    Mutation(
        "factored-cv-noise-globals-term-dropped",
        "fedsa_jax/theory/_agents.py",
        "XG = U_G @ A.T + U_X @ MG[:, g:].T + QRG  #",
        "XG = U_G @ A.T + U_X @ MG[:, g:].T  #",
        (f"{UNTESTED}::test_factored_control_variates_keep_the_noise_in_their_rows[scaffnew]",),
        "the factored recursion drops the noise's cross term Q R G^T between control variates and globals",
    ),
    Mutation(
        "stability-certificate-against-ones",
        "fedsa_jax/theory/stationary.py",
        "diagonal = (op.iu[0] == op.iu[1])[1:][sigma].astype(float)  # the identity's entries",
        "diagonal = np.ones(len(sigma))  # the identity's entries",
        (f"{UNTESTED}::test_stability_certificate_solves_against_the_identity",),
        "the mean-square certificate solves X - T(X) = J (all ones): a stable round with T = c^2 I refused",
    ),
    Mutation(
        "on-record-counts-all-seeds",
        "fedsa_jax/_runtime/driver.py",
        "    seeds = plan.seeds_done(batch, run.num_seeds)\n",
        "    seeds = run.num_seeds\n",
        (f"{UNTESTED}::test_on_record_statistics_and_counts_cover_the_seeds_run_so_far",),
        "on_record's statistics after batch b count the run's seeds, not those run so far",
    ),
    Mutation(
        "ratio-covariance-sign",
        "fedsa_jax/_runtime/compare.py",
        "sb**2 / mb**2 - 2 * cov / (ma * mb)",
        "sb**2 / mb**2 + 2 * cov / (ma * mb)",
        ("tests/test_statistics.py::test_ratio_interval_uses_the_covariance_with_its_sign",),
        "the ratio interval adds the paired covariance instead of subtracting it",
    ),
    # --- damaged files, integer bounds, rate's edges -------------------------------------------------
    Mutation(
        "damaged-header-not-caught",
        "fedsa_jax/_io.py",
        "    except Exception as err:  # zipfile's, numpy's header parser's",
        "    except (ValueError, OSError, KeyError, EOFError) as err:  # zipfile's, numpy's header parser's",
        ("tests/test_damaged_files.py::test_flips_in_headers_are_damaged_files",),
        "a flip in a zip or npy header escapes as NotImplementedError / tokenize.TokenError",
    ),
    Mutation(
        "edited-sem-nan-loads",
        "fedsa_jax/result.py",
        "defined = (num_seeds - diverged) >= 2",
        "defined = (num_seeds - diverged) >= num_seeds + 2",
        ("tests/test_damaged_files.py::test_values_no_run_writes_are_a_damaged_file",),
        "a standard error NaN where the seed count defines it loads silently",
    ),
    Mutation(
        "sweep-blocked-entry-not-refused",
        "fedsa_jax/_runtime/sweep.py",
        '                return None, "blocked"',
        '                return None, ""',
        ("tests/test_damaged_files.py::test_a_folder_where_a_sweep_result_goes_refuses_that_entry_alone",),
        "a folder where a sweep result goes is retried as damaged, then the write fails",
    ),
    Mutation(
        "integer-no-int32-bound",
        "fedsa_jax/_validate.py",
        "    if maximum is None and value > INDEX_MAX:",
        "    if maximum is None and value > 2**70:",
        ("tests/test_integer_bounds.py",),
        "2**64 passes the check and fails in the conversion with OverflowError",
    ),
    Mutation(
        "rate-no-rounding-floor",
        "fedsa_jax/stats.py",
        "    low = m <= floor\n",
        "    low = m < 0\n",
        ("tests/test_statistics.py::test_rate_refuses_a_diverged_curve_and_warns_at_the_rounding_floor",),
        "a slope fitted through float64 rounding noise is returned without a word",
    ),
    Mutation(
        "plug-in-centred-by-old-means",
        "fedsa_jax/algorithms/plug_in.py",
        "        n = jnp.maximum(count, 1).astype(theta.dtype)\n        eps = g - (sum_A / n @ theta - sum_b / n)",
        "        n = jnp.maximum(count, 1).astype(theta.dtype)\n        eps = g - (sum_A / n @ theta - (sum_b - w @ b) / n)",
        ("tests/test_plug_in.py::test_the_sums_equal_a_numpy_loop",),
        "the noise centred by a mean that leaves out the round's own observations",
    ),
    Mutation(
        "plug-in-counts-inactive-steps",
        "fedsa_jax/algorithms/plug_in.py",
        "    used = jnp.broadcast_to(active, (problem.num_agents, H))",
        "    used = jnp.ones((problem.num_agents, H), bool)",
        ("tests/test_plug_in.py::test_the_plug_in_observes_what_the_algorithm_observes",),
        "observations of steps past H_t (step size 0) counted in the means",
    ),
    Mutation(
        "plug-in-noise-not-over-n",
        "fedsa_jax/algorithms/plug_in.py",
        "    noise = jnp.mean(m.sum_noise / n, axis=0) / m.agents",
        "    noise = jnp.mean(m.sum_noise / n, axis=0)",
        ("tests/test_plug_in.py::test_the_interval_is_the_exact_one_to_first_order_and_covers",),
        "the noise not averaged over the N agents: the interval sqrt(N) times too wide",
    ),
    Mutation(
        "gauss-jordan-no-pivoting",
        "fedsa_jax/algorithms/plug_in.py",
        "        row = jnp.argmax(jnp.where(jnp.arange(n) >= k, jnp.abs(M[:, k]), -1.0))",
        "        row = k",
        ("tests/test_plug_in.py::test_lyapunov_equals_scipy",),
        "elimination without row exchanges: wrong or NaN where a pivot is small",
    ),
    Mutation(
        "joint-quantile-at-tail",
        "fedsa_jax/inference.py",
        "            threshold = jnp.quantile(jax.vmap(mahalanobis)(spread), self.level)",
        "            threshold = jnp.quantile(jax.vmap(mahalanobis)(spread), 1 - self.level)",
        ("tests/test_inference.py::test_joint_sets_cover_at_their_level_and_equal_the_formula",),
        "the bootstrap's joint threshold at the wrong tail",
    ),
    Mutation(
        "local-work-one-step-more",
        "fedsa_jax/channel/local_work.py",
        "    mask = (jnp.arange(num_steps, dtype=jnp.int32)[None, :] < counts[:, None]).astype(dtype)",
        "    mask = (jnp.arange(num_steps, dtype=jnp.int32)[None, :] <= counts[:, None]).astype(dtype)",
        ("tests/test_local_work.py::test_gaussian_round_by_round_against_numpy",),
        "every agent runs one local step past its count",
    ),
    Mutation(
        "fednova-scale-inverted",
        "fedsa_jax/channel/local_work.py",
        "    scale = work.tau(local.shape[0]) / counts.astype(local.dtype)",
        "    scale = counts.astype(local.dtype) / work.tau(local.shape[0])",
        ("tests/test_local_work.py::test_gaussian_round_by_round_against_numpy",),
        "FedNova's normalisation multiplies by H_c / tau instead of tau / H_c",
    ),
    Mutation(
        "scafflsa-common-denominator",
        "fedsa_jax/channel/local_work.py",
        "    return jnp.sum(jnp.where(mask, steps, 0.0), axis=1, keepdims=True)",
        "    return jnp.sum(steps)",
        ("tests/test_local_work.py::test_scafflsa_round_by_round_against_numpy",),
        "SCAFFLSA's control variates divide by the round's H_max steps, not the agent's own",
    ),
    Mutation(
        "random-stop-cross-terms-from-diagonal",
        "fedsa_jax/moments/phases.py",
        "        out = conjugate(self.mean(), S)\n        out[diag] = acc",
        "        out = conjugate(self.mean(), S)",
        ("tests/test_local_work.py::test_monte_carlo_matches_exact_mse_gaussian",),
        "independent counts: each agent's own block from the mean map (its spread over counts lost)",
    ),
    Mutation(
        "local-work-counts-lockstep",
        "fedsa_jax/algorithms/_base.py",
        "        * (jnp.int32(N) * H if counts is None else jnp.sum(counts)),",
        "        * (jnp.int32(N) * H),",
        ("tests/test_local_work.py::test_through_the_driver_and_the_counts",),
        "the observation count ignores the agents' counts",
    ),
    Mutation(
        "delay-off-by-one-lag",
        "fedsa_jax/channel/delays.py",
        "    return jnp.concatenate([error[None], past])[lags]",
        "    return jnp.concatenate([error[None], past])[jnp.minimum(lags + 1, past.shape[0])]",
        ("tests/test_delays.py::test_gaussian_round_by_round_against_numpy",),
        "every agent starts one round older than its delay",
    ),
    Mutation(
        "delay-buffer-not-moving",
        "fedsa_jax/channel/delays.py",
        "    return jnp.concatenate([error[None], past[:-1]])",
        "    return past",
        ("tests/test_delays.py::test_gaussian_round_by_round_against_numpy",),
        "the buffer keeps theta_0: stale starts never move",
    ),
    Mutation(
        "delayed-message-against-current",
        "fedsa_jax/channel/delays.py",
        "        return error + (local - start), error",
        "        return local, error",
        ("tests/test_delays.py::test_gaussian_round_by_round_against_numpy",),
        "the server averages the stale local iterates instead of applying their updates",
    ),
    Mutation(
        "delay-theory-buffer-still",
        "fedsa_jax/channel/delays.py",
        '    return [start, *local_work_theory(y, config, steps, "lag"), rebase, push]',
        '    return [start, *local_work_theory(y, config, steps, "lag"), rebase]',
        ("tests/test_delays.py::test_monte_carlo_matches_exact_mse_gaussian",),
        "the exact recursion's buffer never moves",
    ),
    Mutation(
        "scafflsa-delayed-local-not-rebased",
        "fedsa_jax/algorithms/scafflsa.py",
        "    local, start = delayed_messages(state.error, start, local)  # delayed: updates move the current iterate",
        "    start = state.error if start.ndim == 2 else start",
        ("tests/test_delays.py::test_scafflsa_round_by_round_against_numpy",),
        "SCAFFLSA averages the stale local iterates and moves its control variates against them",
    ),
    Mutation(
        "fedbuff-download-at-arrival",
        "fedsa_jax/algorithms/fedbuff.py",
        "        advanced = now > ev.clock",
        "        advanced = now >= ev.clock",
        ("tests/test_fedbuff.py::test_gaussian_round_by_round_against_numpy",),
        "an agent downloads when it arrives, before the rest of its tick's arrivals step the server",
    ),
    Mutation(
        "fedbuff-staleness-unweighted",
        "fedsa_jax/algorithms/fedbuff.py",
        "            ev.total + config.weight(tau, dtype) * sent,",
        "            ev.total + sent,",
        ("tests/test_fedbuff.py::test_gaussian_round_by_round_against_numpy",),
        "the staleness weights are ignored",
    ),
    Mutation(
        "fedbuff-clock-not-advancing",
        "fedsa_jax/algorithms/fedbuff.py",
        "            ev.finish.at[j].set(now + duration),",
        "            ev.finish.at[j].set(ev.finish[j] + 1),",
        ("tests/test_fedbuff.py::test_gaussian_round_by_round_against_numpy",),
        "every job lasts one tick whatever its law",
    ),
    Mutation(
        "fedbuff-version-not-recorded",
        "fedsa_jax/algorithms/fedbuff.py",
        "        version = jnp.where(download, state.count, ev.version)",
        "        version = ev.version",
        ("tests/test_fedbuff.py::test_gaussian_round_by_round_against_numpy",),
        "the staleness counts from theta_0",
    ),
    # --- issue 47: privacy and the loader ---
    Mutation(
        "adaptive-clip-uncentred-count",
        "fedsa_jax/channel/dp.py",
        "    centred = jnp.where(norms <= clip_norm, 0.5, -0.5).astype(dtype)  # b_c - 1/2\n"
        "    below = jnp.sum(jnp.where(delivered, centred, 0.0))\n"
        "    z = _prng.normal(jax.random.fold_in(key, PRIVACY_STREAM + 1), (), dtype)\n"
        "    noised = below + jnp.asarray(privacy_.count_noise, dtype) * z\n"
        "    fraction = noised / jnp.asarray(senders, dtype) + 0.5\n",
        "    centred = (norms <= clip_norm).astype(dtype)\n"
        "    below = jnp.sum(jnp.where(delivered, centred, 0.0))\n"
        "    z = _prng.normal(jax.random.fold_in(key, PRIVACY_STREAM + 1), (), dtype)\n"
        "    noised = below + jnp.asarray(privacy_.count_noise, dtype) * z\n"
        "    fraction = noised / jnp.asarray(senders, dtype)\n",
        ("tests/test_privacy.py::test_adaptive_clipping_epsilon_covers_its_worst_neighbours",),
        "the count sums the bits b_c, not b_c - 1/2: one agent moves it by 1, Theorem 1 composes 1/2",
    ),
    Mutation(
        "adaptive-clip-counts-received",
        "fedsa_jax/channel/dp.py",
        "    fraction = noised / jnp.asarray(senders, dtype) + 0.5",
        "    fraction = noised / jnp.maximum(jnp.sum(delivered), 1).astype(dtype) + 0.5",
        ("tests/test_privacy.py::test_adaptive_clipping_counts_over_the_agents_asked",),
        "adaptive clipping's fraction divides by the messages received, not the agents asked",
    ),
    Mutation(
        "adaptive-clip-count-noise-is-sum-noise",
        "fedsa_jax/channel/dp.py",
        "    z = _prng.normal(jax.random.fold_in(key, PRIVACY_STREAM + 1), (), dtype)",
        "    z = _prng.normal(jax.random.fold_in(key, PRIVACY_STREAM), (1,), dtype)[0]",
        ("tests/test_privacy.py::test_adaptive_clipping_count_noise_is_independent_of_the_sum_noise",),
        "the count's noise is drawn from the sum's stream (correlated with the sum's noise)",
    ),
    Mutation(
        "cohort-amplified-bound-only",
        "fedsa_jax/channel/accounting.py",
        "        if best is None or eps < best[0]:",
        "        if best is None:",
        ("tests/test_privacy.py::test_a_cohort_reports_the_smaller_valid_bound",),
        "a cohort reports the amplified RDP bound even where no amplification is tighter",
    ),
    Mutation(
        "cohort-of-n-accounted-as-sampling",
        "fedsa_jax/channel/accounting.py",
        "    if m is None or m >= num_agents:  # every agent every round: no sampling",
        "    if m is None:  # every agent every round: no sampling",
        ("tests/test_privacy.py::test_a_cohort_of_every_agent_is_full_participation",),
        "clients_per_round = N is accounted as a sample under replace-one (overstates epsilon)",
    ),
    Mutation(
        "target-epsilon-local-calibrated-as-central",
        "fedsa_jax/cli/build.py",
        "            target, rounds, args.agents, args.delta, args.dp_mode, args.clients_per_round",
        '            target, rounds, args.agents, args.delta, "central", args.clients_per_round',
        ("tests/test_privacy.py::test_result_and_command_line",),
        "--target-epsilon calibrates local noise with the central mode's accounting",
    ),
    Mutation(
        "sweep-target-epsilon-on-total-steps",
        "fedsa_jax/cli/build.py",
        "            rounds = max(1, rounds_within(_make_algorithm(args.algorithm, plain), args.total_local_steps)[0])",
        "            rounds = args.total_local_steps",
        ("tests/test_privacy.py::test_a_sweep_at_a_total_of_local_steps_calibrates_each_configuration",),
        "a sweep at a total of local steps calibrates every configuration on the total, not its rounds",
    ),
    Mutation(
        "huge-noise-multiplier-not-capped",
        "fedsa_jax/channel/accounting.py",
        "    noise = min(noise, MAX_NOISE_MULTIPLIER)",
        "    noise = noise",
        ("tests/test_privacy.py::test_accounting_at_its_limits_is_a_number_or_one_line",),
        "a noise multiplier of 1e200 overflows the accountant (after the run)",
    ),
    Mutation(
        "loader-privacy-record-unchecked",
        "fedsa_jax/result.py",
        '        _check_privacy(config.get("privacy"))\n',
        "",
        ("tests/test_result_integrity.py::test_load_refuses_edited_two_seed_files_and_privacy_records",),
        "a result whose privacy record was edited (epsilon -3, a string, NaN) loads",
    ),
    Mutation(
        "loader-negative-theta-sem",
        "fedsa_jax/result.py",
        '    for key in ("mse_mean", "mse_quantiles", "seed_mse", "mse_sem", "theta_sem"):',
        '    for key in ("mse_mean", "mse_quantiles", "seed_mse", "mse_sem"):',
        ("tests/test_result_integrity.py::test_load_refuses_edited_two_seed_files_and_privacy_records",),
        "fj.load accepts a negative theta_sem",
    ),
    Mutation(
        "loader-nan-sem-needs-three-seeds",
        "fedsa_jax/result.py",
        "    defined = (num_seeds - diverged) >= 2",
        "    defined = (num_seeds - diverged) >= 3",
        ("tests/test_result_integrity.py::test_load_refuses_edited_two_seed_files_and_privacy_records",),
        "a NaN standard error is accepted where exactly two seeds survive",
    ),
    Mutation(
        "loader-refuses-all-diverged",
        "fedsa_jax/result.py",
        "    defined = (num_seeds - diverged) >= 2",
        "    defined = (num_seeds - diverged) >= 0",
        (
            "tests/test_result_integrity.py::test_load_accepts_runs_where_every_seed_diverged_and_names_a_folder",
        ),
        "fj.load refuses a result where every seed diverged at some round (NaN standard errors there)",
    ),
    Mutation(
        "loader-folder-as-damaged",
        "fedsa_jax/_io.py",
        "    except (FileNotFoundError, PermissionError, IsADirectoryError):",
        "    except (FileNotFoundError, PermissionError):",
        (
            "tests/test_result_integrity.py::test_load_accepts_runs_where_every_seed_diverged_and_names_a_folder",
        ),
        "a folder where a file is expected is reported as a damaged file",
    ),
    # --- issue 47: inference ---
    Mutation(
        "quantile-interval-alpha-in-each-tail",
        "fedsa_jax/inference.py",
        "return jnp.quantile(vb, alpha / 2), jnp.quantile(vb, 1 - alpha / 2)",
        "return jnp.quantile(vb, alpha), jnp.quantile(vb, 1 - alpha)",
        (
            "tests/test_inference.py::test_bootstrap_bounds_and_variance_equal_numpy_on_each_seeds_replicates",
            "tests/test_inference.py::test_bootstrap_intervals_cover_at_their_level",
        ),
        "the bootstrap's quantile interval puts alpha, not alpha/2, in each tail",
    ),
    Mutation(
        "normal-interval-sd-over-sqrt-b",
        "fedsa_jax/inference.py",
        "            sd = jnp.std(vb)\n",
        "            sd = jnp.std(vb) / jnp.sqrt(vb.shape[0])\n",
        (
            "tests/test_inference.py::test_bootstrap_bounds_and_variance_equal_numpy_on_each_seeds_replicates",
            "tests/test_inference.py::test_bootstrap_intervals_cover_at_their_level",
        ),
        "the normal interval divides the replicates' sd by sqrt(B): 10x too narrow at B = 100",
    ),
    Mutation(
        "bootstrap-variance-around-replicates-mean",
        "fedsa_jax/inference.py",
        "spread = (_replicates(state).theta - state.theta) @ u",
        "spread = (_replicates(state).theta - jnp.mean(_replicates(state).theta, axis=0)) @ u",
        ("tests/test_inference.py::test_bootstrap_bounds_and_variance_equal_numpy_on_each_seeds_replicates",),
        "bootstrap_variance is centred at the replicates' mean, not at the main iterate",
    ),
    Mutation(
        "exact-interval-sd-of-next-round",
        "fedsa_jax/inference.py",
        "[jnp.minimum(state.count, len(self.sd) - 1)]",
        "[jnp.minimum(state.count + 1, len(self.sd) - 1)]",
        ("tests/test_inference.py::test_exact_interval_of_a_bare_bootstrap_uses_the_rounds_own_sd",),
        "the exact interval at round t uses the sd of round t + 1",
    ),
    Mutation(
        "bootstrap-round-counter-frozen",
        "fedsa_jax/algorithms/bootstrap.py",
        "replicates, state.count + 1), info",
        "replicates, state.count), info",
        ("tests/test_inference.py::test_exact_interval_of_a_bare_bootstrap_uses_the_rounds_own_sd",),
        "a bare bootstrap's round counter stays at 0: its exact interval collapses to a point",
    ),
    Mutation(
        "joint-singular-covariance-covers",
        "fedsa_jax/inference.py",
        "return jnp.where(jnp.isfinite(distance), distance, jnp.inf)",
        "return jnp.where(jnp.isfinite(distance), distance, 0.0)",
        ("tests/test_inference.py::test_a_singular_joint_covariance_does_not_cover",),
        "a joint set with a singular covariance (round 0) covers by putting theta* at distance 0",
    ),
    Mutation(
        "plug-in-eta-first-local-step",
        "fedsa_jax/algorithms/plug_in.py",
        "    return etas[last]\n",
        "    return etas[0]\n",
        ("tests/test_plug_in.py::test_the_step_size_is_the_rounds_last_local_step",),
        "the plug-in's eta_t is the round's first local step size, not its last",
    ),
    Mutation(
        "plug-in-eta-of-h-max",
        "fedsa_jax/algorithms/plug_in.py",
        "    return etas[last]\n",
        "    return etas[-1]\n",
        ("tests/test_plug_in.py::test_the_step_size_is_the_rounds_last_local_step",),
        "the plug-in's eta_t is the step size of step H_max - 1 (0 in a round with H_t < H_max)",
    ),
    Mutation(
        "exact-table-shorter-than-run-accepted",
        "fedsa_jax/inference.py",
        "    if len(table) < num_rounds + 1:",
        "    if False:",
        (
            "tests/test_inference.py::test_a_table_or_direction_that_does_not_fit_the_run_is_refused_before_compiling",
        ),
        "an exact table shorter than the run is accepted and its last row reused",
    ),
    Mutation(
        "direction-not-normalised",
        "fedsa_jax/inference.py",
        "return tuple(float(x) for x in u / np.linalg.norm(u))",
        "return tuple(float(x) for x in np.asarray(direction, np.float64))",
        ("tests/test_inference.py::test_coverage_does_not_depend_on_the_directions_scale_in_float32",),
        "the direction's scale overflows or underflows in float32",
    ),
    Mutation(
        "colliding-level-names-accepted",
        "fedsa_jax/inference.py",
        "        if other is not None:",
        "        if False:",
        ("tests/test_inference.py::test_bad_input_is_a_one_line_error",),
        "levels 0.9 and 0.9000001 share one metric name and one is dropped",
    ),
    Mutation(
        "bootstrap-of-plug-in-without-hint",
        "fedsa_jax/algorithms/bootstrap.py",
        "    if isinstance(algorithm.config, PlugInConfig):",
        "    if False:",
        ("tests/test_bootstrap.py::test_bad_input_is_a_one_line_error",),
        "fj.bootstrap(fj.plug_in(alg)) does not say to wrap the other way",
    ),
    # --- issue 47: first use ---
    Mutation(
        "scafflsa-accepts-random-work-per-agent",
        "fedsa_jax/algorithms/scafflsa.py",
        'if work is None or work.deterministic or work.shared or work.normalization != "none":',
        "if True:",
        ("tests/test_first_use.py::test_scafflsa_refuses_random_counts_per_agent_with_plain_averaging",),
        "SCAFFLSA runs counts drawn per agent with plain averaging, which diverges without a word",
    ),
    Mutation(
        "scafflsa-refuses-shared-work",
        "fedsa_jax/algorithms/scafflsa.py",
        'if work is None or work.deterministic or work.shared or work.normalization != "none":',
        'if work is None or work.deterministic or work.normalization != "none":',
        ("tests/test_first_use.py::test_scafflsa_takes_the_laws_that_converge",),
        "a shared count (which converges) is refused with the per-agent laws",
    ),
    Mutation(
        "warning-dumps-the-configuration",
        "fedsa_jax/_runtime/driver.py",
        'f"{settings(algorithm)}: up to {worst} of',
        'f"{algorithm.name} ({algorithm.describe()}): up to {worst} of',
        ("tests/test_first_use.py::test_divergence_warning_is_short_with_a_long_law",),
        "the divergence warning lists the whole configuration, a law's table included",
    ),
    Mutation(
        "title-without-delays",
        "fedsa_jax/cli/titles.py",
        '        out += f", delays {delays}"',
        '        out += ""',
        ("tests/test_first_use.py::test_titles_name_delays_fedbuff_and_the_privacy_mechanism",),
        "the figure's title omits the delays",
    ),
    Mutation(
        "unclipped-bias-line-under-clipping",
        "fedsa_jax/cli/run.py",
        '        if getattr(args, "clip_norm", None) is not None:',
        "        if False:",
        ("tests/test_first_use.py::test_clipped_run_draws_no_unclipped_bias_line",),
        "a clipped run draws FedLSA's unclipped bias as its reference level",
    ),
    # --- issue 47: laws and FedBuff ---
    Mutation(
        "geometric-law-one-minus-p",
        "fedsa_jax/channel/local_work.py",
        "    rows = [(1.0 / float(m)) * (1 - 1.0 / float(m)) ** (h - 1) for m in means]",
        "    rows = [(1 - 1.0 / float(m)) * (1.0 / float(m)) ** (h - 1) for m in means]",
        (
            "tests/test_local_work.py::test_each_law_is_its_definition",
            "tests/test_local_work.py::test_the_geometric_laws_have_their_means",
        ),
        "a geometric law (local work, clock) has success probability 1 - p: mean 4 becomes 1.33",
    ),
    Mutation(
        "straggler-floor",
        "fedsa_jax/channel/local_work.py",
        "    slow = max(1, math.ceil(fraction * H))",
        "    slow = max(1, math.floor(fraction * H))",
        ("tests/test_local_work.py::test_each_law_is_its_definition",),
        "a straggler runs floor(fraction H) steps, not ceil",
    ),
    Mutation(
        "delay-geometric-mean",
        "fedsa_jax/channel/delays.py",
        "    q = 1.0 / (1.0 + float(mean))",
        "    q = 1.0 / max(float(mean), 1.0)",
        (
            "tests/test_local_work.py::test_each_law_is_its_definition",
            "tests/test_local_work.py::test_the_geometric_laws_have_their_means",
        ),
        "fj.delays.geometric(mean) takes 1 / mean as its success probability: geometric(1.0) is no delay",
    ),
    Mutation(
        "fednova-tau-is-hmax",
        "fedsa_jax/channel/local_work.py",
        "        return float(np.mean(self.mean_steps(num_agents)))",
        "        return float(self.max)",
        ("tests/test_local_work.py::test_fednova_tau_is_the_mean_expected_work",),
        "FedNova's tau is H_max instead of the mean expected work",
    ),
    Mutation(
        "fedbuff-drift-old-iterate",
        "fedsa_jax/algorithms/fedbuff.py",
        "    drift = (ev.locals_sq - 2 * jnp.dot(error, ev.locals_sum)) / K + jnp.sum(error * error)",
        "    drift = (ev.locals_sq - 2 * jnp.dot(state.error, ev.locals_sum)) / K + jnp.sum(state.error**2)",
        ("tests/test_fedbuff.py::test_client_drift_is_against_the_new_iterate_over_agents",),
        "FedBuff's client_drift is measured against the old server iterate",
    ),
    Mutation(
        "client-drift-over-coordinates",
        "fedsa_jax/algorithms/_base.py",
        "    drift = jnp.mean(jnp.sum((local - theta) ** 2, axis=-1))",
        "    drift = jnp.sum(jnp.mean((local - theta) ** 2, axis=-1))",
        ("tests/test_fedbuff.py::test_client_drift_is_against_the_new_iterate_over_agents",),
        "client_drift sums over agents the mean over coordinates (equal only where d = N)",
    ),
    Mutation(
        "fedbuff-ticks-int32",
        "fedsa_jax/algorithms/fedbuff.py",
        "    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32",
        "    return jnp.int32",
        ("tests/test_fedbuff.py::test_the_clock_runs_past_int32",),
        "the clock's ticks stay int32 with x64: they wrap past 2^31 and break the arrival order",
    ),
    Mutation(
        "fedbuff-int32-ticks-unchecked",
        "fedsa_jax/channel/clock.py",
        "        if not x64 and ticks > _validate.INDEX_MAX:",
        "        if False:",
        ("tests/test_fedbuff.py::test_int32_ticks_are_refused_where_they_could_wrap",),
        "without x64 a run whose int32 ticks could wrap is not refused",
    ),
    Mutation(
        "staleness-checked-on-0-to-3",
        "fedsa_jax/algorithms/fedbuff.py",
        "            bound = staleness_bound(self.durations, num_agents, self.buffer_size)",
        "            bound = 3",
        ("tests/test_fedbuff.py::test_a_staleness_function_is_checked_where_staleness_can_reach",),
        "a staleness function is checked on 0..3 only: weights <= 0 at reachable staleness run",
    ),
    Mutation(
        "law-table-uncapped",
        "fedsa_jax/channel/clock.py",
        '    check_table("duration" if slowdown == 1 else "slowdown", duration if slowdown == 1 else slowdown, 1, slow)',
        "    pass",
        ("tests/test_local_work.py::test_huge_laws_are_refused_before_allocating[<lambda>-slowdown1]",),
        "a straggler clock of 10^12 ticks allocates its table (MemoryError) instead of a one-line refusal",
    ),
    Mutation(
        "law-errors-unnamed",
        "fedsa_jax/channel/local_work.py",
        '        _validate.fail(option, text, str(err).replace(" is invalid: ", ": ", 1))',
        "        raise",
        ("tests/test_input_errors.py::test_cli_law_errors_name_the_option_and_its_text",),
        "a bad --delays/--local-work/--durations value names the law's parameter, not the option",
    ),
    Mutation(
        "law-options-without-law-read",
        "fedsa_jax/cli/checks.py",
        "            if not law_reads(args, option):",
        "            if False:",
        ("tests/test_input_errors.py::test_cli_law_options_without_their_law_are_refused",),
        "--local-work-shared, --delays-shared, --work-normalization without their law are ignored",
    ),
    Mutation(
        "fixed-work-for-other-agents",
        "fedsa_jax/channel/local_work.py",
        "            if num_agents is not None and len(values) not in (1, num_agents):",
        "            if False:",
        ("tests/test_input_errors.py::test_cli_law_errors_name_the_option_and_its_text",),
        "--local-work fixed:1,1,1 on 2 agents runs as H = 1",
    ),
    Mutation(
        "sweep-keeps-unread-keys",
        "fedsa_jax/cli/sweep_file.py",
        "        and not (k in own and not entries[name].reads(k))",
        "",
        ("tests/test_input_errors.py::test_sweep_leaves_out_the_keys_an_algorithm_does_not_read",),
        "a sweep records FedBuff's configuration with the delays it does not run",
    ),
    # --- issue 47: privacy on the command line ---
    Mutation(
        "cli-reason-keeps-python-keywords",
        "fedsa_jax/cli/checks.py",
        "    return _KEYWORD_RE.sub(keyword, _CALL_RE.sub(call, reason))",
        "    return reason",
        ("tests/test_privacy.py::test_command_line_refusals_name_the_flags",),
        "a refusal on the command line says mode='local' and clip=False instead of --dp-mode local, --no-clip",
    ),
    Mutation(
        "clipped-at-the-bound",
        "fedsa_jax/channel/dp.py",
        "    return jnp.sqrt(jnp.sum(messages * messages, axis=-1)) > bound",
        "    return jnp.sqrt(jnp.sum(messages * messages, axis=-1)) >= bound",
        ("tests/test_privacy.py::test_the_channel_counts_the_messages_clipping_shortens",),
        "a message of norm exactly C counted as clipped (clip leaves it as it is)",
    ),
    Mutation(
        "clipped-counted-outside-the-cohort",
        "fedsa_jax/channel/erasures.py",
        "jnp.sum(short if cohort is None else short & cohort)",
        "jnp.sum(short)",
        (
            "tests/test_privacy.py::test_the_channel_counts_the_messages_clipping_shortens",
            "tests/test_privacy.py::test_clipped_fraction_metric",
        ),
        "the clipped count includes agents outside the cohort (a fraction above 1)",
    ),
    Mutation(
        "scaffnew-clipped-not-counted",
        "fedsa_jax/algorithms/scaffnew.py",
        "    counts = jnp.stack([jnp.sum(delivery.delivered), jnp.asarray(delivery.clipped)]).astype(jnp.int32)",
        "    counts = jnp.stack([jnp.sum(delivery.delivered), 0 * jnp.asarray(delivery.clipped)]).astype(jnp.int32)",
        ("tests/test_privacy.py::test_clipped_fraction_metric",),
        "Scaffnew reports no clipped message whatever its communications clipped",
    ),
    Mutation(
        "cli-clipped-line-missing",
        "fedsa_jax/cli/run.py",
        "    _clipped_line(res, alg.name, summary)\n",
        "",
        ("tests/test_privacy.py::test_command_line_reports_the_clipped_fraction",),
        "a privacy run whose messages are all clipped prints nothing about it",
    ),
    # --- issue 47: first use (2) ---
    Mutation(
        "exact-refusal-never-fires",
        "fedsa_jax/cli/run.py",
        "        if cost is not None and cost.seconds(cost.rounds) > MAX_EXACT_S:\n",
        "        if cost is not None and cost.seconds(cost.rounds) > 1e3 * MAX_EXACT_S:\n",
        ("tests/test_first_use.py::test_exact_refuses_what_cannot_finish_before_anything_runs",),
        "--exact starts an exact MSE estimated at an hour (the simulation first), instead of refusing it",
    ),
    Mutation(
        "exact-cost-counts-local-steps-only",
        "fedsa_jax/theory/engine.py",
        "        operations = self.local_steps * self.dim**2 + self.maps * self.dim**3\n",
        "        operations = self.local_steps * self.dim**2\n",
        ("tests/test_first_use.py::test_exact_refuses_what_cannot_finish_before_anything_runs",),
        "the estimate leaves out the dense maps (delays' lags, aggregations): an hour estimated at 14 s",
    ),
    Mutation(
        "stationary-never-skipped",
        "fedsa_jax/cli/run.py",
        "            if estimate > MAX_EXACT_S:\n",
        "            if estimate > 1e9 * MAX_EXACT_S:\n",
        ("tests/test_first_use.py::test_a_stationary_mse_too_long_is_skipped_with_its_sizes",),
        "a stationary MSE estimated beyond the limit runs anyway",
    ),
    Mutation(
        "random-stop-finishes-impossible-outcomes",
        "fedsa_jax/moments/phases.py",
        "            if not self.pmf[:, k].any():  # an outcome of probability 0: its finish never runs\n"
        "                continue\n",
        "",
        ("tests/test_theory_speed.py::test_a_random_stop_finishes_only_its_possible_outcomes",),
        "SCAFFLSA's dense control-variate finish runs for every count, the straggler's impossible ones too",
    ),
    Mutation(
        "gmres-runs-past-stagnation",
        "fedsa_jax/theory/_operator.py",
        "        stagnated = beta >= previous or (claimed and beta > 0.5 * previous)\n",
        "        stagnated = False\n",
        (
            "tests/test_stationary.py::test_a_solve_stagnating_above_the_target_stops_and_is_kept",
            "tests/test_stationary.py::test_a_failed_solve_names_the_solver_not_the_algorithm",
        ),
        "GMRES spends its 3000 rounds at the rounding floor (the 7.5 minutes of --exact with delays)",
    ),
    Mutation(
        "stationary-accepts-only-its-target",
        "fedsa_jax/theory/stationary.py",
        "    if not residual <= _ACCEPT:\n",
        "    if not residual <= _TOL:\n",
        ("tests/test_stationary.py::test_a_solve_stagnating_above_the_target_stops_and_is_kept",),
        "a fixed point solved to 1e-11 is refused against the 1e-13 aimed at",
    ),
    Mutation(
        "growth-settled-rule-off",
        "fedsa_jax/_runtime/growth.py",
        "    if reference is not None and base > 0 and level >= SETTLED_FACTOR * base:  # False on NaN\n",
        "    if reference is not None and base > 0 and level >= 1e3 * SETTLED_FACTOR * base:  # False on NaN\n",
        (
            "tests/test_growth.py::test_settled_rule",
            "tests/test_growth.py::test_a_run_settling_far_above_its_start_warns_and_a_converging_one_does_not",
            "tests/test_growth.py::test_cli_settled_run_says_so_on_its_console_line",
        ),
        "FedBuff settling at 6x its start says nothing (0 diverged, no warning)",
    ),
    Mutation(
        "growth-settled-on-last-record",
        "fedsa_jax/_runtime/growth.py",
        "    level = float(np.median(mse[middle:]))",
        "    level = end",
        ("tests/test_growth.py::test_settled_rule",),
        "the settled rule reads the last record alone, which a heavy tail pulls down to 2.9x",
    ),
    Mutation(
        "growth-settled-ignores-reference",
        "fedsa_jax/_runtime/growth.py",
        "    base = max(start, reference or 0.0)\n",
        "    base = start\n",
        ("tests/test_growth.py::test_settled_rule",),
        "a run started at theta_star is compared with its own start, 0: never (or always) too high",
    ),
    Mutation(
        "cpu-collectives-threshold-not-raised",
        "fedsa_jax/cpu.py",
        "    if wanted > 1:\n        quiet_collectives()\n    return wanted\n",
        "    return wanted\n",
        ("tests/test_cpu.py::test_two_devices_raise_xlas_stuck_thresholds_and_xla_reads_them",),
        "two CPU devices keep XLA's 20 s 'may be stuck' lines and its abort 40 s later under load",
    ),
    Mutation(
        "cpu-collectives-threshold-overrides-the-users",
        "fedsa_jax/cpu.py",
        "        if flag not in flags:\n",
        "        if True:\n",
        ("tests/test_cpu.py::test_one_device_adds_no_flag_and_a_users_own_threshold_stays",),
        "a threshold the user set in XLA_FLAGS is overridden",
    ),
    # --- federated SARSA: observations that follow the iterate ---
    Mutation(
        "sarsa-action-from-the-state-uniform",
        "fedsa_jax/problems/federated_sarsa.py",
        "next_pair = s_next * A + self._action(s_next, u[1], theta)",
        "next_pair = s_next * A + self._action(s_next, u[0], theta)",
        ("tests/test_sarsa.py::test_kernel_equals_numpy_loop[None-None-fedlsa]",),
        "the next action reuses the next state's uniform",
    ),
    Mutation(
        "sarsa-action-from-the-round-start",
        "fedsa_jax/algorithms/_base.py",
        "o, smp = problem.observe_step(params, smp, r, th)",
        "o, smp = problem.observe_step(params, smp, r, theta)",
        ("tests/test_sarsa.py::test_kernel_equals_numpy_loop[None-None-fedlsa]",),
        "the behaviour policy follows the round's starting iterate, not the current local one",
    ),
    Mutation(
        "mean-path-limit-ignores-conserved-sums",
        "fedsa_jax/theory/mean_path.py",
        "conserved = u[:, sv <= 1e-10 * max(sv.max(initial=0.0), 1.0)].T",
        "conserved = u[:, sv < 0].T",
        ("tests/test_sarsa.py::test_mean_path_and_its_limit[scafflsa]",),
        "Newton's steps move the control variates' sum: another member of the family of fixed points",
    ),
    Mutation(
        "linear-theory-accepts-sarsa",
        "fedsa_jax/problems/protocol.py",
        "    if follows_iterate(problem):\n        return",
        "    if False:\n        return",
        ("tests/test_sarsa.py::test_linear_theory_refuses",),
        "the exact linear recursions run on a problem whose observation law follows the iterate",
    ),
    Mutation(
        "observed-updates-drop-the-control-variate",
        "fedsa_jax/algorithms/_base.py",
        "return local_updates(problem, params, obs, theta, step_size, control), sampler",
        "return local_updates(problem, params, obs, theta, step_size, None), sampler",
        ("tests/test_sarsa.py::test_problems_that_do_not_follow_the_iterate_run_as_before[gaussian]",),
        "today's problems lose SCAFFLSA's control variates on the dispatch to observe-then-update",
    ),
    Mutation(
        "garnet-control-heterogeneity-reversed",
        "fedsa_jax/problems/federated_sarsa.py",
        "P = (1.0 - h) * P_gen.mean(0) + h * P_gen[which]",
        "P = h * P_gen.mean(0) + (1.0 - h) * P_gen[which]",
        ("tests/test_sarsa.py::test_garnet_control_draws_as_the_papers_code",),
        "heterogeneity 1 puts every agent on the averaged MDP",
    ),
    Mutation(
        "sarsa-carried-entry-not-moved",
        "fedsa_jax/problems/federated_sarsa.py",
        "            e_p = jnp.where(n == p, e_n - step, e_n)\n        else:",
        "            e_p = e_n\n        else:",
        ("tests/test_sarsa.py::test_tabular_fast_path_equals_the_generic_scan[fedlsa]",),
        "the tabular step's carried e_p misses its own update when the next pair is the current one",
    ),
    Mutation(
        "classic-sarsa-next-action-at-reset-state",
        "fedsa_jax/problems/classic_sarsa.py",
        "next_action = self.policy(self.q_values(reached, behaviour), rand.u[0])",
        "next_action = self.policy(self.q_values(x_new, behaviour), rand.u[0])",
        (
            "tests/test_classic_sarsa.py::"
            "test_a_local_step_is_gymnaxs_step_and_a_softmax_draw_of_the_current_iterate",
        ),
        "the target's next action is drawn at the reset observation after a time limit, not where the step went",
    ),
    Mutation(
        "classic-sarsa-reference-replicas-sem-of-one",
        "fedsa_jax/problems/classic_sarsa.py",
        "return runs.mean(0), runs.std(0, ddof=1) / np.sqrt(REPLICAS)",
        "return runs.mean(0), runs.std(0, ddof=1)",
        (
            "tests/test_classic_sarsa.py::"
            "test_the_reference_is_reproducible_and_its_error_is_the_spread_of_independent_ones",
        ),
        "the reference's standard error is one replica's, not their mean's",
    ),
    Mutation(
        "classic-sarsa-expected-target-ignores-policy",
        "fedsa_jax/problems/classic_sarsa.py",
        "pi = self.policy.probabilities(self.q_values(move.next_x, behaviour))",
        "pi = jnp.full(self.features.num_actions, 1.0 / self.features.num_actions)",
        (
            "tests/test_classic_sarsa.py::"
            "test_fedsarsa_with_one_local_step_keeps_its_mean_on_the_deterministic_limit",
        ),
        "the reference's target averages the next action uniformly, not over the policy",
    ),
    # --- speed settings that must change no value: seed slices, merged vmaps ---
    Mutation(
        "seed-slices-merged-in-slice-order",
        "fedsa_jax/_runtime/kernel.py",
        "        return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])",
        "        return x.reshape((-1,) + x.shape[2:])",
        ("tests/test_seed_slices.py::test_by_slices_gives_each_seed_the_values_of_one_call",),
        "a round's slices come back in slice order: seeds swap states",
    ),
    Mutation(
        "merged-vmaps-outer-only-argument-tiled",
        "fedsa_jax/problems/protocol.py",
        "                x = jax.numpy.broadcast_to(x[:, None], (axis_size, size) + x.shape[1:])",
        "                x = jax.numpy.tile(x, (size,) + (1,) * (x.ndim - 1))[:, None][: axis_size * size].reshape((axis_size, size) + x.shape[1:])",
        ("tests/test_seed_slices.py::test_merged_vmaps_equal_nested_vmaps",),
        "an argument batched over the seeds only is repeated in the wrong order when the axes merge",
    ),
    # --- federated Q-learning ---
    Mutation(
        "q-async-visits-the-next-state",
        "fedsa_jax/problems/federated_q_learning.py",
        "            return s_next * A + a_next, (pair, s_next)",
        "            return s_next * A + a_next, (s_next * A + a_next, s_next)",
        ("tests/test_q_learning.py::test_kernel_equals_numpy_loop[equal-asynchronous]",),
        "the asynchronous step updates the pair it moves to, not the one it visited",
    ),
    Mutation(
        "q-theta-star-ignores-occupancy",
        "fedsa_jax/problems/federated_q_learning.py",
        '    D = np.ones((N, S, A)) if mode == "synchronous" else nu',
        "    D = np.ones((N, S, A))",
        ("tests/test_q_learning.py::test_references",),
        "the asynchronous H = 1 limit weighs the agents' Bellman residuals equally, not by their visits",
    ),
    Mutation(
        "q-error-direction-drops-the-gaps",
        "fedsa_jax/problems/federated_q_learning.py",
        "            return error + residual - self.gamma * self._targets(obs, self.gaps_star + error)",
        "            return error + residual - self.gamma * self._targets(obs, error)",
        ("tests/test_q_learning.py::test_kernel_equals_numpy_loop[equal-synchronous]",),
        "the synchronous target's max ignores Q*'s own action gaps in error coordinates",
    ),
    Mutation(
        "importance-weights-inverted",
        "fedsa_jax/algorithms/importance_averaging.py",
        "        log_weight = -jnp.log1p(-etas) @ problem.visits(obs).astype(etas.dtype)  # (d,)",
        "        log_weight = jnp.log1p(-etas) @ problem.visits(obs).astype(etas.dtype)  # (d,)",
        ("tests/test_q_learning.py::test_kernel_equals_numpy_loop",),
        "importance averaging favours the agent that visited an entry least",
    ),
    Mutation(
        "importance-normalised-over-senders-only",
        "fedsa_jax/algorithms/importance_averaging.py",
        '    normalise = asked if ch.aggregation == "divide_by_n" else delivery.delivered',
        "    normalise = delivery.delivered",
        ("tests/test_q_learning.py::test_kernel_equals_numpy_loop",),
        "divide_by_n's importance weights are normalised over what arrived, not over the agents asked",
    ),
    # --- fused local steps (Pallas kernels, interpret mode on the CPU) ---
    Mutation(
        "fused-td-drops-control",
        "fedsa_jax/problems/fused.py",
        "return tuple(e[j] - eta * (g * phi[j] - ctrl[j]) for j in range(d))",
        "return tuple(e[j] - eta * (g * phi[j]) for j in range(d))",
        (FU,),
        "the TD kernel leaves out SCAFFLSA's control variate",
    ),
    Mutation(
        "fused-first-step-size",
        "fedsa_jax/problems/fused.py",
        "eta = eta_ref[h]  # the step's size: a scalar, or a vector of the rows' own",
        "eta = eta_ref[0]",
        (FU,),
        "every local step uses the round's first step size (a schedule's later steps ignored)",
    ),
    Mutation(
        "fused-td-const-of-agent-zero",
        "fedsa_jax/problems/fused.py",
        "g = g + const_ref[offset + pair]",
        "g = g + const_ref[pair]",
        (FU,),
        "every agent reads agent 0's constants (heterogeneous rewards ignored)",
    ),
    Mutation(
        "fused-gaussian-noise-scale-at-error",
        "fedsa_jax/problems/fused.py",
        "theta = [star[i] + e[i] for i in range(d)]",
        "theta = list(e)",
        (FU,),
        "the multiplicative noise's scale is taken at the error, not at theta = theta_star + error",
    ),
    Mutation(
        "fused-rows-out-of-order",
        "fedsa_jax/problems/fused.py",
        "return out[:num_rows] if by_rows else out[:, :num_rows].T",
        "return jnp.roll(out[:num_rows] if by_rows else out[:, :num_rows].T, 1, axis=0)",
        (FU,),
        "the kernel's rows come back shifted by one (another agent's or seed's iterate)",
    ),
    Mutation(
        "fused-blocks-read-the-first",
        "fedsa_jax/problems/fused.py",
        "spec = lambda k: pl.BlockSpec((k, block), lambda i: (0, i))  # noqa: E731",
        "spec = lambda k: pl.BlockSpec((k, block), lambda i: (0, 0))  # noqa: E731",
        (FU_BLOCKS,),
        "every program reads the first block of rows (the grid's index map ignores the program)",
    ),
]


def copy_repo(dest: Path) -> None:
    shutil.copytree(
        ROOT,
        dest,
        ignore=shutil.ignore_patterns(
            ".git", "__pycache__", ".pytest_cache", "*.egg-info", "figures", "runs", "out"
        ),
    )


def run_tests(repo: Path, tests, timeout: float) -> tuple[int, list[str], str]:
    env = dict(os.environ, PYTHONPATH=str(repo))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, [], "timeout"
    out = proc.stdout + proc.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.MULTILINE)
    return proc.returncode, failed, out


def check_snippets(repo: Path, mutations) -> list[str]:
    problems = []
    for m in mutations:
        path = repo / m.file
        text = path.read_text() if path.exists() else ""
        n = text.count(m.old)
        if n != 1:
            problems.append(
                f"{m.id}: snippet found {n} times in {m.file} (expected exactly once):\n    {m.old!r}"
            )
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument(
        "--only", action="append", default=[], metavar="ID", help="run only these (repeatable)"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated copy")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    args = parser.parse_args(argv)

    ids = [m.id for m in MUTATIONS]
    assert len(set(ids)) == len(ids), "mutation ids must be unique"
    unknown = sorted(set(args.only) - set(ids))
    if unknown:
        parser.error(f"unknown mutation id(s): {', '.join(unknown)}")
    chosen = [m for m in MUTATIONS if not args.only or m.id in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.id}  [{m.file}]  {m.why}")
            for t in m.tests:
                print(f"    {t}")
        return 0

    with tempfile.TemporaryDirectory(prefix="fedsa_mutations_") as tmp:
        repo = Path(tmp) / "repo"
        copy_repo(repo)
        bad = check_snippets(repo, chosen)
        if bad:
            print("MUTATIONS OUT OF STEP WITH THE CODE (update tests/mutations.py):", file=sys.stderr)
            for line in bad:
                print("  " + line, file=sys.stderr)
            return 2
        if not args.no_baseline:
            tests = sorted({t for m in chosen for t in m.tests})
            t0 = time.perf_counter()
            rc, failed, out = run_tests(repo, tests, args.timeout * 4)
            if rc != 0:
                print(out[-4000:], file=sys.stderr)
                print(
                    f"BASELINE FAILED (rc={rc}): the unmutated tests must pass first: {failed}",
                    file=sys.stderr,
                )
                return 2
            print(
                f"baseline: {len(tests)} tests pass unmutated ({time.perf_counter() - t0:.0f} s)", flush=True
            )

        rows, survivors = [], []
        for m in chosen:
            path = repo / m.file
            original = path.read_text()
            path.write_text(original.replace(m.old, m.new))
            t0 = time.perf_counter()
            try:
                rc, failed, out = run_tests(repo, m.tests, args.timeout)
            finally:
                path.write_text(original)
            seconds = time.perf_counter() - t0
            if rc == 1 and failed:
                caught = ", ".join(f.split("::", 1)[-1] if "::" in f else f for f in failed)
            else:
                caught = "NOT CAUGHT" if rc == 0 else f"NOT CAUGHT (pytest rc={rc})"
                survivors.append(m.id)
                if rc not in (0, 1):
                    print(out[-2000:], file=sys.stderr)
            rows.append((m.id, caught, seconds))
            print(f"{m.id}: {caught} ({seconds:.0f} s)", flush=True)

    print()
    print("| mutation | caught by | seconds |")
    print("|---|---|---:|")
    for mid, caught, seconds in rows:
        print(f"| `{mid}` | {caught} | {seconds:.0f} |")
    total = sum(r[2] for r in rows)
    print(f"\n{len(rows) - len(survivors)} of {len(rows)} mutations caught in {total:.0f} s")
    if survivors:
        print(f"SURVIVED: {', '.join(survivors)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
