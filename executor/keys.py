"""`python -m executor.keys`: a CurveZMQ key pair for the executor's tcp:// endpoint.

Give the secret to the executor (SYMBIOSIS_EXECUTOR_CURVE_SECRET) and the public key to its
clients (SYMBIOSIS_EXECUTOR_CURVE_PUBLIC): traffic is then encrypted and only clients that know
the server's public key can talk to it.
"""

from __future__ import annotations

import sys

import zmq


def main() -> int:
    public, secret = zmq.curve_keypair()
    sys.stdout.write(f"SYMBIOSIS_EXECUTOR_CURVE_PUBLIC={public.decode()}\n"
                     f"SYMBIOSIS_EXECUTOR_CURVE_SECRET={secret.decode()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
