"""The host probe: how fast this host's CPU multiplies and copies, with the threads a rank uses.

:class:`HostProbe` times fp32 matmuls with the thread count the training ranks use
(:func:`rank_threads`: ``OMP_NUM_THREADS``, else torchrun's 1 per rank when a node runs several
ranks, else torch's default) and a memory copy on one thread (a rank's elementwise work on small
tensors runs on one thread whatever its thread count), and keeps the best of several short repeats,
so background load on a shared host reads as little as it can. A probe is still a measurement of a
moment: the launcher records the one it took in ``run.json["host_probe"]``, a calibration keeps the
probes it was fitted with, and predictions and summaries reuse those rather than probe again
(``HostProbe.source`` says which one a number came from). :func:`probe_host` keeps this host's
probe on disk so later processes reuse it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from powertrain.store.leftovers import remove_stale

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HostProbe:
    """What one host CPU did in a short probe, with the thread count it was pinned to.

    ``matmul_flops``: fp32 matmul FLOP/s with ``threads`` threads (best of the repeats);
    ``copy_bytes_per_s``: bytes read + written per second by a large tensor copy on one thread;
    ``cores``: the cores this process could run on; ``method``: how it was measured;
    ``source``: where this value came from now (a fresh probe, a run's ``run.json``, a profile).
    """

    matmul_flops: float
    copy_bytes_per_s: float
    threads: int
    cores: int
    method: str
    source: str = "fresh probe of this host"

    def to_dict(self) -> dict[str, Any]:
        """The record written to ``run.json["host_probe"]`` and to calibration profiles."""
        return {"matmul_flops": self.matmul_flops, "copy_bytes_per_s": self.copy_bytes_per_s,
                "threads": self.threads, "cores": self.cores, "method": self.method}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str) -> HostProbe:
        """A recorded probe; raises ``ValueError`` naming the missing key."""
        try:
            return cls(matmul_flops=float(raw["matmul_flops"]), copy_bytes_per_s=float(raw["copy_bytes_per_s"]),
                       threads=int(raw["threads"]), cores=int(raw["cores"]), method=str(raw.get("method", "")),
                       source=source)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: host probe record is incomplete ({exc}); it needs matmul_flops, "
                             "copy_bytes_per_s, threads and cores") from None



PROBE_MATMUL_N = 1024  # fp32 n×n matmul: ~2 GFLOP, tens of ms on one core
PROBE_COPY_ELEMS = 8 * 1024 * 1024  # 32 MiB of fp32: larger than any last-level cache it will meet
PROBE_REPEATS = 7


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity: a container's share, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS): all cores
        return os.cpu_count() or 1


def rank_threads(ranks_per_node: int, environ: Mapping[str, str] | None = None) -> int:
    """Intra-op threads each training rank uses, as torchrun sets them up.

    ``OMP_NUM_THREADS`` when set (torch reads it at start); otherwise torchrun sets it to 1 for
    every rank when a node runs more than one rank, and a lone rank gets torch's default (the
    host's physical cores as torch counts them).
    """
    env = os.environ if environ is None else environ
    raw = env.get("OMP_NUM_THREADS")
    if raw is not None and raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    if raw is None and ranks_per_node > 1:
        return 1  # torchrun's default for several ranks per node
    try:
        import torch
    except ImportError:
        return host_cores()
    return int(torch.get_num_threads())


def _best_time(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    fn()  # warm: thread pool, caches, page faults
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def _clock(threads: int) -> Callable[[], float]:
    """One thread: this thread's CPU time, which time spent descheduled by other work on a busy host
    does not inflate (a wall-clock probe read 3-4x low beside a CPU hog); several: wall time."""
    return time.thread_time if threads == 1 else time.perf_counter


def measure_host_probe(threads: int, repeats: int = PROBE_REPEATS) -> HostProbe:
    """Probe this host's CPU with ``threads`` threads now: best of ``repeats`` fp32 matmuls and copies.

    Uses torch (what the training ranks run) with its intra-op threads pinned to ``threads`` for
    the matmuls and to one for the copy, restored after. Without torch it falls back to numpy,
    whose BLAS thread count it cannot pin; ``method`` says so. About 0.1–0.5 s.
    """
    if threads < 1:
        raise ValueError(f"host probe needs at least one thread, got {threads}")
    n = PROBE_MATMUL_N
    try:
        import torch
    except ImportError:
        mm, cp, nbytes, method = _time_with_numpy(n, repeats)
    else:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            g = torch.Generator().manual_seed(0)
            a = torch.randn(n, n, generator=g)
            b = torch.randn(n, n, generator=g)
            c = torch.empty(n, n)
            mm = _best_time(lambda: torch.mm(a, b, out=c), repeats, _clock(threads))
            torch.set_num_threads(1)
            src = torch.ones(PROBE_COPY_ELEMS)
            dst = torch.empty_like(src)
            cp = _best_time(lambda: dst.copy_(src), repeats, _clock(1))
            nbytes = src.numel() * src.element_size()
        finally:
            torch.set_num_threads(before)
        method = (f"torch {torch.__version__} fp32 {n}x{n} matmul on {threads} thread(s) and "
                  f"{nbytes >> 20} MiB copy on 1 thread, best of {repeats}"
                  f" ({'thread CPU time' if threads == 1 else 'wall time'} for the matmul)")
    return HostProbe(matmul_flops=2.0 * n**3 / mm, copy_bytes_per_s=2.0 * nbytes / cp, threads=threads,
                     cores=host_cores(), method=method)


def _time_with_numpy(n: int, repeats: int) -> tuple[float, float, int, str]:
    """(matmul s, copy s, bytes copied, method) with numpy, for hosts without torch."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    mm = _best_time(lambda: a @ a, repeats)
    src = np.ones(PROBE_COPY_ELEMS, dtype=np.float32)
    dst = np.empty_like(src)
    cp = _best_time(lambda: np.copyto(dst, src), repeats)
    nbytes = src.nbytes
    method = (f"numpy fp32 {n}x{n} matmul (BLAS threads not pinned: torch is not installed) and "
              f"{nbytes >> 20} MiB copy (one thread), best of {repeats}")
    return mm, cp, nbytes, method


def probe_cache_dir() -> Path:
    """Where host probes are kept between processes: ``$POWERTRAIN_CACHE_DIR``, else the user's cache."""
    if env := os.environ.get("POWERTRAIN_CACHE_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "powertrain"


# How a probe is measured, as kept probes are matched: change it whenever measure_host_probe measures
# differently, so probes kept by an earlier version are measured again (one kept from before the one-thread
# matmul was timed in thread CPU time read about half of today's figure on a busy host, and was reused).
PROBE_METHOD_VERSION = "2: fp32 matmul timed in thread CPU time on one thread, wall time on several"


def _probe_identity(threads: int) -> dict[str, Any]:
    """What a kept probe must match to be reused: same host, CPU, core count, threads, torch and method."""
    import platform
    import socket

    try:  # the installed version, read without importing torch (seconds of CPU in a short CLI call)
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"host": socket.gethostname(), "machine": platform.machine(), "processor": platform.processor(),
            "cores": host_cores(), "threads": threads, "torch": torch_version, "method": PROBE_METHOD_VERSION}


@cache
def probe_host(threads: int) -> HostProbe:
    """This host's probe for ``threads`` threads: measured once, then kept on disk and reused.

    A probe is a measurement of a moment, and a busy host reads differently from one second to the
    next; re-probing on every call made identical ``predict`` calls disagree. So the first probe of
    a host (for a thread count, CPU and torch version) is kept in :func:`probe_cache_dir` and every
    later process uses it; its ``source`` names the file and when it was measured. Delete the file
    to probe again. Runs record their own probe (``run.json``) and profiles keep theirs; this one
    serves only where neither exists.
    """
    ident = _probe_identity(threads)
    path = probe_cache_dir() / f"host-probe-{ident['host']}-{threads}t.json"
    kept = _read_kept_probe(path, ident)
    if kept is not None:
        return kept
    probe = measure_host_probe(threads)
    record = {**probe.to_dict(), "identity": ident, "t_ns": time.time_ns()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path.parent, [f".{path.name}.{{pid}}.tmp"])  # left by a probe that was killed here
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        try:
            os.replace(tmp, path) if path.exists() else os.link(tmp, path)  # first writer wins a race
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("host probe not kept (%s): later processes will probe again", exc)
        return HostProbe(**{**probe.to_dict(), "source": "probe of this host, measured now (could not be kept)"})
    return _read_kept_probe(path, ident) or probe


def _read_kept_probe(path: Path, ident: dict[str, Any]) -> HostProbe | None:
    """The probe kept at ``path`` if it was taken under the same identity; None otherwise."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable host probe %s (%s): probing again", path, exc)
        return None
    if not isinstance(raw, dict) or raw.get("identity") != ident:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(raw.get("t_ns", 0)) / 1e9))
    try:
        return HostProbe.from_dict(raw, f"probe of this host measured {when}, kept in {path} (delete it to re-probe)")
    except ValueError as exc:
        log.warning("ignoring host probe %s: %s", path, exc)
        return None


def record_host_probe(ranks_per_node: int, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A fresh probe pinned to the threads a run's ranks will use, as ``run.json["host_probe"]``.

    The launcher calls this for a CPU run before its ranks start; ``environ`` is the ranks' environment.
    """
    probe = measure_host_probe(rank_threads(ranks_per_node, environ))
    return {**probe.to_dict(), "t_ns": time.time_ns(), "by": "launcher, before the ranks started"}
