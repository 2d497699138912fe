"""rl_core.runtime.hlo counts a compiled program's collectives, loops included (8 simulated devices)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rl_core.runtime import hlo

# A hand-written fragment in the compiled-HLO text format: one all-gather in the entry,
# an all-reduce inside a while body with a known trip count of 4, and an async all-gather.
TEXT = textwrap.dedent("""\
    HloModule m

    %body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
      %p = (s32[], f32[8,16]) parameter(0)
      %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
      %ar = f32[8,16]{1,0} all-reduce(%x), replica_groups={{0,1}}, to_apply=%add
      ROOT %t = (s32[], f32[8,16]) tuple(%i, %ar)
    }

    %cond (p: (s32[], f32[8,16])) -> pred[] {
      ROOT %c = pred[] constant(true)
    }

    ENTRY %main (a: bf16[4,32]) -> f32[8,16] {
      %a = bf16[4,32]{1,0} parameter(0)
      %ag = bf16[8,32]{1,0} all-gather(%a), dimensions={0}
      %ags = (bf16[4,32]{1,0}, bf16[8,32]{1,0}) all-gather-start(%a), dimensions={0}
      %agd = bf16[8,32]{1,0} all-gather-done(%ags)
      %w = (s32[], f32[8,16]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
      ROOT %r = f32[8,16]{1,0} get-tuple-element(%w), index=1
    }
    """)


def test_collectives_by_hand():
    ops = hlo.collectives(TEXT)
    assert sorted((c.kind, c.shapes, c.bytes, c.count) for c in ops) == [
        ("all-gather", ("bf16[8,32]",), 8 * 32 * 2, 1),  # the async one: its result, not its operand
        ("all-gather", ("bf16[8,32]",), 8 * 32 * 2, 1),
        ("all-reduce", ("f32[8,16]",), 8 * 16 * 4, 4),  # four trips of the loop
    ]
    assert hlo.total_bytes(ops) == 2 * 512 + 4 * 512
    assert hlo.summary(ops) == {"all-gather": {"executions": 2, "bytes": 1024},
                                "all-reduce": {"executions": 4, "bytes": 2048}}


SCRIPT = """
import json, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from rl_core.runtime import hlo
mesh = jax.make_mesh((8,), ("x",))
rows, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())

def f(w, xs):  # w gathered once, then a scan of 3 steps each summing over the rows
    def body(c, x):
        return c + jnp.sum(x @ w, axis=0), None
    out, _ = jax.lax.scan(body, jnp.zeros((64,)), xs)
    return out

c = jax.jit(f, in_shardings=(rows, NamedSharding(mesh, P(None, "x"))), out_shardings=whole).lower(
    jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((3, 16, 64), jnp.float32)).compile()
print(json.dumps(hlo.summary(hlo.collectives(c.as_text()))))
"""


@pytest.mark.multidevice
def test_a_compiled_program_on_eight_devices():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    env = dict(os.environ, XLA_FLAGS=flags)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    # the row-split weight is gathered whole (64 x 64 float32 per device) at least once, and
    # the per-row sums are all-reduced: every collective XLA chose is counted with its bytes
    assert summary["all-gather"]["bytes"] >= 64 * 64 * 4
    assert summary.get("all-reduce", {"executions": 0})["executions"] >= 1
