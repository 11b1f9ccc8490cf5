"""The compile worker: ``python -m poot.codegen.worker`` reads length-prefixed pickled
(ir_text, target, name, loop_vectorize) requests on stdin and answers (ok, artifact-or-message) on stdout.
If LLVM aborts, only this process dies."""

from __future__ import annotations

import pickle
import struct
import sys


def main() -> None:
    from .compile import compile_ir

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        (n,) = struct.unpack("<Q", head)
        ir_text, tgt, name, loop_vectorize = pickle.loads(inp.read(n))
        try:
            reply = (True, compile_ir(ir_text, tgt, name, loop_vectorize))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the parent, typed there
            reply = (False, f"{type(e).__name__}: {str(e).strip()[:2000]}")
        data = pickle.dumps(reply)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()


if __name__ == "__main__":
    main()
