"""The test suite's independent references (not a test): numpy loops and brute-force enumerations.

Two kinds of reference live here, each piece of logic once.

**Loops fed the kernel's random numbers.** Plain numpy loops, seed by seed, agent by agent,
step by step, for FedLSA, SCAFFLSA, QFedTD and Scaffnew on federated TD and Gaussian LSA
problems, with the uplink channel (quantizers written from their definitions, Bernoulli
erasures, both aggregation rules). They draw the same random numbers as the kernel, from
the driver's documented key derivation:

* seed i: ``(init_key, round_key) = split(fold_in(key, i))``; Markov chains start at
  ``alias(mu_c, uniform(split(init_key, N)[c]))``;
* round t: ``(k_obs, k_channel) = split(fold_in(round_key, t))``; the observations are the
  problem's raw draws ``problem.randomness(k_obs, N, H, skip)`` (uniforms, uint32 words or
  normals), turned into observations here;
* uplink: ``(k_q, k_e) = split(k_channel)``, agent c's quantizer uniforms
  ``uniform(split(k_q, N)[c], (d,))``, deliveries ``uniform(k_e, (N,)) < p``;
* Scaffnew: ``(k_coin, k_send) = split(k_channel)``, coins ``uniform(k_coin, (H,)) < p``;
* local steps that change with the round (a table ``H_t``): every round draws for ``H_max``
  steps and uses the first ``H_t`` (Scaffnew's coins past ``H_t`` are not used); under Markov
  sampling step h's draws are ``problem.randomness(split(k_obs, H_max)[h], N, 1, skip)``.

so trajectories must agree with the kernel's to float64 rounding. Only the key derivation
(``fedsa_jax._runtime.kernel.per_seed_keys``, ``jax.random``) and the problems' raw draws and alias
tables are shared with the library: everything that turns random numbers into iterates
(alias sampling, the TD direction, the Gaussian noise, local steps, control variates,
quantizers, erasures, aggregation, Scaffnew's coins) is written again below from the
update rules (Mangold et al. 2024, SCAFFLSA; Dal Fabbro et al. 2023, QFedTD; Mishchenko
et al. 2022, ProxSkip). A change of the key derivation changes every seed's stream and must
be made here too. One round (theta the server iterate, eta the step size, H local steps):

* FedLSA / SCAFFLSA: ``theta^c_{h+1} = theta^c_h - eta (A_c(Z_h) theta^c_h - b_c(Z_h) - xi_c)``
  from ``theta^c_0 = theta`` (``xi_c = 0`` for FedLSA); agent c sends ``m_c = theta^c_H - theta``;
* QFedTD: agent c sends ``m_c = g_c = b_c(Z) - A_c(Z) theta`` (one observation);
* the channel: ``q_c = Q(m_c)``, delivered when ``u_c < p``; weights ``w_c = 1{c in R} / N``
  (``divide_by_n``) or ``1{c in R} / max(|R|, 1)`` (``divide_by_received``); the server sets
  ``theta <- theta + sum_c w_c q_c`` (times eta for QFedTD); SCAFFLSA moves the delivered
  agents' control variates, ``xi_c <- xi_c + (mean_{j in R} q_j - q_c) / (eta H)``. The
  exact channel is the special case Q = identity, p = 1: ``theta <- mean_c theta^c_H``,
  ``xi_c <- xi_c + (theta_new - theta^c_H) / (eta H)``;
* Scaffnew (exact channel): agents' iterates x_c and control variates h_c persist; each local
  step ``xh_c = x_c - eta (A_c(Z) x_c - b_c(Z) - h_c)``; if the step's coin is 1,
  ``x_c <- mean_j xh_j`` and ``h_c <- h_c + (p / eta)(mean_j xh_j - xh_c)``, else ``x_c <- xh_c``;
  the reported iterate is ``mean_c x_c``.

**Enumeration of exact second moments.** For observations of finite support (generative TD,
least squares rows, Gaussian LSA through Rademacher noise with the Gaussian's first two
moments), ``E|theta_t - theta_star|^2`` by brute force: the second moment ``E[Y Y^T]`` of the
stacked state ``Y`` is pushed through every outcome of a round's randomness, each outcome's
affine map ``Y -> L Y`` weighted by its probability. Independent of ``fedsa_jax.theory``
(no shared code); only for tiny problems.

Also :func:`step_trajectories` (the algorithms' own ``init``/``step`` with the driver's keys,
a cheap stand-in for the driver) and :func:`check_against_loop` (driver or steps against a
loop, seed by seed). The random numbers are drawn by small jitted functions of
``(key, seed, round)``: drawn op by op, the threefry hash compiles dozens of tiny kernels per
shape (seconds per test).
"""

import functools
import itertools
from math import comb

import jax
import jax.numpy as jnp
import numpy as np

from fedsa_jax._runtime.kernel import per_seed_keys

# ---------------------------------------------------------------------------------------------
# The kernel's random numbers


def _seed_keys(key, seed):
    """Seed ``seed``'s ``(init_key, round_key)``, as in the driver."""
    init, rounds = per_seed_keys(key, jnp.asarray(seed, jnp.uint32)[None])
    return init[0], rounds[0]


def _round_keys(key, seed, t):
    """``(k_obs, k_channel)`` of seed ``seed``'s round ``t``."""
    round_key = _seed_keys(key, seed)[1]
    return jax.random.split(jax.random.fold_in(round_key, jnp.asarray(t, jnp.uint32)))


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _observation_draws(problem, key, seed, t, H, skip, stepwise, rows):
    k_obs = _round_keys(key, seed, t)[0]
    if not stepwise:
        return problem.randomness(k_obs, rows, H, skip)
    blocks = jax.vmap(lambda k: problem.randomness(k, problem.num_agents, 1, skip))(
        jax.random.split(k_obs, H)
    )
    return jnp.moveaxis(blocks, 0, 1).reshape(problem.num_agents, -1)  # (N, H skip): step h at h skip


def round_randomness(problem, key, seed, t, H, skip=1, stepwise=False, rows=None):
    """The problem's raw draws for round t's observations (all agents; ``rows``: a block of that many
    rows, FedBuff's contributions); ``stepwise``: drawn one local step at a time (local steps that
    change with the round, Markov sampling), laid out as one block of H steps."""
    rows = problem.num_agents if rows is None else rows
    return np.asarray(_observation_draws(problem, key, seed, t, H, skip, stepwise, rows))


def local_steps_at(config, t):
    """``H_t``: round t's local steps (the integer H, or the table's entry)."""
    H = config.num_local_steps
    return H.table[t] if hasattr(H, "table") else H


def step_sizes_at(config, t):
    """Round t's ``H_t`` step sizes: a constant, or the schedule at the local-step indices
    ``K_t + h`` (``K_t = sum_{s<t} H_s``), or at t for a schedule of the round."""
    H, eta = local_steps_at(config, t), config.step_size
    if isinstance(eta, float):
        return [eta] * H
    if eta.per_round:
        return [float(eta(t))] * H
    start = sum(local_steps_at(config, s) for s in range(t))
    return [float(eta(start + h)) for h in range(H)]


def _law_draws(problem, config, field, stream, key, seed, t):
    """Round t's counts ``(N,)`` of the law ``config.<field>`` (the kernel's key: ``fold_in(round key,
    stream)``), or None without one."""
    law = getattr(config, field, None)
    if law is None:
        return None
    round_key = jax.random.fold_in(_seed_keys(key, seed)[1], jnp.asarray(t, jnp.uint32))
    return np.asarray(law.draw(jax.random.fold_in(round_key, stream), problem.num_agents))


def work_counts(problem, config, key, seed, t):
    """Round t's local step counts ``H_{c,t}`` under ``config.local_work``, or None in lockstep."""
    from fedsa_jax.channel.local_work import WORK_STREAM

    return _law_draws(problem, config, "local_work", WORK_STREAM, key, seed, t)


def delay_lags(problem, config, key, seed, t):
    """Round t's delays ``tau_{c,t}`` under ``config.delays``, or None without delays."""
    from fedsa_jax.channel.delays import DELAY_STREAM

    return _law_draws(problem, config, "delays", DELAY_STREAM, key, seed, t)


def max_local_steps(config):
    """The steps every round draws for: H, or the table's largest ``H_t``."""
    H = config.num_local_steps
    return max(H.table) if hasattr(H, "table") else H


@functools.partial(jax.jit, static_argnums=(2,))
def _init_draws(key, seed, N):
    keys = jax.random.split(_seed_keys(key, seed)[0], N)
    return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float64))(keys)


def init_randomness(key, seed, N):
    """One uniform per agent from the seed's init key (the Markov chains' first states)."""
    return [float(u) for u in _init_draws(key, seed, N)]


@functools.partial(jax.jit, static_argnums=(3, 4))
def _channel_draws(key, seed, t, N, d):
    k_q, k_e = jax.random.split(_round_keys(key, seed, t)[1])
    u_q = jax.vmap(lambda k: jax.random.uniform(k, (d,), jnp.float64))(jax.random.split(k_q, N))
    return u_q, jax.random.uniform(k_e, (N,), jnp.float64)


def channel_uniforms(key, seed, t, N, d):
    """The uniforms of round t's uplink: ``(N, d)`` for the quantizers (one row per
    agent) and ``(N,)`` for the erasures, from the kernel's key derivation."""
    u_q, u_e = _channel_draws(key, seed, t, N, d)
    return np.asarray(u_q), np.asarray(u_e)


@functools.partial(jax.jit, static_argnums=(3,))
def _coin_draws(key, seed, t, H):
    k_coin, _ = jax.random.split(_round_keys(key, seed, t)[1])
    return jax.random.uniform(k_coin, (H,), jnp.float64)


def scaffnew_coins(key, seed, t, H, p):
    """Scaffnew's communication coins of round t: ``uniform(k_coin, (H,)) < p`` with
    ``(k_coin, k_send) = split(k_channel)`` (fedsa_jax/algorithms/scaffnew.py)."""
    return np.asarray(_coin_draws(key, seed, t, H)) < p


# ---------------------------------------------------------------------------------------------
# Observations


def alias(prob, al, u):
    """Walker's alias method: column ``i = floor(u S)``, kept if ``u S - i < prob[i]``, else ``al[i]``."""
    S = len(prob)
    i = min(int(u * S), S - 1)
    return i if u * S - i < prob[i] else int(al[i])


def generative_draw(problem, c, u, h, row=None):
    """Agent c's h-th generative observation ``(s, s')`` from row ``row`` (default c) of the round's
    block ``u``: with pair
    tables one uint32 word ``w`` per step, ``w K = i 2^32 + f`` (exact integers), column i kept
    if ``f < threshold``, else its alias (``pair = s S + s'``); otherwise two uniforms, ``s ~ mu_c``
    then ``s' ~ P_c(s, .)``."""
    N, S = problem.num_agents, problem.num_states
    r = c if row is None else row
    if problem.pair_tables:
        K = S * S
        w = int(u[r, h]) * K
        i, f = w >> 32, w & 0xFFFFFFFF
        j = c * K + i
        pair = i if f < int(problem.pair_threshold[j]) else int(problem.pair_alias[j])
        return divmod(pair, S)
    mu_p, mu_a = np.asarray(problem.mu_prob).reshape(N, S), np.asarray(problem.mu_alias).reshape(N, S)
    P_p, P_a = np.asarray(problem.P_prob).reshape(N, S, S), np.asarray(problem.P_alias).reshape(N, S, S)
    s = alias(mu_p[c], mu_a[c], u[r, 0, h])
    return s, alias(P_p[c, s], P_a[c, s], u[r, 1, h])


# ---------------------------------------------------------------------------------------------
# The uplink channel


def quantize(q, u, x):
    """Quantizer ``q`` applied to ``x (d,)`` with the uniforms ``u (d,)``, written from
    the definitions: stochastic rounding goes up from grid point ``lo`` to ``lo + delta``
    when ``u < (y - lo) / delta``."""
    d = x.shape[0]
    if q.kind == "identity":
        return x.copy()
    if q.kind == "rand_k":  # the k coordinates with the smallest uniforms, scaled by d/k
        out = np.zeros(d)
        keep = np.argsort(u)[: q.k]
        out[keep] = x[keep] * d / q.k
        return out
    if q.kind == "natural":  # |x| in [2^e, 2^(e+1)): 2^e or 2^(e+1)
        a = np.abs(x)
        lo = np.ldexp(1.0, np.frexp(a)[1] - 1)
        up = u < (a - lo) / lo
        return np.where(a > 0, np.sign(x) * np.where(up, 2 * lo, lo), 0.0)
    if q.kind == "qsgd":  # |x|_2 sign(x_i) l_i / s, l_i in {0..s}
        norm = np.linalg.norm(x)
        if norm == 0:
            return np.zeros(d)
        y = np.abs(x) / norm * q.levels
        lo = np.floor(y)
        return np.sign(x) * norm * (lo + (u < y - lo)) / q.levels
    assert q.kind == "stochastic_uniform", q.kind
    L = 2**q.bits_per_coordinate - 1  # 2^b points -M, -M + delta, ..., M
    M = np.max(np.abs(x)) if q.range is None else q.range
    if M == 0:
        return np.zeros(d)
    x = np.clip(x, -M, M)
    delta = 2 * M / L
    y = (x + M) / delta
    lo = np.floor(y)
    return -M + np.minimum(lo + (u < y - lo), L) * delta


def uplink(channel, messages, u_q=None, u_e=None):
    """Quantized messages ``(N, d)`` (0 where lost), delivered mask and aggregation weights.

    The uniforms ``u_q (N, d)`` and ``u_e (N,)`` are read only by a quantizer other than the
    identity and by erasures: the exact channel needs none and delivers ``m_c`` with ``w_c = 1/N``."""
    N = messages.shape[0]
    q = np.stack(
        [quantize(channel.quantizer, None if u_q is None else u_q[c], messages[c]) for c in range(N)]
    )
    delivered = u_e < float(channel.success_prob) if channel.erasures else np.ones(N, bool)
    count = delivered.sum()
    if channel.aggregation == "divide_by_n":
        w = delivered / N
    else:
        w = delivered / max(count, 1)
    return np.where(delivered[:, None], q, 0.0), delivered, w


# ---------------------------------------------------------------------------------------------
# Loops


def federated_loop(problem, algorithm, T, theta0, agent_round, key, seed):
    """Every round's server iterate ``theta_0..theta_T (T + 1, d)`` of FedLSA / SCAFFLSA / QFedTD
    (Scaffnew: :func:`scaffnew_loop`); ``agent_round(t)`` returns ``g(c, h, theta)``, the
    direction ``A_c(Z) theta - b_c(Z)`` of agent c's h-th local step in round t.

    The uplink runs through :func:`uplink`, on the kernel's channel uniforms of seed ``seed``
    under ``key`` unless the channel is exact: FedLSA and SCAFFLSA send ``m_c = theta^c - theta``,
    QFedTD sends ``g_c = b_c(Z) - A_c(Z) theta``, and the server adds ``sum_c w_c q(m_c)`` (times
    the step size for QFedTD). SCAFFLSA moves the control variates of delivered agents only, by
    ``(mean_{j in R} q(m_j) - q(m_c)) / (eta H)``. Local work (``config.local_work``): agent c runs
    its round's ``H_c`` steps (:func:`work_counts`); FedNova's normalisation sends ``tau / H_c`` times
    its update. Delays (``config.delays``): agent c starts from ``theta_{max(0, t - tau_c)}``
    (:func:`delay_lags`) and its message is taken against that start.
    """
    if algorithm.name == "scaffnew":
        return scaffnew_loop(problem, algorithm, T, theta0, agent_round, key, seed)
    if algorithm.name == "fedbuff":
        return fedbuff_loop(problem, algorithm, T, theta0, agent_round, key, seed)[0]
    N, d = problem.num_agents, problem.dim
    cfg = algorithm.config
    ch = cfg.channel
    theta = np.zeros(d) if theta0 is None else np.array(theta0, float)
    xi = np.zeros((N, d))
    out = [theta.copy()]
    for t in range(T):
        lags = delay_lags(problem, cfg, key, seed, t)
        starts = np.stack([theta if lags is None else out[max(0, t - lags[c])] for c in range(N)])
        g, H, etas = agent_round(t), local_steps_at(cfg, t), step_sizes_at(cfg, t)
        eta = etas[0]
        counts = work_counts(problem, cfg, key, seed, t)
        runs = [H] * N if counts is None else list(counts)
        if algorithm.name == "qfedtd":
            msg = np.stack([-g(c, 0, theta) for c in range(N)])  # the TD direction
        else:
            local = np.zeros((N, d))
            for c in range(N):
                th = starts[c].copy()
                for h in range(runs[c]):
                    step = g(c, h, th)
                    if algorithm.name == "scafflsa":
                        step = step - xi[c]
                    th = th - etas[h] * step
                local[c] = th
            msg = local - starts
            if counts is not None and cfg.local_work.normalization == "fednova":
                msg = msg * (cfg.local_work.tau(N) / counts)[:, None]
        q, delivered, w = uplink(ch, msg, *(() if ch.trivial else channel_uniforms(key, seed, t, N, d)))
        update = w @ q
        theta = theta + (eta * update if algorithm.name == "qfedtd" else update)
        if algorithm.name == "scafflsa":
            mean_received = q[delivered].sum(0) / max(delivered.sum(), 1)
            D = np.full(N, sum(etas))  # local work: each agent's own step sum, or FedNova's tau mean
            if counts is not None:
                D = np.full(N, cfg.local_work.tau(N) * np.mean(etas))
                if cfg.local_work.normalization == "none":
                    D = np.array([sum(etas[:h]) for h in counts])
            xi[delivered] += (mean_received - q[delivered]) / D[delivered, None]
        out.append(theta.copy())
    return np.array(out)


def scaffnew_loop(problem, algorithm, T, theta0, agent_round, key, seed):
    """Scaffnew (exact channel): the agents' iterates x_c and control variates h_c persist; after
    each local step, if the step's coin (:func:`scaffnew_coins`) is 1, x_c <- mean_j xh_j and
    h_c += (p / eta)(x_c - xh_c)."""
    N, d = problem.num_agents, problem.dim
    cfg = algorithm.config
    assert cfg.channel.trivial, "Scaffnew's loop has an exact channel only"
    p = cfg.comm_prob
    theta = np.zeros(d) if theta0 is None else np.array(theta0, float)
    x = np.tile(theta, (N, 1))
    h = np.zeros((N, d))
    out = [theta.copy()]
    for t in range(T):
        g, coin = agent_round(t), scaffnew_coins(key, seed, t, max_local_steps(cfg), p)
        for k, eta in enumerate(step_sizes_at(cfg, t)):
            xh = np.array([x[c] - eta * (g(c, k, x[c]) - h[c]) for c in range(N)])
            if coin[k]:
                xbar = xh.mean(0)
                h = h + (p / eta) * (xbar - xh)
                x = np.tile(xbar, (N, 1))
            else:
                x = xh
        out.append(x.mean(0))
    return np.array(out)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _clock_draws(key, seed, t, K, d):
    """FedBuff's round t: the clock's uniforms ``(K,)`` float32 and the quantizer's ``(K, d)``."""
    from fedsa_jax.channel.clock import CLOCK_STREAM

    round_key = jax.random.fold_in(_seed_keys(key, seed)[1], jnp.asarray(t, jnp.uint32))
    k_channel = jax.random.split(round_key)[1]
    u_q = jax.vmap(lambda k: jax.random.uniform(k, (d,), jnp.float64))(jax.random.split(k_channel, K))
    return jax.random.uniform(jax.random.fold_in(round_key, CLOCK_STREAM), (K,), jnp.float32), u_q


@functools.partial(jax.jit, static_argnums=(2,))
def _first_clock_draws(key, seed, N):
    from fedsa_jax.channel.clock import CLOCK_STREAM

    return jax.random.uniform(jax.random.fold_in(_seed_keys(key, seed)[0], CLOCK_STREAM), (N,), jnp.float32)


def duration(law, N, c, u):
    """Agent c's job duration from the float32 uniform u: the smallest k with ``u < P(D_c <= k)``
    (the CDF rounded to float32, as the kernel compares)."""
    cdf = np.cumsum(law.table(N)[c]).astype(np.float32)
    return 1 + int(np.sum(np.float32(u) >= cdf[:-1]))


def fedbuff_loop(problem, algorithm, T, theta0, agent_round, key, seed):
    """FedBuff from its definition, arrival by arrival on the integer clock: ``(thetas (T + 1, d),
    states)``, ``states[t]`` the agents' ``start``, ``version``, ``finish``, ``pending`` and the
    ``clock`` after server step t. Each arrival: the earliest job (lowest index among ties) at tick
    ``now``; if the clock moved, the agents pending at the earlier tick download the current
    iterate; the arriving agent's H steps from its start on row k of the round's block, its update
    quantized with row k of the quantizer's uniforms, weighted ``(1 + t - v_j)^-a`` into the buffer;
    it becomes pending with its next job arriving at ``now + D`` (D from the clock's uniform k). The
    K-th arrival steps the server: ``theta += buffer / K``."""
    N, d = problem.num_agents, problem.dim
    cfg = algorithm.config
    K, H, law = cfg.buffer_size, cfg.num_local_steps, cfg.durations
    theta = np.zeros(d) if theta0 is None else np.array(theta0, float)
    start = np.tile(theta, (N, 1))
    version = np.zeros(N, int)
    finish = np.array([duration(law, N, c, u) for c, u in enumerate(_first_clock_draws(key, seed, N))])
    pending = np.zeros(N, bool)
    clock = 0
    out, states = [theta.copy()], []
    for t in range(T):
        g, eta = agent_round(t), step_sizes_at(cfg, t)
        u_clock, u_q = (np.asarray(a) for a in _clock_draws(key, seed, t, K, d))
        total, stale = np.zeros(d), 0
        for k in range(K):
            now = int(finish.min())
            j = int(np.argmin(finish))
            if now > clock:
                start[pending] = theta
                version[pending] = t
                pending[:] = False
            clock = now
            th = start[j].copy()
            for h in range(H):
                th = th - eta[h] * g(j, h, th, row=k)
            sent = quantize(cfg.channel.quantizer, u_q[k], th - start[j])
            tau = t - version[j]
            stale += tau
            weight = (
                cfg.staleness(np.float64(tau)) if callable(cfg.staleness) else (1.0 + tau) ** -cfg.staleness
            )
            total += weight * sent
            pending[j] = True
            finish[j] = now + duration(law, N, j, u_clock[k])
        theta = theta + total / K
        out.append(theta.copy())
        states.append(
            dict(
                start=start.copy(),
                version=version.copy(),
                finish=finish.copy(),
                pending=pending.copy(),
                clock=clock,
                staleness=stale / K,
            )
        )
    return np.array(out), states


def td_loop(problem, algorithm, key, seed, T, theta0=None):
    """Federated TD problem: seed ``seed``'s theta_0..theta_T, sampling by alias tables
    (generative, or one Markov chain per agent carried across rounds, keeping one transition
    out of every ``skip``); the direction is ``-(r_c(s) + gamma phi(s')^T theta - phi(s)^T theta) phi(s)``."""
    N, S = problem.num_agents, problem.num_states
    H, skip = max_local_steps(algorithm.config), algorithm.config.skip
    cfg = algorithm.config
    varies = hasattr(cfg.num_local_steps, "table") or getattr(cfg, "local_work", None) is not None
    stepwise = varies and problem.sampling == "markov"
    Phi = np.asarray(problem.features)
    gamma = float(problem.gamma)
    R = np.asarray(problem.rewards)
    mu_p = np.asarray(problem.mu_prob).reshape(N, S)
    mu_a = np.asarray(problem.mu_alias).reshape(N, S)
    P_p = np.asarray(problem.P_prob).reshape(N, S, S)
    P_a = np.asarray(problem.P_alias).reshape(N, S, S)
    chain = [alias(mu_p[c], mu_a[c], u) for c, u in enumerate(init_randomness(key, seed, N))]

    def agent_round(t):
        u = round_randomness(problem, key, seed, t, H, skip, stepwise, getattr(cfg, "buffer_size", None))

        def g(c, h, th, row=None):
            r = c if row is None else row
            if problem.sampling == "generative":
                s, s2 = generative_draw(problem, c, u, h, r)
            else:
                path = [chain[c]]
                for j in range(skip):
                    path.append(alias(P_p[c, path[-1]], P_a[c, path[-1]], u[r, h * skip + j]))
                s, s2, chain[c] = path[0], path[1], path[-1]
            td = R[c, s] + gamma * Phi[s2] @ th - Phi[s] @ th
            return -td * Phi[s]  # A(Z) theta - b(Z)

        return g

    return federated_loop(problem, algorithm, T, theta0, agent_round, key, seed)


def gaussian_loop(problem, algorithm, key, seed, T, theta0=None):
    """Gaussian LSA problem: seed ``seed``'s theta_0..theta_T with the kernel's normals."""
    H = max_local_steps(algorithm.config)
    A = np.asarray(problem.A_bar)
    b = np.asarray(problem.b_bar)
    sA = np.asarray(problem.noise_A)
    sb = np.asarray(problem.noise_b)

    rows = getattr(algorithm.config, "buffer_size", None)

    def agent_round(t):
        z = round_randomness(problem, key, seed, t, H, rows=rows).reshape(rows or problem.num_agents, H, -1)
        # sA G theta - sb g, G ~ N(0,1)^{d x d}, has the law of sqrt(sA^2 |theta|^2 + sb^2) z.
        return lambda c, h, th, row=None: (
            A[c] @ th - b[c] + np.sqrt(sA[c] ** 2 * (th @ th) + sb[c] ** 2) * z[c if row is None else row, h]
        )

    return federated_loop(problem, algorithm, T, theta0, agent_round, key, seed)


# ---------------------------------------------------------------------------------------------
# The library's own steps, and the comparison with a loop


@functools.partial(jax.jit, static_argnums=(3, 4))
def _step_trajectories(problem, algorithm, key, T, num_seeds, theta0):
    init_keys, round_keys = per_seed_keys(key, jnp.arange(num_seeds, dtype=jnp.uint32))

    def one_seed(init_key, round_key):
        def one_round(state, t):
            state, _ = algorithm.step(jax.random.fold_in(round_key, t), state, problem)
            return state, state.theta

        state = algorithm.init(init_key, problem, theta0)
        _, thetas = jax.lax.scan(one_round, state, jnp.arange(T, dtype=jnp.uint32))
        return jnp.concatenate([state.theta[None], thetas])

    return jax.vmap(one_seed)(init_keys, round_keys)


def step_trajectories(problem, algorithm, key, T, num_seeds, theta0=None):
    """Every seed's ``theta_0..theta_T`` ``(num_seeds, T + 1, d)`` from the algorithm's own
    ``init`` and ``step`` with the driver's keys (seed i: ``split(fold_in(key, i))``, round t:
    ``fold_in(round_key, t)``), in one small jitted scan: the trajectories of
    :func:`fedsa_jax.simulate` at a fraction of its compile time."""
    theta0 = jnp.zeros(problem.dim, problem.dtype) if theta0 is None else jnp.asarray(theta0, problem.dtype)
    return np.asarray(_step_trajectories(problem, algorithm, key, T, num_seeds, theta0))


@functools.partial(jax.jit, static_argnums=(3, 4))
def _joint_step_trajectories(problem, algorithms, key, T, num_seeds, theta0):
    return tuple(_step_trajectories(problem, a, key, T, num_seeds, theta0) for a in algorithms)


def step_trajectories_jointly(problem, algorithms, key, T, num_seeds, theta0=None):
    """``[step_trajectories(problem, a, key, T, num_seeds, theta0) for a in algorithms]`` in one
    compiled program (one compile instead of one per algorithm; the same computations)."""
    theta0 = jnp.zeros(problem.dim, problem.dtype) if theta0 is None else jnp.asarray(theta0, problem.dtype)
    out = _joint_step_trajectories(problem, tuple(algorithms), key, T, num_seeds, theta0)
    return [np.asarray(x) for x in out]


def check_against_loop(
    problem,
    algorithm,
    loop,
    T,
    num_seeds,
    theta0=None,
    key=None,
    driver=True,
    rtol=1e-12,
    atol=1e-13,
    trajectories=None,
    result=None,
):
    """Compare every seed's trajectory with ``loop`` (:func:`td_loop` or :func:`gaussian_loop`).

    ``driver=True``: through :func:`fedsa_jax.simulate`, last iterates seed by seed and the
    mean, standard error and MSE statistics at every round against those of the loop's
    trajectories; ``driver=False``: every round of every seed from :func:`step_trajectories`, or
    ``trajectories`` where given (the same, from :func:`step_trajectories_jointly` with these
    arguments). ``result``: the driver's run where given (the same, from :func:`run_jointly` with
    these arguments) instead of ``fj.simulate``'s. Returns the loop's trajectories
    ``(num_seeds, T + 1, d)``."""
    import fedsa_jax as fj

    key = jax.random.key(11) if key is None else key
    refs = np.stack([loop(problem, algorithm, key, s, T, theta0=theta0) for s in range(num_seeds)])
    if not driver:
        got = trajectories
        if got is None:
            got = step_trajectories(problem, algorithm, key, T, num_seeds, theta0)
        np.testing.assert_allclose(got, refs, rtol=rtol, atol=atol)
        return refs
    res = fj.simulate(key, problem, algorithm, T, num_seeds, theta0=theta0) if result is None else result
    np.testing.assert_allclose(res.final_theta, refs[:, -1], rtol=rtol, atol=atol)
    n = num_seeds
    np.testing.assert_allclose(res.theta_mean, refs.mean(0), rtol=rtol, atol=atol)
    np.testing.assert_allclose(res.theta_sem, refs.std(0, ddof=1) / np.sqrt(n), rtol=1e-9, atol=10 * atol)
    err = np.sum((refs - np.asarray(problem.theta_star)) ** 2, -1)
    np.testing.assert_allclose(res.mse_mean, err.mean(0), rtol=1e-11)
    np.testing.assert_allclose(res.mse_sem, err.std(0, ddof=1) / np.sqrt(n), rtol=1e-9)
    np.testing.assert_array_equal(
        res.bits_sent, res.rounds * problem.num_agents * res.config["bits_per_message"]
    )
    return refs


# ---------------------------------------------------------------------------------------------
# Enumeration of exact second moments


def observation_outcomes(problem):
    """Per agent, every outcome of one local observation: ``(probs (K,), A_Z (K, d, d), b_Z (K, d))``.

    Generative TD: each pair ``Z = (s, s')`` of positive probability ``mu_c(s) P_c(s, s')``, with
    ``A(Z) = phi(s) (phi(s) - gamma phi(s'))^T`` and ``b(Z) = r_c(s) phi(s)``. Gaussian LSA:
    ``A_Z = A_bar + noise_A G``, ``b_Z = b_bar + noise_b g`` with Rademacher entries, each of the
    ``2^(d^2 + d)`` sign patterns equally likely. The updates are affine in ``(G, g)``, so second
    moments depend on the noise only through its mean (0) and covariance (I), which Rademacher
    and Gaussian entries share: the enumerated MSE is the Gaussian model's.
    """
    if hasattr(problem, "transitions"):
        P = np.asarray(problem.transitions, float)
        r = np.asarray(problem.rewards, float)
        phi = np.asarray(problem.features, float)
        mu = np.asarray(problem.stationary, float)
        gamma = float(problem.gamma)
        N, S, _ = P.shape
        out = []
        for c in range(N):
            pairs = [(s, t) for s in range(S) for t in range(S) if mu[c, s] * P[c, s, t] > 0]
            out.append(
                (
                    np.array([mu[c, s] * P[c, s, t] for s, t in pairs]),
                    np.array([np.outer(phi[s], phi[s] - gamma * phi[t]) for s, t in pairs]),
                    np.array([r[c, s] * phi[s] for s, t in pairs]),
                )
            )
        return out
    A = np.asarray(problem.A_bar, float)
    b = np.asarray(problem.b_bar, float)
    sA = np.asarray(problem.noise_A, float)
    sb = np.asarray(problem.noise_b, float)
    N, d, _ = A.shape
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=d * d + d)))
    G, g = signs[:, : d * d].reshape(-1, d, d), signs[:, d * d :]
    probs = np.full(len(signs), 1.0 / len(signs))
    return [(probs, A[c] + sA[c] * G, b[c] + sb[c] * g) for c in range(N)]


def enumerated_mse(
    problem,
    name,
    eta,
    H,
    T,
    theta0=None,
    p=1.0,
    aggregation="divide_by_n",
    k=None,
    support=None,
    server=None,
    burn_in=None,
    with_mean=False,
):
    """Exact ``E|theta_t - theta_star|^2``, t = 0..T, of FedLSA, SCAFFLSA or QFedTD (``name``) on a
    problem with i.i.d. observations of finite support, by brute force.

    The second moment ``M = E[Y Y^T]`` of ``Y = (1, theta, xi_1..xi_N, x_1..x_N[, m][, v])`` is
    pushed through every outcome of a round's randomness, ``M <- sum_o prob_o L_o M L_o^T``:

    * the broadcast ``x_c <- theta``;
    * each local step, for each agent's observation outcome (``support[c] = (probs, A_Z, b_Z)``,
      default :func:`observation_outcomes`), ``x_c <- (I - eta A_Z) x_c + eta b_Z (+ eta xi_c)``.
      A step's map is a product of per-agent maps that touch disjoint rows of Y (agent c's rows
      read only the constant, ``x_c`` and ``xi_c``) and whose outcomes are independent, so its
      expectation is taken one agent at a time;
    * each delivery pattern (agents delivered with probability ``p``, weights ``w_c = 1/N`` or
      ``1/|R|``) and each agent's rand-k subset S_c (probability ``1/C(d, k)``, mask
      ``D_c = (d/k) 1_{S_c}``): the aggregate ``a = theta + sum_c w_c D_c (x_c - theta)``;
      SCAFFLSA (exact channel only) ``xi_c <- xi_c + (a - x_c) / sum_h eta_{t,h}``;
    * the server: ``theta <- a``, or with ``server=(lr, beta)`` SGD with momentum on the
      pseudo-gradient, ``m <- (theta - a) + beta m``, ``theta <- theta - lr m``;
    * ``burn_in=b``: the running mean ``v`` of ``theta_{b+1..t}`` is reported from round b + 1 on.

    Then ``E|u - theta_star|^2 = tr M_uu - 2 theta_star^T M_0u + |theta_star|^2`` for the
    reported iterate u. QFedTD is FedLSA with H = 1 (its local iterate is ``theta + eta g``;
    rand-k commutes with the factor eta). ``eta``: a float, or ``(T, H)`` step sizes (a
    schedule). ``with_mean``: also return ``E[u]`` ``(T + 1, d)``.
    """
    assert name != "scafflsa" or (p == 1.0 and k is None), "SCAFFLSA is enumerated with an exact channel only"
    obs = observation_outcomes(problem) if support is None else support
    theta_star = np.asarray(problem.theta_star, float)
    N, d = problem.num_agents, problem.dim
    D = 1 + d + 2 * N * d
    th = np.arange(1, 1 + d)
    xi = [np.arange(1 + d + c * d, 1 + d + (c + 1) * d) for c in range(N)]
    loc = [np.arange(1 + d + (N + c) * d, 1 + d + (N + c + 1) * d) for c in range(N)]
    mom = avg = None
    if server is not None:
        mom, D = np.arange(D, D + d), D + d
    if burn_in is not None:
        avg, D = np.arange(D, D + d), D + d
    E = np.eye(D)
    I = np.eye(d)
    etas = np.broadcast_to(np.asarray(eta, float), (T, H))

    @functools.cache
    def step_maps(eta):
        """Per agent: ``(probs (K,), maps (K, D, D))`` of one local step with step size eta."""
        out = []
        for c, (probs, Az, bz) in enumerate(obs):
            L = np.tile(E, (len(probs), 1, 1))
            L[:, loc[c][:, None], loc[c]] = I - eta * np.asarray(Az, float)
            L[:, loc[c], 0] = eta * np.asarray(bz, float)
            if name == "scafflsa":
                L[:, loc[c][:, None], xi[c]] = eta * I
            out.append((np.asarray(probs, float), L))
        return out

    if k is None:
        masks = [(1.0, np.ones(d))]
    else:
        masks = [
            (1.0 / comb(d, k), np.isin(np.arange(d), sub) * (d / k))
            for sub in itertools.combinations(range(d), k)
        ]
    y = np.zeros(D)
    y[0] = 1.0
    if theta0 is not None:
        y[th] = theta0
    M = np.outer(y, y)
    means = []

    def sq_err(M, t):
        u = avg if burn_in is not None and t > burn_in else th
        means.append(M[0, u].copy())
        return np.trace(M[np.ix_(u, u)]) - 2 * theta_star @ M[0, u] + theta_star @ theta_star

    out = [sq_err(M, 0)]
    for t in range(T):
        L = E.copy()
        for c in range(N):
            L[np.ix_(loc[c], loc[c])] = 0.0
            L[np.ix_(loc[c], th)] = I
        M = L @ M @ L.T
        for h in range(H):
            for probs, maps in step_maps(float(etas[t, h])):
                M = np.einsum("k,kij,jl,kml->im", probs, maps, M, maps, optimize=True)
        new = np.zeros((D, D))
        for delivered in itertools.product((0, 1), repeat=N):
            prob_r = np.prod([p if x else 1 - p for x in delivered])
            if prob_r == 0:
                continue
            n_rec = sum(delivered)
            w = [x / N if aggregation == "divide_by_n" else (x / n_rec if n_rec else 0.0) for x in delivered]
            for combo in itertools.product(masks, repeat=N):
                L = E.copy()
                prob = prob_r * np.prod([q for q, _ in combo])
                for c, (_, mask) in enumerate(combo):
                    L[np.ix_(th, th)] -= w[c] * np.diag(mask)
                    L[np.ix_(th, loc[c])] += w[c] * np.diag(mask)
                if name == "scafflsa":
                    for c in range(N):
                        L[xi[c], :] += (L[th, :] - E[loc[c], :]) / np.sum(etas[t])
                if server is not None:  # L[th] is the aggregate a; momentum and theta from the old Y
                    lr, beta = server
                    L[mom, :] = E[th, :] - L[th, :] + beta * E[mom, :]
                    L[th, :] = E[th, :] - lr * L[mom, :]
                new += prob * L @ M @ L.T
        M = new
        if burn_in is not None and t + 1 > burn_in:
            n = t + 1 - burn_in
            L = E.copy()
            L[np.ix_(avg, avg)] = (1 - 1 / n) * I
            L[np.ix_(avg, th)] = I / n
            M = L @ M @ L.T
        out.append(sq_err(M, t + 1))
    return (np.asarray(means), np.asarray(out)) if with_mean else np.asarray(out)


def enumerated_algorithm_mse(problem, algorithm, T, theta0=None, support=None):
    """:func:`enumerated_mse` of a constant-step FedLSA, SCAFFLSA or QFedTD ``algorithm``: its step
    size, local steps and channel (success probability, aggregation rule, rand-k's k)."""
    cfg = algorithm.config
    q = cfg.channel.quantizer
    return enumerated_mse(
        problem,
        algorithm.name,
        float(cfg.step_size),
        cfg.num_local_steps,
        T,
        theta0=theta0,
        p=float(cfg.channel.success_prob),
        aggregation=cfg.channel.aggregation,
        k=q.k if q.kind == "rand_k" else None,
        support=support,
    )


# ---------------------------------------------------------------------------------------------
# Monte Carlo against the exact recursions


def assert_monte_carlo_matches_exact(problem, alg, T: int = 8, n: int = 4000, seed: int = 7):
    """``alg`` on ``problem`` from ``linspace(1, -1, d)``: the MC MSE within Z_TOL standard errors of
    ``exact_mse`` at every round after the first, the MC mean within Z_TOL of ``exact_mean``. Returns
    the exact MSE curve."""
    import fedsa_jax as fj

    theta0 = np.linspace(1.0, -1.0, problem.dim)
    res = fj.simulate(jax.random.key(seed), problem, alg, T, n, theta0=theta0)
    return assert_result_matches_exact(problem, alg, res, T, n)


def assert_result_matches_exact(problem, alg, res, T: int = 8, n: int = 4000, label=""):
    """The checks of :func:`assert_monte_carlo_matches_exact` on ``res``, a run of ``alg`` from
    ``linspace(1, -1, d)`` (:func:`monte_carlo_jointly`). Returns the exact MSE curve."""
    from conftest import Z_TOL

    import fedsa_jax as fj

    theta0 = np.linspace(1.0, -1.0, problem.dim)
    exact = fj.theory.exact_mse(problem, alg, T, theta0=theta0)
    z = np.abs(res.mse_mean[1:] - exact[1:]) / res.mse_sem[1:]
    assert np.all(z < Z_TOL), (label, z)
    mean = fj.theory.exact_mean(problem, alg, T, theta0=theta0)
    assert np.all(np.abs(res.theta_mean - mean) <= Z_TOL * np.sqrt(exact[:, None] / n) + 1e-12), label
    return exact


def run_jointly(key, problem, algorithms, num_rounds, num_seeds, group: int = 5, **options):
    """``[fj.simulate(key, problem, a, num_rounds, num_seeds, **options) for a in algorithms]``, run
    side by side by :func:`fedsa_jax.compare`, ``group`` algorithms to a compiled program (a last
    lone one joins the group before it): each result is the algorithm's lone run with the same key,
    up to float rounding (bitwise where the compiler emits the same code;
    tests/test_statistics.py::test_compared_results_are_the_lone_runs), at about a third of the
    compile time per algorithm. For checks to float rounding, not for bitwise ones."""
    import fedsa_jax as fj

    algorithms = list(algorithms)
    assert len(algorithms) >= 2, "one algorithm: call fj.simulate"
    starts = list(range(0, len(algorithms), group))
    if len(algorithms) - starts[-1] == 1:
        starts.pop()
    results = []
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else len(algorithms)
        chunk = {str(j): algorithms[j] for j in range(start, stop)}
        joint = fj.compare(key, problem, chunk, num_rounds, num_seeds, **options)
        results += [joint.results[name] for name in chunk]
    return results


def monte_carlo_jointly(problem, algorithms, T: int = 8, n: int = 4000, seed: int = 7):
    """The runs of :func:`assert_monte_carlo_matches_exact` (``n`` seeds from ``linspace(1, -1, d)``,
    key ``seed``) of each of ``algorithms``, side by side (:func:`run_jointly`), for
    :func:`assert_result_matches_exact`: each algorithm is held to the same tolerance as alone."""
    theta0 = np.linspace(1.0, -1.0, problem.dim)
    return run_jointly(jax.random.key(seed), problem, algorithms, T, n, theta0=theta0)


def monte_carlo_by_family(cases, families, T: int = 8) -> dict:
    """Case index -> ``(*case, result)`` for ``cases`` (each ``(problem, alg, ...)``): the
    :func:`monte_carlo_jointly` run of every case, the cases of one family (``families[i]``, the same
    problem) side by side."""
    runs = {}
    for family in dict.fromkeys(families):
        mine = [i for i, f in enumerate(families) if f == family]
        results = monte_carlo_jointly(cases[mine[0]][0], [cases[i][1] for i in mine], T=T)
        runs.update({i: (*cases[i], res) for i, res in zip(mine, results)})
    return runs


def assert_monte_carlo_matches_exact_jointly(problem, algorithms, T: int = 8, n: int = 4000, seed: int = 7):
    """:func:`assert_monte_carlo_matches_exact` for each of ``algorithms`` (``{name: alg}``, two or
    more), run side by side (:func:`monte_carlo_jointly`): every algorithm is checked, and every
    failing one named. Returns ``{name: exact MSE curve}``."""
    results = monte_carlo_jointly(problem, algorithms.values(), T, n, seed)
    exact, failed = {}, []
    for (name, alg), res in zip(algorithms.items(), results):
        try:
            exact[name] = assert_result_matches_exact(problem, alg, res, T, n, label=name)
        except AssertionError as err:
            failed.append(f"{name}: {err}")
    assert not failed, "\n".join(failed)
    return exact


def assert_gap_to_noise_free_limit_halves(problem, H: int, etas=(0.4, 0.2), steps: float = 300.0):
    """For a nonlinear problem: the stationary mean of FedLSA (Polyak-Ruppert averages over the last
    3/4 of ``steps / eta`` rounds, 1000 seeds started at the limit) minus the noise-free H-step limit
    at the same step is O(eta): from ``etas[0]`` to ``etas[1] = etas[0] / 2`` the gap along its own
    direction halves, up to 15 % (O(eta^2)) and 4.5 standard errors, and the larger gap is resolved
    (over 6 s.e.), so the check can fail."""
    import fedsa_jax as fj

    gaps, ses = [], []
    for eta in etas:
        alg = fj.fedlsa(eta, H)
        limit = np.asarray(fj.theory.mean_path_limit(problem, alg), np.float64)
        rounds = int(round(steps / eta))
        averaged = fj.averaged(alg, burn_in=rounds // 4)
        res = fj.simulate(jax.random.key(0), problem, averaged, rounds, 1000, theta0=limit, progress=False)
        gaps.append(np.asarray(res.theta_mean[-1]) - limit)
        ses.append(np.asarray(res.theta_sem[-1]))
    u = gaps[0] / np.linalg.norm(gaps[0])  # the gap's direction at the larger step
    big, small = gaps[0] @ u, gaps[1] @ u
    se = np.hypot(ses[0] @ np.abs(u) / 2, ses[1] @ np.abs(u))  # bounds the s.e. of small - big / 2
    assert big > 6 * ses[0] @ np.abs(u)  # a gap the Monte Carlo resolves: the test can fail
    assert abs(small - big / 2) < 4.5 * se + 0.15 * big / 2  # halves, up to O(eta^2) and 4.5 s.e.


# ---------------------------------------------------------------------------------------------
# Markov sampling: enumeration of every chain path


def chain_paths(P, mu, length):
    """Every state sequence ``s_0..s_{length-1}`` of one chain with positive probability:
    ``(paths (M, length) int, probabilities (M,))``, ``s_0 ~ mu``, ``s_{i+1} ~ P(s_i, .)``."""
    paths = np.array([[s] for s in range(len(mu)) if mu[s] > 0])
    prob = np.array([mu[s] for s in paths[:, 0]])
    for _ in range(length - 1):
        nxt_paths, nxt_prob = [], []
        for path, q in zip(paths, prob):
            for s in np.nonzero(P[path[-1]] > 0)[0]:
                nxt_paths.append(np.append(path, s))
                nxt_prob.append(q * P[path[-1], s])
        paths, prob = np.array(nxt_paths), np.array(nxt_prob)
    return paths, prob


def markov_enumerated_moments(problem, kind, eta, H, T, skip=1, theta0=None, success_prob=1.0, rand_k=None):
    """``(E[theta_t] (T+1, d), E|theta_t - theta_star|^2 (T+1,))`` of FedLSA, SCAFFLSA or QFedTD
    (``kind``) on a federated TD problem under Markov sampling, by summing over every joint path of
    the agents' chains (and, for QFedTD, every delivery pattern and rand-k coordinate choice) its
    probability times the iterate it leads to. Each chain starts from its stationary law and runs
    on across rounds; local step h of round t reads the transition ``(s_i, s_{i+1})``,
    ``i = (K_t + h) skip`` with ``K_t = t H`` (``H`` a sequence ``H_t``: ``K_t = sum_{s<t} H_s``).
    Written from the update rules (module docstring); only the problem's arrays are read. Tiny
    problems only: the outcomes multiply."""
    table = list(H) if np.ndim(H) == 1 else [H] * T
    starts = np.concatenate([[0], np.cumsum(table)]).astype(int)
    P = np.asarray(problem.transitions, np.float64)
    mu = np.asarray(problem.stationary, np.float64)
    r = np.asarray(problem.rewards, np.float64)
    phi = np.asarray(problem.features, np.float64)
    gamma = float(problem.gamma)
    theta_star = np.asarray(problem.theta_star, np.float64)
    N, S, _ = P.shape
    d = phi.shape[1]
    length = (starts[T] - 1) * skip + 2  # the last transition read: (s_{(K_T-1)skip}, s_{(K_T-1)skip+1})
    # per agent: every path, and for QFedTD every round's channel draw (delivered, kept coordinate)
    per_agent = []
    for c in range(N):
        paths, prob = chain_paths(P[c], mu[c], length)
        if kind == "qfedtd":
            k = d if rand_k is None else rand_k
            subsets = list(itertools.combinations(range(d), k))
            draws = [(ok, sub) for ok in (True, False) for sub in range(len(subsets))]
            draw_prob = [(success_prob if ok else 1 - success_prob) / len(subsets) for ok, _ in draws]
            combos = np.array(list(itertools.product(range(len(draws)), repeat=T))).reshape(-1, T)
            combo_prob = np.array([np.prod([draw_prob[i] for i in combo]) for combo in combos])
            n_paths = len(prob)
            paths = np.repeat(paths, len(combos), axis=0)
            channel = np.tile(combos, (n_paths, 1))
            prob = np.repeat(prob, len(combos)) * np.tile(combo_prob, n_paths)
            per_agent.append((paths, prob, channel, draws, subsets, k))
        else:
            per_agent.append((paths, prob))
    # the joint outcomes: the product over agents (agents' chains and channels are independent)
    sizes = [len(a[1]) for a in per_agent]
    grids = np.meshgrid(*[np.arange(m) for m in sizes], indexing="ij")
    index = [g.ravel() for g in grids]
    weight = np.prod([per_agent[c][1][index[c]] for c in range(N)], axis=0)
    M = len(weight)
    theta = np.tile(np.zeros(d) if theta0 is None else np.asarray(theta0, np.float64), (M, 1))
    xi = np.zeros((N, M, d))

    def direction(c, i, x):  # b_c(Z) - A_c(Z) x for the transition read at position i
        path = per_agent[c][0][index[c]]
        s, s_next = path[:, i], path[:, i + 1]
        td = r[c, s] + gamma * np.sum(phi[s_next] * x, 1) - np.sum(phi[s] * x, 1)
        return td[:, None] * phi[s]

    def moments(theta):
        return weight @ theta, weight @ np.sum((theta - theta_star) ** 2, 1)

    out = [moments(theta)]
    for t in range(T):
        if kind == "qfedtd":
            total = np.zeros((M, d))
            for c in range(N):
                paths, prob, channel, draws, subsets, k = per_agent[c]
                g = direction(c, t * skip, theta)
                draw = channel[index[c], t]
                ok = np.array([o for o, _ in draws])[draw]
                sub = np.array([j for _, j in draws])[draw]
                mask = np.zeros((M, d))  # rand-k: the kept coordinates, scaled by d / k
                for j, subset in enumerate(subsets):
                    mask[np.ix_(sub == j, list(subset))] = d / k
                total += ok[:, None] * mask * g / N  # divide_by_n
            theta = theta + eta * total
        else:
            loc = []
            for c in range(N):
                x = theta.copy()
                for h in range(table[t]):
                    x = x + eta * (direction(c, (starts[t] + h) * skip, x) + xi[c])
                loc.append(x)
            theta = np.mean(loc, axis=0)
            if kind == "scafflsa":
                for c in range(N):
                    xi[c] = xi[c] + (theta - loc[c]) / (eta * table[t])
        out.append(moments(theta))
    return np.array([m for m, _ in out]), np.array([e for _, e in out])
