"""Benchmark of the Ray backend: a guarded study on a Ray cluster of 3 nodes on this machine, each node's
processes in a memory cgroup of its own, against the same study run on Ray as users run it.

Each node is a ``ray start --block`` whose processes (its raylet, object store, and every worker it starts) live
in a cgroup v1 memory group made below this process's own: its memory is real, not only Ray's logical
``memory`` resource. A node is started without a limit, its own processes are left to settle, and then the
group's limit is set to what they use plus ``--node-ram-mib`` (the room for trials, also the node's ``memory``
resource), plus ``--ray-headroom-mib`` (256) for the growth of Ray's own processes while they serve tasks (the
head's control store grows with every task: a run without it had its one OOM kill on the head, its trials within
their room): a node whose trials together need more than that room meets the kernel's OOM killer.

The study (TPE, fixed seed, a SQLite file every node reaches) asks ``mb`` among a few sizes; each trial grows
to ``mb`` MiB (numpy pages written) over the first half of ``--hold-s`` seconds (8), holds them to the end and
reports each of its 8 steps. The per-trial budget (``--budget-mib``) is under the three largest sizes, and the
largest is more than a node holds. Two arms, each on a fresh cluster, each for
the same wall time (``--duration``), one node's raylet SIGKILLed halfway through:

- guarded: ``omp.optimize(study, objective, guard=guard, backend="ray", n_jobs=<the cluster's CPUs>)`` with the
  footprint ``process + mb`` (the process: a Ray worker with Optuna, measured once by a task on the cluster);
  each task asks Ray for its predicted memory, a trial over the budget is clamped to a size that fits (the
  guard's default) or rejected before it starts;
- unguarded: the loop a user writes (``study.ask()``, a ``@ray.remote`` task per trial with Ray's defaults: 1 CPU,
  no ``memory`` declared, 3 retries on a lost worker; ``study.tell`` of its value, FAIL on an error), at most as
  many tasks in flight as the cluster has CPUs.

An independent reader (a thread of this process) samples every node's group every 50 ms (its anonymous
memory, ``memory.stat``'s ``total_rss``: the highest is printed against the limit) and reads, per arm, the OOM
kills the kernel made there (``memory.oom_control``'s ``oom_kill``). A node is overcommitted when what ran there
needed more than its memory, that is when the kernel had to OOM-kill there (page cache, Ray's logs among it,
fills a group to its limit and is reclaimed first). Last line::

    RAY nodes=3 trials=<n> completed_guarded=<a> completed_unguarded=<b> node_overcommit=<k> oom_kills=<o>
        killed_node_trials_failed_with_reason=<f> running_left=<r> lost=<l>   (one line)

``trials`` is the guarded arm's trials; ``node_overcommit`` and ``oom_kills`` are the guarded arm's (the
unguarded arm's are on the line before); ``completed_*`` count trials COMPLETE within ``--duration`` of their
arm's start; ``killed_node_trials_failed_with_reason`` the guarded trials that ended FAIL with the words of the
lost task in their record; ``running_left`` trials of either arm left RUNNING or WAITING; ``lost`` the guarded
trials without a final state or without a record. Targets: node_overcommit 0, running_left 0, lost 0,
completed_guarded at least 1.5x completed_unguarded.

Needs root (or a delegated memory group) on a machine with cgroup v1 memory groups, as this project's test
machines have; Ray from the ``ray`` extra.

    python scripts/bench_ray.py            # 3 nodes x 3 CPUs, 1.5 GiB of room each, 150 s per arm
    python scripts/bench_ray.py --smoke    # 60 s per arm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import optuna
from optuna.trial import TrialState

import optuna_memprune as omp

MiB = 2**20
#: MiB a trial touches: the budget (1 GiB) is under the three largest, the largest is more than a node holds
SIZES = (100, 200, 350, 500, 700, 900, 1200, 1500)
RAY_ERROR = "its Ray task was lost"  # the words the guarded record gives a trial whose node died


def objective(trial: optuna.Trial) -> float:
    """A training trial in miniature: its memory grows to ``mb`` MiB (numpy pages written) over the first half
    of ``BENCH_RAY_HOLD_S`` seconds and is held to the end, with a report each step."""
    mb = int(trial.suggest_categorical("mb", SIZES))
    x = trial.suggest_float("x", -3.0, 3.0)
    steps = 8
    step_s = float(os.environ.get("BENCH_RAY_HOLD_S", "8.0")) / steps
    blocks = []
    for step in range(steps):
        if step < steps // 2:
            blocks.append(np.ones(mb * MiB // (steps // 2), dtype=np.uint8))
        trial.report(float(step), step)
        time.sleep(step_s)
    return x * x + float(sum(int(b[0]) for b in blocks)) * 0.0


def _worker_rss() -> int:
    """The RSS of a Ray worker that has imported what a trial's process has (run as a Ray task)."""
    import optuna_memprune.runner  # noqa: F401 - what the guarded task imports

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the nodes and their groups --------------------------------------------------------------------------


def _own_memory_group() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise SystemExit("bench_ray needs a cgroup v1 memory group (none in /proc/self/cgroup)")


class Node:
    """One ``ray start --block`` in a memory group of its own."""

    def __init__(self, index: int, group: Path, command: list[str], env: dict[str, str], log: str) -> None:
        self.index, self.group = index, group
        group.mkdir()
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
            )

    def read(self, name: str) -> str:
        return (self.group / name).read_text()

    def usage(self) -> int:
        return int(self.read("memory.usage_in_bytes"))

    def limit(self, room: int, headroom: int) -> None:
        (self.group / "memory.limit_in_bytes").write_text(str(self.usage() + room + headroom))

    def oom_kills(self) -> int:
        for line in self.read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def anonymous(self) -> int:
        """The group's anonymous memory (with its swap cache): what its processes hold, not its page cache."""
        for line in self.read("memory.stat").splitlines():
            if line.startswith("total_rss "):
                return int(line.split()[1])
        raise ValueError("no total_rss in memory.stat")

    def memory_limit(self) -> int:
        return int(self.read("memory.limit_in_bytes"))

    def kill_raylet(self) -> bool:
        for pid in self.read("cgroup.procs").split():
            try:
                if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                    os.kill(int(pid), signal.SIGKILL)
                    return True
            except OSError:
                continue
        return False

    def stop(self) -> None:
        for pid in self.read("cgroup.procs").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        self.process.wait()
        deadline = time.monotonic() + 10
        while self.read("cgroup.procs").split() and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            self.group.rmdir()
        except OSError:
            pass


class Cluster:
    """``nodes`` Ray nodes on this machine, the first the head; each with ``cpus`` CPUs and ``room`` bytes of
    Ray ``memory`` and of real memory above what its own processes use."""

    def __init__(self, root: Path, nodes: int, cpus: int, room: int, logs: str, headroom: int) -> None:
        self.root, self.logs, self.headroom = root, logs, headroom
        self.nodes: list[Node] = []
        root.mkdir()
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"
        common = [
            f"--num-cpus={cpus}",
            f"--memory={room}",
            f"--object-store-memory={80 * MiB}",
            "--disable-usage-stats",
            "--block",
        ]
        # the kernel's limit is the node's memory (Ray's monitor off); no token: a cluster of this machine alone
        env = dict(os.environ, RAY_memory_monitor_refresh_ms="0", RAY_AUTH_MODE="disabled")
        os.environ["RAY_AUTH_MODE"] = "disabled"
        head = [ray, "start", "--head", f"--port={port}", "--include-dashboard=false"]
        self.nodes.append(Node(0, root / "node0", head + common, env, os.path.join(logs, f"{root.name}-node0.log")))
        try:
            self._start(ray, head, common, env, nodes, room)
        except BaseException:
            self.close()
            raise

    def _start(self, ray: str, head: list[str], common: list[str], env: dict[str, str], nodes: int, room: int) -> None:
        _wait_for(lambda: _connectable(self.address), 60, "the head node")
        import ray as ray_module

        ray_module.init(address=self.address, logging_level="error", log_to_driver=False)

        def up(count: int) -> Callable[[], bool]:
            def check() -> bool:
                alive = sum(n["Alive"] for n in ray_module.nodes())
                ended = [n.index for n in self.nodes if n.process.poll() is not None]
                if ended:
                    raise SystemExit(
                        f"bench_ray: node(s) {ended} ended while starting ({alive} alive); see {self.logs}"
                    )
                return alive == count

            return check

        _wait_for(up(1), 60, "the head node")
        for i in range(1, nodes):  # one at a time: a raylet that does not register within 30 s gives up
            command = [ray, "start", f"--address={self.address}", *common]
            log = os.path.join(self.logs, f"{self.root.name}-node{i}.log")
            self.nodes.append(Node(i, self.root / f"node{i}", command, env, log))
            _wait_for(up(i + 1), 60, f"node {i}")
        time.sleep(3.0)  # each node's own processes settle before its limit is set
        for node in self.nodes:
            node.limit(room, self.headroom)

    def close(self) -> None:
        import ray

        ray.shutdown()
        for node in reversed(self.nodes):
            node.stop()
        try:
            self.root.rmdir()
        except OSError:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connectable(address: str) -> bool:
    host, port = address.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _wait_for(check, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"bench_ray: {what} did not come up within {seconds:.0f} s")


class Reader(threading.Thread):
    """The independent reader: every node's group every 50 ms (the highest anonymous memory seen, which the
    kernel cannot reclaim: ``total_rss`` of ``memory.stat``), and its OOM kills at the start and the end of an
    arm. A node is overcommitted when what ran there needed more than its memory: the kernel OOM-killed there
    (the group's page cache, Ray's logs among it, fills any group to its limit and is reclaimed first, so
    reaching the limit alone says nothing)."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.start_kills = [n.oom_kills() for n in nodes]
        self.highest = [0] * len(nodes)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for i, node in enumerate(self.nodes):
                try:
                    self.highest[i] = max(self.highest[i], node.anonymous())
                except (OSError, ValueError):
                    pass

    def finish(self) -> tuple[int, int]:
        """(nodes overcommitted, OOM kills) during the arm."""
        self.stopped.set()
        self.join()
        kills = [node.oom_kills() - k0 for node, k0 in zip(self.nodes, self.start_kills, strict=True)]
        return sum(k > 0 for k in kills), sum(kills)


# -- the two arms ----------------------------------------------------------------------------------------


def _killer(cluster: Cluster, after: float, killed: list[float]) -> threading.Thread:
    def kill() -> None:  # the worker node that holds the most now (the head keeps the cluster's control store)
        time.sleep(after)
        node = max(cluster.nodes[1:], key=lambda n: n.usage())
        if node.kill_raylet():
            killed.append(time.time())

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def guarded_arm(cluster: Cluster, url: str, args: argparse.Namespace, base: int) -> optuna.Study:
    def footprint(params: dict) -> omp.Footprint:
        return omp.Footprint.of(ram=base + int(params["mb"]) * MiB)

    space = {
        "mb": optuna.distributions.CategoricalDistribution(SIZES),
        "x": optuna.distributions.FloatDistribution(-3.0, 3.0),
    }
    guard = omp.MemoryGuard(footprint, omp.Budget(ram=args.budget_mib * MiB), search_space=space)
    study = optuna.create_study(
        study_name="guarded",
        storage=url,
        sampler=guard.wrap_sampler(optuna.samplers.TPESampler(seed=args.seed)),
        pruner=guard.wrap_pruner(None),
    )
    omp.optimize(
        study,
        objective,
        guard=guard,
        timeout=args.duration,
        n_jobs=args.nodes * args.cpus,
        backend="ray",
        ray_address=None,  # this process is connected (Cluster)
        show_progress_bar=False,
    )
    return study


def _plain_task(url: str, name: str, trial_id: int) -> float:
    study = optuna.load_study(study_name=name, storage=url)
    return objective(optuna.trial.Trial(study, trial_id))


def unguarded_arm(url: str, args: argparse.Namespace) -> optuna.Study:
    import ray

    study = optuna.create_study(study_name="unguarded", storage=url, sampler=optuna.samplers.TPESampler(seed=args.seed))
    task = ray.remote(num_cpus=1)(_plain_task)  # Ray's defaults: no memory declared, 3 retries
    deadline = time.monotonic() + args.duration
    running: dict = {}
    while running or time.monotonic() < deadline:
        while time.monotonic() < deadline and len(running) < args.nodes * args.cpus:
            trial = study.ask()
            running[task.remote(url, "unguarded", trial._trial_id)] = trial
        done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
        for ref in done:
            trial = running.pop(ref)
            try:
                study.tell(trial, ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - the task died (OOM kill, lost node): the trial fails
                trial.set_user_attr("error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                study.tell(trial, state=TrialState.FAIL)
    return study


def _completed_within(study: optuna.Study, start: float, seconds: float) -> int:
    return sum(
        t.state == TrialState.COMPLETE
        and t.datetime_complete is not None
        and t.datetime_complete.timestamp() <= start + seconds
        for t in study.get_trials(deepcopy=False)
    )


def run_arm(name: str, args: argparse.Namespace, root: Path, tmp: str, url: str, base: int | None) -> dict:
    cluster = Cluster(root / name, args.nodes, args.cpus, args.node_ram_mib * MiB, tmp, args.ray_headroom_mib * MiB)
    try:
        if base is None:
            import ray

            base = int(ray.get(ray.remote(num_cpus=0)(_worker_rss).remote())) + 32 * MiB
        reader = Reader(cluster.nodes)
        reader.start()
        killed: list[float] = []
        killer = _killer(cluster, args.duration / 2, killed)
        start = time.time()
        study = guarded_arm(cluster, url, args, base) if name == "guarded" else unguarded_arm(url, args)
        wall = time.time() - start
        killer.join()
        hit, kills = reader.finish()
        highest = [
            f"{h / MiB:.0f}/{n.memory_limit() / MiB:.0f}" for h, n in zip(reader.highest, cluster.nodes, strict=True)
        ]
    finally:
        cluster.close()
    trials = study.get_trials(deepcopy=False)
    states = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    out = {
        "arm": name,
        "base": base,
        "trials": len(trials),
        "states": {k: v for k, v in states.items() if v},
        "completed": _completed_within(study, start, args.duration),
        "overcommit": hit,
        "oom_kills": kills,
        "anonymous_peak_of_limit_mib": highest,
        "node_killed": bool(killed),
        "wall_s": round(wall, 1),
        "running_left": states["RUNNING"] + states["WAITING"],
    }
    if name == "guarded":
        records = [omp.read_record(t.user_attrs) for t in trials]
        out["killed_failed"] = sum(
            t.state == TrialState.FAIL and r is not None and RAY_ERROR in r.reason
            for t, r in zip(trials, records, strict=True)
        )
        out["lost"] = sum(
            t.state in (TrialState.RUNNING, TrialState.WAITING) or r is None
            for t, r in zip(trials, records, strict=True)
        )
        out["decisions"] = {}
        for r in records:
            key = "none" if r is None else r.decision.value
            out["decisions"][key] = out["decisions"].get(key, 0) + 1
    print(f"{name}: {json.dumps(out)}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=3, help="each node's CPUs (Ray's num_cpus)")
    parser.add_argument("--node-ram-mib", type=int, default=1536, help="each node's room for trials")
    parser.add_argument("--budget-mib", type=int, default=1024, help="the per-trial RAM budget")
    parser.add_argument(
        "--ray-headroom-mib", type=int, default=256, help="each node's room for the growth of Ray's own processes"
    )
    parser.add_argument("--duration", type=float, default=150.0, help="seconds each arm asks trials")
    parser.add_argument("--hold-s", type=float, default=8.0, help="each trial's seconds (it grows over half)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="60 s per arm")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (study, node logs)")
    args = parser.parse_args()
    if args.smoke:
        args.duration = min(args.duration, 60.0)
    os.environ["BENCH_RAY_HOLD_S"] = str(args.hold_s)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    own = _own_memory_group()
    root = own / f"memprune-bench-ray-{os.getpid()}"
    root.mkdir()
    tmp = tempfile.mkdtemp(prefix="memprune-bench-ray-", dir="/tmp")  # short: Ray's socket paths
    url = f"sqlite:///{os.path.join(tmp, 'study.db')}"
    try:
        guarded = run_arm("guarded", args, root, tmp, url, None)
        unguarded = run_arm("unguarded", args, root, tmp, url, guarded["base"])
    finally:
        try:
            root.rmdir()
        except OSError:
            pass
        if args.keep:
            print(f"kept: {tmp} (the study, each node's log)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"unguarded: completed={unguarded['completed']} node_overcommit={unguarded['overcommit']} "
        f"oom_kills={unguarded['oom_kills']} running_left={unguarded['running_left']} states={unguarded['states']}; "
        f"guarded decisions {guarded['decisions']}; ratio "
        f"{guarded['completed'] / max(1, unguarded['completed']):.2f}"
    )
    print(
        f"RAY nodes={args.nodes} trials={guarded['trials']} completed_guarded={guarded['completed']} "
        f"completed_unguarded={unguarded['completed']} node_overcommit={guarded['overcommit']} "
        f"oom_kills={guarded['oom_kills']} killed_node_trials_failed_with_reason={guarded['killed_failed']} "
        f"running_left={guarded['running_left'] + unguarded['running_left']} lost={guarded['lost']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
