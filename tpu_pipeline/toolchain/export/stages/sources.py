"""The project's files: the model and its C array, the op resolver, the board layer (a board with a
`[firmware]` section), harness_config.h, the harness sources, and export.json with every figure."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace

from tpu_pipeline.toolchain.data import HARNESS_DIR  # package data: found from any folder, in a wheel too
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.export.result import ExportResult
from tpu_pipeline.toolchain.export.sources import c_array, config_header, resolver_header
from tpu_pipeline.toolchain.firmware.project import project_files

MODEL_DATA_H = (b"#pragma once\n\nextern const unsigned char g_model_data[];\n"
                b"extern const unsigned int g_model_data_len;\n")


def sources(state, allowed):
    device, data, graph = state.options.device, state.data, state.graph
    crc = f"{zlib.crc32(data):08X}"
    sg = state.planned.subgraphs[0]
    files: dict[str, bytes] = {
        "model.tflite": data,
        "model_data.h": MODEL_DATA_H,
        "model_data.cc": c_array(data, "g_model_data").encode(),
        "op_resolver.h": resolver_header(state.opcodes, state.methods).encode(),
    }
    firmware = device.firmware
    if firmware is not None:
        files.update(project_files(device))
    external = [(t, graph.tensors[t].nbytes) for t in sorted(graph.external)]  # TFLM adds them by index
    files["harness_config.h"] = config_header(device, state.arena_size, state.measured.head, crc, len(sg.inputs),
                                              len(sg.outputs), state.src.name,
                                              firmware.core_clock_hz if firmware else None, external,
                                              state.arena_banks).encode()
    if HARNESS_DIR.is_dir():
        for f in sorted(HARNESS_DIR.iterdir()):
            if f.is_file():
                files[f.name] = f.read_bytes()
    m = device.memory
    result = ExportResult(str(state.options.out_dir), tuple(sorted([*files, "export.json"])), device.name,
                          state.opcodes, len(data), state.planned_head, state.own_head, state.measured.head,
                          state.measured.tail, state.arena_size, m.sram_bytes, m.flash_bytes, state.planner,
                          sum(1 for o in state.offsets if o >= 0), crc, firmware.to_json() if firmware else None,
                          state.arena_banks, state.notes)
    files["export.json"] = (json.dumps(result.to_json(), indent=2) + "\n").encode()
    return replace(state, files=tuple(files.items()), result=result), PassRecord("sources", "ran", 0.0,
                                                                               {"files": len(files)})
