"""Subprocess entry point for the scale tests (devices, hosts, SIGKILL).

python scale_worker.py run OUT [--devices K] [--checkpoint DIR] [--chunk C] [--rounds T]
python scale_worker.py host PROCESS_ID PORT OUT      # one of two processes
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)


def problem_and_alg():
    import fedsa_jax as fj

    p = fj.problems.garnet(jax.random.key(0), num_agents=3, num_states=6, dim=2, sampling="markov")
    return p, fj.scafflsa(0.3, 3, quantizer=fj.channel.stochastic_uniform(3), success_prob=0.7)


def simulate(**kw):
    import fedsa_jax as fj

    p, alg = problem_and_alg()
    kw.setdefault("num_rounds", 12)
    return fj.simulate(jax.random.key(9), p, alg, num_seeds=10, record_every=2, **kw)


def save(out, res):
    import numpy as np

    np.savez(
        out,
        final=res.final_theta,
        mse=res.mse_mean,
        sem=res.mse_sem,
        theta=res.theta_mean,
        delivered=res.bits_delivered,
        devices=res.config["device_count"],
        processes=res.config["process_count"],
    )


def main(argv):
    mode = argv[0]
    if mode == "run":
        out = argv[1]
        opts = dict(zip(argv[2::2], argv[3::2]))
        if "--devices" in opts:
            jax.config.update("jax_num_cpu_devices", int(opts["--devices"]))
        kw = {}
        if "--checkpoint" in opts:
            kw["checkpoint_dir"] = opts["--checkpoint"]
        if "--chunk" in opts:
            kw["chunk_rounds"] = int(opts["--chunk"])
        if "--rounds" in opts:
            kw["num_rounds"] = int(opts["--rounds"])
        save(out, simulate(**kw))
    elif mode == "host":
        pid, port, out = int(argv[1]), argv[2], argv[3]
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.config.update("jax_num_cpu_devices", 2)
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=2,
            process_id=pid,
            initialization_timeout=120,
        )
        res = simulate()
        if pid == 0:
            save(out, res)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
