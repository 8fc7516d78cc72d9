"""Plain numpy loops (seed by seed, agent by agent, step by step) used as references.

They consume the same random numbers as the JAX kernel (taken from the same key
derivation), so trajectories must agree to float64 rounding.
"""

import jax
import numpy as np

from fedsa_jax.simulate import seed_keys


def round_keys(key, seed, t):
    """``(k_obs, k_channel)`` of seed ``seed``'s round ``t``."""
    _, keys = seed_keys(key, seed + 1)
    return jax.random.split(jax.random.fold_in(keys[seed], np.uint32(t)))


def round_randomness(problem, key, seed, t, H, skip=1):
    k_obs, _ = round_keys(key, seed, t)  # the other half keys the channel
    return np.asarray(problem.randomness(k_obs, problem.num_agents, H, skip))


def scaffnew_coins(key, seed, t, H, p):
    """Scaffnew's communication coins of round t: ``uniform(k_coin, (H,)) < p`` with
    ``(k_coin, k_send) = split(k_channel)`` (fedsa_jax/algorithms/scaffnew.py)."""
    _, k_channel = round_keys(key, seed, t)
    k_coin, _ = jax.random.split(k_channel)
    return np.asarray(jax.random.uniform(k_coin, (H,), np.float64)) < p


def init_randomness(key, seed, N):
    init_keys, _ = seed_keys(key, seed + 1)
    keys = jax.random.split(init_keys[seed], N)
    return [float(jax.random.uniform(k, (), np.float64)) for k in keys]


def alias(prob, al, u):
    S = len(prob)
    i = min(int(u * S), S - 1)
    return i if u * S - i < prob[i] else int(al[i])


def generative_draw(problem, c, u, h):
    """Agent c's h-th generative observation ``(s, s')`` from the round's block ``u``: with pair
    tables one uint32 word ``w`` per step, ``w K = i 2^32 + f`` (exact integers), column i kept
    if ``f < threshold``, else its alias (``pair = s S + s'``); otherwise two uniforms, ``s ~ mu_c``
    then ``s' ~ P_c(s, .)``."""
    N, S = problem.num_agents, problem.num_states
    if problem.pair_tables:
        K = S * S
        w = int(u[c, h]) * K
        i, f = w >> 32, w & 0xFFFFFFFF
        j = c * K + i
        pair = i if f < int(problem.pair_threshold[j]) else int(problem.pair_alias[j])
        return divmod(pair, S)
    mu_p, mu_a = np.asarray(problem.mu_prob).reshape(N, S), np.asarray(problem.mu_alias).reshape(N, S)
    P_p, P_a = np.asarray(problem.P_prob).reshape(N, S, S), np.asarray(problem.P_alias).reshape(N, S, S)
    s = alias(mu_p[c], mu_a[c], u[c, 0, h])
    return s, alias(P_p[c, s], P_a[c, s], u[c, 1, h])


def federated_loop(problem, algorithm, T, theta0, agent_round, coins=None):
    """FedLSA / SCAFFLSA / Scaffnew rounds; ``agent_round(t)`` returns ``g(c, h, theta)``, the
    direction ``A_c(Z) theta - b_c(Z)`` of agent c's h-th local step in round t; ``coins(t)``
    Scaffnew's communication coins of round t."""
    if algorithm.name == "scaffnew":
        return scaffnew_loop(problem, algorithm, T, theta0, agent_round, coins)
    N, d = problem.num_agents, problem.dim
    cfg = algorithm.config
    eta, H = cfg.step_size, cfg.num_local_steps
    theta = np.zeros(d) if theta0 is None else np.array(theta0, float)
    xi = np.zeros((N, d))
    out = [theta.copy()]
    for t in range(T):
        g = agent_round(t)
        local = np.zeros((N, d))
        for c in range(N):
            th = theta.copy()
            for h in range(H):
                step = g(c, h, th)
                if algorithm.name == "scafflsa":
                    step = step - xi[c]
                th = th - eta * step
            local[c] = th
        theta = local.mean(0)
        if algorithm.name == "scafflsa":
            xi = xi + (theta - local) / (eta * H)
        out.append(theta.copy())
    return np.array(out)


def scaffnew_loop(problem, algorithm, T, theta0, agent_round, coins):
    """Scaffnew (exact channel): the agents' iterates x_c and control variates h_c persist; after
    each local step, if the step's coin is 1, x_c <- mean_j xh_j and h_c += (p / eta)(x_c - xh_c)."""
    N, d = problem.num_agents, problem.dim
    cfg = algorithm.config
    eta, p, H = cfg.step_size, cfg.comm_prob, cfg.num_local_steps
    theta = np.zeros(d) if theta0 is None else np.array(theta0, float)
    x = np.tile(theta, (N, 1))
    h = np.zeros((N, d))
    out = [theta.copy()]
    for t in range(T):
        g, coin = agent_round(t), coins(t)
        for k in range(H):
            xh = np.array([x[c] - eta * (g(c, k, x[c]) - h[c]) for c in range(N)])
            if coin[k]:
                xbar = xh.mean(0)
                h = h + (p / eta) * (xbar - xh)
                x = np.tile(xbar, (N, 1))
            else:
                x = xh
        out.append(x.mean(0))
    return np.array(out)


def _coins(algorithm, key, seed):
    cfg = algorithm.config
    if algorithm.name != "scaffnew":
        return None
    return lambda t: scaffnew_coins(key, seed, t, cfg.num_local_steps, cfg.comm_prob)


def td_loop(problem, algorithm, key, seed, T, theta0=None):
    """Federated TD problem: every seed's theta_0..theta_T, sampling by alias tables."""
    N, S = problem.num_agents, problem.num_states
    H, skip = algorithm.config.num_local_steps, algorithm.config.skip
    Phi = np.asarray(problem.features)
    gamma = float(problem.gamma)
    R = np.asarray(problem.rewards)
    mu_p = np.asarray(problem.mu_prob).reshape(N, S)
    mu_a = np.asarray(problem.mu_alias).reshape(N, S)
    P_p = np.asarray(problem.P_prob).reshape(N, S, S)
    P_a = np.asarray(problem.P_alias).reshape(N, S, S)
    chain = [alias(mu_p[c], mu_a[c], u) for c, u in enumerate(init_randomness(key, seed, N))]

    def agent_round(t):
        u = round_randomness(problem, key, seed, t, H, skip)

        def g(c, h, th):
            if problem.sampling == "generative":
                s, s2 = generative_draw(problem, c, u, h)
            else:
                path = [chain[c]]
                for j in range(skip):
                    path.append(alias(P_p[c, path[-1]], P_a[c, path[-1]], u[c, h * skip + j]))
                s, s2, chain[c] = path[0], path[1], path[-1]
            td = R[c, s] + gamma * Phi[s2] @ th - Phi[s] @ th
            return -td * Phi[s]  # A(Z) theta - b(Z)

        return g

    return federated_loop(problem, algorithm, T, theta0, agent_round, _coins(algorithm, key, seed))


def gaussian_loop(problem, algorithm, key, seed, T, theta0=None):
    """Gaussian LSA problem with the kernel's normals."""
    H = algorithm.config.num_local_steps
    A = np.asarray(problem.A_bar)
    b = np.asarray(problem.b_bar)
    sA = np.asarray(problem.noise_A)
    sb = np.asarray(problem.noise_b)

    def agent_round(t):
        z = round_randomness(problem, key, seed, t, H).reshape(problem.num_agents, H, -1)  # (N, H, d)
        # sA G theta - sb g, G ~ N(0,1)^{d x d}, has the law of sqrt(sA^2 |theta|^2 + sb^2) z.
        return lambda c, h, th: (
            A[c] @ th - b[c] + np.sqrt(sA[c] ** 2 * (th @ th) + sb[c] ** 2) * z[c, h]
        )

    return federated_loop(problem, algorithm, T, theta0, agent_round, _coins(algorithm, key, seed))


def td_support(problem):
    """Generative federated TD's observations: per agent, ``(prob, A(Z), b(Z))`` for every
    pair ``Z = (s, s')`` of positive probability ``mu_c(s) P_c(s, s')``."""
    P = np.asarray(problem.transitions, float)
    r = np.asarray(problem.rewards, float)
    phi = np.asarray(problem.features, float)
    mu = np.asarray(problem.stationary, float)
    gamma = float(problem.gamma)
    N, S, _ = P.shape
    return [[(mu[c, s] * P[c, s, t], np.outer(phi[s], phi[s] - gamma * phi[t]), r[c, s] * phi[s])
             for s in range(S) for t in range(S) if mu[c, s] * P[c, s, t] > 0] for c in range(N)]


def enumerated_mse(problem, name, eta, H, T, theta0=None, p=1.0, aggregation="divide_by_n", k=None,
                   support=None, server=None, burn_in=None, with_mean=False):
    """Exact ``E|theta_t - theta_star|^2`` of a problem with i.i.d. observations of finite
    support (default: generative federated TD, :func:`td_support`) by brute force.

    The second moment of ``Y = (1, theta, xi_1..xi_N, x_1..x_N)`` is pushed through
    every joint outcome of a round's randomness (each agent's observation at each
    local step, from ``support[c] = [(prob, A(Z), b(Z)), ...]``; the delivery pattern;
    each agent's rand-k coordinate subset), each outcome's affine map weighted by its
    probability. Independent of ``fedsa_jax.theory`` (no shared code); only for tiny
    problems. QFedTD is FedLSA with H = 1 (its local iterate is ``theta + eta g``).

    ``eta``: a float, or ``(T, H)`` step sizes (a schedule; SCAFFLSA divides by the sum of
    the round's steps). ``server=(lr, beta)``: server SGD with momentum on the pseudo-gradient,
    ``m <- (theta - a) + beta m``, ``theta <- theta - lr m`` (``a`` the aggregate), the momentum
    ``m`` a block of Y. ``burn_in=b``: report the running mean ``v`` of ``theta_{b+1..t}``
    (another block of Y). ``with_mean``: also return ``E[reported iterate]``.
    """
    import itertools
    from math import comb

    assert name != "scafflsa" or (p == 1.0 and k is None), "SCAFFLSA is enumerated with an exact channel only"
    obs = td_support(problem) if support is None else support
    theta_star = np.asarray(problem.theta_star, float)
    N, d = problem.num_agents, problem.dim
    D = 1 + d + 2 * N * d + 2 * d
    th = np.arange(1, 1 + d)
    xi = [np.arange(1 + d + c * d, 1 + d + (c + 1) * d) for c in range(N)]
    loc = [np.arange(1 + d + (N + c) * d, 1 + d + (N + c + 1) * d) for c in range(N)]
    mom = np.arange(D - 2 * d, D - d)
    avg = np.arange(D - d, D)
    etas = np.broadcast_to(np.asarray(eta, float), (T, H))
    I = np.eye(d)
    if k is None:
        masks = [(1.0, np.ones(d))]
    else:
        masks = [(1.0 / comb(d, k), np.isin(np.arange(d), sub) * (d / k)) for sub in itertools.combinations(range(d), k)]
    y = np.zeros(D)
    y[0] = 1.0
    if theta0 is not None:
        y[th] = theta0
    M = np.outer(y, y)
    means = []

    def sq_err(M, t):
        v = avg if burn_in is not None and t > burn_in else th
        means.append(M[0, v].copy())
        return np.trace(M[np.ix_(v, v)]) - 2 * theta_star @ M[0, v] + theta_star @ theta_star

    out = [sq_err(M, 0)]
    for t in range(T):
        L = np.eye(D)
        for c in range(N):
            L[np.ix_(loc[c], loc[c])] = 0.0
            L[np.ix_(loc[c], th)] = I
        M = L @ M @ L.T
        for h in range(H):
            eta = etas[t, h]
            new = np.zeros((D, D))
            for combo in itertools.product(*obs):
                L = np.eye(D)
                prob = 1.0
                for c, (w, Az, bz) in enumerate(combo):
                    prob *= w
                    L[np.ix_(loc[c], loc[c])] = I - eta * Az
                    L[loc[c], 0] = eta * bz
                    if name == "scafflsa":
                        L[np.ix_(loc[c], xi[c])] = eta * I
                new += prob * L @ M @ L.T
            M = new
        new = np.zeros((D, D))
        for delivered in itertools.product((0, 1), repeat=N):
            prob_r = np.prod([p if x else 1 - p for x in delivered])
            if prob_r == 0:
                continue
            n_rec = sum(delivered)
            w = [x / N if aggregation == "divide_by_n" else (x / n_rec if n_rec else 0.0) for x in delivered]
            for combo in itertools.product(masks, repeat=N):
                L = np.eye(D)
                prob = prob_r * np.prod([q for q, _ in combo])
                for c, (_, mask) in enumerate(combo):
                    L[np.ix_(th, th)] -= w[c] * np.diag(mask)
                    L[np.ix_(th, loc[c])] += w[c] * np.diag(mask)
                if name == "scafflsa":
                    for c in range(N):
                        L[xi[c], :] += (L[th, :] - np.eye(D)[loc[c], :]) / np.sum(etas[t])
                if server is not None:  # L[th] is the aggregate a; momentum and theta from the old Y
                    lr, beta = server
                    L[mom, :] = np.eye(D)[th, :] - L[th, :] + beta * np.eye(D)[mom, :]
                    L[th, :] = np.eye(D)[th, :] - lr * L[mom, :]
                new += prob * L @ M @ L.T
        M = new
        if burn_in is not None and t + 1 > burn_in:
            n = t + 1 - burn_in
            L = np.eye(D)
            L[np.ix_(avg, avg)] = (1 - 1 / n) * I
            L[np.ix_(avg, th)] = I / n
            M = L @ M @ L.T
        out.append(sq_err(M, t + 1))
    return (np.asarray(means), np.asarray(out)) if with_mean else np.asarray(out)
