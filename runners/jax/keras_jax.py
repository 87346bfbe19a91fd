"""keras_jax: Keras 3 on JAX, data parallel with keras.distribution.DataParallel, trained with
model.fit as Keras' distribution guide does it (keras 3.15.1, jax 0.10.2). Options: `input`
(numpy or preplaced), `batchnorm` (per_device: keras_batchnorm.py; global: Keras' own), `loader`,
`steps_per_execution` (Keras' compile argument, default 1; on jax a Python loop of jitted steps per
call, callbacks and the clock once per call, each step timed as the call's mean). Fit, clock
(warm-up settled past JAX's compiles), window evidence and record: keras_fit.py, keras_run.py.
Converge: one fit per epoch, the rate set per step by a callback. docs/runners/keras_jax.md."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from contract.reasons import code
from contract.result import join
from models import spec_of
from runners.common import Invalid, Spec, main
from runners.converge import Batch, fitting_splits, train_to_accuracy
from runners.jax import keras_run
from runners.jax.common import check_short_batch, eval_chunk, framework_versions, sgd_recipe
from runners.jax.keras_batchnorm import keras_moving_stats
from runners.jax.keras_fit import EpochRows, make_distribution
from runners.jax.keras_input import ARRAYS_PLACEMENT, input_mode
from runners.jax.keras_run import KerasRun, Strategy

if TYPE_CHECKING:
    import keras
    import numpy as np

DATA_PARALLEL = Strategy(lambda spec, name: make_distribution(spec))

benchmark = partial(keras_run.benchmark, strategy=DATA_PARALLEL)
equivalence = partial(keras_run.equivalence, strategy=DATA_PARALLEL)


def converge_callbacks(keras: Any, lr_at: Callable[[int], float], rows: EpochRows) -> list[Any]:
    """fit's callbacks for one epoch: the learning rate set before every step, the rows probe
    installed once fit has made its train function."""

    class StepLearningRate(keras.callbacks.Callback):
        """model.optimizer.learning_rate = lr_at(step) before each step (self.model syncs
        Keras' jax state into the variables first; the trainer then reads it back)."""

        def on_train_begin(self, logs: dict | None = None) -> None:
            rows.install(self._model)

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            self.model.optimizer.learning_rate = lr_at(batch)

    return [StepLearningRate()]


def logits_model(keras: Any, model: keras.Model, loss: Any) -> tuple[Any, Any, str]:
    """(the model fit trains, its loss, what the record says of it): a model ending in a softmax
    Activation (the built-in CNNs) as the model of its logits with sparse cross-entropy from
    logits, as Keras on TensorFlow takes it (docs/runners/keras_jax.md says why); any other
    model as it is, with `loss`."""
    last = model.layers[-1]
    if isinstance(last, keras.layers.Activation) and \
            getattr(last.activation, "__name__", "") == "softmax":
        logits = keras.Model(model.inputs, last.input, name=f"{model.name}_logits")
        return (logits, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                code("jax.keras_loss_from_logits"))
    return model, loss, "global mean sparse cross-entropy (the model's own logits)"


class KerasConverge:
    """The converge adapter: one fit per epoch on the recipe's batches (numpy arrays, or
    preplaced by a generator), predict on the held-out split, the BatchNorm statistics read;
    what the record reads of the run (the first epoch's rows per device, the rates)."""

    def __init__(self, run: KerasRun, trained: Any, mode: str, heldout_rows: int) -> None:
        self.run, self.trained, self.mode = run, trained, mode
        self.rows = EpochRows()
        self.rows_fed: list[int] = []
        self.lrs: list[float] = []  # the optimizer's learning rate after each epoch's fit
        self.read: str | None = None  # what the last moving_stats() read
        self.chunk = eval_chunk(heldout_rows, run.n)  # held-out rows per predict batch

    def train_epoch(self, epoch: int, batches: list[Batch], lr_at: Callable[[int], float]
                    ) -> float:
        import numpy as np

        self.rows.active = epoch == 0
        if epoch == 0:
            self.rows_fed.extend(b.global_rows for b in batches)
        if self.mode == "numpy":
            feed = {"x": np.concatenate([b.x for b in batches]),
                    "y": np.concatenate([b.y for b in batches]),
                    "batch_size": self.run.spec.global_batch_size, "shuffle": False}
        else:
            import jax

            feed = {"x": (jax.device_put((b.x, b.y), self.run.shardings) for b in batches),
                    "steps_per_epoch": len(batches)}
        history = self.trained.fit(**feed, epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                                   callbacks=converge_callbacks(self.run.keras, lr_at,
                                                                self.rows))
        self.lrs.append(float(np.asarray(self.trained.optimizer.learning_rate)))
        return float(history.history["loss"][-1])

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        import numpy as np

        padded = np.concatenate([x, np.zeros((-len(x) % self.chunk, *x.shape[1:]), x.dtype)])
        out = self.trained.predict(padded, batch_size=self.chunk, verbose=0)
        return float((np.argmax(out[:len(y)], axis=-1) == y).mean())

    def moving_stats(self) -> tuple[bool, str]:
        finite, self.read = keras_moving_stats(self.run.keras, self.trained)
        return finite, self.read


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: train_to_accuracy with the benchmark's model under DataParallel, one fit
    per epoch, the learning rate set per step by a callback."""
    recipe = sgd_recipe(spec, "keras_jax", "of them is not fed yet")
    mode = input_mode(spec)
    splits = fitting_splits(spec, spec_of(spec))
    run = KerasRun.start(spec, DATA_PARALLEL)
    from models.keras_common import loss_for

    check_short_batch(recipe, len(splits.y_train), run.n, "DataParallel")
    keras = run.keras
    keras.utils.set_random_seed(recipe.seed)
    trained, loss, loss_kind = logits_model(keras, run.build(), loss_for(run.model_spec))
    decay = {"weight_decay": recipe.weight_decay} if recipe.weight_decay else {}
    trained.compile(optimizer=keras.optimizers.SGD(learning_rate=recipe.base_lr,
                                                   momentum=recipe.momentum, **decay),
                    loss=loss)
    a = KerasConverge(run, trained, mode, len(splits.y_heldout))
    result = train_to_accuracy(spec, a.train_epoch, a.evaluate, a.moving_stats, splits=splits)
    if sum(a.rows.rows.values()) != sum(a.rows_fed):
        raise Invalid(f"the first epoch fed {sum(a.rows.rows.values())} rows to the devices, "
                      f"not its {sum(a.rows_fed)}")
    return join(result, run.record(trained), {
        "framework": framework_versions("keras"),
        "input": mode,
        "loss_kind": f"{loss_kind}; per epoch Keras' mean of its batches' losses weighted by "
                     "rows (fit's history)",
        "optimizer": code("jax.keras_sgd_lr_callback"),
        # per epoch, the rate of its last step, read back from the optimizer's variable
        "lr_read_back": a.lrs,
        "moving_stats_read": a.read,
        "placement": a.rows.rows,
        "placement_source": code("jax.keras_converge_rows"),
        "data_placement": (ARRAYS_PLACEMENT if mode == "numpy"
                           else code("jax.keras_converge_device_put")),
    })


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
