"""The SB3 recipe: exact layouts where SB3 is exact, clear errors, and real runs against the prediction."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from optuna_memprune import Kind
from optuna_memprune.estimate import recipes
from optuna_memprune.estimate.buffers import layout_nbytes, sb3_replay_layout
from optuna_memprune.exceptions import EstimateError

ROOT = Path(__file__).resolve().parents[2]
PONG = "ALE/Pong-v5"


def _kind(fp, kind):
    return sum(c.ram for c in fp.components if c.kind == kind)


def test_dqn_default_atari_buffer_is_the_56_gb_one():
    fp = recipes.sb3("dqn", PONG, {"buffer_size": 1_000_000, "batch_size": 32}, frame_stack=4)
    full = layout_nbytes(sb3_replay_layout((4, 84, 84), "uint8", (), "int64", buffer_size=1_000_000))
    buffer = next(c for c in fp.components if c.name == "replay buffer")
    assert abs(buffer.ram - full) < 1e6 and 56.3e9 < full < 56.6e9
    assert fp.ram > 56.4e9
    omu = recipes.sb3("dqn", PONG, {"buffer_size": 1_000_000, "optimize_memory_usage": True}, frame_stack=4)
    assert 28.1e9 < next(c for c in omu.components if c.name == "replay buffer").ram < 28.4e9


def test_buffer_fill_follows_total_timesteps():
    part = recipes.sb3("dqn", PONG, {"buffer_size": 100_000, "total_timesteps": 25_000}, frame_stack=4)
    full = recipes.sb3("dqn", PONG, {"buffer_size": 100_000}, frame_stack=4)
    ratio = _kind(part, Kind.BUFFER) / _kind(full, Kind.BUFFER)
    assert 0.24 < ratio < 0.26


def test_every_algorithm_builds_its_networks():
    names = {
        "dqn": ["q_net weights", "q_net frozen weights"],
        "qrdqn": ["q_net weights", "q_net frozen weights"],
        "ppo": ["policy weights"],
        "a2c": ["policy weights"],
        "sac": ["actor weights", "critic weights", "critic frozen weights"],
        "td3": ["actor weights", "actor frozen weights", "critic frozen weights"],
    }
    for algo, wanted in names.items():
        env = "Pendulum-v1" if algo in ("sac", "td3") else "CartPole-v1"
        fp = recipes.sb3(algo, env, {"net_arch": [64, 64]})
        got = " | ".join(c.name for c in fp.components)
        for w in wanted:
            assert w in got, (algo, got)
        assert fp.threads >= 2 and _kind(fp, Kind.BASELINE) > 100e6


def test_wider_nets_and_quantiles_cost_more():
    small = recipes.sb3("qrdqn", "CartPole-v1", {"net_arch": "small", "n_quantiles": 25})
    big = recipes.sb3("qrdqn", "CartPole-v1", {"net_arch": "verybig", "n_quantiles": 200})
    assert _kind(big, Kind.WEIGHTS) > 10 * _kind(small, Kind.WEIGHTS)


def test_subproc_envs_are_worker_processes():
    dummy = recipes.sb3("ppo", PONG, {"n_steps": 128}, n_envs=4, frame_stack=4)
    sub = recipes.sb3("ppo", PONG, {"n_steps": 128}, n_envs=4, frame_stack=4, vec_env="subproc")
    assert sub.processes >= 4 and dummy.processes == 0
    assert sub.ram > dummy.ram + 4 * 100e6  # each worker imports torch and SB3 again
    assert sub.threads > dummy.threads


@pytest.mark.parametrize(
    "call,word",
    [
        (lambda: recipes.sb3("dqnn", PONG, {}), "algo"),
        (lambda: recipes.sb3("dqn", PONG, {"buffer_size": -5}), "buffer_size"),
        (lambda: recipes.sb3("dqn", PONG, {"batch_sz": 32}), "batch_sz"),
        (lambda: recipes.sb3("dqn", PONG, {"net_arch": "enormous"}), "net_arch"),
        (lambda: recipes.sb3("sac", "CartPole-v1", {}), "Box action space"),
        (lambda: recipes.sb3("ppo", PONG, {}, vec_env="threads"), "vec_env"),
        (lambda: recipes.sb3("ppo", PONG, {}, n_envs=0), "n_envs"),
        (lambda: recipes.sb3("dqn", "CartPole-v1", {}, frame_stack=-2), "frame_stack must be a positive int"),
        (lambda: recipes.sb3("dqn", "NoSuchEnv-v0", {}), "unknown env id 'NoSuchEnv-v0'"),
        (lambda: recipes.sb3("dqn", PONG, {"buffer_size": 10**99}), r"buffer_size.*2\*\*50.*1e\+99"),
        (lambda: recipes.sb3("ppo", PONG, {"net_arch": {"pi": [64], "vf": [2**30]}}), "net_arch.*2\\*\\*24"),
        (lambda: recipes.sb3("dqn", "CartPole-v1", {"buffer_size": 10**15}), "over 1 PiB"),
    ],
)
def test_bad_input_names_what_was_wrong(call, word):
    with pytest.raises(EstimateError, match=word):
        call()


def test_memprune_predict_prints_the_breakdown(capsys):
    from optuna_memprune.cli import main

    # the table, by the command's main in this process; the usage error below in a real process
    argv = ["predict", "sb3", "--algo", "dqn", "--env", PONG, "--frame-stack", "4", "buffer_size=1e6", "batch_size=32"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "replay buffer" in out and "TOTAL" in out
    assert re.search(r"5\d\.\d\d GiB", out), out  # 52.6 GiB buffer + the rest
    bad = subprocess.run(
        [sys.executable, "-m", "optuna_memprune.cli", "predict", "sb3", "--algo", "dqn", "--env", PONG, "buffer_sz=1"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "buffer_sz" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_accuracy_smoke_on_real_training_runs():
    """A few real configurations (DQN Pong filled buffer, PPO subproc, torch MLP, deque) in fresh processes."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_accuracy.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    fields = dict(kv.split("=") for kv in last.split()[1:])
    assert float(fields["ram_max_err"].rstrip("%")) <= 15, out.stdout
    assert int(fields["ram_under5"]) <= 1, out.stdout
    within, n = map(int, fields["threads_within1"].split("/"))
    assert within >= 0.8 * n, out.stdout


def test_every_recipe_exports_what_the_registry_reads():
    import argparse

    from optuna_memprune.estimate.processes import Stack

    assert recipes.RECIPES["sb3"] is recipes.sb3_recipe and recipes.sb3 is recipes.sb3_recipe.sb3
    for name, recipe in recipes.RECIPES.items():
        assert isinstance(recipe.HELP, str) and recipe.HELP, name
        assert recipe.VERSIONED and all(isinstance(d, str) for d in recipe.VERSIONED), name
        assert recipe.STACKS and all(isinstance(s, Stack) and s.imports for s in recipe.STACKS.values()), name
        parser = argparse.ArgumentParser()
        recipe.add_arguments(parser)
        assert callable(recipe.from_args) and parser._actions, name
        if hasattr(recipe, "calibrate_env"):  # env ids are checked before any probe is started for them
            assert callable(recipe.check_env), name
    assert set(recipes.stacks()) == {"python", "torch", "sb3", "sb3-atari", "rlzoo3", "rlzoo3-atari"}


def test_process_takes_the_recipes_stack_names():
    from optuna_memprune.estimate import process
    from optuna_memprune.estimate.processes import process as process_of

    named = process("sb3-atari", torch_threads=1)
    assert named == process_of(recipes.sb3_recipe.STACKS["sb3-atari"], torch_threads=1)
    assert "ale_py" in named.components[0].note
    with pytest.raises(EstimateError, match=r"'sb3-atari'.*but got 'tensorflow'"):
        process("tensorflow")


def test_the_recipe_and_process_share_one_calibrated_entry_keyed_by_the_recipes_versions():
    from optuna_memprune.estimate import calibration

    fp = recipes.sb3("dqn", PONG, {"buffer_size": 1000}, frame_stack=4)
    stacks = calibration.load().data["stacks"]
    atari = ",".join(sorted(recipes.sb3_recipe.STACKS["sb3-atari"].imports))
    keys = [k for k in stacks if k.startswith(f"stack:{atari}:1:")]
    assert len(keys) == 1  # keyed by the SB3 libraries' versions as well as the file's
    assert _kind(fp, Kind.BASELINE) == stacks[keys[0]]["points"][0][1]["warm"]["VmHWM"]


def _real_networks(model, algo):
    """The real model's networks by the recipe's component names, as parameter bytes."""

    def nbytes(module):
        return sum(p.numel() * p.element_size() for p in module.parameters())

    if algo in ("dqn", "qrdqn"):
        online = model.policy.quantile_net if algo == "qrdqn" else model.q_net
        target = model.policy.quantile_net_target if algo == "qrdqn" else model.q_net_target
        return {"q_net weights": nbytes(online), "q_net frozen weights": nbytes(target)}
    if algo in ("ppo", "a2c", "trpo"):
        return {"policy weights": nbytes(model.policy)}
    out = {
        "actor weights": nbytes(model.actor),
        "critic weights": nbytes(model.critic),
        "critic frozen weights": nbytes(model.critic_target),
    }
    if algo in ("td3", "ddpg"):
        out["actor frozen weights"] = nbytes(model.actor_target)
    return out


@pytest.mark.parametrize(
    ("algo", "env", "policy_kwargs"),
    [
        ("dqn", "CartPole-v1", "dict(net_arch=[256, 256])"),
        ("qrdqn", "CartPole-v1", {"net_arch": [64, 64], "n_quantiles": 170}),
        (
            "ppo",
            "CartPole-v1",
            "dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[128]))",
        ),
        ("a2c", "CartPole-v1", {"net_arch": {"pi": [64], "vf": [64]}, "activation_fn": "tanh"}),
        ("trpo", "CartPole-v1", None),
        ("sac", "Pendulum-v1", "dict(net_arch=dict(pi=[256, 256], qf=[1024, 1024]), n_critics=3)"),
        ("td3", "Pendulum-v1", "dict(net_arch=[400, 300])"),
        ("ddpg", "Pendulum-v1", None),  # DDPG's one critic
        ("tqc", "Pendulum-v1", "dict(net_arch=[512, 512, 512], n_critics=2, n_quantiles=10)"),
    ],
)
def test_every_algo_has_the_real_models_parameter_bytes(algo, env, policy_kwargs):
    """Each algo's networks as the recipe builds them on meta, against the real SB3/sb3-contrib model built with
    the same policy_kwargs (text read as rl-zoo3's yml writes it)."""
    import gymnasium as gym
    import torch.nn as nn
    from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3

    sb3_contrib = pytest.importorskip("sb3_contrib", reason="sb3-contrib is not installed")
    classes = {
        "dqn": DQN,
        "ppo": PPO,
        "a2c": A2C,
        "sac": SAC,
        "td3": TD3,
        "ddpg": DDPG,
        "qrdqn": sb3_contrib.QRDQN,
        "trpo": sb3_contrib.TRPO,
        "tqc": sb3_contrib.TQC,
    }
    real_kwargs = recipes.sb3_recipe.read_kwargs(policy_kwargs, "policy_kwargs")
    if real_kwargs.get("activation_fn") == "nn.ReLU":
        real_kwargs["activation_fn"] = nn.ReLU
    elif real_kwargs.get("activation_fn") == "tanh":
        real_kwargs["activation_fn"] = nn.Tanh
    model = (
        classes[algo]("MlpPolicy", gym.make(env), policy_kwargs=real_kwargs, buffer_size=1000, device="cpu")
        if algo in ("dqn", "qrdqn", "sac", "td3", "ddpg", "tqc")
        else classes[algo]("MlpPolicy", gym.make(env), policy_kwargs=real_kwargs, device="cpu")
    )
    params = {"buffer_size": 1000} if "buffer_size" in ALGO_DEFAULTS[algo] else {}
    if policy_kwargs is not None:
        params["policy_kwargs"] = policy_kwargs
    fp = recipes.sb3(algo, env, params)
    got = {c.name.removeprefix(f"{algo} "): c.ram for c in fp.components if c.name.endswith("weights")}
    assert got == _real_networks(model, algo)
    if algo in ("dqn", "qrdqn", "sac", "td3", "ddpg", "tqc"):
        arrays = [a for a in vars(model.replay_buffer).values() if hasattr(a, "nbytes")]
        real = sum(a.nbytes for a in arrays)
        predicted = next(c.ram for c in fp.components if c.name == "replay buffer")
        assert 0 <= predicted - real < 4096 * len(arrays)  # each array's RSS in whole pages


ALGO_DEFAULTS = {algo: defaults for algo, (_, defaults) in recipes.SB3_ALGOS.items()}


def test_the_optimizer_is_the_algos():
    a2c = recipes.sb3("a2c", "CartPole-v1", {"net_arch": [64]})
    adam = recipes.sb3("a2c", "CartPole-v1", {"net_arch": [64], "use_rms_prop": False})
    state = {fp: next(c.ram for c in fp.components if c.name.endswith("optimizer state")) for fp in (a2c, adam)}
    weights = next(c.ram for c in a2c.components if c.name.endswith("policy weights"))
    assert abs(state[a2c] - weights) < 1024 and abs(state[adam] - 2 * weights) < 1024  # RMSprop 1 buffer, Adam 2


@pytest.mark.parametrize(
    ("params", "word"),
    [
        (
            {"policy_kwargs": "dict(net_arch=[64], lstm_hidden_size=64)"},
            r"unknown policy_kwargs key\(s\) \['lstm_hidden_size'\]",
        ),
        ({"policy_kwargs": "__import__('os').system('echo hacked')"}, "would need running code"),
        ({"policy_kwargs": "dict(net_arch=[64]"}, "policy_kwargs' must be Python text"),
        ({"policy_kwargs": {"n_quantiles": 10}}, r"\['n_quantiles'\] are not parameters of dqn"),
        ({"policy_kwargs": {"net_arch": {"pi": [64], "vf": [64]}}}, "net_arch.*of dqn must be a list"),
        ({"net_arch": [64], "policy_kwargs": {"net_arch": [128]}}, "'net_arch' is given twice"),
        ({"policy_kwargs": {"activation_fn": "swish"}}, "activation_fn"),
        ({"policy": "MultiInputPolicy"}, "param 'policy'"),
        ({"replay_buffer_class": "HerReplayBuffer"}, "replay_buffer_class"),
    ],
)
def test_bad_policy_kwargs_name_what_was_wrong(params, word):
    with pytest.raises(EstimateError, match=word):
        recipes.sb3("dqn", "CartPole-v1", params)
