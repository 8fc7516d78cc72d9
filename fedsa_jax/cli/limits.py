"""The references of a run on a problem that is not linear stochastic approximation (federated SARSA,
whose observations follow the iterate; Q-learning, whose direction has a max): no closed-form bias
and no exact MSE, which are exact for linear stochastic approximation only;
with ``--exact``, each algorithm's noise-free limit (:func:`fedsa_jax.theory.mean_path_limit`) and
its squared distance to ``theta*``, the level its MSE settles near as the step size shrinks."""

from __future__ import annotations

import sys
import time

from fedsa_jax.cli.checks import in_option_terms
from fedsa_jax.problems.protocol import nonlinear_reason


def no_closed_form_note(reason: str) -> str:
    """Why a run on such a problem prints no predicted squared bias (``reason``:
    :func:`fedsa_jax.problems.protocol.nonlinear_reason`)."""
    return (
        f"no closed form: {reason}, and the closed form is for linear stochastic approximation; "
        "--exact computes the noise-free limit (fj.theory.mean_path_limit)"
    )


# a limit within this many units of the problem's rounding of theta*, or within SOLVER_TOL of it
# relative to |theta*| (what Newton's stopping rules leave of theta* and of the limit), is theta*
# itself: no line drawn
ROUNDING_UNITS = 10.0
SOLVER_TOL = 1e-9


def no_closed_form(title: str, key: str, summary: dict, reason: str) -> None:
    """Say, in the summary and on standard error, that ``title``'s bias has no closed form here."""
    note = no_closed_form_note(reason)
    summary[f"{key}_predicted_squared_bias_note"] = note
    print(f"{title} predicted squared bias: {note}", file=sys.stderr)


def noise_free_limits(args, problem, algs, summary: dict, lines: dict) -> None:
    """``--exact`` on a problem whose observations follow the iterate: for each algorithm whose rounds
    draw no random numbers of their own and whose step is constant, the fixed point ``theta_inf`` of
    its noise-free round, ``|theta_inf - theta*|^2`` printed, in the summary
    (``noise_free_limit_squared_error``) and a dashed line (none where the limit is ``theta*`` to the
    problem's precision: the drift-corrected algorithm's); the others are named, with the reason, on
    standard error."""
    import numpy as np

    import fedsa_jax as fj

    star = np.asarray(problem.theta_star, np.float64)
    eps = float(np.finfo(np.dtype(problem.dtype)).eps)
    floor = (max(ROUNDING_UNITS * eps, SOLVER_TOL) * max(1.0, float(np.linalg.norm(star)))) ** 2
    for alg in algs:
        start = time.perf_counter()
        try:
            limit = fj.theory.mean_path_limit(problem, alg)
        except ValueError as err:
            print(
                f"fedsa-jax: no noise-free limit for {alg.name}: {in_option_terms(str(err), args)}",
                file=sys.stderr,
            )
            continue
        level = float(np.sum((limit - star) ** 2))
        summary["runs"][alg.name]["noise_free_limit_squared_error"] = level
        seconds = time.perf_counter() - start
        where = "drawn dashed" if level > floor else "theta* to the problem's precision, not drawn"
        print(
            f"{alg.name:9s} noise-free limit |theta_inf - theta*|^2 = {level:.4g} ({where}; no exact MSE: "
            f"{nonlinear_reason(problem)}; {seconds:.1f} s)",
            flush=True,
        )
        if level > floor:
            lines[f"{alg.name} noise-free limit"] = level
