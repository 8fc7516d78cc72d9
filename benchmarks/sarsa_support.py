"""What runs on a federated SARSA problem: every algorithm, wrapper and channel option, tried one by one.

Each row builds the algorithm and runs ``fj.simulate`` on a tiny case (``fj.problems.garnet_control
(num_agents=4)``, float32, 5 rounds from theta_lim_fed, 8 seeds, step 0.01, H = 10), then the
noise-free references (``fj.theory.mean_path`` and its limit) and the exact linear theory. A row
says ``runs`` (with the MSE to theta_lim_fed after the 5 rounds), ``refused`` (a one-line
``ValueError``: its message) or ``to fix`` (any other exception: its type and the traceback's last
lines; or a silent wrong answer that a row checks for). The table of the guide page "Control:
federated SARSA" is this script's output.

    python benchmarks/sarsa_support.py [--markdown] [--only WORD]
"""

from __future__ import annotations

import argparse
import traceback
import warnings
from typing import Any

import jax
import numpy as np
import optax

import fedsa_jax as fj

ROUNDS, SEEDS, ETA, H = 5, 8, 0.01, 10  # every run starts at theta_lim_fed


def algorithm_rows():
    """``(row, builder)``: the builder returns what ``fj.simulate`` runs."""
    q = fj.channel
    rows = [
        ("fedlsa (FedSARSA)", lambda: fj.fedlsa(ETA, H)),
        ("scafflsa (drift-corrected FedSARSA)", lambda: fj.scafflsa(ETA, H)),
        ("qfedtd (one SARSA step a round)", lambda: fj.qfedtd(ETA)),
        ("scaffnew", lambda: fj.scaffnew(ETA, 0.1, H)),
        ("fedbuff", lambda: fj.fedbuff(ETA, H, buffer_size=2)),
        ("fj.averaged(fedlsa)", lambda: fj.averaged(fj.fedlsa(ETA, H), burn_in=2)),
        ("fj.richardson(fj.averaged(fedlsa))", lambda: fj.richardson(fj.averaged(fj.fedlsa(ETA, H)))),
        ("fj.bootstrap(fedlsa, 10)", lambda: fj.bootstrap(fj.fedlsa(ETA, H), 10)),
        ("fj.plug_in(fedlsa)", lambda: fj.plug_in(fj.fedlsa(ETA, H))),
        ("skip=2", lambda: fj.fedlsa(ETA, H, skip=2)),
    ]
    options: list[tuple[str, dict[str, Any]]] = [
        ("quantizer qsgd(4)", dict(quantizer=q.qsgd(4))),
        ("quantizer rand_k(10)", dict(quantizer=q.rand_k(10))),
        ("quantizer top_k(10)", dict(quantizer=q.top_k(10))),
        ("erasures success_prob=0.5", dict(success_prob=0.5)),
        ("erasures, divide_by_received", dict(success_prob=0.5, aggregation="divide_by_received")),
        ("error_feedback ef14 + top_k", dict(quantizer=q.top_k(10), error_feedback="ef14")),
        ("error_feedback ef21 + top_k", dict(quantizer=q.top_k(10), error_feedback="ef21")),
        ("clients_per_round=2 (cohort)", dict(clients_per_round=2)),
        ("delays fj.delays.uniform(2)", dict(delays=fj.delays.uniform(2))),
        ("local work fj.local_work.uniform(1, 10)", dict(num_local_steps=fj.local_work.uniform(1, 10))),
        (
            "local work fixed, fednova",
            dict(num_local_steps=fj.local_work.fixed([1, 5, 10, 20], normalization="fednova")),
        ),
        ("growing local steps [1, 2, 4, 8, 16]", dict(num_local_steps=[1, 2, 4, 8, 16])),
        ("server optax.sgd(1, momentum=0.9)", dict(server_optimizer=optax.sgd(1.0, momentum=0.9))),
        ("server optax.adam(1e-2)", dict(server_optimizer=optax.adam(1e-2))),
        ("downlink channel(rand_k(10))", dict(downlink=q.channel(q.rand_k(10)))),
        ("privacy central (sigma 1, C 1)", dict(privacy=q.privacy(1.0, 1.0))),
        ("privacy local (sigma 1, C 1)", dict(privacy=q.privacy(1.0, 1.0, mode="local"))),
        (
            "step size fj.schedule(inverse_time)",
            dict(step_size=fj.schedule(fj.optim.inverse_time, eta0=ETA, k0=100.0)),
        ),
    ]
    for label, kwargs in options:
        for name, factory in (("fedlsa", fj.fedlsa), ("scafflsa", fj.scafflsa)):
            args = {"step_size": ETA, "num_local_steps": H, **kwargs}
            rows.append((f"{name}: {label}", lambda f=factory, a=args: f(**a)))
    return rows


def theory_rows(problem):
    """``(row, call)``: the references and the exact linear theory on the problem."""
    fed, scaf = fj.fedlsa(ETA, H), fj.scafflsa(ETA, H)
    adam: dict[str, Any] = dict(server_optimizer=optax.adam(1e-2))
    qsgd: dict[str, Any] = dict(quantizer=fj.channel.qsgd(4))
    late: dict[str, Any] = dict(delays=fj.delays.fixed(1))
    heavy: dict[str, Any] = dict(server_optimizer=optax.sgd(1.0, momentum=0.9))
    cohort: dict[str, Any] = dict(clients_per_round=2)
    decay: Any = fj.schedule(fj.optim.inverse_time, eta0=ETA, k0=100.0)
    th = fj.theory
    return [
        ("fj.theory.mean_path(fedlsa)", lambda: th.mean_path(problem, fed, 3)),
        ("fj.theory.mean_path_limit(fedlsa)", lambda: th.mean_path_limit(problem, fed)),
        ("fj.theory.mean_path_limit(scafflsa)", lambda: th.mean_path_limit(problem, scaf)),
        ("fj.theory.mean_path(fedlsa + adam)", lambda: th.mean_path(problem, fj.fedlsa(ETA, H, **adam), 3)),
        ("fj.theory.mean_path(fedlsa + qsgd)", lambda: th.mean_path(problem, fj.fedlsa(ETA, H, **qsgd), 3)),
        (
            "fj.theory.mean_path(fedlsa + cohort)",
            lambda: th.mean_path(problem, fj.fedlsa(ETA, H, **cohort), 3),
        ),
        (
            "fj.theory.mean_path(fedlsa + delays.fixed(1))",
            lambda: th.mean_path(problem, fj.fedlsa(ETA, H, **late), 3),
        ),
        (
            "fj.theory.mean_path(fedlsa + delays.uniform(2))",
            lambda: th.mean_path(problem, fj.fedlsa(ETA, H, delays=fj.delays.uniform(2)), 3),
        ),
        (
            "fj.theory.mean_path_limit(fedlsa + adam)",
            lambda: th.mean_path_limit(problem, fj.fedlsa(ETA, H, **adam)),
        ),
        (
            "fj.theory.mean_path_limit(fedlsa + sgd momentum)",
            lambda: th.mean_path_limit(problem, fj.fedlsa(ETA, H, **heavy)),
        ),
        ("fj.theory.mean_path_limit(growing H)", lambda: growing_limit(problem)),
        ("fj.theory.mean_path_limit(schedule)", lambda: th.mean_path_limit(problem, fj.fedlsa(decay, H))),
        ("fj.theory.exact_mean", lambda: th.exact_mean(problem, fed, 3)),
        ("fj.theory.exact_mse", lambda: th.exact_mse(problem, fed, 3)),
        ("fj.theory.stationary_mse", lambda: th.stationary_mse(problem, fed)),
        ("fj.theory.fedlsa_bias", lambda: th.fedlsa_bias(problem, ETA, H)),
        ("fj.theory.max_stable_step_size", lambda: th.max_stable_step_size(problem, "fedlsa", H)),
        ("fj.theory.mixing_time", lambda: th.mixing_time(problem)),
    ]


def growing_limit(problem):
    """A table of local steps ``[1, 2, 4]`` has no fixed round: its limit should be refused, not the
    fixed point of the first round's ``H_0 = 1`` (``theta_lim_fed``) returned silently."""
    limit = fj.theory.mean_path_limit(problem, fj.fedlsa(ETA, [1, 2, 4]))
    first = fj.theory.mean_path_limit(problem, fj.fedlsa(ETA, 1))
    if np.allclose(limit, first, rtol=0, atol=1e-9):
        raise AssertionError("returned the fixed point of the first round (H_0 = 1), not a refusal")
    return limit


def _tail() -> str:
    """The current traceback's last lines (its carets left out), on one line."""
    lines = [x for x in traceback.format_exc().strip().splitlines() if x.strip().strip("^~")]
    return " | ".join(lines[-4:])


def outcome(call) -> tuple[str, str]:
    """``(status, detail)`` of ``call()``: ``runs``, ``refused`` (a ValueError, its first line) or
    ``to fix`` (another exception, or a ValueError of several lines: the traceback's tail)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = call()
    except ValueError as e:
        message = str(e)
        if "\n" not in message.strip():
            return "refused", message
        return "to fix", _tail()
    except AssertionError as e:  # a row's own check of a silent wrong answer
        return "to fix", str(e)
    except Exception:  # noqa: BLE001 - the point is to report it
        return "to fix", _tail()
    if caught:  # e.g. the MSE-growth warning of a run started at MSE 0
        value += f" (warns: {str(caught[0].message)[:90]}...)"
    return "runs", value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--only", default=None, help="rows whose label contains this text")
    args = ap.parse_args(argv)
    problem = fj.problems.garnet_control(num_agents=4)
    print(f"garnet_control(num_agents=4), {problem.dtype}, T={ROUNDS}, {SEEDS} seeds, eta={ETA}, H={H}")

    star = np.asarray(problem.theta_star, np.float64)

    def simulate(build):  # from theta_lim_fed: the MSE is the noise and drift of 5 rounds
        res = fj.simulate(jax.random.key(0), problem, build(), ROUNDS, SEEDS, theta0=star, progress=False)
        return f"MSE to theta_lim_fed after {ROUNDS} rounds {res.mse_mean[-1]:.3g}"

    def compute(call):
        value = np.asarray(call())
        if value.shape == star.shape:
            return f"|limit - theta_lim_fed| = {np.linalg.norm(value - star):.3g}"
        return f"shape {value.shape}"

    rows = [(label, lambda b=build: simulate(b)) for label, build in algorithm_rows()]
    rows += [(label, lambda c=call: compute(c)) for label, call in theory_rows(problem)]
    found = []
    for label, call in rows:
        if args.only and args.only not in label:
            continue
        status, detail = outcome(call)
        found.append((label, status, detail))
        if args.markdown:
            print(f"| {label} | {status} | {detail} |", flush=True)
        else:
            print(f"{label:<55} {status:<8} {detail}", flush=True)
    fixes = [row for row in found if row[1] == "to fix"]
    print(
        f"{len(found)} rows: {sum(r[1] == 'runs' for r in found)} run, "
        f"{sum(r[1] == 'refused' for r in found)} refused, {len(fixes)} to fix"
    )
    return 1 if fixes else 0


if __name__ == "__main__":
    raise SystemExit(main())
