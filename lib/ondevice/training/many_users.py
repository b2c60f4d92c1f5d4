"""Many users of one architecture trained together, for simulation: at the personal batch (16) one
user's LSTM step leaves most of the machine idle (per-op overhead of small products), so K users'
steps run as one computation over weights stacked along a leading user axis (batched matmuls for
the dense and LSTM layers, a batched gather for the embedding).

Each user keeps its own data and batch order (its own random generator), its own optimizer state
(SGD, or Adam with its own step count), its own gradient clipping and its own stopping rule; a
user whose epochs are done, or who stopped, is masked and its weights and state stop changing. The
users' losses are summed, and user k's weights enter only user k's loss, so each user's gradient
is its own: a user's result does not depend on who trained beside it (`tests/test_many_users.py`
checks it against the per-user `trainer.Trainer`, which stays the step the exports run).

Supported: DeepType's model (`models.lstm_lm`: embedding -> LSTM layers -> dense softmax, no
dropout) with `NextWordTask`'s loss; `train_layers` trains only the named layers (`FineTune`);
`source` replaces the task's batches as a `Hook`'s `batches` does (e.g. `bucketing.EqualLength`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..data.typing_samples import PAD_ID
from ..tasks.next_word import NextWordTask
from .step import Hook
from .trainer import History, Plateau

BETA_1, BETA_2, ADAM_EPSILON = 0.9, 0.999, 1e-7  # Keras Adam's defaults, as `step.make_optimizer` uses them


def layer_kinds(model: keras.Model) -> list[tuple[str, str, int]]:
    """(kind, layer name, number of weights) of each layer with weights, in `model.weights` order;
    a layer the batched computation does not implement is a clear error."""
    kinds = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, keras.layers.Embedding):
            kinds.append(("embedding", layer.name, 1))
        elif isinstance(layer, keras.layers.LSTM):
            plain = (
                layer.activation is keras.activations.tanh and layer.recurrent_activation is keras.activations.sigmoid
            )
            odd = layer.go_backwards or layer.stateful or layer.dropout or layer.recurrent_dropout
            if not plain or odd or not layer.use_bias or not layer.return_sequences:
                raise ValueError(f"LSTM {layer.name!r}: only tanh/sigmoid, biased, forward, full-sequence LSTMs batch")
            kinds.append(("lstm", layer.name, 3))
        elif isinstance(layer, keras.layers.Dense) and layer.activation is keras.activations.linear and layer.use_bias:
            kinds.append(("dense", layer.name, 2))
        else:
            raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) is not supported by many_users")
    inner = [kind for kind, _, _ in kinds[1:-1]]
    if len(kinds) < 2 or kinds[0][0] != "embedding" or kinds[-1][0] != "dense" or "embedding" in inner:
        raise ValueError("many_users trains embedding -> LSTM/dense layers -> dense output models (models.lstm_lm)")
    return kinds


def lstm_layer(x, kernel, recurrent, bias):
    """Keras' LSTM (gates i, f, c, o; zero initial state) for K users at once: x [K, B, T, D] with
    kernel [K, D, 4H], recurrent [K, H, 4H], bias [K, 4H] -> outputs [K, B, T, H]."""
    inputs = tf.transpose(dense_layer(x, kernel, bias), [2, 0, 1, 3])  # time-major [T, K, B, 4H]
    return tf.transpose(recurrence(inputs, recurrent), [1, 2, 0, 3])


@tf.custom_gradient
def recurrence(inputs, recurrent):
    """The LSTM's time loop on the input projections [T, K, B, 4H] -> hidden states [T, K, B, H],
    with its backward pass written out: only dz_t @ U' runs inside the reverse loop; the recurrent
    kernel's gradient is one batched product over all steps afterwards (autodiff of the loop ran
    the per-step weight gradients and the loop's bookkeeping in the loop)."""
    zeros = tf.zeros(tf.concat([tf.shape(inputs)[1:3], tf.shape(recurrent)[1:2]], 0), inputs.dtype)

    def cell(state, z):
        h, c = state[0], state[1]
        i, f, g, o = tf.split(z + tf.matmul(h, recurrent), 4, axis=-1)
        i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
        c = f * c + i * g
        return o * tf.tanh(c), c, tf.concat([i, f, g, o], -1)

    h, c, gates = tf.scan(cell, inputs, initializer=(zeros, zeros, tf.zeros_like(inputs[0])))

    def gradient(upstream):
        before = tf.concat([zeros[None], c[:-1]], 0)  # c_{t-1}

        def back(carry, step):
            dh_next, dc_next, _ = carry
            dh, gate, c_t, c_prev = step
            i, f, g, o = tf.split(gate, 4, axis=-1)
            dh, tanh_c = dh + dh_next, tf.tanh(c_t)
            dc = dh * o * (1 - tanh_c * tanh_c) + dc_next
            dz = tf.concat(
                [dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], -1
            )
            return tf.matmul(dz, recurrent, transpose_b=True), dc * f, dz

        _, _, dz = tf.scan(
            back, (upstream, gates, c, before), initializer=(zeros, zeros, tf.zeros_like(inputs[0])), reverse=True
        )
        previous = tf.concat([zeros[None], h[:-1]], 0)  # h_{t-1}: [T, K, B, H]
        flat = lambda t: tf.reshape(tf.transpose(t, [1, 0, 2, 3]), tf.stack([tf.shape(t)[1], -1, tf.shape(t)[3]]))  # noqa: E731
        return dz, tf.matmul(flat(previous), flat(dz), transpose_a=True)

    return h, gradient


def dense_layer(x, kernel, bias):
    """x [K, B, T, I] @ kernel [K, I, O] + bias [K, O], as one batched matmul over the users (its
    gradient takes no transposes, which einsum's did: 1.4x slower at K = 20 on the default model)."""
    shape = tf.shape(x)
    flat = tf.matmul(tf.reshape(x, tf.stack([shape[0], -1, shape[3]])), kernel) + bias[:, None, :]
    return tf.reshape(flat, tf.concat([shape[:3], tf.shape(kernel)[2:]], 0))


@tf.custom_gradient
def cross_entropy(logits, labels):
    """`tasks.next_word.cross_entropy` (log-sum-exp minus the label's logit, per position) with its
    gradient (softmax minus one-hot) from the exponentials the forward pass kept: two passes over
    the K x positions x vocabulary logits fewer than TensorFlow's own gradient of that form."""
    top = tf.reduce_max(logits, axis=-1, keepdims=True)
    exps = tf.exp(logits - top)
    sums = tf.reduce_sum(exps, axis=-1, keepdims=True)
    loss = tf.squeeze(tf.math.log(sums) + top, -1) - tf.gather(logits, labels, batch_dims=labels.shape.rank)

    def gradient(upstream):
        probs = exps * (upstream[..., None] / sums)
        flat = tf.reshape(probs, [-1, tf.shape(probs)[-1]])
        rows = tf.stack([tf.range(tf.shape(flat)[0]), tf.reshape(labels, [-1])], axis=-1)
        return tf.reshape(tf.tensor_scatter_nd_sub(flat, rows, tf.reshape(upstream, [-1])), tf.shape(probs)), None

    return loss, gradient


class ManyUsers(tf.Module):
    """K users' copies of one model, trained together: `train` is one step of every active user;
    `fit` runs each user's epochs with its own batches and stopping rule; `reset` starts every user
    again from one weight set, `reset_each` each from its own. `model` is used to read the
    architecture and, during `fit`, to hold one user's weights for `evaluate`."""

    def __init__(
        self,
        model: keras.Model,
        task: NextWordTask,
        users: int,
        learning_rate: float,
        optimizer: str = "sgd",
        clip_norm: float = 0.0,
        train_layers: Sequence[str] | None = None,
        source: Hook | None = None,
    ):
        super().__init__()
        if not isinstance(task, NextWordTask):
            raise ValueError(f"many_users implements NextWordTask's loss, got {type(task).__name__}")
        if optimizer not in ("sgd", "adam") or users < 1 or clip_norm < 0:
            raise ValueError(
                f"need optimizer sgd|adam, users >= 1, clip_norm >= 0; got {optimizer}, {users}, {clip_norm}"
            )
        self.model, self.task, self.users, self.learning_rate = model, task, users, learning_rate
        self.source = source
        self.optimizer_name, self.clip_norm, self.kinds = optimizer, clip_norm, layer_kinds(model)
        names = [name for _, name, _ in self.kinds]
        unknown = set(train_layers or ()) - set(names)
        if unknown:
            raise ValueError(f"train_layers names no layer of the model: {sorted(unknown)}")
        self.stacked = [tf.Variable(tf.zeros([users, *w.shape], w.dtype), trainable=False) for w in model.weights]
        owners = [name for _, name, n in self.kinds for _ in range(n)]
        chosen = set(train_layers) if train_layers else set(names)
        self.trained = [i for i, name in enumerate(owners) if name in chosen]
        zeros = lambda: [tf.Variable(tf.zeros_like(self.stacked[i]), trainable=False) for i in self.trained]  # noqa: E731
        self.moments, self.velocities = (zeros(), zeros()) if optimizer == "adam" else ([], [])
        self.iterations = tf.Variable(tf.zeros([users], tf.float32), trainable=False)
        spec = tf.TensorSpec([users, None, None], tf.int32)
        vector = tf.TensorSpec([users], tf.float32)
        self.train = tf.function(self._train, input_signature=[spec, spec, vector, vector, vector])
        self.reset(model.get_weights())

    def reset(self, weights: Sequence[np.ndarray]) -> None:
        """Every user from one model's `weights` (as `model.get_weights()`); optimizer states at zero."""
        self.reset_each([weights] * self.users)

    def reset_each(self, weight_sets: Sequence[Sequence[np.ndarray]]) -> None:
        """User k from `weight_sets[k]` (one list per user); optimizer states at zero."""
        if len(weight_sets) != self.users:
            raise ValueError(f"need {self.users} weight sets, got {len(weight_sets)}")
        for i, v in enumerate(self.stacked):
            v.assign(np.stack([np.asarray(user[i], v.dtype.as_numpy_dtype) for user in weight_sets]))
        for v in [*self.moments, *self.velocities, self.iterations]:
            v.assign(tf.zeros_like(v))

    def batches(self, data, batch_size: int, rng) -> list:
        """One epoch's batches of a user, drawn as `Trainer` draws them with `source` as its hook."""
        drawn = self.source.batches(self.task, data, batch_size, rng) if self.source is not None else None
        return list(drawn if drawn is not None else self.task.batches(data, batch_size, rng))

    def user_weights(self, k: int) -> list[np.ndarray]:
        return [v[k].numpy() for v in self.stacked]

    def set_user_weights(self, k: int, weights: Sequence[np.ndarray]) -> None:
        for v, w in zip(self.stacked, weights):
            v[k].assign(w)

    def embed(self, tokens):
        """Every user's embedding of its tokens [K, B, T] -> [K, B, T, D]."""
        return tf.gather(self.stacked[0], tokens, batch_dims=1)

    def hidden(self, embedded):
        """Every user's input to the output layer [K, B, T, H] from its embedded tokens."""
        x, at = embedded, 1
        for kind, _, n in self.kinds[1:-1]:
            w = [tf.convert_to_tensor(v) for v in self.stacked[at : at + n]]  # read once, outside the time loop
            at += n
            x = lstm_layer(x, *w) if kind == "lstm" else dense_layer(x, *w)
        return x

    def losses(self, embedded, labels, samples):
        """Each user's `NextWordTask.loss` of its batch [K]: `samples` is the number of real rows of
        its batch (the rows that pad the users' batches to one shape hold only <pad> labels). The
        output layer and cross-entropy run user by user: one user's logits stay in the CPU's cache,
        all K users' did not (measured at K = 20, default model: 281 -> 138 ms forward + backward)."""
        mask = tf.cast(tf.not_equal(labels, PAD_ID), embedded.dtype)
        per = samples if self.task.loss_per == "sample" else tf.reduce_sum(mask, axis=[1, 2])
        return self.output_sums(self.hidden(embedded), labels) / tf.maximum(per, 1.0)

    def output_sums(self, hidden, labels):
        """Each user's cross-entropy [K] summed over its real positions, from the output layer's input."""
        totals, width = [], tf.shape(hidden)[-1]
        # unstack, not indexing: the gradient of K slices of a tensor would be K tensors of its full size
        users = zip(*(tf.unstack(t, self.users) for t in (hidden, self.stacked[-2], self.stacked[-1], labels)))
        for x, kernel, bias, y in users:
            logits, flat = tf.matmul(tf.reshape(x, [-1, width]), kernel) + bias, tf.reshape(y, [-1])
            totals.append(
                tf.reduce_sum(cross_entropy(logits, flat) * tf.cast(tf.not_equal(flat, PAD_ID), logits.dtype))
            )
        return tf.stack(totals)

    def _train(self, tokens, labels, samples, active, rate):
        """One step of every user with `active` 1 (0: weights and optimizer state unchanged), at
        its own learning rate; returns each user's loss. The embedding's gradient is taken per
        position (as Keras' sparse gradient is): its norm for clipping counts a repeated token once
        per position, as `tf.clip_by_global_norm` does on the per-user step's IndexedSlices."""
        dense = [self.stacked[i] for i in self.trained if i != 0]
        embedding = 0 in self.trained
        with tf.GradientTape() as tape:
            tape.watch(dense)
            embedded = self.embed(tokens)
            tape.watch(embedded)
            losses = self.losses(embedded, labels, samples)
            total = tf.reduce_sum(losses)
        grads = tape.gradient(total, [*dense, embedded] if embedding else dense)
        grads, per_position = (grads[:-1], grads[-1]) if embedding else (grads, None)
        scale = tf.ones_like(active)
        if self.clip_norm:  # tf.clip_by_global_norm per user: t * clip / max(norm, clip)
            squares = [tf.reduce_sum(g * g, axis=tf.range(1, tf.rank(g))) for g in grads]
            if embedding:
                squares.append(tf.reduce_sum(per_position * per_position, axis=[1, 2, 3]))
            scale = self.clip_norm * tf.minimum(tf.math.rsqrt(tf.add_n(squares)), 1.0 / self.clip_norm)
        users = tf.broadcast_to(tf.range(self.users)[:, None, None], tf.shape(tokens))
        rows = tf.stack([users, tokens], axis=-1)
        if self.optimizer_name == "sgd":  # clipping and the rate in one product: one pass over each gradient
            step = scale * rate * active
            for v, g in zip(dense, grads):
                v.assign_sub(g * _per_user(step, g))
            if embedding:
                self.stacked[0].scatter_nd_sub(rows, per_position * _per_user(step, per_position))
        else:
            grads = [g * _per_user(scale, g) for g in grads]
            if embedding:
                embedded_grads = tf.scatter_nd(
                    rows, per_position * _per_user(scale, per_position), self.stacked[0].shape
                )
                dense, grads = [self.stacked[0], *dense], [embedded_grads, *grads]
            self._adam(dense, grads, active, rate)
        return losses

    def _adam(self, variables, grads, active, rate):
        """Keras Adam's dense update (`tf_keras` optimizers.Adam.update_step), per user: its own step
        count in the bias correction, moments kept where the user is not active."""
        step = self.iterations + 1.0
        alpha = rate * tf.sqrt(1 - tf.pow(BETA_2, step)) / (1 - tf.pow(BETA_1, step))
        for v, g, m, s in zip(variables, grads, self.moments, self.velocities):
            on = _per_user(active, g) > 0
            m.assign(tf.where(on, m + (g - m) * (1 - BETA_1), m))
            s.assign(tf.where(on, s + (tf.square(g) - s) * (1 - BETA_2), s))
            v.assign(tf.where(on, v - (m * _per_user(alpha, g)) / (tf.sqrt(s) + ADAM_EPSILON), v))
        self.iterations.assign_add(active)

    def fit(
        self,
        data: Sequence,
        epochs: int,
        batch_size: int,
        rngs: Sequence[np.random.Generator],
        evaluate: Callable[[int, keras.Model], dict] | None = None,
        stop: Plateau | None = None,
        schedule: Callable[[int], float] | None = None,
    ) -> list[History]:
        """`Trainer.fit` for user k = 0..len(data)-1 on `data[k]` with `rngs[k]` (up to `users`; the
        other slots idle), all users stepping together. `evaluate(k, model)` scores user k's
        weights after each of its epochs; with `stop`, user k stops at its plateau and is left with
        the epoch's weights `stop` keeps. A row's `seconds` are the user's share of the steps it
        took part in (each step's wall time over the users in it)."""
        if len(data) != len(rngs) or not 0 < len(data) <= self.users:
            raise ValueError(f"need 1..{self.users} users with one generator each, got {len(data)} and {len(rngs)}")
        if stop is not None and evaluate is None:
            raise ValueError("stop needs evaluate: a plateau is judged on held-out data")
        run = _Run(self, epochs, batch_size, evaluate, stop, schedule)
        users = [_User(d, r, stop.watch() if stop else None) for d, r in zip(data, rngs)]
        for k, user in enumerate(users):
            run.advance(k, user)
        while any(not u.done for u in users):
            run.step(users)
        for k, user in enumerate(users):
            if user.watch is not None:
                self.set_user_weights(k, user.watch.weights)
                user.history.best_epoch, user.history.plateau = user.watch.epoch, user.watch.plateau
        return [u.history for u in users]


def _per_user(values, like):
    """A [K] vector shaped to broadcast against a [K, ...] tensor."""
    return tf.reshape(values, tf.concat([[-1], tf.ones([tf.rank(like) - 1], tf.int32)], 0))


@dataclass
class _User:
    """One user's place in `ManyUsers.fit`: its data, generator, the current epoch's batches."""

    data: object
    rng: np.random.Generator
    watch: object
    history: History = field(default_factory=History)
    batches: list = field(default_factory=list)
    at: int = 0
    epoch: int = 0
    losses: list = field(default_factory=list)
    seconds: float = 0.0
    done: bool = False


@dataclass
class _Run:
    """The settings of one `ManyUsers.fit`, and its two moves: a step of every active user, and a
    user's epoch boundary (its row, evaluation, stop rule, next epoch's batches)."""

    many: ManyUsers
    epochs: int
    batch_size: int
    evaluate: Callable | None
    stop: Plateau | None
    schedule: Callable | None

    def rate(self, user: _User) -> float:
        return float(self.schedule(user.epoch)) if self.schedule else self.many.learning_rate

    def step(self, users: list[_User]) -> None:
        """One batched step: each active user's next batch, padded to the longest (rows and length)."""
        k_all, active = self.many.users, [k for k, u in enumerate(users) if not u.done]
        batches = {k: users[k].batches[users[k].at] for k in active}
        length = max(x.shape[1] for x, _ in batches.values())
        rows = max(x.shape[0] for x, _ in batches.values())
        tokens, labels = np.zeros((2, k_all, rows, length), np.int32)
        samples, on, rate = np.zeros((3, k_all), np.float32)
        for k, (x, y) in batches.items():
            tokens[k, : x.shape[0], : x.shape[1]], labels[k, : y.shape[0], : y.shape[1]] = x, y
            samples[k], on[k], rate[k] = x.shape[0], 1.0, self.rate(users[k])
        start = time.perf_counter()
        losses = self.many.train(tokens, labels, samples, on, rate).numpy()
        share = (time.perf_counter() - start) / len(active)
        for k in active:
            user = users[k]
            user.losses.append(float(losses[k]))
            user.seconds, user.at = user.seconds + share, user.at + 1
            self.advance(k, user)

    def advance(self, k: int, user: _User) -> None:
        """Close the user's epochs that have no batch left (an empty epoch closes at once) and draw
        the next epoch's batches, until the user has a batch to run or is done."""
        while not user.done and user.at == len(user.batches):
            if user.epoch > 0:
                self.close_epoch(k, user)
            if user.done or user.epoch == self.epochs:
                user.done = True
                break
            user.epoch, user.at, user.losses, user.seconds = user.epoch + 1, 0, [], 0.0
            user.batches = self.many.batches(user.data, self.batch_size, user.rng)

    def close_epoch(self, k: int, user: _User) -> None:
        row = {"epoch": user.epoch}
        if self.schedule:
            row["learning_rate"] = self.rate(user)
        loss = float(np.mean(user.losses)) if user.losses else float("nan")
        row.update(loss=loss, seconds=user.seconds, steps=len(user.batches))
        model = self.many.model
        if self.evaluate is not None:
            model.set_weights(self.many.user_weights(k))
            row.update(self.evaluate(k, model))
        user.history.append(row)
        if user.watch is not None and user.watch.update(row[self.stop.monitor], user.epoch, model):
            user.done = True
