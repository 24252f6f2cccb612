"""A real process for the monitor tests (run as a script), and `Worker`, the tests' handle on one.

The script reads one command per line on stdin and answers one line on stdout. It imports only the
standard library, so it has exactly one thread until told otherwise.

  alloc NAME BYTES   keep a bytearray of BYTES bytes with every page written
  free NAME          drop it
  threads K          start K threads that sleep until the process exits
  spawn              start a child worker (from the main thread); "child CMD" then goes to it
  spawn_thread       the same, but forked from a non-main thread that stays alive
  orphan BYTES       start a child that starts a grandchild holding BYTES, then the child exits after
                     0.5 s; answers the grandchild's pid
                     (the grandchild is re-parented; it exits when this process is gone)
  pid                answer this process's pid
  exit               leave
"""

import os
import select
import subprocess
import sys
import threading
import time

HERE = os.path.abspath(__file__)
held = {}
child = None
stop = threading.Event()


def start_child():
    proc = subprocess.Popen([sys.executable, HERE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    for line in (f"alloc warmup {1 << 20}", "free warmup"):  # the interpreter is up, its command path ran once
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        proc.stdout.readline()
    return proc


def grandchild(nbytes, watch_pid):
    data = bytearray(b"\x01") * nbytes  # noqa: F841 - held until exit
    while True:
        try:
            os.kill(watch_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def main():
    global child
    if len(sys.argv) > 1 and sys.argv[1] == "grandchild":
        grandchild(int(sys.argv[2]), int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "middle":
        g = subprocess.Popen(
            [sys.executable, HERE, "grandchild", sys.argv[2], sys.argv[3]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(g.pid, flush=True)
        time.sleep(0.5)  # long enough for a monitor to see three generations
        return
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        op, args = cmd[0], cmd[1:]
        reply = "ok"
        if op == "alloc":
            held[args[0]] = bytearray(b"\x01") * int(args[1])
        elif op == "free":
            held.pop(args[0], None)
        elif op == "threads":
            for _ in range(int(args[0])):
                threading.Thread(target=stop.wait, daemon=True).start()
        elif op == "spawn":
            child = start_child()
            reply = f"ok {child.pid}"
        elif op == "spawn_thread":
            box = []
            ready = threading.Event()

            def fork_and_stay():
                box.append(start_child())
                ready.set()
                stop.wait()  # stay alive: the child stays on this thread's children list

            threading.Thread(target=fork_and_stay, daemon=True).start()
            ready.wait()
            child = box[0]
            reply = f"ok {child.pid}"
        elif op == "orphan":
            out = subprocess.run(
                [sys.executable, HERE, "middle", args[0], str(os.getpid())], capture_output=True, text=True, check=True
            ).stdout
            reply = f"ok {out.strip()}"
        elif op == "child":
            child.stdin.write(" ".join(args) + "\n")
            child.stdin.flush()
            reply = child.stdout.readline().strip()
        elif op == "pid":
            reply = f"ok {os.getpid()}"
        elif op == "exit":
            break
        print(reply, flush=True)
    if child is not None:
        child.stdin.close()
        child.wait()


class Worker:
    """Handle on a worker process started from a test; ``cmd`` sends one command and returns the answer."""

    def __init__(self):
        self.proc = start_child()
        self.pid = self.proc.pid

    def cmd(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], 30)[0]:  # one answer per command: nothing buffered
            self.kill()
            raise RuntimeError(f"worker did not answer {line!r} within 30 s")
        reply = self.proc.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise RuntimeError(f"worker answered {reply!r} to {line!r}")
        return reply[3:]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()

    def kill(self):
        self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    main()
