"""Running a TFLite file with LiteRT (`ai-edge-litert`), the runtime that replaces `tf.lite.Interpreter`.

LiteRT has no Flex delegate, so it runs only files made of builtin ops (`device.builtin_export`);
`operators` reads which ops a file needs from its flatbuffer, without running it. TensorFlow and
`ai_edge_litert` load in one process (checked with tensorflow 2.19.1 and ai-edge-litert 2.3.0), so
no subprocess is needed; nothing here imports TensorFlow, so a phone-like process can run without it.
"""

from __future__ import annotations

import importlib.metadata
import time

import numpy as np
from ai_edge_litert import interpreter as _litert
from ai_edge_litert import schema_py_generated as _schema

_BUILTIN_NAMES = {code: name for name, code in vars(_schema.BuiltinOperator).items() if not name.startswith("_")}


def operators(flatbuffer: bytes) -> list[str]:
    """Sorted names of the operators a file uses: builtin ones by their schema name (ADD, ...),
    custom ones (Flex<TF op> for Select TF ops) by their custom code."""
    model = _schema.Model.GetRootAs(flatbuffer, 0)
    names = set()
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        # files from before 2.3 keep codes < 127 in the deprecated byte; take the larger of the two
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == _schema.BuiltinOperator.CUSTOM:
            names.add(code.CustomCode().decode())
        else:
            names.add(_BUILTIN_NAMES[builtin])
    return sorted(names)


def custom_operators(flatbuffer: bytes) -> list[str]:
    """The operators that are not builtin (empty for a file LiteRT runs without delegates)."""
    return [name for name in operators(flatbuffer) if name not in _BUILTIN_NAMES.values()]


def interpreter(flatbuffer: bytes) -> _litert.Interpreter:
    interp = _litert.Interpreter(model_content=flatbuffer)
    interp.allocate_tensors()
    return interp


def signature_details(interp) -> dict:
    """Each signature's inputs and outputs with shapes (-1: any size) and dtypes. Works for
    LiteRT's and TensorFlow's interpreters alike."""
    out = {}
    for name in interp.get_signature_list():
        runner = interp.get_signature_runner(name)
        io = {}
        for kind, details in (("inputs", runner.get_input_details()), ("outputs", runner.get_output_details())):
            io[kind] = {
                k: {"shape": [int(s) for s in d["shape_signature"]], "dtype": np.dtype(d["dtype"]).name}
                for k, d in sorted(details.items())
            }
        out[name] = io
    return out


def median_step_seconds(run, feeds: list[dict], warmup: int = 2) -> float:
    """Median wall time of `run(**feed)` over `feeds` after the first `warmup` calls (allocation,
    caches); the caller passes at least warmup + 5 feeds."""
    if len(feeds) < warmup + 5:
        raise ValueError(f"need at least {warmup + 5} feeds for a median of 5 after warm-up, got {len(feeds)}")
    seconds = []
    for feed in feeds:
        start = time.perf_counter()
        run(**feed)
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds[warmup:]))


def version() -> str:
    return importlib.metadata.version("ai-edge-litert")
