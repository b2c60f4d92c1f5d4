"""What a trainable TFLite file holds: the Select TF ops it needs (its signatures: `litert.signature_details`).

`flex_ops(flatbuffer)` lists the Select TF ops a file needs (the Flex delegate runs them): TFLite
stores a custom operator's name as a flatbuffer string (a little-endian uint32 length, the bytes,
a NUL), and the converter names every Select op "Flex<TF op name>". We accept a match only when
its length prefix and terminator agree, which a tensor name merely containing "Flex" does not.
(The export with inference-result reuse: `training.inference_reuse.OnlineTrainer`, converted with
`device.tflite.REUSE_SIGNATURES`.)
"""

from __future__ import annotations

import re
import struct

_FLEX = re.compile(rb"Flex[A-Za-z0-9_]+\x00")


def flex_ops(flatbuffer: bytes) -> list[str]:
    """Sorted names of the Select TF ops (without the "Flex" prefix) that the file uses."""
    found = set()
    for m in _FLEX.finditer(flatbuffer):
        name = m.group()[:-1]
        start = m.start()
        if start >= 4 and struct.unpack_from("<I", flatbuffer, start - 4)[0] == len(name):
            found.add(name[4:].decode())
    return sorted(found)
