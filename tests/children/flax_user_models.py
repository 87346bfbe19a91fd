"""A user's Flax models file, copied as mynets.py into a folder outside the repository: a
token model without `train` or BatchNorm, and a builder that returns no Flax module."""

import flax.linen as nn


class TinyLM(nn.Module):  # no `train` argument, no BatchNorm
    vocab: int
    width: int

    @nn.compact
    def __call__(self, ids):
        x = nn.Embed(self.vocab, self.width)(ids)
        return nn.Dense(self.vocab)(nn.relu(nn.Dense(self.width)(x)))


def make(vocab=97, width=32):
    return TinyLM(vocab, width)


def not_flax():
    return object()
