"""The Keras 3 transformer builders on the jax backend: every builder's count_params, describe()
of the tiny ones, a user's subclassed token model and something not a model. Prints one line
"RESULT <json>"."""

import json
import os

os.environ["KERAS_BACKEND"] = "jax"
import keras

from models import get_spec, load_builder
from models.custom import CustomModelError, model_spec
from models.keras_common import describe

out = {"params": {}, "described": {}}
for name in ("gpt2", "gpt2_tiny", "vit_b16", "vit_tiny"):
    model = load_builder(name, "keras")(get_spec(name))
    out["params"][name] = model.count_params()
    if name.endswith("_tiny"):
        out["described"][name] = describe(model, get_spec(name))
    del model


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.embed = keras.layers.Embedding(100, 16)
        self.head = keras.layers.Dense(100)

    def call(self, x, training=False):
        return self.head(self.embed(x))


entry = {"name": "mine", "framework": "keras", "build": "m:f", "path": "/tmp",
         "input": {"kind": "tokens", "seq_len": 8, "vocab": 100}}
out["custom"] = describe(Net(), model_spec(entry))
try:
    describe(object(), model_spec(entry))
except CustomModelError as exc:
    out["not_a_model"] = str(exc)
print("RESULT " + json.dumps(out))
