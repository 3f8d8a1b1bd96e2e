"""`python -m bench.forked ARGS_JSON`: preload torch, transformers and peft once, then fork one
child per argument list, each running `bench.workload.main(args)` (the way the worker manager's
spawner starts workers and trainers: shared import pages, so PSS counts them once)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import peft  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401

import workers.build  # noqa: F401
from bench import workload


def main() -> int:
    argvs = json.loads(open(sys.argv[1]).read())  # noqa: SIM115
    children = []
    for argv in argvs:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = workload.main(argv)
            finally:
                os._exit(code)
        children.append(pid)
    failed = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
