"""Random specs thrown at the planner: invalid ones are rejected with a message, nothing crashes,
and every run it would launch satisfies the layout rules (checked here independently)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powertrain.plan.planner import plan
from powertrain.plan.sweep_spec import SpecError, parse_sweep_spec

small = st.integers(min_value=-1, max_value=9)
models = st.one_of(
    st.sampled_from(["gpt3-tiny", "llama3-tiny", "mixtral-8x7b-tiny", "nope-7b"]),
    st.fixed_dictionaries({
        "family": st.sampled_from(["gpt", "llama", "mixtral", "rnn"]),
        "layers": small, "hidden": st.sampled_from([0, 64, 96, 128]), "ffn": st.sampled_from([64, 256]),
        "heads": small, "kv_heads": small, "vocab": st.sampled_from([256, 250]), "seq_len": st.sampled_from([32, 64]),
        "experts": small, "top_k": small,
    }),
)
layouts = st.fixed_dictionaries({}, optional={
    "tp": small, "pp": small, "cp": small, "ep": small, "dp": small,
    "fsdp": st.booleans(), "sequence_parallel": st.booleans(),
    "pp_schedule": st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zigzag"]),
    "virtual_stages": small,
    "pp_split": st.one_of(st.sampled_from(["even", "study_uneven"]), st.lists(small, max_size=4)),
})
knobs = st.fixed_dictionaries({}, optional={
    "micro_batch": small, "global_batch": st.integers(min_value=-1, max_value=40),
    "recompute": st.sampled_from(["none", "selective", "full", "some"]),
})
hardware = st.fixed_dictionaries({}, optional={"nodes": small, "devices_per_node": small})
raw_specs = st.fixed_dictionaries({
    "name": st.sampled_from(["fuzz", "bad name"]),
    "base": st.fixed_dictionaries({"model": models, "layout": layouts, "knobs": knobs, "hardware": hardware}),
}, optional={"grid": st.lists(st.dictionaries(st.sampled_from(["layout.tp", "layout.pp", "knobs.micro_batch"]),
                                              st.lists(small, min_size=1, max_size=3), max_size=2), max_size=2)})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_specs)
def test_planner_never_crashes_and_only_launches_valid_runs(raw):
    try:
        p = plan(parse_sweep_spec(raw))
    except SpecError as exc:
        assert str(exc)  # a bad spec is refused with a message, as a SpecError
        return
    for run in p.runs:
        if run.status != "planned":
            assert run.reasons and all(r.strip() for r in run.reasons)
            continue
        c = run.config
        m, lay, k, hw = c.model, c.layout, c.knobs, c.hardware
        assert lay.dp is not None and lay.dp * lay.tp * lay.pp * lay.cp == hw.nodes * hw.devices_per_node
        assert m.heads % lay.tp == 0 and m.kv_heads % lay.tp == 0
        assert m.experts % lay.ep == 0 and (lay.dp * lay.cp) % lay.ep == 0
        assert k.global_batch % (k.micro_batch * lay.dp) == 0
        assert m.layers >= lay.pp * lay.virtual_stages
