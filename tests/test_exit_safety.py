"""A process using the lake must never die at exit (issue 14; cause and fix in lakebuffer/lake/runtime.py).

Runs many short child processes (``tests/exit_child.py``) that write, commit and read a Delta table
on a local path and on the loopback moto S3 server, keep a daemon thread inside delta-rs reads at exit,
import the other native libraries lakebuffer loads, and exit by return, ``sys.exit`` and an uncaught
exception. Every child must exit with its expected code and no ``terminate called`` / fatal error.

Without the fix the same children abort (``--unsafe``: deltalake's default read filesystem and an
unguarded thread): run ``python -m tests.test_exit_safety --n 60 --unsafe`` to see the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.sizes import fast_and_full

REPO = Path(__file__).resolve().parents[1]
N_CHILDREN = 50
PARALLEL = 3
CHILD_TIMEOUT_S = 60
BUFFER_EVERY = 5  # every 5th child runs a ReplayBuffer on the lake instead of raw deltalake calls
EXITS = ["return", "sysexit", "exception"]
IMPORTS = ["", "lance,duckdb,rocksdict"]
BAD_MARKS = ("terminate called", "Fatal Python error", "FATAL:", "panicked", "Segmentation fault", "core dumped")


def delta_storage_options(endpoint: str) -> dict[str, str]:
    """deltalake (object_store) options for the loopback moto server."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def fsspec_options(so: dict[str, str]) -> dict:
    """The same S3 server as ``storage_options`` for ``ReplayBuffer.open`` (fsspec style); {} when local."""
    if not so:
        return {}
    return {"key": so["AWS_ACCESS_KEY_ID"], "secret": so["AWS_SECRET_ACCESS_KEY"], "endpoint_url": so["AWS_ENDPOINT_URL"],
            "client_kwargs": {"region_name": so["AWS_REGION"]}}


def run_children(targets: list[tuple[str, dict[str, str]]], n: int, *, unsafe: bool = False, parallel: int = PARALLEL,
                 thread: str = "daemon", buffer_every: int = BUFFER_EVERY, scratch: Path | None = None) -> list[dict]:
    """Run ``n`` children over the targets, exit modes and imports in turn; one result dict each.
    ``scratch``: the children's temporary directory (their buffer directories go there, not in /tmp)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(scratch)
    s3 = [so for _, so in targets if so]
    if s3:  # delta-rs reads AWS_* from the environment too
        env |= {k: v for k, v in s3[0].items()}

    def one(i: int) -> dict:
        uri, so = targets[i % len(targets)]
        how = EXITS[i % len(EXITS)]
        imports = IMPORTS[(i // len(EXITS)) % len(IMPORTS)]
        cmd = [sys.executable, "-m", "tests.exit_child", uri, json.dumps(so), "--exit", how, "--thread", thread, "--imports", imports]
        if unsafe:
            cmd.append("--unsafe")
        if buffer_every and i % buffer_every == buffer_every - 1:  # lakebuffer itself, exiting without close()
            cmd += ["--buffer", json.dumps(fsspec_options(so))]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=CHILD_TIMEOUT_S)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:  # a hang at exit is as bad as an abort (the child is killed)
            rc, out, err = "hung", str(e.stdout or ""), str(e.stderr or "")
        expected = 1 if how == "exception" else 0
        bad = rc != expected or any(m in err for m in BAD_MARKS) or '"rows"' not in out
        return {"i": i, "buffer": "--buffer" in cmd, "target": uri.split("://")[0] if "://" in uri else "local", "exit": how, "imports": imports,
                "rc": rc, "bad": bad, "stderr": err[-6000:]}

    with ThreadPoolExecutor(parallel) as ex:
        return list(ex.map(one, range(n)))


def summary(results: list[dict]) -> dict:
    return {"n": len(results), "bad": sum(r["bad"] for r in results),
            "rcs": dict(Counter(r["rc"] for r in results)),
            "terminate_called": sum("terminate called" in r["stderr"] for r in results),
            "bad_by_target": dict(Counter(r["target"] for r in results if r["bad"])),
            "bad_buffer_children": sum(r["bad"] and r["buffer"] for r in results)}


@pytest.mark.timeout(900)  # 50 children: ~45-60 s on 2 idle cores; several minutes when the machine is shared
@fast_and_full("n", 10, N_CHILDREN)  # 10 still cover both targets, every exit mode, both imports and 2 buffer children
def test_short_processes_exit_cleanly(tmp_path, s3_server, s3_bucket, n) -> None:
    so = delta_storage_options(s3_server.direct_endpoint_url)
    targets = [(str(tmp_path / "lake"), {}), (f"{s3_bucket}/lake", so)]
    results = run_children(targets, n, scratch=tmp_path / "scratch")
    bad = [r for r in results if r["bad"]]
    assert not bad, f"{summary(results)}; first failure: {bad[0]}"


if __name__ == "__main__":  # evidence runs: python -m tests.test_exit_safety --n 100 [--unsafe] [--thread none]
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--unsafe", action="store_true")
    ap.add_argument("--thread", default="daemon")
    ap.add_argument("--target", default="both", choices=["both", "local", "s3"])
    ap.add_argument("--parallel", type=int, default=PARALLEL)
    ap.add_argument("--buffer-every", type=int, default=BUFFER_EVERY, help="0: no ReplayBuffer children")
    args = ap.parse_args()
    from tests.s3server import FAKE_AWS_ENV, S3Server

    os.environ.update(FAKE_AWS_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(tmp)
        server.launch()
        try:
            bucket = server.make_bucket()
            tg = {"local": [(f"{tmp}/lake", {})], "s3": [(f"{bucket}/lake", delta_storage_options(server.direct_endpoint_url))]}
            targets = tg["local"] + tg["s3"] if args.target == "both" else tg[args.target]
            res = run_children(targets, args.n, unsafe=args.unsafe, parallel=args.parallel, thread=args.thread, buffer_every=args.buffer_every)
            print(json.dumps({"unsafe": args.unsafe, "thread": args.thread, "target": args.target, **summary(res)}))
            for r in [r for r in res if r["bad"]][:2]:
                print(r["rc"], r["stderr"][-300:])
        finally:
            server.kill()
