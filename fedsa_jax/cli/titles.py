"""The run figure's title and the console's notes, from the options and the registered entries'
captions."""

from __future__ import annotations

from fedsa_jax import registry


def reads_local_steps(args) -> bool:
    """Whether an algorithm of this run takes H local steps per round (a plugin may)."""
    algorithms = registry.algorithms()
    return any(name not in algorithms or algorithms[name].reads("local_steps") for name in args.algorithms)


def cohort_caption(args, problem) -> str:
    """The cohort of a run with ``--clients-per-round`` M below the problem's N, as "cohort M of N
    agents" (each round, Scaffnew: each communication, M agents drawn uniformly take part); "" for
    the full round (no option, or M = N)."""
    m = getattr(args, "clients_per_round", None)
    return "" if m is None or m >= problem.num_agents else f"cohort {m} of {problem.num_agents} agents"


def run_title(args, problem) -> str:
    title = f"{args.problem}, N={problem.num_agents}, d={problem.dim}, " + rf"$\eta$={args.step_size:g}"
    if args.schedule != "constant":
        title = title.replace(
            rf"$\eta$={args.step_size:g}", rf"$\eta_k$={args.step_size:g}/(1+k/{args.decay_steps:g})"
        )
    if reads_local_steps(args):
        growth = getattr(args, "local_steps_growth", 0.0)
        title += rf", $H_t$=⌈{args.local_steps}(t+1)^{growth:g}⌉" if growth else f", H={args.local_steps}"
        work = getattr(args, "local_work", "none") or "none"
        if work != "none":
            title = title.removesuffix(f", H={args.local_steps}") + rf", $H_c$ {work}"
            title += " shared" if getattr(args, "local_work_shared", False) else ""
            norm = getattr(args, "work_normalization", "none")
            title += f", {norm}" if norm != "none" else ""
    if cohort_caption(args, problem):
        title += f", {cohort_caption(args, problem)}"
    title += _law_captions(args)
    if args.server_optimizer != "none":
        title += f", server {args.server_optimizer} lr={args.server_lr:g}"
        title += f" momentum={args.server_momentum:g}" if args.server_momentum else ""
    if args.average is not None:
        title += f", averaged after {args.average}"
    if args.quantizer != "none":
        caption = registry.quantizers()[args.quantizer].caption
        title += f", {args.quantizer}" + (caption(args) if caption is not None else "")
    if getattr(args, "error_feedback", "none") != "none":
        title += f", {args.error_feedback.upper()}"
    if getattr(args, "downlink_quantizer", "none") != "none":
        title += f", downlink {args.downlink_quantizer}"
    if args.success_prob != 1.0:
        title += f", p={args.success_prob:g}"
    return title + privacy_caption(args)


def _reads(args, dest: str) -> bool:
    """Whether an algorithm of this run reads the option ``dest`` (a plugin may: counted as reading)."""
    algorithms = registry.algorithms()
    return any(name not in algorithms or algorithms[name].reads(dest) for name in args.algorithms)


def _law_captions(args) -> str:
    """The delays (``--delays``), FedBuff's buffer and job durations, where an algorithm reads them."""
    out = ""
    delays = getattr(args, "delays", "none") or "none"
    if delays != "none" and _reads(args, "delays"):
        out += f", delays {delays}" + (" shared" if getattr(args, "delays_shared", False) else "")
    if getattr(args, "buffer_size", None) is not None and _reads(args, "buffer_size"):
        out += f", buffer K={args.buffer_size}"
    if getattr(args, "durations", None) and _reads(args, "durations"):
        out += f", durations {args.durations}"
    staleness = getattr(args, "staleness", None)
    if staleness is not None and _reads(args, "staleness"):
        out += f", staleness $(1+\\tau)^{{-{staleness:g}}}$"
    return out


def privacy_caption(args) -> str:
    """The privacy mechanism (``--clip-norm`` and its options): ", DP local: clip C=1, sigma=1.1"
    (adaptive clipping: the target quantile); "" without clipping."""
    clip = getattr(args, "clip_norm", None)
    if clip is None:
        return ""
    out = f", DP {getattr(args, 'dp_mode', 'central')}: clip C={clip:g}"
    quantile = getattr(args, "target_quantile", None)
    if quantile is not None:
        out += f" adaptive (quantile {quantile:g})"
    sigma, target = getattr(args, "noise_multiplier", None), getattr(args, "target_epsilon", None)
    if target is not None:
        return out + rf", $\sigma$ for $\varepsilon$={target:g}"
    return out + (rf", $\sigma$={sigma:g}" if sigma else ", no noise")
