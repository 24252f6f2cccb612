"""A real process for the ledger tests (run as a script): holds, races for or watches a ledger.

  python _ledger_racer.py hold URL HOST CAPACITY KEY RAM
      admit Request(ram=RAM) for KEY, print the entry as JSON, then sleep until killed
  python _ledger_racer.py race URL HOST CAPACITY SEED ROUNDS OUT
      print "ready", wait for a line on stdin, then ROUNDS times: admit a random request (try_admit
      first, to count waits), read in_use in a fresh transaction, hold a few ms, release; write a JSON log
  python _ledger_racer.py poll URL HOST CAPACITY OUT
      print "ready", then read in_use continuously until stdin closes; write every distinct sum seen
  python _ledger_racer.py stream URL HOST CAPACITY RAM OUT
      print "ready", wait for a line on stdin, then until stdin closes: ask for Request(ram=RAM) under a new
      key every few ms (try_admit, the same key until admitted), hold it 20 ms, release; write the times

CAPACITY is HostCapacity's fields as JSON. Times are time.monotonic() (system-wide on Linux).
"""

import dataclasses
import json
import random
import sys
import time

from optuna_memprune.ledger import HostCapacity, Ledger, Request


def _ledger(url, host, capacity):
    fields = json.loads(capacity)
    return Ledger(
        HostCapacity(ram=fields["ram"], gpus=tuple(fields["gpus"]), threads=fields["threads"]), url=url, host=host
    )


def hold(url, host, capacity, key, ram):
    entry = _ledger(url, host, capacity).admit(Request(ram=int(ram)), key, timeout=10)
    print(json.dumps(dataclasses.asdict(entry)), flush=True)
    time.sleep(3600)


def race(url, host, capacity, seed, rounds, out):
    ledger = _ledger(url, host, capacity)
    rng = random.Random(int(seed))
    print("ready", flush=True)
    sys.stdin.readline()
    log = {"rounds": [], "waits": 0, "timeouts": 0}
    for r in range(int(rounds)):
        request = Request(
            ram=rng.randint(100, 500), vram=rng.choice((0, rng.randint(100, 600))), threads=rng.randint(1, 4)
        )
        key = f"{seed}-{r}"
        entry = ledger.try_admit(request, key)
        if entry is None:
            log["waits"] += 1
            try:
                entry = ledger.admit(request, key, timeout=30, poll=0.003)  # 5 s timed out on a loaded 2-core host
            except TimeoutError:
                log["timeouts"] += 1
                continue
        admitted = time.monotonic()
        seen = ledger.in_use()
        time.sleep(rng.uniform(0.004, 0.015))  # long enough beside an admission (ms on PostgreSQL) to contend
        released = time.monotonic()
        ledger.release(entry)
        log["rounds"].append(
            {
                "admitted": admitted,
                "released": released,
                "ram": entry.ram,
                "threads": entry.threads,
                "vram": entry.vram,
                "gpu": entry.gpu,
                "seen": seen._asdict(),
            }
        )
    with open(out, "w") as f:
        json.dump(log, f)


def poll(url, host, capacity, out):
    import select

    ledger = _ledger(url, host, capacity)
    print("ready", flush=True)
    seen, reads = set(), 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        seen.add(tuple(ledger.in_use()))
        reads += 1
    with open(out, "w") as f:
        json.dump({"reads": reads, "seen": [[u[0], u[1], list(u[2])] for u in seen]}, f)


def stream(url, host, capacity, ram, out):
    import os
    import select

    ledger = _ledger(url, host, capacity)
    print("ready", flush=True)
    sys.stdin.readline()
    log, i = {"admitted": [], "tries": 0}, 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        key = f"stream-{os.getpid()}-{i}"
        entry = ledger.try_admit(Request(ram=int(ram)), key)
        log["tries"] += 1
        if entry is None:
            time.sleep(0.005)
            continue
        log["admitted"].append(time.monotonic())
        time.sleep(0.02)
        ledger.release(entry)
        i += 1
    with open(out, "w") as f:
        json.dump(log, f)


if __name__ == "__main__":
    {"hold": hold, "race": race, "poll": poll, "stream": stream}[sys.argv[1]](*sys.argv[2:])
