"""Fitting: the keras half of a training run (model, callbacks, fit, the model's outputs).

:func:`daskfeed.training._train.train` starts the cluster and prepares the data without keras, then
imports this module; the run's settings, place and cluster come in a :class:`~daskfeed.training._run.Run`.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from daskfeed.adapters import keras
from daskfeed.core import DaskfeedError, RSSSampler
from daskfeed.inference import export as export_serving
from daskfeed.inference import publish_manifest, write_record
from daskfeed.training._callbacks import Checkpointer, fit_from
from daskfeed.training._certificate import TrainedMark, certificate_line, read_mark, resume_certificate
from daskfeed.training._chart import ChartProcess
from daskfeed.training._early_stopping import (
    EarlyStopping,
    make_early_stopping,
    report_early_stopping,
    resume_early_stopping,
)
from daskfeed.training._model import model_for
from daskfeed.training._order_record import record_order
from daskfeed.training._outputs import (
    bad_lines_report,
    class_weights,
    save_model,
    split_report,
    write_history,
)
from daskfeed.training._spikes import StepLosses
from daskfeed.training._summary import summary_lines
from daskfeed.training._telemetry import EpochTelemetry
from daskfeed.training._watch import WatchCallback

if TYPE_CHECKING:
    from daskfeed.adapters import DaskSequence
    from daskfeed.training._run import Run


def fit(run: Run, train_seq: DaskSequence, val_seq: DaskSequence | None, reused: bool,
        rss: RSSSampler) -> tuple[list[dict[str, Any]], keras.Model, dict[str, Any],
                                  dict[str, Any] | None]:
    """Build the model and its callbacks, fit from the start or the checkpoint, write outputs.

    Returns the history, the model, the bad-lines report and what early stopping did (None
    without it).
    """
    opts, echo, ckpt = run.opts, run.echo, run.ckpt
    if keras.backend.backend() == "torch":  # (its own threads beside daskfeed's LocalCluster)
        from daskfeed.adapters import set_torch_threads

        threads = set_torch_threads(run.client)
        if threads:
            echo(threads)
    keras.utils.set_random_seed(opts.data.seed)  # the model's initial weights, dropout
    if opts.data.weight:
        echo(f"sample weights: column {opts.data.weight!r} (not a feature); loss and weighted_ "
             "metrics weighted" + ("" if val_seq is None else ", validation too" if val_seq.weight
                                   else "; validation unweighted (its data have no such column)"))
    weights = class_weights(train_seq.manifest, opts.fit.class_weight, echo)
    fit_weights = weights
    if weights is not None and opts.data.weight:  # Keras takes one or the other: multiply
        train_seq.stream.weigh_classes(weights)
        fit_weights = None
        echo(f"class weights multiplied into the sample weights of {opts.data.weight!r} "
             "(training batches; validation keeps its sample weights)")
    # written now, not at the end: an interrupted run keeps its quarantined lines
    bad_report = bad_lines_report(run.out, opts.data.read.bad_lines, reused, train_seq, val_seq)
    net = model_for(opts.model, train_seq, opts.fit, echo)
    stopper = make_early_stopping(opts.fit.patience, opts.fit.monitor, net, echo)
    telemetry = EpochTelemetry(train_seq, rss)
    epoch, batch = _start_point(run, net, stopper, train_seq)
    begin = (ckpt.cursor.epoch, ckpt.cursor.at) if ckpt is not None else (0, 0)
    if begin[0] < opts.epochs:
        # what fixes the order, and where this entry begins (daskfeed rows): the checkpoint's
        # place, also when the rest of its epoch is this layout's tail (the stream moved on)
        record_order(run.out, train_seq, epoch=begin[0], position=begin[1],
                     world=run.ranks.world_size, epochs=opts.epochs, fresh=ckpt is None)
    if ckpt is not None and begin[0] < opts.epochs:  # the interrupted epoch's rows, counted
        run.certificate = resume_certificate(train_seq, *begin, read_mark(run.out))
        echo(certificate_line(run.certificate, run.ranks.world_size))
    mark = TrainedMark(run.out)
    run.closing.append(mark)
    every = opts.checkpoint_every
    echo(f"checkpoints: {f'every {every} batches and ' if every else ''}at epoch ends in "
         f"{run.store.directory} (the last {run.store.keep} kept)")
    checkpointer = Checkpointer(run.store, train_seq, every=every, telemetry=telemetry,
                                history=ckpt.history if ckpt else [], early_stopping=stopper,
                                mark=mark)
    # every step's loss (steps.bin), the steps far above their neighbourhood and their rows
    run.spikes = steps = StepLosses(run.out, train_seq, fresh=ckpt is None, saved=checkpointer.saved)
    run.closing.append(steps)
    watch = WatchCallback(run.client, train_seq, validation=val_seq, budget_bytes=run.budget.total,
                          rss_sampler=rss, epochs=opts.epochs,
                          marks=steps.take_marks)  # the daskfeed page, live
    callbacks = [telemetry, *([stopper] if stopper else []), checkpointer, steps, watch,
                 *([keras.callbacks.TensorBoard(opts.tensorboard)] if opts.tensorboard else [])]
    try:
        fit_from(net, train_seq, epochs=opts.epochs, epoch=epoch, batch=batch, handoff=opts.fit.handoff,
                 validation_data=val_seq, shuffle=False, verbose=opts.verbose,
                 callbacks=callbacks, class_weight=fit_weights)
    except Exception as err:
        reraise_feed_error(err, train_seq, val_seq)
        raise
    history = checkpointer.history
    chart = ChartProcess(history, os.path.join(run.out, "history.png"))  # drawn meanwhile
    try:
        run.trained(train_seq, val_seq)  # (the cluster closes while the outputs are written)
        stopping = report_early_stopping(stopper, opts.epochs, echo)
        save_model(net, run.out)
        publish_manifest(run.out)  # manifest.json beside the model it trained, ...
        write_record(run.out, run.run_id)  # ... tied to it in run.json (readers check them)
        try:  # serving/: the same model taking raw column values
            export_serving(run.out, model=net, features=list(train_seq.features), echo=echo)
        except (DaskfeedError, ValueError, TypeError) as err:  # model.keras stands; say why not
            warnings.warn(f"serving/ not written: {err}", stacklevel=2)
        write_history(run, history, train_seq, chart, peak_rss=rss.overall_peak,
                      bad_lines=bad_report, class_weights=weights,
                      split=split_report(train_seq, val_seq), early_stopping=stopping)
    finally:
        chart.close()  # (a run that failed before the chart was put in place leaves none)
    write_record(run.out, run.run_id)  # last: serving/ and history.json tied in too
    return history, net, bad_report, stopping


def _start_point(run: Run, net: keras.Model, stopper: EarlyStopping | None,
                 train_seq: DaskSequence) -> tuple[int, int]:
    """Epoch and batch to start at: 0, 0, or the checkpoint's (its weights and optimizer loaded).

    A checkpoint in the global order is a position in it: this run goes on from there in its
    own layout (windows of its budget, its number of trainers).
    """
    ckpt, epochs = run.ckpt, run.opts.epochs
    if ckpt is None:
        return 0, 0
    ckpt.restore(net)  # weights + optimizer state (its iteration count checked)
    cur = ckpt.cursor
    epoch, batch = cur.epoch, cur.batch
    stream = train_seq.stream
    if cur.global_order and epoch < epochs:  # (the batches it skipped are skipped again)
        stream.set_state(cur, where=f"The checkpoint {ckpt.path}", cli=True)
        epoch, batch = train_seq.epoch, train_seq.start
    elif cur.global_order:  # nothing left to train: its skipped batches stay on record
        stream.keep_skips(cur)
    if stream.skips:
        run.echo(f"skipping (--skip-batches, the checkpoint's and this run's): {stream.skips.text()}")
    where = (f"batch {cur.at + 1} of the epoch's global order, this trainer's batch {batch + 1}/"
             f"{train_seq.plan.num_batches}" if cur.global_order and run.ranks.several else
             f"batch {batch + 1}/{train_seq.plan.num_batches}")
    run.echo(f"resuming from {ckpt.path}: epoch {epoch + 1}/{epochs} at {where} (optimizer "
             f"iteration {ckpt.iterations})" if epoch < epochs else
             f"{ckpt.path} is at the end of epoch {epoch}: nothing left to train (raise "
             "--epochs to train more)")
    if resume_early_stopping(stopper, ckpt, net, run.echo):
        return max(epoch, epochs), 0
    return epoch, batch


def summary(run: Run, history: list[dict[str, Any]], bad_report: dict[str, Any], seconds: float,
            rss: RSSSampler, stopping: dict[str, Any] | None, built: str = "") -> None:
    """The closing lines: the validation figure, the summary, what was written.

    The figures are those of the weights saved: the epoch early stopping restored, if it did.
    ``built``: a line on the global order's buckets built while training started ("": none).
    """
    saved = saved_record(history, stopping)
    metric = next((k for k in ("val_weighted_accuracy", "val_accuracy",
                               "val_weighted_mean_absolute_error", "val_mean_absolute_error",
                               "val_loss") if k in saved), None)
    if metric:
        restored = saved is not (history[-1] if history else {})  # saved_record's own record
        run.echo(f"{metric.replace('_', ' ')}: {saved[metric]:.4f}"
                 + (f" (epoch {int(saved['epoch']) + 1}, whose weights early stopping restored)"
                    if restored else ""))
    for line in summary_lines(history, seconds=seconds, budget_bytes=run.budget.total,
                              peak_rss_bytes=rss.overall_peak, bad_rows=bad_report,
                              restored=saved):
        run.echo(line)
    if run.spikes is not None:
        for line in run.spikes.summary_lines():
            run.echo(line)
    if built:
        run.echo(built)
    chart = ", history.png" if os.path.exists(os.path.join(run.out, "history.png")) else ""
    run.echo(f"wrote {run.out}/model.keras, manifest.json, history.json{chart}, run.json")


def saved_record(history: list[dict[str, Any]],
                 stopping: dict[str, Any] | None) -> dict[str, Any]:
    """The record of the epoch whose weights the model holds at the end of the run.

    The last epoch's, unless early stopping restored the best epoch's weights: that epoch's.
    """
    last = history[-1] if history else {}
    if not stopping or not stopping.get("restored_best_weights"):
        return last
    best = int(stopping["best_epoch"])
    return next((r for r in history if int(r.get("epoch", -1)) == best), last)


def reraise_feed_error(err: Exception, *seqs: DaskSequence | None) -> None:
    """Raise the daskfeed error behind ``err`` if a batch failed with one.

    Keras' TF backend reads batches inside a tf.data ``py_function``: an error raised by
    ``DaskSequence.__getitem__`` reaches ``fit``'s caller as a TF ``UnknownError`` holding its
    text. The sequence keeps the original (``failure``): raise that, clear and typed.
    """
    if isinstance(err, DaskfeedError):
        return
    for seq in seqs:
        failure = getattr(seq, "failure", None)
        if failure is not None:
            raise failure from None
