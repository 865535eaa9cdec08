"""``ampd serve`` (one coordinator replica) and ``ampd up`` (a local cluster:
Redis, engines, coordinators) from a configuration file (docs/SERVING.md)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading

import uvicorn

from ampd.cli.options import add_run_options, config_from_args, positive_float, positive_int
from ampd.config import RunConfig, override
from ampd.core.errors import InputError
from ampd.serve.build import build_app, make_store
from ampd.serve.state.store import StoreUnavailable
from ampd.cluster.up import LocalCluster


def _serve_options(p: argparse.ArgumentParser) -> None:
    add_run_options(p)
    p.add_argument("--system", help="serving system (default: the configuration's, ampd)")
    p.add_argument("--host", help="listen address (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=positive_int, help="coordinator port (default 8000)")
    p.add_argument("--redis-url", help="shared state, e.g. redis://10.0.0.1:6379/0 (default: in-memory)")
    p.add_argument("--time-scale", type=positive_float, help="wall seconds per model second (mock engines only)")


def _serve_config(args: argparse.Namespace) -> RunConfig:
    config, _ = config_from_args(args)
    serve = {k: v for k, v in (("host", args.host), ("port", args.port), ("redis_url", args.redis_url),
                               ("time_scale", args.time_scale)) if v is not None}
    changes = {"system": args.system} if args.system else {}
    return override(config, serve=serve, **changes)


def _check_store(config: RunConfig) -> None:
    """Fail at once, with the address, when the shared store does not answer."""
    async def ping():
        store = make_store(config)
        try:
            await store.ping()
        finally:
            await store.close()
    try:
        asyncio.run(ping())
    except StoreUnavailable as err:
        raise InputError(f"cannot reach the shared store: {err}") from None


def cmd_serve(args: argparse.Namespace) -> None:
    config = _serve_config(args)
    _check_store(config)
    app = build_app(config, args.replica_id or "")
    coordinator = app.state.coordinator
    print(f"ampd coordinator {coordinator.options.replica_id} ({config.system}) on "
          f"http://{config.serve.host}:{config.serve.port}, {len(coordinator.workers)} engines, "
          f"store {config.serve.redis_url or 'in-memory'}", flush=True)
    uvicorn.run(app, host=config.serve.host, port=config.serve.port, log_level="warning", access_log=False)


def cmd_up(args: argparse.Namespace) -> None:
    config = _serve_config(args)
    cluster = LocalCluster(config, args.log_dir, args.coordinators)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with cluster:
        c = cluster.config
        print(f"cluster up: {c.cluster.deployment} ({c.serve.engine} engines), system {c.system}, store "
              f"{c.serve.redis_url or 'in-memory'}; coordinators: {', '.join(cluster.urls)}; logs in "
              f"{args.log_dir}/. Ctrl-C stops everything.", flush=True)
        while not stop.wait(1.0):
            for child in cluster.exited():
                print(f"ampd up: {child.name} exited (code {child.process.returncode}); see {child.log_path}",
                      file=sys.stderr, flush=True)
    print("cluster stopped", flush=True)


def register(sub) -> None:
    serve = sub.add_parser("serve", help="run one coordinator replica (OpenAI-compatible HTTP)")
    _serve_options(serve)
    serve.add_argument("--replica-id", help="unique per replica sharing a Redis (default: host:pid)")
    serve.set_defaults(func=cmd_serve)
    up = sub.add_parser("up", help="start Redis, engines and coordinators of a config on this machine")
    _serve_options(up)
    up.add_argument("--coordinators", type=positive_int, default=1, help="coordinator replicas (default 1)")
    up.add_argument("--log-dir", default="out/up", help="logs and the resolved configuration (default out/up)")
    up.set_defaults(func=cmd_up)
