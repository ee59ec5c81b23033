"""The named device mesh of a layout, and the process groups each parallelism asks for.

Dims are ``("pp", "dp", "cp", "tp")`` with tp innermost, so tensor-parallel ranks are neighbours
(on a GPU node: the fastest links), exactly as :meth:`powertrain.spec.layout.Layout.coords` numbers
them. Expert parallelism is carved out of dp×cp: a second mesh ``("pp", "edp", "ep", "tp")`` over
the same ranks splits the flattened data-parallel index into (expert-data-parallel, ep), and is only
built when ``ep > 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from powertrain.spec.layout import Layout

MESH_DIMS = ("pp", "dp", "cp", "tp")


@dataclass
class Meshes:
    """The mesh of one layout on this rank; ``mesh`` is None when running without a process group."""

    layout: Layout
    rank: int
    mesh: DeviceMesh | None
    ep_mesh: DeviceMesh | None

    @property
    def coords(self) -> dict[str, int]:
        return self.layout.coords(self.rank)

    def sub(self, dim: str) -> DeviceMesh | None:
        return self.mesh[dim] if self.mesh is not None else None

    def group(self, dim: str) -> Any:
        """Process group of ``dim`` (pp, dp, cp, tp, or ep / edp), or None without one."""
        if dim in ("ep", "edp"):
            return self.ep_mesh[dim].get_group() if self.ep_mesh is not None else None
        return self.mesh[dim].get_group() if self.mesh is not None else None


def device_type() -> str:
    """``cuda`` (or another accelerator) when one is present, else ``cpu``. Never touches torch.cuda on CPU."""
    if torch.accelerator.is_available():
        acc = torch.accelerator.current_accelerator()
        return acc.type if acc is not None else "cpu"
    return "cpu"


def build_meshes(layout: Layout, device: str) -> Meshes:
    """The meshes of ``layout`` (resolved against the process group's world size)."""
    if not dist.is_initialized():
        lay = layout.resolve(1)
        return Meshes(lay, 0, None, None)
    world, rank = dist.get_world_size(), dist.get_rank()
    lay = layout.resolve(world)
    assert lay.dp is not None
    mesh = init_device_mesh(device, (lay.pp, lay.dp, lay.cp, lay.tp), mesh_dim_names=MESH_DIMS)
    ep_mesh = None
    if lay.ep > 1:
        ep_mesh = init_device_mesh(device, (lay.pp, lay.dp * lay.cp // lay.ep, lay.ep, lay.tp),
                                   mesh_dim_names=("pp", "edp", "ep", "tp"))
    return Meshes(lay, rank, mesh, ep_mesh)
