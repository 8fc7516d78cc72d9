"""The theory beside a run: each algorithm's closed-form squared bias (:func:`bias_lines`), its exact and
stationary MSE with ``--exact`` (:func:`exact_curves`, refused or announced by their estimated cost,
:func:`exact_costs`), and the references of a run on a problem that is not linear stochastic
approximation (federated SARSA,
whose observations follow the iterate; Q-learning, whose direction has a max): no closed-form bias
and no exact MSE, which are exact for linear stochastic approximation only;
with ``--exact``, each algorithm's noise-free limit (:func:`fedsa_jax.theory.mean_path_limit`) and
its squared distance to ``theta*``, the level its MSE settles near as the step size shrinks."""

from __future__ import annotations

import sys
import time

from fedsa_jax import registry
from fedsa_jax.cli.build import local_steps
from fedsa_jax.cli.checks import in_option_terms
from fedsa_jax.problems.protocol import nonlinear_reason

__all__ = [
    "no_closed_form_note",
    "ROUNDING_UNITS",
    "SOLVER_TOL",
    "no_closed_form",
    "noise_free_limits",
    "bias_lines",
    "MARKOV_BIAS_NOTE",
    "LONG_EXACT_S",
    "MAX_EXACT_S",
    "exact_costs",
    "exact_curves",
]


def no_closed_form_note(reason: str, noise_free: bool = True) -> str:
    """Why a run on such a problem prints no predicted squared bias (``reason``:
    :func:`fedsa_jax.problems.protocol.nonlinear_reason`); ``noise_free``: whether the problem has a
    noise-free version (``mean_field``) for ``--exact``."""
    then = (
        "--exact computes the noise-free limit (fj.theory.mean_path_limit)"
        if noise_free
        else "its mean field has no closed form either (theta* is a Monte Carlo estimate)"
    )
    return f"no closed form: {reason}, and the closed form is for linear stochastic approximation; {then}"


# a limit within this many units of the problem's rounding of theta*, or within SOLVER_TOL of it
# relative to |theta*| (what Newton's stopping rules leave of theta* and of the limit), is theta*
# itself: no line drawn
ROUNDING_UNITS = 10.0
SOLVER_TOL = 1e-9


def no_closed_form(title: str, key: str, summary: dict, reason: str, noise_free: bool = True) -> None:
    """Say, in the summary and on standard error, that ``title``'s bias has no closed form here."""
    note = no_closed_form_note(reason, noise_free)
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


def bias_lines(args, problem, summary: dict) -> dict:
    """The squared limit bias of every algorithm whose entry names a closed form (constant step)."""
    import numpy as np

    import fedsa_jax as fj

    lines = {}
    for name, entry in registry.algorithms().items():
        if entry.bias is None or name not in args.algorithms or args.schedule != "constant":
            continue
        if getattr(args, "local_steps_growth", 0.0):  # the closed form is for one H
            continue
        if getattr(args, "clip_norm", None) is not None:  # clipping moves the limit: not the unclipped one
            continue
        reason = nonlinear_reason(problem)  # SARSA, Q-learning: the closed form is for linear SA
        if reason is not None:
            no_closed_form(entry.title, name, summary, reason, callable(getattr(problem, "mean_field", None)))
            continue
        bias = getattr(fj.theory, entry.bias)(problem, args.step_size, local_steps(args))  # H or a law
        level = float(np.sum(bias**2))
        summary[f"{name}_predicted_squared_bias"] = level
        lines[rf"{entry.title} predicted $\|\mathrm{{bias}}\|^2$"] = level
        print(f"{entry.title} predicted squared bias |theta_inf - theta_star|^2 = {level:.4g}")
        if getattr(problem, "sampling", "generative") != "generative":
            summary[f"{name}_predicted_squared_bias_note"] = MARKOV_BIAS_NOTE
            print(f"  note: {MARKOV_BIAS_NOTE}", file=sys.stderr)
    return lines


REFERENCE_MARGIN = 10.0  # a final MSE below this many times the reference's own error is warned


def reference_lines(problem, results: dict, summary: dict) -> dict:
    """For a problem whose ``theta_star`` is itself an estimate (``reference_mse``: what its error
    adds to an MSE measured against it, e.g. the classic-control problems' Monte Carlo reference):
    the line printed, saved and drawn, and a warning for every run whose final MSE is not far above
    it (below ``REFERENCE_MARGIN`` times)."""
    level = getattr(problem, "reference_mse", None)
    if level is None:
        return {}
    summary["reference_mse"] = float(level)
    print(f"reference theta*: estimated by Monte Carlo; its error adds about {level:.3g} to every MSE")
    for name, result in results.items():
        final = float(result.mse_mean[-1])
        if final < REFERENCE_MARGIN * level:
            warning = (
                f"{name}'s final MSE {final:.3g} is within {REFERENCE_MARGIN:g}x of the reference's own "
                f"error {level:.3g}: the curve's floor is not resolved (a larger --reference)"
            )
            summary.setdefault("warnings", []).append(warning)
            print(f"warning: {warning}", file=sys.stderr)
    return {r"reference $\mathrm{tr\,Cov}(\hat\theta^\star)$": float(level)}


MARKOV_BIAS_NOTE = (
    "the closed form assumes i.i.d. observations; under Markov sampling the limit also carries a "
    "Markov bias of order eta (less with --skip): --exact draws the exact stationary MSE on small chains"
)


LONG_EXACT_S = 20.0


MAX_EXACT_S = 1800.0


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.0f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def exact_costs(args, problem, algs) -> dict:
    """``--exact``: each algorithm's estimated cost (None where the sizes do not set it); an exact MSE
    estimated above ``MAX_EXACT_S`` is refused here, before anything runs, naming its sizes."""
    from fedsa_jax.theory.engine import exact_cost

    costs = {alg.name: exact_cost(problem, alg, args.rounds) for alg in algs} if args.exact else {}
    for name, cost in costs.items():
        if cost is not None and cost.seconds(cost.rounds) > MAX_EXACT_S:
            raise ValueError(
                f"--exact is invalid: the exact MSE of {name} would take roughly "
                f"{_duration(cost.seconds(cost.rounds))} ({cost.sizes(cost.rounds)}) > the limit of "
                f"{_duration(MAX_EXACT_S)}: lower --local-steps or --rounds, or run without --exact"
            )
    return costs


def _announce(name: str, what: str, seconds: float, sizes: str) -> None:
    if seconds > LONG_EXACT_S:
        print(f"{name:9s} {what}: roughly {_duration(seconds)} ({sizes})...", flush=True)


def exact_curves(args, problem, algs, summary: dict, lines: dict) -> dict:
    """``--exact``: the exact MSE of every algorithm that has an exact description (built-in or not),
    and, with a constant step, its stationary MSE (the floor, a dashed line in ``lines``); each part
    timed, announced when its estimate is long, the stationary MSE skipped when too long."""
    import fedsa_jax as fj

    if args.exact and nonlinear_reason(problem) is not None:  # no exact MSE: the noise-free limits
        noise_free_limits(args, problem, algs, summary, lines)
        return {}
    exact, costs = {}, getattr(args, "exact_costs", {})
    for alg in algs if args.exact else ():
        cost = costs.get(alg.name)
        if cost is not None:
            _announce(alg.name, "exact MSE", cost.seconds(cost.rounds), cost.sizes(cost.rounds))
        start = time.perf_counter()
        try:
            exact[alg.name] = fj.theory.exact_mse(problem, alg, args.rounds)
        except ValueError as err:
            print(
                f"fedsa-jax: no exact curve for {alg.name}: {in_option_terms(str(err), args)}",
                file=sys.stderr,
            )
            continue
        summary["runs"][alg.name]["exact_final_mse"] = float(exact[alg.name][-1])
        seconds = time.perf_counter() - start
        print(f"{alg.name:9s} exact final MSE {exact[alg.name][-1]:.4g} ({seconds:.1f} s)", flush=True)
        if cost is not None and cost.stationary_rounds is not None:
            estimate, sizes = cost.seconds(cost.stationary_rounds), cost.sizes(cost.stationary_rounds)
            if estimate > MAX_EXACT_S:
                print(
                    f"fedsa-jax: no stationary MSE for {alg.name}: it would take roughly "
                    f"{_duration(estimate)} (GMRES, up to {sizes}) > the limit of {_duration(MAX_EXACT_S)}; "
                    "lower --local-steps",
                    file=sys.stderr,
                )
                continue
            _announce(alg.name, "stationary MSE", estimate, f"GMRES, up to {sizes}")
        start = time.perf_counter()
        try:
            floor = fj.theory.stationary_mse(problem, alg)
        except ValueError as err:  # a schedule, an unstable step, too many unknowns: no floor
            print(f"fedsa-jax: no stationary MSE for {alg.name}: {err}", file=sys.stderr)
            continue
        summary["runs"][alg.name]["stationary_mse"] = floor
        lines[f"{alg.name} stationary MSE"] = floor
        seconds = time.perf_counter() - start
        print(
            f"{alg.name:9s} stationary MSE {floor:.4g} (the limit with this constant step; {seconds:.1f} s)",
            flush=True,
        )
    return exact
