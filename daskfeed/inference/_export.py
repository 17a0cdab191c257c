"""``OUTPUT/serving/`` from any Keras backend: on TensorFlow here, elsewhere in a TensorFlow process.

A SavedModel is TensorFlow's format (:mod:`daskfeed.inference._serving` writes it). A run
trained on JAX or PyTorch saved ``model.keras``, which any backend reads: :func:`export` runs the
export in a child process with ``KERAS_BACKEND=tensorflow`` that loads that file (or the model
handed in, saved for it) and writes ``serving/`` as a TensorFlow run would. This process imports
no TensorFlow for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from daskfeed.adapters import keras
from daskfeed.core import DaskfeedError
from daskfeed.inference._scoring import TrainedRun

# the child: the model read back on TensorFlow, then the export as a TensorFlow run does it
_CHILD = """
import json, sys
from daskfeed.adapters import keras
from daskfeed.inference._serving import export
out, path, features = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
model = keras.saving.load_model(path, compile=False) if path else None
export(out, model=model, features=features, echo=print)
"""


def export(output_dir: str | os.PathLike[str], *, model: keras.Model | None = None,
           features: list[str] | None = None, echo: Callable[[str], None] = print) -> str:
    """Write ``output_dir/serving/``: the trained model behind the training encoding, raw inputs in.

    On TensorFlow in this process; on JAX or PyTorch in a child process on TensorFlow, which
    reads ``model.keras`` (or ``model``, saved beside it for the child and removed after).
    ``docs/using-a-model.md`` tells the signatures, inputs and outputs.

    Parameters
    ----------
    output_dir
        A ``daskfeed train --output`` directory (``model.keras``, ``manifest.json``).
    model
        The trained Keras model (default: ``model.keras``).
    features
        Only for a model over one matrix (``as_matrix``): its feature columns, in order.
    echo
        Where the closing line goes.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    DaskfeedError
        The run cannot be read (no manifest or model), or the TensorFlow child failed (its
        last lines of stderr quoted).
    """
    if keras.backend.backend() == "tensorflow":
        from daskfeed.inference._serving import export as write

        path = write(output_dir, model=model, features=features, echo=echo)
        assert path is not None  # (None only on another backend)
        return path
    out = os.fspath(output_dir)
    TrainedRun.open(out, features)  # a directory without a run: refused here, clearly
    saved = ""
    if model is not None:
        saved = os.path.join(out, f".export-{os.getpid()}.keras")
        model.save(saved)
    try:
        env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
        proc = subprocess.run([sys.executable, "-c", _CHILD, out, saved, json.dumps(features)],
                              capture_output=True, text=True, env=env, check=False)
    finally:
        if saved and os.path.exists(saved):
            os.remove(saved)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise DaskfeedError(
            f"Expected serving/ written by a TensorFlow process (a SavedModel is TensorFlow's "
            f"format; this run's backend is {keras.backend.backend()}). Received: exit status "
            f"{proc.returncode}:\n{tail}\nHint: model.keras is written; run 'daskfeed export "
            f"{out}' with KERAS_BACKEND=tensorflow to see the whole error."
        )
    for line in proc.stdout.splitlines():
        echo(line + " (by a TensorFlow process: the model read back from model.keras)"
             if line.startswith("wrote ") else line)
    return os.path.join(out, "serving")
