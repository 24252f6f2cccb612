"""``memprune run``'s startup hook: Python imports this module at startup from the directory ``memprune run``
puts first on ``PYTHONPATH``.

It installs the guard only where ``MEMPRUNE_RUN`` names this process (``optuna_memprune.run``
says why), then hands over to the next ``sitecustomize`` on the path, if any, as if this one were not there.
Imported under any other name (a test collecting the package), it does nothing.
"""

import os
import sys
from types import ModuleType

if __name__ == "sitecustomize":
    _here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("MEMPRUNE_RUN"):
        _hook: "ModuleType | None"  # a string: the program's interpreter may be older than 3.10
        try:
            from optuna_memprune.run import _hook
        except ImportError:  # this interpreter does not have the package: use the CLI's copy
            import json

            try:
                sys.path.append(json.loads(os.environ["MEMPRUNE_RUN"])["package"])
                from optuna_memprune.run import _hook
            except Exception as exc:  # noqa: BLE001 - the program runs, unguarded, and says so
                _hook = None
                print(f"memprune: the guard cannot be loaded in this interpreter ({type(exc).__name__}: "
                      f"{exc}); the program runs unguarded", file=sys.stderr)
        if _hook is not None:
            _hook.install()
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _me = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401 - the next one on the path, as Python would have imported it
    except BaseException as exc:
        sys.modules["sitecustomize"] = _me  # importlib expects a module under this name once this one ran
        if not (isinstance(exc, ImportError) and exc.name == "sitecustomize"):
            raise
