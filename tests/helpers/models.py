"""Models and descriptors several test modules build: a stem-heavy CNN, a fixture with a CUSTOM op
nothing has a kernel for, a small VWW stem whose overlapped layers form two rigid groups, a toy
Edge TPU descriptor, a random DAG whose schedule no machine proves quickly (for tests that need a
search to run until it is stopped)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from helpers.cnn_builder import CnnBuilder, graph_bytes
from tpu_pipeline.toolchain.ir import Graph, Tensor
from tpu_pipeline.toolchain.ir import ops as ir_ops
from tpu_pipeline.toolchain.tflite import read_model, schema

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# a small Edge TPU descriptor with round numbers (cost model and partition tests)
EDGETPU = """
name = "toy"
kind = "edgetpu"
[memory]
param_sram_bytes = 1000
[link]
host_bandwidth_bytes_per_s = 1e9
[timing]
invoke_overhead_s = 1e-3
[compute]
peak_ops_per_s = 2e9
[compute.efficiency]
conv = 0.5
depthwise = 0.25
fully_connected = 1.0
elementwise = 1.0
other = 1.0
[power]
active_w = 2.0
idle_w = 0.5
"""


def stem_heavy_cnn(tmp_path: Path, seed: int = 3, dtype: str = "int8") -> Path:
    """A MobileNet-like stem: the peak sits in the first, high-resolution layers."""
    b = CnnBuilder(seed=seed, dtype=dtype)
    x = b.input((1, 40, 40, 3))
    y = b.conv(x, 16, k=3, stride=2, act="RELU6")  # 20x20x16
    y = b.conv(y, 48, k=1, act="RELU6")  # expand: the peak
    y = b.dw(y, k=3, stride=2, act="RELU6")  # 10x10x48
    y = b.conv(y, 8, k=1)
    z = b.add(b.conv(b.dw(b.conv(y, 24, k=1, act="RELU6"), k=3, act="RELU6"), 8, k=1), y)
    out = b.conv(z, 4, k=3, stride=2, padding="VALID")
    path = tmp_path / f"stem_{dtype}.tflite"
    path.write_bytes(b.model_bytes([out]))
    return path


def overlap_sandwich(tmp_path: Path) -> Path:
    """MLPerf Tiny's VWW stem in small (32x32x3 in): a stride-2 first convolution, a depthwise one,
    a pointwise expansion, a stride-2 depthwise, a pointwise one, average pooling. Under fit's
    harness kernels the first convolution and the expansion overlap their outputs with their
    inputs (two rigid groups) while the depthwise between them may run plain: its input then sits
    at one group's base and its output at the other's (the replan test, issue 30)."""
    b = CnnBuilder(seed=1, spread=True)
    x = b.input((1, 32, 32, 3))
    y = b.conv(x, 8, k=3, stride=2, act="RELU6")
    y = b.dw(y, k=3, act="RELU6")
    y = b.conv(y, 16, k=1, act="RELU6")
    y = b.dw(y, k=3, stride=2, act="RELU6")
    y = b.conv(y, 16, k=1, act="RELU6")
    y = b.pool(y, kind="AVERAGE_POOL_2D", k=8, stride=8)
    path = tmp_path / "overlap_sandwich.tflite"
    path.write_bytes(b.model_bytes([y]))
    return path


def with_custom_op(name: str, after_op: int | None, code: str = "MyCustomDecoder"):
    """The fixture `name` with a CUSTOM op `code` (no kernel anywhere) inserted: reading the
    output of op `after_op` and feeding that op's consumers (same shape and type, as a decoder
    or a MediaPipe op would), or, with after_op None, reading the graph's first output and
    giving a new graph output (Coral's PoseNet decoder at the end)."""
    m = copy.deepcopy(read_model(FIXTURES / f"{name}.tflite"))
    sg = m.subgraphs[0]
    oc = schema.OperatorCodeT()
    oc.builtinCode = schema.BuiltinOperator.CUSTOM
    oc.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    oc.customCode = code.encode()
    oc.version = 1
    m.operatorCodes.append(oc)
    src = sg.outputs[0] if after_op is None else sg.operators[after_op].outputs[0]
    new = copy.deepcopy(sg.tensors[src])
    new.name = (sg.tensors[src].name.decode() + "/decoded").encode()
    new.buffer = 0
    sg.tensors.append(new)
    t_new = len(sg.tensors) - 1
    op = schema.OperatorT()
    op.opcodeIndex = len(m.operatorCodes) - 1
    op.inputs, op.outputs = [src], [t_new]
    if after_op is None:
        sg.operators.append(op)
        sg.outputs = [t_new] + list(sg.outputs[1:])
    else:
        for o in sg.operators[after_op + 1:]:
            o.inputs = [t_new if t == src else t for t in o.inputs]
        sg.operators.insert(after_op + 1, op)
    return m


def random_dag(n_ops=60, seed=0, hw=4):
    """A random float32 DAG of RELUs (one input) and channel CONCATENATIONs (two): at 120 ops its
    memory-optimal order is not proven within minutes, so a search on it runs to its deadline."""
    rng = np.random.default_rng(seed)
    tensors, ops = [], []

    def act(name, c):
        tensors.append(Tensor(len(tensors), name, "float32", (1, hw, hw, int(c))))
        return len(tensors) - 1

    x_in = act("input", 4)
    avail = [(x_in, 4)]
    readers = {x_in: 0}
    for k in range(n_ops):
        ins = [avail[int(j)] for j in rng.choice(len(avail), size=min(len(avail), int(rng.integers(1, 3))), replace=False)]
        c = int(rng.integers(1, 32))
        y = act(f"t{k}", c)
        if len(ins) == 1:
            ops.append(ir_ops.op("RELU", (ins[0][0],), (y,)))
        else:
            tensors[y] = Tensor(y, f"t{k}", "float32", (1, hw, hw, sum(ci for _, ci in ins)))
            c = sum(ci for _, ci in ins)
            ops.append(ir_ops.concatenation([t for t, _ in ins], y, axis=3))
        for t, _ in ins:
            readers[t] = readers.get(t, 0) + 1
        avail.append((y, c))
        readers[y] = 0
        if len(avail) > 12:
            avail = avail[-12:]
    outs = tuple(t for t, n in readers.items() if n == 0)
    return Graph(tuple(tensors), tuple(ops), (x_in,), outs, "random")


def hard_schedule_model(path: Path) -> Path:
    """`random_dag(120)` as a .tflite: every command that schedules it searches until its time limit."""
    path.write_bytes(graph_bytes(random_dag(120, 0)))
    return path


def mcu_toml(name: str, banks, clock_hz: int = 100_000_000, firmware: str | None = None,
             description: str | None = None, power=(0.1, 0.01)) -> str:
    """A small MCU descriptor with round numbers (cost, fit and bank tests): `banks` as for
    banks_toml, one instruction per cycle, `firmware` the [firmware] table's lines (None: none)."""
    head = f'name = "{name}"\nkind = "mcu"\n' + (f'description = "{description}"\n' if description else "")
    return (f"{head}\n[memory]\nflash_bytes = 1048576\n{banks_toml(banks)}\n"
            f"[compute]\nclock_hz = {clock_hz}\ncycles_per_instruction = 1.0\n[compute.cycles_per_mac]\n"
            "conv = 2.0\ndepthwise = 3.0\nfully_connected = 2.0\nelementwise = 5.0\nother = 6.0\n\n"
            f"[link]\nbaud = 115200\n\n[power]\nactive_w = {power[0]}\nidle_w = {power[1]}\n"
            + (f"\n[firmware]\n{firmware}" if firmware else ""))


def banks_toml(banks) -> str:
    """`[[memory.banks]]` tables for (name, origin, size_bytes, wait_states) rows (origin or
    wait_states None: the key left out)."""
    out = []
    for name, origin, size, wait in banks:
        out.append(f'[[memory.banks]]\nname = "{name}"\n' + (f"origin = 0x{origin:08X}\n" if origin is not None else "")
                   + f"size_bytes = {size}\n" + (f"wait_states = {wait}\n" if wait is not None else ""))
    return "".join(out)


def qemu_board(tmp_path: Path, name: str, banks, base: str = "qemu-mps2-an500") -> Path:
    """A descriptor file for an emulated board (`base`'s shipped descriptor) with other RAM banks:
    the first must stay at the board's ram_origin (QEMU's SSRAM), the others at regions QEMU maps
    (the an500's PSRAM at 0x60000000, the an386's at 0x21000000)."""
    import re

    from tpu_pipeline.toolchain.data import DEVICES_DIR

    text = (DEVICES_DIR / f"{base}.toml").read_text()
    text = re.sub(r'^name = ".*"$', f'name = "{name}"', text, count=1, flags=re.M)
    text = re.sub(r"^sram_bytes = .*\n", "", text, flags=re.M)
    text = re.sub(r"(?ms)^\[\[memory\.banks\]\]\n.*?(?=^\[compute\])", lambda _: banks_toml(banks) + "\n", text)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path
