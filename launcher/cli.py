"""`symbiosis`: the command line. Starts processes and edits state; never imports torch itself.

    symbiosis serve [--model tiny-llama] [--data-dir ./data] [--port 8000]
    symbiosis tenants create NAME [--max-concurrent N] [--max-storage-mb MB] [--job-priority P]
        [--requests-per-minute N] [--tokens-per-minute N] [--data-dir ./data]
    symbiosis tenants revoke NAME [--key KEY] [--data-dir ./data]
    symbiosis tenants list [--data-dir ./data]
    symbiosis adapters register --tenant T --name N DIRECTORY [--data-dir ./data]
    symbiosis demo [--out examples] [--model tiny-llama]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from catalogue.builtin import BUILTINS
from gateway.sessions import new_link
from gateway.settings import GatewaySettings
from gateway.tenants import (
    RATES,
    TARGETS,
    TenantDirectory,
    create_tenant,
    entries,
    revoke_key,
    revoke_tenant,
)
from launcher import serve_flags
from launcher.arguments import (
    HIGHEST_PRIORITY,
    LOWEST_PRIORITY,
    positive,
    priority,
    target_ms,
    tenant_id,
)
from wire.stopping import StopSignal

DEV_TENANT = "dev"


def serve(args: argparse.Namespace) -> int:
    from launcher.claim import DataDirInUse
    from launcher.stack import PortInUse, Stack

    data_dir = Path(args.data_dir)
    pins = tuple(a for pin in args.pin or () for a in ("--pin", pin))
    env = serve_flags.environment(args)
    stack = Stack(data_dir, args.model, args.host, args.port, echo=True, env=env,
                  manager_args=pins)
    try:
        stack.claim()  # before anything is printed, written or started
        stack.bind()
    except DataDirInUse as exc:
        sys.stderr.write(f"error: {exc}.\n")
        return 1
    except PortInUse as exc:
        stack.stop()
        sys.stderr.write(f"error: {exc}. Is another server running? Choose another port with "
                         "--port or SYMBIOSIS_PORT.\n")
        return 1
    tenants = GatewaySettings(data_dir=data_dir).tenants_path
    key = None
    if not tenants.exists():
        key = create_tenant(tenants, DEV_TENANT, admin=True)
        key_file = data_dir / f"{DEV_TENANT}.key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
    link = None  # a one-time dashboard sign-in for the dev tenant (gateway.sessions)
    known = json.loads(tenants.read_text()).get("tenants", []) if tenants.exists() else []
    if any(t.get("id") == DEV_TENANT for t in known):
        link, env["SYMBIOSIS_DASHBOARD_LINK"] = new_link(DEV_TENANT)
    stop = StopSignal()
    try:
        stack.start()
    except RuntimeError as exc:
        sys.stderr.write(f"error: {exc}\n")
        stack.stop()
        return 1
    sys.stdout.write(banner(stack, args.model, key, data_dir, tenants, link))
    sys.stdout.flush()
    while not stop.wait(0.5):
        for line in stack.supervise():
            sys.stderr.write(f"[supervisor] {line}\n")
    stack.stop()
    return 0


def banner(stack, model: str, key: str | None, data_dir: Path, tenants: Path,
           link: str | None = None) -> str:
    rule = "=" * 78
    lines = [rule, f"Symbiosis is serving {model} at {stack.base_url}/v1"]
    if key:
        lines += [f"Tenant '{DEV_TENANT}' API key: {key}",
                  f"  (saved to {data_dir / (DEV_TENANT + '.key')}, readable by you only; it is "
                  "also an operator key for /metrics)"]
    else:
        lines.append(f"Tenants and their hashed keys: {tenants} (a first run saved the dev key "
                     f"in {data_dir / (DEV_TENANT + '.key')})")
    if model in BUILTINS:
        lines.append(f"Note: {model} is a built-in test model with random weights: its answers "
                     "are gibberish and run to max_tokens.")
    request = {"model": model, "prompt": "Hello", "max_tokens": 8}
    lines += [f"Try: curl {stack.base_url}/v1/completions -H 'Authorization: Bearer "
              f"{key or 'YOUR_KEY'}' -H 'Content-Type: application/json' -d "
              f"'{json.dumps(request)}'"]
    if link:
        lines.append(f"Dashboard: {stack.base_url}/dashboard#link={link} (signs you in as "
                     f"'{DEV_TENANT}', once; then {stack.base_url}/dashboard with a key)")
    else:
        lines.append(f"Dashboard: {stack.base_url}/dashboard (sign in with a key)")
    lines += ["Press Ctrl-C to stop.", rule]
    return "\n".join(lines) + "\n"


def tenants_create(args: argparse.Namespace) -> int:
    path = GatewaySettings(data_dir=Path(args.data_dir)).tenants_path
    limits = {"max_concurrent": args.max_concurrent} if args.max_concurrent else {}
    if args.max_storage_mb is not None:
        limits["max_storage_mb"] = args.max_storage_mb
    if args.fallback:
        limits["fallback"] = True
    if args.job_priority is not None:
        limits["job_priority"] = args.job_priority
    for name in (*RATES, *TARGETS):
        if (value := getattr(args, name)) is not None:
            limits[name] = value
    key = create_tenant(path, args.name, **limits)
    sys.stdout.write(f"tenant {args.name}: API key (shown once) {key}\n")
    return 0


def tenants_revoke(args: argparse.Namespace) -> int:
    path = GatewaySettings(data_dir=Path(args.data_dir)).tenants_path
    if args.key is not None:
        if not revoke_key(path, args.name, args.key):
            sys.stderr.write(f"error: tenant {args.name} has no such key in {path}\n")
            return 1
        sys.stdout.write(f"tenant {args.name}: that key revoked (it stops working within a "
                         "second; the tenant's other keys and limits stay)\n")
        return 0
    if not revoke_tenant(path, args.name):
        sys.stderr.write(f"error: no tenant {args.name} in {path}\n")
        return 1
    sys.stdout.write(f"tenant {args.name}: revoked (its keys stop working within a second)\n")
    from launcher.revoke import Unanswered, cancel_work

    try:
        cancelled = cancel_work(Path(args.data_dir), args.name)
    except Unanswered as exc:
        sys.stderr.write(f"error: its jobs and batches were not cancelled: {exc}\n")
        return 1
    if cancelled:
        sys.stdout.write(f"its unfinished jobs and running batches cancelled: "
                         f"{', '.join(cancelled)}\n")
    return 0


def tenants_list(args: argparse.Namespace) -> int:
    path = GatewaySettings(data_dir=Path(args.data_dir)).tenants_path
    listed = entries(path)
    if not listed:
        sys.stdout.write(f"no tenants in {path}\n")
    for entry in listed:
        keys = len(entry.get("key_sha256", []))
        rest = " ".join(f"{k}={v}" for k, v in entry.items() if k not in ("id", "key_sha256"))
        sys.stdout.write(f"{entry['id']}  {keys} key{'' if keys == 1 else 's'}"
                         f"{'  ' + rest if rest else ''}\n")
    return 0


def adapters_register(args: argparse.Namespace) -> int:
    from launcher.records import Refused, register

    settings = GatewaySettings(data_dir=Path(args.data_dir), model=args.model)
    try:
        version = register(settings.data_dir, settings.model, args.tenant, args.name,
                           Path(args.directory))
    except Refused as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"registered {version} for tenant {args.tenant}\n")
    directory = TenantDirectory.load(settings.tenants_path, settings.api_keys)
    if args.tenant not in directory.tenants:
        sys.stderr.write(f"note: no tenant {args.tenant} in {settings.tenants_path} or "
                         "SYMBIOSIS_API_KEYS, so no key reaches this model yet: symbiosis "
                         f"tenants create {args.tenant}\n")
    return 0


def demo(args: argparse.Namespace) -> int:
    """Starter files, made by a child process (this one never imports torch)."""
    return subprocess.call([sys.executable, "-m", "catalogue.starter", "--model", args.model,
                            "--out", args.out])


class CliSettings(BaseSettings):
    """The defaults every subcommand shares (SYMBIOSIS_DATA_DIR, SYMBIOSIS_MODEL)."""

    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_", extra="ignore", frozen=True)

    data_dir: str = "./data"
    model: str = "tiny-llama"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="symbiosis", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = root.add_subparsers(dest="command", required=True)
    settings = CliSettings()
    default_dir, default_model = settings.data_dir, settings.model

    p = sub.add_parser("serve", help="start executor, worker manager and gateway",
                       description="Every flag sets the SYMBIOSIS_* variable it names for the "
                       "services (README: Configuration); a variable already set is the default.")
    serve_flags.add_to(p)
    p.set_defaults(run=serve)

    tenants = sub.add_parser("tenants").add_subparsers(dest="action", required=True)
    p = tenants.add_parser("create", help="add a tenant (or a key and new limits to one) and "
                           "print a new API key; a serving gateway takes it within a second")
    p.add_argument("name", type=tenant_id)
    p.add_argument("--max-concurrent", type=positive, metavar="N")
    p.add_argument("--max-storage-mb", type=serve_flags.AMOUNT, metavar="MB",
                   help="what the tenant's files, adapters, stored responses and batches "
                   "may take (0: no quota)")
    p.add_argument("--job-priority", type=priority,
                   metavar=f"{LOWEST_PRIORITY}..{HIGHEST_PRIORITY}",
                   help="the tenant's tier: the priority of its jobs that do not set one")
    p.add_argument("--requests-per-minute", type=serve_flags.COUNT, metavar="N",
                   help="the requests the tenant's clients may send a minute (0: any)")
    p.add_argument("--tokens-per-minute", type=serve_flags.COUNT, metavar="N",
                   help="the prompt and generated tokens the tenant's requests may take a "
                   "minute (0: any)")
    p.add_argument("--fallback", action="store_true",
                   help="serve the base model when the tenant's adapter cannot be loaded")
    for lane, default in (("decode", 1), ("prefill", 50)):
        p.add_argument(f"--{lane}-target-ms", type=target_ms, metavar="MS",
                       help=f"how long the tenant's {lane} calls may wait in the executor before "
                       f"their batch runs (0: the executor's own, {default} ms by default)")
    for name, what in (("ttft", "time to a request's first token"),
                       ("inter-token", "time between tokens")):
        p.add_argument(f"--{name}-target-ms", type=target_ms, metavar="MS",
                       help=f"the {what} the tenant's clients should meet (counted per token on "
                       "/metrics; its calls' waits in the executor follow it where no "
                       "--decode/--prefill-target-ms is set; 0: none)")
    p.add_argument("--data-dir", default=default_dir)
    p.set_defaults(run=tenants_create)
    p = tenants.add_parser("revoke", help="remove a tenant and all its keys (its unfinished "
                           "jobs and running batches are cancelled), or with --key "
                           "one key (live: a serving gateway follows the tenants file)")
    p.add_argument("name", type=tenant_id)
    p.add_argument("--key", help="revoke only this key of the tenant")
    p.add_argument("--data-dir", default=default_dir)
    p.set_defaults(run=tenants_revoke)
    p = tenants.add_parser("list", help="the tenants in the tenants file, their number of "
                           "keys and their limits (never a key)")
    p.add_argument("--data-dir", default=default_dir)
    p.set_defaults(run=tenants_list)

    adapters = sub.add_parser("adapters").add_subparsers(dest="action", required=True)
    p = adapters.add_parser("register", help="register a PEFT adapter directory")
    p.add_argument("directory")
    p.add_argument("--tenant", required=True, type=tenant_id)
    p.add_argument("--name", required=True)
    p.add_argument("--model", default=default_model)
    p.add_argument("--data-dir", default=default_dir)
    p.set_defaults(run=adapters_register)

    p = sub.add_parser("demo", help="starter files: a LoRA adapter and a chat training file "
                       "for the model (README: the walk-through)")
    p.add_argument("--model", default=default_model)
    p.add_argument("--out", default="examples")
    p.set_defaults(run=demo)
    return root


def main(argv: list[str] | None = None) -> int:
    from state.storage import private_files

    private_files()
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
