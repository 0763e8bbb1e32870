"""The ``lakebuffer`` command line: demo, sql, stats, snapshot, compact, restore, fsck, bench.

Every command prints one clear line and exits non-zero on error (``--debug`` shows the
traceback). Options also come from ``LAKEBUFFER_*`` environment variables (e.g.
``LAKEBUFFER_LAKE``, ``LAKEBUFFER_MEMORY_LIMIT_MB``) or a TOML file given with ``--config``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import LakeBufferError, LakeError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="A tiered, persistent replay buffer for RL rollouts.")
console = Console()
err_console = Console(stderr=True)
_state: dict[str, Any] = {"debug": False, "config": {}}


def _load_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    import tomllib

    with open(path, "rb") as f:
        doc = tomllib.load(f)
    return doc.get("lakebuffer", doc)


def _opt(name: str, value: Any, default: Any = None) -> Any:
    """Flag value, else the TOML config's, else the default (env vars are read by typer)."""
    if value is not None:
        return value
    return _state["config"].get(name, default)


def _storage_options(raw: str | None) -> dict | None:
    raw = _opt("storage_options", raw)
    if raw is None:
        return None
    return raw if isinstance(raw, dict) else json.loads(raw)


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs.", envvar="LAKEBUFFER_DEBUG"),
    config: Path | None = typer.Option(None, "--config", help="TOML file with default options.", envvar="LAKEBUFFER_CONFIG"),
) -> None:
    _state["debug"] = debug
    _state["config"] = _load_config(config)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=False,
    )


def _print_table(t: pa.Table, fmt: str = "table", out: Path | None = None, max_rows: int = 50) -> None:
    if fmt == "table":
        rt = Table(show_header=True, header_style="bold")
        for name in t.column_names:
            rt.add_column(name)
        for row in t.slice(0, max_rows).to_pylist():
            rt.add_row(*[_short(v) for v in row.values()])
        console.print(rt)
        if t.num_rows > max_rows:
            console.print(f"... {t.num_rows - max_rows} more rows ({t.num_rows} in all)")
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(_flat(t), sink)
        _emit(sink.getvalue().to_pybytes(), out)
    elif fmt == "json":
        _emit((json.dumps(t.to_pylist(), default=str) + "\n").encode(), out)
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        if out is None:
            raise typer.BadParameter("--format parquet needs --out FILE")
        pq.write_table(t, out)
    else:
        raise typer.BadParameter(f"unknown format {fmt!r}: use table, csv, json or parquet")


def _flat(t: pa.Table) -> pa.Table:
    """CSV cannot hold lists: render nested columns as JSON text."""
    cols = []
    for c in t.columns:
        cols.append(pa.array([json.dumps(v) for v in c.to_pylist()]) if pa.types.is_nested(c.type) else c)
    return pa.table(cols, names=t.column_names)


def _emit(data: bytes, out: Path | None) -> None:
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        out.write_bytes(data)


def _short(v: Any) -> str:
    if isinstance(v, list):
        head = ", ".join(str(x) for x in v[:4])
        return f"[{head}{', ...' if len(v) > 4 else ''}] ({len(v)})"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _open(path: str, lake: str | None = None, storage_options: dict | None = None, **kw: Any):
    """A buffer directory, or a lake URL (read-only) when ``path`` is not a buffer directory."""
    from .buffer import ReplayBuffer

    p = Path(path)
    if p.is_dir() and (p / "index").is_dir():
        kw.setdefault("memory_limit_mb", None)  # the run's own budget, not a default
        return ReplayBuffer.open(p, lake=lake, storage_options=storage_options, snapshot_interval_s=0, **kw)
    if "://" not in path and not p.exists():
        raise LakeError(f"{path} does not exist: it is neither a lakebuffer directory nor a lake (check the path)")
    return ReplayBuffer.open_lake(path, storage_options=storage_options)  # LakeError if the URL does not exist


def _run(fn: Callable[[], None]) -> None:
    """One clear line and exit 1 on error; a traceback only with --debug."""
    try:
        fn()
    except typer.Exit:
        raise
    except (LakeBufferError, OSError, ValueError, KeyError) as e:
        if _state["debug"]:
            raise
        err_console.print(f"[red]error:[/red] {type(e).__name__}: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


# commands ------------------------------------------------------------------------------------
@app.command()
def demo(
    path: Path = typer.Option(Path("runs/demo"), "--dir", help="Buffer directory (created).", envvar="LAKEBUFFER_DIR"),
    memory_limit_mb: float = typer.Option(64, help="Hot-tier budget.", envvar="LAKEBUFFER_MEMORY_LIMIT_MB"),
    total_mb: float = typer.Option(256, help="MB of synthetic rollouts to push (several times the budget)."),
    fresh: bool = typer.Option(True, help="Start from an empty directory."),
) -> None:
    """Generate synthetic GRPO rollouts, push several times the budget, sample, query, snapshot."""
    _run(lambda: _demo(path, memory_limit_mb, total_mb, fresh))


def _demo(path: Path, memory_limit_mb: float, total_mb: float, fresh: bool) -> None:
    import shutil

    from .bench.data import rollouts
    from .buffer import ReplayBuffer

    if fresh and path.exists():
        shutil.rmtree(path)
    batch_rows = 256
    per_batch = rollouts(0, batch_rows, run_id="demo").nbytes
    n_batches = max(1, int(total_mb * 2**20 / per_batch))
    t0 = time.perf_counter()
    pushed = 0
    with ReplayBuffer.open(path, memory_limit_mb=memory_limit_mb, snapshot_interval_s=0) as buf:
        with _progress() as prog:
            task = prog.add_task("push rollouts", total=n_batches)
            for i in range(n_batches):
                t = rollouts(i * batch_rows, batch_rows, seed=7, run_id="demo").drop_columns(["key", "run_id"])
                buf.push(t)
                pushed += t.nbytes
                prog.advance(task)
        buf.flush()
        dt = time.perf_counter() - t0
        console.print(f"pushed {pushed / 2**20:.0f} MB ({n_batches * batch_rows} rollouts) in {dt:.1f} s "
                      f"under a {memory_limit_mb:.0f} MB hot budget")
        top = int(buf.sql("SELECT max(policy_version) FROM rollouts").column(0)[0].as_py())
        where = f"reward > 0.5 AND policy_version >= {max(0, top - 2)}"
        t1 = time.perf_counter()
        s = buf.sample(8, where=where, columns=["key", "group_id", "policy_version", "reward", "response_ids"], seed=0)
        console.print(f"\nsample(8, where={where!r}) in {1000 * (time.perf_counter() - t1):.1f} ms:")
        _print_table(s)
        console.print("\nSELECT policy_version, count(*), avg(reward) FROM rollouts GROUP BY 1 ORDER BY 1 DESC LIMIT 5:")
        _print_table(buf.sql("SELECT policy_version, count(*) AS rollouts, round(avg(reward), 3) AS avg_reward "
                             "FROM rollouts GROUP BY 1 ORDER BY 1 DESC LIMIT 5"))
        with _progress() as prog:
            task = prog.add_task("snapshot to the lake", total=None)
            m = buf.snapshot(wait=True, progress=lambda done, total: prog.update(task, completed=done, total=total))
        if m:
            console.print(f"snapshot {m.snapshot_id} committed to {buf.lake_url} ({m.files} Parquet files)")
        _print_stats(buf.stats())


def _print_stats(st: dict[str, Any]) -> None:
    name = st.get("run_id") or st.get("url") or st.get("path") or ""
    rt = Table(title=f"lakebuffer {name}".rstrip(), show_header=True, header_style="bold")
    for c in ("tier", "rows", "bytes", "files", "detail"):
        rt.add_column(c)
    hot, warm, cold = st.get("hot", {}), st.get("warm", {}), st.get("cold", {})
    if hot:
        rt.add_row("hot", str(hot["rows"]), _mb(hot["bytes"]), str(hot.get("batches", "")),
                   f"limit {_mb(hot['limit_bytes'])}")
    if warm:
        rt.add_row("warm", str(warm["rows"]), _mb(warm["bytes"]), str(warm["fragments"]), "Arrow IPC fragments (mmapped)")
    if cold:
        age = cold.get("last_snapshot_age_s")
        detail = f"snapshot {cold.get('last_snapshot_id')}" + (f", {age:.0f} s ago" if age is not None else "")
        if isinstance(cold.get("last_snapshot_id"), dict):  # a lake: one id per run
            ids = cold["last_snapshot_id"]
            detail = f"{len(ids)} run(s), last snapshots " + ", ".join(f"{r}: {i}" for r, i in sorted(ids.items()))
        if cold.get("missing_rows"):  # another writer removed committed rows (engine/lakeaudit)
            detail += (f"; {cold['missing_rows']} committed rows removed by another writer: "
                       f"{cold.get('reuploaded_rows', 0)} uploaded again, {cold.get('lost_rows', 0)} lost")
        url = cold.get("url") or st.get("url") or "-"
        rt.add_row("cold", str(cold.get("rows", 0)), _mb(cold.get("bytes", 0)), str(cold.get("files", 0)),
                   f"{url} {detail}")
    console.print(rt)
    q = st.get("queues", {})
    if q:
        console.print(f"queues: p0={q.get('p0', 0)} p1={q.get('p1', 0)} running={q.get('running', 0)}"
                      f"  wal segments={st.get('wal', {}).get('segments', 0)}")


def _mb(n: int | float) -> str:
    return f"{(n or 0) / 2**20:.1f} MB"


@app.command()
def sql(
    source: str = typer.Argument(..., help="Buffer directory or lake URL."),
    query: str | None = typer.Argument(None, help="SQL over rollouts (and hot, warm, cold, meta)."),
    file: Path | None = typer.Option(None, "--file", "-f", help="Read the query from a .sql file."),
    name: str | None = typer.Option(None, "--query", "-q",
                                    help="Run an analysis query shipped with lakebuffer by name (e.g. policy_lag)."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the result to a file."),
    lake: str | None = typer.Option(None, envvar="LAKEBUFFER_LAKE"),
    storage_options: str | None = typer.Option(None, help="JSON fsspec options.", envvar="LAKEBUFFER_STORAGE_OPTIONS"),
) -> None:
    """Run DuckDB SQL over a buffer or a lake and print the result."""

    def go() -> None:
        from .resources import analysis_sql

        if sum(x is not None for x in (query, file, name)) != 1:
            raise ValueError("give exactly one of: a query, --file FILE, --query NAME")
        if name is not None:
            file_ = analysis_sql(name)
        else:
            file_ = file
        text = file_.read_text() if file_ is not None else query
        with _open(source, _opt("lake", lake), _storage_options(storage_options)) as buf:
            _print_table(buf.sql(text), fmt, out)

    _run(go)


@app.command()
def stats(
    path: str = typer.Argument(..., help="Buffer directory or lake URL."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    lake: str | None = typer.Option(None, envvar="LAKEBUFFER_LAKE"),
    storage_options: str | None = typer.Option(None, envvar="LAKEBUFFER_STORAGE_OPTIONS"),
) -> None:
    """Per-tier rows, bytes and files, snapshot age and queue depths."""

    def go() -> None:
        with _open(path, _opt("lake", lake), _storage_options(storage_options)) as buf:
            st = buf.stats()
        if as_json:
            console.print_json(json.dumps(st, default=str))
        else:
            _print_stats(st)

    _run(go)


@app.command()
def snapshot(
    path: str = typer.Argument(..., help="Buffer directory."),
    lake: str | None = typer.Option(None, envvar="LAKEBUFFER_LAKE", help="Lake URL (default <dir>/lake)."),
    storage_options: str | None = typer.Option(None, envvar="LAKEBUFFER_STORAGE_OPTIONS"),
) -> None:
    """Push everything new to the cold lake now."""

    def go() -> None:
        with _open(path, _opt("lake", lake), _storage_options(storage_options)) as buf:
            with _progress() as prog:
                task = prog.add_task("snapshot", total=None)
                info = buf.snapshot(wait=True, progress=lambda done, total: prog.update(task, completed=done, total=total))
            if info is None:
                console.print("snapshot committed: nothing new")
            else:
                console.print(f"snapshot {info.snapshot_id} committed to {info.lake}: run {info.run_id} now has "
                              f"{info.rows} rows in {info.files} files ({_mb(info.bytes)})")

    _run(go)


@app.command()
def compact(
    path: str = typer.Argument(..., help="Buffer directory or lake URL."),
    lake: str | None = typer.Option(None, envvar="LAKEBUFFER_LAKE"),
    storage_options: str | None = typer.Option(None, envvar="LAKEBUFFER_STORAGE_OPTIONS"),
    target_mb: float = typer.Option(256, help="Target file size."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Rewrite the lake's small files into large partitioned files."""

    def go() -> None:
        from .buffer import ReplayBuffer

        opts = _storage_options(storage_options)
        with _open(path, _opt("lake", lake), opts) as buf:
            with _progress() as prog:
                task = prog.add_task("compact", total=None)
                tick = lambda done, total: prog.update(task, completed=done, total=total)  # noqa: E731
                if isinstance(buf, ReplayBuffer):
                    res = buf.compact(target_file_bytes=int(target_mb * 2**20), progress=tick)
                else:  # a lake URL: its views are read-only, so compaction takes a writable handle of its own
                    from .lake import Lake

                    res = Lake(buf.url, opts).compact(buf.run_id, target_file_bytes=int(target_mb * 2**20),
                                                      progress=tick)
        if as_json:
            console.print_json(json.dumps(res, default=str))
        else:
            _print_compact(res)

    _run(go)


@app.command()
def restore(
    path: Path = typer.Argument(..., help="Empty or missing buffer directory to restore into."),
    lake: str = typer.Option(..., envvar="LAKEBUFFER_LAKE", help="Lake URL holding the run."),
    run_id: str = typer.Option(..., "--run-id", envvar="LAKEBUFFER_RUN_ID"),
    storage_options: str | None = typer.Option(None, envvar="LAKEBUFFER_STORAGE_OPTIONS"),
    memory_limit_mb: float = typer.Option(256, envvar="LAKEBUFFER_MEMORY_LIMIT_MB"),
) -> None:
    """Restore a run from the lake (as of its last committed snapshot) into a local directory."""

    def go() -> None:
        from .buffer import ReplayBuffer
        from .lake import Lake
        from .lake.location import require_existing

        source = Lake(lake, _storage_options(storage_options), read_only=True)
        try:
            require_existing(source)  # a typo in --lake: LakeError "does not exist", not "no snapshot"
        except LakeError as e:
            raise LakeError(f"{e} (asked to restore run {run_id!r})") from None
        if source.latest_manifest(run_id) is None:
            raise LakeBufferError(f"lake {lake} holds no committed snapshot of run {run_id!r}")
        with _progress() as prog:
            task = prog.add_task("restore", total=None)
            with ReplayBuffer.open(path, lake=lake, run_id=run_id, storage_options=_storage_options(storage_options),
                                   memory_limit_mb=memory_limit_mb, snapshot_interval_s=0,
                                   progress=lambda done, total: prog.update(task, completed=done, total=total)) as buf:
                n = len(buf)
        console.print(f"restored {n} rollouts of run {run_id!r} into {path}")

    _run(go)


@app.command()
def fsck(
    path: str = typer.Argument(..., help="Buffer directory, or a lake URL (every file of the lake is verified)."),
    repair: bool = typer.Option(False, help="Repair what can be repaired (broken batches from the lake)."),
    lake: str | None = typer.Option(None, envvar="LAKEBUFFER_LAKE",
                                    help="Also verify the run's files and rows in this lake (and rebuild from it)."),
    storage_options: str | None = typer.Option(None, envvar="LAKEBUFFER_STORAGE_OPTIONS"),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check index vs fragments vs WAL (and repair with --repair); with --lake also the run's lake
    files and rows. Given a lake URL, verify every file of the lake (nothing is changed or deleted)."""

    def go() -> None:
        from .fsck import check, check_lake, is_buffer_dir

        opts = _storage_options(storage_options)
        if not is_buffer_dir(Path(path)) and ("://" in path or Path(path).is_dir()):
            if repair:
                raise typer.BadParameter("--repair applies to a buffer directory; a lake is only checked (never changed)")
            report = check_lake(path, opts)
        else:
            report = {"path": path, **check(Path(path), repair=repair, lake=_opt("lake", lake), storage_options=opts)}
        if as_json:
            console.print_json(json.dumps(report, default=str))
        else:
            _print_fsck(report)
        if report["problems"] and not repair:
            raise typer.Exit(1)

    _run(go)


def _print_compact(res: dict[str, Any]) -> None:
    """Compaction totals (and one line per run) as text: before -> after."""

    def line(r: dict[str, Any]) -> str:
        return (f"files {r.get('files_before', '?')} -> {r.get('files_after', '?')}, rows {r.get('rows_before', '?')} -> "
                f"{r.get('rows_after', '?')}, {_mb(r.get('bytes_before'))} -> {_mb(r.get('bytes_after'))}, "
                f"{r.get('files_rewritten', 0)} rewritten, {r.get('files_written', 0)} written")

    console.print(f"compaction: {line(res)}, {res.get('gc_removed', 0)} old files removed", highlight=False)
    for run, r in sorted((res.get("runs") or {}).items()):
        console.print(f"  run {run}: {line(r)}", highlight=False)


def _print_fsck(report: dict[str, Any]) -> None:
    """The fsck report as lines a person reads: verdict, then each problem and repair."""
    verdict = "[green]ok[/green]" if report.get("ok") else "[red]PROBLEMS[/red]"
    console.print(f"fsck {report.get('path', '')}: {verdict}")
    for key, value in report.items():
        if key in ("ok", "path", "quarantine", "quarantine_help"):
            continue
        if isinstance(value, list):
            console.print(f"  {key}: {len(value)}")
            for item in value:
                console.print(f"    - {_short(item) if not isinstance(item, dict) else json.dumps(item, default=str)}",
                              highlight=False)
        else:
            console.print(f"  {key}: {_short(value)}", highlight=False)
    if "quarantine" in report:  # a buffer directory's (a lake has none)
        _print_quarantine(report["quarantine"] or [], report.get("quarantine_help"))


def _print_quarantine(entries: list[dict[str, Any]], help_text: str | None) -> None:
    """What fsck found in the quarantine folder: one line per file (size, why), then how to dispose."""
    total = sum(int(e.get("bytes") or 0) for e in entries)
    console.print(f"  quarantine: {len(entries)} file(s), {_mb(total)}", highlight=False)
    for e in entries:
        why = e.get("why") or "reason not recorded"
        when = f", {e['at']}" if e.get("at") else ""
        console.print(f"    - {e['path']} ({e.get('bytes', 0)} bytes{when}): {why}", highlight=False, soft_wrap=True)
    if help_text:
        console.print(f"  to dispose: {help_text}", highlight=False, soft_wrap=True)


@app.command()
def bench(
    quick: bool = typer.Option(False, help="Smoke run (< 60 s)."),
    out: Path | None = typer.Option(None, "--out", help="Write results JSON here."),
    scenario: list[str] | None = typer.Option(None, "--scenario", help="Run only these scenarios."),
    previous: Path | None = typer.Option(None, "--previous", help="Compare with these results (default: the --out file before this run)."),
) -> None:
    """Benchmarks side by side with the baselines and the machine's limits."""

    def go() -> None:
        from . import bench as benchmod

        with _progress() as prog:
            task = prog.add_task("bench", total=None)

            def progress(message: str, done: int, total: int) -> None:
                prog.update(task, description=f"bench: {message}"[:60], completed=done, total=total)

            res = benchmod.run(quick=quick, out=str(out) if out else None, scenarios=scenario or None,
                               progress=progress, previous=str(previous) if previous else None)
        sys.stdout.write(benchmod.summary(res) + "\n")  # markdown tables, unwrapped

    _run(go)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
