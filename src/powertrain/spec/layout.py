"""Parallel layout degrees: the one object that owns dp/tp/pp/cp/ep and how they multiply.

As in torchtitan's ``ParallelDims``, the degrees are validated once here and everything else (the
trainer's device mesh, the planner, the predictor) asks this object instead of re-deriving them.

World = dp × cp × tp × pp. Expert parallelism is carved out of data parallelism as in Megatron
(the ``ep`` ranks of an expert group are ``ep`` consecutive data-parallel ranks), so ``ep`` must
divide ``dp × cp`` and does not multiply the world size. FSDP shards over the data-parallel dimension.

``etp`` (expert tensor parallelism) is Megatron-Core's parallel folding: the experts are split ``etp``
ways instead of ``tp`` ways, and an expert group is ``ep`` ranks ``etp`` apart anywhere in a stage's
``tp × cp × dp`` ranks (e.g. TP2 with EP64 and ETP1 on 64 ranks per stage), so ``ep × etp`` must divide
``tp × cp × dp``. The predictor and the advisor cost it; the built-in trainer refuses it
(``spec.validate``: rule ``expert_tp_unsupported``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from powertrain.spec.values import SpecModel

MAX_DEGREE = 1 << 26  # no degree exceeds the largest world (65 536 nodes × 1 024 devices)

PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
# "even": layers spread as evenly as possible; "study_uneven": the study's split (even-indexed
# stages one layer more, odd-indexed one fewer); or an explicit list of layers per (virtual) stage.
StageSplit = Literal["even", "study_uneven"] | list[int]


class Layout(SpecModel):
    """How a model is spread over ``world`` ranks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp: int | None = Field(default=None, ge=1, le=MAX_DEGREE, description="data parallel; derived from world if omitted")
    tp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    pp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    cp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    ep: int = Field(default=1, ge=1, le=MAX_DEGREE, description="expert parallel, carved out of dp×cp")
    etp: int | None = Field(default=None, ge=1, le=MAX_DEGREE,
                            description="expert tensor parallel (parallel folding: ep×etp divides tp×cp×dp); "
                                        "unset: experts split like the dense layers (tp). Predicted, not trained")
    fsdp: bool = Field(default=False, description="shard parameters/grads/optimizer over dp (FSDP2)")
    sequence_parallel: bool = Field(default=False, description="shard norms/dropout activations over tp")
    pp_schedule: PipelineSchedule = "1f1b"
    virtual_stages: int = Field(default=1, ge=1, le=1024, description="model chunks per pipeline rank (interleaved)")
    pp_split: StageSplit = "even"
    distributed_optimizer: bool = Field(default=False, description="shard optimizer states over dp (ZeRO-1)")

    def resolve(self, world: int) -> Layout:
        """This layout with ``dp`` filled in from the world size (raises if it does not divide)."""
        rest = self.tp * self.pp * self.cp
        if world % rest:
            raise ValueError(
                f"world size {world} is not divisible by tp×pp×cp = {self.tp}×{self.pp}×{self.cp} = {rest}; "
                f"use a world size that is a multiple of {rest}, or change the degrees"
            )
        dp = world // rest
        if self.dp is not None and self.dp != dp:
            raise ValueError(
                f"world size {world} ≠ dp×cp×tp×pp = {self.dp}×{self.cp}×{self.tp}×{self.pp} = "
                f"{self.dp * rest}; set dp to {dp} or omit it to derive it"
            )
        return self.model_copy(update={"dp": dp})

    @property
    def world(self) -> int:
        if self.dp is None:
            raise ValueError("dp is not resolved yet: call resolve(world) first")
        return self.dp * self.cp * self.tp * self.pp

    @property
    def stages(self) -> int:
        """Pipeline (virtual) stages in total."""
        return self.pp * self.virtual_stages

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of ``rank``: dims ordered (pp, dp, cp, tp), tp innermost (fastest varying).

        ``ep`` is the rank's index inside its expert group: ``ep`` consecutive data-parallel ranks
        (dp×cp flattened) form one group, as in Megatron.
        """
        dp = self.dp
        if dp is None:
            raise ValueError("dp is not resolved yet: call resolve(world) first")
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside world {self.world}")
        tp_i, rest = rank % self.tp, rank // self.tp
        cp_i, rest = rest % self.cp, rest // self.cp
        dp_i, pp_i = rest % dp, rest // dp
        return {"dp": dp_i, "tp": tp_i, "pp": pp_i, "cp": cp_i, "ep": (dp_i * self.cp + cp_i) % self.ep}

    def stage_layer_counts(self, layers: int) -> list[int]:
        """Transformer layers in each (virtual) stage, in stage order, per ``pp_split``.

        ``even`` spreads the remainder over the first stages; ``study_uneven`` gives even-indexed
        stages one layer more and odd-indexed stages one fewer than the even split (the study's
        split; with an odd number of stages the last stage keeps the even share). Raises
        ``ValueError`` when a stage would get no layer or an explicit list does not add up.
        """
        n = self.stages
        if isinstance(self.pp_split, list):
            counts = list(self.pp_split)
            if len(counts) != n or sum(counts) != layers:
                raise ValueError(
                    f"pp_split {counts} must list {n} stages (pp×virtual_stages) adding up to {layers} layers"
                )
        elif self.pp_split == "study_uneven":
            if layers % n:
                raise ValueError(f"study_uneven needs layers ({layers}) divisible by stages ({n})")
            base = layers // n
            counts = [base + 1 if i % 2 == 0 else base - 1 for i in range(n)]
            if n % 2:
                counts[-1] = base
        else:
            base, rest = divmod(layers, n)
            counts = [base + (1 if i < rest else 0) for i in range(n)]
        if min(counts) < 1:
            raise ValueError(f"stage split {counts} leaves a stage without layers ({layers} layers, {n} stages)")
        return counts

    def label(self) -> str:
        """Short human label, e.g. ``TP4·PP8`` or ``TP2·EP4·FSDP``."""
        parts = []
        for key in ("dp", "tp", "pp", "cp", "ep"):
            val = getattr(self, key)
            if key == "dp" or (val and val > 1):
                parts.append(f"{key.upper()}{val if val is not None else '?'}")
        if self.etp is not None:
            parts.append(f"ETP{self.etp}")
        if self.virtual_stages > 1:
            parts.append(f"V{self.virtual_stages}")
        if self.fsdp:
            parts.append("FSDP")
        if self.sequence_parallel:
            parts.append("SP")
        return "·".join(parts)
