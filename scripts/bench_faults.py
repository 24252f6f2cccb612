"""Fault drill: many process-per-trial runners on one PostgreSQL study, with workers, trials and the database
killed under them.

The script starts its own PostgreSQL server (a throwaway cluster on a free port of 127.0.0.1, run as the
``postgres`` user when root) with two databases: the study (RDB storage with heartbeats) and the host
ledgers. It plays ``--hosts`` pseudo-hosts (each its own host id and capacity in the ledger database) with
``--workers-per-host`` worker processes each; every worker is its own OS process running
``omp.optimize(study, objective, guard=..., host=<its host's Ledger>, n_jobs=1)``. The ledgers live on the
same PostgreSQL server (``--ledger postgres``, the default) so that the restart hits admission too, and one
reader sees every host in one snapshot; ``--ledger sqlite`` gives each pseudo-host its own SQLite file instead
(what a real host uses by default).

The trials are short and real: they allocate and hold tens of MiB (numpy pages touched) for 0.2-2 s. Kinds,
drawn from the param ``u``: ``hold`` (as predicted), ``over`` (grows past the per-trial budget in 16 MiB steps,
to be stopped), ``burst`` (touches a block that takes it about 100 MiB over the budget at once and frees it:
faster than the 100 ms poll), ``helper`` (starts a child that ignores SIGTERM and would sleep for 300 s).
The host capacity (``--host-ram-mib``, 1 GiB) holds about 5 trials, so most workers wait for admission.

Faults, at random times of the run: SIGKILL of ``--kill-workers`` workers (chosen among those running a
trial; the first one, where it can, among those whose trial has a helper child: the orphan case), SIGKILL
of ``--kill-trials`` trial processes (children of a worker's fork server), one restart of PostgreSQL
(``pg_ctl -m fast stop``, 2 s down, started again on the same port); and before the workers
start, host 0's ledger is filled with the reservations of a runner that then dies (a process that admits
RUNNING trials of the study with the runner's own keys, 128 MiB each up to the host's capacity, and is
SIGKILLed): they must be reaped, and their trials failed with the reason, not block the host.

Measured independently of the runners: a reader thread reads the ledger tables every 100 ms (overcommit =
samples where a host's reservations sum above its capacity; the admission time of each trial = the
``created`` time of its reservation minus the trial's ``datetime_start``, i.e. ask, check and the wait for
the reservation), and the study is read directly at the end. Once the workers ended by their timeout, one
more runner per pseudo-host starts with ``n_trials=0`` (a user's next run: it reaps the host's ledger and
fails the trials of its dead runners, nothing else). Then: ``running_left`` (trials still RUNNING),
``orphans`` (processes left that carry the drill's token in their environment or a ``memprune-trial-`` name:
workers, fork servers, trial processes, their children), ``lost`` (trials not finished, or without a record
or its reason), ``study_aborted`` (a worker that exited with an exception, seen in its exit status or its
log), and ``burst_overshoot_max_pct``: the largest (peak RAM in the record / budget - 1) x 100 over the burst
trials (a burst trial that completed has its process's exact VmHWM; one stopped by the polling watchdog has
the reading that crossed, a lower bound; under a cgroup, the group's peak). Everything the script started is
killed and the server removed on exit, Ctrl-C and errors included.

The workers pass ``catch=`` the storage's connection errors: a trial whose own process meets the server
down (it suggests while the server restarts) fails with the reason and the study goes on, as a user riding
out database restarts would ask; errors of the runner itself are not caught and count in ``study_aborted``.

The ledger's own work is measured apart from the waiting: every worker writes the ledger's DEBUG line for each
``try_admit`` transaction (logger ``optuna_memprune.ledger.txn``: its duration, admitted, refused, or
refused-unlocked for a refusal seen on a read that took no lock, the CPU time of the thread that ran it, the key)
to a file of its own. ``admit_txn_p99_ms`` is the 99th percentile of those durations over every worker's
transactions (connection, host lock, reaping, the queue and the insert; retries while the server restarts
included, and a line above gives it without the transactions that overlapped the restart);
``admit_txn_cpu_p99_ms`` the 99th percentile of their CPU time in the worker (what a transaction costs its
process, apart from its waits for a CPU, the server and the host's lock). ``wait_max_s`` is
the longest any trial waited for its reservation: from its first try to the one that admitted it (for a trial
never admitted, to its last try: a lower bound). Trials wait in their host's queue, first come, first served
(see ``Ledger``), so a large trial is not passed by a stream of small ones.

``--enforce`` is passed to ``omp.optimize`` only when the installed version takes ``enforce=``; the line
before the last says which enforcement the records name. Last line::

    FAULTS workers=64 trials=<n> admit_p50_ms=<x> admit_p99_ms=<x> admit_txn_p99_ms=<x> admit_txn_cpu_p99_ms=<x> wait_max_s=<x> overcommit=<k> burst_overshoot_max_pct=<x> running_left=<r> orphans=<o> lost=<l> study_aborted=<0|1>

    python scripts/bench_faults.py                    # 4 hosts x 16 workers, 180 s
    python scripts/bench_faults.py --smoke            # 2 hosts x 4 workers, about 60 s, fewer faults
    python scripts/bench_faults.py --enforce polling  # side by side with --enforce cgroup
"""

from __future__ import annotations

import argparse
import glob
import inspect
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import warnings

import numpy as np
import optuna
import psutil
import sqlalchemy as sa

from _pg import PostgresCluster  # scripts/_pg.py: the PostgreSQL helper the tests share
from optuna_memprune.ledger import HostCapacity, Request

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage")  # the drill asks trials only to fill a ledger

MiB = 2**20
BUDGET_MIB = 256  # per trial
BASE_MIB = 100  # a trial's process forked from the runner's fork server, before the objective allocates
OVER_MIB = 420  # where an "over" trial would stop growing if nobody stopped it
BURST_MIB = BUDGET_MIB - BASE_MIB + 100  # touched at once: about 100 MiB over the budget
TOKEN = "MEMPRUNE_FAULT_DRILL"
STUDY = "faults"
HEARTBEAT_S, GRACE_S = 2, 30
ABORTED = "memprune-drill: optimize() raised"


# given to the guard: 64 workers starting at once would otherwise run their first trials unchecked
SPACE = {
    "u": optuna.distributions.FloatDistribution(0.0, 1.0),
    "mb": optuna.distributions.IntDistribution(16, 112, step=8),
    "hold_s": optuna.distributions.FloatDistribution(0.2, 2.0),
}


def kind_of(u: float) -> str:
    return "hold" if u < 0.55 else "over" if u < 0.7 else "burst" if u < 0.85 else "helper"


def objective(trial: optuna.Trial) -> float:
    """Allocate and hold ``mb`` MiB for ``hold_s``; the kind (from ``u``) adds an overrun, a burst or a helper."""
    trial.set_user_attr("drill_pid", os.getpid())
    u = trial.suggest_float("u", 0.0, 1.0)
    mb = trial.suggest_int("mb", 16, 112, step=8)
    hold = trial.suggest_float("hold_s", 0.2, 2.0)
    kind = kind_of(u)
    blocks = [np.ones(mb * MiB, dtype=np.uint8)]
    if kind == "over":
        while mb + 16 * len(blocks) < OVER_MIB:
            blocks.append(np.ones(16 * MiB, dtype=np.uint8))
            time.sleep(0.05)
    elif kind == "burst":
        burst = np.ones(BURST_MIB * MiB, dtype=np.uint8)  # every page touched at once
        del burst
    elif kind == "helper":  # ignores SIGTERM and outlives the trial unless its tree is stopped whole
        subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 300"])
    time.sleep(hold)
    return float(mb)


def footprint(params: dict) -> object:
    import optuna_memprune as omp

    return omp.Footprint.of(ram=(BASE_MIB + params["mb"]) * MiB, name="held blocks + process")


# -- a worker (one OS process, one runner) ---------------------------------------------------------------


def storage_of(url: str) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)


def worker(args: argparse.Namespace) -> int:
    """Run ``omp.optimize`` until ``args.go``'s end time; exit 3 with the traceback on any exception."""
    import logging

    import optuna_memprune as omp

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s %(message)s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.txn_dir:  # the ledger's line per try_admit transaction, to this worker's own file (see measure)
        txn = logging.getLogger("optuna_memprune.ledger.txn")
        handler = logging.FileHandler(os.path.join(args.txn_dir, f"txn-{os.getpid()}.log"))
        handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
        txn.addHandler(handler)
        txn.setLevel(logging.DEBUG)
        txn.propagate = False
    try:
        guard = omp.MemoryGuard(footprint, omp.Budget(ram=f"{BUDGET_MIB}MiB"), search_space=SPACE)
        study = optuna.load_study(
            study_name=STUDY,
            storage=storage_of(args.storage),
            sampler=guard.wrap_sampler(optuna.samplers.RandomSampler()),
            pruner=guard.wrap_pruner(),
        )
        ledger = omp.Ledger(HostCapacity(ram=args.host_ram_mib * MiB), url=args.ledger_url, host=args.host)
        kwargs = {}
        if args.enforce and "enforce" in inspect.signature(omp.optimize).parameters:
            kwargs["enforce"] = args.enforce
        end = None
        if args.go:
            open(os.path.join(os.path.dirname(args.go), f"ready-{os.getpid()}"), "w").close()
            for _ in range(3000):  # at most 600 s for the others to start
                if os.path.exists(args.go):
                    with open(args.go) as f:
                        end = float(f.read() or 0)
                    break
                time.sleep(0.2)
            else:
                return 4
        timeout = None if end is None else max(0.0, end - time.time())
        # storage errors inside a trial's process (the server restarting while it suggests) fail that trial
        # with the reason and let the study go on, as a user riding out database restarts would ask
        catch = (optuna.exceptions.StorageInternalError, sa.exc.OperationalError, sa.exc.InterfaceError)
        omp.optimize(
            study,
            objective,
            guard=guard,
            host=ledger,
            n_jobs=1,
            n_trials=args.n_trials,
            timeout=timeout,
            catch=catch,
            show_progress_bar=False,
            **kwargs,
        )
    except BaseException:  # noqa: BLE001 - the drill counts it
        traceback.print_exc()
        print(ABORTED, flush=True)  # the drill may SIGKILL this worker while it exits: the log still says it
        sys.stderr.flush()
        return 3
    return 0


# -- the PostgreSQL server -------------------------------------------------------------------------------


class Postgres(PostgresCluster):
    """The drill's cluster (``scripts/_pg.py``): 800 connections for 64 workers, its commands without the
    drill's token (the orphan count looks for it)."""

    def __init__(self, root: str, settings: str = "") -> None:
        super().__init__(
            root,
            max_connections=800,
            options=f"-c shared_buffers=64MB {settings}",
            env={k: v for k, v in os.environ.items() if k != TOKEN},
        )


# -- the independent reader ------------------------------------------------------------------------------


class Reader(threading.Thread):
    """Every 100 ms: each host's reserved RAM against its capacity, and when each trial's reservation
    appeared (its ``created``), read from the ledger tables directly; the load average every second."""

    def __init__(self, urls: dict[str, str], capacity: int) -> None:
        super().__init__(daemon=True)
        self.urls, self.capacity = urls, capacity
        self.engines = {u: sa.create_engine(u, pool_pre_ping=True) for u in set(urls.values())}
        self.samples = self.overcommit = self.gaps = 0
        self.peak = {h: 0 for h in urls}
        self.admitted: dict[int, float] = {}  # trial id -> created of its reservation (first seen)
        self.host_admits: dict[str, list[float]] = {h: [] for h in urls}
        self.loads: list[float] = []
        self.available = psutil.virtual_memory().available
        self.halt = threading.Event()

    def run(self) -> None:
        try:  # this thread only: its samples stay 100 ms apart however loaded the machine is
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -5)
        except OSError:
            pass
        q = sa.text("SELECT host, key, ram, created FROM memprune_ledger_entries")
        last_load = 0.0
        while not self.halt.wait(0.1):
            if time.monotonic() - last_load >= 1.0:
                last_load = time.monotonic()
                self.loads.append(os.getloadavg()[0])
                self.available = min(self.available, psutil.virtual_memory().available)
            sums = {h: 0 for h in self.urls}
            try:
                for url, engine in self.engines.items():
                    with engine.connect() as conn:
                        rows = conn.execute(q).all()
                    for host, key, ram, created in rows:
                        if self.urls.get(host) != url:
                            continue
                        sums[host] += ram
                        try:
                            k = json.loads(key)
                        except ValueError:
                            continue
                        launched = isinstance(k, dict) and k.get("phase") == "launched"
                        if launched and k.get("trial_id") not in self.admitted:
                            self.admitted[k["trial_id"]] = created
                            self.host_admits[host].append(created)
            except Exception:  # noqa: BLE001 - the server is restarting: a gap in the samples
                self.gaps += 1
                time.sleep(0.2)
                continue
            self.samples += 1
            for host, total in sums.items():
                self.peak[host] = max(self.peak[host], total)
                if total > self.capacity:
                    self.overcommit += 1

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        for engine in self.engines.values():
            engine.dispose()


# -- processes -------------------------------------------------------------------------------------------


def marked(pid: int, token: str) -> bool:
    """Whether ``pid`` is one of the drill's: the token in its environment, or a trial process's name."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().startswith("memprune-trial"):
                return True
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{TOKEN}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def drill_processes(token: str) -> list[int]:
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and marked(int(entry), token):
            try:
                if psutil.Process(int(entry)).status() != psutil.STATUS_ZOMBIE:
                    out.append(int(entry))
            except psutil.Error:
                pass
    return out


def kill_all(procs: list[subprocess.Popen], token: str) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for _ in range(3):
        for pid in drill_processes(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def children_map() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc (psutil's children() reads all of /proc per call,
    which took the drill 30 s per fault at a load of 40)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry))
    return out


def trial_processes(worker_pid: int, tree: dict[int, list[int]]) -> list[psutil.Process]:
    """A worker's trial processes: the children of its fork server, started at least 0.3 s ago."""
    out = []
    for server in tree.get(worker_pid, []):
        try:
            with open(f"/proc/{server}/cmdline", "rb") as f:
                if b"forkserver" not in f.read():
                    continue
            for pid in tree.get(server, []):
                p = psutil.Process(pid)
                if time.time() - p.create_time() > 0.3:
                    out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


# -- the drill -------------------------------------------------------------------------------------------


class Drill:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.token = f"{os.getpid()}-{time.time_ns()}"
        self.tmp = tempfile.mkdtemp(prefix="memprune-faults-")
        self.procs: list[subprocess.Popen] = []
        self.workers: list[tuple[str, subprocess.Popen]] = []
        self.pg = Postgres(self.tmp, self.args.pg_settings)
        self.notes: list[str] = []
        self.timeline: list[str] = []  # each fault: when it began (s into the run) and how long it took
        self.killed_workers: list[int] = []
        self.helpers_at_kill = 0  # children of the killed workers' trials (helpers) when they were killed
        self.killed_trials: list[tuple[int, float]] = []
        self.filler: dict = {}
        self.pg_down: tuple[float, float] | None = None  # time.time() when the restart began and ended

    def spawn(self, host: str, ledger_url: str, *, go: str | None, n_trials: int | None, log: str) -> subprocess.Popen:
        a = self.args
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--role",
            "worker",
            "--storage",
            self.study_url,
            "--ledger-url",
            ledger_url,
            "--host",
            host,
            "--host-ram-mib",
            str(a.host_ram_mib),
            "--txn-dir",
            self.tmp,
        ]
        cmd += ["--go", go] if go else []
        cmd += ["--n-trials", str(n_trials)] if n_trials is not None else []
        cmd += ["--enforce", a.enforce] if a.enforce else []
        env = dict(os.environ, **{TOKEN: self.token})
        with open(log, "ab") as out:
            p = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.procs.append(p)
        return p

    def run(self) -> str:
        a = self.args
        hosts = [f"drill-h{i}" for i in range(a.hosts)]
        self.pg.init()
        self.pg.start()
        self.study_url = self.pg.create_db("study")
        if a.ledger == "postgres":
            url = self.pg.create_db("ledger")
            self.ledger_urls = {h: url for h in hosts}
        else:
            self.ledger_urls = {h: f"sqlite:///{self.tmp}/ledger-{h}.sqlite" for h in hosts}
        optuna.create_study(study_name=STUDY, storage=storage_of(self.study_url), direction="maximize")
        import optuna_memprune as omp

        for h in hosts:  # the tables exist before the reader looks
            omp.Ledger(HostCapacity(ram=a.host_ram_mib * MiB), url=self.ledger_urls[h], host=h).close()
        go = os.path.join(self.tmp, "go")
        started = time.monotonic()
        for i in range(a.hosts * a.workers_per_host):
            host = hosts[i % a.hosts]
            self.workers.append(
                (
                    host,
                    self.spawn(
                        host,
                        self.ledger_urls[host],
                        go=go,
                        n_trials=None,
                        log=os.path.join(self.tmp, f"worker-{i}.log"),
                    ),
                )
            )
        n = len(self.workers)
        for _ in range(3000):
            ended = sum(p.poll() is not None for _, p in self.workers)
            if len(glob.glob(os.path.join(self.tmp, "ready-*"))) + ended >= n:
                break
            time.sleep(0.2)
        print(f"{n} workers ready in {time.monotonic() - started:.0f} s", flush=True)
        self.reader = Reader(self.ledger_urls, a.host_ram_mib * MiB)
        self.reader.start()
        self.fill_ledger(hosts)
        t0_wall = time.time()
        with open(go + ".tmp", "w") as f:
            f.write(str(t0_wall + a.duration))
        os.replace(go + ".tmp", go)
        t0 = time.monotonic()
        events = [(self.rng.uniform(0.15, 0.8) * a.duration, "kill_worker") for _ in range(a.kill_workers)]
        events += [(self.rng.uniform(0.15, 0.8) * a.duration, "kill_trial") for _ in range(a.kill_trials)]
        events += [(0.5 * a.duration, "restart_pg")]
        for at, what in sorted(events):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            began = time.monotonic()
            try:
                getattr(self, what)(hosts)
            except Exception as exc:  # noqa: BLE001 - the drill goes on; the line says what failed
                self.notes.append(f"{what} at {time.monotonic() - t0:.0f} s failed: {type(exc).__name__}: {exc}")
            self.timeline.append(f"{what} {began - t0:.0f}s+{time.monotonic() - began:.1f}")
        hung = 0
        deadline = t0 + a.duration + 180
        for _, p in self.workers:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung += 1
                p.kill()
                p.wait()
        ran_s = time.monotonic() - t0
        finals = [
            self.spawn(h, self.ledger_urls[h], go=None, n_trials=0, log=os.path.join(self.tmp, f"final-{h}.log"))
            for h in hosts
        ]
        for p in finals:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                hung += 1
                p.kill()
        self.reader.stop()
        time.sleep(1.0)
        orphans = drill_processes(self.token)
        return self.measure(hosts, ran_s, hung, orphans, finals)

    # -- faults ------------------------------------------------------------------------------------

    def kill_worker(self, hosts: list[str]) -> None:
        alive = [p for _, p in self.workers if p.poll() is None and p.pid not in self.killed_workers]
        if not alive:
            self.notes.append("kill_worker: no worker was left")
            return
        for _ in range(20):  # the first kill waits up to 2 s for a trial with a helper child: the orphan case
            tree = children_map()
            busy = [p for p in alive if trial_processes(p.pid, tree)]
            helped = [p for p in busy if any(tree.get(t.pid) for t in trial_processes(p.pid, tree))]
            if helped or self.killed_workers:
                break
            time.sleep(0.1)
        victim = self.rng.choice(helped or busy or alive)
        helpers = sum(len(tree.get(t.pid, [])) for t in trial_processes(victim.pid, tree))
        victim.send_signal(signal.SIGKILL)
        self.killed_workers.append(victim.pid)
        self.helpers_at_kill += helpers

    def kill_trial(self, hosts: list[str]) -> None:
        tree = children_map()
        trials = [t for _, p in self.workers if p.poll() is None for t in trial_processes(p.pid, tree)]
        if not trials:
            self.notes.append("kill_trial: no trial process was running")
            return
        self.rng.shuffle(trials)
        for victim in trials:
            try:
                victim.send_signal(signal.SIGKILL)
            except psutil.Error:  # ended meanwhile
                continue
            self.killed_trials.append((victim.pid, time.time()))
            return
        self.notes.append("kill_trial: every trial process ended before it could be killed")

    def restart_pg(self, hosts: list[str]) -> None:
        t, began = time.monotonic(), time.time()
        try:
            self.pg.stop(self.args.pg_stop)
            time.sleep(2.0)
            self.pg.start()
        finally:
            self.pg_down = (began, time.time())
        self.notes.append(
            f"PostgreSQL stopped ({self.args.pg_stop}) and started again: down {time.monotonic() - t:.1f} s"
        )

    def fill_ledger(self, hosts: list[str]) -> None:
        """Before the workers start: a runner admits RUNNING trials of the study on host 0, 128 MiB each,
        until the host is full, and dies (SIGKILL)."""
        import optuna_memprune as omp

        # the drill plays a runner: its entries carry the runner's own keys (storage, study, trial)
        from optuna_memprune.runner._owners import TrialKey
        from optuna_memprune.runner._storage import storage_id

        owner = subprocess.Popen(["sleep", "600"], env=dict(os.environ, **{TOKEN: self.token}))
        self.procs.append(owner)
        study = optuna.load_study(study_name=STUDY, storage=storage_of(self.study_url))
        ledger = omp.Ledger(
            HostCapacity(ram=self.args.host_ram_mib * MiB), url=self.ledger_urls[hosts[0]], host=hosts[0]
        )
        trials = []
        for _ in range(self.args.host_ram_mib // 128):
            trial = study.ask()
            key = TrialKey(storage_id(study), STUDY, trial._trial_id, trial.number, "admitted").dumps()
            assert ledger.try_admit(Request(ram=128 * MiB), key, owner_pid=owner.pid) is not None
            trials.append(trial.number)
        ledger.close()
        owner.kill()
        owner.wait()
        self.filler = {
            "host": hosts[0],
            "entries": len(trials),
            "mib": 128 * len(trials),
            "trials": trials,
            "died": time.time(),
        }

    # -- the figures ---------------------------------------------------------------------------------

    def measure(self, hosts: list[str], ran_s: float, hung: int, orphans: list[int], finals: list) -> str:
        from optuna_memprune.guard import read_record

        a = self.args
        storage = optuna.storages.RDBStorage(self.study_url)
        trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
        states: dict[str, int] = {}
        lost, running_left, enforcement, decisions = [], 0, {}, {}
        overshoot, kinds = [], {}
        admit = []
        filled = set(self.filler.get("trials", ()))
        for t in trials:
            states[t.state.name] = states.get(t.state.name, 0) + 1
            r = read_record(t.user_attrs)
            if not t.state.is_finished():
                running_left += 1
            if not t.state.is_finished() or r is None or not r.reason:
                lost.append(t)
            if r is not None:
                decisions[r.decision.value] = decisions.get(r.decision.value, 0) + 1
                how = t.user_attrs.get("memprune:enforcement", "polling (no memprune:enforcement in the record)")
                enforcement[how] = enforcement.get(how, 0) + 1
            kind = kind_of(t.params["u"]) if "u" in t.params else "unknown"
            kinds.setdefault(kind, {}).setdefault(t.state.name, 0)
            kinds[kind][t.state.name] += 1
            if kind == "burst" and r is not None and r.peak_ram:
                overshoot.append((r.peak_ram / (BUDGET_MIB * MiB) - 1) * 100)
            tid = t._trial_id
            if tid in self.reader.admitted and t.datetime_start is not None and t.number not in filled:
                admit.append((self.reader.admitted[tid] - t.datetime_start.timestamp()) * 1000)
        exits = [p.returncode for _, p in self.workers]
        logs = [os.path.join(self.tmp, f"worker-{i}.log") for i in range(len(self.workers))]
        logs += [os.path.join(self.tmp, f"final-{h}.log") for h in hosts]
        codes = [p.returncode for _, p in self.workers] + [p.returncode for p in finals]
        aborted = [
            i
            for i, (code, log) in enumerate(zip(codes, logs))
            if code not in (0, -signal.SIGKILL) or ABORTED in open(log, errors="replace").read()
        ]
        for i in aborted:
            with open(logs[i], errors="replace") as f:
                print(f"-- {os.path.basename(logs[i])} (exit {codes[i]}) ends:\n" + f.read()[-3000:], flush=True)
        for t in lost[:10]:
            r = read_record(t.user_attrs)
            print(f"lost: trial {t.number} {t.state.name} record={'none' if r is None else repr(r.reason)}", flush=True)
        signalled = [
            t
            for t in trials
            if (r := read_record(t.user_attrs)) is not None
            and "SIGKILL" in r.reason
            and "its runner (pid" not in r.reason
        ]
        print(
            f"trial processes SIGKILLed by the drill: {len(self.killed_trials)}; trials whose record names a "
            f"SIGKILL: {len(signalled)} ({_tally(t.state.name for t in signalled)})",
            flush=True,
        )
        why = _tally(
            re.sub(r"\d+(\.\d+)?", "N", read_record(t.user_attrs).reason)[:110]
            for t in trials
            if t.state.name == "FAIL" and read_record(t.user_attrs) is not None
        )
        print(f"FAIL reasons: {why}", flush=True)
        died = [t for t in trials if (r := read_record(t.user_attrs)) is not None and "its runner (pid" in r.reason]
        print(
            f"trials of dead runners failed with the reason: {len(died)}; workers killed: {len(self.killed_workers)} "
            f"(their trials had {self.helpers_at_kill} helper processes then)",
            flush=True,
        )
        if self.filler:

            def first(host: str) -> str:
                after = [c for c in self.reader.host_admits[host] if c > self.filler["died"]]
                return f"{(min(after) - self.filler['died']) * 1000:.0f} ms" if after else "never"

            print(
                f"dead runner on {self.filler['host']}: {self.filler['entries']} reservations "
                f"({self.filler['mib']} MiB, the whole host) of trials {self.filler['trials']}, then SIGKILL; "
                f"first admission on that host {first(hosts[0])} after its death (on the other hosts: "
                f"{', '.join(first(h) for h in hosts[1:]) or '-'})",
                flush=True,
            )
        for note in self.notes:
            print(note, flush=True)
        print("faults (start s + seconds taken): " + ", ".join(self.timeline), flush=True)
        pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
        spans, waits = read_txn_logs(self.tmp)
        txns = [ms for _, ms, _ in spans]
        cpus = [own for _, _, own in spans if own == own]  # NaN: a version that logs no CPU figure
        down = self.pg_down or (0.0, 0.0)  # a transaction that overlapped the restart retried across it
        calm = [ms for end, ms, _ in spans if end <= down[0] or end - ms / 1000 >= down[1]]
        print(
            f"ledger transactions: {len(txns)} try_admit, p50 {pct(txns, 50):.1f} ms, p99 {pct(txns, 99):.1f} ms, "
            f"max {max(txns, default=float('nan')):.0f} ms ({len(calm)} that did not overlap the server's restart: "
            f"p99 {pct(calm, 99):.1f} ms); the worker thread's CPU in them: p50 {pct(cpus, 50):.2f} ms, "
            f"p99 {pct(cpus, 99):.2f} ms; trials' waits for a reservation over {len(waits)} trials: "
            f"p50 {pct(waits, 50):.2f} s, p99 {pct(waits, 99):.2f} s",
            flush=True,
        )
        print(f"states {states}; decisions {decisions}; by kind {kinds}", flush=True)
        print(
            f"reader: {self.reader.samples} samples, {self.reader.gaps} gaps (server down), peak reserved per "
            f"host (MiB) {[self.reader.peak[h] // MiB for h in hosts]} of {a.host_ram_mib}; admission measured "
            f"on {len(admit)} trials; bursts {len(overshoot)}; worker exit codes "
            f"{sorted(set(exits))}; hung {hung}",
            flush=True,
        )
        if orphans:
            print("orphans: " + "; ".join(f"{pid} {_cmd(pid)}" for pid in orphans[:10]), flush=True)
        loads = self.reader.loads or [os.getloadavg()[0]]
        how = ", ".join(f"{k}: {v} trials" for k, v in sorted(enforcement.items(), key=lambda kv: -kv[1]))
        import optuna_memprune as omp

        takes = "enforce" in inspect.signature(omp.optimize).parameters
        passed = f"enforce={a.enforce or '(default)'}" if takes else "this optimize has no enforce= keyword"
        n = len(self.workers)
        print(
            f"LOAD load_avg_1m mean={np.mean(loads):.1f} max={max(loads):.1f} on {os.cpu_count()} CPUs, "
            f"workers={n} ({a.hosts} hosts x {a.workers_per_host}), duration={a.duration:.0f} s "
            f"(ran {ran_s:.0f} s), least memory available {self.reader.available / 2**30:.1f} GiB, "
            f"ledger={a.ledger}; {passed}; enforcement in the records: {how or 'none'}",
            flush=True,
        )
        return (
            f"FAULTS workers={n} trials={len(trials)} admit_p50_ms={pct(admit, 50):.0f} "
            f"admit_p99_ms={pct(admit, 99):.0f} admit_txn_p99_ms={pct(txns, 99):.1f} "
            f"admit_txn_cpu_p99_ms={pct(cpus, 99):.2f} "
            f"wait_max_s={max(waits, default=float('nan')):.1f} overcommit={self.reader.overcommit} "
            f"burst_overshoot_max_pct={max(overshoot) if overshoot else float('nan'):.1f} "
            f"running_left={running_left} orphans={len(orphans)} lost={len(lost)} "
            f"study_aborted={int(bool(aborted))}"
        )

    def close(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if getattr(self, "reader", None) is not None:
            self.reader.halt.set()
        kill_all(self.procs, self.token)
        if self.pg.started:
            self.pg.stop("immediate")
        if self.args.keep:
            print(f"kept {self.tmp}", flush=True)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def read_txn_logs(directory: str) -> tuple[list[tuple[float, float, float]], list[float]]:
    """The workers' ``try_admit`` lines (``<time> try_admit <ms> ms <admitted|refused|refused-unlocked> cpu=<ms>
    conflicts=<n> key=<key>``; versions before the CPU figure have no ``cpu=``, before the read-then-commit
    admission no ``conflicts=``): every transaction's (end time, milliseconds, CPU
    milliseconds of the worker's thread, NaN when not given), and per trial's key (per worker; not the empty
    reservation that names a trial while it is checked, phase ``asked``) the seconds from its first try to its
    admission, or to its last try when never admitted. A line cut short by a SIGKILL is skipped."""
    took: list[tuple[float, float, float]] = []
    waits: list[float] = []
    for path in glob.glob(os.path.join(directory, "txn-*.log")):
        tries: dict[str, list[float]] = {}  # key -> [first try, last try, admitted (0: never)]
        with open(path, errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split(" ", 5)
                if len(parts) < 6 or parts[1] != "try_admit":
                    continue
                cpu, key = "nan", parts[5]
                while not key.startswith("key=") and "=" in key.partition(" ")[0]:  # cpu=, conflicts=
                    field, _, key = key.partition(" ")
                    if field.startswith("cpu="):
                        cpu = field[4:]
                if not key.startswith("key="):
                    continue
                try:
                    at, ms, own = float(parts[0]), float(parts[2]), float(cpu)
                except ValueError:
                    continue
                took.append((at, ms, own))
                if '"phase": "asked"' in key:
                    continue
                seen = tries.setdefault(key, [at, at, 0.0])
                seen[1] = at
                if parts[4] == "admitted" and not seen[2]:
                    seen[2] = at
        waits += [(admitted or last) - first for first, last, admitted in tries.values()]
    return took, waits


def _tally(items: object) -> dict:
    out: dict = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _cmd(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--workers-per-host", type=int, default=16)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds in which trials start")
    parser.add_argument("--smoke", action="store_true", help="2 hosts x 4 workers, 40 s, fewer faults")
    parser.add_argument("--enforce", default=None, help="passed to omp.optimize(enforce=...) where it exists")
    parser.add_argument("--kill-workers", type=int, default=10)
    parser.add_argument("--kill-trials", type=int, default=5)
    parser.add_argument("--host-ram-mib", type=int, default=1024, help="each pseudo-host's capacity")
    parser.add_argument("--ledger", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--pg-stop", choices=["fast", "immediate"], default="fast")
    parser.add_argument(
        "--pg-settings",
        default="",
        help="more server settings, such as '-c log_min_duration_statement=25 -c log_lock_waits=on "
        "-c deadlock_timeout=5ms' (the server's log is <tmp>/log; with --keep)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    parser.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)
    for hidden in ("--storage", "--ledger-url", "--host", "--go", "--txn-dir"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--n-trials", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: never outlive the drill
        return worker(args)
    if args.smoke:
        args.hosts, args.workers_per_host, args.duration = 2, 4, 40.0
        args.kill_workers, args.kill_trials, args.host_ram_mib = 2, 2, 512
    for name in ("hosts", "workers_per_host", "host_ram_mib"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.host_ram_mib < BUDGET_MIB:
        parser.error(f"--host-ram-mib must hold one trial's budget ({BUDGET_MIB} MiB)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    drill = Drill(args)

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background of a shell
    try:
        line = drill.run()
    finally:
        drill.close()
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
