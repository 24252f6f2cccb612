"""The rl-zoo3 recipe against rl-zoo3 itself: its yml files, its samplers on real Optuna trials, its manager's
own preprocessing and the SB3 models it builds from them."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

pytest.importorskip("rl_zoo3", reason="rl-zoo3 is not installed (pip install rl-zoo3==2.9.2 pandas: the test extra)")

import optuna  # noqa: E402
from rl_zoo3.exp_manager import ExperimentManager  # noqa: E402
from rl_zoo3.hyperparams_opt import HYPERPARAMS_SAMPLER  # noqa: E402

from optuna_memprune.estimate import Kind, recipes  # noqa: E402
from optuna_memprune.exceptions import EstimateError  # noqa: E402
from optuna_memprune.units import parse_bytes  # noqa: E402

zoo = recipes.rlzoo3_recipe
PONG = "PongNoFrameskip-v4"
ENVS = {
    "dqn": "CartPole-v1",
    "qrdqn": "CartPole-v1",
    "ppo": "CartPole-v1",
    "a2c": "CartPole-v1",
    "trpo": "CartPole-v1",
    "sac": "Pendulum-v1",
    "td3": "Pendulum-v1",
    "ddpg": "Pendulum-v1",
    "tqc": "Pendulum-v1",
}


def _buffer(fp):
    return next(c.ram for c in fp.components if c.name == "replay buffer")


def _manager(algo, env_id, tmp_path, **kwargs):
    """rl-zoo3's own ExperimentManager, as ``train.py -optimize`` makes it, with its hyperparameters read and
    preprocessed by its own code: (the model kwargs, the manager)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    em = ExperimentManager(
        argparse.Namespace(),
        algo,
        env_id,
        str(tmp_path),
        optimize_hyperparameters=True,
        verbose=0,
        device="cpu",
        **kwargs,
    )
    hyperparams, em.env_wrapper, _, em.vec_env_wrapper = em._preprocess_hyperparams(em.read_hyperparameters()[0])
    env = em.create_envs(1, no_log=True)
    hyperparams = em._preprocess_action_noise(hyperparams, {}, env)  # as setup_experiment() does
    env.close()
    return hyperparams, em


def test_pong_dqn_defaults_are_rl_zoos_5_26_gib_buffer(tmp_path):
    """The zoo's Pong DQN (buffer 100000 of 4x84x84 uint8 twice, no optimize_memory_usage) against the real
    ReplayBuffer of the model rl-zoo3 builds from its own preprocessing, at a tiny buffer_size and scaled."""
    fixed = zoo.fixed_hyperparams("dqn", PONG)
    assert (fixed["buffer_size"], fixed["frame_stack"], fixed["optimize_memory_usage"]) == (100_000, 4, False)
    fp = recipes.rlzoo3("dqn", PONG)
    buffer = _buffer(fp)
    assert 5.25 * 2**30 < buffer < 5.27 * 2**30
    assert 5.3 * 2**30 < fp.ram < 6.5 * 2**30  # plus the process, nets and envs
    assert sum(c.ram for c in fp.components if c.name.startswith("eval env")) > 0

    kwargs, em = _manager("dqn", PONG, tmp_path, hyperparams={"buffer_size": 1000, "learning_starts": 0})
    from stable_baselines3 import DQN

    model = DQN(env=em.create_envs(em.n_envs, no_log=True), **kwargs)
    arrays = [a for a in vars(model.replay_buffer).values() if hasattr(a, "nbytes")]
    per_transition = sum(a.nbytes for a in arrays) / 1000
    assert per_transition == 2 * 4 * 84 * 84 + 8 + 3 * 4  # obs and next obs, int64 action, three float32
    assert buffer == pytest.approx(per_transition * 100_000, abs=4096 * len(arrays))
    small = recipes.rlzoo3("dqn", PONG, hyperparams={"buffer_size": 1000, "learning_starts": 0})
    assert 0 <= _buffer(small) - per_transition * 1000 < 4096 * len(arrays)
    model.env.close()


def test_optimize_memory_usage_and_n_timesteps_from_the_command_line():
    full = _buffer(recipes.rlzoo3("dqn", PONG))
    omu = _buffer(
        recipes.rlzoo3(
            "dqn",
            PONG,
            hyperparams={
                "optimize_memory_usage": True,
                "replay_buffer_kwargs": "dict(handle_timeout_termination=False)",
            },
        )
    )
    assert 0.49 < omu / full < 0.51
    part = _buffer(recipes.rlzoo3("dqn", PONG, n_timesteps=25_000))  # train.py -n 25000: a quarter filled
    assert 0.24 < part / full < 0.26


@pytest.mark.parametrize("algo", list(ENVS))
def test_rl_zoos_own_samplers_on_real_trials_are_predicted(algo, tmp_path):
    """rl-zoo3's sampler on a real Optuna trial: what it returns (SB3's names, classes) and the trial's params
    (rl-zoo3's names) give one prediction, whose networks and replay buffer are those of the model rl-zoo3's
    objective builds from the same kwargs."""
    from rl_zoo3.utils import ALGOS

    env_id = ENVS[algo]
    kwargs, em = _manager(algo, env_id, tmp_path, n_timesteps=2000)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(2):
        trial = study.ask()
        sampled = HYPERPARAMS_SAMPLER[algo](trial, 1, em.n_envs, {"using_her_replay_buffer": False, "her_kwargs": {}})
        fp = recipes.rlzoo3(algo, env_id, sampled, n_timesteps=2000)
        assert fp.ram == recipes.rlzoo3(algo, env_id, trial.params, n_timesteps=2000).ram
        model = ALGOS[algo](env=em.create_envs(em.n_envs, no_log=True), **{**kwargs, **sampled})
        params = sum(p.numel() * p.element_size() for p in model.policy.parameters())
        ours = sum(c.ram for c in fp.components if c.kind is Kind.WEIGHTS)
        assert ours == params, (algo, trial.params)  # the policy holds online and target networks alike
        if hasattr(model, "replay_buffer"):
            arrays = [a for a in vars(model.replay_buffer).values() if hasattr(a, "nbytes")]
            full = sum(a.nbytes for a in arrays) * min(2000, model.buffer_size) / model.buffer_size
            assert _buffer(fp) == pytest.approx(full, rel=0.01, abs=4096 * len(arrays))
        model.env.close()


@pytest.mark.parametrize(
    ("call", "word"),
    [
        (lambda: recipes.rlzoo3("dqn", PONG, {"batch_sz": 32}), r"unknown rl-zoo3 param\(s\) \['batch_sz'\].*known:"),
        (lambda: recipes.rlzoo3("dqn", PONG, hyperparams={"bufer_size": 10}), r"\['bufer_size'\] in hyperparams"),
        (lambda: recipes.rlzoo3("dqnn", PONG), "algo must be one of"),
        (lambda: recipes.rlzoo3("ppo", "CartPole-v1", {"net_arch": "big"}), "net_arch' of ppo must be one of"),
        (lambda: recipes.rlzoo3("dqn", PONG, {"batch_size_pow": 99}), "batch_size_pow' must be at most 40"),
        (
            lambda: recipes.rlzoo3("dqn", PONG, hyperparams={"policy_kwargs": "dict(net_arch=exec('1'))"}),
            "running code",
        ),
        (lambda: recipes.rlzoo3("dqn", PONG, hyperparams={"env_wrapper": None}), "AtariWrapper"),
        (lambda: zoo.fixed_hyperparams("dqn", PONG, path="/nonexistent/dqn.yml"), "cannot read rl-zoo3"),
    ],
)
def test_bad_input_names_what_was_wrong(call, word):
    with pytest.raises(EstimateError, match=word):
        call()


def test_largest_buffer_that_fits_a_budget():
    budget = parse_bytes("4GiB")
    fits = zoo.largest_fitting("dqn", PONG, "4GiB")
    assert 50_000 < fits < 100_000
    assert recipes.rlzoo3("dqn", PONG, hyperparams={"buffer_size": fits}).ram <= budget
    assert recipes.rlzoo3("dqn", PONG, hyperparams={"buffer_size": fits + 1}).ram > budget
    assert zoo.largest_fitting("dqn", PONG, "64GiB") == 100_000  # the zoo's own value fits: kept
    assert zoo.largest_fitting("dqn", PONG, "100MiB") is None  # not even the process fits
    line = zoo.budget_advice("dqn", PONG, "4GiB")
    assert re.fullmatch(r"buffer_size 100000 needs 5\.\d\d GiB at 4\.00 GiB; \d\d000 fits", line), line
    assert zoo.budget_advice("dqn", PONG, "64GiB") is None
    # any count the footprint grows with: the zoo's 8 PPO Atari envs as worker processes
    envs = zoo.largest_fitting("ppo", PONG, "2GiB", "n_envs", vec_env="subproc")
    assert 1 <= envs < 8
    for n, fits_or_not in ((envs, True), (envs + 1, False)):
        fp = recipes.rlzoo3("ppo", PONG, hyperparams={"n_envs": n}, vec_env="subproc")
        assert (fp.ram <= budget // 2) is fits_or_not
        assert sum(c.name == "multiprocessing helpers" for c in fp.components) == 1


def test_memprune_predict_rlzoo3_through_the_registry(capsys):
    from optuna_memprune.cli import main

    argv = ["predict", "rlzoo3", "--algo", "dqn", "--env", PONG]

    def predict(*params: str) -> str:  # the command's output, by its main in this process
        assert main([*argv, *params]) == 0
        return capsys.readouterr().out

    out = predict("-params", "buffer_size:50000")
    assert "replay buffer" in out and "eval env" in out and "buffer_size:50000" in out
    assert re.search(r"replay buffer\s+buffer\s+2\.6\d GiB", out), out
    sampled = predict("batch_size_pow=6", "net_arch=big")
    assert "batch 64" in sampled and "5.26 GiB" in sampled
    # a usage error in a real process: one line on its stderr, no traceback
    bad = subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", *argv, "batch_sz=1"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "batch_sz" in bad.stderr and "Traceback" not in bad.stderr
