"""llama.cpp as a peer (through ``llama-cpp-python``, the ``llamacpp`` extra): loading a GGUF file
with the same threads as decodelab, its own float32 conversion of a file, and its logits on token
windows. Shared by the decode benchmark (speed, ``decodelab.measure.peers``) and the quantization
study (cross-implementation rows of the scoreboard: the file, and llama.cpp's own float32, Q8_0,
Q4_0 and Q4_K_M conversions of it, ``convert``).

llama.cpp's AMX kernels stop with an illegal instruction where the kernel does not grant a
process AMX state (some virtual machines), so ``load`` takes ``extra_buffers=False`` by default:
llama.cpp's plain CPU kernels (AVX2 / AVX-512), which run on every x86 machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import pathlib

import numpy as np

from decodelab import optional
from decodelab.measure.timing import threads


def gguf_tensor_bytes(path: pathlib.Path) -> int:
    """Bytes of every tensor stored in the GGUF file at ``path`` (as stored: quantized blocks at
    their block size), what llama.cpp reads of its weights per decode step."""
    reader = optional.require("gguf").GGUFReader(str(path))
    return int(sum(int(t.n_bytes) for t in reader.tensors))


# What ``convert`` makes with llama.cpp's own quantizer: float32, and the quantizations the
# quantization scoreboard sets beside decodelab's (Q8_0 and Q4_0: one scale per block of 32
# weights; Q4_K_M: k-quants, super-blocks of 256 with 6-bit sub-block scales, some tensors at 6
# bits). The quantized ones are made from llama.cpp's float32 copy of the file.
FTYPES = {"f32": "LLAMA_FTYPE_ALL_F32", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def convert(source: pathlib.Path, destination: pathlib.Path, ftype: str) -> pathlib.Path:
    """The GGUF file ``source`` written by llama.cpp's own quantizer (``llama_model_quantize``,
    requantizing allowed) as ``ftype`` (``FTYPES``) at ``destination``: "f32" is the same values
    decodelab computes when it dequantizes the file, stored as llama.cpp reads them; a quantized
    ``ftype`` is made from that float32 copy (written beside ``destination``), as llama.cpp's
    quantizer would make it from a float32 file."""
    if ftype not in FTYPES:
        raise ValueError(f"ftype must be one of {sorted(FTYPES)}, got {ftype!r}")
    llama_cpp = optional.require("llama_cpp")
    if ftype != "f32":
        source = convert(source, destination.with_name(destination.stem + "-f32.gguf"), "f32")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[ftype])
    params.allow_requantize = True
    params.nthread = threads()
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(destination).encode(),
                                            ctypes.byref(params))
    if status != 0 or not destination.is_file():
        raise RuntimeError(f"llama.cpp could not convert {source} to {ftype} (status {status})")
    return destination


@contextlib.contextmanager
def _model_params(**fields):
    """Models loaded inside get llama.cpp's default model parameters with ``fields`` changed
    (``llama_cpp.Llama`` takes no argument for some of them)."""
    bindings = optional.require("llama_cpp.llama_cpp")
    default = bindings.llama_model_default_params

    def changed():
        params = default()
        for name, value in fields.items():
            setattr(params, name, value)
        return params

    bindings.llama_model_default_params = changed
    try:
        yield
    finally:
        bindings.llama_model_default_params = default


def load(path: pathlib.Path, n_ctx: int, n_batch: int, *, extra_buffers: bool = False,
         logits_all: bool = False):
    """``llama_cpp.Llama`` of the GGUF file at ``path`` with ``threads()`` threads, a context of
    ``n_ctx`` positions, prompts evaluated ``n_batch`` tokens at a time; ``extra_buffers``:
    llama.cpp's extra weight buffer types (repacked and AMX kernels; module docstring);
    ``logits_all``: keep the logits of every evaluated position, not only the last."""
    llama_cpp = optional.require("llama_cpp")
    with _model_params(use_extra_bufts=extra_buffers):
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch,
                               n_threads=threads(), n_threads_batch=threads(),
                               logits_all=logits_all, verbose=False)


def logits(path: pathlib.Path, windows: np.ndarray, *, extra_buffers: bool = False) -> np.ndarray:
    """``float32 [W, T, V]``: llama.cpp's logits at every position of each window ``int [W, T]``,
    each window read from an empty KV cache at positions ``0 .. T-1`` (as ``dl.compare`` reads
    them), in one prompt evaluation."""
    windows = np.asarray(windows)
    if windows.ndim != 2:
        raise ValueError(f"windows must be token ids [W, T], got shape {windows.shape}")
    T = windows.shape[1]
    llm = load(path, n_ctx=T, n_batch=T, extra_buffers=extra_buffers, logits_all=True)
    out = []
    for window in windows:
        llm.reset()
        llm.eval([int(t) for t in window])
        out.append(np.array(llm.scores[:T], np.float32))
    return np.stack(out)
